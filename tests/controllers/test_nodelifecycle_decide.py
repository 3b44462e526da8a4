"""A node's health as plain decisions: the node, its Lease, its pods, what the controller
remembers and the time in; state, Events, taints, pods to mark and evictions out."""

from __future__ import annotations

from typing import Any

from gpufleet.api.k8s import Lease, Node, Pod
from gpufleet.controllers.nodelifecycle import (
    HEARD_FROM,
    NO_EXECUTE,
    NO_SCHEDULE,
    NOT_READY,
    UNREACHABLE,
    UNSCHEDULABLE,
    NodeHealth,
    NodeState,
    decide_evictions,
    decide_node,
    decide_node_gone,
    managed_taints,
    not_ready_conditions,
    observe_heartbeats,
    unknown_conditions,
)

T0 = 1_000_000.0
GRACE = 8.0


def node(ready: str | None = "True", *, taints: list | None = None, unschedulable: bool = False,
         heartbeat: str = "2026-01-01T00:00:00Z") -> Node:
    body: dict[str, Any] = {"metadata": {"name": "gpu-1"}, "spec": {}, "status": {}}
    if ready is not None:
        body["status"]["conditions"] = [{"type": "Ready", "status": ready, "lastHeartbeatTime": heartbeat}]
    if taints:
        body["spec"]["taints"] = taints
    if unschedulable:
        body["spec"]["unschedulable"] = True
    return Node.from_dict(body)


def pod(name: str, *, ready: bool = True, phase: str = "Running", tolerations: list | None = None,
        deleting: int | None = None) -> Pod:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if deleting is not None:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        meta["deletionGracePeriodSeconds"] = deleting
    return Pod.from_dict({
        "metadata": meta,
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "i"}],
                 **({"tolerations": tolerations} if tolerations else {})},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})


def lease(renew: str) -> Lease:
    return Lease.from_dict({"metadata": {"name": "gpu-1", "namespace": "kube-node-lease"},
                            "spec": {"renewTime": renew}})


def test_a_moving_lease_or_heartbeat_is_a_probe_and_the_memory_given_is_not_changed():
    first = observe_heartbeats(None, node(), lease("2026-01-01T00:00:01.000000Z"), T0)
    assert first.probe_time == T0 and first.lease_renew is not None
    same = observe_heartbeats(first, node(), lease("2026-01-01T00:00:01.000000Z"), T0 + 5)
    assert same.probe_time == T0
    moved = observe_heartbeats(same, node(), lease("2026-01-01T00:00:02.000000Z"), T0 + 6)
    assert moved.probe_time == T0 + 6 and same.probe_time == T0
    beat = observe_heartbeats(moved, node(heartbeat="2026-01-01T00:00:09Z"), None, T0 + 7)
    assert beat.probe_time == T0 + 7


def test_a_new_ready_node_is_registered_and_looked_at_again_when_its_grace_runs_out():
    d = decide_node(node(), NodeHealth(probe_time=T0), [], T0 + 1, GRACE)
    assert (d.state, d.moved, d.stale) == (NodeState.READY, True, False)
    assert [e.reason for e in d.events] == ["RegisteredNode"]
    assert d.taints == frozenset() and not d.retaint and d.mark_pods == []
    assert d.requeue_after == GRACE - 1
    again = decide_node(node(), NodeHealth(probe_time=T0, state=NodeState.READY), [], T0 + 2, GRACE)
    assert not again.moved and again.events == []


def test_a_silent_node_is_unreachable_fenced_and_its_ready_pods_marked():
    pods = [pod("a"), pod("b", ready=False), pod("done", phase="Succeeded")]
    d = decide_node(node(), NodeHealth(probe_time=T0, state=NodeState.READY), pods, T0 + GRACE + 0.1, GRACE)
    assert (d.state, d.stale, d.moved) == (NodeState.UNREACHABLE, True, True)
    assert [(e.reason, e.message) for e in d.events] == [("NodeNotReady", "Node gpu-1 status is now: NodeNotReady")]
    assert d.taints == {(UNREACHABLE, NO_SCHEDULE), (UNREACHABLE, NO_EXECUTE)} and d.retaint
    assert [p.metadata.name for p in d.mark_pods] == ["a"]
    assert d.requeue_after is None
    # Still unreachable: pods are marked on every look, as no agent reports them.
    d = decide_node(node(), NodeHealth(probe_time=T0, state=NodeState.UNREACHABLE), pods, T0 + 20, GRACE)
    assert not d.moved and [p.metadata.name for p in d.mark_pods] == ["a"]


