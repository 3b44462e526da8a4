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

import bisect
import collections
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from gpufleet.api.gpu import GPU_RESOURCE
from gpufleet.queueing import policies
from gpufleet.queueing.quota import Quotas, Usage, usage_of, workload_usage
from gpufleet.queueing.shape import FreeState, PodDemand, ShapeMiss, merge_selectors, place, shape_message
from gpufleet.queueing.workloads import (
    IN_CLUSTER_QUEUE,
    IN_COHORT_RECLAIM_WHILE_BORROWING,
    IN_COHORT_RECLAMATION,
    WAIT_INADMISSIBLE,
    WAIT_PREEMPTING,
    WAIT_PRIORITY,
    WAIT_QUEUED,
    WAIT_QUOTA,
    WAIT_SHAPE,
    Assignment,
    ClusterQueueInfo,
    CycleResult,
    FlavorInfo,
    FlavorResource,
    NodeInfo,
    Placement,
    PodSetInfo,
    Preemption,
    Quota,
    ResourceGroupInfo,
    Taint,
    Toleration,
    Wait,
    WorkloadInfo,
)

# Re-exported: callers and tests import these names from here.
__all__ = [
    "Assignment", "ClusterQueueInfo", "Cycle", "CycleResult", "FlavorInfo", "FlavorResource",
    "FreeState", "IN_CLUSTER_QUEUE", "IN_COHORT_RECLAIM_WHILE_BORROWING", "IN_COHORT_RECLAMATION",
    "NodeInfo", "Placement", "PodDemand", "PodSetInfo", "Preemption", "Quota", "Quotas",
    "ResourceGroupInfo", "ShapeMiss", "Taint", "Toleration", "Usage", "WAIT_INADMISSIBLE",
    "WAIT_PREEMPTING", "WAIT_PRIORITY", "WAIT_QUEUED", "WAIT_QUOTA", "WAIT_SHAPE", "Wait",
    "WorkloadInfo", "merge_selectors", "place", "schedule", "shape_message", "uncovered_message",
    "usage_of", "workload_usage",
]

# -- the cycle --------------------------------------------------------------------------------------


