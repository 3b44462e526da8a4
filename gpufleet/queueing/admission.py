"""Queue admission as a pure function: given the ClusterQueues, flavors, nodes and workloads,
which pending workloads are admitted (with which flavor for each resource), which admitted
ones are preempted to make room, and why every other one waits.

The quota rules are Kueue's (v1beta1, classical preemption):

- a ClusterQueue may use its ``nominalQuota`` of each flavor and resource; in a cohort the
  part of its quota above ``nominalQuota - lendingLimit`` is lent to the cohort's pool, and
  it may borrow from that pool up to ``borrowingLimit`` (unbounded when unset);
- a pending workload gets, for each pod set and resource group, the first flavor (in the
  ClusterQueue's order) whose quota fits; ``whenCanBorrow: TryNextFlavor`` prefers a later
  flavor that fits without borrowing;
- preemption (``reclaimWithinCohort``, ``borrowWithinCohort``, ``withinClusterQueue``) looks
  for the fewest victims: borrowers in other ClusterQueues first, lower priority first,
  most recently admitted first; victims that turn out not to be needed are kept;
- a workload whose pods request a resource that none of the ClusterQueue's resource groups
  covers is inadmissible ("resource nvidia.com/gpu unavailable in ClusterQueue"), however
  much quota is free;
- across ClusterQueues, workloads that do not borrow go first, then by priority and age;
  with fair sharing, the ClusterQueue whose share of borrowed capacity (divided by its
  ``fairSharing.weight``) would be lowest after the admission goes first.

On top of quota, admission checks the *shape*: every pod of the workload must fit, all at
once, on a node that matches its flavor (its GPUs on one node, or in one interconnect group
when the pod asks for that), counting the pods bound now and the pods of workloads admitted
but not yet running. So 8 free GPUs spread 2+2+2+2 over four nodes do not admit a pod that
needs 8 GPUs on one node, and an admitted gang does not sit pending.

Amounts are integers: cpu in millicores, every other resource in whole units.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufleet.api.gpu import GPU_RESOURCE
from gpufleet.api.taints import TaintTuple, TolerationTuple, tolerates_all

# Why a workload waits: the first word of its QuotaReserved=False message, and the column
# `get workloads` shows.
WAIT_QUOTA = "Quota"
WAIT_SHAPE = "Shape"
WAIT_PRIORITY = "Priority"
WAIT_PREEMPTING = "Preempting"
WAIT_INADMISSIBLE = "Inadmissible"
WAIT_QUEUED = "Queued"

# Workload Preempted condition reasons (Kueue's).
IN_CLUSTER_QUEUE = "InClusterQueue"
IN_COHORT_RECLAMATION = "InCohortReclamation"
IN_COHORT_RECLAIM_WHILE_BORROWING = "InCohortReclaimWhileBorrowing"

FlavorResource = tuple[str, str]  # (flavor, resource)
Assignment = dict[str, dict[str, str]]  # pod set -> resource -> flavor


# -- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quota:
    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    @property
    def guaranteed(self) -> int:
        """What the queue keeps for itself and never lends."""
        return max(0, self.nominal - self.lending_limit) if self.lending_limit is not None else 0


@dataclass(frozen=True)
class ResourceGroupInfo:
    resources: tuple[str, ...]
    flavors: tuple[str, ...]


@dataclass
class ClusterQueueInfo:
    name: str
    groups: list[ResourceGroupInfo]
    quotas: dict[FlavorResource, Quota]
    cohort: str = ""
    weight: float = 1.0
    strategy: str = "BestEffortFIFO"
    reclaim_within_cohort: str = "Never"
    borrow_within_cohort: str = "Never"
    borrow_max_priority: int | None = None
    within_cluster_queue: str = "Never"
    when_can_borrow: str = "Borrow"
    # Why the queue admits nothing (stopped, a flavor missing); empty when active.
    inactive: str = ""

    def group_of(self, resource: str) -> ResourceGroupInfo | None:
        for g in self.groups:
            if resource in g.resources:
                return g
        return None


# (key, operator, value, effect), as Kubernetes' Toleration.
Toleration = TolerationTuple
# (key, value, effect) of a node taint that keeps pods off (NoSchedule, NoExecute).
Taint = TaintTuple


@dataclass(frozen=True)
class FlavorInfo:
    name: str
    node_labels: Mapping[str, str] = field(default_factory=dict)
    # Given to the pods admitted on this flavor, as Kueue does.
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True)
class PodSetInfo:
    name: str
    count: int
    requests: Mapping[str, int]  # per pod
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # The pod's GPUs must come from one interconnect group (NVLink domain) of its node.
    same_gpu_group: bool = False
    tolerations: tuple[Toleration, ...] = ()

    @property
    def gpus(self) -> int:
        return int(self.requests.get(GPU_RESOURCE, 0))


@dataclass(frozen=True)
class Placement:
    """GPUs one bound pod holds on its node, by interconnect group."""

    node: str
    gpus: Mapping[str, int]


@dataclass
class WorkloadInfo:
    key: str
    cluster_queue: str
    pod_sets: list[PodSetInfo]
    priority: int = 0
    # Queue order: creation, or the time it was last evicted (it goes back in line).
    timestamp: float = 0.0
    # Set once admitted: pod set -> resource -> flavor.
    admission: Assignment | None = None
    admitted_at: float = 0.0
    # Admitted, told to stop, still holding its quota until its pods are gone.
    evicting: bool = False
    # Its pods bound to nodes and still active.
    placed: list[Placement] = field(default_factory=list)
    # Admitted: how many pods of each pod set are not bound yet.
    unbound: dict[str, int] = field(default_factory=dict)
    # Set when it cannot even be considered (its LocalQueue is missing, say).
    problem: str = ""
    # Evicting: the workload it makes room for, when known.
    preempted_by: str = ""


@dataclass
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    capacity: dict[str, int]  # interconnect group -> GPUs
    used: dict[str, int] = field(default_factory=dict)  # by bound, active pods
    taints: tuple[Taint, ...] = ()

    def free(self) -> dict[str, int]:
        return {g: max(0, n - self.used.get(g, 0)) for g, n in self.capacity.items()}


# -- outputs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wait:
    kind: str
    message: str


@dataclass(frozen=True)
class Preemption:
    preemptor: str
    reason: str
    message: str


@dataclass
class CycleResult:
    admitted: dict[str, Assignment] = field(default_factory=dict)
    borrowing: set[str] = field(default_factory=set)
    preempted: dict[str, Preemption] = field(default_factory=dict)
    waiting: dict[str, Wait] = field(default_factory=dict)


# -- quota ----------------------------------------------------------------------------------------


Usage = dict[str, dict[FlavorResource, int]]  # cluster queue -> (flavor, resource) -> amount


def workload_usage(wl: WorkloadInfo, assignment: Assignment | None = None) -> dict[FlavorResource, int]:
    """What the workload counts against its queue's quota under ``assignment`` (default: its own)."""
    assignment = assignment if assignment is not None else wl.admission or {}
    out: dict[FlavorResource, int] = {}
    for ps in wl.pod_sets:
        flavors = assignment.get(ps.name) or {}
        for res, amount in ps.requests.items():
            flavor = flavors.get(res)
            if flavor is not None and amount:
                out[(flavor, res)] = out.get((flavor, res), 0) + amount * ps.count
    return out


