"""A PyTorchJob's sync as a plain decision: a job, its pods and nodes in; Actions out. No API
server, no informers, no clock."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.api.k8s import Node, Pod
from gpufleet.api.kubeflow import PyTorchJob
from gpufleet.controllers.actions import Instant
from gpufleet.controllers.pytorchjob import TRANSITIONS, Memory, Observed, Settings, decide, phase
from gpufleet.controllers.pytorchjob.decide import ACTIVE, NEW
from gpufleet.controllers.pytorchjob.model import set_job_condition
from gpufleet.utils.clock import rfc3339

T0 = 1_700_000_000.0
NOW = Instant(T0, rfc3339(T0), 100.0)
SETTINGS = Settings(restart_backoff=1.0, restart_backoff_max=60.0, checkpoint_root="/ckpt",
                    elastic_resize_interval=30.0)


def template(gpus: int = 0, restart: str = "OnFailure") -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {"replicas": 1, "restartPolicy": restart,
            "template": {"spec": {"containers": [{"name": "pytorch", "image": "trainer", "resources": resources}]}}}


def job(workers: int = 2, *, attempt: int = 0, restarts: int = 0, conditions: list[dict] | None = None,
        master: bool = True, elastic: tuple[int, int] | None = None, run_policy: dict | None = None,
        restart: str = "OnFailure", gpus: int = 0, annotations: dict | None = None,
        status: dict | None = None) -> PyTorchJob:
    specs: dict[str, Any] = {"Worker": {**template(gpus, restart), "replicas": workers}}
    if master:
        specs["Master"] = template(gpus, restart)
    spec: dict[str, Any] = {"pytorchReplicaSpecs": specs}
    if elastic:
        spec["elasticPolicy"] = {"minReplicas": elastic[0], "maxReplicas": elastic[1]}
    if run_policy:
        spec["runPolicy"] = run_policy
    ann = {"gpufleet.io/gang-attempt": str(attempt), "gpufleet.io/gang-restarts": str(restarts),
           **(annotations or {})}
    body: dict[str, Any] = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                            "metadata": {"name": "train", "namespace": "ml", "uid": "0123456789abcdef",
                                         "annotations": ann}, "spec": spec}
    if conditions is not None:
        body["status"] = {"conditions": conditions, "startTime": rfc3339(T0 - 10)}
    if status is not None:
        body["status"] = status
    return PyTorchJob.from_dict(body)


def conds(*types: str, reason: str = "") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in types:
        set_job_condition(out, t, "True", reason or f"PyTorchJob{t}", t, rfc3339(T0 - 20))
    return out


def pod(rtype: str, index: int, phase_: str = "Running", *, attempt: int = 0, exit_code: int | None = None,
        node: str | None = "n1", size: int = 3, gpus: int = 0, priority: int = 0,
        owner: bool = True) -> Pod:
    name = f"train-{rtype}-{index}" if owner else f"other-{index}"
    status: dict[str, Any] = {"phase": phase_}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "pytorch", "image": "trainer", "imageID": "", "ready": False,
                                        "restartCount": 0,
                                        "state": {"terminated": {"exitCode": exit_code}}}]
    spec: dict[str, Any] = {"containers": [{"name": "pytorch", "image": "trainer",
                                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}}],
                            "priority": priority}
    if node:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                            "annotations": {"gpufleet.io/gang-attempt": str(attempt),
                                            "gpufleet.io/gang-size": str(size)}}
    if owner:
        meta["labels"] = {"training.kubeflow.org/replica-type": rtype, "training.kubeflow.org/replica-index": str(index)}
    return Pod.from_dict({"metadata": meta, "spec": spec, "status": status})


def node(name: str = "n1", gpus: int = 8) -> Node:
    return Node.from_dict({"metadata": {"name": name}, "status": {
        "allocatable": {"nvidia.com/gpu": str(gpus)},
        "conditions": [{"type": "Ready", "status": "True"}],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "",
                     "containerRuntimeVersion": "process://1", "kubeletVersion": "", "kubeProxyVersion": "",
                     "operatingSystem": "linux", "architecture": "amd64"}}})


def gang(attempt: int = 0, phase_: str = "Running", workers: int = 2) -> list[Pod]:
    return [pod("master", 0, phase_, attempt=attempt, size=workers + 1),
            *(pod("worker", i, phase_, attempt=attempt, size=workers + 1) for i in range(workers))]


def run(j: PyTorchJob, pods: list[Pod], **kw: Any) -> Any:
    return decide(Observed(job=j, pods=pods, nodes=kw.pop("nodes", [node()]), settings=SETTINGS, **kw), NOW)


def condition(actions: Any, type_: str) -> dict[str, Any] | None:
    return next((c for c in actions.status["conditions"] if c["type"] == type_), None)


def event_reasons(actions: Any) -> list[str]:
    return [e.reason for e in actions.events]


# -- the table ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TRANSITIONS))
def test_every_transition_leads_to_the_phase_it_names(name: str):
    t = TRANSITIONS[name]
    for source in t.sources:
        before = [] if source == NEW else conds(*dict.fromkeys(("Created", source)), reason="Before")
        after = [dict(c) for c in before]
        assert set_job_condition(after, t.condition, t.status, t.reason, "m", NOW.text)
        assert phase(after) == t.to, (name, source)


def test_finished_phases_have_no_way_out():
    assert all("Succeeded" not in t.sources and "Failed" not in t.sources for t in TRANSITIONS.values())
    assert {t.to for t in TRANSITIONS.values() if t.name.startswith(("Fail", "Exceed"))} == {"Failed"}
    assert TRANSITIONS["Resume"].sources == {"Suspended"} and ACTIVE == {"Created", "Running", "Restarting"}


# -- a sync, row by row -------------------------------------------------------------------


def test_a_new_job_is_created_with_its_service_pod_group_and_whole_gang():
    actions = run(job(), [])
    assert actions.reason == "CreateMissing"
    assert event_reasons(actions) == ["PyTorchJobCreated"]
    assert phase(actions.status["conditions"]) == "Created"
    kinds = [c.body["kind"] for c in actions.creates]
    assert kinds == ["Service", "PodGroup", "Pod", "Pod", "Pod"]  # the PodGroup before its members
    assert actions.creates[1].body["spec"] == {"minMember": 3}
    names = [c.body["metadata"]["name"] for c in actions.creates if c.expect]
    assert names == ["train-master-0", "train-worker-0", "train-worker-1"]
    env = {e["name"]: e.get("value") for e in actions.creates[3].body["spec"]["containers"][0]["env"]}
    assert (env["WORLD_SIZE"], env["RANK"], env["MASTER_ADDR"]) == ("3", "1", "127.0.0.1")
    assert env["GPUFLEET_CHECKPOINT_DIR"] == "/ckpt/ml/train-01234567"
    assert not actions.deletes and not actions.patches


def test_the_gang_running_whole_is_the_running_phase_once():
    actions = run(job(conditions=conds("Created")), gang())
    assert (actions.reason, phase(actions.status["conditions"])) == ("InPlace", "Running")
    assert event_reasons(actions) == ["PyTorchJobRunning"]
    again = run(job(status=actions.status), gang())
    assert again.events == [] and again.status is None  # nothing changed, nothing written


def test_a_failed_member_restarts_the_whole_gang_from_its_checkpoint_after_a_back_off():
    pods = [*gang()[:2], pod("worker", 1, "Failed", exit_code=137)]
    actions = run(job(conditions=conds("Created", "Running"), restarts=2), pods)
    assert actions.reason == "Restart"
    restarting = condition(actions, "Restarting")
    assert restarting["status"] == "True" and "pod train-worker-1 failed on node n1 (exit code 137)" in \
        restarting["message"]
    assert condition(actions, "Running")["status"] == "False"
    (patch,) = actions.patches
    assert patch.owner and patch.patch == {"metadata": {"annotations": {
        "gpufleet.io/gang-attempt": "1", "gpufleet.io/gang-restarts": "3"}}}
    assert sorted(d.name for d in actions.deletes if d.kind is Pod) == [
        "train-master-0", "train-worker-0", "train-worker-1"]
    assert not any(c.expect for c in actions.creates)  # the new gang waits for the old one to go
    assert actions.requeue_after == 4.0 and actions.memo["not_before"] == NOW.monotonic + 4.0

    # The old gang gone and the back-off over: the next gang, same checkpoint directory.
    later = Instant(T0 + 5, rfc3339(T0 + 5), NOW.monotonic + 5)
    obs = Observed(job=job(attempt=1, restarts=3, conditions=actions.status["conditions"]), pods=[],
                   nodes=[node()], memory=Memory(not_before=actions.memo["not_before"]), settings=SETTINGS)
    nxt = decide(obs, later)
    bodies = [c.body for c in nxt.creates if c.expect]
    assert len(bodies) == 3
    assert {b["metadata"]["annotations"]["gpufleet.io/gang-attempt"] for b in bodies} == {"1"}
    assert {b["metadata"]["annotations"]["gpufleet.io/checkpoint-dir"] for b in bodies} == {
        "/ckpt/ml/train-01234567"}
    # Before the back-off is over nothing is created.
    early = decide(obs, Instant(T0 + 1, rfc3339(T0 + 1), NOW.monotonic + 1))
    assert early.reason == "RestartBackoff" and not any(c.expect for c in early.creates)


def test_an_earlier_gang_still_leaving_holds_the_next_one():
    actions = run(job(attempt=1, conditions=conds("Created", "Restarting")), gang(attempt=0))
    assert actions.reason == "EarlierGangLeaving" and actions.requeue_after == 1.0
    assert len(actions.deletes) == 3 and not any(c.expect for c in actions.creates)


def test_a_lost_member_of_this_attempt_is_a_restart():
    created = Memory(created=(0, frozenset({("Master", 0), ("Worker", 0), ("Worker", 1)})))
    actions = run(job(conditions=conds("Created", "Running")), gang()[:2], memory=created)
    assert actions.reason == "Restart"
    assert "pod train-worker-1 was lost" in condition(actions, "Restarting")["message"]


def test_a_gang_lost_whole_is_a_restart_not_a_fresh_start():
    # Every member on one node that died: the node lifecycle deletes them at once, so no
    # member is left running to compare with; they were created, so they were lost.
    created = Memory(created=(0, frozenset({("Master", 0), ("Worker", 0), ("Worker", 1)})))
    actions = run(job(conditions=conds("Created", "Running")), [], memory=created)
    assert actions.reason == "Restart"
    assert "pod train-master-0 was lost" in condition(actions, "Restarting")["message"]
    assert not [c for c in actions.creates if c.body.get("kind") == "Pod"]


def test_restart_policy_never_fails_the_job_and_keeps_the_failed_pod():
    pods = [*gang()[:2], pod("worker", 1, "Failed", exit_code=1)]
    actions = run(job(conditions=conds("Created", "Running"), restart="Never"), pods)
    assert actions.reason == "Failed"
    failed = condition(actions, "Failed")
    assert failed["reason"] == "PyTorchJobFailed" and "restartPolicy is Never" in failed["message"]
    assert sorted(d.name for d in actions.deletes) == ["train-master-0", "train-worker-0"]
    assert actions.status["completionTime"] == NOW.text


def test_the_backoff_limit_ends_the_restarts():
    pods = [*gang()[:2], pod("worker", 1, "Failed", exit_code=137)]
    actions = run(job(conditions=conds("Created", "Running"), restarts=2,
                      run_policy={"backoffLimit": 2}), pods)
    assert actions.reason == "BackoffLimitExceeded"
    assert condition(actions, "Failed")["reason"] == "BackoffLimitExceeded"
    assert not actions.patches


def test_the_leader_succeeding_is_success_and_clean_pod_policy_all_deletes_the_rest():
    pods = [pod("master", 0, "Succeeded"), pod("worker", 0), pod("worker", 1, "Succeeded")]
    actions = run(job(conditions=conds("Created", "Running"), run_policy={"cleanPodPolicy": "All",
                                                                          "ttlSecondsAfterFinished": 60}), pods)
    assert actions.reason == "Succeeded" and phase(actions.status["conditions"]) == "Succeeded"
    assert event_reasons(actions) == ["PyTorchJobSucceeded"]
    assert len([d for d in actions.deletes if d.kind is Pod]) == 3
    assert actions.requeue_after == pytest.approx(60.001)  # then the TTL deletes the job


def test_a_finished_job_past_its_ttl_is_deleted():
    finished = conds("Created", "Succeeded")
    actions = run(job(conditions=finished, run_policy={"ttlSecondsAfterFinished": 5}), [])
    (delete,) = actions.deletes
    assert (delete.kind, delete.name, delete.propagation_policy) == ("kubeflow.org/v1/PyTorchJob", "train",
                                                                     "Foreground")


def test_suspend_deletes_the_gang_and_resume_creates_it_again():
    actions = run(job(conditions=conds("Created", "Running"), run_policy={"suspend": True}), gang())
    assert actions.reason == "Suspended" and phase(actions.status["conditions"]) == "Suspended"
    assert condition(actions, "Running")["status"] == "False" and "startTime" not in actions.status
    assert len(actions.deletes) == 3
    resumed = run(job(conditions=actions.status["conditions"]), [])
    assert "PyTorchJobResumed" in event_reasons(resumed) and phase(resumed.status["conditions"]) == "Created"
    assert len([c for c in resumed.creates if c.expect]) == 3


def test_the_active_deadline_fails_the_job():
    actions = run(job(conditions=conds("Created", "Running"), run_policy={"activeDeadlineSeconds": 5}), gang())
    assert actions.reason == "DeadlineExceeded" and condition(actions, "Failed")["reason"] == "DeadlineExceeded"


def test_a_non_elastic_resize_re_forms_the_gang_at_the_new_size():
    actions = run(job(workers=3, conditions=conds("Created", "Running")), gang(workers=2))
    assert actions.reason == "Resize"
    assert condition(actions, "Restarting")["reason"] == "PyTorchJobResizing"
    assert "with 4 members (was 3)" in condition(actions, "Restarting")["message"]
    (patch,) = actions.patches
    assert patch.patch["metadata"]["annotations"] == {"gpufleet.io/gang-attempt": "1"}  # not a failure


# -- elastic ------------------------------------------------------------------------------


def elastic_job(workers: int) -> PyTorchJob:
    return job(workers=workers, master=False, elastic=(1, 3), gpus=1, conditions=conds("Created", "Running"))


def elastic_gang(workers: int) -> list[Pod]:
    return [pod("worker", i, gpus=1, size=workers) for i in range(workers)]


def test_elastic_grow_when_a_node_has_a_workers_gpus_free():
    pods = elastic_gang(2)
    actions = run(elastic_job(2), pods, cluster_pods=pods, nodes=[node("n1", gpus=4)])
    assert actions.reason == "ElasticGrow"
    (patch,) = actions.patches
    assert patch.patch["spec"] == {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}}
    assert "node n1 has 2 idle GPUs" in actions.events[-1].message
    assert actions.memo["last_resize"] == NOW.monotonic


def test_elastic_shrink_when_a_pod_of_higher_priority_waits_and_fits_nowhere():
    pods = elastic_gang(2)
    waiting = pod("x", 0, "Pending", node=None, gpus=1, priority=100, owner=False)
    actions = run(elastic_job(2), pods, cluster_pods=[*pods, waiting], nodes=[node("n1", gpus=2)])
    assert actions.reason == "ElasticShrink"
    assert actions.patches[0].patch["spec"] == {"pytorchReplicaSpecs": {"Worker": {"replicas": 1}}}
    assert "pod ml/other-0 of higher priority waits for GPUs" in actions.events[-1].message


def test_no_resize_within_the_interval_nor_past_the_bounds():
    pods = elastic_gang(2)
    recent = Memory(last_resize=NOW.monotonic - 10)
    assert run(elastic_job(2), pods, cluster_pods=pods, nodes=[node("n1", gpus=4)], memory=recent).patches == []
    full = elastic_gang(3)
    assert run(elastic_job(3), full, cluster_pods=full, nodes=[node("n1", gpus=8)]).patches == []


def test_an_elastic_job_adds_workers_in_place_without_a_restart():
    pods = elastic_gang(2)
    j = job(workers=3, master=False, elastic=(1, 3), gpus=1, conditions=conds("Created", "Running"),
            annotations={"gpufleet.io/elastic-autoscale": "false"})
    actions = run(j, pods)
    assert actions.reason == "CreateMissing" and not actions.patches and not actions.deletes
    assert [c.body["metadata"]["name"] for c in actions.creates if c.expect] == ["train-worker-2"]


# -- work moves off failed hardware --------------------------------------------------------


def broken(p: Pod, reason: str = "GPUUnhealthy") -> Pod:
    """The pod as the node agent leaves it when its GPU fails: Failed, with DisruptionTarget."""
    body = p.to_dict()
    message = "GPU 1 (GPU-1b) on node n1 failed: XID 79 (GPU has fallen off the bus)"
    body["status"].update(phase="Failed", reason=reason, message=message, conditions=[
        {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}])
    return Pod.from_dict(body)


def test_a_member_failed_by_its_gpu_restarts_the_gang_without_spending_the_backoff_limit():
    pods = [*gang()[:2], broken(pod("worker", 1, exit_code=137))]
    for restart in ("OnFailure", "Never"):  # neither the limit nor restartPolicy applies
        actions = run(job(conditions=conds("Created", "Running"), restart=restart,
                          run_policy={"backoffLimit": 0}), pods)
        assert actions.reason == "MoveOffHardware"
        restarting = condition(actions, "Restarting")
        assert restarting["status"] == "True" and restarting["reason"] == "GPUUnhealthy"
        assert "pod train-worker-1 on node n1 failed with its hardware" in restarting["message"]
        assert "XID 79" in restarting["message"]
        (patch,) = actions.patches
        assert patch.patch == {"metadata": {"annotations": {
            "gpufleet.io/gang-attempt": "1", "gpufleet.io/hardware-restarts": "1"}}}  # gang-restarts untouched
        assert sorted(d.name for d in actions.deletes if d.kind is Pod) == [
            "train-master-0", "train-worker-0", "train-worker-1"]
        assert [(e.type, e.reason) for e in actions.events] == [("Warning", "GPUUnhealthy")]
        assert actions.requeue_after == 0.05 and actions.memo["not_before"] == NOW.monotonic  # no back-off


def test_a_peer_crashing_on_the_broken_collective_is_not_the_jobs_failure_either():
    pods = [pod("master", 0), pod("worker", 0, "Failed", exit_code=1), broken(pod("worker", 1))]
    actions = run(job(conditions=conds("Created", "Running"), run_policy={"backoffLimit": 0}), pods)
    assert actions.reason == "MoveOffHardware"


def test_a_preempted_member_is_an_ordinary_restart():
    pods = [*gang()[:2], broken(pod("worker", 1, exit_code=137), reason="PreemptionByScheduler")]
    actions = run(job(conditions=conds("Created", "Running"), restarts=1), pods)
    assert actions.reason == "Restart"
    assert actions.patches[0].patch["metadata"]["annotations"]["gpufleet.io/gang-restarts"] == "2"


def elastic_with_restarts(max_restarts: int | None, **kw: Any) -> PyTorchJob:
    j = job(workers=3, master=False, elastic=(1, 3), gpus=1, **kw)
    body = j.to_dict()
    if max_restarts is not None:
        body["spec"]["elasticPolicy"]["maxRestarts"] = max_restarts
    return PyTorchJob.from_dict(body)


def test_an_elastic_member_failed_by_its_gpu_is_replaced_alone():
    j = elastic_with_restarts(3, conditions=conds("Created", "Running"),
                              annotations={"gpufleet.io/elastic-autoscale": "false",
                                           "gpufleet.io/hardware-restarts": "2"})
    pods = [*elastic_gang(3)[:2], broken(pod("worker", 2, gpus=1, size=3))]
    actions = run(j, pods)
    assert actions.reason == "ReplaceMember"
    assert [d.name for d in actions.deletes] == ["train-worker-2"]  # the others keep running
    (patch,) = actions.patches
    assert patch.patch == {"metadata": {"annotations": {"gpufleet.io/hardware-restarts": "3"}}}  # same attempt
    assert condition(actions, "Restarting")["reason"] == "GPUUnhealthy"
    assert not any(c.expect for c in actions.creates)  # its name is free once it is gone
    # Once it is gone: the same member again, in the same attempt, under the running group.
    j2 = elastic_with_restarts(3, conditions=actions.status["conditions"],
                               annotations={"gpufleet.io/elastic-autoscale": "false",
                                            "gpufleet.io/hardware-restarts": "3"})
    nxt = run(j2, pods[:2], memory=Memory(created=(0, frozenset({("Worker", 0), ("Worker", 1), ("Worker", 2)}))))
    assert nxt.reason == "CreateMissing" and not nxt.deletes
    (body,) = [c.body for c in nxt.creates if c.expect]
    assert body["metadata"]["name"] == "train-worker-2"
    assert body["metadata"]["annotations"]["gpufleet.io/gang-attempt"] == "0"


def test_an_elastic_jobs_rendezvous_host_failed_by_its_gpu_restarts_the_gang():
    j = elastic_with_restarts(3, conditions=conds("Created", "Running"),
                              annotations={"gpufleet.io/elastic-autoscale": "false"})
    pods = [broken(pod("worker", 0, gpus=1, size=3)), *elastic_gang(3)[1:]]
    actions = run(j, pods)
    assert actions.reason == "MoveOffHardware" and len(actions.deletes) == 3


@pytest.mark.parametrize("max_restarts", [None, 0])
def test_an_elastic_member_is_not_replaced_alone_when_torchrun_has_no_restarts(max_restarts: int | None):
    # The survivors' torchrun would exit on the lost peer: the gang restarts instead.
    j = elastic_with_restarts(max_restarts, conditions=conds("Created", "Running"),
                              annotations={"gpufleet.io/elastic-autoscale": "false"})
    pods = [*elastic_gang(3)[:2], broken(pod("worker", 2, gpus=1, size=3))]
    actions = run(j, pods)
    assert actions.reason == "MoveOffHardware" and len(actions.deletes) == 3
    assert actions.patches[0].patch["metadata"]["annotations"]["gpufleet.io/gang-attempt"] == "1"
