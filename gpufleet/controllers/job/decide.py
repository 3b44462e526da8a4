"""A Job's sync as decisions: the Job, its pods and what the controller remembers in;
``Actions`` out, touching nothing.

The Job's state is read from its conditions (``state``): Active, Suspended, FailureTarget or
SuccessCriteriaMet (decided, pods still being counted), then Failed or Complete (finished).
``TRANSITIONS`` is every change a sync may make to it, with the condition, reason, message and
Event each writes, as Kubernetes' job controller writes them.

A sync counts the pods (``begin``: new successes and failures, completed indexes, the
back-off, whether the Job is past its backoff limit or deadline), then decides its pods
(``decide_pods``: delete them all when failing or suspended, otherwise create or delete
towards parallelism), then counts finished pods exactly once (``decide_tracking``: their uids
into ``uncountedTerminatedPods`` before their finalizers come off), then moves them into the
counters and finishes the Job once nothing is left uncounted (``decide_finish``), and deletes
a finished Job after its TTL (``decide_expire``). ``Sync`` carries what one step decided to
the next; the controller applies each step's Actions in between, since what the next decides
depends on how many pods the API really created or deleted and which finalizers came off.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api import podfailurepolicy
from gpufleet.api.k8s import Job, Pod
from gpufleet.client import objects
from gpufleet.client.events import NORMAL, WARNING
from gpufleet.controllers._common import (
    find_condition,
    is_being_deleted,
    pod_is_active,
    pod_is_ready,
    pod_phase,
    pod_restart_count,
    status_dict,
    timestamp,
)
from gpufleet.controllers.actions import Actions, Create, Delete, Instant
from gpufleet.controllers.job.model import (
    BACKOFF_LIMIT_EXCEEDED,
    COMPLETIONS_REACHED,
    DEADLINE_EXCEEDED,
    MAX_PODS_PER_SYNC,
    _conditions,
    ensure_condition,
    format_indexes,
    has_tracking_finalizer,
    is_indexed,
    parse_indexes,
    pending_indexes,
    pod_body,
    pod_counts_as_failed,
    pod_index,
    pods_for_removal,
    tidy,
)

ACTIVE, SUSPENDED = "Active", "Suspended"
FAILURE_TARGET, SUCCESS_CRITERIA_MET = "FailureTarget", "SuccessCriteriaMet"
FAILED, COMPLETE = "Failed", "Complete"
FROM_TARGET = None  # the Failed condition repeats its FailureTarget's reason and message


@dataclass(frozen=True)
class Transition:
    """One change of a Job's state: the condition it sets (``status``) with ``reason`` and
    ``message`` (``FROM_TARGET``: the FailureTarget's), and the Event it records when the
    condition changed (none when ``event_reason`` is empty). ``sources``: the states it fires
    from; ``to``: the state after."""

    name: str
    sources: frozenset[str]
    to: str
    condition: str
    status: str
    reason: str | None
    message: str | None
    event_type: str = NORMAL
    event_reason: str | None = ""
    event_message: str | None = ""


TRANSITIONS: dict[str, Transition] = {t.name: t for t in (
    Transition("Suspend", frozenset({ACTIVE}), SUSPENDED, "Suspended", "True", "JobSuspended", "Job suspended",
               NORMAL, "Suspended", "Job suspended"),
    Transition("Resume", frozenset({SUSPENDED}), ACTIVE, "Suspended", "False", "JobResumed", "Job resumed",
               NORMAL, "Resumed", "Job resumed"),
    Transition("ExceedBackoffLimit", frozenset({ACTIVE, SUSPENDED}), FAILURE_TARGET, FAILURE_TARGET, "True",
               BACKOFF_LIMIT_EXCEEDED, "Job has reached the specified backoff limit"),
    # The message names the pod and the rule (``podfailurepolicy.match``).
    Transition("FailByPodFailurePolicy", frozenset({ACTIVE}), FAILURE_TARGET, FAILURE_TARGET, "True",
               podfailurepolicy.POD_FAILURE_POLICY_REASON, None),
    Transition("ExceedDeadline", frozenset({ACTIVE}), FAILURE_TARGET, FAILURE_TARGET, "True", DEADLINE_EXCEEDED,
               "Job was active longer than specified deadline"),
    Transition("MeetSuccessCriteria", frozenset({ACTIVE, SUSPENDED}), SUCCESS_CRITERIA_MET, SUCCESS_CRITERIA_MET,
               "True", COMPLETIONS_REACHED, "Reached expected number of succeeded pods"),
    Transition("Fail", frozenset({FAILURE_TARGET}), FAILED, FAILED, "True", FROM_TARGET, FROM_TARGET,
               WARNING, FROM_TARGET, FROM_TARGET),
    Transition("Complete", frozenset({SUCCESS_CRITERIA_MET}), COMPLETE, COMPLETE, "True", COMPLETIONS_REACHED,
               "Reached expected number of succeeded pods", NORMAL, "Completed", "Job completed"),
)}


def _true(conditions: list[dict[str, Any]], type_: str) -> bool:
    cond = find_condition(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def state(conditions: list[dict[str, Any]]) -> str:
    """The Job's state as its conditions say: finished first, then decided, then suspended."""
    for type_ in (FAILED, COMPLETE, FAILURE_TARGET, SUCCESS_CRITERIA_MET):
        if _true(conditions, type_):
            return type_
    return SUSPENDED if _true(conditions, "Suspended") else ACTIVE


def fire(name: str, conditions: list[dict[str, Any]], now: str, actions: Actions | None = None,
         message: str | None = None) -> bool:
    """Apply transition ``name`` to ``conditions`` (its Event into ``actions``); whether the
    condition changed. ``message``: for a transition whose message the table leaves open."""
    t = TRANSITIONS[name]
    target = find_condition(conditions, FAILURE_TARGET) or {}
    reason = target.get("reason", "") if t.reason is FROM_TARGET else t.reason
    if message is None:
        message = target.get("message", "") if t.message is FROM_TARGET else t.message
    changed = ensure_condition(conditions, t.condition, t.status, reason or "", message or "", now)
    if changed and actions is not None and t.event_reason != "":
        event_reason = target.get("reason", "Failed") if t.event_reason is FROM_TARGET else t.event_reason
        event_message = target.get("message", "") if t.event_message is FROM_TARGET else t.event_message
        actions.event(t.event_type, event_reason or "", event_message or "")
    return changed


@dataclass(frozen=True)
class Backoff:
    """Consecutive pod failures, and when the last one was seen."""

    failures: int = 0
    last_failure: float = 0.0


@dataclass(frozen=True)
class Settings:
    pod_failure_backoff: float = 1.0
    pod_failure_backoff_max: float = 60.0
    # Pod events and the Job's own status updates bring it back this much later, so that a
    # burst of them is one sync (upstream's SyncJobBatchPeriod, 1 s); a spec change, at once.
    sync_batch_period: float = 1.0


@dataclass(frozen=True)
class Observed:
    """What a sync decides on: the Job, the pods it owns (claimed), uids of pods whose
    finalizer the controller removed but the cache still shows holding it, whether the cache
    has seen the controller's own creates and deletes, and the back-off so far."""

    job: Any
    pods: list[Any]
    removed: frozenset[str] = frozenset()
    expectations_satisfied: bool = True
    backoff: Backoff = Backoff()
    settings: Settings = Settings()


@dataclass
class Sync:
    """One sync's working picture, passed from step to step."""

    obs: Observed
    old_status: dict[str, Any]
    status: dict[str, Any]
    conditions: list[dict[str, Any]]
    uncounted_ok: list[str]
    uncounted_failed: list[str]
    active_pods: list[Any]
    new_ok: list[Any]
    new_failed: list[Any]
    completed: set[int]
    succeeded: int
    failed: int
    backoff: Backoff
    requeue_after: float | None = None
    active: int = 0
    to_release: list[Any] = field(default_factory=list)

    @property
    def job(self) -> Any:
        return self.obs.job

    def requeue(self, after: float | None) -> None:
        if after is not None:
            self.requeue_after = after if self.requeue_after is None else min(self.requeue_after, after)


def next_backoff(backoff: Backoff, new_ok: list[Any], new_failed: list[Any], now: float) -> Backoff:
    """A success resets the count; failures add to it."""
    failures, last = backoff.failures, backoff.last_failure
    if new_ok:
        failures = 0
    if new_failed:
        failures += len(new_failed)
        last = now
    return Backoff(failures, last)


def backoff_remaining(backoff: Backoff, settings: Settings, now: float) -> float:
    """Seconds before the next pod may replace a failed one: ``pod_failure_backoff * 2**(n-1)``
    after the n-th consecutive failure, capped."""
    if backoff.failures == 0 or settings.pod_failure_backoff <= 0:
        return 0.0
    delay = min(settings.pod_failure_backoff * 2 ** (backoff.failures - 1), settings.pod_failure_backoff_max)
    return max(backoff.last_failure + delay - now, 0.0)


def past_backoff_limit_on_failure(job: Any, active_pods: list[Any]) -> bool:
    """restartPolicy OnFailure: container restarts count against backoffLimit."""
    spec = job.spec.template.spec
    if spec is None or spec.restart_policy != "OnFailure":
        return False
    restarts = sum(pod_restart_count(p) for p in active_pods if pod_phase(p) in ("Running", "Pending"))
    limit = job.spec.backoff_limit if job.spec.backoff_limit is not None else 6
    return restarts > 0 if limit == 0 else restarts >= limit


def past_deadline(job: Any, status: dict[str, Any], now: float) -> bool:
    ads = job.spec.active_deadline_seconds
    start = timestamp(status.get("startTime"))
    if not ads or start is None or job.spec.suspend:
        return False
    return now - start >= ads


def begin(obs: Observed, now: Instant) -> Sync:
    """Count the pods and decide whether the Job fails (past its backoff limit or deadline)."""
    job, pods, removed = obs.job, obs.pods, obs.removed
    old_status = status_dict(job)
    status = dict(old_status)
    conditions = [dict(c) for c in old_status.get("conditions") or []]
    uncounted = old_status.get("uncountedTerminatedPods") or {}
    uncounted_ok = list(uncounted.get("succeeded") or [])
    uncounted_failed = list(uncounted.get("failed") or [])
    indexed, completions, suspended = is_indexed(job), job.spec.completions, bool(job.spec.suspend)

    active_pods = [p for p in pods if pod_is_active(p)]
    new_ok = [p for p in pods if has_tracking_finalizer(p) and pod_phase(p) == "Succeeded"
              and objects.uid_of(p) not in uncounted_ok and objects.uid_of(p) not in removed]
    new_failed = [p for p in pods if has_tracking_finalizer(p) and pod_counts_as_failed(p)
                  and objects.uid_of(p) not in uncounted_failed and objects.uid_of(p) not in removed]

    new_failed, fail_job = judge_failures(job, new_failed)

    completed = parse_indexes(old_status.get("completedIndexes")) if indexed else set()
    if indexed:
        for p in [*new_ok, *(p for p in pods if pod_phase(p) == "Succeeded")]:
            ix = pod_index(p)
            if ix is not None and completions is not None and 0 <= ix < completions:
                completed.add(ix)
        succeeded = len(completed)
    else:
        succeeded = (old_status.get("succeeded") or 0) + len(new_ok) + len(uncounted_ok)
    failed = (old_status.get("failed") or 0) + len(new_failed) + len(uncounted_failed)

    if status.get("startTime") is None and not suspended:
        status["startTime"] = now.text
    sync = Sync(obs, old_status, status, conditions, uncounted_ok, uncounted_failed, active_pods, new_ok,
                new_failed, completed, succeeded, failed, next_backoff(obs.backoff, new_ok, new_failed, now.wall))

    # What the Job's outcome is, once decided it stays decided.
    if not _true(conditions, FAILURE_TARGET):
        backoff_limit = job.spec.backoff_limit if job.spec.backoff_limit is not None else 6
        if fail_job is not None:
            fire("FailByPodFailurePolicy", conditions, now.text, message=fail_job)
        elif failed > backoff_limit or past_backoff_limit_on_failure(job, active_pods):
            fire("ExceedBackoffLimit", conditions, now.text)
        elif past_deadline(job, status, now.wall):
            fire("ExceedDeadline", conditions, now.text)
        elif job.spec.active_deadline_seconds and not suspended:
            start = timestamp(status.get("startTime")) or now.wall
            sync.requeue(max(start + job.spec.active_deadline_seconds - now.wall, 0.0) + 0.001)
    return sync


def judge_failures(job: Any, failed: list[Any]) -> tuple[list[Any], str | None]:
    """The newly failed pods that count against backoffLimit under the Job's podFailurePolicy
    (all of them without one), and the message of the first FailJob rule matched. Pods an
    Ignore rule matches are not counted: their finalizer comes off and they are replaced."""
    policy = job.spec.pod_failure_policy
    if policy is None:
        return failed, None
    counted: list[Any] = []
    fail_job: str | None = None
    for p in failed:
        if pod_phase(p) != "Failed":  # a pod deleted before it finished: no rule judges it
            counted.append(p)
            continue
        message, counts, _ = podfailurepolicy.match(policy, p)
        if message is not None and fail_job is None:
            fail_job = message
        if counts:
            counted.append(p)
    return counted, fail_job


def _deletes(pods: list[Any]) -> list[Delete]:
    return [Delete(Pod, objects.name_of(p), objects.namespace_of(p), uid=objects.uid_of(p), expect=True,
                   success_reason="SuccessfulDelete") for p in pods]


def decide_pods(sync: Sync, now: Instant) -> Actions:
    """The pods to create or delete: every active pod of a failing or suspended Job; otherwise
    towards ``min(parallelism, completions still needed)`` running, after the back-off, one pod
    per pending index for an Indexed Job. Nothing while the cache is behind the controller's
    own writes, a finalizer removal is unsettled, or the Job is being deleted."""
    job, obs = sync.job, sync.obs
    sync.active = len(sync.active_pods)
    if _true(sync.conditions, FAILURE_TARGET):
        return Actions(deletes=_deletes(sync.active_pods), reason="Failing")
    if not obs.expectations_satisfied or obs.removed or is_being_deleted(job):
        return Actions(reason="WaitingForCache")
    actions = Actions()
    if job.spec.suspend:
        fire("Suspend", sync.conditions, now.text, actions)
        actions.deletes = _deletes(sync.active_pods)
        actions.reason = "Suspended"
        return actions
    if fire("Resume", sync.conditions, now.text, actions):
        # activeDeadlineSeconds counts time running, not time suspended.
        sync.status["startTime"] = now.text

    active = sync.active
    parallelism = job.spec.parallelism if job.spec.parallelism is not None else 1
    completions = job.spec.completions
    if completions is None:
        want = active if sync.succeeded > 0 else parallelism
    else:
        want = max(min(completions - sync.succeeded, parallelism), 0)

    excess = pods_for_removal(job, sync.active_pods, max(active - want, 0), sync.completed)
    if excess:
        actions.deletes = _deletes(excess[:MAX_PODS_PER_SYNC])
        actions.reason = "ScaleDown"
        return actions
    diff = want - active
    if diff <= 0:
        actions.reason = "InSync"
        return actions
    wait = backoff_remaining(sync.backoff, obs.settings, now.wall)
    if wait > 0:
        actions.requeue(wait + 0.001)
        actions.reason = "BackingOff"
        return actions
    diff = min(diff, MAX_PODS_PER_SYNC)
    indexes: list[int | None] = [None] * diff
    if is_indexed(job):
        indexes = list(pending_indexes(job, sync.active_pods, sync.completed, diff))
    actions.creates = [Create(pod_body(job, ix), expect=True, success_reason="SuccessfulCreate",
                              failure_reason="FailedCreate", tag=ix) for ix in indexes]
    actions.reason = "ScaleUp" if actions.creates else "InSync"
    return actions


def decide_tracking(sync: Sync, active: int, now: Instant) -> Actions:
    """Whether the Job met its success criteria, and the status that records every finished
    pod before its finalizer comes off (written only when there is a finalizer to remove and
    the status changed). ``sync.to_release``: the pods whose finalizer comes off next."""
    job = sync.job
    sync.active = active
    if not _true(sync.conditions, FAILURE_TARGET):
        completions = job.spec.completions
        complete = (sync.succeeded > 0 and active == 0 if completions is None
                    else sync.succeeded >= completions and active == 0)
        if complete and find_condition(sync.conditions, SUCCESS_CRITERIA_MET) is None:
            fire("MeetSuccessCriteria", sync.conditions, now.text)
    status, indexed = sync.status, is_indexed(job)
    status["active"] = active
    status["ready"] = sum(1 for p in sync.active_pods if pod_is_ready(p))
    if indexed:
        status["succeeded"] = sync.succeeded
        status["completedIndexes"] = format_indexes(sync.completed)

    # Count finished pods exactly once: uids (for Indexed jobs, the completed indexes) into
    # the status first, then finalizers off, then the uids into the counters.
    if not indexed:
        sync.uncounted_ok.extend(objects.uid_of(p) for p in sync.new_ok)
    sync.uncounted_failed.extend(objects.uid_of(p) for p in sync.new_failed
                                 if objects.uid_of(p) not in sync.uncounted_ok)
    removed = sync.obs.removed
    sync.to_release = [
        p for p in sync.obs.pods
        if has_tracking_finalizer(p) and objects.uid_of(p) not in removed and (
            pod_phase(p) in ("Succeeded", "Failed") or is_being_deleted(p) or is_being_deleted(job)
        )
    ]
    status["uncountedTerminatedPods"] = {"succeeded": sync.uncounted_ok, "failed": sync.uncounted_failed}
    status["conditions"] = sync.conditions
    actions = Actions(reason="Tracking")
    if sync.to_release and tidy(status) != tidy(sync.old_status):
        actions.status = copy.deepcopy(tidy(status))
    return actions


def decide_finish(sync: Sync, job: Any, released: set[str], now: Instant) -> Actions:
    """Move the pods whose finalizer is off from uncounted into the counters, and finish the
    Job (Failed after FailureTarget, Complete after SuccessCriteriaMet) once nothing runs and
    no pod is left uncounted or holding the finalizer. ``job``: the Job as last written."""
    status = sync.status
    with_finalizer = ({objects.uid_of(p) for p in sync.obs.pods if has_tracking_finalizer(p)}
                      | set(sync.obs.removed)) - released
    for uid in list(sync.uncounted_ok):
        if uid not in with_finalizer:
            sync.uncounted_ok.remove(uid)
            status["succeeded"] = (status.get("succeeded") or 0) + 1
    for uid in list(sync.uncounted_failed):
        if uid not in with_finalizer:
            sync.uncounted_failed.remove(uid)
            status["failed"] = (status.get("failed") or 0) + 1

    actions = Actions(reason=state(sync.conditions))
    # Pods deleted this very sync are counted when their deletion shows.
    settled = not sync.uncounted_ok and not sync.uncounted_failed and not with_finalizer
    if settled and sync.active == 0:
        if _true(sync.conditions, FAILURE_TARGET):
            fire("Fail", sync.conditions, now.text, actions)
        elif find_condition(sync.conditions, SUCCESS_CRITERIA_MET) is not None:
            if fire("Complete", sync.conditions, now.text, actions):
                status["completionTime"] = now.text
        actions.reason = state(sync.conditions)
    if tidy(status) != tidy(status_dict(job)):
        actions.status = copy.deepcopy(tidy(status))
    actions.requeue(sync.requeue_after)
    return actions


def finished_pods_to_release(job: Any, pods: list[Any]) -> list[Any]:
    """A finished Job lets go of every pod still holding its finalizer."""
    return [p for p in pods if has_tracking_finalizer(p)] if is_finished_state(job) else []


def is_finished_state(job: Any) -> bool:
    return state(_conditions(job)) in (FAILED, COMPLETE)


def decide_expire(job: Any, now: Instant) -> Actions:
    """A finished Job is deleted ``ttlSecondsAfterFinished`` after it finished (foreground, so
    its pods go first); until then, look again when that time comes."""
    ttl = job.spec.ttl_seconds_after_finished
    if ttl is None or is_being_deleted(job) or not is_finished_state(job):
        return Actions(reason="Kept")
    finished = [timestamp(c.get("lastTransitionTime")) for c in _conditions(job)
                if c.get("type") in (COMPLETE, FAILED) and c.get("status") == "True"]
    finished_at = max([t for t in finished if t is not None] or [now.wall])
    remaining = finished_at + ttl - now.wall
    if remaining > 0:
        actions = Actions(reason="Finished")
        actions.requeue(remaining + 0.001)
        return actions
    return Actions(deletes=[Delete(Job, objects.name_of(job), objects.namespace_of(job), uid=objects.uid_of(job),
                                   propagation_policy="Foreground", ignore_conflict=True)], reason="Expired")