def usage_of(workloads: Iterable[WorkloadInfo], exclude: set[str] = frozenset()) -> Usage:  # type: ignore[assignment]
    usage: Usage = {}
    for wl in workloads:
        if wl.admission is None or wl.key in exclude:
            continue
        per = usage.setdefault(wl.cluster_queue, {})
        for fr, amount in workload_usage(wl).items():
            per[fr] = per.get(fr, 0) + amount
    return usage


class Quotas:
    """The ClusterQueues and their cohorts, answering 'how much more may this queue use'."""

    def __init__(self, queues: Mapping[str, ClusterQueueInfo]) -> None:
        self.queues = queues
        self.cohorts: dict[str, list[ClusterQueueInfo]] = {}
        for cq in queues.values():
            if cq.cohort:
                self.cohorts.setdefault(cq.cohort, []).append(cq)

    def members(self, cq: ClusterQueueInfo) -> list[ClusterQueueInfo]:
        return self.cohorts.get(cq.cohort, [cq]) if cq.cohort else [cq]

    def available(self, cq: ClusterQueueInfo, fr: FlavorResource, usage: Usage) -> int:
        """Kueue's ``available``: unused guaranteed quota plus what the cohort can still lend,
        capped by the queue's borrowingLimit. Negative when the queue is over its share."""
        quota = cq.quotas.get(fr)
        if quota is None:
            return 0
        used = usage.get(cq.name, {}).get(fr, 0)
        if not cq.cohort:
            return quota.nominal - used
        local = max(0, quota.guaranteed - used)
        pool = 0
        pool_used = 0
        for member in self.members(cq):
            q = member.quotas.get(fr)
            if q is None:
                continue
            pool += q.nominal - q.guaranteed
            pool_used += max(0, usage.get(member.name, {}).get(fr, 0) - q.guaranteed)
        parent = pool - pool_used
        if quota.borrowing_limit is not None:
            stored = quota.nominal - quota.guaranteed
            used_in_parent = max(0, used - quota.guaranteed)
            parent = min(stored - used_in_parent + quota.borrowing_limit, parent)
        return local + parent

    def borrowing(self, cq: ClusterQueueInfo, usage: Usage, frs: Iterable[FlavorResource] | None = None) -> bool:
        """Whether the queue uses more than its nominal quota (of ``frs``, or of anything)."""
        used = usage.get(cq.name, {})
        keys = list(frs) if frs is not None else list(used)
        return any(used.get(fr, 0) > cq.quotas[fr].nominal for fr in keys if fr in cq.quotas)

    def share(self, cq: ClusterQueueInfo, usage: Usage) -> float:
        """Kueue's dominant resource share: for each resource, what the queue borrows as a
        part (per mille) of what the cohort can lend, the largest of them, over the weight."""
        if not cq.cohort:
            return 0.0
        borrowed: dict[str, int] = {}
        for fr, amount in usage.get(cq.name, {}).items():
            quota = cq.quotas.get(fr)
            nominal = quota.nominal if quota is not None else 0
            if amount > nominal:
                borrowed[fr[1]] = borrowed.get(fr[1], 0) + amount - nominal
        if not borrowed:
            return 0.0
        lendable: dict[str, int] = {}
        for member in self.members(cq):
            for (_f, res), q in member.quotas.items():
                lendable[res] = lendable.get(res, 0) + (q.lending_limit if q.lending_limit is not None else q.nominal)
        drs = max(amount * 1000 / lendable[res] if lendable.get(res) else math.inf
                  for res, amount in borrowed.items())
        if cq.weight <= 0:
            return math.inf
        return drs / cq.weight


