"""The Volcano Job and Queue decisions without a control plane: the phase machine, the
lifecycle policies, and Queue admission (capability, state, weight)."""

from __future__ import annotations

from typing import Any

from gpufleet.api import k8s
from gpufleet.api import volcano as vc
from gpufleet.api.defaults import apply_defaults
from gpufleet.api.validation import validate_create
from gpufleet.controllers.actions import Instant
from gpufleet.controllers.volcano import Memory, Observed, decide, decide_queues

NOW = Instant(1_800_000_000.0, "2027-01-15T08:00:00Z", 100.0)


def job(policies: list[dict[str, Any]] | None = None, status: dict[str, Any] | None = None,
        master_policies: list[dict[str, Any]] | None = None, **spec: Any) -> vc.VolcanoJob:
    def task(name: str, replicas: int, policies: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"name": name, "replicas": replicas, "policies": policies,
                "template": {"spec": {"restartPolicy": "Never", "containers": [
                    {"name": name, "image": "train:v1", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}

    body = {"apiVersion": vc.BATCH_API_VERSION, "kind": "Job",
            "metadata": {"name": "mnist", "namespace": "default", "uid": "u1"},
            "spec": {"minAvailable": 3, "queue": "research", "policies": policies,
                     "tasks": [task("master", 1, master_policies), task("worker", 2)], **spec},
            "status": status}
    j = vc.VolcanoJob.model_validate(body)
    apply_defaults(j)
    return j


def pod(name: str, task: str, index: int, phase: str = "Running", version: int = 0, code: int | None = None,
        node: str = "n1") -> k8s.Pod:
    status: dict[str, Any] = {"phase": phase}
    if code is not None:
        status["containerStatuses"] = [{"name": task, "image": "x", "imageID": "", "ready": False,
                                        "restartCount": 0, "state": {"terminated": {"exitCode": code}}}]
    return k8s.Pod.model_validate({
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                     "labels": {"volcano.sh/task-spec": task, "volcano.sh/task-index": str(index)},
                     "annotations": {"volcano.sh/task-spec": task, "volcano.sh/job-version": str(version)}},
        "spec": {"nodeName": node, "containers": [{"name": task, "image": "x"}]},
        "status": status})


def podgroup(phase: str | None, queue: str = "research", gpus: str = "3", name: str = "mnist-u1",
             created: str = "2027-01-15T07:00:00Z") -> vc.VolcanoPodGroup:
    return vc.VolcanoPodGroup.model_validate({
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
        "spec": {"minMember": 3, "queue": queue, "minResources": {"nvidia.com/gpu": gpus}},
        "status": {"phase": phase} if phase else None})


def queue(name: str, gpus: str | None = None, state: str | None = None, weight: int = 1) -> vc.Queue:
    return vc.Queue.model_validate({
        "metadata": {"name": name},
        "spec": {"weight": weight, **({"capability": {"nvidia.com/gpu": gpus}} if gpus else {})},
        "status": {"state": state} if state else None})


RUNNING = {"state": {"phase": "Running"}, "version": 0, "retryCount": 0}
ALL_RUNNING = [pod("mnist-master-0", "master", 0), pod("mnist-worker-0", "worker", 0),
               pod("mnist-worker-1", "worker", 1)]


def test_defaults_and_errors_name_the_field() -> None:
    j = job()
    assert (j.spec.scheduler_name, j.spec.max_retry, j.spec.tasks[0].min_available) == ("volcano", 3, 1)
    bad = job(policies=[{"event": "PodExploded", "action": "RestartJob"}], minAvailable=4)
    messages = [str(e) for e in validate_create(bad)]
    assert any("spec.policies[0].event" in m and "PodExploded" in m for m in messages)
    assert any("spec.minAvailable" in m and "total replicas of the tasks (3)" in m for m in messages)


def test_no_pod_is_made_before_the_queue_admits_the_podgroup() -> None:
    a = decide(Observed(job(), [], podgroup("Pending")), NOW)
    assert a.reason == "PodGroupPending"
    assert not [c for c in a.creates if c.body["kind"] == "Pod"]
    assert a.status["state"]["phase"] == "Pending"
    a = decide(Observed(job(status={"state": {"phase": "Pending"}}), [], podgroup("Inqueue")), NOW)
    names = sorted(c.body["metadata"]["name"] for c in a.creates if c.body["kind"] == "Pod")
    assert names == ["mnist-master-0", "mnist-worker-0", "mnist-worker-1"]
    pg = next(c.body for c in a.creates if c.body["kind"] == "PodGroup")
    assert pg["metadata"]["name"] == "mnist-u1"
    assert pg["spec"] == {"minMember": 3, "minTaskMember": {"master": 1, "worker": 2}, "queue": "research",
                          "minResources": {"nvidia.com/gpu": "3"}}


def test_pending_becomes_running_once_min_available_pods_run() -> None:
    a = decide(Observed(job(status={"state": {"phase": "Pending"}}), ALL_RUNNING, podgroup("Running")), NOW)
    assert a.status["state"]["phase"] == "Running" and a.status["running"] == 3


def test_pod_failed_restarts_the_job_and_counts_a_retry() -> None:
    pods = [*ALL_RUNNING[:2], pod("mnist-worker-1", "worker", 1, "Failed", code=1)]
    j = job(policies=[{"event": "PodFailed", "action": "RestartJob"}], status=RUNNING)
    a = decide(Observed(j, pods, podgroup("Running")), NOW)
    assert a.reason == "RestartJob"
    assert a.status["state"]["phase"] == "Restarting" and a.status["retryCount"] == 1 and a.status["version"] == 1
    assert sorted(d.name for d in a.deletes) == ["mnist-master-0", "mnist-worker-0", "mnist-worker-1"]
    # At maxRetry the restart ends the job Failed instead.
    j = job(status={"state": {"phase": "Restarting"}, "retryCount": 3, "version": 3})
    a = decide(Observed(j, [], podgroup("Pending")), NOW)
    assert a.status["state"]["phase"] == "Failed" and a.status["state"]["reason"] == "MaxRetryExceeded"
    # Below it, once the old pods are gone, the job queues again.
    j = job(status={"state": {"phase": "Restarting"}, "retryCount": 1, "version": 1})
    assert decide(Observed(j, [], podgroup("Pending")), NOW).status["state"]["phase"] == "Pending"


def test_abort_keeps_ended_pods_and_exit_codes_and_task_policies_match() -> None:
    pods = [*ALL_RUNNING[:2], pod("mnist-worker-1", "worker", 1, "Failed", code=137)]
    j = job(policies=[{"exitCode": 137, "action": "AbortJob"}], status=RUNNING)
    a = decide(Observed(j, pods, podgroup("Running")), NOW)
    assert a.status["state"]["phase"] == "Aborting"
    assert sorted(d.name for d in a.deletes) == ["mnist-master-0", "mnist-worker-0"]
    done = [pod("mnist-master-0", "master", 0, "Succeeded"), *ALL_RUNNING[1:]]
    j = job(master_policies=[{"event": "TaskCompleted", "action": "CompleteJob"}], status=RUNNING)
    a = decide(Observed(j, done, podgroup("Running")), NOW)
    assert a.status["state"]["phase"] == "Completing"
    assert sorted(d.name for d in a.deletes) == ["mnist-worker-0", "mnist-worker-1"]


def test_without_a_policy_a_failed_pod_only_counts_and_the_end_decides() -> None:
    pods = [pod("mnist-master-0", "master", 0, "Succeeded"), pod("mnist-worker-0", "worker", 0, "Succeeded"),
            pod("mnist-worker-1", "worker", 1, "Failed", code=1)]
    a = decide(Observed(job(status=RUNNING), pods, podgroup("Running")), NOW)
    assert a.status["state"]["phase"] == "Failed"  # 2 succeeded < minAvailable 3
    a = decide(Observed(job(status=RUNNING, minAvailable=2), pods, podgroup("Running")), NOW)
    assert a.status["state"]["phase"] == "Completed"


def test_an_evicted_pod_is_one_the_controller_created_that_is_gone() -> None:
    j = job(policies=[{"event": "PodEvicted", "action": "RestartJob"}], status=RUNNING)
    memory = Memory(created=(0, frozenset({"mnist-master-0", "mnist-worker-0", "mnist-worker-1"})))
    a = decide(Observed(j, ALL_RUNNING[:2], podgroup("Running"), memory=memory), NOW)
    assert a.reason == "RestartJob" and "PodEvicted" in a.events[0].message


def _phases(actions: Any) -> dict[str, str]:
    return {p.name: p.patch["status"]["phase"] for p in actions.patches if p.kind is vc.VolcanoPodGroup}


def test_queue_capability_admits_what_fits_and_says_why_not() -> None:
    groups = [podgroup("Running", name="a"), podgroup(None, name="b"), podgroup(None, gpus="1", name="c",
                                                                                 queue="default")]
    a = decide_queues([queue("research", gpus="4")], groups, {}, NOW.text)
    phases = _phases(a)
    assert phases.get("b") is None or phases["b"] == "Pending"  # 3 held + 3 > 4
    assert phases["c"] == "Inqueue"  # the default queue needs no object and has no capability
    patch = next(p.patch for p in a.patches if p.name == "b")
    assert "capability nvidia.com/gpu 4, 3 held, the group needs 3" in patch["status"]["conditions"][0]["message"]
    q = next(p.patch["status"] for p in a.patches if p.kind is vc.Queue)
    # "a" is Running by its phase but has no member placed: it goes back to Pending and queues again.
    assert q["state"] == "Open"


def test_closed_or_missing_queues_admit_nothing_and_weight_orders_the_rest() -> None:
    groups = [podgroup(None, name="x", queue="shut"), podgroup(None, name="y", queue="nowhere")]
    a = decide_queues([queue("shut", state="Closed")], groups, {}, NOW.text)
    messages = {p.name: p.patch["status"]["conditions"][0]["message"] for p in a.patches
                if p.kind is vc.VolcanoPodGroup}
    assert messages == {"x": "queue shut is Closed: it admits no PodGroup",
                        "y": "queue nowhere not found; create it or set spec.queue"}
    # Two queues share 3 GPUs' worth of capability each; the one holding less per weight goes first.
    running = [pod(f"r{i}", "worker", i) for i in range(3)]
    groups = [podgroup("Running", name="held", queue="light", gpus="2"),
              podgroup(None, name="light-next", queue="light", gpus="1", created="2027-01-15T06:00:00Z"),
              podgroup(None, name="heavy-next", queue="heavy", gpus="1", created="2027-01-15T07:30:00Z")]
    queues = [queue("light", gpus="2", weight=1), queue("heavy", gpus="3", weight=4)]
    a = decide_queues(queues, groups, {"default/held": running}, NOW.text)
    phases = _phases(a)
    assert phases["heavy-next"] == "Inqueue"
    assert "light-next" not in phases or phases["light-next"] == "Pending"  # light is at its capability


def test_an_ended_group_stays_completed_while_its_pods_go_and_holds_nothing() -> None:
    going = pod("w", "worker", 0)
    going = going.model_copy(update={"metadata": going.metadata.model_copy(
        update={"deletion_timestamp": "2027-01-15T08:00:00Z"})})
    groups = [podgroup("Completed", name="done"), podgroup(None, name="next")]
    a = decide_queues([queue("research", gpus="3")], groups, {"default/done": [going]}, NOW.text)
    phases = _phases(a)
    assert phases.get("done", "Completed") == "Completed"  # not reopened by the pod on its way out
    assert phases["next"] == "Inqueue"  # and the capability it held is free