class _Attempt:
    def __init__(self) -> None:
        self.assignment: Assignment | None = None
        self.borrows = False
        self.kind = WAIT_QUOTA
        self.messages: list[str] = []
        self._reason: str | None = None

    def reason(self) -> str:
        """Why it was not assigned flavors (made once: the workloads of a shape share it)."""
        if self._reason is None:
            self._reason = "couldn't assign flavors to the pod sets: " + "; ".join(dict.fromkeys(self.messages))
        return self._reason


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
        now: float | None = None,
        memo: dict[str, Any] | None = None,
    ) -> None:
        self.queues = dict(queues)
        self.flavors = dict(flavors)
        self.result = CycleResult()
        workloads = list(workloads)
        if now is not None:
            self.queues, workloads, self.result.requeue_after = ranked(self.queues, workloads, now, memo)
        self.workloads = {wl.key: wl for wl in workloads}
        self.nodes = {n.name: n for n in nodes}
        self.fair_sharing = fair_sharing
        self.quotas = Quotas(self.queues)
        # Assignments made this pass, on top of the workloads' own.
        self._admitted: dict[str, Assignment] = {}
        self._evicting = {wl.key for wl in self.workloads.values() if wl.evicting and wl.admission is not None}
        self._preemptor = {key: self.workloads[key].preempted_by for key in self._evicting}
        # _gone_for's answer for any workload: (room made for anyone, room made for each).
        self._gone: tuple[set[str], dict[str, set[str]]] | None = None
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
        self._shape_attempts: dict[tuple, tuple[int, _Attempt]] = {}
        # Shape -> (version, highest priority, the priorities of the candidates weighed) for
        # which no victims were found: a workload of that shape and no higher priority finds
        # none either while the state is the same.
        self._no_victims: dict[tuple, tuple[int, int, list[int]]] = {}
        self._targets: dict[tuple, Assignment | None] = {}
        # Shape -> what uncovered_message says of it (the queue's resource groups do not change
        # in a pass).
        self._uncovered: dict[tuple, str] = {}
        # What each workload uses under its own admission (that never changes in a pass), and
        # the workloads holding quota at a version of the state: a preemption search reads both
        # for every admitted workload, for each pending one it is run for.
        self._own_usage: dict[str, dict[FlavorResource, int]] = {}
        self._holding_at: tuple[int, list[WorkloadInfo]] | None = None

    # -- state views ------------------------------------------------------------------------

    def _assignment_of(self, wl: WorkloadInfo) -> Assignment | None:
        return self._admitted.get(wl.key, wl.admission)

    def _holding(self) -> list[WorkloadInfo]:
        """Workloads that hold quota now (admitted before or during this pass)."""
        if self._holding_at is not None and self._holding_at[0] == self._version:
            return self._holding_at[1]
        out = [wl for wl in self.workloads.values() if self._assignment_of(wl) is not None]
        self._holding_at = (self._version, out)
        return out

    def _usage_of(self, wl: WorkloadInfo) -> dict[FlavorResource, int]:
        """``workload_usage(wl)``: what it uses under its own admission."""
        usage = self._own_usage.get(wl.key)
        if usage is None:
            usage = self._own_usage[wl.key] = workload_usage(wl)
        return usage

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

    def _claim(self, wl: WorkloadInfo, assignment: Assignment) -> None:
        """Hold for the rest of the pass the quota a workload waiting on its preemptions will
        take, as Kueue counts a preempting workload's usage in its cycle: the quota a victim
        gives back is not taken by a workload behind the preemptor (a victim re-admitted, say,
        before the preemptor fits, to be preempted again, round after round)."""
        # Its victims still hold part of it (in its queue or the cohort's others): that part
        # is counted once, as theirs, until they are gone.
        held: dict[FlavorResource, int] = {}
        for key in self._gone_for(wl):
            victim = self.workloads[key]
            for fr, amount in workload_usage(victim, self._assignment_of(victim)).items():
                held[fr] = held.get(fr, 0) + amount
        per = self._usage_now.setdefault(wl.cluster_queue, {})
        for fr, amount in workload_usage(wl, assignment).items():
            per[fr] = per.get(fr, 0) + max(0, amount - held.get(fr, 0))
        self._hold_room(wl, assignment)
        self._version += 1

    def _hold_room(self, wl: WorkloadInfo, assignment: Assignment) -> None:
        """The GPUs free now that the preemptor's pods will take once its victims are gone, held
        for the rest of the pass as its quota is: a smaller workload behind it must not fill the
        part of a node it needs (it would be preempted next, and another victim re-admitted,
        round after round at one instant)."""
        demands = self._demands(wl, assignment)
        if not demands:
            return
        after = self._free(self._gone_for(wl))
        given_back = {node: {g: n - self._free_now.get(node, {}).get(g, 0) for g, n in groups.items()}
                      for node, groups in after.items()}
        taken: list[Placement] = []
        if place(demands, after, self.nodes, taken) is not None:
            return
        for p in taken:
            free, back = self._free_now.get(p.node), given_back.get(p.node, {})
            if free is None:
                continue
            for g, n in p.gpus.items():
                from_victims = min(n, back.get(g, 0))
                back[g] = back.get(g, 0) - from_victims
                free[g] = free.get(g, 0) - min(n - from_victims, free.get(g, 0))

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
        # A pending workload's attempt depends on the state and its pod sets only: workloads
        # of the same shape in the same queue share it (hundreds waiting, a few shapes).
        shape = _shape(wl) if wl.admission is None else None
        if shape is not None:
            same = self._shape_attempts.get(shape)
            if same is not None and same[0] == self._version:
                self._attempts[wl.key] = same
                return same[1]
        attempt = self._assign(wl, cq)
        self._attempts[wl.key] = (self._version, attempt)
        if shape is not None:
            self._shape_attempts[shape] = (self._version, attempt)
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
            if frs.isdisjoint(self._usage_of(c)):
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
                frs = set(self._usage_of(c))
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

    def _target_of(self, wl: WorkloadInfo, cq: ClusterQueueInfo) -> Assignment | None:
        """``_target``, once per shape: it depends on the quotas and the nodes only."""
        shape = _shape(wl)
        if shape not in self._targets:
            self._targets[shape] = self._target(wl, cq)
        return self._targets[shape]

    def _preempt(self, wl: WorkloadInfo, cq: ClusterQueueInfo) -> tuple[list[WorkloadInfo], str, int]:
        if cq.within_cluster_queue == "Never" and (not cq.cohort or (
                cq.reclaim_within_cohort == "Never" and cq.borrow_within_cohort == "Never")):
            return [], "", 0  # this queue never preempts
        target = self._target_of(wl, cq)
        if target is None:
            return [], "", 0
        memo = None
        if cq.within_cluster_queue == "LowerPriority" and not cq.cohort and not self._gone_for(wl):
            memo = _shape(wl)
            failed = self._no_victims.get(memo)
            if failed is not None and failed[0] == self._version and failed[1] >= wl.priority:
                # Its candidates (strictly lower priority) are some of those that did not make
                # room; those held on by a higher priority than its own are counted.
                held = failed[2]
                return [], "", len(held) - bisect.bisect_right(held, wl.priority)
        victims, why, too_high = self._preempt_for(wl, cq, target)
        if memo is not None and not victims:
            self._no_victims[memo] = (self._version, wl.priority, self._candidate_priorities(wl, cq, target))
        return victims, why, too_high

    def _candidate_priorities(self, wl: WorkloadInfo, cq: ClusterQueueInfo, target: Assignment) -> list[int]:
        """The priorities, in order, of the workloads of ``wl``'s queue that ``_candidates``
        weighs for it (holding the quota it needs), whatever their priority."""
        frs = set(workload_usage(wl, target))
        return sorted(c.priority for c in self._holding()
                      if c.key != wl.key and c.key not in self._evicting and c.key not in self._admitted
                      and c.cluster_queue == cq.name and not frs.isdisjoint(self._usage_of(c)))

    def _preempt_for(self, wl: WorkloadInfo, cq: ClusterQueueInfo, target: Assignment,
                     ) -> tuple[list[WorkloadInfo], str, int]:
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
        shape = _shape(wl)
        missing = self._uncovered.get(shape)
        if missing is None:
            missing = self._uncovered[shape] = uncovered_message(wl, cq)
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
        reason = attempt.reason()
        # Room that preempted workloads are about to give back is not taken twice.
        gone = self._gone_for(wl)
        target = self._target_of(wl, cq)
        if gone and target is not None and self._fits(wl, target, gone, True)[0]:
            self.result.waiting[wl.key] = Wait(
                WAIT_PREEMPTING, f"waiting for {len(gone)} preempted workload(s) to stop; {reason}")
            self._claim(wl, target)
            return False
        victims, why, too_high = self._preempt(wl, cq)
        if victims:
            self._version += 1
            for v in victims:
                self._evicting.add(v.key)
                self._preemptor[v.key] = wl.key
                self.result.preempted[v.key] = Preemption(wl.key, why, _preempt_message(wl, v, why))
            self._gone = None
            self.result.waiting[wl.key] = Wait(
                WAIT_PREEMPTING, f"preempting {len(victims)} workload(s): "
                                 + ", ".join(v.key for v in victims) + f"; {reason}")
            if target is not None:
                self._claim(wl, target)
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
        if self._gone is None:
            # Worked out again only when a pass preempts: it is asked for every pending workload.
            anyone: set[str] = set()
            made_for: dict[str, set[str]] = {}
            for k in self._evicting:
                preemptor = self._preemptor.get(k, "")
                if preemptor == "" or preemptor not in self.workloads:
                    anyone.add(k)
                else:
                    made_for.setdefault(preemptor, set()).add(k)
            self._gone = (anyone, made_for)
        anyone, made_for = self._gone
        mine = made_for.get(wl.key)
        return anyone | mine if mine else set(anyone)

    def _order_key(self, wl: WorkloadInfo) -> tuple:
        cq = self.queues.get(wl.cluster_queue)
        if cq is None or cq.inactive or wl.problem:
            return (0, 0.0, -wl.priority, wl.order, wl.timestamp, wl.key)
        attempt = self._attempt(wl, cq)
        if self.fair_sharing:
            usage = self._usage()
            if attempt.assignment is not None:
                per = usage.setdefault(cq.name, {})
                for fr, amount in workload_usage(wl, attempt.assignment).items():
                    per[fr] = per.get(fr, 0) + amount
            return (0, self.quotas.share(cq, usage), -wl.priority, wl.order, wl.timestamp, wl.key)
        return (1 if attempt.borrows else 0, 0.0, -wl.priority, wl.order, wl.timestamp, wl.key)

    def run(self) -> CycleResult:
        pending: dict[str, list[WorkloadInfo]] = {}
        for wl in self.workloads.values():
            if wl.admission is None:
                pending.setdefault(wl.cluster_queue, []).append(wl)
        queued: dict[str, collections.deque[WorkloadInfo]] = {}
        for name, items in pending.items():
            items.sort(key=_order)
            queued[name] = collections.deque(items)
        while queued:
            if len(queued) == 1:
                wl = next(iter(queued.values()))[0]
            else:
                wl = min((items[0] for items in queued.values()), key=self._order_key)
            items = queued[wl.cluster_queue]
            items.popleft()
            admitted = self._try(wl)
            cq = self.queues.get(wl.cluster_queue)
            if not admitted and cq is not None and cq.strategy == "StrictFIFO":
                for rest in items:
                    self.result.waiting[rest.key] = Wait(
                        WAIT_QUEUED, f"behind {wl.key} in ClusterQueue {cq.name} (StrictFIFO)")
                items.clear()
            if not items:
                del queued[wl.cluster_queue]
        return self.result