# -- shape ----------------------------------------------------------------------------------------


FreeState = dict[str, dict[str, int]]  # node -> interconnect group -> free GPUs


@dataclass(frozen=True)
class PodDemand:
    pod_set: str
    gpus: int
    selector: Mapping[str, str]
    same_group: bool
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True)
class ShapeMiss:
    pod_set: str
    gpus: int
    unplaced: int
    same_group: bool
    eligible_free: tuple[int, ...]  # free GPUs on each matching node, before placing


def merge_selectors(*selectors: Mapping[str, str]) -> dict[str, str] | None:
    """The union of label requirements; None when two of them want different values."""
    out: dict[str, str] = {}
    for sel in selectors:
        for k, v in sel.items():
            if out.get(k, v) != v:
                return None
            out[k] = v
    return out


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _allowed(node: NodeInfo, tolerations: tuple[Toleration, ...]) -> bool:
    return tolerates_all(node.taints, tolerations)


def _room(groups: Mapping[str, int], same_group: bool) -> int:
    if not groups:
        return 0
    return max(groups.values()) if same_group else sum(groups.values())


def _take(groups: dict[str, int], gpus: int, same_group: bool) -> dict[str, int]:
    if same_group:
        # The tightest group that holds them all keeps the big groups whole.
        best = min((g for g, n in groups.items() if n >= gpus), key=lambda g: (groups[g], g))
        groups[best] -= gpus
        return {best: gpus}
    taken: dict[str, int] = {}
    left = gpus
    for g in sorted(groups, key=lambda g: (-groups[g], g)):
        if left == 0:
            break
        n = min(groups[g], left)
        if n:
            groups[g] -= n
            taken[g] = n
            left -= n
    return taken


def place(demands: Iterable[PodDemand], free: FreeState, nodes: Mapping[str, NodeInfo],
          taken: list[Placement] | None = None) -> ShapeMiss | None:
    """Place pods on nodes, biggest first, each on the node where it fits tightest
    (best-fit decreasing); ``free`` is updated and, when given, ``taken`` says where each pod
    went. Returns the first pod set that does not fit."""
    pending = sorted((d for d in demands if d.gpus > 0), key=lambda d: -d.gpus)
    missed: dict[tuple, list[PodDemand]] = {}
    before: dict[tuple, tuple[int, ...]] = {}
    for d in pending:
        sel_key = (d.pod_set, d.gpus, d.same_group, tuple(sorted(d.selector.items())), d.tolerations)
        eligible = [n for n in nodes.values()
                    if n.name in free and _matches(n.labels, d.selector) and _allowed(n, d.tolerations)]
        if sel_key not in before:
            before[sel_key] = tuple(sorted((_room(free[n.name], d.same_group) for n in eligible), reverse=True))
        fitting = [n for n in eligible if _room(free[n.name], d.same_group) >= d.gpus]
        if not fitting:
            missed.setdefault(sel_key, []).append(d)
            continue
        node = min(fitting, key=lambda n: (_room(free[n.name], d.same_group), n.name))
        groups = _take(free[node.name], d.gpus, d.same_group)
        if taken is not None:
            taken.append(Placement(node.name, groups))
    if not missed:
        return None
    key, ds = next(iter(missed.items()))
    return ShapeMiss(ds[0].pod_set, ds[0].gpus, len(ds), ds[0].same_group, before[key])


