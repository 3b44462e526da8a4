"""Gang placement: all the pending members of a PodGroup are placed in one cycle, on the
snapshot, or none is.

Holding part of a gang while waiting for the rest is how two gangs that each need most of
the cluster deadlock (each holds some GPUs, neither ever gets all it needs). Here nothing
is held: ``place_gang`` simulates every member on the cycle's snapshot, each one seeing
the members before it as placed, and answers whether at least ``minMember`` members
(counting those already bound) fit. The scheduler then assumes and binds them all, or
none and sends the whole gang back to the queue.

Where the members go: a gang talks to itself (all-reduce), so it should span as few
racks and nodes as it can. A plan is made once per gang from what the first (largest)
member needs: the racks (label ``gpufleet.io/rack``) are chosen best fit, a single rack
that holds the whole gang with the least room to spare, else the roomiest racks until
the gang fits; inside them the nodes are taken roomiest first until the rest of the gang
fits on one node, which is then chosen best fit. Members fill the planned nodes in that
order (first fit); a member that fits none of them gets an ordinary cycle over all nodes.

Everything here is pure: no I/O, nothing outside the snapshot is changed. So is the
bookkeeping the scheduler keeps between cycles (``GangState``): each group's members, and
since when each gang has waited, for its ``scheduleTimeoutSeconds``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpufleet.api import k8s
from gpufleet.api import podgroup as pg_api
from gpufleet.api.gpu import RACK_LABEL
from gpufleet.scheduler.framework import FitError, Framework, ScheduleResult
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot


@dataclass
class GangPlacement:
    """The outcome of one gang cycle on a snapshot."""

    group: str
    min_member: int
    # Members of the gang already bound or assumed (not part of this cycle).
    bound: int
    # (member, where it goes), in placement order; applied to the snapshot.
    placed: list[tuple[PodInfo, ScheduleResult]] = field(default_factory=list)
    # (member, why it fits nowhere), the snapshot holding the members placed before it.
    failed: list[tuple[PodInfo, FitError]] = field(default_factory=list)
    # The nodes the plan meant to fill, in order.
    plan: list[str] = field(default_factory=list)

    @property
    def fits(self) -> int:
        return self.bound + len(self.placed)

    @property
    def total(self) -> int:
        return self.bound + len(self.placed) + len(self.failed)

    @property
    def ok(self) -> bool:
        return self.fits >= self.min_member

    def nodes_used(self) -> set[str]:
        return {result.node for _, result in self.placed}

    def message(self) -> str:
        """Why the gang was not placed, e.g. 'pod group default/job-a: 3 of 4 members fit,
        needs minMember 4; 0/4 nodes are available: 4 Insufficient nvidia.com/gpu.'"""
        text = f"pod group {self.group}: {self.fits} of {self.total} members fit, needs minMember {self.min_member}"
        if self.failed:
            text += f"; {self.failed[0][1].message}"
        return text

    def undo(self, snapshot: Snapshot) -> None:
        """Take the placed members off the snapshot again (nothing of a rejected gang may
        stay on it)."""
        for member, result in reversed(self.placed):
            snapshot.remove_pod(member.assigned(result.node, result.gpu_indices))


def member_order(members: Iterable[PodInfo]) -> list[PodInfo]:
    """Largest first (GPUs, then cpu, memory), then by name: big pieces are hardest to fit."""
    return sorted(members, key=lambda p: (-p.gpus, -p.cpu, -p.memory, p.name))


