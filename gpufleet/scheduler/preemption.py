"""DefaultPreemption (PostFilter): when a pod fits nowhere, find the node where evicting
the fewest, least important pods makes it fit, as kube-scheduler's DefaultPreemption does.

For each node the filters rejected as resolvable: take away every pod of strictly lower
priority (never one of equal or higher priority, never one already terminating); if the
pod still does not fit, the node cannot help. Otherwise give back as many of them as
possible, most important first ("reprieve"), those whose eviction would break a
PodDisruptionBudget before the others, so that only the pods the preemptor really needs
gone are victims. Nodes are compared by, in order: fewest budget violations, lowest
highest victim priority, smallest sum of victim priorities, fewest victims.

Gangs: a victim that belongs to a PodGroup takes its whole gang with it (a gang missing a
member is useless and would only hold its GPUs), so all its members, on every node, are
victims or none is; a gang with any member of the preemptor's priority or more is never
a victim. They all count in the comparison.

PodDisruptionBudgets are respected as Kubernetes does: preemption tries not to violate
one, but will when there is no other way. A budget's allowance is its
``status.disruptionsAllowed`` when the disruption controller keeps it current, and is
otherwise computed here from the spec and the healthy pods it selects.

The plugin is pure: it leaves its choice (a ``Candidate``) in the CycleState under
``VICTIMS_KEY`` and returns the node to nominate; the scheduler deletes the victims.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api import k8s
from gpufleet.api.validation import selector_matches
from gpufleet.scheduler.framework import (
    NODE_ADD,
    NODE_ALLOCATABLE,
    OK,
    POD_DELETE,
    Code,
    CycleState,
    Framework,
    FrameworkHandle,
    Status,
)
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot

VICTIMS_KEY = "DefaultPreemption/candidate"
NEVER = "Never"

NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NOT_ELIGIBLE_NEVER = "preemption: not eligible due to preemptionPolicy=Never"

_PRIORITY_OFFSET = 2**31
# NodeInfo memo key: the lowest priority of the node's pods that are not terminating.
_LOWEST_PRIORITY_KEY = "DefaultPreemption/lowest-priority"
_NOBODY = 2**63


@dataclass
class DisruptionBudget:
    """What preemption needs of a PodDisruptionBudget: whom it covers and how many of them
    may still go."""

    namespace: str
    name: str
    selector: k8s.LabelSelector | None
    allowed: int

    def covers(self, pod_info: PodInfo) -> bool:
        # policy/v1: a budget without a selector selects nothing, an empty one everything.
        return (
            self.selector is not None
            and pod_info.namespace == self.namespace
            and selector_matches(self.selector, pod_info.labels)
        )


def _healthy(pod_info: PodInfo) -> bool:
    status = pod_info.pod.status
    if status is None or status.phase != "Running" or pod_info.terminating:
        return False
    ready = next((c for c in status.conditions or () if c.type == "Ready"), None)
    return ready is None or ready.status == "True"


def _scaled(value: Any, total: int) -> int:
    """An int-or-percent against ``total``, percentages rounded up (as the disruption
    controller's GetScaledValueFromIntOrPercent with roundUp)."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def disruption_budget(pdb: k8s.PodDisruptionBudget, pods: Iterable[PodInfo]) -> DisruptionBudget:
    meta = pdb.metadata or k8s.ObjectMeta()
    spec = pdb.spec or k8s.PodDisruptionBudgetSpec()
    budget = DisruptionBudget(meta.namespace or "", meta.name or "", spec.selector, 0)
    status = pdb.status
    if (
        status is not None
        and status.disruptions_allowed is not None
        and status.observed_generation is not None
        and status.observed_generation >= (meta.generation or 0)
    ):
        budget.allowed = status.disruptions_allowed
        return budget
    covered = [p for p in pods if not p.terminal and budget.covers(p)]
    expected = len(covered)
    healthy = sum(1 for p in covered if _healthy(p))
    if spec.max_unavailable is not None:
        desired = expected - _scaled(spec.max_unavailable, expected)
    elif spec.min_available is not None:
        desired = _scaled(spec.min_available, expected)
    else:
        desired = expected
    budget.allowed = max(0, healthy - max(desired, 0))
    return budget


def disruption_budgets(pdbs: Iterable[k8s.PodDisruptionBudget], snapshot: Snapshot) -> list[DisruptionBudget]:
    pdbs = list(pdbs)
    if not pdbs:
        return []
    pods = [p for n in snapshot.node_infos for p in n.pods.values()]
    return [disruption_budget(pdb, pods) for pdb in pdbs]


def count_violations(victims: Iterable[PodInfo], budgets: Sequence[DisruptionBudget]) -> int:
    """How many of the victims, evicted in this order, each take a budget below zero."""
    left = [b.allowed for b in budgets]
    violations = 0
    for victim in victims:
        violated = False
        for i, budget in enumerate(budgets):
            if budget.covers(victim):
                left[i] -= 1
                violated = violated or left[i] < 0
        violations += violated
    return violations


@dataclass
class Candidate:
    """Where the preemptor goes and who must leave for it."""

    node: str
    victims: list[PodInfo] = field(default_factory=list)
    pdb_violations: int = 0

    def key(self) -> tuple[int, int, int, int, str]:
        priorities = [v.priority for v in self.victims]
        return (
            self.pdb_violations,
            max(priorities, default=-_PRIORITY_OFFSET),
            sum(p + _PRIORITY_OFFSET for p in priorities),
            len(self.victims),
            self.node,
        )


class _Groups:
    """The members of each PodGroup on the snapshot, collected on first use."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self._members: dict[str, list[PodInfo]] | None = None

    def members(self, group: str) -> list[PodInfo]:
        if self._members is None:
            self._members = {}
            for node_info in self.snapshot.node_infos:
                for p in node_info.pods.values():
                    if p.pod_group:
                        self._members.setdefault(p.pod_group, []).append(p)
        return self._members.get(group, [])


def victims_on_node(
    framework: Framework,
    state: CycleState,
    pod_info: PodInfo,
    node_info: NodeInfo,
    budgets: Sequence[DisruptionBudget],
    groups: _Groups,
    leaving: set[str] | frozenset[str] = frozenset(),
) -> Candidate | None:
    """The fewest, least important pods (whole gangs) to evict from ``node_info`` for the
    pod to fit there; None when evicting every lower-priority pod would not do."""
    priority = pod_info.priority
    units: dict[str, list[PodInfo]] = {}
    local: dict[str, list[PodInfo]] = {}
    protected: set[str] = set()
    for p in node_info.pods.values():
        if p.terminating or p.priority >= priority or p.terminal or p.key in leaving:
            continue
        if p.pod_group:
            key = "group:" + p.pod_group
            if key in protected:
                continue
            if key not in units:
                members = groups.members(p.pod_group)
                if any(m.priority >= priority for m in members):
                    protected.add(key)
                    continue
                units[key] = [m for m in members if not m.terminating and m.key not in leaving]
        else:
            key = "pod:" + p.key
            units[key] = [p]
        local.setdefault(key, []).append(p)
    if not units:
        return None
    trial = node_info.clone()
    for key in units:
        for p in local[key]:
            trial.remove_pod(p)
    if not framework.run_filters(state, pod_info, trial).is_success:
        return None
    ordered = sorted(units, key=lambda k: (-max(m.priority for m in units[k]), len(units[k]), k))
    violating = _violating_units(ordered, units, budgets)
    chosen: list[str] = []
    for key in [k for k in ordered if k in violating] + [k for k in ordered if k not in violating]:
        for p in local[key]:
            trial.add_pod(p)
        if framework.run_filters(state, pod_info, trial).is_success:
            continue  # reprieved: the pod fits with this unit staying
        for p in local[key]:
            trial.remove_pod(p)
        chosen.append(key)
    victims = [m for k in chosen for m in units[k]]
    victims.sort(key=lambda v: (v.priority, v.key))
    return Candidate(node_info.name, victims, count_violations(victims, budgets))


def _violating_units(
    ordered: list[str], units: Mapping[str, list[PodInfo]], budgets: Sequence[DisruptionBudget]
) -> set[str]:
    if not budgets:
        return set()
    left = [b.allowed for b in budgets]
    out = set()
    for key in ordered:
        for member in units[key]:
            for i, budget in enumerate(budgets):
                if budget.covers(member):
                    left[i] -= 1
                    if left[i] < 0:
                        out.add(key)
    return out


def find_candidate(
    framework: Framework,
    state: CycleState,
    pod_info: PodInfo,
    snapshot: Snapshot,
    node_statuses: Mapping[str, Status],
) -> tuple[Candidate | None, str]:
    """The best node to preempt on, or None and the reason counts for the message."""
    budgets: list[DisruptionBudget] | None = None
    groups = _Groups(snapshot)
    leaving = framework.handle.pending_victims
    candidates: list[Candidate] = []
    not_helpful = no_victims = 0
    if snapshot.lowest_priority is not None and snapshot.lowest_priority >= pod_info.priority:
        # Nothing on any node is less important than the preemptor.
        not_helpful = sum(1 for s in node_statuses.values() if s.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE)
        return None, _no_candidate_message(len(snapshot), len(snapshot) - not_helpful, not_helpful)
    for node_info in snapshot.node_infos:
        status = node_statuses.get(node_info.name)
        if status is not None and status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
            not_helpful += 1
            continue
        # Most nodes of a busy cluster hold nothing less important than the preemptor: ask
        # the node (memoized until it changes) before looking at its pods one by one.
        lowest = node_info.memo.get(_LOWEST_PRIORITY_KEY)
        if lowest is None:
            lowest = node_info.memo[_LOWEST_PRIORITY_KEY] = min(
                (p.priority for p in node_info.pods.values() if not p.terminating), default=_NOBODY
            )
        if lowest >= pod_info.priority:
            no_victims += 1
            continue
        if budgets is None:
            budgets = disruption_budgets(snapshot.pdbs, snapshot)
        candidate = victims_on_node(framework, state, pod_info, node_info, budgets, groups, leaving)
        if candidate is None:
            no_victims += 1
        else:
            candidates.append(candidate)
    if candidates:
        return min(candidates, key=Candidate.key), ""
    return None, _no_candidate_message(len(snapshot), no_victims, not_helpful)


def _no_candidate_message(nodes: int, no_victims: int, not_helpful: int) -> str:
    counts = []
    if no_victims:
        counts.append(f"{no_victims} {NO_VICTIMS}")
    if not_helpful:
        counts.append(f"{not_helpful} {NOT_HELPFUL}")
    return f"preemption: 0/{nodes} nodes are available: {', '.join(sorted(counts))}"


def waiting_for_victims(
    pod_info: PodInfo, snapshot: Snapshot, nominated: str, leaving: set[str] | frozenset[str] = frozenset()
) -> bool:
    """Kube's PodEligibleToPreemptOthers, negated: the pod already preempted on its
    nominated node and lower-priority pods there are still terminating."""
    node_info = snapshot.get(nominated) if nominated else None
    if node_info is None:
        return False
    return any(
        (p.terminating or p.key in leaving) and p.priority < pod_info.priority
        for p in node_info.pods.values()
    )


class DefaultPreemption:
    name = "DefaultPreemption"

    def __init__(self, args: Mapping[str, Any] | None = None, handle: FrameworkHandle | None = None) -> None:
        self.handle = handle or FrameworkHandle()

    def post_filter(
        self, state: CycleState, pod_info: PodInfo, snapshot: Snapshot, node_statuses: Mapping[str, Status]
    ) -> tuple[str | None, Status]:
        if pod_info.preemption_policy == NEVER:
            return None, Status.unresolvable(NOT_ELIGIBLE_NEVER)
        nominated = self.handle.nominated_nodes.get(pod_info.uid or pod_info.key) or (
            pod_info.pod.status.nominated_node_name if pod_info.pod.status is not None else None
        )
        if nominated and waiting_for_victims(pod_info, snapshot, nominated, self.handle.pending_victims):
            return None, Status.unschedulable(
                f"preemption: waiting for the pods preempted on node {nominated} to terminate"
            )
        framework = self.handle.framework
        if framework is None:
            return None, Status(Code.ERROR, ["preemption needs the framework"])
        candidate, message = find_candidate(framework, state, pod_info, snapshot, node_statuses)
        if candidate is None:
            return None, Status.unschedulable(message)
        state.write(VICTIMS_KEY, candidate)
        return candidate.node, OK

    def events_to_register(self) -> set[str]:
        return {NODE_ADD, NODE_ALLOCATABLE, POD_DELETE}
