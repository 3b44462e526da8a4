"""The scheduler's own view of the cluster: NodeInfos kept up to date from node and pod
events, plus the pods it has *assumed* — placed by a scheduling cycle but not yet seen bound.

Assuming is what lets the next cycle start before the binding of the previous one reached
the API server: the cycle after it already sees the pod's cpu, memory and GPU indices as
taken. An assumption ends one of three ways: the informer delivers the bound pod (confirmed),
binding fails (forgotten), or, after binding finished, the bound pod never shows up within
``ttl`` seconds (expired — the watch lost it; the space is given back).

Snapshots are refreshed incrementally, as kube-scheduler's cache does: every change stamps
the NodeInfo with a new generation and moves it to the end of an ordered dict, so
``update_snapshot`` copies only the nodes changed since that snapshot's generation by
walking back from the end.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpufleet.api import k8s
from gpufleet.scheduler.snapshot import NO_PODS, NodeInfo, PodInfo, Snapshot
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)


@dataclass
class _Assumption:
    node_name: str
    binding_finished: bool = False
    # Monotonic time after which an unconfirmed assumption is dropped.
    deadline: float | None = None


def cache_key(pod: k8s.Pod | PodInfo) -> str:
    """Pods are tracked by UID where they have one, so a pod re-created under the same
    name is a different pod; 'namespace/name' otherwise (pods built by hand in tests)."""
    if isinstance(pod, PodInfo):
        return pod.uid or pod.key
    meta = pod.metadata
    if meta is None:
        return "/"
    return meta.uid or f"{meta.namespace or ''}/{meta.name or ''}"


class SchedulerCache:
    def __init__(self, *, clock: Clock = REAL_CLOCK, ttl: float | None = 30.0) -> None:
        self.clock = clock
        # None or 0: an assumption lasts until confirmed or forgotten.
        self.ttl = ttl
        self._nodes: OrderedDict[str, NodeInfo] = OrderedDict()
        # cache key -> the PodInfo placed on a node (bound or assumed)
        self._pods: dict[str, PodInfo] = {}
        self._assumed: dict[str, _Assumption] = {}
        # Placed pods by priority: preemption asks for the lowest first (most clusters
        # hold nothing a pending pod could preempt).
        self._priorities: Counter[int] = Counter()
        self._generation = 0
        # Bumped when the set of nodes with a Node object changes (a snapshot must then
        # rebuild its list, not just replace entries).
        self._membership_generation = 0

    # -- nodes ----------------------------------------------------------------------------

    def _touch(self, node_info: NodeInfo) -> None:
        self._generation += 1
        node_info.generation = self._generation
        self._nodes.move_to_end(node_info.name)

    def add_node(self, node: k8s.Node) -> NodeInfo:
        name = node.metadata.name if node.metadata else ""
        node_info = self._nodes.get(name)
        if node_info is None:
            node_info = NodeInfo()
            node_info.name = name
            self._nodes[name] = node_info
        if node_info.node is None:
            self._membership_generation += 1
        node_info.set_node(node)
        self._touch(node_info)
        return node_info

    def update_node(self, old: k8s.Node | None, new: k8s.Node) -> NodeInfo:
        return self.add_node(new)

    def remove_node(self, node: k8s.Node | str) -> None:
        name = node if isinstance(node, str) else (node.metadata.name if node.metadata else "")
        node_info = self._nodes.get(name)
        if node_info is None:
            return
        self._membership_generation += 1
        if node_info.pods:
            # Its pods are still running somewhere as far as the API knows; keep their
            # accounting until they are deleted, in case the node comes back.
            node_info.node = None
            self._touch(node_info)
        else:
            del self._nodes[name]
            self._generation += 1

    def get_node(self, name: str) -> NodeInfo | None:
        """The cache's own NodeInfo (read-only for callers; use a snapshot to experiment)."""
        return self._nodes.get(name)

    @property
    def node_count(self) -> int:
        return sum(1 for n in self._nodes.values() if n.node is not None)

    # -- pods -----------------------------------------------------------------------------

    def _place(self, pod_info: PodInfo) -> None:
        node_info = self._nodes.get(pod_info.node_name)
        if node_info is None:
            # A pod seen before its node: keep a placeholder so nothing is lost.
            node_info = NodeInfo()
            node_info.name = pod_info.node_name
            self._nodes[pod_info.node_name] = node_info
        node_info.add_pod(pod_info)
        self._pods[cache_key(pod_info)] = pod_info
        self._priorities[pod_info.priority] += 1
        self._touch(node_info)

    def _unplace(self, key: str) -> PodInfo | None:
        pod_info = self._pods.pop(key, None)
        if pod_info is None:
            return None
        left = self._priorities[pod_info.priority] - 1
        if left > 0:
            self._priorities[pod_info.priority] = left
        else:
            del self._priorities[pod_info.priority]
        node_info = self._nodes.get(pod_info.node_name)
        if node_info is not None:
            node_info.remove_pod(pod_info)
            if node_info.node is None and not node_info.pods:
                del self._nodes[node_info.name]
                self._generation += 1
            else:
                self._touch(node_info)
        return pod_info

    def add_pod(self, pod: k8s.Pod) -> None:
        """A pod the API says is bound (spec.nodeName set). Terminal pods hold nothing."""
        pod_info = PodInfo(pod)
        key = cache_key(pod_info)
        if not pod_info.node_name:
            return
        assumption = self._assumed.pop(key, None)
        if assumption is not None and assumption.node_name != pod_info.node_name:
            log.warning(
                "pod %s was assumed on %s but is bound to %s",
                pod_info.key,
                assumption.node_name,
                pod_info.node_name,
            )
        self._unplace(key)
        if not pod_info.terminal:
            self._place(pod_info)

    def update_pod(self, old: k8s.Pod | None, new: k8s.Pod) -> None:
        self.add_pod(new)

    def remove_pod(self, pod: k8s.Pod | PodInfo) -> None:
        key = cache_key(pod)
        self._assumed.pop(key, None)
        self._unplace(key)

    def assume_pod(self, pod_info: PodInfo, node_name: str, gpu_indices: Iterable[int] = ()) -> PodInfo:
        """Place a pod the scheduler chose a node for, before the API knows."""
        key = cache_key(pod_info)
        if key in self._pods:
            raise ValueError(f"pod {pod_info.key} is already placed on {self._pods[key].node_name!r}")
        assumed = pod_info.assigned(node_name, gpu_indices)
        self._place(assumed)
        self._assumed[key] = _Assumption(node_name)
        return assumed

    def finish_binding(self, pod_info: PodInfo) -> None:
        """The binding was accepted: from now on the assumption may expire."""
        assumption = self._assumed.get(cache_key(pod_info))
        if assumption is None:
            return
        assumption.binding_finished = True
        if self.ttl:
            assumption.deadline = self.clock.monotonic() + self.ttl

    def forget_pod(self, pod_info: PodInfo) -> None:
        """Drop an assumption (binding failed). A pod already confirmed is left alone."""
        key = cache_key(pod_info)
        if self._assumed.pop(key, None) is not None:
            self._unplace(key)

    def is_assumed(self, pod: k8s.Pod | PodInfo) -> bool:
        return cache_key(pod) in self._assumed

    def get_pod(self, pod: k8s.Pod | PodInfo) -> PodInfo | None:
        return self._pods.get(cache_key(pod))

    def expiring(self) -> bool:
        """Whether an assumption can expire (a TTL is set and one is held)."""
        return self.ttl is not None and bool(self._assumed)

    def cleanup_expired(self, now: float | None = None) -> list[PodInfo]:
        """Drop assumptions whose binding finished more than ``ttl`` ago and that the
        informer never confirmed; returns them."""
        now = self.clock.monotonic() if now is None else now
        expired = [
            key
            for key, a in self._assumed.items()
            if a.binding_finished and a.deadline is not None and a.deadline <= now
        ]
        out = []
        for key in expired:
            del self._assumed[key]
            pod_info = self._unplace(key)
            if pod_info is not None:
                log.warning(
                    "assumed pod %s on %s expired before it was seen bound", pod_info.key, pod_info.node_name
                )
                out.append(pod_info)
        return out

    @property
    def pod_count(self) -> int:
        return len(self._pods)

    @property
    def assumed_count(self) -> int:
        return len(self._assumed)

    # -- snapshots ------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        snapshot = Snapshot()
        self.update_snapshot(snapshot)
        return snapshot

    def update_snapshot(self, snapshot: Snapshot) -> Snapshot:
        """Bring ``snapshot`` up to date, copying only what changed since it was last updated
        (and any node the snapshot's own add_pod/remove_pod changed)."""
        since = snapshot.generation
        rebuild = snapshot.membership_generation != self._membership_generation
        changed: list[NodeInfo] = []
        for name in reversed(self._nodes):
            node_info = self._nodes[name]
            if node_info.generation <= since:
                break
            changed.append(node_info)
        touched = snapshot.touched
        if rebuild:
            fresh = {n.name: n.clone() for n in changed if n.node is not None}
            for name in touched:
                node_info = self._nodes.get(name)
                if node_info is not None and node_info.node is not None and name not in fresh:
                    fresh[name] = node_info.clone()
            nodes = []
            for name, node_info in self._nodes.items():
                if node_info.node is None:
                    continue
                copy = fresh.get(name) or snapshot.get(name)
                nodes.append(copy if copy is not None else node_info.clone())
            # Stable order (by name) so that the filter walk's rotation means the same
            # thing however the nodes arrived.
            nodes.sort(key=lambda n: n.name)
            snapshot._reset(nodes)
        else:
            for node_info in changed:
                if node_info.node is not None:
                    snapshot._replace(node_info.clone())
            for name in touched:
                node_info = self._nodes.get(name)
                if node_info is not None and node_info.node is not None:
                    snapshot._replace(node_info.clone())
        touched.clear()
        snapshot.lowest_priority = min(self._priorities) if self._priorities else NO_PODS
        snapshot.generation = self._generation
        snapshot.membership_generation = self._membership_generation
        return snapshot

    def dump(self) -> dict[str, Any]:
        """What the cache holds, for debugging."""
        return {
            "nodes": {
                name: {"node": n.node is not None, "pods": sorted(n.pods), "requested": n.requested}
                for name, n in self._nodes.items()
            },
            "assumed": {key: a.node_name for key, a in self._assumed.items()},
        }
