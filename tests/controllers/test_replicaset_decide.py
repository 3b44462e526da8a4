"""The ReplicaSet's decisions as plain functions: no API server, no informers."""

from __future__ import annotations

from typing import Any

from gpufleet.api.k8s import Pod, ReplicaSet
from gpufleet.client.errors import ApiError
from gpufleet.controllers.actions import Instant
from gpufleet.controllers.replicaset import decide_replicas, decide_status

NOW = Instant(1_000_000.0, "1970-01-12T13:46:40Z", 50.0)


def rs(replicas: int, *, min_ready: int = 0, deleting: bool = False, status: dict | None = None) -> ReplicaSet:
    meta: dict[str, Any] = {"name": "web", "namespace": "default", "uid": "rs-uid", "generation": 3}
    if deleting:
        meta["deletionTimestamp"] = "1970-01-12T13:46:00Z"
    return ReplicaSet.from_dict({
        "metadata": meta,
        "spec": {"replicas": replicas, "minReadySeconds": min_ready, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}}},
        **({"status": status} if status else {}),
    })


def pod(name: str, *, node: str | None = None, ready_since: str | None = None, phase: str = "Running") -> Pod:
    status: dict[str, Any] = {"phase": phase}
    if ready_since:
        status["conditions"] = [{"type": "Ready", "status": "True", "lastTransitionTime": ready_since}]
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if node:
        spec["nodeName"] = node
    return Pod.from_dict({"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                                       "labels": {"app": "web"}}, "spec": spec, "status": status})


def test_too_few_pods_are_created_from_the_template_up_to_the_burst():
    actions = decide_replicas(rs(5), [pod("a")], [], burst_replicas=3)
    assert actions.reason == "ScaleUp"
    assert len(actions.creates) == 3 and not actions.deletes
    body = actions.creates[0].body
    assert body["metadata"]["generateName"] == "web-"
    assert body["metadata"]["labels"] == {"app": "web"}
    assert body["metadata"]["ownerReferences"][0]["uid"] == "rs-uid"
    assert all(c.expect for c in actions.creates)


def test_too_many_pods_lose_the_unscheduled_one_first():
    pods = [pod("on-node", node="n1", ready_since="1970-01-12T13:40:00Z"), pod("nowhere", phase="Pending")]
    actions = decide_replicas(rs(1), pods, [])
    assert actions.reason == "ScaleDown"
    assert [d.name for d in actions.deletes] == ["nowhere"]
    assert actions.deletes[0].uid == "uid-nowhere"


def test_nothing_is_decided_while_the_cache_is_behind_or_the_set_is_deleted():
    assert decide_replicas(rs(3), [], [], expectations_satisfied=False).empty
    assert decide_replicas(rs(3, deleting=True), [], []).empty
    assert decide_replicas(rs(1), [pod("a")], []).reason == "InSync"


def test_status_counts_ready_and_available_and_asks_to_look_again():
    pods = [pod("a", ready_since="1970-01-12T13:46:35Z"), pod("b")]
    actions = decide_status(rs(2, min_ready=10), pods, None, NOW)
    assert actions.status == {"replicas": 2, "fullyLabeledReplicas": 2, "readyReplicas": 1,
                              "observedGeneration": 3}
    # a became ready 5 s ago; it counts as available 10 s after that.
    assert actions.requeue_after is not None and 4.9 < actions.requeue_after < 5.1


def test_a_failed_create_is_a_replica_failure_condition_and_an_unchanged_status_is_not_written():
    error = ApiError(403, "Forbidden", 'pods "web-x" is forbidden: exceeded quota')
    actions = decide_status(rs(2), [], error, NOW)
    (cond,) = actions.status["conditions"]
    assert (cond["type"], cond["reason"]) == ("ReplicaFailure", "FailedCreate")
    assert "exceeded quota" in cond["message"]
    assert decide_status(rs(2, status=actions.status), [], error, NOW).status is None
