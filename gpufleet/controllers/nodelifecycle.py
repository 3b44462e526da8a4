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

Not done: zone-aware eviction rate limiting (Kubernetes slows evictions when a whole zone
looks down); pods are evicted as soon as their toleration allows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpufleet.api.k8s import Lease, Node, Pod
from gpufleet.api.taints import NO_EXECUTE, NO_SCHEDULE, tolerates
from gpufleet.client import objects
from gpufleet.client.api import Client, retry_on_conflict
from gpufleet.client.controller import Controller, Requeue
from gpufleet.client.errors import ApiError, Conflict, NotFound
from gpufleet.client.events import NORMAL, EventRecorder
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.client.workqueue import WorkQueue
from gpufleet.controllers._common import (
    NODE_NAME_INDEX,
    index_by_node,
    is_being_deleted,
    now_text,
    pod_is_terminal,
    timestamp,
)
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

_HEARD_FROM = object()

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


class NodeLifecycleController:
    name = "nodelifecycle"

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
        self.client = client
        self.clock = clock
        self.recorder = recorder or EventRecorder(client, "node-controller", clock=clock)
        self.grace = node_monitor_grace_period
        self.default_eviction_seconds = default_eviction_seconds
        self.health: dict[str, NodeHealth] = {}
        # When this controller first saw each of its NoExecute taints without a timeAdded.
        self._taint_seen: dict[tuple[str, str], float] = {}
        self.node_informer = informers.informer(Node)
        self.lease_informer = informers.informer(Lease, namespace=LEASE_NAMESPACE)
        self.pod_informer = informers.informer(Pod)
        index_by_node(self.pod_informer)
        self.queue = WorkQueue(self.name, clock=clock)
        self.controller = Controller(self.name, self.reconcile, self.queue, workers=workers)
        self.controller.watch(self.node_informer)
        self.lease_informer.add_event_handler(self._lease_changed, lambda old, new: self._lease_changed(new))
        self.pod_informer.add_event_handler(self._pod_changed, lambda old, new: self._pod_changed(new))

    async def start(self) -> None:
        await self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()

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

    def _observe(self, node: Any, now: float) -> NodeHealth:
        name = objects.name_of(node)
        health = self.health.get(name)
        if health is None:
            health = self.health[name] = NodeHealth(probe_time=now)
        lease = self.lease_informer.get(f"{LEASE_NAMESPACE}/{name}")
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

    # -- sync ---------------------------------------------------------------------------------

    async def reconcile(self, name: str) -> Requeue | None:
        node = self.node_informer.get(name)
        now = self.clock.now()
        try:
            if node is None:
                return await self._node_gone(name)
            health = self._observe(node, now)
            stale = now - health.probe_time > self.grace
            if stale:
                marked = await self._mark_unknown(node, health)
                if marked is _HEARD_FROM:
                    health.probe_time = now
                    stale = False
                elif marked is not None:
                    node = marked
            ready = _condition(node, "Ready")
            ready_status = ready.status if ready is not None else "Unknown"
            state = (
                NodeState.UNREACHABLE if stale
                else NodeState.READY if ready_status == "True"
                else NodeState.NOT_READY if ready_status == "False"
                else NodeState.PENDING
            )
            moved = await self._record_transition(node, health, state, now)
            node = await self._sync_taints(node, stale, ready_status) or node
            # An unreachable node has no agent to report its pods; a live but NotReady one
            # does, so its pods are marked once, on the transition, as Kubernetes does.
            if state == NodeState.UNREACHABLE or (moved and state == NodeState.NOT_READY):
                await self._mark_pods_not_ready(name)
            next_eviction = await self._evict(node, now)
        except NotFound:
            return None
        except ApiError as e:
            log.info("node %s: %s", name, e)
            return Requeue()
        waits = [w for w in (next_eviction, None if stale else health.probe_time + self.grace - now) if w is not None]
        if not waits:
            return None
        return Requeue(after=max(min(waits), 0.0) + 0.01)

    async def _record_transition(self, node: Any, health: NodeHealth, state: NodeState, now: float) -> bool:
        first = health.state is None
        if not health.transition(state, now):
            return False
        name = objects.name_of(node)
        if first:
            await self.recorder.record(node, NORMAL, "RegisteredNode",
                                       f"Node {name} event: Registered Node {name} in Controller")
        reason = _STATE_EVENTS.get(state)
        if reason and not (first and state == NodeState.READY):
            await self.recorder.record(node, NORMAL, reason, f"Node {name} status is now: {reason}")
        return True

    async def _mark_unknown(self, node: Any, health: NodeHealth) -> Any | None:
        """Ready and the pressure conditions -> Unknown: the updated node, None when they
        were already, or _HEARD_FROM when a heartbeat arrived after all."""
        now = now_text(self.clock)
        name = objects.name_of(node)

        async def attempt() -> Any | None:
            fresh = await self.client.get(Node, name, raw=True)
            status = fresh.setdefault("status", {})
            conditions = status.setdefault("conditions", [])
            ready = next((c for c in conditions if c.get("type") == "Ready"), None)
            if ready is not None and ready.get("lastHeartbeatTime") and health.ready_heartbeat is not None and (
                timestamp(ready["lastHeartbeatTime"]) != timestamp(health.ready_heartbeat)
            ):
                return _HEARD_FROM  # the agent spoke meanwhile: not stale after all
            changed = False
            if ready is None:
                conditions.append({
                    "type": "Ready", "status": "Unknown", "reason": "NodeStatusNeverUpdated",
                    "message": "Kubelet never posted node status.",
                    "lastHeartbeatTime": fresh["metadata"].get("creationTimestamp", now),
                    "lastTransitionTime": now,
                })
                changed = True
            for cond in conditions:
                if cond.get("type") in CONDITIONS_MARKED_UNKNOWN and cond.get("status") != "Unknown":
                    cond.update(status="Unknown", reason="NodeStatusUnknown",
                                message="Kubelet stopped posting node status.", lastTransitionTime=now)
                    changed = True
            if not changed:
                return None
            return await self.client.update_status(fresh)

        return await retry_on_conflict(attempt)

    async def _sync_taints(self, node: Any, stale: bool, ready_status: str) -> Any | None:
        want: set[tuple[str, str]] = set()
        if stale:
            want |= {(UNREACHABLE, NO_SCHEDULE), (UNREACHABLE, NO_EXECUTE)}
        elif ready_status == "False":
            want |= {(NOT_READY, NO_SCHEDULE), (NOT_READY, NO_EXECUTE)}
        if node.spec is not None and node.spec.unschedulable:
            want.add((UNSCHEDULABLE, NO_SCHEDULE))
        have = {(t.key, t.effect) for t in (node.spec.taints if node.spec else None) or []} & MANAGED_TAINTS
        if have == want:
            return None
        now = now_text(self.clock)
        name = objects.name_of(node)

        async def attempt() -> Any:
            fresh = await self.client.get(Node, name, raw=True)
            spec = fresh.setdefault("spec", {})
            taints = [t for t in spec.get("taints") or []
                      if (t.get("key"), t.get("effect")) not in MANAGED_TAINTS or (t.get("key"), t.get("effect")) in want]
            present = {(t.get("key"), t.get("effect")) for t in taints}
            for key, effect in sorted(want - present):
                taints.append({"key": key, "effect": effect, "timeAdded": now})
                if effect == NO_EXECUTE:
                    # timeAdded has whole seconds; evictions are timed from the precise moment.
                    self._taint_seen[(name, key)] = self.clock.now()
            spec["taints"] = taints or None
            if not taints:
                spec.pop("taints")
            return await self.client.update(fresh)

        updated = await retry_on_conflict(attempt)
        added, removed = want - have, have - want
        log.info("node %s: taints added %s, removed %s", name, sorted(added), sorted(removed))
        return updated

    async def _mark_pods_not_ready(self, node_name: str) -> None:
        now = now_text(self.clock)
        for pod in self.pod_informer.by_index(NODE_NAME_INDEX, node_name):
            if pod_is_terminal(pod) or not _pod_ready(pod):
                continue

            async def attempt(pod: Any = pod) -> None:
                try:
                    fresh = await self.client.get(Pod, objects.name_of(pod), objects.namespace_of(pod), raw=True)
                except NotFound:
                    return
                changed = False
                for cond in (fresh.get("status") or {}).get("conditions") or []:
                    if cond.get("type") == "Ready" and cond.get("status") == "True":
                        cond.update(status="False", lastTransitionTime=now)
                        changed = True
                if changed:
                    await self.client.update_status(fresh, raw=True)

            await retry_on_conflict(attempt)

    async def _evict(self, node: Any, now: float) -> float | None:
        """Delete the pods whose tolerations ran out; seconds until the next one does."""
        taints = [t.to_dict() for t in (node.spec.taints if node.spec else None) or [] if t.effect == NO_EXECUTE]
        name = objects.name_of(node)
        if not taints:
            self._taint_seen = {k: v for k, v in self._taint_seen.items() if k[0] != name}
            return None
        since = min(self._taint_time(name, t, now) for t in taints)
        unreachable = any(t.get("key") == UNREACHABLE for t in taints)
        next_at: float | None = None
        for pod in self.pod_informer.by_index(NODE_NAME_INDEX, name):
            if pod_is_terminal(pod):
                continue
            if is_being_deleted(pod) and (not unreachable or objects.meta(pod, "deletionGracePeriodSeconds") == 0):
                continue
            delay = eviction_delay(pod, taints, self.default_eviction_seconds)
            if delay is None:
                continue
            at = since + delay
            if at > now:
                next_at = at if next_at is None else min(next_at, at)
                continue
            await self._evict_pod(pod, force=unreachable)
        return None if next_at is None else next_at - now

    def _taint_time(self, node_name: str, taint: dict[str, Any], now: float) -> float:
        seen = self._taint_seen.get((node_name, taint.get("key") or ""))
        added = timestamp(taint.get("timeAdded"))
        if seen is not None and (added is None or abs(seen - added) < 1.0):
            return seen
        if added is not None:
            return added
        return self._taint_seen.setdefault((node_name, taint.get("key") or ""), now)

    async def _evict_pod(self, pod: Any, *, force: bool) -> None:
        ns, name = objects.namespace_of(pod), objects.name_of(pod)
        already = is_being_deleted(pod)
        try:
            await self.client.delete(Pod, name, ns, grace_period_seconds=0 if force else None,
                                     preconditions_uid=objects.uid_of(pod))
        except (NotFound, Conflict):
            return
        if not already:
            await self.recorder.record(pod, NORMAL, "TaintManagerEviction", f"Marking for deletion Pod {ns}/{name}")

    async def _node_gone(self, name: str) -> Requeue | None:
        pods = [p for p in self.pod_informer.by_index(NODE_NAME_INDEX, name)]
        health = self.health.pop(name, None)
        if health is None and not pods:
            return None
        try:
            node = await self.client.get(Node, name, raw=True)
        except NotFound:
            node = None
        if node is not None:
            return None  # only the cache had not seen it yet
        if health is not None:
            ref = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
            await self.recorder.record(ref, NORMAL, "RemovingNode",
                                       f"Node {name} event: Removing Node {name} from Controller")
        for pod in pods:
            if objects.meta(pod, "deletionGracePeriodSeconds") != 0:
                await self._evict_pod(pod, force=True)
        return None


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