def schedule(
    queues: Mapping[str, ClusterQueueInfo],
    flavors: Mapping[str, FlavorInfo],
    workloads: Iterable[WorkloadInfo],
    nodes: Iterable[NodeInfo],
    *,
    fair_sharing: bool = False,
    now: float | None = None,
    memo: dict[str, Any] | None = None,
) -> CycleResult:
    """One admission pass; see the module's doc for the rules. With ``now``, the ClusterQueues'
    queueing policies (``gpufleet.queueing.policies``) order their workloads (``memo``: see
    ``ranked``)."""
    return Cycle(queues, flavors, workloads, nodes, fair_sharing=fair_sharing, now=now, memo=memo).run()


def standing(wl: WorkloadInfo) -> policies.Standing:
    """A workload as the queueing policies see it."""
    holding = wl.admission is not None and not wl.evicting
    return policies.Standing(
        key=wl.key, priority=wl.priority, gpus=wl.gpus, admitted=holding,
        admitted_at=wl.admitted_at if holding else None, stored_service=wl.attained,
        waiting_since=wl.timestamp, total_steps=wl.total_steps,
        progress=wl.progress if isinstance(wl.progress, policies.Progress) else None)


def ranked(queues: Mapping[str, ClusterQueueInfo], workloads: list[WorkloadInfo], now: float,
           memo: dict[str, Any] | None = None,
           ) -> tuple[dict[str, ClusterQueueInfo], list[WorkloadInfo], float | None]:
    """Apply the ClusterQueues' queueing policies: each workload of a policy's queue gets its
    rank as its priority and the policy's order within a rank, and the queue preempts within
    itself by that rank (strictly lower ranks only). Returns the queues, the workloads, and the
    seconds until a rank changes. ``memo``, kept by the caller from one pass to the next,
    holds what was worked out for each WorkloadInfo object: a pass given the same object
    again (hundreds wait unchanged) does not work out again what time does not change."""
    out_queues = dict(queues)
    by_queue: dict[str, list[WorkloadInfo]] = {}
    for wl in workloads:
        cq = queues.get(wl.cluster_queue)
        if cq is not None and cq.policy:
            by_queue.setdefault(cq.name, []).append(wl)
    if not by_queue:
        return out_queues, workloads, None
    changed: dict[str, WorkloadInfo] = {}
    soonest: float | None = None
    kept: dict[str, tuple[WorkloadInfo, policies.Standing, WorkloadInfo | None, tuple]] = {}
    for name, members in by_queue.items():
        cq = queues[name]
        out_queues[name] = dataclasses.replace(cq, within_cluster_queue="LowerPriority")
        params = (cq.policy, cq.levels, cq.starvation_factor, cq.within_level)
        # A waiting workload's rank moves with time only through the starvation guard.
        timeless = cq.policy != policies.ATTAINED_SERVICE or not (
            policies.STARVATION_FACTOR if cq.starvation_factor is None else cq.starvation_factor)
        standings = []
        for wl in members:
            last = memo.get(wl.key) if memo is not None else None
            if last is not None and last[0] is wl:
                s = last[1]
                out = last[2] if last[3] == params else None
            else:
                s, out = standing(wl), None
            if out is None:
                out = _with_rank(wl, policies.rank(cq.policy, s, now, cq.levels, cq.starvation_factor),
                                 policies.order(cq.policy, s, cq.within_level))
            standings.append(s)
            changed[wl.key] = out
            kept[wl.key] = (wl, s, out if timeless and wl.admission is None else None, params)
        if any(wl.admission is None for wl in members):
            after = policies.next_change(cq.policy, standings, now, cq.levels, cq.starvation_factor)
            if after is not None:
                soonest = after if soonest is None else min(soonest, after)
    if memo is not None:
        memo.clear()
        memo.update(kept)
    return out_queues, [changed.get(wl.key, wl) for wl in workloads], soonest


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


