"""Job: run pods until ``completions`` of them succeed, or give up.

What it does, as Kubernetes' job controller (1.31) does:
- keeps up to ``parallelism`` pods running (never more than the completions still needed),
  created from the template in slow-start batches with expectations, like ReplicaSets;
- ``completionMode: Indexed`` gives every pod an index: the annotation and label
  ``batch.kubernetes.io/job-completion-index``, the environment variable
  ``JOB_COMPLETION_INDEX`` (a literal value: each pod has its own, so no downward API is
  needed from the node agent), hostname ``<job>-<index>`` and name ``<job>-<index>-<5 chars>``;
  ``status.completedIndexes`` lists the indexes done;
- counts each finished pod exactly once with the ``batch.kubernetes.io/job-tracking``
  finalizer: a pod is created holding it; once it finished (or is being deleted) its uid is
  first written to ``status.uncountedTerminatedPods``, then the finalizer is removed, then the
  uid moves into ``succeeded``/``failed``. A pod can therefore neither vanish uncounted nor be
  counted twice, whatever crashes in between;
- fails the Job (conditions FailureTarget, then Failed) with reason BackoffLimitExceeded when
  more pods failed than ``backoffLimit`` (for restartPolicy OnFailure, container restarts
  count too), or DeadlineExceeded after ``activeDeadlineSeconds``; active pods are deleted;
- completes it (SuccessCriteriaMet, then Complete, with completionTime) when enough pods
  succeeded; a Job without completions completes when one pod succeeded and none is running;
- ``suspend`` deletes the active pods (condition Suspended); resuming restarts startTime;
- waits ``pod_failure_backoff * 2**(n-1)`` (capped) before replacing the n-th consecutive
  failure (Kubernetes: 10 s doubling to 6 min; ours is shorter and configurable);
- ``ttlSecondsAfterFinished`` deletes the finished Job (foreground, so its pods go first).

The selector: Kubernetes' API server gives every Job without ``manualSelector`` the selector
``batch.kubernetes.io/controller-uid=<uid>`` and puts that label and ``job-name`` on its pod
template. Our API server does not, and both fields are immutable after creation, so the
controller uses that selector whenever ``spec.selector`` is empty and puts the labels
(``batch.kubernetes.io/controller-uid``, ``batch.kubernetes.io/job-name``, and the legacy
``controller-uid``, ``job-name``) on every pod it creates.

Not done: podFailurePolicy, successPolicy, backoffLimitPerIndex/maxFailedIndexes,
podReplacementPolicy (pods are replaced once they are terminating or failed), managedBy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gpufleet.api.k8s import Job, Pod
from gpufleet.client import objects
from gpufleet.client.api import Client, retry_on_conflict
from gpufleet.client.controller import Controller, Requeue
from gpufleet.client.errors import ApiError, Conflict, NotFound
from gpufleet.client.events import NORMAL, WARNING, EventRecorder
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.client.workqueue import WorkQueue
from gpufleet.controllers._common import (
    CONTROLLER_UID_INDEX,
    Expectations,
    RefManager,
    error_text,
    find_condition,
    index_by_controller,
    is_being_deleted,
    now_text,
    owner_reference,
    pod_from_template,
    pod_is_active,
    pod_is_ready,
    pod_phase,
    pod_restart_count,
    pods_to_delete,
    resolve_controller,
    selector_from,
    slow_start_batch,
    status_dict,
    timestamp,
)
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

API_VERSION = "batch/v1"
KIND = "Job"
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
LEGACY_CONTROLLER_UID_LABEL = "controller-uid"
LEGACY_JOB_NAME_LABEL = "job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"
MAX_PODS_PER_SYNC = 500

BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
DEADLINE_EXCEEDED = "DeadlineExceeded"
COMPLETIONS_REACHED = "CompletionsReached"


# -- pure helpers -------------------------------------------------------------------------------


def job_selector(job: Any) -> dict[str, Any]:
    """The selector in force: the Job's own, else the one Kubernetes would have generated."""
    if job.spec.selector is not None and (job.spec.selector.match_labels or job.spec.selector.match_expressions):
        return job.spec.selector.to_dict()
    return {"matchLabels": {CONTROLLER_UID_LABEL: objects.uid_of(job)}}