def test_not_ready_marks_pods_once_and_a_cordon_gets_its_taint():
    n = node("False", unschedulable=True)
    d = decide_node(n, NodeHealth(probe_time=T0, state=NodeState.READY), [pod("a")], T0 + 1, GRACE)
    assert d.state == NodeState.NOT_READY and len(d.mark_pods) == 1
    assert d.taints == {(NOT_READY, NO_SCHEDULE), (NOT_READY, NO_EXECUTE), (UNSCHEDULABLE, NO_SCHEDULE)}
    held = decide_node(n, NodeHealth(probe_time=T0, state=NodeState.NOT_READY), [pod("a")], T0 + 1, GRACE)
    assert held.mark_pods == []
    pending = decide_node(node(None), NodeHealth(probe_time=T0), [], T0, GRACE)
    assert pending.state == NodeState.PENDING


def test_stale_conditions_go_unknown_unless_the_agent_spoke_meanwhile():
    stored = node().to_dict()
    conditions = unknown_conditions(stored, "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z")
    assert [(c["status"], c["reason"]) for c in conditions] == [("Unknown", "NodeStatusUnknown")]
    assert stored["status"]["conditions"][0]["status"] == "True"  # not changed in place
    assert unknown_conditions(stored, "2026-01-01T00:00:05Z", "now") is HEARD_FROM
    stored["status"]["conditions"] = conditions
    assert unknown_conditions(stored, "2026-01-01T00:00:00Z", "later") is None
    never = unknown_conditions({"metadata": {"name": "n", "creationTimestamp": "c"}}, None, "now")
    assert [(c["reason"], c["lastHeartbeatTime"]) for c in never] == [("NodeStatusNeverUpdated", "c")]


def test_only_managed_taints_are_added_and_removed():
    theirs = {"key": "gpu", "value": "busy", "effect": "NoSchedule"}
    old = {"key": NOT_READY, "effect": NO_EXECUTE, "timeAdded": "t0"}
    taints, added = managed_taints([theirs, old], frozenset({(UNREACHABLE, NO_EXECUTE)}), "t1")
    assert taints == [theirs, {"key": UNREACHABLE, "effect": NO_EXECUTE, "timeAdded": "t1"}]
    assert added == [UNREACHABLE]


def test_a_ready_pod_condition_goes_false():
    stored = pod("a").to_dict()
    assert not_ready_conditions(stored, "t")[0] == {"type": "Ready", "status": "False", "lastTransitionTime": "t"}
    assert not_ready_conditions(pod("b", ready=False).to_dict(), "t") is None


def test_evictions_follow_tolerations_and_an_unreachable_node_deletes_at_once():
    n = node(taints=[{"key": UNREACHABLE, "effect": NO_EXECUTE}])
    pods = [
        pod("plain"),
        pod("patient", tolerations=[{"key": UNREACHABLE, "operator": "Exists", "effect": NO_EXECUTE,
                                     "tolerationSeconds": 60}]),
        pod("forever", tolerations=[{"operator": "Exists"}]),
        pod("done", phase="Failed"),
        pod("going", deleting=30),
        pod("forced", deleting=0),
    ]
    actions = decide_evictions(n, pods, since=T0, now=T0 + 5, default_seconds=2.0)
    assert [(d.name, d.uid, d.grace_period_seconds) for d in actions.deletes] == [
        ("plain", "uid-plain", 0), ("going", "uid-going", 0)]
    assert all(d.ignore_conflict for d in actions.deletes)
    assert actions.requeue_after == 55
    early = decide_evictions(n, pods[:1], since=T0, now=T0 + 1, default_seconds=2.0)
    assert early.deletes == [] and early.requeue_after == 1


def test_a_not_ready_node_evicts_with_grace_and_leaves_pods_being_deleted():
    n = node("False", taints=[{"key": NOT_READY, "effect": NO_EXECUTE}])
    actions = decide_evictions(n, [pod("plain"), pod("going", deleting=30)], since=T0, now=T0 + 3,
                               default_seconds=2.0)
    assert [(d.name, d.grace_period_seconds) for d in actions.deletes] == [("plain", None)]
    assert decide_evictions(node(), [pod("plain")], T0, T0 + 99, 2.0).deletes == []


def test_pods_of_a_deleted_node_are_deleted_at_once_and_a_known_node_is_announced():
    actions = decide_node_gone("gpu-1", True, [pod("a"), pod("forced", deleting=0)])
    assert [e.reason for e in actions.events] == ["RemovingNode"]
    assert [(d.name, d.grace_period_seconds) for d in actions.deletes] == [("a", 0)]
    assert decide_node_gone("gpu-1", False, []).events == []
