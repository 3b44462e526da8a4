"""What a scheduling cycle looks at: pods and nodes reduced to plain integers once, so the
per-node checks of the hot path are comparisons rather than quantity parsing.

- ``PodInfo``: a pod and its effective requests (cpu in millicores, memory in bytes, GPUs,
  other resources in whole units), computed the way Kubernetes does.
- ``NodeInfo``: a node, the pods on it, what they request, and which GPUs are free in each
  interconnect group.
- ``Snapshot``: the NodeInfos one cycle works on. The scheduler cache hands out snapshots
  whose NodeInfos are private copies, so a cycle may add pods to them ("what if") freely.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from fractions import Fraction
from typing import Any

from gpufleet.api import k8s, podresources
from gpufleet.api.gpu import (
    GPU_INDICES_ANNOTATION,
    GPU_MEMORY_LABEL,
    GPU_RESOURCE,
    GPUS_ANNOTATION,
    GPUDevice,
    parse_gpu_indices,
    parse_gpus_annotation,
)
from gpufleet.api.podgroup import group_name
from gpufleet.api.quantity import format_quantity, whole_amount
from gpufleet.api.taints import PREFER_NO_SCHEDULE, taint_tuples, toleration_tuples
from gpufleet.scheduler.volumes import EMPTY as EMPTY_STORAGE
from gpufleet.scheduler.volumes import StorageState

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"

# What a container that requests no cpu/memory counts as when nodes are *scored*, so that
# request-less pods still spread (Kubernetes' DefaultMilliCPURequest / DefaultMemoryRequest).
# Filtering always uses the real requests.
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024

_NO_POD_LIMIT = 2**62
# Snapshot.lowest_priority of a snapshot without pods.
NO_PODS = 2**62

_NONZERO_CPU = "\x00nonzero-cpu"
_NONZERO_MEMORY = "\x00nonzero-memory"


@functools.lru_cache(maxsize=16384)
def _amount(resource: str, quantity: str) -> int:
    # Kubernetes compares cpu in millicores (MilliValue) and everything else in whole units
    # (Value), both rounded up; manifests repeat a few quantities, hence the memo.
    return whole_amount(resource, quantity)


# What a container that requests no cpu/memory is scored as (the non-missing requests).
_NON_MISSING = {CPU: Fraction(DEFAULT_MILLI_CPU_REQUEST, 1000), MEMORY: Fraction(DEFAULT_MEMORY_REQUEST)}


def pod_requests(spec: k8s.PodSpec) -> dict[str, int]:
    """A pod's effective requests as integers (cpu in millicores), by Kubernetes' rule
    (:func:`gpufleet.api.podresources.pod_requests`), with the cpu and memory it is scored
    as under two private keys (request-less containers counted as 100m and 200Mi)."""
    # Kubernetes rounds the pod's total up, not each container.
    exact, nonzero = podresources.pod_requests_and_non_missing(spec, _NON_MISSING)
    total = {name: whole_amount(name, amount) for name, amount in exact.items()}
    total[_NONZERO_CPU] = whole_amount(CPU, nonzero.get(CPU, Fraction(0)))
    total[_NONZERO_MEMORY] = whole_amount(MEMORY, nonzero.get(MEMORY, Fraction(0)))
    return total


def _timestamp(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def pod_key(pod: Any) -> str:
    """'namespace/name' of a pod model."""
    meta = pod.metadata
    return f"{meta.namespace or ''}/{meta.name or ''}" if meta is not None else "/"


# Controllers whose replicas Kubernetes spreads by default (SystemDefaulting in
# PodTopologySpread): losing one node should not take all of a service's replicas.
SPREAD_OWNER_KINDS = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController"})


def spread_owner_uid(meta: k8s.ObjectMeta) -> str:
    """The uid of the pod's controller when that is a ReplicaSet, StatefulSet or
    ReplicationController; "" otherwise (bare pods, Jobs, gangs)."""
    for ref in meta.owner_references or ():
        if ref.controller:
            return ref.uid if ref.kind in SPREAD_OWNER_KINDS else ""
    return ""


class PodInfo:
    """A pod and everything the plugins read from it, computed once.

    The pod object is shared with the informer cache: never modify it. ``node_name`` and
    ``gpu_indices`` are the assignment (bound or assumed), which may differ from the pod
    object while an assumption is in flight.
    """

    __slots__ = (
        "pod",
        "key",
        "uid",
        "namespace",
        "name",
        "node_name",
        "priority",
        "creation_timestamp",
        "cpu",
        "memory",
        "gpus",
        "scalar",
        "nonzero_cpu",
        "nonzero_memory",
        "gpu_indices",
        "tolerations",
        "labels",
        "annotations",
        "spread_owner",
        "pod_group",
        "preemption_policy",
        "terminating",
        "cache",
    )

    def __init__(self, pod: k8s.Pod | Mapping[str, Any]) -> None:
        if not isinstance(pod, k8s.Pod):
            pod = k8s.Pod.model_validate(pod)
        self.pod = pod
        meta = pod.metadata or k8s.ObjectMeta()
        spec = pod.spec or k8s.PodSpec(containers=[])
        self.namespace = meta.namespace or ""
        self.name = meta.name or ""
        self.key = f"{self.namespace}/{self.name}"
        self.uid = meta.uid or ""
        self.node_name = spec.node_name or ""
        self.priority = spec.priority or 0
        self.creation_timestamp = _timestamp(meta.creation_timestamp)
        self.labels = meta.labels or {}
        self.annotations = meta.annotations or {}
        requests = pod_requests(spec)
        self.nonzero_cpu = requests.pop(_NONZERO_CPU, 0)
        self.nonzero_memory = requests.pop(_NONZERO_MEMORY, 0)
        self.cpu = requests.pop(CPU, 0)
        self.memory = requests.pop(MEMORY, 0)
        self.gpus = requests.pop(GPU_RESOURCE, 0)
        self.scalar = {name: amount for name, amount in requests.items() if amount}
        text = self.annotations.get(GPU_INDICES_ANNOTATION)
        self.gpu_indices: tuple[int, ...] = parse_gpu_indices(text) if text else ()
        self.tolerations = toleration_tuples(spec.tolerations)
        self.spread_owner = spread_owner_uid(meta)
        # 'namespace/name' of the PodGroup the pod belongs to (gang scheduling), or "".
        group = group_name(self.labels, self.annotations)
        self.pod_group = f"{self.namespace}/{group}" if group else ""
        self.preemption_policy = spec.preemption_policy or "PreemptLowerPriority"
        # Deleted and on its way out: it still holds what it requests, but preempting it
        # again would gain nothing.
        self.terminating = meta.deletion_timestamp is not None
        # Per-pod memo for plugins (compiled selectors and the like): keyed by plugin name,
        # computed on the first cycle and reused on every retry of the same pod object.
        self.cache: dict[str, Any] = {}

    def assigned(self, node_name: str, gpu_indices: Iterable[int] = ()) -> PodInfo:
        """A copy placed on ``node_name`` with those GPUs (what the cache assumes)."""
        other = object.__new__(PodInfo)
        for slot in PodInfo.__slots__:
            setattr(other, slot, getattr(self, slot))
        other.node_name = node_name
        other.gpu_indices = tuple(sorted(gpu_indices))
        return other

    @property
    def requests(self) -> dict[str, int]:
        """Requests by resource name (cpu in millicores), zero entries left out."""
        out = {CPU: self.cpu, MEMORY: self.memory, GPU_RESOURCE: self.gpus, **self.scalar}
        return {name: amount for name, amount in out.items() if amount}

    @property
    def terminal(self) -> bool:
        status = self.pod.status
        return status is not None and status.phase in ("Succeeded", "Failed")

    def __repr__(self) -> str:
        return f"PodInfo({self.key!r}, node={self.node_name!r}, gpus={self.gpus}, indices={self.gpu_indices})"


class NodeInfo:
    """A node, the pods assigned to it (bound or assumed) and what is left.

    Allocatable falls back to capacity when a node publishes no allocatable. A node that
    publishes no ``pods`` allocatable has no pod-count limit (Kubernetes would read it as
    zero; a GPU server that reports only GPUs should not refuse every pod).
    """

    __slots__ = (
        "node",
        "name",
        "labels",
        "annotations",
        "taints",
        "soft_taints",
        "unschedulable",
        "alloc_cpu",
        "alloc_memory",
        "alloc_gpus",
        "alloc_pods",
        "pod_limit",
        "alloc_scalar",
        "req_cpu",
        "req_memory",
        "req_gpus",
        "req_scalar",
        "nonzero_cpu",
        "nonzero_memory",
        "cpu_left",
        "memory_left",
        "gpus_left",
        "pods_left",
        "pods",
        "gpu_devices",
        "gpu_group_of",
        "gpu_memory_mib",
        "gpu_refs",
        "free_gpus",
        "free_gpu_total",
        "unindexed_gpus",
        "generation",
        "owner_pods",
        "memo",
        "_gpu_source",
    )

    def __init__(
        self, node: k8s.Node | Mapping[str, Any] | None = None, pods: Iterable[PodInfo] = ()
    ) -> None:
        self.node: k8s.Node | None = None
        self.name = ""
        self.labels: dict[str, str] = {}
        self.annotations: dict[str, str] = {}
        self.taints: tuple[tuple[str, str, str], ...] = ()
        # The PreferNoSchedule ones, which only lower the score.
        self.soft_taints: tuple[tuple[str, str, str], ...] = ()
        self.unschedulable = False
        self.alloc_cpu = 0
        self.alloc_memory = 0
        self.alloc_gpus = 0
        self.alloc_pods: int | None = None
        # alloc_pods as a plain bound (the hot path compares without a None check).
        self.pod_limit = _NO_POD_LIMIT
        self.alloc_scalar: dict[str, int] = {}
        self.req_cpu = 0
        self.req_memory = 0
        self.req_gpus = 0
        self.req_scalar: dict[str, int] = {}
        self.nonzero_cpu = 0
        self.nonzero_memory = 0
        # allocatable - requested, kept current so the hot path only compares.
        self.cpu_left = 0
        self.memory_left = 0
        self.gpus_left = 0
        self.pods_left = _NO_POD_LIMIT
        self.pods: dict[str, PodInfo] = {}
        self.gpu_devices: tuple[GPUDevice, ...] = ()
        # index -> group, healthy devices only: the indices the scheduler may hand out.
        self.gpu_group_of: dict[int, str] = {}
        self.gpu_memory_mib: int | None = None
        # index -> how many assigned pods name it (more than one only if something else
        # double-booked it; the scheduler never does).
        self.gpu_refs: dict[int, int] = {}
        self.free_gpus: dict[str, set[int]] = {}
        self.free_gpu_total = 0
        # GPUs requested by pods whose annotation does not say which (bound by something
        # other than this scheduler): they count against the free total, at unknown indices.
        self.unindexed_gpus = 0
        self.generation = 0
        # spread owner uid -> how many of its pods are here, so spreading reads a count
        # instead of walking the node's pods on every cycle.
        self.owner_pods: dict[str, int] = {}
        # Plugins' per-node results keyed by what of the pod they depend on (a score for a
        # pod shape, say); emptied whenever the node or its pods change. Nodes that did not
        # change keep their NodeInfo from one snapshot to the next, so on a large, mostly
        # quiet cluster most lookups hit.
        self.memo: dict[Any, Any] = {}
        self._gpu_source: tuple[Any, ...] | None = None
        if node is not None:
            self.set_node(node)
        for p in pods:
            self.add_pod(p)

    # -- node ---------------------------------------------------------------------------

    def set_node(self, node: k8s.Node | Mapping[str, Any]) -> None:
        if not isinstance(node, k8s.Node):
            node = k8s.Node.model_validate(node)
        self.node = node
        self.memo = {}
        meta = node.metadata or k8s.ObjectMeta()
        spec = node.spec or k8s.NodeSpec()
        status = node.status or k8s.NodeStatus()
        self.name = meta.name or ""
        self.labels = meta.labels or {}
        self.annotations = meta.annotations or {}
        self.taints = taint_tuples(spec.taints)
        self.soft_taints = tuple(t for t in self.taints if t[2] == PREFER_NO_SCHEDULE)
        self.unschedulable = bool(spec.unschedulable)
        alloc = status.allocatable if status.allocatable is not None else (status.capacity or {})
        amounts = {name: _amount(name, str(q)) for name, q in alloc.items()}
        self.alloc_cpu = amounts.pop(CPU, 0)
        self.alloc_memory = amounts.pop(MEMORY, 0)
        self.alloc_gpus = amounts.pop(GPU_RESOURCE, 0)
        self.alloc_pods = amounts.pop(PODS, None)
        self.pod_limit = _NO_POD_LIMIT if self.alloc_pods is None else self.alloc_pods
        self.alloc_scalar = amounts
        self._update_left()
        gpu_source = (
            self.annotations.get(GPUS_ANNOTATION),
            self.alloc_gpus,
            self.labels.get(GPU_MEMORY_LABEL),
        )
        if gpu_source != self._gpu_source:
            self._gpu_source = gpu_source
            self._set_gpu_inventory()

    def _set_gpu_inventory(self) -> None:
        text = self.annotations.get(GPUS_ANNOTATION)
        devices = parse_gpus_annotation(text) if text else None
        if devices is None:
            devices = tuple(GPUDevice(index=i) for i in range(self.alloc_gpus))
        self.gpu_devices = devices
        self.gpu_group_of = {d.index: d.group for d in devices if d.healthy}
        label = self.labels.get(GPU_MEMORY_LABEL, "")
        memories = [d.memory_mib for d in devices if d.memory_mib is not None]
        if label.isdigit():
            self.gpu_memory_mib = int(label)
        else:
            self.gpu_memory_mib = min(memories) if memories else None
        self._rebuild_free_gpus()

    def _rebuild_free_gpus(self) -> None:
        free: dict[str, set[int]] = {}
        refs = self.gpu_refs
        for index, group in self.gpu_group_of.items():
            if not refs.get(index):
                free.setdefault(group, set()).add(index)
        self.free_gpus = free
        self.free_gpu_total = sum(len(s) for s in free.values())

    # -- pods ---------------------------------------------------------------------------

    def add_pod(self, pod_info: PodInfo) -> None:
        if pod_info.key in self.pods:
            self.remove_pod(self.pods[pod_info.key])
        self.pods[pod_info.key] = pod_info
        self._account(pod_info, 1)

    def remove_pod(self, pod_info: PodInfo) -> bool:
        """Remove the pod with this key; False when it was not here."""
        current = self.pods.pop(pod_info.key, None)
        if current is None:
            return False
        self._account(current, -1)
        return True

    def _update_left(self) -> None:
        # Never negative: on an over-committed node (pods bound by something else) nothing
        # is left, and a request of zero still fits, as in Kubernetes' fit check.
        self.cpu_left = max(0, self.alloc_cpu - self.req_cpu)
        self.memory_left = max(0, self.alloc_memory - self.req_memory)
        self.gpus_left = max(0, self.alloc_gpus - self.req_gpus)
        self.pods_left = self.pod_limit - len(self.pods)

    def _account(self, p: PodInfo, sign: int) -> None:
        if self.memo:
            self.memo = {}
        self.req_cpu += sign * p.cpu
        self.req_memory += sign * p.memory
        self.req_gpus += sign * p.gpus
        self._update_left()
        self.nonzero_cpu += sign * p.nonzero_cpu
        self.nonzero_memory += sign * p.nonzero_memory
        owner = p.spread_owner
        if owner:
            count = self.owner_pods.get(owner, 0) + sign
            if count > 0:
                self.owner_pods[owner] = count
            else:
                self.owner_pods.pop(owner, None)
        if p.scalar:
            req = self.req_scalar
            for name, amount in p.scalar.items():
                left = req.get(name, 0) + sign * amount
                if left:
                    req[name] = left
                else:
                    req.pop(name, None)
        indices = p.gpu_indices
        if p.gpus or indices:
            self.unindexed_gpus += sign * max(0, p.gpus - len(indices))
            refs = self.gpu_refs
            group_of = self.gpu_group_of
            for index in indices:
                count = refs.get(index, 0) + sign
                if count > 0:
                    refs[index] = count
                else:
                    refs.pop(index, None)
                group = group_of.get(index)
                if group is None:
                    continue
                if sign > 0 and count == 1:
                    self.free_gpus[group].discard(index)
                    self.free_gpu_total -= 1
                elif sign < 0 and count == 0:
                    self.free_gpus.setdefault(group, set()).add(index)
                    self.free_gpu_total += 1

    # -- views --------------------------------------------------------------------------

    @property
    def num_pods(self) -> int:
        return len(self.pods)

    @property
    def free_gpu_count(self) -> int:
        """GPUs a new pod could get: both the count and the free healthy indices must allow."""
        return max(0, min(self.alloc_gpus - self.req_gpus, self.free_gpu_total - self.unindexed_gpus))

    @property
    def allocatable(self) -> dict[str, int]:
        out = {
            CPU: self.alloc_cpu,
            MEMORY: self.alloc_memory,
            GPU_RESOURCE: self.alloc_gpus,
            **self.alloc_scalar,
        }
        if self.alloc_pods is not None:
            out[PODS] = self.alloc_pods
        return out

    @property
    def requested(self) -> dict[str, int]:
        out = {CPU: self.req_cpu, MEMORY: self.req_memory, GPU_RESOURCE: self.req_gpus, **self.req_scalar}
        out[PODS] = len(self.pods)
        return out

    def clone(self) -> NodeInfo:
        other = object.__new__(NodeInfo)
        other.node = self.node
        other.name = self.name
        other.labels = self.labels
        other.annotations = self.annotations
        other.taints = self.taints
        other.soft_taints = self.soft_taints
        other.unschedulable = self.unschedulable
        other.alloc_cpu = self.alloc_cpu
        other.alloc_memory = self.alloc_memory
        other.alloc_gpus = self.alloc_gpus
        other.alloc_pods = self.alloc_pods
        other.pod_limit = self.pod_limit
        other.alloc_scalar = self.alloc_scalar
        other.req_cpu = self.req_cpu
        other.req_memory = self.req_memory
        other.req_gpus = self.req_gpus
        other.req_scalar = dict(self.req_scalar)
        other.nonzero_cpu = self.nonzero_cpu
        other.nonzero_memory = self.nonzero_memory
        other.cpu_left = self.cpu_left
        other.memory_left = self.memory_left
        other.gpus_left = self.gpus_left
        other.pods_left = self.pods_left
        other.pods = dict(self.pods)
        other.gpu_devices = self.gpu_devices
        other.gpu_group_of = self.gpu_group_of
        other.gpu_memory_mib = self.gpu_memory_mib
        other.gpu_refs = dict(self.gpu_refs)
        other.free_gpus = {group: set(indices) for group, indices in self.free_gpus.items()}
        other.free_gpu_total = self.free_gpu_total
        other.unindexed_gpus = self.unindexed_gpus
        other.generation = self.generation
        other.owner_pods = dict(self.owner_pods) if self.owner_pods else {}
        other.memo = {}
        other._gpu_source = self._gpu_source
        return other

    def describe_free(self) -> str:
        """One line of what is left, for logs and diagnostics."""
        cpu = format_quantity(f"{max(0, self.alloc_cpu - self.req_cpu)}m", "cpu")
        memory = format_quantity(max(0, self.alloc_memory - self.req_memory), "memory")
        return f"cpu {cpu}, memory {memory}, {GPU_RESOURCE} {self.free_gpu_count}"

    def __repr__(self) -> str:
        return f"NodeInfo({self.name!r}, pods={len(self.pods)}, gpus={self.req_gpus}/{self.alloc_gpus})"


class Snapshot:
    """The nodes of one scheduling cycle, in a stable order, and a lookup by name.

    ``add_pod``/``remove_pod`` change the snapshot's own NodeInfos (an assumed pod, or a
    preemption "what if"); the cache notices and copies those nodes afresh on the next
    ``update_snapshot``, so such changes never leak into a later cycle.
    """

    def __init__(self, nodes: Iterable[NodeInfo] = ()) -> None:
        self.node_infos: list[NodeInfo] = [n for n in nodes if n.node is not None]
        self._by_name: dict[str, NodeInfo] = {n.name: n for n in self.node_infos}
        self._position: dict[str, int] = {n.name: i for i, n in enumerate(self.node_infos)}
        # Highest cache generation copied in, and the cache's node-set generation.
        self.generation = -1
        self.membership_generation = -1
        self.touched: set[str] = set()
        # The PodDisruptionBudget objects preemption weighs its victims against, set by
        # the scheduler before each cycle (preemption.disruption_budgets reads them).
        self.pdbs: list[Any] = []
        # The claims, volumes and storage classes of the cycle (a volumes.StorageState),
        # set by the scheduler before each cycle; VolumeBinding reads them.
        self.storage: StorageState = EMPTY_STORAGE
        # No pod on these nodes has a lower priority than this (None: not known); lets
        # preemption answer at once when nothing could be a victim.
        self.lowest_priority: int | None = None

    def group_members(self, group: str) -> list[PodInfo]:
        """The pods of PodGroup 'namespace/name' placed on this snapshot's nodes."""
        if not group:
            return []
        return [p for n in self.node_infos for p in n.pods.values() if p.pod_group == group]

    def get(self, name: str) -> NodeInfo | None:
        return self._by_name.get(name)

    def __len__(self) -> int:
        return len(self.node_infos)

    def __iter__(self) -> Iterator[NodeInfo]:
        return iter(self.node_infos)

    def add_pod(
        self, pod_info: PodInfo, node_name: str | None = None, gpu_indices: Iterable[int] | None = None
    ) -> PodInfo:
        """Place a pod on a node of this snapshot; returns the placed PodInfo."""
        name = node_name or pod_info.node_name
        node_info = self._by_name.get(name)
        if node_info is None:
            raise KeyError(f"node {name!r} is not in the snapshot")
        placed = pod_info.assigned(name, pod_info.gpu_indices if gpu_indices is None else gpu_indices)
        node_info.add_pod(placed)
        if self.lowest_priority is not None and placed.priority < self.lowest_priority:
            self.lowest_priority = placed.priority
        self.touched.add(name)
        return placed

    def remove_pod(self, pod_info: PodInfo) -> bool:
        node_info = self._by_name.get(pod_info.node_name)
        if node_info is None:
            return False
        self.touched.add(node_info.name)
        return node_info.remove_pod(pod_info)

    # -- used by the cache to refresh a snapshot in place ------------------------------

    def _replace(self, node_info: NodeInfo) -> None:
        position = self._position.get(node_info.name)
        if position is None:
            raise KeyError(node_info.name)
        self.node_infos[position] = node_info
        self._by_name[node_info.name] = node_info

    def _reset(self, node_infos: list[NodeInfo]) -> None:
        self.node_infos = node_infos
        self._by_name = {n.name: n for n in node_infos}
        self._position = {n.name: i for i, n in enumerate(node_infos)}
