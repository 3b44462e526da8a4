"""A Deployment's facts as plain functions: the pod-template hash, the rolling-update
fenceposts, revisions and their annotations, proportional shares, the status Kubernetes'
calculateStatus computes and when a rollout counts as complete, progressing or timed out."""

from __future__ import annotations

import json
from typing import Any

from gpufleet.client import objects
from gpufleet.controllers._common import find_condition, set_condition, timestamp

API_VERSION = "apps/v1"
KIND = "Deployment"
POD_TEMPLATE_HASH = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
REVISION_HISTORY = "deployment.kubernetes.io/revision-history"
DESIRED_REPLICAS = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# Annotations of the Deployment that are not copied onto its ReplicaSets.
_NOT_COPIED = {LAST_APPLIED, REVISION, REVISION_HISTORY, DESIRED_REPLICAS, MAX_REPLICAS,
               "deprecated.deployment.rollback.to"}
MAX_REVISION_HISTORY_CHARS = 2000

# Condition reasons, as kubectl and dashboards expect them.
NEW_RS_CREATED = "NewReplicaSetCreated"
FOUND_NEW_RS = "FoundNewReplicaSet"
RS_UPDATED = "ReplicaSetUpdated"
NEW_RS_AVAILABLE = "NewReplicaSetAvailable"
TIMED_OUT = "ProgressDeadlineExceeded"
FAILED_RS_CREATE = "ReplicaSetCreateError"
PAUSED = "DeploymentPaused"
RESUMED = "DeploymentResumed"
MIN_AVAILABLE = "MinimumReplicasAvailable"
MIN_UNAVAILABLE = "MinimumReplicasUnavailable"


# -- pure helpers -----------------------------------------------------------------------------