def shape_message(miss: ShapeMiss, flavor: str) -> str:
    where = "one interconnect group of one node" if miss.same_group else "one node"
    free = "+".join(str(n) for n in miss.eligible_free if n) or "0"
    largest = max(miss.eligible_free, default=0)
    return (f"pod set {miss.pod_set}: {miss.unplaced} pod(s) of {miss.gpus} {GPU_RESOURCE} each must fit on {where}; "
            f"free {GPU_RESOURCE} on the {len(miss.eligible_free)} node(s) of flavor {flavor}: {free} "
            f"(at most {largest} together)")


# -- the cycle --------------------------------------------------------------------------------------


class _Attempt:
    def __init__(self) -> None:
        self.assignment: Assignment | None = None
        self.borrows = False
        self.kind = WAIT_QUOTA
        self.messages: list[str] = []


class Cycle:
    """One admission pass over a snapshot. ``run()`` returns the decisions; the snapshot
    (usage, reservations) is updated as it admits, so one pass may admit many workloads."""

    def __init__(
        self,
        queues: Mapping[str, ClusterQueueInfo],
        flavors: Mapping[str, FlavorInfo],
        workloads: Iterable[WorkloadInfo],
        nodes: Iterable[NodeInfo],
        *,
        fair_sharing: bool = False,
    ) -> None:
        self.queues = dict(queues)
        self.flavors = dict(flavors)
        self.workloads = {wl.key: wl for wl in workloads}
        self.nodes = {n.name: n for n in nodes}
        self.fair_sharing = fair_sharing
        self.quotas = Quotas(self.queues)
        self.result = CycleResult()
        # Assignments made this pass, on top of the workloads' own.
        self._admitted: dict[str, Assignment] = {}
        self._evicting = {wl.key for wl in self.workloads.values() if wl.evicting and wl.admission is not None}
        self._preemptor = {key: self.workloads[key].preempted_by for key in self._evicting}
        # What the workloads holding quota use, kept up to date as the pass admits.
        self._usage_now: Usage = usage_of(self.workloads.values())
        # Free GPUs with the unbound pods of admitted workloads given a place; where each
        # workload's reservation went, so that it can be handed back.
        self._free_now: FreeState = {name: n.free() for name, n in self.nodes.items()}
        self._reserved: dict[str, list[Placement]] = {}
        for wl in self.workloads.values():
            if wl.admission is not None and wl.key not in self._evicting:
                self._reserve(wl, wl.admission, wl.unbound)
        # Bumped whenever the state changes; attempts are cached per version.
        self._version = 0
        self._attempts: dict[str, tuple[int, _Attempt]] = {}

    # -- state views ------------------------------------------------------------------------

    def _assignment_of(self, wl: WorkloadInfo) -> Assignment | None:
        return self._admitted.get(wl.key, wl.admission)

    def _holding(self) -> list[WorkloadInfo]:
        """Workloads that hold quota now (admitted before or during this pass)."""
        out = []
        for wl in self.workloads.values():
            assignment = self._assignment_of(wl)
            if assignment is not None:
                out.append(wl)
        return out

    def _usage(self, exclude: set[str] = frozenset()) -> Usage:  # type: ignore[assignment]
        """A copy of the usage, without that of ``exclude``."""
        usage = {cq: dict(per) for cq, per in self._usage_now.items()}
        for key in exclude:
            wl = self.workloads[key]
            per = usage.get(wl.cluster_queue, {})
            for fr, amount in workload_usage(wl, self._assignment_of(wl)).items():
                per[fr] = per.get(fr, 0) - amount
        return usage

    def _reserve(self, wl: WorkloadInfo, assignment: Assignment, counts: Mapping[str, int]) -> None:
        demands = self._demands(wl, assignment, counts)
        if demands:
            taken: list[Placement] = []
            place(demands, self._free_now, self.nodes, taken)
            self._reserved[wl.key] = taken

    def _record_admission(self, wl: WorkloadInfo, assignment: Assignment) -> None:
        self._admitted[wl.key] = assignment
        per = self._usage_now.setdefault(wl.cluster_queue, {})
        for fr, amount in workload_usage(wl, assignment).items():
            per[fr] = per.get(fr, 0) + amount
        self._reserve(wl, assignment, {ps.name: ps.count for ps in wl.pod_sets})
        self._version += 1

    def _demands(self, wl: WorkloadInfo, assignment: Assignment, counts: Mapping[str, int] | None = None,
                 ) -> list[PodDemand] | None:
        out: list[PodDemand] = []
        for ps in wl.pod_sets:
            if ps.gpus <= 0:
                continue
            flavors = assignment.get(ps.name) or {}
            selector = self._selector(ps, flavors)
            if selector is None:
                return None
            tolerations = ps.tolerations + tuple(
                t for f in dict.fromkeys(flavors.values()) if f in self.flavors for t in self.flavors[f].tolerations)
            n = ps.count if counts is None else counts.get(ps.name, 0)
            out.extend(PodDemand(ps.name, ps.gpus, selector, ps.same_gpu_group, tolerations) for _ in range(n))
        return out

    def _selector(self, ps: PodSetInfo, flavors: Mapping[str, str]) -> dict[str, str] | None:
        labels = [self.flavors[f].node_labels for f in dict.fromkeys(flavors.values()) if f in self.flavors]
        return merge_selectors(*labels, ps.node_selector)

    def _free(self, exclude: set[str] = frozenset()) -> FreeState:  # type: ignore[assignment]
        """A copy of the free GPUs per node and group, once the pods of ``exclude`` are gone
        and their reservations handed back."""
        free = {name: dict(groups) for name, groups in self._free_now.items()}
        for key in exclude:
            wl = self.workloads[key]
            for p in [*wl.placed, *self._reserved.get(key, ())]:
                groups = free.get(p.node)
                if groups is None:
                    continue
                cap = self.nodes[p.node].capacity
                for g, n in p.gpus.items():
                    groups[g] = min(cap.get(g, 0), groups.get(g, 0) + n)
        return free

    # -- flavors ------------------------------------------------------------------------------

    def _fits(self, wl: WorkloadInfo, assignment: Assignment, exclude: set[str], allow_borrow: bool,
              ) -> tuple[bool, str, str]:
        """Whether ``assignment`` fits with ``exclude`` gone: (fits, wait kind, message)."""
        cq = self.queues[wl.cluster_queue]
        usage = self._usage(exclude)
        for (flavor, res), need in sorted(workload_usage(wl, assignment).items()):
            avail = self.quotas.available(cq, (flavor, res), usage)
            if need > avail:
                return False, WAIT_QUOTA, _quota_message(res, flavor, need - max(avail, 0))
            if not allow_borrow and usage.get(cq.name, {}).get((flavor, res), 0) + need > cq.quotas[(flavor, res)].nominal:
                return False, WAIT_QUOTA, (f"insufficient quota for {res} in flavor {flavor} without borrowing "
                                           "while preempting in the cohort")
        demands = self._demands(wl, assignment)
        if demands is None:
            return False, WAIT_SHAPE, "the node labels of the assigned flavors contradict the pod's nodeSelector"
        miss = place(demands, self._free(exclude), self.nodes)
        if miss is not None:
            return False, WAIT_SHAPE, shape_message(miss, _gpu_flavor(assignment, miss.pod_set))
        return True, "", ""

    def _attempt(self, wl: WorkloadInfo, cq: ClusterQueueInfo) -> _Attempt:
        cached = self._attempts.get(wl.key)
        if cached is not None and cached[0] == self._version:
            return cached[1]
        attempt = self._assign(wl, cq)
        self._attempts[wl.key] = (self._version, attempt)
        return attempt

    def _assign(self, wl: WorkloadInfo, cq: ClusterQueueInfo) -> _Attempt:
        """Pick flavors pod set by pod set, each the first that fits quota and shape."""
        attempt = _Attempt()
        assignment: Assignment = {}
        usage = self._usage()
        free = self._free()
        for ps in wl.pod_sets:
            groups: dict[int, ResourceGroupInfo] = {}
            for res, amount in ps.requests.items():
                if amount <= 0:
                    continue
                g = cq.group_of(res)
                if g is not None:
                    groups[id(g)] = g
            chosen: dict[str, str] = {}
            for g in groups.values():
                flavor = self._pick_flavor(wl, cq, ps, g, assignment, chosen, usage, free, attempt)
                if flavor is None:
                    return attempt
                for res in g.resources:
                    if ps.requests.get(res, 0) > 0:
                        chosen[res] = flavor
            assignment[ps.name] = chosen
            demands = self._demands(wl, {ps.name: chosen})
            if demands:
                place([d for d in demands if d.pod_set == ps.name], free, self.nodes)
        attempt.assignment = assignment
        attempt.borrows = _borrows(cq, usage, workload_usage(wl, assignment))
        return attempt

    def _pick_flavor(self, wl: WorkloadInfo, cq: ClusterQueueInfo, ps: PodSetInfo, group: ResourceGroupInfo,
                     assignment: Assignment, chosen: dict[str, str], usage: Usage, free: FreeState,
                     attempt: _Attempt) -> str | None:
        borrowing_fit: str | None = None
        for flavor in group.flavors:
            if flavor not in self.flavors:
                attempt.messages.append(f"flavor {flavor} not found")
                continue
            trial = {**assignment, ps.name: {**chosen, **{r: flavor for r in group.resources
                                                           if ps.requests.get(r, 0) > 0}}}
            need = workload_usage(wl, trial)
            short = ""
            for (f, res), amount in sorted(need.items()):
                if f != flavor:
                    continue
                avail = self.quotas.available(cq, (f, res), usage)
                if amount > avail:
                    short = _quota_message(res, f, amount - max(avail, 0))
                    break
            if short:
                attempt.messages.append(short)
                attempt.kind = WAIT_QUOTA if attempt.kind != WAIT_SHAPE else attempt.kind
                continue
            demands = self._demands(wl, trial)
            if demands is None:
                attempt.messages.append(f"flavor {flavor}: its node labels contradict the pod's nodeSelector")
                attempt.kind = WAIT_SHAPE
                continue
            miss = place([d for d in demands if d.pod_set == ps.name], {n: dict(g) for n, g in free.items()},
                         self.nodes)
            if miss is not None:
                attempt.messages.append(shape_message(miss, flavor))
                attempt.kind = WAIT_SHAPE
                continue
            if cq.when_can_borrow == "TryNextFlavor" and _borrows(cq, usage, need):
                borrowing_fit = borrowing_fit or flavor
                continue
            return flavor
        return borrowing_fit

    # -- preemption ---------------------------------------------------------------------------

    def _target(self, wl: WorkloadInfo, cq: ClusterQueueInfo) -> Assignment | None:
        """Flavors worth preempting for: per pod set, the first whose quota could hold it
        were nothing else running, and whose nodes could hold its pods were they empty."""
        empty: Usage = {}
        assignment: Assignment = {}
        for ps in wl.pod_sets:
            chosen: dict[str, str] = {}
            for res, amount in ps.requests.items():
                if amount <= 0 or res in chosen:
                    continue
                g = cq.group_of(res)
                if g is None:
                    continue
                for flavor in g.flavors:
                    if flavor not in self.flavors:
                        continue
                    trial = {**assignment, ps.name: {**chosen, **{r: flavor for r in g.resources
                                                                   if ps.requests.get(r, 0) > 0}}}
                    need = workload_usage(wl, trial)
                    if any(a > self.quotas.available(cq, fr, empty) for fr, a in need.items() if fr[0] == flavor):
                        continue
                    demands = self._demands(wl, trial) or []
                    capacity = {n: dict(node.capacity) for n, node in self.nodes.items()}
                    if place([d for d in demands if d.pod_set == ps.name], capacity, self.nodes) is not None:
                        continue
                    chosen.update({r: flavor for r in g.resources if ps.requests.get(r, 0) > 0})
                    break
                else:
                    return None
            assignment[ps.name] = chosen
        return assignment

    def _candidates(self, wl: WorkloadInfo, cq: ClusterQueueInfo, target: Assignment,
                    ) -> tuple[list[WorkloadInfo], list[WorkloadInfo], int]:
        """(same-queue candidates, other-queue candidates, how many were passed over for their
        higher priority); each sorted in the order they are given up."""
        frs = set(workload_usage(wl, target))
        usage = self._usage()
        same: list[WorkloadInfo] = []
        other: list[WorkloadInfo] = []
        too_high = 0
        for c in self._holding():
            if c.key == wl.key or c.key in self._evicting or c.key in self._admitted:
                continue
            if not frs & set(workload_usage(c)):
                continue
            if c.cluster_queue == cq.name:
                policy = cq.within_cluster_queue
                ok = (policy == "LowerPriority" and c.priority < wl.priority) or (
                    policy == "LowerOrNewerEqualPriority" and (
                        c.priority < wl.priority or (c.priority == wl.priority and c.timestamp > wl.timestamp)))
                if ok:
                    same.append(c)
                elif policy != "Never" and c.priority > wl.priority:
                    too_high += 1
                continue
            ccq = self.queues.get(c.cluster_queue)
            if ccq is None or not cq.cohort or ccq.cohort != cq.cohort:
                continue
            if not self.quotas.borrowing(ccq, usage, frs):
                continue
            policy = cq.reclaim_within_cohort
            if policy == "Any" or (policy == "LowerPriority" and c.priority < wl.priority):
                other.append(c)
            elif policy == "LowerPriority" and c.priority > wl.priority:
                too_high += 1

        def order(c: WorkloadInfo) -> tuple:
            return (c.priority, -c.admitted_at, -c.timestamp, c.key)

        return sorted(same, key=order), sorted(other, key=order), too_high

    def _minimal(self, wl: WorkloadInfo, target: Assignment, candidates: list[WorkloadInfo], allow_borrow: bool,
                 gone: set[str]) -> list[WorkloadInfo]:
        cq = self.queues[wl.cluster_queue]
        removed: list[WorkloadInfo] = []
        exclude = set(gone)
        fits = False
        for c in candidates:
            ccq = self.queues[c.cluster_queue]
            if ccq.name != cq.name:
                frs = set(workload_usage(c))
                if not self.quotas.borrowing(ccq, self._usage(exclude), frs):
                    continue  # that queue is back within its own quota: leave it alone
            removed.append(c)
            exclude.add(c.key)
            if self._fits(wl, target, exclude, allow_borrow)[0]:
                fits = True
                break
        if not fits:
            return []
        # Give back the victims that turned out not to be needed, latest choice first kept.
        for c in reversed(removed[:-1]):
            exclude.discard(c.key)
            if self._fits(wl, target, exclude, allow_borrow)[0]:
                removed.remove(c)
            else:
                exclude.add(c.key)
        return removed

    def _preempt(self, wl: WorkloadInfo, cq: ClusterQueueInfo) -> tuple[list[WorkloadInfo], str, int]:
        target = self._target(wl, cq)
        if target is None:
            return [], "", 0
        gone = self._gone_for(wl)
        same, other, too_high = self._candidates(wl, cq, target)
        usage = self._usage(gone)
        within_nominal = not _borrows(cq, usage, workload_usage(wl, target))
        if within_nominal and (same or other):
            victims = self._minimal(wl, target, other + same, False, gone)
            if victims:
                return victims, IN_COHORT_RECLAMATION, too_high
        if cq.borrow_within_cohort == "LowerPriority" and other:
            threshold = cq.borrow_max_priority
            allowed = [c for c in other if c.priority < wl.priority and (threshold is None or c.priority <= threshold)]
            victims = self._minimal(wl, target, allowed + same, True, gone)
            if victims:
                return victims, IN_COHORT_RECLAIM_WHILE_BORROWING, too_high
        if same:
            victims = self._minimal(wl, target, same, True, gone)
            if victims:
                return victims, IN_CLUSTER_QUEUE, too_high
        return [], "", too_high

    # -- driving ----------------------------------------------------------------------------------

    def _try(self, wl: WorkloadInfo) -> bool:
        """Admit, preempt for, or explain ``wl``; True when it was admitted."""
        cq = self.queues.get(wl.cluster_queue)
        if wl.problem or cq is None:
            self.result.waiting[wl.key] = Wait(WAIT_INADMISSIBLE, wl.problem or f"ClusterQueue {wl.cluster_queue} "
                                                                               "doesn't exist")
            return False
        if cq.inactive:
            self.result.waiting[wl.key] = Wait(WAIT_INADMISSIBLE, f"ClusterQueue {cq.name} is inactive: {cq.inactive}")
            return False
        missing = uncovered_message(wl, cq)
        if missing:
            self.result.waiting[wl.key] = Wait(WAIT_INADMISSIBLE, missing)
            return False
        attempt = self._attempt(wl, cq)
        if attempt.assignment is not None:
            self._record_admission(wl, attempt.assignment)
            self.result.admitted[wl.key] = attempt.assignment
            if attempt.borrows:
                self.result.borrowing.add(wl.key)
            return True
        reason = "couldn't assign flavors to the pod sets: " + "; ".join(dict.fromkeys(attempt.messages))
        # Room that preempted workloads are about to give back is not taken twice.
        gone = self._gone_for(wl)
        target = self._target(wl, cq)
        if gone and target is not None and self._fits(wl, target, gone, True)[0]:
            self.result.waiting[wl.key] = Wait(
                WAIT_PREEMPTING, f"waiting for {len(gone)} preempted workload(s) to stop; {reason}")
            return False
        victims, why, too_high = self._preempt(wl, cq)
        if victims:
            self._version += 1
            for v in victims:
                self._evicting.add(v.key)
                self._preemptor[v.key] = wl.key
                self.result.preempted[v.key] = Preemption(wl.key, why, _preempt_message(wl, v, why))
            self.result.waiting[wl.key] = Wait(
                WAIT_PREEMPTING, f"preempting {len(victims)} workload(s): "
                                 + ", ".join(v.key for v in victims) + f"; {reason}")
            return False
        if target is None:
            self.result.waiting[wl.key] = Wait(attempt.kind, reason + " (it can never fit this ClusterQueue's "
                                                                      "quota or nodes)")
            return False
        if too_high:
            self.result.waiting[wl.key] = Wait(
                WAIT_PRIORITY, f"{reason}; the workloads holding that quota cannot be preempted by priority "
                               f"{wl.priority} under this ClusterQueue's preemption policy")
            return False
        self.result.waiting[wl.key] = Wait(attempt.kind, reason)
        return False

    def _gone_for(self, wl: WorkloadInfo) -> set[str]:
        """Evicting workloads whose room ``wl`` may count on: those preempted for it (or for
        a workload no longer known); room made for another workload is that one's."""
        return {k for k in self._evicting
                if self._preemptor.get(k, "") in ("", wl.key) or self._preemptor[k] not in self.workloads}

    def _order_key(self, wl: WorkloadInfo) -> tuple:
        cq = self.queues.get(wl.cluster_queue)
        if cq is None or cq.inactive or wl.problem:
            return (0, 0.0, -wl.priority, wl.timestamp, wl.key)
        attempt = self._attempt(wl, cq)
        if self.fair_sharing:
            usage = self._usage()
            if attempt.assignment is not None:
                per = usage.setdefault(cq.name, {})
                for fr, amount in workload_usage(wl, attempt.assignment).items():
                    per[fr] = per.get(fr, 0) + amount
            return (0, self.quotas.share(cq, usage), -wl.priority, wl.timestamp, wl.key)
        return (1 if attempt.borrows else 0, 0.0, -wl.priority, wl.timestamp, wl.key)

    def run(self) -> CycleResult:
        pending: dict[str, list[WorkloadInfo]] = {}
        for wl in self.workloads.values():
            if wl.admission is None:
                pending.setdefault(wl.cluster_queue, []).append(wl)
        for items in pending.values():
            items.sort(key=_order)
        while pending:
            heads = [items[0] for items in pending.values()]
            wl = min(heads, key=self._order_key)
            items = pending[wl.cluster_queue]
            items.pop(0)
            admitted = self._try(wl)
            cq = self.queues.get(wl.cluster_queue)
            if not admitted and cq is not None and cq.strategy == "StrictFIFO":
                for rest in items:
                    self.result.waiting[rest.key] = Wait(
                        WAIT_QUEUED, f"behind {wl.key} in ClusterQueue {cq.name} (StrictFIFO)")
                items.clear()
            if not items:
                del pending[wl.cluster_queue]
        return self.result