def is_finished(job: Any) -> str | None:
    """'Complete' or 'Failed' when the Job has that condition True."""
    for cond in _conditions(job):
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return cond["type"]
    return None


def _conditions(job: Any) -> list[dict[str, Any]]:
    return [dict(c) for c in status_dict(job).get("conditions") or []]


def is_indexed(job: Any) -> bool:
    return job.spec.completion_mode == "Indexed"


def pod_index(pod: Any) -> int | None:
    annotations = objects.meta(pod, "annotations") or {}
    labels = objects.labels_of(pod)
    value = annotations.get(COMPLETION_INDEX, labels.get(COMPLETION_INDEX))
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def parse_indexes(text: str | None) -> set[int]:
    """'1,3-5' -> {1, 3, 4, 5}."""
    out: set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if hi else int(lo)
        except ValueError:
            continue
        out.update(range(first, last + 1))
    return out


def format_indexes(indexes: set[int]) -> str:
    """{1, 3, 4, 5} -> '1,3-5' (the form of status.completedIndexes)."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(indexes):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


def has_tracking_finalizer(pod: Any) -> bool:
    return TRACKING_FINALIZER in (objects.meta(pod, "finalizers") or [])


def pod_counts_as_failed(pod: Any) -> bool:
    """A failed pod, or one deleted before it succeeded (its outcome is lost)."""
    phase = pod_phase(pod)
    return phase == "Failed" or (is_being_deleted(pod) and phase != "Succeeded")


def _job_condition(type_: str, status: str, reason: str, message: str, now: str) -> dict[str, Any]:
    cond = {"type": type_, "status": status, "lastProbeTime": now, "lastTransitionTime": now}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def ensure_condition(
    conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str, now: str
) -> bool:
    """Set a Job condition; a change of status or reason moves its times. Returns whether it changed."""
    current = find_condition(conditions, type_)
    if current is not None:
        if current.get("status") == status and current.get("reason") == reason:
            return False
        current.update(_job_condition(type_, status, reason, message, now))
        return True
    if status == "False":
        # Kubernetes does not add a condition just to say it is false (e.g. never suspended).
        return False
    conditions.append(_job_condition(type_, status, reason, message, now))
    return True


@dataclass
class _Backoff:
    failures: int = 0
    last_failure: float = 0.0


# -- the controller ---------------------------------------------------------------------------


class JobController:
    name = "job"

    def __init__(
        self,
        client: Client,
        informers: SharedInformerFactory,
        *,
        clock: Clock = REAL_CLOCK,
        recorder: EventRecorder | None = None,
        workers: int = 2,
        pod_failure_backoff: float = 1.0,
        pod_failure_backoff_max: float = 60.0,
    ) -> None:
        self.client = client
        self.clock = clock
        self.recorder = recorder or EventRecorder(client, "job-controller", clock=clock)
        self.pod_failure_backoff = pod_failure_backoff
        self.pod_failure_backoff_max = pod_failure_backoff_max
        self.expectations = Expectations(clock)
        # Job key -> uids of pods whose finalizer this controller removed but whose update
        # the informer has not shown yet; they must not be counted again meanwhile.
        self._finalizers_removed: dict[str, set[str]] = {}
        self._backoff: dict[str, _Backoff] = {}
        # Job key -> resourceVersion of this controller's last status write: a cached Job
        # older than that would make it count and create from stale numbers.
        self._written: dict[str, int] = {}
        self.job_informer = informers.informer(Job)
        self.pod_informer = informers.informer(Pod)
        index_by_controller(self.pod_informer)
        self.queue = WorkQueue(self.name, clock=clock)
        self.controller = Controller(self.name, self.reconcile, self.queue, workers=workers)
        self.controller.watch(self.job_informer)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_deleted)
        # Pods holding the tracking finalizer whose Job is gone must still be let go.
        self.orphan_queue = WorkQueue(f"{self.name}-orphan-pods", clock=clock)
        self.orphans = Controller(f"{self.name}-orphan-pods", self._release_orphan, self.orphan_queue, workers=1)

    async def start(self) -> None:
        await self.controller.start()
        await self.orphans.start()

    async def stop(self) -> None:
        await self.orphans.stop()
        await self.controller.stop()

    # -- pod events -----------------------------------------------------------------------

    def _owner_key(self, pod: Any) -> str | None:
        job = resolve_controller(self.job_informer, pod, KIND)
        return objects.object_key(job) if job is not None else None

    def _pod_added(self, pod: Any) -> None:
        if is_being_deleted(pod):
            self._pod_updated(pod, pod)
            return
        key = self._owner_key(pod)
        if key:
            self.expectations.creation_observed(key)
            self.queue.add(key)
        elif objects.controller_ref(pod) is None:
            self._enqueue_matching(pod)
        else:
            self._maybe_orphan(pod)

    def _pod_updated(self, old: Any, new: Any) -> None:
        key = self._owner_key(new)
        if key:
            if is_being_deleted(new):
                self.expectations.deletion_observed(key, objects.object_key(new))
            self.queue.add(key)
        else:
            self._maybe_orphan(new)
        old_key = self._owner_key(old)
        if old_key and old_key != key:
            self.queue.add(old_key)
        if objects.controller_ref(new) is None and objects.labels_of(old) != objects.labels_of(new):
            self._enqueue_matching(new)

    def _pod_deleted(self, pod: Any) -> None:
        key = self._owner_key(pod)
        if key:
            self.expectations.deletion_observed(key, objects.object_key(pod))
            self.queue.add(key)

    def _enqueue_matching(self, pod: Any) -> None:
        labels = objects.labels_of(pod)
        for job in self.job_informer.by_index(NAMESPACE_INDEX, objects.namespace_of(pod)):
            if selector_from(job_selector(job)).matches(labels):
                self.queue.add(objects.object_key(job))

    def _maybe_orphan(self, pod: Any) -> None:
        if has_tracking_finalizer(pod):
            self.orphan_queue.add(objects.object_key(pod))

    # -- sync -----------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Requeue | None:
        job = self.job_informer.get(key)
        if job is None:
            self.expectations.forget(key)
            self._finalizers_removed.pop(key, None)
            self._backoff.pop(key, None)
            self._written.pop(key, None)
            return None
        if _rv(job) < self._written.get(key, 0):
            return None  # the watch event of that write will bring us back
        try:
            return await self._sync(key, job)
        except NotFound:
            return None
        except ApiError as e:
            log.info("job %s: %s", key, e)
            return Requeue()

    async def _claim_pods(self, job: Any) -> list[Any]:
        ns = objects.namespace_of(job)
        selector = selector_from(job_selector(job))

        def drop_finalizer(body: dict[str, Any]) -> None:
            meta = body["metadata"]
            meta["finalizers"] = [f for f in meta.get("finalizers") or [] if f != TRACKING_FINALIZER] or None

        refs = RefManager(self.client, job, API_VERSION, KIND, selector, Pod, release_also=drop_finalizer)
        candidates = self.pod_informer.by_index(NAMESPACE_INDEX, ns)
        return await refs.claim(candidates, adopt_filter=lambda p: not is_finished(job))

    async def _sync(self, key: str, job: Any) -> Requeue | None:
        if is_finished(job):
            await self._release_all_finalizers(key, job)
            return await self._expire(job)

        now = self.clock.now()
        now_str = now_text(self.clock)
        pods = await self._claim_pods(job)
        old_status = status_dict(job)
        status = {k: v for k, v in old_status.items()}
        conditions = [dict(c) for c in old_status.get("conditions") or []]
        uncounted = old_status.get("uncountedTerminatedPods") or {}
        uncounted_ok = list(uncounted.get("succeeded") or [])
        uncounted_failed = list(uncounted.get("failed") or [])
        removed = self._finalizers_removed.setdefault(key, set())
        # A removal is settled once the cache shows the pod without the finalizer, or gone.
        mine = {objects.uid_of(p): p for p in self.pod_informer.by_index(CONTROLLER_UID_INDEX, objects.uid_of(job))}
        for uid in list(removed):
            if uid not in mine or not has_tracking_finalizer(mine[uid]):
                removed.discard(uid)
        indexed = is_indexed(job)
        completions = job.spec.completions
        suspended = bool(job.spec.suspend)

        active_pods = [p for p in pods if pod_is_active(p)]
        new_ok = [p for p in pods if has_tracking_finalizer(p) and pod_phase(p) == "Succeeded"
                  and objects.uid_of(p) not in uncounted_ok and objects.uid_of(p) not in removed]
        new_failed = [p for p in pods if has_tracking_finalizer(p) and pod_counts_as_failed(p)
                      and objects.uid_of(p) not in uncounted_failed and objects.uid_of(p) not in removed]
        self._note_outcomes(key, new_ok, new_failed, now)

        completed_indexes = parse_indexes(old_status.get("completedIndexes")) if indexed else set()
        if indexed:
            for p in [*new_ok, *(p for p in pods if pod_phase(p) == "Succeeded")]:
                ix = pod_index(p)
                if ix is not None and completions is not None and 0 <= ix < completions:
                    completed_indexes.add(ix)
            succeeded = len(completed_indexes)
        else:
            succeeded = (old_status.get("succeeded") or 0) + len(new_ok) + len(uncounted_ok)
        failed = (old_status.get("failed") or 0) + len(new_failed) + len(uncounted_failed)

        if status.get("startTime") is None and not suspended:
            status["startTime"] = now_str
        requeue_after: float | None = None

        # What the Job's outcome is, once decided it stays decided.
        target = find_condition(conditions, "FailureTarget")
        target = target if target is not None and target.get("status") == "True" else None
        if target is None:
            backoff_limit = job.spec.backoff_limit if job.spec.backoff_limit is not None else 6
            if failed > backoff_limit or self._past_backoff_limit_on_failure(job, active_pods):
                target = _job_condition("FailureTarget", "True", BACKOFF_LIMIT_EXCEEDED,
                                        "Job has reached the specified backoff limit", now_str)
            elif self._past_deadline(job, status, now):
                target = _job_condition("FailureTarget", "True", DEADLINE_EXCEEDED,
                                        "Job was active longer than specified deadline", now_str)
            elif job.spec.active_deadline_seconds and not suspended:
                start = timestamp(status.get("startTime")) or now
                requeue_after = max(start + job.spec.active_deadline_seconds - now, 0.0) + 0.001
            if target is not None:
                conditions.append(target)

        active = len(active_pods)
        success = find_condition(conditions, "SuccessCriteriaMet")
        if target is not None:
            deleted = await self._delete_pods(key, job, active_pods)
            active -= deleted
        else:
            # Counts are only trusted once the cache shows this controller's own pod writes.
            if self.expectations.satisfied(key) and not removed and not is_being_deleted(job):
                active, wait = await self._manage(key, job, active_pods, succeeded, completed_indexes, conditions,
                                                  status, now_str)
                if wait is not None:
                    requeue_after = wait if requeue_after is None else min(requeue_after, wait)
            complete = (
                succeeded > 0 and active == 0 if completions is None
                else succeeded >= completions and active == 0
            )
            if complete and success is None:
                success = _job_condition("SuccessCriteriaMet", "True", COMPLETIONS_REACHED,
                                         "Reached expected number of succeeded pods", now_str)
                conditions.append(success)

        status["active"] = active
        status["ready"] = sum(1 for p in active_pods if pod_is_ready(p))
        if indexed:
            status["succeeded"] = succeeded
            status["completedIndexes"] = format_indexes(completed_indexes)

        # Count finished pods exactly once: uids (for Indexed jobs, the completed indexes) into
        # the status first, then finalizers off, then the uids into the counters.
        if not indexed:
            uncounted_ok.extend(objects.uid_of(p) for p in new_ok)
        uncounted_failed.extend(objects.uid_of(p) for p in new_failed if objects.uid_of(p) not in uncounted_ok)
        to_release = [
            p for p in pods
            if has_tracking_finalizer(p) and objects.uid_of(p) not in removed and (
                pod_phase(p) in ("Succeeded", "Failed") or is_being_deleted(p) or is_being_deleted(job)
            )
        ]
        status["uncountedTerminatedPods"] = {"succeeded": uncounted_ok, "failed": uncounted_failed}
        status["conditions"] = conditions
        if to_release and _tidy(status) != _tidy(old_status):
            job = await self._write(job, status)
        with_finalizer = {objects.uid_of(p) for p in pods if has_tracking_finalizer(p)} | removed
        for p in to_release:
            if await self._remove_finalizer(key, p):
                with_finalizer.discard(objects.uid_of(p))
        for uid in list(uncounted_ok):
            if uid not in with_finalizer:
                uncounted_ok.remove(uid)
                status["succeeded"] = (status.get("succeeded") or 0) + 1
        for uid in list(uncounted_failed):
            if uid not in with_finalizer:
                uncounted_failed.remove(uid)
                status["failed"] = (status.get("failed") or 0) + 1

        # Finish once nothing runs and no pod of the Job is left uncounted or holding the
        # finalizer (pods deleted this very sync are counted when their deletion shows).
        settled = not uncounted_ok and not uncounted_failed and not with_finalizer
        if settled and active == 0:
            if target is not None:
                if ensure_condition(conditions, "Failed", "True", target.get("reason", ""),
                                    target.get("message", ""), now_str):
                    await self.recorder.record(job, WARNING, target.get("reason", "Failed"),
                                               target.get("message", ""))
            elif success is not None:
                if ensure_condition(conditions, "Complete", "True", COMPLETIONS_REACHED,
                                    "Reached expected number of succeeded pods", now_str):
                    status["completionTime"] = now_str
                    await self.recorder.record(job, NORMAL, "Completed", "Job completed")
        job = await self._write(job, status)
        if is_finished(job) and job.spec.ttl_seconds_after_finished is not None:
            return await self._expire(job)
        return Requeue(after=requeue_after) if requeue_after is not None else None

    async def _write(self, job: Any, status: dict[str, Any]) -> Any:
        if _tidy(status) == _tidy(status_dict(job)):
            return job
        body = job.to_dict()
        body["status"] = _tidy(status)
        updated = await self.client.update_status(body)
        self._written[objects.object_key(updated)] = _rv(updated)
        return updated

    def _note_outcomes(self, key: str, new_ok: list[Any], new_failed: list[Any], now: float) -> None:
        record = self._backoff.setdefault(key, _Backoff())
        if new_ok:
            record.failures = 0
        if new_failed:
            record.failures += len(new_failed)
            record.last_failure = now

    def _backoff_remaining(self, key: str, now: float) -> float:
        record = self._backoff.get(key)
        if record is None or record.failures == 0 or self.pod_failure_backoff <= 0:
            return 0.0
        delay = min(self.pod_failure_backoff * 2 ** (record.failures - 1), self.pod_failure_backoff_max)
        return max(record.last_failure + delay - now, 0.0)

    def _past_backoff_limit_on_failure(self, job: Any, active_pods: list[Any]) -> bool:
        spec = job.spec.template.spec
        if spec is None or spec.restart_policy != "OnFailure":
            return False
        restarts = sum(pod_restart_count(p) for p in active_pods if pod_phase(p) in ("Running", "Pending"))
        limit = job.spec.backoff_limit if job.spec.backoff_limit is not None else 6
        return restarts > 0 if limit == 0 else restarts >= limit

    def _past_deadline(self, job: Any, status: dict[str, Any], now: float) -> bool:
        ads = job.spec.active_deadline_seconds
        start = timestamp(status.get("startTime"))
        if not ads or start is None or job.spec.suspend:
            return False
        return now - start >= ads

    async def _manage(
        self,
        key: str,
        job: Any,
        active_pods: list[Any],
        succeeded: int,
        completed: set[int],
        conditions: list[dict[str, Any]],
        status: dict[str, Any],
        now_str: str,
    ) -> tuple[int, float | None]:
        """Create or delete pods toward the wanted number running; returns (active, retry in)."""
        active = len(active_pods)
        if job.spec.suspend:
            if ensure_condition(conditions, "Suspended", "True", "JobSuspended", "Job suspended", now_str):
                await self.recorder.record(job, NORMAL, "Suspended", "Job suspended")
            return active - await self._delete_pods(key, job, active_pods), None
        if ensure_condition(conditions, "Suspended", "False", "JobResumed", "Job resumed", now_str):
            await self.recorder.record(job, NORMAL, "Resumed", "Job resumed")
            # activeDeadlineSeconds counts time running, not time suspended.
            status["startTime"] = now_str

        parallelism = job.spec.parallelism if job.spec.parallelism is not None else 1
        completions = job.spec.completions
        if completions is None:
            want = active if succeeded > 0 else parallelism
        else:
            want = max(min(completions - succeeded, parallelism), 0)

        excess = self._pods_for_removal(job, active_pods, max(active - want, 0), completed)
        if excess:
            return active - await self._delete_pods(key, job, excess[:MAX_PODS_PER_SYNC]), None

        diff = want - active
        if diff <= 0:
            return active, None
        wait = self._backoff_remaining(key, self.clock.now())
        if wait > 0:
            return active, wait + 0.001
        diff = min(diff, MAX_PODS_PER_SYNC)
        indexes: list[int | None] = [None] * diff
        if is_indexed(job):
            indexes = list(self._pending_indexes(job, active_pods, completed, diff))
            diff = len(indexes)
            if diff == 0:
                return active, None
        self.expectations.expect_creations(key, diff)
        pending = iter(indexes)

        async def create_one() -> None:
            body = self._pod_body(job, next(pending))
            try:
                pod = await self.client.create(body, objects.namespace_of(job), raw=True)
            except ApiError as e:
                await self.recorder.record(job, WARNING, "FailedCreate", f"Error creating: {error_text(e)}")
                raise
            await self.recorder.record(job, NORMAL, "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}")

        created, error = await slow_start_batch(diff, create_one)
        for _ in range(diff - created):
            self.expectations.creation_observed(key)
        if error is not None:
            raise error
        return active + created, None

    def _pods_for_removal(self, job: Any, active_pods: list[Any], at_least: int, completed: set[int]) -> list[Any]:
        remove: list[Any] = []
        keep = list(active_pods)
        if is_indexed(job):
            completions = job.spec.completions or 0
            best: dict[int, Any] = {}
            # One pod per pending index; out-of-range, duplicate and already completed ones go.
            for p in active_pods:
                ix = pod_index(p)
                if ix is None or not 0 <= ix < completions or ix in completed:
                    remove.append(p)
                elif ix in best:
                    worse = pods_to_delete([best[ix], p], 1)[0]
                    remove.append(worse)
                    best[ix] = p if worse is best[ix] else best[ix]
                else:
                    best[ix] = p
            keep = list(best.values())
        if len(remove) < at_least:
            remove.extend(pods_to_delete(keep, at_least - len(remove)))
        return remove

    def _pending_indexes(self, job: Any, active_pods: list[Any], completed: set[int], count: int) -> list[int]:
        taken = {pod_index(p) for p in active_pods}
        out = []
        for ix in range(job.spec.completions or 0):
            if ix in completed or ix in taken:
                continue
            out.append(ix)
            if len(out) == count:
                break
        return out

    def _pod_body(self, job: Any, index: int | None) -> dict[str, Any]:
        name, uid = objects.name_of(job), objects.uid_of(job)
        labels = {
            CONTROLLER_UID_LABEL: uid,
            JOB_NAME_LABEL: name,
            LEGACY_CONTROLLER_UID_LABEL: uid,
            LEGACY_JOB_NAME_LABEL: name,
        }
        annotations: dict[str, str] = {}
        prefix = f"{name}-"
        if index is not None:
            labels[COMPLETION_INDEX] = str(index)
            annotations[COMPLETION_INDEX] = str(index)
            prefix = f"{name}-{index}-"
        body = pod_from_template(
            job.spec.template,
            namespace=objects.namespace_of(job),
            generate_name=prefix,
            owner_ref=owner_reference(job, API_VERSION, KIND),
            labels=labels,
            annotations=annotations,
            finalizers=[TRACKING_FINALIZER],
        )
        if index is not None:
            spec = body["spec"]
            spec.setdefault("hostname", f"{name}-{index}")
            for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
                env = [e for e in c.get("env") or [] if e.get("name") != COMPLETION_INDEX_ENV]
                c["env"] = [{"name": COMPLETION_INDEX_ENV, "value": str(index)}, *env]
        return body

    async def _delete_pods(self, key: str, job: Any, pods: list[Any]) -> int:
        if not pods:
            return 0
        self.expectations.expect_deletions(key, [objects.object_key(p) for p in pods])
        deleted = 0
        first_error: ApiError | None = None
        for p in pods:
            try:
                await self.client.delete(Pod, objects.name_of(p), objects.namespace_of(p),
                                         preconditions_uid=objects.uid_of(p))
            except NotFound:
                deleted += 1
                continue
            except ApiError as e:
                self.expectations.deletion_observed(key, objects.object_key(p))
                first_error = first_error or e
                continue
            deleted += 1
            await self.recorder.record(job, NORMAL, "SuccessfulDelete", f"Deleted pod: {objects.name_of(p)}")
        if first_error is not None and deleted == 0:
            raise first_error
        return deleted

    async def _remove_finalizer(self, key: str, pod: Any) -> bool:
        """Take the tracking finalizer off; True once it is off (or the pod is gone)."""
        uid = objects.uid_of(pod)
        removed = self._finalizers_removed.setdefault(key, set())
        removed.add(uid)
        try:
            await _drop_tracking_finalizer(self.client, pod)
        except ApiError as e:
            removed.discard(uid)
            log.info("job %s: could not remove the finalizer of pod %s: %s", key, objects.name_of(pod), e)
            return False
        return True

    async def _release_all_finalizers(self, key: str, job: Any) -> None:
        for p in self.pod_informer.by_index(CONTROLLER_UID_INDEX, objects.uid_of(job)):
            if has_tracking_finalizer(p):
                await self._remove_finalizer(key, p)

    async def _expire(self, job: Any) -> Requeue | None:
        ttl = job.spec.ttl_seconds_after_finished
        if ttl is None or is_being_deleted(job):
            return None
        conds = _conditions(job)
        finished = [timestamp(c.get("lastTransitionTime")) for c in conds
                    if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"]
        finished_at = max([t for t in finished if t is not None] or [self.clock.now()])
        remaining = finished_at + ttl - self.clock.now()
        if remaining > 0:
            return Requeue(after=remaining + 0.001)
        try:
            await self.client.delete(Job, objects.name_of(job), objects.namespace_of(job),
                                     propagation_policy="Foreground", preconditions_uid=objects.uid_of(job))
        except (NotFound, Conflict):
            pass
        return None

    async def _release_orphan(self, key: str) -> None:
        """A pod holding the tracking finalizer whose Job is gone (or finished) is let go."""
        pod = self.pod_informer.get(key)
        if pod is None or not has_tracking_finalizer(pod):
            return
        ref = objects.controller_ref(pod)
        if ref is not None and objects.field(ref, "kind") == KIND:
            try:
                job = await self.client.get(Job, objects.field(ref, "name"), objects.namespace_of(pod))
            except NotFound:
                job = None
            if job is not None and objects.uid_of(job) == objects.field(ref, "uid") and not is_finished(job):
                return
        try:
            await _drop_tracking_finalizer(self.client, pod)
        except NotFound:
            pass


async def _drop_tracking_finalizer(client: Client, pod: Any) -> None:
    uid = objects.uid_of(pod)

    async def attempt() -> None:
        try:
            fresh = await client.get(Pod, objects.name_of(pod), objects.namespace_of(pod), raw=True)
        except NotFound:
            return
        meta = fresh["metadata"]
        finalizers = meta.get("finalizers") or []
        if meta.get("uid") != uid or TRACKING_FINALIZER not in finalizers:
            return
        meta["finalizers"] = [f for f in finalizers if f != TRACKING_FINALIZER]
        try:
            await client.update(fresh, raw=True)
        except NotFound:
            return

    await retry_on_conflict(attempt)


def _rv(obj: Any) -> int:
    # The store's resourceVersion is its global revision, an integer that only grows.
    try:
        return int(objects.resource_version_of(obj))
    except ValueError:
        return 0


def _tidy(status: dict[str, Any]) -> dict[str, Any]:
    """Status as Kubernetes writes it: zero counters and empty lists left out."""
    out: dict[str, Any] = {}
    for k, v in status.items():
        if k == "uncountedTerminatedPods":
            v = {kk: vv for kk, vv in (v or {}).items() if vv}
            if not v:
                continue
        if v in (None, [], {}, "") or (k in ("active", "succeeded", "failed", "terminating") and v == 0):
            continue
        out[k] = v
    return out
