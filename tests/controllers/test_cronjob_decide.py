"""The CronJob controller's decisions and the schedule reader, without a control plane:
a CronJob, its Jobs and the time in, the plan out; minutes pass in virtual time."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.api import cronschedule
from gpufleet.api.k8s import CronJob, Job
from gpufleet.controllers.cronjob import Observed, after_create, decide, most_recent_schedule_time
from gpufleet.utils.clock import parse_rfc3339, rfc3339

T0 = parse_rfc3339("2024-05-01T12:00:00Z")  # a whole minute


def cronjob(schedule: str = "* * * * *", *, status: dict[str, Any] | None = None, created: float = T0 - 30,
            **spec: Any) -> CronJob:
    body = {
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "tick", "namespace": "default", "uid": "cj-uid", "creationTimestamp": rfc3339(created)},
        "spec": {"schedule": schedule, "concurrencyPolicy": "Allow", "suspend": False,
                 "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 1,
                 "jobTemplate": {"metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
                                 "spec": {"template": {"spec": {"restartPolicy": "Never",
                                                                "containers": [{"name": "c", "image": "i"}]}}}},
                 **{_camel(k): v for k, v in spec.items()}},
    }
    if status:
        body["status"] = status
    return CronJob.from_dict(body)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def job(name: str, *, uid: str | None = None, finished: str | None = None, started: float | None = None,
        done: float | None = None) -> Job:
    status: dict[str, Any] = {}
    if started is not None:
        status["startTime"] = rfc3339(started)
    if finished:
        status["conditions"] = [{"type": finished, "status": "True"}]
        if finished == "Complete":
            status["completionTime"] = rfc3339(done if done is not None else (started or T0))
    return Job.from_dict({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}",
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "tick",
                                          "uid": "cj-uid", "controller": True}]},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}},
        "status": status,
    })


def ref(j: Job) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "name": j.metadata.name, "namespace": "default",
            "uid": j.metadata.uid}


def stored(body: dict[str, Any], uid: str) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "uid": uid, "resourceVersion": "7"}}


# -- the schedule -------------------------------------------------------------------------


@pytest.mark.parametrize(("schedule", "after", "expected"), [
    ("* * * * *", "2024-05-01T12:00:00Z", "2024-05-01T12:01:00Z"),
    ("*/15 * * * *", "2024-05-01T12:07:30Z", "2024-05-01T12:15:00Z"),
    ("@hourly", "2024-05-01T12:00:00Z", "2024-05-01T13:00:00Z"),
    ("@daily", "2024-05-01T12:00:00Z", "2024-05-02T00:00:00Z"),
    ("0 9 * * MON-FRI", "2024-05-03T10:00:00Z", "2024-05-06T09:00:00Z"),  # Friday -> Monday
    ("0 0 1 JAN ?", "2024-05-01T00:00:00Z", "2025-01-01T00:00:00Z"),
    ("@every 90s", "2024-05-01T12:00:00Z", "2024-05-01T12:01:30Z"),
])
def test_the_next_time_of_a_schedule(schedule: str, after: str, expected: str) -> None:
    assert rfc3339(cronschedule.parse(schedule).next(parse_rfc3339(after))) == expected


def test_a_time_zone_moves_the_schedule_and_follows_daylight_saving() -> None:
    sched = cronschedule.parse("0 9 * * *", "Europe/Berlin")
    assert rfc3339(sched.next(parse_rfc3339("2024-01-10T00:00:00Z"))) == "2024-01-10T08:00:00Z"  # CET
    assert rfc3339(sched.next(parse_rfc3339("2024-07-10T00:00:00Z"))) == "2024-07-10T07:00:00Z"  # CEST


@pytest.mark.parametrize(("schedule", "message"), [
    ("* * * *", "expected exactly 5 fields, found 4: [* * * *]"),
    ("61 * * * *", "end of range (61) above maximum (59): 61"),
    ("* * 0 * *", "beginning of range (0) below minimum (1): 0"),
    ("5-1 * * * *", "beginning of range (5) beyond end of range (1): 5-1"),
    ("*/0 * * * *", "step of range should be a positive number: */0"),
    ("x * * * *", 'failed to parse int from x: strconv.Atoi: parsing "x": invalid syntax'),
    ("* * * * 7", "end of range (7) above maximum (6): 7"),
    ("@fortnightly", "unrecognized descriptor: @fortnightly"),
])
def test_a_schedule_kubernetes_refuses_is_refused_with_its_words(schedule: str, message: str) -> None:
    with pytest.raises(cronschedule.ScheduleError) as e:
        cronschedule.parse(schedule)
    assert str(e.value) == message


def test_time_zones_must_be_iana_names() -> None:
    assert cronschedule.time_zone_error("America/New_York") is None
    assert cronschedule.time_zone_error("Mars/Olympus") == "unknown time zone Mars/Olympus"
    assert cronschedule.time_zone_error("Local").startswith("timeZone must be an explicit time zone")
    assert cronschedule.time_zone_error("") == "timeZone must be nil or non-empty string"
    assert cronschedule.time_zone_error("../etc/passwd") == "unknown time zone ../etc/passwd"


# -- when a run is due --------------------------------------------------------------------


def test_nothing_is_due_before_the_first_schedule_time_and_it_looks_again_then() -> None:
    plan = decide(Observed(cronjob(), []), T0 - 10)
    assert plan.reason == "NotDue" and plan.create is None
    assert plan.requeue_after == pytest.approx(10.1)


def test_a_due_run_makes_its_job_from_the_template() -> None:
    plan = decide(Observed(cronjob(time_zone="Europe/Berlin"), []), T0 + 0.2)
    assert plan.reason == "Start" and plan.scheduled == T0
    body = plan.create.body
    assert body["metadata"]["name"] == f"tick-{int(T0) // 60}"
    assert body["metadata"]["labels"] == {"team": "a"}
    assert body["metadata"]["annotations"] == {
        "note": "x", "batch.kubernetes.io/cronjob-scheduled-timestamp": "2024-05-01T14:00:00+02:00"}
    owner = body["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("CronJob", "tick", "cj-uid", True)
    assert body["spec"]["template"]["spec"]["containers"][0]["image"] == "i"
    after = after_create(cronjob(), plan, [], stored(body, "new-uid"), True)
    assert after.status["lastScheduleTime"] == rfc3339(T0)
    assert [r["uid"] for r in after.status["active"]] == ["new-uid"]
    assert [(e.reason, e.message) for e in after.events] == [("SuccessfulCreate", f"Created job tick-{int(T0) // 60}")]
    assert after.requeue_after == pytest.approx(60.1 - 0.2)


def test_every_minute_one_job_per_minute_in_virtual_time() -> None:
    """Minutes pass; each sync starts the run of the minute that just began, once."""
    cj, jobs, names = cronjob(), [], []
    now = T0 + 0.1
    for _ in range(5):
        plan = decide(Observed(cj, jobs), now)
        assert plan.reason == "Start", plan.reason
        body = stored(plan.create.body, f"uid-{len(jobs)}")
        after = after_create(cj, plan, [], body, True)
        cj = cj.model_copy(update={"status": CronJob.from_dict({**cj.to_dict(), "status": after.status}).status})
        jobs.append(Job.from_dict(body))
        names.append(body["metadata"]["name"])
        # The same minute again: already done.
        assert decide(Observed(cj, jobs), now + 1).create is None
        now += after.requeue_after
    assert names == [f"tick-{int(T0) // 60 + i}" for i in range(5)]


def test_only_the_most_recent_missed_run_starts() -> None:
    cj = cronjob(status={"lastScheduleTime": rfc3339(T0)})
    plan = decide(Observed(cj, []), T0 + 10 * 60 + 5)
    assert plan.reason == "Start" and plan.scheduled == T0 + 600
    assert not [e for e in plan.events if e.reason == "TooManyMissedTimes"]


def test_more_than_100_missed_runs_are_reported_and_the_latest_starts() -> None:
    cj = cronjob(status={"lastScheduleTime": rfc3339(T0)})
    plan = decide(Observed(cj, []), T0 + 200 * 60 + 5)
    assert [e.reason for e in plan.events] == ["TooManyMissedTimes"]
    assert plan.scheduled == T0 + 200 * 60


def test_a_run_past_its_starting_deadline_is_missed() -> None:
    cj = cronjob(status={"lastScheduleTime": rfc3339(T0)}, starting_deadline_seconds=10)
    assert decide(Observed(cj, []), T0 + 60 + 5).reason == "Start"
    late = decide(Observed(cj, []), T0 + 60 + 30)
    # The deadline window starts after the last run: nothing is due in it.
    assert late.create is None
    cj = cronjob(status={"lastScheduleTime": rfc3339(T0)}, schedule="0 * * * *", starting_deadline_seconds=10)
    plan = decide(Observed(cj, []), T0 + 3600 + 5)
    assert plan.reason == "Start"


def test_suspend_an_unknown_zone_and_deletion_start_nothing() -> None:
    assert decide(Observed(cronjob(suspend=True), []), T0 + 1).reason == "Suspended"
    unknown = decide(Observed(cronjob(time_zone="Mars/Olympus"), []), T0 + 1)
    assert unknown.reason == "UnknownTimeZone" and unknown.events[0].reason == "UnknownTimeZone"
    cj = cronjob()
    cj.metadata.deletion_timestamp = rfc3339(T0)
    assert decide(Observed(cj, []), T0 + 1).create is None


# -- concurrency --------------------------------------------------------------------------


def test_forbid_skips_while_a_job_runs_replace_deletes_it_allow_runs_beside() -> None:
    running = job("tick-old", started=T0 - 60)
    status = {"active": [ref(running)], "lastScheduleTime": rfc3339(T0 - 60)}
    forbid = decide(Observed(cronjob(concurrency_policy="Forbid", status=status), [running]), T0 + 1)
    assert forbid.reason == "Forbidden" and forbid.create is None
    assert [e.reason for e in forbid.events] == ["JobAlreadyActive"]
    replace = decide(Observed(cronjob(concurrency_policy="Replace", status=status), [running]), T0 + 1)
    assert [d.name for d in replace.deletes] == ["tick-old"] and replace.create is not None
    assert replace.deletes[0].propagation_policy == "Background"
    after = after_create(cronjob(), replace, replace.deletes, stored(replace.create.body, "n"), True)
    assert [r["uid"] for r in after.status["active"]] == ["n"]
    assert ("SuccessfulDelete", "Deleted job tick-old") in [(e.reason, e.message) for e in after.events]
    allow = decide(Observed(cronjob(status=status), [running]), T0 + 1)
    assert allow.create is not None and not allow.deletes


# -- the Jobs it has ----------------------------------------------------------------------


def test_finished_jobs_leave_active_and_the_latest_success_is_recorded() -> None:
    ok = job("tick-1", finished="Complete", started=T0 - 120, done=T0 - 100)
    failed = job("tick-2", finished="Failed", started=T0 - 60)
    status = {"active": [ref(ok), ref(failed)], "lastScheduleTime": rfc3339(T0 - 60)}
    plan = decide(Observed(cronjob(status=status, suspend=True), [ok, failed]), T0 - 1)
    assert plan.status.get("active") is None
    assert plan.status["lastSuccessfulTime"] == rfc3339(T0 - 100)
    assert {e.message for e in plan.events} == {"Saw completed job: tick-1, condition: Complete",
                                                "Saw completed job: tick-2, condition: Failed"}


def test_a_job_made_by_hand_is_reported_and_a_vanished_one_leaves_active() -> None:
    manual = job("tick-manual")
    gone = job("tick-gone")
    status = {"active": [ref(gone)]}
    plan = decide(Observed(cronjob(status=status, suspend=True), [manual], frozenset({"uid-tick-gone"})), T0)
    assert [e.reason for e in plan.events] == ["UnexpectedJob", "MissingJob"]
    assert plan.status.get("active") is None
    # A Job the cache does not show but the API did not confirm gone stays active.
    kept = decide(Observed(cronjob(status=status, suspend=True), []), T0)
    assert [r["name"] for r in kept.status["active"]] == ["tick-gone"]


def test_history_limits_delete_the_oldest_finished_jobs() -> None:
    done = [job(f"ok-{i}", finished="Complete", started=T0 - 1000 + i) for i in range(5)]
    failed = [job(f"bad-{i}", finished="Failed", started=T0 - 500 + i) for i in range(3)]
    running = job("now", started=T0 - 5)
    plan = decide(Observed(cronjob(suspend=True), [*reversed(done), *failed, running]), T0)
    assert [d.name for d in plan.deletes] == ["ok-0", "ok-1", "bad-0", "bad-1"]
    zero = decide(Observed(cronjob(suspend=True, successful_jobs_history_limit=0), done), T0)
    assert len(zero.deletes) == 5


def test_a_schedule_that_never_fires_is_invalid_not_a_hang() -> None:
    cj = cronjob("0 0 30 2 *", status={"lastScheduleTime": rfc3339(T0)})
    with pytest.raises(ValueError):
        most_recent_schedule_time(cj, T0 + 60, cronschedule.parse("0 0 30 2 *"), True)
    plan = decide(Observed(cj, []), T0 + 60)
    assert plan.reason == "InvalidSchedule" and plan.create is None
    assert plan.events[0].reason == "InvalidSchedule"


_FIELD = st.one_of(st.sampled_from(["*", "?", "0", "5", "59", "60", "1-5", "5-1", "*/0", "*/7", "3/4", "mon", "JAN",
                                    "7", "-1", "1-2-3", "1/2/3", "", "x", "1,2", "L", "#"]), st.text(max_size=4))


@settings(max_examples=300, deadline=None)
@given(fields=st.lists(_FIELD, min_size=0, max_size=7), prefix=st.sampled_from(["", "@every ", "TZ=Europe/Paris ",
                                                                                 "CRON_TZ=Bad/Zone ", "@"]),
       zone=st.one_of(st.none(), st.text(max_size=12), st.sampled_from(["Asia/Tokyo", "Local", "UTC"])))
def test_any_schedule_is_read_or_refused_in_words(fields: list[str], prefix: str, zone: str | None) -> None:
    """No input makes the reader fail otherwise than with a ScheduleError (an API server 5xx)."""
    text = prefix + " ".join(fields)
    cronschedule.time_zone_error(zone or "")
    try:
        sched = cronschedule.parse(text, zone)
    except cronschedule.ScheduleError as e:
        assert str(e)
        return
    try:
        assert sched.next(T0) > T0
    except Exception as e:  # a schedule that never fires: the controller reports InvalidSchedule
        assert sched.expression, e