def schedule(
    queues: Mapping[str, ClusterQueueInfo],
    flavors: Mapping[str, FlavorInfo],
    workloads: Iterable[WorkloadInfo],
    nodes: Iterable[NodeInfo],
    *,
    fair_sharing: bool = False,
) -> CycleResult:
    """One admission pass; see the module's doc for the rules."""
    return Cycle(queues, flavors, workloads, nodes, fair_sharing=fair_sharing).run()


# -- small helpers ----------------------------------------------------------------------------------


def uncovered_message(wl: WorkloadInfo, cq: ClusterQueueInfo) -> str:
    """Kueue's answer to pods that request a resource (more than 0 of it) that none of the
    ClusterQueue's resource groups covers: no flavor can be assigned, so the workload is not
    admitted, whatever quota is free. One reason per pod set, the first such resource in
    name order; empty when every requested resource is covered."""
    reasons = []
    for ps in wl.pod_sets:
        res = next((r for r in sorted(ps.requests) if ps.requests[r] > 0 and cq.group_of(r) is None), None)
        if res is not None:
            reasons.append(f"couldn't assign flavors to pod set {ps.name}: resource {res} unavailable in ClusterQueue")
    return "; ".join(reasons)


def _order(wl: WorkloadInfo) -> tuple:
    return (-wl.priority, wl.timestamp, wl.key)


