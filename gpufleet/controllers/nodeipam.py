"""Node IPAM: each Node gets a pod CIDR of its own (spec.podCIDR, spec.podCIDRs), carved
from the cluster CIDR, as kube-controller-manager's node-ipam controller does with
--allocate-node-cidrs.

The node's agent makes its pod network from it (agent/network.py), so pod IPs are unique
across the fleet and every node can route to every other node's pods. A CIDR is never
changed once set (Kubernetes refuses that); one freed by a deleted Node is reused.

The decision is ``decide_cidr`` (the node, every node and the CIDRs handed out but not yet
seen back in; the patch and its Event out), applied with ``actions.apply``.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
from typing import Any

from gpufleet.api.k8s import Node
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import Conflict, NotFound
from gpufleet.client.events import NORMAL, WARNING
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.controllers.actions import Actions, Patch
from gpufleet.controllers.base import KeyedController

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
    """The first node-sized subnet of the cluster CIDR that no node has (none: full).

    As kube-controller-manager's CIDR set, a map of the subnets in use rather than a test of
    every subnet against every node's: registering a fleet node by node stays linear."""
    network = ipaddress.ip_network(cluster_cidr, strict=False)
    if mask < network.prefixlen or mask > network.max_prefixlen:
        raise ValueError(f"node mask /{mask} does not fit in the cluster CIDR {network}")
    size = 1 << (network.max_prefixlen - mask)
    base = int(network.network_address)
    count = 1 << (mask - network.prefixlen)
    end = base + count * size - 1
    blocked: set[int] = set()
    for t in taken:
        used = _bounds(t)
        if used is None:
            continue
        version, lo, hi = used
        if version != network.version or hi < base or lo > end:
            continue
        blocked.update(range((max(lo, base) - base) // size, (min(hi, end) - base) // size + 1))
    for i in range(count):
        if i not in blocked:
            return str(ipaddress.ip_network((base + i * size, mask)))
    return None


@functools.lru_cache(maxsize=65536)
def _bounds(cidr: str) -> tuple[int, int, int] | None:
    """A CIDR's IP version and first and last addresses (None: not a CIDR), parsed once: a
    fleet's CIDRs are read again for every node that registers."""
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return None
    return net.version, int(net.network_address), int(net.broadcast_address)


RETRY_FULL = 30.0  # a full cluster CIDR: how soon to look again
RETRY_CONFLICT = 0.1  # the node changed under the patch: read it again soon


def decide_cidr(key: str, node: Any, nodes: list[Any], pending: dict[str, str],
                cluster_cidr: str, mask: int) -> Actions:
    """The node's pod CIDR: nothing when it has one; else the CIDR handed to it before and not
    yet seen back (``pending``, node key -> CIDR), or the first free one, written as a merge
    patch of spec.podCIDR and spec.podCIDRs on the node's resourceVersion (a compare-and-swap)
    with the Event CIDRAssignmentSucceeded to record once it is written; a full cluster CIDR
    is the Event CIDRNotAvailable and a look again later. ``memo["cidr"]``: what to hold
    as pending for the node afterwards (None: drop it)."""
    spec = node.spec
    if spec is not None and (spec.pod_cidr or spec.pod_cidrs):
        return Actions(reason="Assigned", memo={"cidr": None})
    taken = allocated_cidrs(nodes) | {c for k, c in pending.items() if k != key}
    cidr = pending.get(key) or next_cidr(cluster_cidr, mask, taken)
    if cidr is None:
        actions = Actions(reason="Full", memo={"cidr": pending.get(key)})
        actions.event(WARNING, "CIDRNotAvailable", f"Node {key} status is now: CIDRNotAvailable")
        actions.requeue(RETRY_FULL)
        return actions
    patch = {"metadata": {"resourceVersion": node.metadata.resource_version},
             "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}}
    actions = Actions(patches=[Patch(Node, key, None, patch)], reason="Assign", memo={"cidr": cidr})
    actions.event(NORMAL, "CIDRAssignmentSucceeded", f"Node {key} was assigned pod CIDR {cidr}")
    return actions


class NodeIpamController(KeyedController):
    name = "nodeipam"
    component = "node-controller"
    model = Node

    def __init__(self, client: Client, informers: SharedInformerFactory, *,
                 cluster_cidr: str = DEFAULT_CLUSTER_CIDR, node_mask: int = DEFAULT_NODE_MASK,
                 **kwargs: Any) -> None:
        kwargs["workers"] = 1  # one at a time: two workers could hand out the same CIDR
        super().__init__(client, informers, **kwargs)
        self.cluster_cidr = cluster_cidr
        self.node_mask = node_mask
        # Handed out but maybe not yet seen back through the informer.
        self._pending: dict[str, str] = {}
        # Nodes found with no CIDR left for them: looked at again every RETRY_FULL, not at
        # each of their heartbeats (each look reads every node).
        self._waiting_full: set[str] = set()

    def update_matters(self, old: Any, new: Any) -> bool:
        # As kube-controller-manager's range allocator: an update matters only to a node
        # still without a pod CIDR (heartbeats of a fleet's nodes are most updates).
        spec = new.spec
        if spec is not None and (spec.pod_cidr or spec.pod_cidrs):
            return False
        return new.metadata.name not in self._waiting_full  # a Node's key is its name

    async def sync(self, key: str, node: Any | None) -> Requeue | None:
        if node is None:
            self._pending.pop(key, None)
            self._waiting_full.discard(key)
            # A deleted node's CIDR is free: the nodes waiting for one look again now.
            for waiting in self._waiting_full:
                self.controller.enqueue(waiting)
            return None
        actions = decide_cidr(key, node, self.informer.list(), self._pending, self.cluster_cidr, self.node_mask)
        self._remember(key, actions.memo.get("cidr"))
        if actions.reason == "Full":
            self._waiting_full.add(key)
        else:
            self._waiting_full.discard(key)
        if not actions.patches:
            if actions.events:
                log.warning("node %s: no pod CIDR left in %s", key, self.cluster_cidr)
                await self.act(key, node, actions)
            return self.requeue(actions)
        # The Event says the CIDR was assigned: recorded only once the patch is written.
        try:
            await self.act(key, node, Actions(patches=actions.patches))
        except NotFound:
            self._pending.pop(key, None)
            return None
        except Conflict:
            return Requeue(after=RETRY_CONFLICT)
        log.info("node %s: pod CIDR %s", key, actions.memo["cidr"])
        await self.act(key, node, Actions(events=actions.events))
        return None

    def _remember(self, key: str, cidr: str | None) -> None:
        if cidr is None:
            self._pending.pop(key, None)
        else:
            self._pending[key] = cidr
