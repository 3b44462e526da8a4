"""A Deployment's sync as plain decisions: a Deployment, its ReplicaSets and their pods in;
Actions out. No API server, no informers, no clock."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpufleet.api.k8s import Deployment, Pod, ReplicaSet
from gpufleet.client.errors import ApiError
from gpufleet.controllers.actions import Instant
from gpufleet.controllers.deployment import (
    DESIRED_REPLICAS,
    MAX_REPLICAS,
    POD_TEMPLATE_HASH,
    REVISION,
    Observed,
    compute_hash,
    decide,
    decide_collision,
    decide_create_failed,
    decide_new_replica_set,
    decide_selecting_all,
    strategy,
)
from gpufleet.utils.clock import rfc3339

T0 = 1_700_000_000.0
NOW = Instant(T0, rfc3339(T0), 10.0)


def template(image: str) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": image}]}}


def dep(replicas: int = 3, image: str = "web:v2", *, recreate: bool = False, paused: bool = False,
        surge: Any = 1, unavailable: Any = 0, deadline: int | None = 600, history: int | None = None,
        status: dict | None = None, selector: bool = True, revision: str | None = None) -> Deployment:
    strategy_: dict[str, Any] = {"type": "Recreate"} if recreate else {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}
    spec: dict[str, Any] = {"replicas": replicas, "template": template(image), "strategy": strategy_,
                            "paused": paused}
    spec["selector"] = {"matchLabels": {"app": "web"}} if selector else {}
    if deadline is not None:
        spec["progressDeadlineSeconds"] = deadline
    if history is not None:
        spec["revisionHistoryLimit"] = history
    meta: dict[str, Any] = {"name": "web", "namespace": "default", "uid": "d-uid", "generation": 2}
    if revision:
        meta["annotations"] = {REVISION: revision}
    body: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}
    if status is not None:
        body["status"] = status
    return Deployment.from_dict(body)


def rs(image: str, replicas: int, *, available: int | None = None, revision: int = 1, created: float = T0 - 100,
       desired: int | None = None, owner: str = "d-uid", observed: int = 1) -> ReplicaSet:
    t = template(image)
    pod_hash = compute_hash(t)
    t["metadata"]["labels"][POD_TEMPLATE_HASH] = pod_hash
    ann = {REVISION: str(revision)}
    if desired is not None:
        ann[DESIRED_REPLICAS] = str(desired)
        ann[MAX_REPLICAS] = str(desired + 1)
    available = replicas if available is None else available
    return ReplicaSet.from_dict({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": f"web-{pod_hash}", "namespace": "default", "uid": f"uid-{image}", "generation": 1,
                     "resourceVersion": "7", "creationTimestamp": rfc3339(created), "annotations": ann,
                     "labels": {"app": "web", POD_TEMPLATE_HASH: pod_hash},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                          "uid": owner, "controller": True}]},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web", POD_TEMPLATE_HASH: pod_hash}},
                 "template": t},
        "status": {"replicas": replicas, "readyReplicas": available, "availableReplicas": available,
                   "observedGeneration": observed},
    })


def scales(actions: Any) -> list[tuple[str, int]]:
    return [(u.body["metadata"]["name"].split("-")[0] + ":" + u.body["spec"]["template"]["spec"]["containers"][0]
             ["image"], u.body["spec"]["replicas"]) for u in actions.updates]


def progressing(actions: Any) -> dict[str, Any] | None:
    return next((c for c in (actions.status or {}).get("conditions", []) if c["type"] == "Progressing"), None)


def created(obs: Observed) -> Observed:
    """``obs`` after the new set was created: its create body, as the API answers it."""
    body = decide_new_replica_set(obs).creates[0].body
    body["metadata"].update(uid="uid-new", resourceVersion="9", creationTimestamp=NOW.text, generation=1)
    return dataclasses.replace(obs, created=ReplicaSet.from_dict(body), fresh=True)


# -- the new ReplicaSet ---------------------------------------------------------------------


def test_a_new_template_gets_a_hashed_replica_set_within_the_surge():
    obs = Observed(dep(3, surge=1), [rs("web:v1", 3, revision=4, desired=3)])
    actions = decide_new_replica_set(obs)
    (create,) = actions.creates
    body = create.body
    pod_hash = compute_hash(template("web:v2"))
    assert body["metadata"]["name"] == f"web-{pod_hash}"
    assert body["spec"]["selector"]["matchLabels"] == {"app": "web", POD_TEMPLATE_HASH: pod_hash}
    assert body["spec"]["replicas"] == 1  # 3 old + 1 surge
    assert body["metadata"]["annotations"][REVISION] == "5"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "d-uid"


def test_recreate_creates_nothing_until_the_old_pods_are_gone():
    old = rs("web:v1", 0)
    old.status.replicas = 0
    pod = Pod.from_dict({"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": []},
                         "status": {"phase": "Running"}})
    d = dep(2, recreate=True)
    assert decide_new_replica_set(Observed(d, [old], {"uid-web:v1": [pod]})).reason == "WaitingForOldPods"
    assert decide_new_replica_set(Observed(d, [rs("web:v1", 2)])).reason == "WaitingForOldPods"
    assert decide_new_replica_set(Observed(d, [old], {"uid-web:v1": []})).creates[0].body["spec"]["replicas"] == 2


def test_a_name_taken_by_another_template_counts_a_collision():
    d = dep(status={"collisionCount": 1})
    theirs = rs("web:v1", 1, owner="someone-else")
    assert decide_collision(d, theirs).status["collisionCount"] == 2
    ours = rs("web:v2", 1)
    assert decide_collision(d, ours) is None


def test_a_refused_create_is_a_progressing_false_condition_and_a_warning():
    error = ApiError(403, "Forbidden", "exceeded quota")
    actions = decide_create_failed(dep(), "web-abc", error, NOW)
    cond = progressing(actions)
    assert (cond["status"], cond["reason"]) == ("False", "ReplicaSetCreateError")
    assert "exceeded quota" in cond["message"]
    assert [e.reason for e in actions.events] == ["ReplicaSetCreateError"]


# -- rolling update -------------------------------------------------------------------------


def test_after_the_create_the_revision_is_recorded_and_old_pods_wait_for_availability():
    status = {"observedGeneration": 2, "replicas": 3, "readyReplicas": 3, "availableReplicas": 3}
    obs = created(Observed(dep(3, surge=1, unavailable=0, status=status), [rs("web:v1", 3, revision=1, desired=3)]))
    actions = decide(obs, NOW)
    assert actions.reason == "RollingUpdate"
    assert [p.patch for p in actions.patches] == [{"metadata": {"annotations": {REVISION: "2"}}}]
    assert [e.message for e in actions.events] == [f"Scaled up replica set {obs.created.metadata.name} from 0 to 1"]
    assert actions.updates == []  # the new pod is not available yet: no old pod may go
    assert progressing(actions)["reason"] == "NewReplicaSetCreated"
    assert "updatedReplicas" not in actions.status  # the new set has no pods yet
    assert actions.requeue_after is not None  # to notice the deadline passing


def test_old_sets_lose_unavailable_pods_first_then_as_many_as_availability_allows():
    new = rs("web:v2", 2, available=2, revision=2, desired=3, created=T0 - 10)
    old = rs("web:v1", 2, available=1, revision=1, desired=3)
    actions = decide(Observed(dep(3, surge=1, unavailable=0), [old, new]), NOW)
    # 4 pods, 3 must stay available: the unavailable old pod goes first, then nothing more
    # (3 available left, the floor), in one update of the old set.
    assert scales(actions) == [("web:web:v1", 1)]
    assert [u.event.message for u in actions.updates] == [f"Scaled down replica set {old.metadata.name} from 2 to 1"]
    assert actions.updates[0].body["metadata"]["generation"] == 2


def test_a_set_can_be_scaled_twice_in_one_sync_each_with_its_event():
    new = rs("web:v2", 3, available=3, revision=2, desired=4, created=T0 - 10)
    old = rs("web:v1", 2, available=1, revision=1, desired=4)
    actions = decide(Observed(dep(4, surge=1, unavailable=1), [old, new]), NOW)
    assert [u.body["spec"]["replicas"] for u in actions.updates] == [1, 0]
    assert all(u.event is not None for u in actions.updates)


def test_scaling_mid_rollout_spreads_the_change_in_proportion():
    new = rs("web:v2", 2, revision=2, desired=4, created=T0 - 10)
    old = rs("web:v1", 3, revision=1, desired=4)
    d = dep(8, surge=1, status={"replicas": 5})
    assert strategy(d, [old, new]) == "Sync"
    actions = decide(Observed(d, [old, new]), NOW)
    sizes = dict((u.body["metadata"]["name"], u.body["spec"]["replicas"]) for u in actions.updates)
    assert sizes == {old.metadata.name: 5, new.metadata.name: 4}  # 9 = 8 + surge, 3:2
    assert all(u.body["metadata"]["annotations"][DESIRED_REPLICAS] == "8" for u in actions.updates)


def test_a_complete_rollout_deletes_old_sets_past_the_history_limit():
    new = rs("web:v2", 2, revision=3, desired=2, created=T0 - 10)
    older, old = rs("web:v0", 0, revision=1), rs("web:v1", 0, revision=2)
    status = {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}
    actions = decide(Observed(dep(2, history=1, status=status), [older, old, new]), NOW)
    assert [d.name for d in actions.deletes] == [older.metadata.name]
    assert actions.deletes[0].uid == "uid-web:v0"
    assert progressing(actions)["reason"] == "NewReplicaSetAvailable"


def test_no_progress_past_the_deadline_times_out_once():
    new = rs("web:v2", 1, available=0, revision=2, desired=2, created=T0 - 10)
    old = rs("web:v1", 2, revision=1, desired=2)
    stale = rfc3339(T0 - 700)
    cond = {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated", "lastUpdateTime": stale,
            "lastTransitionTime": stale}
    status = {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 2,
              "readyReplicas": 2, "conditions": [cond]}
    d = dep(2, surge=1, unavailable=0, deadline=600, status=status, revision="2")
    actions = decide(Observed(d, [old, new]), NOW)
    assert progressing(actions)["reason"] == "ProgressDeadlineExceeded"
    assert [e.reason for e in actions.events] == ["ProgressDeadlineExceeded"]
    assert actions.requeue_after is None
    again = decide(Observed(dep(2, surge=1, unavailable=0, status=actions.status, revision="2"), [old, new]), NOW)
    assert again.events == [] and again.status is None


# -- recreate, paused, deleted, no selector -------------------------------------------------


def test_recreate_scales_every_old_set_to_zero_first():
    actions = decide(Observed(dep(2, recreate=True), [rs("web:v1", 2, desired=2), rs("web:v0", 1, desired=2)]), NOW)
    assert sorted(u.body["spec"]["replicas"] for u in actions.updates) == [0, 0]


def test_recreate_scales_the_new_set_once_created():
    old = rs("web:v1", 0, desired=2)
    old.status.replicas = 0
    obs = created(Observed(dep(2, recreate=True), [old], {"uid-web:v1": []}))
    actions = decide(obs, NOW)
    assert actions.updates == [] and [p.patch for p in actions.patches][0]["metadata"]["annotations"][REVISION]
    assert [e.reason for e in actions.events] == ["ScalingReplicaSet"]


def test_a_paused_deployment_says_so_and_only_scales():
    current = rs("web:v1", 1, desired=1)
    actions = decide(Observed(dep(2, paused=True), [current]), NOW)
    assert actions.reason == "Sync"
    cond = progressing(actions)
    assert (cond["status"], cond["reason"], cond["message"]) == ("Unknown", "DeploymentPaused",
                                                                "Deployment is paused")
    assert scales(actions) == [("web:web:v1", 2)]
    assert decide_new_replica_set(Observed(dep(2, paused=True), [current])).creates == []


def test_a_deployment_being_deleted_only_has_its_status_written():
    d = dep(2)
    d.metadata.deletion_timestamp = NOW.text
    actions = decide(Observed(d, [rs("web:v1", 2, desired=2)]), NOW)
    assert actions.reason == "StatusOnly" and actions.updates == [] and actions.deletes == []


def test_a_deployment_selecting_everything_is_refused():
    actions = decide_selecting_all(dep(selector=False))
    assert [e.reason for e in actions.events] == ["SelectingAll"]
    assert actions.status["observedGeneration"] == 2