def _with_rank(wl: WorkloadInfo, priority: int, order: float) -> WorkloadInfo:
    """``wl`` with a policy's rank and order: ``dataclasses.replace`` without its cost (it
    re-runs ``__init__`` for each of hundreds of waiting workloads, every pass). A copy of
    the attributes, so the shape ``_shape`` remembered goes with it (the pod sets and the
    queue are the same)."""
    if wl.priority == priority and wl.order == order:
        return wl
    out = object.__new__(WorkloadInfo)
    out.__dict__.update(wl.__dict__)
    out.priority = priority
    out.order = order
    return out


_SHAPE = "_shape_key"


def _shape(wl: WorkloadInfo) -> tuple:
    """What an attempt to place a pending workload depends on besides the state: its queue
    and pod sets, which no pass changes (remembered on the object, computed once)."""
    shape = wl.__dict__.get(_SHAPE)
    if shape is None:
        shape = (wl.cluster_queue, tuple((ps.name, ps.count, tuple(sorted(ps.requests.items())),
                                          tuple(sorted(ps.node_selector.items())), ps.same_gpu_group,
                                          ps.tolerations)
                                         for ps in wl.pod_sets))
        wl.__dict__[_SHAPE] = shape
    return shape


def _order(wl: WorkloadInfo) -> tuple:
    return (-wl.priority, wl.order, wl.timestamp, wl.key)


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
