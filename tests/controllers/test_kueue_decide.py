"""A queued job's sync as a plain decision: the job, its Workload, its live pods and the
flavors in; the job's update and Event, the Workload to create, or the Workload's new
status out, one row of the table in gpufleet/controllers/kueue/jobs.py each."""

from __future__ import annotations

from typing import Any

from gpufleet.api import kueue as kq
from gpufleet.controllers.kueue import BATCH_JOB, JOB_UID_LABEL
from gpufleet.controllers.kueue.jobs import JobObserved, decide_job

NOW = "2026-01-01T00:00:00Z"


def job(*, suspend: bool = True, conditions: list[dict[str, Any]] | None = None,
        node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    body = {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "team", "uid": "u1",
                         "labels": {kq.QUEUE_NAME_LABEL: "lq"}},
            "spec": {"parallelism": 2, "suspend": suspend, "template": {"spec": spec}}}
    if conditions:
        body["status"] = {"conditions": conditions}
    return body


def workload(*conditions: tuple[str, str], admitted: bool = False) -> kq.Workload:
    status: dict[str, Any] = {"conditions": [
        {"type": t, "status": s, "reason": "R", "message": "evicted to make room" if t == kq.EVICTED else "m",
         "lastTransitionTime": "2025-12-31T00:00:00Z"} for t, s in conditions]}
    if admitted:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "main", "flavors": {"nvidia.com/gpu": "h100"}, "count": 2}]}
    return kq.Workload.model_validate({
        "apiVersion": kq.API_VERSION, "kind": "Workload",
        "metadata": {"name": "job-train-abcde", "namespace": "team"},
        "spec": {"queueName": "lq", "podSets": [
            {"name": "main", "count": 2, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}]},
        "status": status})


def flavor() -> kq.ResourceFlavor:
    return kq.ResourceFlavor.model_validate({
        "apiVersion": kq.API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": "h100"},
        "spec": {"nodeLabels": {"gpu": "h100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]}})


def observe(j: dict[str, Any], wl: kq.Workload | None = None, **kw: Any) -> JobObserved:
    return JobObserved(kind=BATCH_JOB, job=j, queue="lq", workload=wl, **kw)


def test_a_running_job_without_a_workload_is_suspended_and_gets_one():
    d = decide_job(observe(job(suspend=False), priority=(100, "high")), NOW)
    (update,) = d.job.updates
    assert update.body["spec"]["suspend"] is True
    assert (update.event.reason, update.event.message) == ("Stopped", "waiting for its queue to admit it")
    (create,) = d.job.creates
    body = create.body
    assert body["kind"] == "Workload" and body["metadata"]["labels"] == {JOB_UID_LABEL: "u1"}
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert body["spec"]["podSets"][0]["count"] == 2
    assert (body["spec"]["priority"], body["spec"]["priorityClassName"]) == (100, "high")
    assert create.on_exists == "ignore" and d.workload.status is None


def test_a_finished_job_without_a_workload_is_left_alone():
    d = decide_job(observe(job(conditions=[{"type": "Complete", "status": "True"}])), NOW)
    assert d.job.empty and d.workload.status is None and d.reason == "finished-unqueued"


def test_a_finished_job_marks_its_workload_finished_once():
    done = job(conditions=[{"type": "Failed", "status": "True"}])
    d = decide_job(observe(done, workload((kq.QUOTA_RESERVED, "True"), admitted=True)), NOW)
    finished = [c for c in d.workload.status["conditions"] if c["type"] == kq.FINISHED]
    assert [(c["status"], c["reason"], c["message"]) for c in finished] == [("True", "Failed", "Job finished: Failed")]
    wl = kq.Workload.model_validate({**workload().to_dict(), "status": d.workload.status})
    assert decide_job(observe(done, wl), NOW).workload.status is None


def test_an_admitted_workload_starts_the_job_on_its_flavor():
    d = decide_job(observe(job(), workload((kq.QUOTA_RESERVED, "True"), admitted=True),
                           flavors={"h100": flavor()}), NOW)
    (update,) = d.job.updates
    spec = update.body["spec"]
    assert spec["suspend"] is False
    assert spec["template"]["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert spec["template"]["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert (update.event.reason, update.event.message) == ("Started", "Admitted by clusterQueue cq")


def test_the_decision_leaves_the_observed_job_untouched():
    observed = job()
    decide_job(observe(observed, workload((kq.QUOTA_RESERVED, "True"), admitted=True),
                       flavors={"h100": flavor()}), NOW)
    assert observed["spec"]["suspend"] is True and "nodeSelector" not in observed["spec"]["template"]["spec"]


def test_an_evicted_running_job_is_suspended_with_the_eviction_message():
    wl = workload((kq.QUOTA_RESERVED, "True"), (kq.EVICTED, "True"), admitted=True)
    d = decide_job(observe(job(suspend=False), wl), NOW)
    (update,) = d.job.updates
    assert update.body["spec"]["suspend"] is True and update.event.message == "evicted to make room"


def test_an_evicted_job_keeps_its_quota_while_its_pods_run():
    wl = workload((kq.QUOTA_RESERVED, "True"), (kq.EVICTED, "True"), admitted=True)
    d = decide_job(observe(job(node_selector={"gpu": "h100"}), wl, live_pods=1), NOW)
    assert d.job.empty and d.workload.status is None and d.reason == "evicted-pods-left"


def test_an_evicted_job_without_pods_is_put_back_and_releases_its_quota():
    wl = workload((kq.QUOTA_RESERVED, "True"), (kq.EVICTED, "True"), admitted=True)
    d = decide_job(observe(job(node_selector={"gpu": "h100"}), wl), NOW)
    (update,) = d.job.updates
    assert "nodeSelector" not in update.body["spec"]["template"]["spec"]
    status = d.workload.status
    assert "admission" not in status
    by_type = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert by_type[kq.QUOTA_RESERVED] == ("False", "Pending")
    assert by_type[kq.ADMITTED] == ("False", "NoReservation")


def test_a_pending_suspended_job_waits():
    d = decide_job(observe(job(), workload((kq.QUOTA_RESERVED, "False"))), NOW)
    assert d.job.empty and d.workload.status is None and d.reason == "waiting"
