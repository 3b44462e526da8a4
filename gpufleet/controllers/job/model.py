"""A Job's facts as plain functions: its selector, completion indexes, the tracking finalizer,
its conditions, the pods it creates, which of its pods to remove first, and its status as
Kubernetes writes it."""

from __future__ import annotations

from typing import Any

from gpufleet.api.batch import (
    COMPLETION_INDEX,
    CONTROLLER_UID_LABEL,
    JOB_NAME_LABEL,
    LEGACY_CONTROLLER_UID_LABEL,
    LEGACY_JOB_NAME_LABEL,
)
from gpufleet.client import objects
from gpufleet.controllers._common import (
    find_condition,
    is_being_deleted,
    owner_reference,
    pod_from_template,
    pod_phase,
    pods_to_delete,
    status_dict,
)

API_VERSION = "batch/v1"
KIND = "Job"
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"
MAX_PODS_PER_SYNC = 500

BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
DEADLINE_EXCEEDED = "DeadlineExceeded"
COMPLETIONS_REACHED = "CompletionsReached"





def job_selector(job: Any) -> dict[str, Any]:
    """The selector in force: the Job's own (the API server generates it on create), else, for
    a Job stored without one, the one Kubernetes would have generated."""
    if job.spec.selector is not None and (job.spec.selector.match_labels or job.spec.selector.match_expressions):
        return job.spec.selector.to_dict()
    return {"matchLabels": {CONTROLLER_UID_LABEL: objects.uid_of(job)}}


def _selector_unset(job: Any) -> bool:
    sel = job.spec.selector
    return sel is None or not (sel.match_labels or sel.match_expressions)


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


def pod_body(job: Any, index: int | None) -> dict[str, Any]:
    """A pod of the Job: its template's labels (which the API server gave the Job's uid and
    name; a Job stored without a selector gets them here), holding the tracking finalizer; an
    Indexed Job's pod also carries its index (annotation, label, hostname, environment)."""
    name, uid = objects.name_of(job), objects.uid_of(job)
    labels: dict[str, str] = {}
    if _selector_unset(job):
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


def pods_for_removal(job: Any, active_pods: list[Any], at_least: int, completed: set[int]) -> list[Any]:
    """At least ``at_least`` active pods to delete, cheapest to lose first; for an Indexed Job
    also every pod whose index is out of range, done already, or held by a better pod."""
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


def pending_indexes(job: Any, active_pods: list[Any], completed: set[int], count: int) -> list[int]:
    """Up to ``count`` indexes neither completed nor held by an active pod, lowest first."""
    taken = {pod_index(p) for p in active_pods}
    out = []
    for ix in range(job.spec.completions or 0):
        if ix in completed or ix in taken:
            continue
        out.append(ix)
        if len(out) == count:
            break
    return out


def resource_version(obj: Any) -> int:
    # The store's resourceVersion is its global revision, an integer that only grows.
    try:
        return int(objects.resource_version_of(obj))
    except ValueError:
        return 0


def tidy(status: dict[str, Any]) -> dict[str, Any]:
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
