"""Node lifecycle: notice nodes that stopped reporting, fence them, and move their pods away.

Heartbeats. A node agent renews its Lease (``kube-node-lease/<node>``) every few seconds and
posts its Ready condition. Like Kubernetes, the controller does not compare those timestamps
with its own clock (hosts' clocks drift): it notes *when it saw* a renewTime or a Ready
lastHeartbeatTime change, and a node with no change for ``node_monitor_grace_period``
(8 s by default; Kubernetes uses 40-50 s) is unreachable.

An unreachable node gets Ready (and any Memory/Disk/PIDPressure condition) set to Unknown,
reason NodeStatusUnknown, message "Kubelet stopped posting node status." (a node that never
posted one gets NodeStatusNeverUpdated), the taints ``node.kubernetes.io/unreachable``
NoSchedule and NoExecute (with timeAdded), and its pods' Ready condition set False (as
Kubernetes' MarkPodsNotReady, so endpoints stop sending them traffic). When its Lease moves
again the unreachable taints come off and the agent sets Ready itself. A node whose agent
reports Ready=False gets ``node.kubernetes.io/not-ready`` NoSchedule and NoExecute; a
cordoned node (spec.unschedulable) gets ``node.kubernetes.io/unschedulable:NoSchedule``.

Taint-based eviction (Kubernetes' taint manager): a pod on a node with a NoExecute taint it
does not tolerate is deleted at once; one that tolerates it for ``tolerationSeconds`` is
deleted that long after the taint's timeAdded. A pod with no toleration of its own for
not-ready or unreachable is treated as tolerating them for ``default_eviction_seconds``
(2 s by default), standing in for the 300 s that Kubernetes' DefaultTolerationSeconds
admission writes into every pod. Pods on an unreachable node are deleted with
gracePeriodSeconds=0, since no agent is there to stop them, with an Event
TaintManagerEviction. Pods bound to a node that was deleted are deleted the same way.

Each node's health is a small state machine (Pending, Ready, NotReady, Unreachable); every
transition is kept with its time in ``NodeHealth.history`` and announced as an Event
(RegisteredNode, NodeReady, NodeNotReady, RemovingNode).

The sync is decisions in steps, each a pure function of what was observed and the time:
``observe_heartbeats`` (the node's health memory from its Lease and Ready heartbeat),
``decide_node`` (state, transition Events, conditions to mark Unknown, the managed taints it
should carry, the pods to mark not Ready, when to look again), then on the node as that
wrote it ``decide_evictions`` (the pods to delete and when the next toleration runs out),
and ``decide_node_gone`` for a node deleted; the read-modify-writes they lead to are pure
too (``unknown_conditions``, ``managed_taints``, ``not_ready_conditions``).

Not done: zone-aware eviction rate limiting (Kubernetes slows evictions when a whole zone
looks down); pods are evicted as soon as their toleration allows.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpufleet.api.k8s import Lease, Node, Pod
from gpufleet.api.taints import NO_EXECUTE, NO_SCHEDULE, tolerates
from gpufleet.client import objects
from gpufleet.client.api import Client, retry_on_conflict
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import ApiError, NotFound
from gpufleet.client.events import NORMAL, EventRecorder
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.controllers._common import (
    NODE_NAME_INDEX,
    index_by_node,
    is_being_deleted,
    pod_is_terminal,
    timestamp,
)
from gpufleet.controllers.actions import Actions, Delete, Event, Instant, apply
from gpufleet.controllers.base import KeyedController
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-node-lease"
UNREACHABLE = "node.kubernetes.io/unreachable"
NOT_READY = "node.kubernetes.io/not-ready"
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
# The taints this controller owns; it adds and removes only these.
MANAGED_TAINTS = {
    (UNREACHABLE, NO_SCHEDULE), (UNREACHABLE, NO_EXECUTE),
    (NOT_READY, NO_SCHEDULE), (NOT_READY, NO_EXECUTE),
    (UNSCHEDULABLE, NO_SCHEDULE),
}
CONDITIONS_MARKED_UNKNOWN = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")


class NodeState(StrEnum):
    PENDING = "Pending"  # reporting, but its agent has not said Ready yet
    READY = "Ready"
    NOT_READY = "NotReady"
    UNREACHABLE = "Unreachable"


# Every move between different states is legal; staying put is not a transition.
TRANSITIONS: dict[NodeState | None, set[NodeState]] = {
    None: set(NodeState),
    **{s: set(NodeState) - {s} for s in NodeState},
}

HEARD_FROM = object()

_STATE_EVENTS = {
    NodeState.READY: "NodeReady",
    NodeState.NOT_READY: "NodeNotReady",
    NodeState.UNREACHABLE: "NodeNotReady",
}


@dataclass
class NodeHealth:
    """What the controller saw of one node: when its last heartbeat was observed (on the
    controller's clock), and its state transitions with their times."""

    probe_time: float
    lease_renew: Any = None
    ready_heartbeat: Any = None
    state: NodeState | None = None
    history: list[tuple[NodeState, float]] = field(default_factory=list)

    def transition(self, state: NodeState, now: float) -> bool:
        if state == self.state:
            return False
        if state not in TRANSITIONS[self.state]:
            raise ValueError(f"illegal node state transition {self.state} -> {state}")
        self.state = state
        self.history.append((state, now))
        return True


def effective_tolerations(pod: Any, default_seconds: float) -> list[dict[str, Any]]:
    """The pod's tolerations, plus the default ones for not-ready and unreachable that
    Kubernetes' admission would have added when the pod has none of its own for them."""
    spec = pod.spec
    tolerations = [t.to_dict() for t in (spec.tolerations if spec is not None else None) or []]
    out = list(tolerations)
    for key in (NOT_READY, UNREACHABLE):
        own = any(
            (t.get("key") or "") in ("", key) and (t.get("effect") or "") in ("", NO_EXECUTE)
            for t in tolerations
        )
        if not own:
            out.append({"key": key, "operator": "Exists", "effect": NO_EXECUTE, "tolerationSeconds": default_seconds})
    return out


def eviction_delay(pod: Any, taints: list[dict[str, Any]], default_seconds: float) -> float | None:
    """Seconds after the taints appeared that the pod must go: 0 when some NoExecute taint
    is not tolerated, None when every one is tolerated forever."""
    tolerations = effective_tolerations(pod, default_seconds)
    used: list[dict[str, Any]] = []
    for taint in taints:
        match = next((t for t in tolerations if tolerates(t, taint)), None)
        if match is None:
            return 0.0
        used.append(match)
    seconds = [t["tolerationSeconds"] for t in used if t.get("tolerationSeconds") is not None]
    if not seconds:
        return None
    return max(min(float(s) for s in seconds), 0.0)


# -- decisions ---------------------------------------------------------------------------------


def observe_heartbeats(health: NodeHealth | None, node: Any, lease: Any | None, now: float) -> NodeHealth:
    """The node's health memory once its Lease and Ready heartbeat were looked at: a renewTime
    or lastHeartbeatTime not seen before moves ``probe_time`` to ``now``."""
    health = NodeHealth(probe_time=now) if health is None else replace(health, history=list(health.history))
    renew = lease.spec.renew_time if lease is not None and lease.spec is not None else None
    if renew is not None and renew != health.lease_renew:
        health.lease_renew = renew
        health.probe_time = now
    ready = _condition(node, "Ready")
    heartbeat = ready.last_heartbeat_time if ready is not None else None
    if heartbeat is not None and heartbeat != health.ready_heartbeat:
        health.ready_heartbeat = heartbeat
        health.probe_time = now
    return health


@dataclass
class NodeDecision:
    """What one look at a node decided: its state (``moved``: a transition), the Events of
    that transition, whether its conditions go Unknown (``stale``), the managed taints it
    should carry, the pods whose Ready goes False, and when to look again for a heartbeat."""

    state: NodeState
    moved: bool
    stale: bool
    taints: frozenset[tuple[str, str]]
    retaint: bool
    mark_pods: list[Any] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None


def wanted_taints(node: Any, stale: bool) -> frozenset[tuple[str, str]]:
    """The managed taints ``node`` should carry."""
    want: set[tuple[str, str]] = set()
    if stale:
        want |= {(UNREACHABLE, NO_SCHEDULE), (UNREACHABLE, NO_EXECUTE)}
    elif _ready_status(node) == "False":
        want |= {(NOT_READY, NO_SCHEDULE), (NOT_READY, NO_EXECUTE)}
    if node.spec is not None and node.spec.unschedulable:
        want.add((UNSCHEDULABLE, NO_SCHEDULE))
    return frozenset(want)


def managed_taints_of(node: Any) -> frozenset[tuple[str, str]]:
    return frozenset((t.key, t.effect) for t in (node.spec.taints if node.spec else None) or []) & MANAGED_TAINTS


def decide_node(node: Any, health: NodeHealth, pods: Iterable[Any], now: float, grace: float) -> NodeDecision:
    """The decision for a node whose heartbeats were last seen at ``health.probe_time``
    (``health.state``: its state so far; ``pods``: those bound to it)."""
    name = objects.name_of(node)
    stale = now - health.probe_time > grace
    ready_status = _ready_status(node)
    state = (
        NodeState.UNREACHABLE if stale
        else NodeState.READY if ready_status == "True"
        else NodeState.NOT_READY if ready_status == "False"
        else NodeState.PENDING
    )
    moved = state != health.state
    if moved and state not in TRANSITIONS[health.state]:
        raise ValueError(f"illegal node state transition {health.state} -> {state}")
    events: list[Event] = []
    if moved:
        first = health.state is None
        if first:
            events.append(Event(NORMAL, "RegisteredNode", f"Node {name} event: Registered Node {name} in Controller"))
        reason = _STATE_EVENTS.get(state)
        if reason and not (first and state == NodeState.READY):
            events.append(Event(NORMAL, reason, f"Node {name} status is now: {reason}"))
    want = wanted_taints(node, stale)
    # An unreachable node has no agent to report its pods; a live but NotReady one does, so
    # its pods are marked once, on the transition, as Kubernetes does.
    mark = state == NodeState.UNREACHABLE or (moved and state == NodeState.NOT_READY)
    return NodeDecision(
        state=state, moved=moved, stale=stale, taints=want, retaint=managed_taints_of(node) != want,
        mark_pods=[p for p in pods if not pod_is_terminal(p) and _pod_ready(p)] if mark else [],
        events=events,
        requeue_after=None if stale else health.probe_time + grace - now,
    )


def unknown_conditions(node: dict[str, Any], ready_heartbeat: Any, now: str) -> list[dict[str, Any]] | object | None:
    """The conditions of a stale node (as stored, ``node``) with Ready and the pressure
    conditions Unknown; None when they are already, HEARD_FROM when its Ready heartbeat is
    not the one last seen (``ready_heartbeat``: the agent spoke meanwhile)."""
    conditions = copy.deepcopy((node.get("status") or {}).get("conditions") or [])
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is not None and ready.get("lastHeartbeatTime") and ready_heartbeat is not None and (
        timestamp(ready["lastHeartbeatTime"]) != timestamp(ready_heartbeat)
    ):
        return HEARD_FROM
    changed = False
    if ready is None:
        conditions.append({
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusNeverUpdated",
            "message": "Kubelet never posted node status.",
            "lastHeartbeatTime": (node.get("metadata") or {}).get("creationTimestamp", now),
            "lastTransitionTime": now,
        })
        changed = True
    for cond in conditions:
        if cond.get("type") in CONDITIONS_MARKED_UNKNOWN and cond.get("status") != "Unknown":
            cond.update(status="Unknown", reason="NodeStatusUnknown",
                        message="Kubelet stopped posting node status.", lastTransitionTime=now)
            changed = True
    return conditions if changed else None


def managed_taints(taints: list[dict[str, Any]] | None, want: frozenset[tuple[str, str]],
                   now: str) -> tuple[list[dict[str, Any]], list[str]]:
    """A node's taints (as stored) with the managed ones made ``want`` (new ones timeAdded
    ``now``), and the keys of the NoExecute taints added."""
    kept = [t for t in taints or []
            if (t.get("key"), t.get("effect")) not in MANAGED_TAINTS or (t.get("key"), t.get("effect")) in want]
    present = {(t.get("key"), t.get("effect")) for t in kept}
    added: list[str] = []
    for key, effect in sorted(want - present):
        kept.append({"key": key, "effect": effect, "timeAdded": now})
        if effect == NO_EXECUTE:
            added.append(key)
    return kept, added


def not_ready_conditions(pod: dict[str, Any], now: str) -> list[dict[str, Any]] | None:
    """A pod's conditions (as stored) with Ready False, None when it is not True."""
    conditions = copy.deepcopy((pod.get("status") or {}).get("conditions") or [])
    changed = False
    for cond in conditions:
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            cond.update(status="False", lastTransitionTime=now)
            changed = True
    return conditions if changed else None


def no_execute_taints(node: Any) -> list[dict[str, Any]]:
    return [t.to_dict() for t in (node.spec.taints if node.spec else None) or [] if t.effect == NO_EXECUTE]


def _evict(pod: Any, force: bool) -> Delete:
    # NotFound and a replaced pod (the uid precondition fails) are both done.
    return Delete(Pod, objects.name_of(pod), objects.namespace_of(pod), uid=objects.uid_of(pod),
                  grace_period_seconds=0 if force else None, ignore_conflict=True)


def decide_evictions(node: Any, pods: Iterable[Any], since: float, now: float, default_seconds: float) -> Actions:
    """The pods on ``node`` whose tolerations of its NoExecute taints ran out (the taints
    there since ``since``), deleted (at once on an unreachable node), and when the next one's
    runs out."""
    taints = no_execute_taints(node)
    actions = Actions(reason="NoTaints" if not taints else "Evict")
    if not taints:
        return actions
    unreachable = any(t.get("key") == UNREACHABLE for t in taints)
    for pod in pods:
        if pod_is_terminal(pod):
            continue
        if is_being_deleted(pod) and (not unreachable or objects.meta(pod, "deletionGracePeriodSeconds") == 0):
            continue
        delay = eviction_delay(pod, taints, default_seconds)
        if delay is None:
            continue
        at = since + delay
        if at > now:
            actions.requeue(at - now)
            continue
        actions.deletes.append(_evict(pod, unreachable))
    return actions


def decide_node_gone(name: str, known: bool, pods: Iterable[Any]) -> Actions:
    """A node deleted (``known``: the controller had seen it): the Event, and its pods deleted
    at once (but those already being deleted with no grace)."""
    actions = Actions(reason="NodeGone")
    if known:
        actions.event(NORMAL, "RemovingNode", f"Node {name} event: Removing Node {name} from Controller")
    actions.deletes = [_evict(p, True) for p in pods if objects.meta(p, "deletionGracePeriodSeconds") != 0]
    return actions


# -- the controller ------------------------------------------------------------------------------


class NodeLifecycleController(KeyedController):
    name = "nodelifecycle"
    model = Node
    component = "node-controller"

    def __init__(
        self,
        client: Client,
        informers: SharedInformerFactory,
        *,
        clock: Clock = REAL_CLOCK,
        recorder: EventRecorder | None = None,
        workers: int = 2,
        node_monitor_grace_period: float = 8.0,
        default_eviction_seconds: float = 2.0,
    ) -> None:
        super().__init__(client, informers, clock=clock, recorder=recorder, workers=workers)
        self.grace = node_monitor_grace_period
        self.default_eviction_seconds = default_eviction_seconds
        self.health: dict[str, NodeHealth] = {}
        # When this controller first saw each of its NoExecute taints without a timeAdded.
        self._taint_seen: dict[tuple[str, str], float] = {}
        self.node_informer = self.informer
        self.lease_informer = informers.informer(Lease, namespace=LEASE_NAMESPACE)
        self.pod_informer = informers.informer(Pod)
        index_by_node(self.pod_informer)
        self.lease_informer.add_event_handler(self._lease_changed, lambda old, new: self._lease_changed(new))
        self.pod_informer.add_event_handler(self._pod_changed, lambda old, new: self._pod_changed(new))

    # -- heartbeats ---------------------------------------------------------------------------

    def _lease_changed(self, lease: Any) -> None:
        name = objects.name_of(lease)
        health = self.health.get(name)
        if health is None:
            self.queue.add(name)
            return
        renew = lease.spec.renew_time if lease.spec is not None else None
        if renew != health.lease_renew:
            health.lease_renew = renew
            health.probe_time = self.clock.now()
            # A live node is rechecked by its own timer; only a fenced one needs us now.
            if health.state == NodeState.UNREACHABLE:
                self.queue.add(name)

    def _pod_changed(self, pod: Any) -> None:
        node_name = pod.spec.node_name if pod.spec is not None else None
        if not node_name:
            return
        node = self.node_informer.get(node_name)
        if node is None or any(t.effect == NO_EXECUTE for t in (node.spec.taints if node.spec else None) or []):
            self.queue.add(node_name)

    def _pods(self, name: str) -> list[Any]:
        return list(self.pod_informer.by_index(NODE_NAME_INDEX, name))

    # -- sync ---------------------------------------------------------------------------------

    async def sync(self, name: str, node: Any | None) -> Requeue | None:
        at = self.now()
        try:
            if node is None:
                return await self._node_gone(name)
            lease = self.lease_informer.get(f"{LEASE_NAMESPACE}/{name}")
            health = self.health[name] = observe_heartbeats(self.health.get(name), node, lease, at.wall)
            decision = decide_node(node, health, self._pods(name), at.wall, self.grace)
            if decision.stale:
                marked = await self._mark_unknown(node, health, at)
                if marked is HEARD_FROM:
                    health.probe_time = at.wall
                    decision = decide_node(node, health, self._pods(name), at.wall, self.grace)
                elif marked is not None:
                    node = marked
            if decision.moved:
                health.transition(decision.state, at.wall)
                for ev in decision.events:
                    await self.recorder.record(node, ev.type, ev.reason, ev.message)
            if managed_taints_of(node) != decision.taints:
                node = await self._write_taints(node, decision.taints, at)
            for pod in decision.mark_pods:
                await self._mark_not_ready(pod, at)
            next_eviction = await self._evictions(node, at)
        except NotFound:
            return None
        except ApiError as e:
            log.info("node %s: %s", name, e)
            return Requeue()
        waits = [w for w in (next_eviction, decision.requeue_after) if w is not None]
        if not waits:
            return None
        return Requeue(after=max(min(waits), 0.0) + 0.01)

    async def _mark_unknown(self, node: Any, health: NodeHealth, at: Instant) -> Any | None:
        """Ready and the pressure conditions -> Unknown: the updated node, None when they
        were already, or HEARD_FROM when a heartbeat arrived after all."""
        async def attempt() -> Any | None:
            fresh = await self.client.get(Node, objects.name_of(node), raw=True)
            conditions = unknown_conditions(fresh, health.ready_heartbeat, at.text)
            if conditions is None or conditions is HEARD_FROM:
                return conditions
            fresh.setdefault("status", {})["conditions"] = conditions
            return await self.client.update_status(fresh)

        return await retry_on_conflict(attempt)

    async def _write_taints(self, node: Any, want: frozenset[tuple[str, str]], at: Instant) -> Any:
        name = objects.name_of(node)

        async def attempt() -> Any:
            fresh = await self.client.get(Node, name, raw=True)
            spec = fresh.setdefault("spec", {})
            taints, added = managed_taints(spec.get("taints"), want, at.text)
            for key in added:
                # timeAdded has whole seconds; evictions are timed from the precise moment.
                self._taint_seen[(name, key)] = self.clock.now()
            spec["taints"] = taints or None
            if not taints:
                spec.pop("taints")
            return await self.client.update(fresh)

        have = managed_taints_of(node)
        updated = await retry_on_conflict(attempt)
        log.info("node %s: taints added %s, removed %s", name, sorted(want - have), sorted(have - want))
        return updated

    async def _mark_not_ready(self, pod: Any, at: Instant) -> None:
        async def attempt() -> None:
            try:
                fresh = await self.client.get(Pod, objects.name_of(pod), objects.namespace_of(pod), raw=True)
            except NotFound:
                return
            conditions = not_ready_conditions(fresh, at.text)
            if conditions is not None:
                fresh["status"]["conditions"] = conditions
                await self.client.update_status(fresh, raw=True)

        await retry_on_conflict(attempt)

    async def _evictions(self, node: Any, at: Instant) -> float | None:
        """Delete the pods whose tolerations ran out; seconds until the next one does."""
        name = objects.name_of(node)
        taints = no_execute_taints(node)
        if not taints:
            self._taint_seen = {k: v for k, v in self._taint_seen.items() if k[0] != name}
            return None
        since = min(self._taint_time(name, t, at.wall) for t in taints)
        pods = self._pods(name)
        actions = decide_evictions(node, pods, since, at.wall, self.default_eviction_seconds)
        await self._evict(actions, pods, node)
        return actions.requeue_after

    def _taint_time(self, node_name: str, taint: dict[str, Any], now: float) -> float:
        seen = self._taint_seen.get((node_name, taint.get("key") or ""))
        added = timestamp(taint.get("timeAdded"))
        if seen is not None and (added is None or abs(seen - added) < 1.0):
            return seen
        if added is not None:
            return added
        return self._taint_seen.setdefault((node_name, taint.get("key") or ""), now)

    async def _evict(self, actions: Actions, pods: list[Any], owner: Any) -> None:
        """Apply an eviction decision: the deletes, then an Event on each pod deleted that was
        not being deleted already."""
        outcome = await apply(self.client, actions, owner=owner, recorder=self.recorder, raise_errors=False)
        by_key = {objects.object_key(p): p for p in pods}
        for d in outcome.deleted:
            pod = by_key.get(d.key)
            if pod is not None and not is_being_deleted(pod):
                await self.recorder.record(pod, NORMAL, "TaintManagerEviction",
                                           f"Marking for deletion Pod {d.namespace}/{d.name}")
        if outcome.error is not None:
            raise outcome.error

    async def _node_gone(self, name: str) -> Requeue | None:
        pods = self._pods(name)
        health = self.health.pop(name, None)
        if health is None and not pods:
            return None
        try:
            await self.client.get(Node, name, raw=True)
            return None  # only the cache had not seen it yet
        except NotFound:
            pass
        ref = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        await self._evict(decide_node_gone(name, health is not None, pods), pods, ref)
        return None


def _ready_status(node: Any) -> str:
    ready = _condition(node, "Ready")
    return ready.status if ready is not None else "Unknown"


def _condition(node: Any, type_: str) -> Any | None:
    status = node.status
    for cond in (status.conditions if status is not None else None) or []:
        if cond.type == type_:
            return cond
    return None


def _pod_ready(pod: Any) -> bool:
    status = pod.status
    for cond in (status.conditions if status is not None else None) or []:
        if cond.type == "Ready":
            return cond.status == "True"
    return False
