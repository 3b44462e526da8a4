"""The StatefulSet's decisions as plain functions: no API server, no informers."""

from __future__ import annotations

import copy
from typing import Any

from gpufleet.api.defaults import apply_defaults
from gpufleet.api.k8s import ControllerRevision, PersistentVolumeClaim, Pod, StatefulSet
from gpufleet.controllers import history
from gpufleet.controllers.actions import Instant
from gpufleet.controllers.statefulset import Observed, decide, decide_revisions

NOW = Instant(1_000_000.0, "1970-01-12T13:46:40Z", 50.0)
LONG_AGO = "1970-01-12T13:00:00Z"


def sts(replicas: int = 3, *, image: str = "db:v1", policy: str | None = None, partition: int | None = None,
        on_delete: bool = False, retention: dict | None = None, status: dict | None = None,
        claims: bool = True, history_limit: int | None = None) -> StatefulSet:
    spec: dict[str, Any] = {
        "replicas": replicas, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
        "template": {"metadata": {"labels": {"app": "db"}},
                     "spec": {"containers": [{"name": "c", "image": image}]}},
    }
    if claims:
        spec["volumeClaimTemplates"] = [{"metadata": {"name": "data"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]
    if policy:
        spec["podManagementPolicy"] = policy
    if on_delete:
        spec["updateStrategy"] = {"type": "OnDelete"}
    elif partition is not None:
        spec["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}}
    if retention:
        spec["persistentVolumeClaimRetentionPolicy"] = retention
    if history_limit is not None:
        spec["revisionHistoryLimit"] = history_limit
    obj = StatefulSet.from_dict({"metadata": {"name": "db", "namespace": "default", "uid": "sts-uid",
                                              "generation": 1},
                                 "spec": spec, **({"status": status} if status else {})})
    apply_defaults(obj)
    return obj


def revision_of_set(s: StatefulSet, number: int = 1) -> ControllerRevision:
    """The revision the controller would have created for ``s``'s template."""
    create = decide_revisions(s, []).actions.creates[0]
    body = copy.deepcopy(create.body)
    body["revision"] = number
    body["metadata"]["uid"] = f"rev-{number}"
    body["metadata"]["creationTimestamp"] = LONG_AGO
    return ControllerRevision.from_dict(body)


def pod(s: StatefulSet, ordinal: int, revision: ControllerRevision, *, ready: bool = True, phase: str = "Running",
        deleting: bool = False) -> Pod:
    meta: dict[str, Any] = {"name": f"db-{ordinal}", "namespace": "default", "uid": f"pod-{ordinal}",
                            "labels": {"app": "db", "controller-revision-hash": revision.metadata.name},
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                                                 "uid": "sts-uid", "controller": True}]}
    if deleting:
        meta["deletionTimestamp"] = LONG_AGO
    status: dict[str, Any] = {"phase": phase, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": LONG_AGO}]}
    return Pod.from_dict({"metadata": meta, "spec": {"containers": [{"name": "c", "image": "i"}]}, "status": status})


def claim(name: str, refs: list[dict] | None = None) -> PersistentVolumeClaim:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if refs:
        meta["ownerReferences"] = refs
    return PersistentVolumeClaim.from_dict({"metadata": meta, "spec": {"accessModes": ["ReadWriteOnce"]}})


def pod_creates(actions) -> list[dict]:
    return [c.body for c in actions.creates if c.body["kind"] == "Pod"]


def test_ordered_ready_creates_one_ordinal_at_a_time_with_its_claim_and_identity():
    s = sts()
    rev = revision_of_set(s)
    actions = decide(Observed(s, [], {}, [rev]), NOW)
    assert actions.reason == "CreatePod"
    kinds = [c.body["kind"] for c in actions.creates]
    assert kinds == ["PersistentVolumeClaim", "Pod"]  # the claim goes first
    claim_body, pod_body = (c.body for c in actions.creates)
    assert claim_body["metadata"]["name"] == "data-db-0"
    assert claim_body["metadata"]["labels"] == {"app": "db"}
    assert "ownerReferences" not in claim_body["metadata"]  # Retain: nobody owns it
    meta, spec = pod_body["metadata"], pod_body["spec"]
    assert meta["name"] == "db-0"
    assert meta["labels"] == {"app": "db", "statefulset.kubernetes.io/pod-name": "db-0",
                              "apps.kubernetes.io/pod-index": "0",
                              "controller-revision-hash": rev.metadata.name}
    assert (spec["hostname"], spec["subdomain"]) == ("db-0", "db")
    assert spec["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}]
    assert meta["ownerReferences"][0]["uid"] == "sts-uid" and meta["ownerReferences"][0]["controller"]

    # db-0 exists but is not Ready: nothing more.
    claims = {"data-db-0": claim("data-db-0")}
    waiting = decide(Observed(s, [pod(s, 0, rev, ready=False)], claims, [rev]), NOW)
    assert waiting.reason == "WaitingForReady" and not pod_creates(waiting)
    # Ready: db-1 next, and only db-1.
    nxt = decide(Observed(s, [pod(s, 0, rev)], claims, [rev]), NOW)
    assert [b["metadata"]["name"] for b in pod_creates(nxt)] == ["db-1"]


def test_parallel_creates_every_missing_ordinal_at_once():
    s = sts(policy="Parallel")
    rev = revision_of_set(s)
    actions = decide(Observed(s, [pod(s, 1, rev, ready=False)], {}, [rev]), NOW)
    assert [b["metadata"]["name"] for b in pod_creates(actions)] == ["db-0", "db-2"]


def test_scale_down_goes_from_the_highest_ordinal_and_waits_for_unhealthy_pods():
    s = sts(replicas=1)
    rev = revision_of_set(s)
    pods = [pod(s, 0, rev), pod(s, 1, rev), pod(s, 2, rev)]
    actions = decide(Observed(s, pods, {}, [rev]), NOW)
    assert actions.reason == "ScaleDown" and [d.name for d in actions.deletes] == ["db-2"]
    # db-0 not ready: nothing is deleted under OrderedReady.
    stuck = decide(Observed(s, [pod(s, 0, rev, ready=False), *pods[1:]], {}, [rev]), NOW)
    assert not [d for d in stuck.deletes if d.kind is Pod]
    # db-2 terminating: wait for it before db-1.
    going = decide(Observed(s, [pods[0], pods[1], pod(s, 2, rev, deleting=True)], {}, [rev]), NOW)
    assert going.reason == "WaitingForTermination" and not going.deletes


def test_a_finished_pod_is_deleted_to_be_made_again():
    s = sts(replicas=1)
    rev = revision_of_set(s)
    actions = decide(Observed(s, [pod(s, 0, rev, phase="Failed", ready=False)], {}, [rev]), NOW)
    assert actions.reason == "ReplaceFinished" and [d.name for d in actions.deletes] == ["db-0"]


def test_rolling_update_with_a_partition_goes_down_from_the_highest_ordinal_one_at_a_time():
    old_set = sts()
    old = revision_of_set(old_set, 1)
    s = sts(image="db:v2", partition=1, status={"replicas": 3, "currentRevision": old.metadata.name})
    revs = decide_revisions(s, [old])
    (create,) = revs.actions.creates
    assert create.body["revision"] == 2 and revs.update != old.metadata.name and revs.current == old.metadata.name
    new = revision_of_set(s, 2)
    claims = {f"data-db-{i}": claim(f"data-db-{i}") for i in range(3)}

    pods = [pod(s, i, old) for i in range(3)]
    first = decide(Observed(s, pods, claims, [old, new]), NOW)
    assert first.reason == "RollingUpdate" and [d.name for d in first.deletes] == ["db-2"]
    # db-2 back at the new revision but not Ready yet: wait.
    pods[2] = pod(s, 2, new, ready=False)
    assert not decide(Observed(s, pods, claims, [old, new]), NOW).deletes
    pods[2] = pod(s, 2, new)
    second = decide(Observed(s, pods, claims, [old, new]), NOW)
    assert [d.name for d in second.deletes] == ["db-1"]
    # The partition holds db-0 at the old revision, and it comes back at the old one.
    pods[1] = pod(s, 1, new)
    done = decide(Observed(s, pods, claims, [old, new]), NOW)
    assert not done.deletes and done.status["updatedReplicas"] == 2 and done.status["currentReplicas"] == 1
    assert done.status["currentRevision"] == old.metadata.name
    again = decide(Observed(s, pods[1:], claims, [old, new]), NOW)
    (body,) = pod_creates(again)
    assert body["metadata"]["labels"]["controller-revision-hash"] == old.metadata.name
    assert body["spec"]["containers"][0]["image"] == "db:v1"


def test_a_finished_rollout_makes_the_update_revision_current():
    old = revision_of_set(sts(), 1)
    s = sts(image="db:v2", status={"replicas": 3, "currentRevision": old.metadata.name})
    new = revision_of_set(s, 2)
    actions = decide(Observed(s, [pod(s, i, new) for i in range(3)], {}, [old, new]), NOW)
    assert actions.status["currentRevision"] == actions.status["updateRevision"] == new.metadata.name
    assert actions.status["currentReplicas"] == actions.status["updatedReplicas"] == 3
    assert actions.status["readyReplicas"] == actions.status["availableReplicas"] == 3


def test_on_delete_replaces_nothing_but_a_deleted_pod_comes_back_new():
    old = revision_of_set(sts(on_delete=True), 1)
    s = sts(image="db:v2", on_delete=True, status={"replicas": 3, "currentRevision": old.metadata.name})
    new = revision_of_set(s, 2)
    pods = [pod(s, 0, old), pod(s, 1, old), pod(s, 2, old)]
    assert not decide(Observed(s, pods, {}, [old, new]), NOW).deletes
    (body,) = pod_creates(decide(Observed(s, pods[:2], {}, [old, new]), NOW))
    assert body["metadata"]["labels"]["controller-revision-hash"] == new.metadata.name


def test_an_earlier_template_back_renumbers_its_revision():
    s1 = sts()
    one = revision_of_set(s1, 1)
    two = revision_of_set(sts(image="db:v2"), 2)
    revs = decide_revisions(s1, [one, two])
    assert revs.update == one.metadata.name and not revs.actions.creates
    (update,) = revs.actions.updates
    assert update.body["metadata"]["name"] == one.metadata.name and update.body["revision"] == 3


def test_revision_names_labels_and_data():
    s = sts()
    (create,) = decide_revisions(s, []).actions.creates
    body = create.body
    hash_ = body["metadata"]["labels"]["controller.kubernetes.io/hash"]
    assert body["metadata"]["name"] == f"db-{hash_}" and body["metadata"]["labels"]["app"] == "db"
    assert body["data"]["spec"]["template"]["$patch"] == "replace"
    assert history.template_of(ControllerRevision.from_dict(body)) == s.spec.template.to_dict()
    assert body["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"


def test_old_revisions_beyond_the_limit_are_deleted_oldest_first():
    s = sts(image="db:v9", history_limit=1)
    olds = [revision_of_set(sts(image=f"db:v{i}"), i) for i in range(1, 5)]
    current = revision_of_set(s, 5)
    pods = [pod(s, i, current) for i in range(3)]
    actions = decide(Observed(s, pods, {}, [*olds, current]), NOW)
    assert sorted(d.name for d in actions.deletes) == sorted(r.metadata.name for r in olds[:3])


def test_retention_policy_decides_who_owns_the_claims():
    s = sts(replicas=1, retention={"whenDeleted": "Delete", "whenScaled": "Delete"})
    rev = revision_of_set(s)
    (claim_body,) = [c.body for c in decide(Observed(s, [], {}, [rev]), NOW).creates
                     if c.body["kind"] == "PersistentVolumeClaim"]
    assert claim_body["metadata"]["ownerReferences"] == [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "sts-uid"}]
    # db-1 is beyond replicas: its claim gets the pod as an owner before the pod goes.
    set_ref = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "sts-uid"}
    claims = {"data-db-0": claim("data-db-0", [set_ref]), "data-db-1": claim("data-db-1", [set_ref])}
    actions = decide(Observed(s, [pod(s, 0, rev), pod(s, 1, rev)], claims, [rev]), NOW)
    (patch,) = actions.patches
    assert patch.name == "data-db-1"
    assert patch.patch["metadata"]["ownerReferences"] == [
        set_ref, {"apiVersion": "v1", "kind": "Pod", "name": "db-1", "uid": "pod-1"}]
    assert [d.name for d in actions.deletes] == ["db-1"]
    # Retain after all: the set's reference goes.
    kept = sts(replicas=2)
    rev2 = revision_of_set(kept)
    cleared = decide(Observed(kept, [pod(kept, 0, rev2), pod(kept, 1, rev2)], claims, [rev2]), NOW)
    assert {p.name: p.patch["metadata"]["ownerReferences"] for p in cleared.patches} == {
        "data-db-0": None, "data-db-1": None}


def test_nothing_but_status_while_the_cache_is_behind():
    s = sts()
    rev = revision_of_set(s)
    actions = decide(Observed(s, [], {}, [rev], expectations_satisfied=False), NOW)
    assert actions.reason == "WaitingForCache" and not actions.creates and not actions.deletes
    assert actions.status["replicas"] == 0 and actions.status["updateRevision"] == rev.metadata.name
