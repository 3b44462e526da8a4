"""A Job's sync as plain decisions: a Job and its pods in; Actions out. No API server, no
informers, no clock."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.api.k8s import Job, Pod
from gpufleet.controllers.actions import Instant
from gpufleet.controllers.job import (
    TRACKING_FINALIZER,
    TRANSITIONS,
    Backoff,
    Observed,
    Settings,
    begin,
    decide_expire,
    decide_finish,
    decide_pods,
    decide_tracking,
    state,
)
from gpufleet.controllers.job.decide import ACTIVE, COMPLETE, FAILED, fire
from gpufleet.controllers.job.model import ensure_condition
from gpufleet.utils.clock import rfc3339

T0 = 1_700_000_000.0
NOW = Instant(T0, rfc3339(T0), 10.0)


def job(*, completions: int | None = 3, parallelism: int = 2, backoff_limit: int | None = None,
        indexed: bool = False, suspend: bool = False, deadline: int | None = None, ttl: int | None = None,
        status: dict | None = None, restart: str = "Never") -> Job:
    spec: dict[str, Any] = {"parallelism": parallelism, "suspend": suspend,
                            "template": {"spec": {"restartPolicy": restart,
                                                  "containers": [{"name": "c", "image": "i"}]}}}
    if completions is not None:
        spec["completions"] = completions
    if backoff_limit is not None:
        spec["backoffLimit"] = backoff_limit
    if indexed:
        spec["completionMode"] = "Indexed"
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    body: dict[str, Any] = {"apiVersion": "batch/v1", "kind": "Job",
                            "metadata": {"name": "work", "namespace": "default", "uid": "job-uid",
                                         "resourceVersion": "5"}, "spec": spec}
    if status is not None:
        body["status"] = status
    return Job.from_dict(body)


def pod(name: str, phase: str = "Running", *, index: int | None = None, finalizer: bool = True,
        restarts: int = 0) -> Pod:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if finalizer:
        meta["finalizers"] = [TRACKING_FINALIZER]
    if index is not None:
        meta["annotations"] = {"batch.kubernetes.io/job-completion-index": str(index)}
    status: dict[str, Any] = {"phase": phase}
    if restarts:
        status["containerStatuses"] = [{"name": "c", "image": "i", "imageID": "", "ready": False,
                                        "restartCount": restarts, "state": {"running": {}}}]
    return Pod.from_dict({"metadata": meta, "spec": {"containers": [{"name": "c", "image": "i"}]},
                          "status": status})


def run(j: Job, pods: list[Pod], *, released: set[str] | None = None, **kw: Any) -> tuple[Any, ...]:
    """One sync, as the controller applies it, with every create and delete succeeding and
    every finalizer removal too (unless ``released`` says which)."""
    sync = begin(Observed(j, pods, settings=kw.pop("settings", Settings(0.0, 0.0)), **kw), NOW)
    pods_actions = decide_pods(sync, NOW)
    active = sync.active + len(pods_actions.creates) - len(pods_actions.deletes)
    tracking = decide_tracking(sync, active, NOW)
    done = {p.metadata.uid for p in sync.to_release} if released is None else released
    finish = decide_finish(sync, j, done, NOW)
    return sync, pods_actions, tracking, finish


def cond(status: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in (status or {}).get("conditions", []) if c["type"] == type_), None)


# -- the table ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TRANSITIONS))
def test_every_transition_leads_to_the_state_it_names(name: str):
    t = TRANSITIONS[name]
    for source in t.sources:
        before: list[dict[str, Any]] = []
        if source != ACTIVE:
            ensure_condition(before, source, "True", "Before", "before", NOW.text)
        after = [dict(c) for c in before]
        assert fire(name, after, NOW.text), (name, source)
        assert state(after) == t.to, (name, source)


def test_finished_states_have_no_way_out_and_failed_repeats_its_target():
    assert all(COMPLETE not in t.sources and FAILED not in t.sources for t in TRANSITIONS.values())
    conds: list[dict[str, Any]] = []
    fire("ExceedDeadline", conds, NOW.text)
    from gpufleet.controllers.actions import Actions

    actions = Actions()
    fire("Fail", conds, NOW.text, actions)
    assert cond({"conditions": conds}, "Failed")["reason"] == "DeadlineExceeded"
    assert [(e.type, e.reason, e.message) for e in actions.events] == [
        ("Warning", "DeadlineExceeded", "Job was active longer than specified deadline")]


# -- a sync, step by step -----------------------------------------------------------------


def test_a_new_job_starts_parallelism_pods_with_the_tracking_finalizer():
    sync, pods_actions, _, finish = run(job(completions=3, parallelism=2), [])
    assert pods_actions.reason == "ScaleUp" and len(pods_actions.creates) == 2
    body = pods_actions.creates[0].body
    assert body["metadata"]["finalizers"] == [TRACKING_FINALIZER]
    assert body["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == "job-uid"
    assert finish.status["active"] == 2 and finish.status["startTime"] == NOW.text


def test_an_indexed_job_creates_the_pending_indexes_only():
    j = job(completions=4, parallelism=4, indexed=True, status={"completedIndexes": "0", "succeeded": 1,
                                                                "startTime": NOW.text})
    _, pods_actions, _, _ = run(j, [pod("a", index=2)])
    assert [c.tag for c in pods_actions.creates] == [1, 3]
    env = pods_actions.creates[0].body["spec"]["containers"][0]["env"]
    assert env[0] == {"name": "JOB_COMPLETION_INDEX", "value": "1"}


def test_a_finished_pod_is_recorded_uncounted_before_its_finalizer_comes_off_then_counted():
    j = job(completions=3, parallelism=1, status={"startTime": NOW.text, "active": 1})
    done = pod("a", "Succeeded")
    sync, pods_actions, tracking, finish = run(j, [done])
    assert tracking.status["uncountedTerminatedPods"] == {"succeeded": ["uid-a"]}
    assert [p.metadata.name for p in sync.to_release] == ["a"]
    assert finish.status["succeeded"] == 1 and "uncountedTerminatedPods" not in finish.status
    assert len(pods_actions.creates) == 1  # the next of three


def test_a_finalizer_that_did_not_come_off_keeps_the_pod_uncounted():
    j = job(completions=1, parallelism=1, status={"startTime": NOW.text, "active": 1})
    _, _, _, finish = run(j, [pod("a", "Succeeded")], released=set())
    assert finish.status["uncountedTerminatedPods"] == {"succeeded": ["uid-a"]}
    assert cond(finish.status, "Complete") is None
    assert cond(finish.status, "SuccessCriteriaMet")["status"] == "True"


def test_enough_successes_complete_the_job_with_its_event():
    j = job(completions=2, parallelism=2, status={"startTime": NOW.text, "succeeded": 1})
    _, _, _, finish = run(j, [pod("b", "Succeeded")])
    assert finish.reason == "Complete"
    assert cond(finish.status, "Complete")["reason"] == "CompletionsReached"
    assert finish.status["completionTime"] == NOW.text
    assert [e.reason for e in finish.events] == ["Completed"]


def test_failures_past_the_backoff_limit_fail_the_job_and_delete_its_pods():
    j = job(completions=5, parallelism=2, backoff_limit=1, status={"startTime": NOW.text, "failed": 1})
    sync, pods_actions, _, finish = run(j, [pod("x", "Failed"), pod("y")])
    assert cond({"conditions": sync.conditions}, "FailureTarget")["reason"] == "BackoffLimitExceeded"
    assert pods_actions.reason == "Failing" and [d.name for d in pods_actions.deletes] == ["y"]
    # y's deletion has not shown yet: it still holds the finalizer, so Failed waits.
    assert cond(finish.status, "Failed") is None
    _, _, _, after = run(job(completions=5, parallelism=2, backoff_limit=1, status=finish.status), [])
    assert cond(after.status, "Failed")["reason"] == "BackoffLimitExceeded"
    assert [(e.type, e.reason) for e in after.events] == [("Warning", "BackoffLimitExceeded")]


def test_container_restarts_count_against_the_limit_with_restart_on_failure():
    j = job(backoff_limit=2, restart="OnFailure", status={"startTime": NOW.text})
    sync, *_ = run(j, [pod("a", restarts=2)])
    assert cond({"conditions": sync.conditions}, "FailureTarget")["reason"] == "BackoffLimitExceeded"


def test_the_deadline_fails_the_job_and_before_it_a_requeue_waits_for_it():
    started = rfc3339(T0 - 30)
    sync, *_ = run(job(deadline=20, status={"startTime": started}), [pod("a")])
    assert cond({"conditions": sync.conditions}, "FailureTarget")["reason"] == "DeadlineExceeded"
    _, _, _, finish = run(job(deadline=60, status={"startTime": started}), [pod("a"), pod("b")])
    assert finish.requeue_after == pytest.approx(30.001)


def test_replacing_a_failed_pod_waits_for_the_back_off():
    j = job(completions=3, parallelism=1, status={"startTime": NOW.text})
    sync, pods_actions, *_ = run(j, [pod("x", "Failed")], settings=Settings(2.0, 60.0),
                                 backoff=Backoff(1, T0 - 10))
    assert sync.backoff == Backoff(2, T0)
    assert pods_actions.reason == "BackingOff" and pods_actions.requeue_after == pytest.approx(4.001)


def test_suspending_deletes_the_pods_and_resuming_restarts_the_clock():
    _, pods_actions, _, finish = run(job(suspend=True, status={"startTime": rfc3339(T0 - 99)}), [pod("a")])
    assert [d.name for d in pods_actions.deletes] == ["a"]
    assert [e.reason for e in pods_actions.events] == ["Suspended"]
    assert state(finish.status["conditions"]) == "Suspended"
    _, resumed, _, after = run(job(status=finish.status), [])
    assert [e.reason for e in resumed.events] == ["Resumed"]
    assert after.status["startTime"] == NOW.text and len(resumed.creates) == 2


def test_nothing_is_created_while_the_cache_is_behind():
    _, pods_actions, *_ = run(job(), [], expectations_satisfied=False)
    assert pods_actions.reason == "WaitingForCache" and pods_actions.empty


def test_a_finished_job_expires_after_its_ttl():
    finished = {"conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": rfc3339(T0 - 5)}]}
    waiting = decide_expire(job(ttl=10, status=finished), NOW)
    assert waiting.deletes == [] and waiting.requeue_after == pytest.approx(5.001)
    (delete,) = decide_expire(job(ttl=3, status=finished), NOW).deletes
    assert (delete.name, delete.propagation_policy, delete.uid) == ("work", "Foreground", "job-uid")
    assert decide_expire(job(ttl=3), NOW).deletes == []


# -- podFailurePolicy ---------------------------------------------------------------------

IGNORE_DISRUPTIONS = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                                {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}


def with_policy(j: Job, policy: dict[str, Any]) -> Job:
    body = j.to_dict()
    body["spec"]["podFailurePolicy"] = policy
    return Job.from_dict(body)


def failed_pod(name: str, *, code: int = 137, disruption: str | None = None) -> Pod:
    body = pod(name, "Failed").to_dict()
    body["status"]["containerStatuses"] = [{"name": "c", "image": "i", "imageID": "", "ready": False,
                                            "restartCount": 0, "state": {"terminated": {"exitCode": code}}}]
    if disruption:
        body["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": disruption,
                                         "message": "GPU 1 (GPU-0001) on node n1 is unhealthy: XID 79"}]
    return Pod.from_dict(body)


def test_an_ignore_rule_for_disruptions_replaces_a_pod_failed_by_its_gpu_without_counting_it():
    j = with_policy(job(completions=1, parallelism=1, backoff_limit=0, status={"startTime": NOW.text}),
                    IGNORE_DISRUPTIONS)
    sync, pods_actions, tracking, finish = run(j, [failed_pod("x", disruption="GPUUnhealthy")],
                                               settings=Settings(5.0, 60.0))
    assert cond({"conditions": sync.conditions}, "FailureTarget") is None
    assert sync.failed == 0 and sync.backoff == Backoff()  # no back-off either
    assert pods_actions.reason == "ScaleUp" and len(pods_actions.creates) == 1
    assert [p.metadata.name for p in sync.to_release] == ["x"]  # its finalizer comes off, uncounted
    assert "failed" not in finish.status and cond(finish.status, "Failed") is None


def test_without_a_policy_a_disrupted_pod_counts_as_kubernetes_counts_it():
    j = job(completions=1, parallelism=1, backoff_limit=0, status={"startTime": NOW.text})
    sync, *_ = run(j, [failed_pod("x", disruption="GPUUnhealthy")])
    assert cond({"conditions": sync.conditions}, "FailureTarget")["reason"] == "BackoffLimitExceeded"


def test_a_fail_job_rule_fails_the_job_naming_the_pod_and_the_rule():
    j = with_policy(job(completions=3, parallelism=2, status={"startTime": NOW.text}), IGNORE_DISRUPTIONS)
    sync, pods_actions, _, _ = run(j, [failed_pod("x", code=42), pod("y")])
    target = cond({"conditions": sync.conditions}, "FailureTarget")
    assert target["reason"] == "PodFailurePolicy"
    assert target["message"] == "Container c for pod default/x failed with exit code 42 matching FailJob rule at index 1"
    assert [d.name for d in pods_actions.deletes] == ["y"]
    # Other exit codes match no rule: counted as usual.
    sync, *_ = run(j, [failed_pod("z", code=1), pod("y")])
    assert cond({"conditions": sync.conditions}, "FailureTarget") is None and sync.failed == 1
