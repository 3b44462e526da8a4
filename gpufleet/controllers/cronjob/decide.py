"""A CronJob's sync as decisions: the CronJob, the Jobs it controls and the time in;
``Plan`` out, touching nothing. The rules are Kubernetes' CronJob controller (v2, 1.31):

- the Jobs it controls are reconciled with ``status.active``: a finished Job leaves it
  (SawCompletedJob), an unfinished one missing from it is reported (UnexpectedJob: a Job
  made by hand with ``kubectl create job --from=cronjob/...``, or written before a crash),
  an active Job that is gone leaves it (MissingJob); ``lastSuccessfulTime`` is the latest
  completion of a Job that succeeded;
- finished Jobs beyond ``successfulJobsHistoryLimit`` / ``failedJobsHistoryLimit`` are
  deleted oldest first (by startTime, then name);
- nothing is started while the CronJob is being deleted, while its time zone is unknown,
  while it is suspended, or while its schedule cannot be read;
- the run due is the most recent schedule time since ``lastScheduleTime`` (else the
  creation time) that has passed, and only that one: earlier missed runs are skipped. More
  than 100 missed runs is reported (TooManyMissedTimes) and the latest still starts, as in
  Kubernetes 1.22+. A run later than ``startingDeadlineSeconds`` after its time is missed
  (MissSchedule) and not started;
- ``concurrencyPolicy``: Allow starts it beside running Jobs, Forbid skips it while one runs
  (JobAlreadyActive), Replace deletes the running ones first;
- the Job is ``<cronjob>-<scheduled time in minutes since the epoch>`` (a name that is also
  the lock against starting one run twice), from ``jobTemplate`` with its labels and
  annotations, the annotation ``batch.kubernetes.io/cronjob-scheduled-timestamp`` (RFC 3339
  in the CronJob's zone) and a controller reference; then it joins ``status.active`` and
  ``lastScheduleTime`` is its scheduled time;
- the CronJob is looked at again 100 ms after its next schedule time.

``decide`` gives the deletes, the create and the status before the create; ``after_create``
adds the created Job (or the one that was there already under that name) to the status.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api import cronschedule
from gpufleet.api.batch import CRONJOB_SCHEDULED_TIMESTAMP
from gpufleet.api.k8s import Job
from gpufleet.client import objects
from gpufleet.controllers._common import is_being_deleted, owner_reference, status_dict
from gpufleet.controllers.actions import Actions, Create, Delete, Event
from gpufleet.utils.clock import parse_rfc3339, rfc3339

API_VERSION = "batch/v1"
KIND = "CronJob"
# How long after a schedule time the CronJob is looked at again.
NEXT_SCHEDULE_DELTA = 0.1
TOO_MANY_MISSED = 100

NONE_MISSED, FEW_MISSED, MANY_MISSED = "none", "few", "many"


@dataclass(frozen=True)
class Observed:
    """The CronJob, the Jobs whose controller it is (from the cache), and the uids of active
    Jobs the API confirmed gone."""

    cronjob: Any
    jobs: list[Any]
    missing: frozenset[str] = frozenset()


@dataclass
class Plan:
    """What one sync does: ``deletes`` (history, then Replace), ``create`` (the Job due, with
    its ``scheduled`` time), ``events``, and ``status`` as it stands before the create;
    ``changed``: whether that status differs from the stored one."""

    status: dict[str, Any]
    changed: bool = False
    deletes: list[Delete] = field(default_factory=list)
    create: Create | None = None
    scheduled: float | None = None
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    reason: str = ""

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))


# -- the Jobs ------------------------------------------------------------------------------


def finished_condition(job: Any) -> str | None:
    """'Complete' or 'Failed' when the Job has that condition True."""
    for c in status_dict(job).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return c["type"]
    return None


def job_name(cronjob: Any, scheduled: float) -> str:
    return f"{objects.name_of(cronjob)}-{int(scheduled) // 60}"


def job_ref(job: dict[str, Any]) -> dict[str, Any]:
    """The ObjectReference status.active holds."""
    meta = job.get("metadata") or {}
    ref = {"apiVersion": API_VERSION, "kind": "Job", "name": meta.get("name"), "namespace": meta.get("namespace"),
           "uid": meta.get("uid")}
    if meta.get("resourceVersion"):
        ref["resourceVersion"] = meta["resourceVersion"]
    return ref


def job_from_template(cronjob: Any, scheduled: float) -> dict[str, Any]:
    """The Job of the run due at ``scheduled`` (Kubernetes' getJobFromTemplate2)."""
    template = cronjob.spec.job_template
    tmeta = template.metadata
    labels = dict((tmeta.labels if tmeta is not None else None) or {})
    annotations = dict((tmeta.annotations if tmeta is not None else None) or {})
    zone = cronschedule.load_zone(cronjob.spec.time_zone or "")
    annotations[CRONJOB_SCHEDULED_TIMESTAMP] = cronschedule.rfc3339_in(scheduled, zone)
    meta: dict[str, Any] = {
        "name": job_name(cronjob, scheduled),
        "namespace": objects.namespace_of(cronjob),
        "annotations": annotations,
        "ownerReferences": [owner_reference(cronjob, API_VERSION, KIND)],
    }
    if labels:
        meta["labels"] = labels
    spec = template.spec.to_dict() if template.spec is not None else {}
    return {"apiVersion": API_VERSION, "kind": "Job", "metadata": meta, "spec": copy.deepcopy(spec)}


def _start_time(job: Any) -> float | None:
    text = status_dict(job).get("startTime")
    try:
        return parse_rfc3339(text) if text else None
    except ValueError:
        return None


def _by_start_time(jobs: list[Any]) -> list[Any]:
    """Oldest first: by startTime (Jobs not started last), then by name."""
    return sorted(jobs, key=lambda j: (_start_time(j) is None, _start_time(j) or 0.0, objects.name_of(j)))


def _delete(job: Any) -> Delete:
    return Delete(Job, objects.name_of(job), objects.namespace_of(job), uid=objects.uid_of(job),
                  propagation_policy="Background", ignore_conflict=True)


# -- the schedule -------------------------------------------------------------------------


def _time(text: Any) -> float | None:
    if not text:
        return None
    try:
        return parse_rfc3339(str(text))
    except ValueError:
        return None


def most_recent_schedule_time(cronjob: Any, now: float, sched: cronschedule.Schedule,
                              with_deadline: bool) -> tuple[float, float | None, str]:
    """(the earliest time looked from, the most recent schedule time at or before ``now``
    after it or None, how many were missed: NONE_MISSED/FEW_MISSED/MANY_MISSED).
    ValueError when the schedule's runs are less than a second apart (or never come)."""
    earliest = _time(objects.meta(cronjob, "creationTimestamp")) or now
    last = _time(status_dict(cronjob).get("lastScheduleTime"))
    if last is not None:
        earliest = last
    deadline = cronjob.spec.starting_deadline_seconds
    if with_deadline and deadline is not None:
        earliest = max(earliest, now - deadline)
    try:
        t1 = sched.next(earliest)
        t2 = sched.next(t1)
    except Exception as e:  # croniter: a schedule that never fires ("0 0 30 2 *")
        raise ValueError(str(e) or "the schedule never fires") from None
    if now < t1:
        return earliest, None, NONE_MISSED
    if now < t2:
        return earliest, t1, NONE_MISSED
    between = round(t2 - t1)
    if between < 1:
        raise ValueError("time difference between two schedules is less than 1 second")
    missed = int(now - t1) // between + 1
    # As Kubernetes: start a little before the estimated most recent one, then walk.
    t = sched.next(t1 + (missed - 2) * between)
    recent: float | None = None
    while t <= now:
        recent = t
        t = sched.next(t)
    how = MANY_MISSED if missed > TOO_MANY_MISSED else FEW_MISSED
    return earliest, recent, how


def next_schedule_in(cronjob: Any, now: float, sched: cronschedule.Schedule) -> float:
    """Seconds until the CronJob should be looked at again."""
    try:
        earliest, recent, missed = most_recent_schedule_time(cronjob, now, sched, False)
        base = recent if recent is not None else (earliest if missed == NONE_MISSED else now)
    except ValueError:
        base = now
    return sched.next(base) + NEXT_SCHEDULE_DELTA - now


# -- the decision -------------------------------------------------------------------------


def _status_base(cronjob: Any) -> dict[str, Any]:
    status = copy.deepcopy(status_dict(cronjob))
    status["active"] = list(status.get("active") or [])
    return status


def _tidy(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if v not in (None, [], {})}


def decide(obs: Observed, now: float) -> Plan:
    cj = obs.cronjob
    plan = Plan(_status_base(cj))
    status, active = plan.status, plan.status["active"]
    _reconcile_jobs(obs, plan, active, status)
    _history(cj, obs.jobs, plan, active)
    _schedule(cj, obs, now, plan, active)
    plan.status = _tidy(status)
    plan.changed = plan.status != _tidy(_status_base(cj))
    return plan


def _reconcile_jobs(obs: Observed, plan: Plan, active: list[dict[str, Any]], status: dict[str, Any]) -> None:
    children = {objects.uid_of(j) for j in obs.jobs}
    last_success = _time(status.get("lastSuccessfulTime"))
    for job in obs.jobs:
        uid, name = objects.uid_of(job), objects.name_of(job)
        found = any(r.get("uid") == uid for r in active)
        finished = finished_condition(job)
        if not found and finished is None:
            plan.event("Warning", "UnexpectedJob", f"Saw a job that the controller did not create or forgot: {name}")
        elif found and finished is not None:
            active[:] = [r for r in active if r.get("uid") != uid]
            plan.event("Normal", "SawCompletedJob", f"Saw completed job: {name}, condition: {finished}")
        if finished == "Complete":
            done = _time(status_dict(job).get("completionTime"))
            if done is not None and (last_success is None or done > last_success):
                last_success = done
                status["lastSuccessfulTime"] = rfc3339(done)
    for ref in list(active):
        if ref.get("uid") in children or ref.get("uid") not in obs.missing:
            continue
        plan.event("Normal", "MissingJob", f"Active job went missing: {ref.get('name')}")
        active.remove(ref)


def _history(cj: Any, jobs: list[Any], plan: Plan, active: list[dict[str, Any]]) -> None:
    spec = cj.spec
    for condition, limit in (("Complete", spec.successful_jobs_history_limit),
                             ("Failed", spec.failed_jobs_history_limit)):
        if limit is None:
            continue
        done = [j for j in jobs if finished_condition(j) == condition and not is_being_deleted(j)]
        for job in _by_start_time(done)[:max(len(done) - limit, 0)]:
            plan.deletes.append(_delete(job))
            active[:] = [r for r in active if r.get("uid") != objects.uid_of(job)]


def _schedule(cj: Any, obs: Observed, now: float, plan: Plan, active: list[dict[str, Any]]) -> None:
    spec = cj.spec
    if is_being_deleted(cj):
        plan.reason = "Deleting"
        return
    if spec.time_zone is not None:
        problem = cronschedule.time_zone_error(spec.time_zone)
        if problem is not None:
            plan.event("Warning", "UnknownTimeZone", f'invalid timeZone: "{spec.time_zone}": {problem}')
            plan.reason = "UnknownTimeZone"
            return
    if spec.suspend:
        plan.reason = "Suspended"
        return
    if "TZ" in spec.schedule:
        plan.event("Warning", "UnsupportedSchedule", f'CRON_TZ or TZ used in schedule "{spec.schedule}" is not '
                   "officially supported, see https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/ "
                   "for more details")
    try:
        sched = cronschedule.parse(spec.schedule, spec.time_zone)
    except cronschedule.ScheduleError as e:
        plan.event("Warning", "UnparseableSchedule", f'unparseable schedule: "{spec.schedule}" : {e}')
        plan.reason = "UnparseableSchedule"
        return
    try:
        _, scheduled, missed = most_recent_schedule_time(cj, now, sched, True)
    except ValueError as e:
        plan.event("Warning", "InvalidSchedule", f"invalid schedule: {spec.schedule} : {e}")
        plan.reason = "InvalidSchedule"
        return
    plan.requeue_after = next_schedule_in(cj, now, sched)
    if scheduled is None or scheduled > now:
        plan.reason = "NotDue"
        return
    if missed == MANY_MISSED:
        plan.event("Warning", "TooManyMissedTimes", "too many missed start times. Set or decrease "
                   ".spec.startingDeadlineSeconds or check clock skew")
    deadline = spec.starting_deadline_seconds
    if deadline is not None and scheduled + deadline < now:
        plan.event("Warning", "MissSchedule", "Missed scheduled time to start a job: "
                   + _rfc1123z(scheduled))
        plan.reason = "MissSchedule"
        return
    name = job_name(cj, scheduled)
    if any(r.get("name") == name for r in active) or _time(plan.status.get("lastScheduleTime")) == scheduled:
        plan.reason = "AlreadyProcessed"
        return
    if spec.concurrency_policy == "Forbid" and active:
        plan.event("Normal", "JobAlreadyActive", "Not starting job because prior execution is running and "
                   "concurrency policy is Forbid")
        plan.reason = "Forbidden"
        return
    if spec.concurrency_policy == "Replace":
        running = {objects.uid_of(j): j for j in obs.jobs}
        for ref in list(active):
            job = running.get(ref.get("uid"))
            plan.deletes.append(_delete(job) if job is not None else Delete(
                Job, ref.get("name", ""), ref.get("namespace"), uid=ref.get("uid"), propagation_policy="Background",
                ignore_conflict=True))
            active.remove(ref)
    plan.create = Create(job_from_template(cj, scheduled), on_exists="ignore", tag="job")
    plan.scheduled = scheduled
    plan.reason = "Start"


def _rfc1123z(t: float) -> str:
    from email.utils import formatdate

    return formatdate(t, usegmt=False).replace("-0000", "+0000")


def after_create(cronjob: Any, plan: Plan, deleted: list[Delete], job: dict[str, Any] | None,
                 created: bool) -> Actions:
    """The events and status once the deletes and the create were sent: ``job`` is the Job
    of the run (``created``: this sync made it; else it was there already), None when it
    could not be had or is not this CronJob's."""
    actions = Actions(reason=plan.reason)
    for d in deleted:
        actions.event("Normal", "SuccessfulDelete", f"Deleted job {d.name}")
    status = copy.deepcopy(plan.status)
    if job is not None and plan.scheduled is not None:
        if created:
            actions.event("Normal", "SuccessfulCreate", f"Created job {objects.name_of(job)}")
        active = list(status.get("active") or [])
        if not any(r.get("uid") == objects.uid_of(job) for r in active):
            active.append(job_ref(job))
        status["active"] = active
        status["lastScheduleTime"] = rfc3339(plan.scheduled)
    status = _tidy(status)
    if status != _tidy(_status_base(cronjob)):
        actions.status = status
    actions.requeue(plan.requeue_after)
    return actions