def capacity(node_info: NodeInfo, pod_info: PodInfo) -> int:
    """How many pods shaped like ``pod_info`` still fit on the node."""
    caps = [node_info.pods_left]
    if pod_info.gpus:
        caps.append(node_info.free_gpu_count // pod_info.gpus)
    if pod_info.cpu:
        caps.append(node_info.cpu_left // pod_info.cpu)
    if pod_info.memory:
        caps.append(node_info.memory_left // pod_info.memory)
    for name, amount in pod_info.scalar.items():
        caps.append((node_info.alloc_scalar.get(name, 0) - node_info.req_scalar.get(name, 0)) // amount)
    return max(0, min(caps))


def plan_nodes(
    nodes: Sequence[NodeInfo],
    shape: PodInfo,
    count: int,
    *,
    rack_label: str = RACK_LABEL,
    anchors: Iterable[str] = (),
) -> list[str]:
    """The nodes to fill, in order, for ``count`` members shaped like ``shape`` (the nodes
    given are those such a member passes the filters on). ``anchors``: nodes the gang
    already has members on, whose racks and themselves are preferred."""
    anchor_nodes = set(anchors)
    caps = [(capacity(n, shape), n) for n in nodes]
    caps = [(c, n) for c, n in caps if c > 0]
    if not caps:
        return []
    racks: dict[str, list[tuple[int, NodeInfo]]] = {}
    for c, n in caps:
        racks.setdefault(n.labels.get(rack_label, ""), []).append((c, n))
    anchor_racks = {n.labels.get(rack_label, "") for _, n in caps if n.name in anchor_nodes}
    room = {rack: sum(c for c, _ in members) for rack, members in racks.items()}
    fitting = [rack for rack in racks if room[rack] >= count]
    if fitting:
        chosen = [min(fitting, key=lambda r: (r not in anchor_racks, room[r], r))]
    else:
        chosen = []
        total = 0
        for rack in sorted(racks, key=lambda r: (r not in anchor_racks, -room[r], r)):
            chosen.append(rack)
            total += room[rack]
            if total >= count:
                break
    pool = [cn for rack in chosen for cn in racks[rack]]
    order: list[NodeInfo] = []
    remaining = count
    while remaining > 0 and pool:
        whole = [cn for cn in pool if cn[0] >= remaining]
        if whole:
            pick = min(whole, key=lambda cn: (cn[1].name not in anchor_nodes, cn[0], cn[1].name))
        else:
            pick = min(pool, key=lambda cn: (cn[1].name not in anchor_nodes, -cn[0], cn[1].name))
        pool.remove(pick)
        order.append(pick[1])
        remaining -= pick[0]
    # Then the rest of the chosen racks, roomiest first: members of another shape may
    # need them.
    order.extend(n for _, n in sorted(pool, key=lambda cn: (-cn[0], cn[1].name)))
    return [n.name for n in order]


def place_gang(
    framework: Framework,
    snapshot: Snapshot,
    group: str,
    members: Iterable[PodInfo],
    *,
    min_member: int,
    bound: Sequence[PodInfo] = (),
    rack_label: str = RACK_LABEL,
) -> GangPlacement:
    """Simulate the gang's pending ``members`` on ``snapshot``; ``bound``: its members
    already placed. On success the placed members stay on the snapshot (as the cycle's
    assumptions); on failure the snapshot is left as it was."""
    ordered = member_order(members)
    placement = GangPlacement(group=group, min_member=min_member, bound=len(bound))
    if not ordered:
        return placement
    shape = ordered[0]
    plan = plan_nodes(
        framework.feasible_nodes(shape, snapshot),
        shape,
        len(ordered),
        rack_label=rack_label,
        anchors=[p.node_name for p in bound],
    )
    placement.plan = plan
    for member in ordered:
        result = framework.schedule_ordered(member, snapshot, plan)
        if isinstance(result, FitError):
            placement.failed.append((member, result))
            continue
        snapshot.add_pod(member, result.node, result.gpu_indices)
        placement.placed.append((member, result))
    if not placement.ok:
        placement.undo(snapshot)
        for member, result in placement.placed:
            framework.run_unreserve(result.state, member, result.node)
    return placement


@dataclass
class GangPreemption:
    """Where each member of a gang goes once ``victims`` are gone."""

    nodes: dict[str, str]  # member key -> node
    victims: list[PodInfo]

    def victims_by_node(self) -> dict[str, list[PodInfo]]:
        out: dict[str, list[PodInfo]] = {}
        for victim in self.victims:
            out.setdefault(victim.node_name, []).append(victim)
        return out


def plan_gang_preemption(
    framework: Framework,
    snapshot: Snapshot,
    members: Iterable[PodInfo],
    *,
    min_member: int,
    bound: Sequence[PodInfo] = (),
) -> GangPreemption | None:
    """Preemption for a whole gang (PostFilter once per member, each seeing the victims
    chosen for the members before it as gone): the victims that make at least
    ``min_member`` members fit, or None when no eviction does. The snapshot is left as it
    was either way."""
    from gpufleet.scheduler.framework import CycleState
    from gpufleet.scheduler.preemption import NEVER, VICTIMS_KEY

    ordered = member_order(members)
    if not ordered or all(m.preemption_policy == NEVER for m in ordered):
        return None
    placed: list[tuple[PodInfo, ScheduleResult]] = []
    victims: dict[str, PodInfo] = {}
    try:
        for member in ordered:
            state = CycleState()
            result = framework.schedule(member, snapshot, state)
            if isinstance(result, FitError):
                candidate = state.read(VICTIMS_KEY) if result.diagnosis.nominated_node else None
                if candidate is None:
                    continue
                for victim in candidate.victims:
                    if victim.key not in victims:
                        victims[victim.key] = victim
                        snapshot.remove_pod(victim)
                result = framework.schedule_ordered(member, snapshot, [candidate.node])
                if isinstance(result, FitError):
                    continue
            snapshot.add_pod(member, result.node, result.gpu_indices)
            placed.append((member, result))
        if not victims or len(placed) + len(bound) < min_member:
            return None
        return GangPreemption(
            nodes={(m.uid or m.key): r.node for m, r in placed},
            victims=sorted(victims.values(), key=lambda v: (v.node_name, v.key)),
        )
    finally:
        for member, result in reversed(placed):
            snapshot.remove_pod(member.assigned(result.node, result.gpu_indices))
            framework.run_unreserve(result.state, member, result.node)
        for victim in victims.values():
            snapshot.add_pod(victim)


# -- bookkeeping ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GangWait:
    """What one more unsuccessful cycle of a gang amounts to."""

    # Wall time at which the gang's wait (re)started, to publish as the PodGroup's
    # status.scheduleStartTime; None while an earlier wait goes on.
    started: float | None = None
    # The wait ran past scheduleTimeoutSeconds (and starts over from now).
    timed_out: bool = False


class GangState:
    """Who belongs to which gang, and since when each gang has failed to be placed.

    Groups are 'namespace/name'; members are keyed by the scheduling queue's key (the
    pod's uid). Pure bookkeeping: the times are passed in (monotonic for the timeout,
    wall for what the user is told).
    """

    def __init__(self) -> None:
        # group -> queue key -> member pod (every phase).
        self._members: dict[str, dict[str, k8s.Pod]] = {}
        # group -> (monotonic, wall) time of its first unsuccessful cycle in a row.
        self._since: dict[str, tuple[float, float]] = {}

    def track(self, key: str, pod: k8s.Pod) -> str | None:
        """Record ``pod`` (added or changed) as a member of its group; returns the group."""
        group = pg_api.group_of(pod)
        if group is not None:
            self._members.setdefault(group, {})[key] = pod
        return group

    def untrack(self, key: str, pod: k8s.Pod) -> str | None:
        """Forget a deleted member; a group left without members stops waiting."""
        group = pg_api.group_of(pod)
        if group is None:
            return None
        members = self._members.get(group)
        if members is not None:
            members.pop(key, None)
            if not members:
                del self._members[group]
                self._since.pop(group, None)
        return group

    def members(self, group: str) -> dict[str, k8s.Pod]:
        """The group's members by queue key (do not change it)."""
        return self._members.get(group) or {}

    def unsuccessful(self, group: str, timeout: float, monotonic: float, wall: float) -> GangWait:
        """One more cycle of ``group`` that placed nothing: starts its wait, or says the
        wait ran past ``timeout`` seconds (and starts it over)."""
        since = self._since.get(group)
        if since is not None and monotonic - since[0] < timeout:
            return GangWait()
        self._since[group] = (monotonic, wall)
        return GangWait(started=wall, timed_out=since is not None)

    def placed(self, group: str) -> None:
        """The gang was placed: its wait is over."""
        self._since.pop(group, None)

    forget = placed  # the PodGroup was deleted

    @property
    def waiting(self) -> bool:
        return bool(self._since)

    def overdue(self, monotonic: float, timeout_of: Callable[[str], float | None]) -> list[str]:
        """The waiting groups past their timeout (``timeout_of(group)``; None: no such
        PodGroup), which get a cycle even if nothing else happened."""
        out = []
        for group, (since, _) in list(self._since.items()):
            timeout = timeout_of(group)
            if timeout is not None and monotonic - since >= timeout:
                out.append(group)
        return out