def _borrows(cq: ClusterQueueInfo, usage: Usage, need: Mapping[FlavorResource, int]) -> bool:
    used = usage.get(cq.name, {})
    return any(used.get(fr, 0) + amount > cq.quotas[fr].nominal for fr, amount in need.items() if fr in cq.quotas)


def _gpu_flavor(assignment: Assignment, pod_set: str) -> str:
    flavors = assignment.get(pod_set) or {}
    return flavors.get(GPU_RESOURCE) or next(iter(flavors.values()), "")


def _format_amount(resource: str, amount: int) -> str:
    if resource == "cpu":
        return f"{amount // 1000}" if amount % 1000 == 0 else f"{amount}m"
    return str(amount)


def _quota_message(resource: str, flavor: str, missing: int) -> str:
    return (f"insufficient unused quota for {resource} in flavor {flavor}, "
            f"{_format_amount(resource, missing)} more needed")


def _preempt_message(preemptor: WorkloadInfo, victim: WorkloadInfo, why: str) -> str:
    where = {
        IN_CLUSTER_QUEUE: "prioritization in the ClusterQueue",
        IN_COHORT_RECLAMATION: "reclamation within the cohort",
        IN_COHORT_RECLAIM_WHILE_BORROWING: "reclamation within the cohort while borrowing",
    }.get(why, why)
    return f"Preempted to accommodate a workload ({preemptor.key}) due to {where}"