def _fnv32a(data: bytes, h: int = 0x811C9DC5) -> int:
    for b in data:
        h ^= b
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def compute_hash(template: dict[str, Any], collision_count: int | None = None) -> str:
    """The pod-template-hash of a template (a wire dict)."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    h = _fnv32a(canonical.encode())
    if collision_count:
        h = _fnv32a((collision_count & 0xFFFFFFFF).to_bytes(4, "little"), h)
    return "".join(_SAFE_ALPHABET[ord(c) % len(_SAFE_ALPHABET)] for c in str(h))


def _normalized(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _normalized(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


def _template_without_hash(template: Any) -> dict[str, Any]:
    data = template.to_dict() if hasattr(template, "to_dict") else json.loads(json.dumps(template or {}))
    labels = (data.get("metadata") or {}).get("labels")
    if labels:
        labels.pop(POD_TEMPLATE_HASH, None)
    return _normalized(data)


def equal_ignore_hash(a: Any, b: Any) -> bool:
    return _template_without_hash(a) == _template_without_hash(b)


def scaled_value(value: Any, total: int, round_up: bool) -> int:
    """An int-or-percent against ``total``."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise ValueError(f"invalid int-or-string {value!r}")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.endswith("%"):
        pct = int(text[:-1])
        return -(-pct * total // 100) if round_up else pct * total // 100
    return int(text)


def _replicas(d: Any) -> int:
    return d.spec.replicas if d.spec.replicas is not None else 1


def _is_rolling(d: Any) -> bool:
    strategy = d.spec.strategy
    return strategy is None or (strategy.type or "RollingUpdate") == "RollingUpdate"


def resolve_fenceposts(d: Any) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) in pods for a rolling Deployment."""
    ru = d.spec.strategy.rolling_update if d.spec.strategy is not None else None
    surge_v = ru.max_surge if ru is not None and ru.max_surge is not None else "25%"
    unavail_v = ru.max_unavailable if ru is not None and ru.max_unavailable is not None else "25%"
    desired = _replicas(d)
    surge = scaled_value(surge_v, desired, round_up=True)
    unavailable = scaled_value(unavail_v, desired, round_up=False)
    if surge == 0 and unavailable == 0:
        # Neither may be zero at once, or the rollout could never move.
        unavailable = 1
    return surge, unavailable


def max_surge(d: Any) -> int:
    return resolve_fenceposts(d)[0] if _is_rolling(d) else 0


def max_unavailable(d: Any) -> int:
    if not _is_rolling(d) or _replicas(d) == 0:
        return 0
    return min(resolve_fenceposts(d)[1], _replicas(d))


def _rs_replicas(rs: Any) -> int:
    return rs.spec.replicas or 0


def _rs_status(rs: Any, name: str) -> int:
    status = rs.status
    return (getattr(status, name, None) or 0) if status is not None else 0


def revision_of(obj: Any) -> int:
    try:
        return int((objects.meta(obj, "annotations") or {}).get(REVISION, "0"))
    except ValueError:
        return 0


def _created(rs: Any) -> tuple[float, str]:
    return (timestamp(objects.meta(rs, "creationTimestamp")) or 0.0, objects.name_of(rs))


def _active(rss: list[Any]) -> list[Any]:
    return [rs for rs in rss if rs is not None and _rs_replicas(rs) > 0]


def find_new_replica_set(d: Any, rss: list[Any]) -> Any | None:
    # The oldest of several equal-template sets wins, so a duplicate never takes over.
    for rs in sorted(rss, key=_created):
        if equal_ignore_hash(rs.spec.template, d.spec.template):
            return rs
    return None


def deployment_complete(d: Any, status: dict[str, Any]) -> bool:
    want = _replicas(d)
    return (
        status.get("updatedReplicas", 0) == want
        and status.get("replicas", 0) == want
        and status.get("availableReplicas", 0) == want
        and status.get("observedGeneration", 0) >= (objects.meta(d, "generation") or 1)
    )


def deployment_progressing(old: dict[str, Any], new: dict[str, Any]) -> bool:
    old_old = old.get("replicas", 0) - old.get("updatedReplicas", 0)
    new_old = new.get("replicas", 0) - new.get("updatedReplicas", 0)
    return (
        new.get("updatedReplicas", 0) > old.get("updatedReplicas", 0)
        or new_old < old_old
        or new.get("readyReplicas", 0) > old.get("readyReplicas", 0)
        or new.get("availableReplicas", 0) > old.get("availableReplicas", 0)
    )


def _progress_deadline(d: Any) -> int | None:
    pds = d.spec.progress_deadline_seconds
    # Kubernetes treats MaxInt32 as "no deadline".
    return None if pds is None or pds >= 2**31 - 1 else pds


def deployment_timed_out(d: Any, conditions: list[dict[str, Any]], now: float) -> bool:
    pds = _progress_deadline(d)
    cond = find_condition(conditions, "Progressing")
    if pds is None or cond is None or cond.get("reason") == NEW_RS_AVAILABLE:
        return False
    if cond.get("reason") == TIMED_OUT:
        return True
    last = timestamp(cond.get("lastUpdateTime")) or 0.0
    return last + pds < now


def deployment_status(
    d: Any, all_rss: list[Any], new_rs: Any | None, conditions: list[dict[str, Any]], now_str: str,
    collision_count: int | None,
) -> dict[str, Any]:
    """Kubernetes' calculateStatus: counts from the sets, the Available condition, and the
    conditions decided during this sync."""
    rss = [rs for rs in all_rss if rs is not None]
    available = sum(_rs_status(rs, "available_replicas") for rs in rss)
    total_spec = sum(_rs_replicas(rs) for rs in rss)
    status: dict[str, Any] = {
        "observedGeneration": objects.meta(d, "generation") or 1,
        "replicas": sum(_rs_status(rs, "replicas") for rs in rss),
        "updatedReplicas": _rs_status(new_rs, "replicas") if new_rs is not None else 0,
        "readyReplicas": sum(_rs_status(rs, "ready_replicas") for rs in rss),
        "availableReplicas": available,
        "unavailableReplicas": max(total_spec - available, 0),
    }
    if collision_count is not None:
        status["collisionCount"] = collision_count
    conds = [dict(c) for c in conditions]
    if available >= _replicas(d) - max_unavailable(d):
        set_condition(conds, "Available", "True", MIN_AVAILABLE, "Deployment has minimum availability.",
                      now_str, update_time_field="lastUpdateTime")
    else:
        set_condition(conds, "Available", "False", MIN_UNAVAILABLE,
                      "Deployment does not have minimum availability.", now_str, update_time_field="lastUpdateTime")
    status = {k: v for k, v in status.items() if v or k in ("observedGeneration", "replicas")}
    if conds:
        status["conditions"] = conds
    return status


def _set_progressing(conds: list[dict[str, Any]], status: str, reason: str, message: str, now: str) -> bool:
    return set_condition(conds, "Progressing", status, reason, message, now, update_time_field="lastUpdateTime")

# -- helpers over sets of ReplicaSets --------------------------------------------------------


def _replace(new_rs: Any, old: list[Any], before: Any, after: Any) -> tuple[Any, list[Any]]:
    if before is new_rs:
        return after, old
    return new_rs, [after if rs is before else rs for rs in old]


def _find_active_or_latest(new_rs: Any | None, old: list[Any]) -> Any | None:
    if new_rs is None and not old:
        return None
    by_newest = sorted(old, key=_created, reverse=True)
    active = _active([new_rs, *by_newest])
    if len(active) == 0:
        return new_rs if new_rs is not None else (by_newest[0] if by_newest else None)
    if len(active) == 1:
        return active[0]
    return None


def _is_saturated(d: Any, new_rs: Any | None) -> bool:
    if new_rs is None:
        return False
    desired = (objects.meta(new_rs, "annotations") or {}).get(DESIRED_REPLICAS)
    return (
        desired == str(_replicas(d))
        and _rs_replicas(new_rs) == _replicas(d)
        and _rs_status(new_rs, "available_replicas") == _replicas(d)
    )


def _proportion(rs: Any, d: Any, d_status: dict[str, Any], to_add: int, added: int) -> int:
    if _rs_replicas(rs) == 0 or to_add == 0 or to_add == added:
        return 0
    fraction = _fraction(rs, d, d_status)
    allowed = to_add - added
    return min(fraction, allowed) if to_add > 0 else max(fraction, allowed)


def _fraction(rs: Any, d: Any, d_status: dict[str, Any]) -> int:
    if _replicas(d) == 0:
        return -_rs_replicas(rs)
    deployment_replicas = _replicas(d) + max_surge(d)
    annotated = (objects.meta(rs, "annotations") or {}).get(MAX_REPLICAS)
    try:
        base = int(annotated) if annotated is not None else d_status.get("replicas", 0)
    except ValueError:
        base = d_status.get("replicas", 0)
    if not base:
        return 0
    size = _rs_replicas(rs) * deployment_replicas / base
    # Go's math.Round: halves away from zero.
    rounded = int(size + 0.5) if size >= 0 else -int(-size + 0.5)
    return rounded - _rs_replicas(rs)


def _set_replicas_annotations(body: dict[str, Any], desired: int, max_replicas: int) -> bool:
    annotations = body.setdefault("metadata", {}).setdefault("annotations", {})
    changed = False
    for key, value in ((DESIRED_REPLICAS, str(desired)), (MAX_REPLICAS, str(max_replicas))):
        if annotations.get(key) != value:
            annotations[key] = value
            changed = True
    return changed


def _set_new_rs_annotations(d: Any, body: dict[str, Any], new_revision: str, *, exists: bool) -> bool:
    """Copy the Deployment's own annotations, raise the revision, keep the revisions this
    template had before in revision-history (a rollback), and on creation set the replica
    annotations. Returns whether anything changed."""
    annotations = body.setdefault("metadata", {}).setdefault("annotations", {})
    changed = False
    for k, v in (objects.meta(d, "annotations") or {}).items():
        if k in _NOT_COPIED or annotations.get(k) == v:
            continue
        annotations[k] = v
        changed = True
    old_revision = annotations.get(REVISION)
    try:
        old_int = int(old_revision) if old_revision else 0
    except ValueError:
        return changed
    new_int = int(new_revision)
    if old_int < new_int:
        annotations[REVISION] = new_revision
        changed = True
        if old_revision:
            history = [r for r in (annotations.get(REVISION_HISTORY) or "").split(",") if r]
            history.append(old_revision)
            while history and len(",".join(history)) > MAX_REVISION_HISTORY_CHARS:
                history.pop(0)
            annotations[REVISION_HISTORY] = ",".join(history)
    if not exists and _set_replicas_annotations(body, _replicas(d), _replicas(d) + max_surge(d)):
        changed = True
    return changed


def _replica_failure(new_rs: Any | None, all_rss: list[Any]) -> dict[str, Any] | None:
    """The ReplicaFailure condition of the new set, else of any set."""
    ordered = [new_rs, *[rs for rs in all_rss if rs is not new_rs]]
    for rs in ordered:
        if rs is None or rs.status is None:
            continue
        for cond in rs.status.conditions or []:
            if cond.type == "ReplicaFailure":
                return cond.to_dict()
    return None


def _stuck_requeue(d: Any, status: dict[str, Any], now: float) -> float | None:
    """When to look again at a rollout that has not finished, to notice its deadline passing."""
    pds = _progress_deadline(d)
    cond = find_condition(status.get("conditions") or [], "Progressing")
    if pds is None or cond is None or d.spec.paused:
        return None
    if deployment_complete(d, status) or cond.get("reason") == TIMED_OUT:
        return None
    last = timestamp(cond.get("lastUpdateTime")) or now
    return max(last + pds - now, 0.0) + 1.0
