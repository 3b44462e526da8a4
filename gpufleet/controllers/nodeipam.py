"""Node IPAM: each Node gets a pod CIDR of its own (spec.podCIDR, spec.podCIDRs), carved
from the cluster CIDR, as kube-controller-manager's node-ipam controller does with
--allocate-node-cidrs.

The node's agent makes its pod network from it (agent/network.py), so pod IPs are unique
across the fleet and every node can route to every other node's pods. A CIDR is never
changed once set (Kubernetes refuses that); one freed by a deleted Node is reused.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

from gpufleet.api.k8s import Node
from gpufleet.client.api import Client
from gpufleet.client.controller import Controller, Requeue
from gpufleet.client.errors import Conflict, NotFound
from gpufleet.client.events import EventRecorder
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

DEFAULT_CLUSTER_CIDR = "10.244.0.0/16"
DEFAULT_NODE_MASK = 24


def allocated_cidrs(nodes: list[Any]) -> set[str]:
    out: set[str] = set()
    for node in nodes:
        spec = getattr(node, "spec", None)
        for cidr in ((spec.pod_cidrs if spec is not None else None) or []):
            out.add(cidr)
        if spec is not None and spec.pod_cidr:
            out.add(spec.pod_cidr)
    return out


def next_cidr(cluster_cidr: str, mask: int, taken: set[str]) -> str | None:
    """The first node-sized subnet of the cluster CIDR that no node has (none: full)."""
    network = ipaddress.ip_network(cluster_cidr, strict=False)
    used = []
    for t in taken:
        try:
            used.append(ipaddress.ip_network(t, strict=False))
        except ValueError:
            continue
    for subnet in network.subnets(new_prefix=mask):
        if not any(subnet.overlaps(u) for u in used):
            return str(subnet)
    return None


class NodeIpamController:
    def __init__(self, client: Client, informers: SharedInformerFactory, *, clock: Clock = REAL_CLOCK,
                 workers: int = 1, recorder: EventRecorder | None = None,
                 cluster_cidr: str = DEFAULT_CLUSTER_CIDR, node_mask: int = DEFAULT_NODE_MASK) -> None:
        del workers  # one at a time: two workers could hand out the same CIDR
        self.client = client
        self.clock = clock
        self.recorder = recorder
        self.cluster_cidr = cluster_cidr
        self.node_mask = node_mask
        self.informer = informers.informer(Node)
        self.controller = Controller("nodeipam", self.reconcile, workers=1)
        self.controller.watch(self.informer)
        # Handed out but maybe not yet seen back through the informer.
        self._pending: dict[str, str] = {}

    async def start(self) -> None:
        await self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()

    async def reconcile(self, key: str) -> Requeue | None:
        node = self.informer.get(key)
        if node is None:
            self._pending.pop(key, None)
            return None
        spec = node.spec
        if spec is not None and (spec.pod_cidr or spec.pod_cidrs):
            self._pending.pop(key, None)
            return None
        nodes = self.informer.list()
        taken = allocated_cidrs(nodes) | {c for k, c in self._pending.items() if k != key}
        cidr = self._pending.get(key) or next_cidr(self.cluster_cidr, self.node_mask, taken)
        if cidr is None:
            log.warning("node %s: no pod CIDR left in %s", key, self.cluster_cidr)
            if self.recorder is not None:
                self.recorder.record_nowait(node, "Warning", "CIDRNotAvailable",
                                            f"Node {key} status is now: CIDRNotAvailable")
            return Requeue(after=30.0)
        self._pending[key] = cidr
        patch = {"metadata": {"resourceVersion": node.metadata.resource_version},
                 "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}}
        try:
            await self.client.patch(Node, key, patch, raw=True)
        except NotFound:
            self._pending.pop(key, None)
            return None
        except Conflict:
            return Requeue(after=0.1)
        log.info("node %s: pod CIDR %s", key, cidr)
        if self.recorder is not None:
            self.recorder.record_nowait(node, "Normal", "CIDRAssignmentSucceeded",
                                        f"Node {key} was assigned pod CIDR {cidr}")
        return None
