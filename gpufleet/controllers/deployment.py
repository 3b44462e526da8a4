"""Deployment: roll a pod template out through ReplicaSets, as Kubernetes does.

- Each template gets a ReplicaSet ``<deployment>-<pod-template-hash>``; the hash is
  ``compute_hash`` (FNV-1a of the template's canonical JSON and the collision count, spelled
  with Kubernetes' SafeEncodeString alphabet), so it is stable across restarts. The label
  ``pod-template-hash`` is added to the ReplicaSet's selector, labels and template. The
  ReplicaSet of the current template is found by comparing templates without that label, not
  by the hash, so a hash that changes (a new field defaulted after an upgrade) never starts
  a rollout by itself; a name taken by a different template bumps ``status.collisionCount``.
- RollingUpdate follows maxSurge (percentages round up) and maxUnavailable (round down; both
  zero means one unavailable): scale the new set up within the surge, scale old sets down
  only as far as availability allows, unhealthy old pods first. Recreate scales every old
  set to zero, waits for their pods to be gone, then scales the new one up.
- A Deployment resized during a rollout is spread over its active sets in proportion to their
  size (the ``deployment.kubernetes.io/desired-replicas`` and ``max-replicas`` annotations).
- Revisions: ``deployment.kubernetes.io/revision`` on every set and on the Deployment, and
  ``revision-history`` when an old template comes back (``kubectl rollout undo`` works: it
  copies an old set's template into the Deployment). Old sets scaled to zero beyond
  ``revisionHistoryLimit`` are deleted, oldest revision first.
- ``paused`` only scales; ``progressDeadlineSeconds`` turns Progressing False with reason
  ProgressDeadlineExceeded when no progress was seen for that long; Available reflects
  minimum availability; status is computed by ``deployment_status`` and carries exactly what
  ``kubectl rollout status`` checks (observedGeneration, updatedReplicas, replicas,
  availableReplicas, the Progressing reason).

Not done: the deprecated ``spec.rollbackTo`` (extensions/v1beta1) and terminatingReplicas.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api.k8s import Deployment, Pod, ReplicaSet
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Controller, Requeue
from gpufleet.client.errors import AlreadyExists, ApiError, NotFound
from gpufleet.client.events import NORMAL, WARNING, EventRecorder
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.client.workqueue import WorkQueue
from gpufleet.controllers._common import (
    CONTROLLER_UID_INDEX,
    RefManager,
    error_text,
    find_condition,
    index_by_controller,
    is_being_deleted,
    now_text,
    owner_reference,
    pod_is_terminal,
    remove_condition,
    resolve_controller,
    selector_from,
    set_condition,
    status_dict,
    timestamp,
)
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

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


# -- the controller ---------------------------------------------------------------------------


@dataclass
class _Sync:
    """One pass over one Deployment: the object as written last, and the conditions and
    collision count decided so far (written together with the status at the end)."""

    d: Any
    original_status: dict[str, Any]
    conditions: list[dict[str, Any]] = field(default_factory=list)
    collision_count: int | None = None
    requeue_after: float | None = None


class DeploymentController:
    name = "deployment"

    def __init__(
        self,
        client: Client,
        informers: SharedInformerFactory,
        *,
        clock: Clock = REAL_CLOCK,
        recorder: EventRecorder | None = None,
        workers: int = 2,
    ) -> None:
        self.client = client
        self.clock = clock
        self.recorder = recorder or EventRecorder(client, "deployment-controller", clock=clock)
        self.d_informer = informers.informer(Deployment)
        self.rs_informer = informers.informer(ReplicaSet)
        self.pod_informer = informers.informer(Pod)
        index_by_controller(self.rs_informer)
        index_by_controller(self.pod_informer)
        self.queue = WorkQueue(self.name, clock=clock)
        self.controller = Controller(self.name, self.reconcile, self.queue, workers=workers)
        self.controller.watch(self.d_informer)
        self.rs_informer.add_event_handler(self._rs_added, self._rs_updated, self._rs_deleted)
        self.pod_informer.add_event_handler(on_delete=self._pod_deleted)

    async def start(self) -> None:
        await self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()

    # -- events ---------------------------------------------------------------------------

    def _owner_key(self, rs: Any) -> str | None:
        d = resolve_controller(self.d_informer, rs, KIND)
        return objects.object_key(d) if d is not None else None

    def _enqueue_matching(self, rs: Any) -> None:
        labels = objects.labels_of(rs)
        for d in self.d_informer.by_index(NAMESPACE_INDEX, objects.namespace_of(rs)):
            if selector_from(d.spec.selector).matches(labels):
                self.queue.add(objects.object_key(d))

    def _rs_added(self, rs: Any) -> None:
        if objects.controller_ref(rs) is not None:
            key = self._owner_key(rs)
            if key:
                self.queue.add(key)
            return
        self._enqueue_matching(rs)

    def _rs_updated(self, old: Any, new: Any) -> None:
        if objects.resource_version_of(old) == objects.resource_version_of(new):
            return
        old_ref, new_ref = objects.controller_ref(old), objects.controller_ref(new)
        ref_changed = objects.field(old_ref, "uid") != objects.field(new_ref, "uid")
        if ref_changed and old_ref is not None:
            key = self._owner_key(old)
            if key:
                self.queue.add(key)
        if new_ref is not None:
            key = self._owner_key(new)
            if key:
                self.queue.add(key)
            return
        if ref_changed or objects.labels_of(old) != objects.labels_of(new):
            self._enqueue_matching(new)

    def _rs_deleted(self, rs: Any) -> None:
        key = self._owner_key(rs)
        if key:
            self.queue.add(key)

    def _pod_deleted(self, pod: Any) -> None:
        # Recreate waits for the old pods to be gone; nothing else announces that.
        rs = resolve_controller(self.rs_informer, pod, "ReplicaSet")
        if rs is None:
            return
        d = resolve_controller(self.d_informer, rs, KIND)
        if d is not None and not _is_rolling(d):
            self.queue.add(objects.object_key(d))

    # -- sync -----------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Requeue | None:
        d = self.d_informer.get(key)
        if d is None:
            return None
        original = status_dict(d)
        ctx = _Sync(d, original, [dict(c) for c in original.get("conditions") or []],
                    original.get("collisionCount"))
        sel = d.spec.selector
        if sel is None or (not sel.match_labels and not sel.match_expressions):
            await self.recorder.record(d, WARNING, "SelectingAll",
                                       "This deployment is selecting all pods. A non-empty selector is required.")
            if (objects.meta(d, "generation") or 1) != original.get("observedGeneration"):
                await self._write_status(ctx, {**original, "observedGeneration": objects.meta(d, "generation") or 1})
            return None
        try:
            rss = await self._claim_replica_sets(d)
            if is_being_deleted(d):
                await self._sync_status_only(ctx, rss)
                return None
            self._check_paused_conditions(ctx)
            if d.spec.paused:
                await self._sync(ctx, rss)
            elif self._is_scaling_event(ctx, rss):
                await self._sync(ctx, rss)
            elif _is_rolling(d):
                await self._rollout_rolling(ctx, rss)
            else:
                await self._rollout_recreate(ctx, rss)
        except NotFound:
            return None
        except ApiError as e:
            # Mostly a Conflict with a write that the cache has not shown yet: look again.
            log.info("deployment %s: %s", key, e)
            return Requeue()
        if ctx.requeue_after is not None:
            return Requeue(after=ctx.requeue_after)
        return None

    async def _claim_replica_sets(self, d: Any) -> list[Any]:
        candidates = self.rs_informer.by_index(NAMESPACE_INDEX, objects.namespace_of(d))
        refs = RefManager(self.client, d, API_VERSION, KIND, selector_from(d.spec.selector), ReplicaSet)
        return await refs.claim(candidates)

    def _check_paused_conditions(self, ctx: _Sync) -> None:
        if _progress_deadline(ctx.d) is None:
            return
        cond = find_condition(ctx.conditions, "Progressing")
        if cond is not None and cond.get("reason") == TIMED_OUT:
            return
        paused_now = cond is not None and cond.get("reason") == PAUSED
        now = now_text(self.clock)
        if ctx.d.spec.paused and not paused_now:
            _set_progressing(ctx.conditions, "Unknown", PAUSED, "Deployment is paused", now)
        elif not ctx.d.spec.paused and paused_now:
            _set_progressing(ctx.conditions, "Unknown", RESUMED, "Deployment is resumed", now)

    def _is_scaling_event(self, ctx: _Sync, rss: list[Any]) -> bool:
        new_rs = find_new_replica_set(ctx.d, rss)
        old = [rs for rs in rss if rs is not new_rs]
        for rs in _active([*old, new_rs]):
            desired = (objects.meta(rs, "annotations") or {}).get(DESIRED_REPLICAS)
            if desired is None:
                continue
            try:
                if int(desired) != _replicas(ctx.d):
                    return True
            except ValueError:
                continue
        return False

    # -- finding and creating the new ReplicaSet -----------------------------------------------

    async def _get_all(self, ctx: _Sync, rss: list[Any], create: bool) -> tuple[Any | None, list[Any]]:
        existing = find_new_replica_set(ctx.d, rss)
        old = [rs for rs in rss if rs is not existing]
        new_rs = await self._get_new_replica_set(ctx, old, existing, create)
        return new_rs, old

    async def _get_new_replica_set(self, ctx: _Sync, old: list[Any], existing: Any | None, create: bool) -> Any:
        d = ctx.d
        new_revision = str(max([revision_of(rs) for rs in old] or [0]) + 1)
        now = now_text(self.clock)
        if existing is not None:
            body = existing.to_dict()
            changed = _set_new_rs_annotations(d, body, new_revision, exists=True)
            if (body["spec"].get("minReadySeconds") or 0) != (d.spec.min_ready_seconds or 0):
                body["spec"]["minReadySeconds"] = d.spec.min_ready_seconds or 0
                changed = True
            if changed:
                return await self.client.update(body)
            await self._set_deployment_revision(ctx, (body["metadata"].get("annotations") or {}).get(REVISION))
            if _progress_deadline(d) is not None and find_condition(ctx.conditions, "Progressing") is None:
                _set_progressing(ctx.conditions, "True", FOUND_NEW_RS,
                                 f'Found new replica set "{objects.name_of(existing)}"', now)
            return existing
        if not create:
            return None

        template = d.spec.template.to_dict()
        pod_hash = compute_hash(template, ctx.collision_count)
        labels = {**((template.get("metadata") or {}).get("labels") or {}), POD_TEMPLATE_HASH: pod_hash}
        template.setdefault("metadata", {})["labels"] = labels
        selector = d.spec.selector.to_dict()
        selector["matchLabels"] = {**(selector.get("matchLabels") or {}), POD_TEMPLATE_HASH: pod_hash}
        name = f"{objects.name_of(d)}-{pod_hash}"
        ns = objects.namespace_of(d)
        body: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": "ReplicaSet",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": labels,
                "ownerReferences": [owner_reference(d, API_VERSION, KIND)],
            },
            "spec": {
                "replicas": 0,
                "minReadySeconds": d.spec.min_ready_seconds or 0,
                "selector": selector,
                "template": template,
            },
        }
        new_replicas = self._new_rs_new_replicas(d, old, None)
        body["spec"]["replicas"] = new_replicas
        _set_new_rs_annotations(d, body, new_revision, exists=False)
        already_existed = False
        try:
            created = await self.client.create(body, ns)
        except AlreadyExists:
            already_existed = True
            # A slow cache, or a hash collision with a different template.
            try:
                created = await self.client.get(ReplicaSet, name, ns)
            except NotFound:
                raise
            ref = objects.controller_ref(created)
            if not (
                ref is not None
                and objects.field(ref, "uid") == objects.uid_of(d)
                and equal_ignore_hash(d.spec.template, created.spec.template)
            ):
                ctx.collision_count = (ctx.collision_count or 0) + 1
                await self._write_status(ctx, {**ctx.original_status, "collisionCount": ctx.collision_count})
                raise
        except ApiError as e:
            msg = f'Failed to create new replica set "{name}": {error_text(e)}'
            if _progress_deadline(d) is not None:
                _set_progressing(ctx.conditions, "False", FAILED_RS_CREATE, msg, now)
                await self._write_status(ctx, {**ctx.original_status, "conditions": ctx.conditions})
            await self.recorder.record(d, WARNING, FAILED_RS_CREATE, msg)
            raise
        if not already_existed and new_replicas > 0:
            await self.recorder.record(d, NORMAL, "ScalingReplicaSet",
                                       f"Scaled up replica set {name} from 0 to {new_replicas}")
        await self._set_deployment_revision(ctx, new_revision)
        if not already_existed and _progress_deadline(d) is not None:
            _set_progressing(ctx.conditions, "True", NEW_RS_CREATED, f'Created new replica set "{name}"', now)
        return created

    async def _set_deployment_revision(self, ctx: _Sync, revision: str | None) -> None:
        if not revision:
            return
        annotations = objects.meta(ctx.d, "annotations") or {}
        if annotations.get(REVISION) == revision:
            return
        ctx.d = await self.client.patch(
            Deployment, objects.name_of(ctx.d), {"metadata": {"annotations": {REVISION: revision}}},
            objects.namespace_of(ctx.d),
        )

    def _new_rs_new_replicas(self, d: Any, all_rss: list[Any], new_rs: Any | None) -> int:
        if not _is_rolling(d):
            return _replicas(d)
        current_new = _rs_replicas(new_rs) if new_rs is not None else 0
        current_total = sum(_rs_replicas(rs) for rs in all_rss if rs is not None)
        max_total = _replicas(d) + max_surge(d)
        if current_total >= max_total:
            return current_new
        scale_up = min(max_total - current_total, _replicas(d) - current_new)
        return current_new + max(scale_up, 0)

    # -- scaling ----------------------------------------------------------------------------

    async def _scale_rs(self, ctx: _Sync, rs: Any, new_scale: int) -> tuple[bool, Any]:
        d = ctx.d
        old_scale = _rs_replicas(rs)
        body = rs.to_dict()
        annotations_changed = _set_replicas_annotations(body, _replicas(d), _replicas(d) + max_surge(d))
        if old_scale == new_scale and not annotations_changed:
            return False, rs
        body["spec"]["replicas"] = new_scale
        updated = await self.client.update(body)
        if old_scale != new_scale:
            direction = "up" if old_scale < new_scale else "down"
            await self.recorder.record(
                d, NORMAL, "ScalingReplicaSet",
                f"Scaled {direction} replica set {objects.name_of(rs)} from {old_scale} to {new_scale}",
            )
            return True, updated
        return False, updated

    async def _scale(self, ctx: _Sync, new_rs: Any | None, old: list[Any]) -> tuple[Any | None, list[Any]]:
        """Resize for a changed spec.replicas: the only active set takes it all; during a
        rollout every active set grows or shrinks in proportion to its size."""
        d = ctx.d
        want = _replicas(d)
        active_or_latest = _find_active_or_latest(new_rs, old)
        if active_or_latest is not None:
            if _rs_replicas(active_or_latest) == want:
                return new_rs, old
            _, updated = await self._scale_rs(ctx, active_or_latest, want)
            return _replace(new_rs, old, active_or_latest, updated)

        if _is_saturated(d, new_rs):
            for rs in _active(old):
                _, updated = await self._scale_rs(ctx, rs, 0)
                new_rs, old = _replace(new_rs, old, rs, updated)
            return new_rs, old

        if not _is_rolling(d):
            return new_rs, old
        all_rss = _active([*old, new_rs])
        current = sum(_rs_replicas(rs) for rs in all_rss)
        allowed = want + max_surge(d) if want > 0 else 0
        to_add = allowed - current
        if to_add > 0:
            # Bigger first; among equals the newer grows first and the older shrinks first.
            all_rss.sort(key=lambda rs: (-_rs_replicas(rs), -_created(rs)[0], _created(rs)[1]))
        elif to_add < 0:
            all_rss.sort(key=lambda rs: (-_rs_replicas(rs), _created(rs)))
        sizes: dict[str, int] = {}
        added = 0
        for rs in all_rss:
            if to_add != 0:
                proportion = _proportion(rs, d, ctx.original_status, to_add, added)
                sizes[objects.name_of(rs)] = _rs_replicas(rs) + proportion
                added += proportion
            else:
                sizes[objects.name_of(rs)] = _rs_replicas(rs)
        if to_add != 0 and all_rss:
            first = objects.name_of(all_rss[0])
            sizes[first] = max(sizes[first] + to_add - added, 0)
        for rs in all_rss:
            _, updated = await self._scale_rs(ctx, rs, sizes[objects.name_of(rs)])
            new_rs, old = _replace(new_rs, old, rs, updated)
        return new_rs, old

    # -- strategies -----------------------------------------------------------------------------

    async def _sync(self, ctx: _Sync, rss: list[Any]) -> None:
        new_rs, old = await self._get_all(ctx, rss, create=False)
        new_rs, old = await self._scale(ctx, new_rs, old)
        if ctx.d.spec.paused:
            await self._cleanup(ctx, old)
        await self._sync_deployment_status(ctx, [*old, new_rs], new_rs)

    async def _sync_status_only(self, ctx: _Sync, rss: list[Any]) -> None:
        new_rs, old = await self._get_all(ctx, rss, create=False)
        await self._sync_deployment_status(ctx, [*old, new_rs], new_rs)

    async def _rollout_rolling(self, ctx: _Sync, rss: list[Any]) -> None:
        d = ctx.d
        new_rs, old = await self._get_all(ctx, rss, create=True)
        # Scale the new set up, as far as the surge allows.
        if _rs_replicas(new_rs) != _replicas(d):
            if _rs_replicas(new_rs) > _replicas(d):
                target = _replicas(d)
            else:
                target = self._new_rs_new_replicas(d, [*old, new_rs], new_rs)
            scaled, updated = await self._scale_rs(ctx, new_rs, target)
            new_rs = updated
            if scaled:
                await self._sync_rollout_status(ctx, [*old, new_rs], new_rs)
                return
        # Scale old sets down, as far as availability allows.
        scaled, old = await self._reconcile_old_replica_sets(ctx, [*old, new_rs], old, new_rs)
        if scaled:
            await self._sync_rollout_status(ctx, [*old, new_rs], new_rs)
            return
        if deployment_complete(d, ctx.original_status):
            await self._cleanup(ctx, old)
        await self._sync_rollout_status(ctx, [*old, new_rs], new_rs)

    async def _reconcile_old_replica_sets(
        self, ctx: _Sync, all_rss: list[Any], old: list[Any], new_rs: Any
    ) -> tuple[bool, list[Any]]:
        d = ctx.d
        old_pods = sum(_rs_replicas(rs) for rs in old)
        if old_pods == 0:
            return False, old
        all_pods = sum(_rs_replicas(rs) for rs in all_rss)
        min_available = _replicas(d) - max_unavailable(d)
        new_unavailable = _rs_replicas(new_rs) - _rs_status(new_rs, "available_replicas")
        max_scaled_down = all_pods - min_available - new_unavailable
        if max_scaled_down <= 0:
            return False, old

        # Old pods that are not available cost nothing to remove: take them first.
        cleaned = 0
        old = sorted(old, key=_created)
        for i, rs in enumerate(old):
            if cleaned >= max_scaled_down:
                break
            replicas, available = _rs_replicas(rs), _rs_status(rs, "available_replicas")
            if replicas == 0 or replicas == available:
                continue
            count = min(max_scaled_down - cleaned, replicas - available)
            _, old[i] = await self._scale_rs(ctx, rs, replicas - count)
            cleaned += count

        # Then available ones, as far as the availability floor allows.
        all_rss = [*old, new_rs]
        available_now = sum(_rs_status(rs, "available_replicas") for rs in all_rss if rs is not None)
        scaled_down = 0
        if available_now > min_available:
            budget = available_now - min_available
            for i, rs in enumerate(old):
                if scaled_down >= budget:
                    break
                replicas = _rs_replicas(rs)
                if replicas == 0:
                    continue
                count = min(replicas, budget - scaled_down)
                _, old[i] = await self._scale_rs(ctx, rs, replicas - count)
                scaled_down += count
        return cleaned + scaled_down > 0, old

    async def _rollout_recreate(self, ctx: _Sync, rss: list[Any]) -> None:
        d = ctx.d
        new_rs, old = await self._get_all(ctx, rss, create=False)
        scaled_down = False
        for i, rs in enumerate(old):
            if _rs_replicas(rs) == 0:
                continue
            scaled, old[i] = await self._scale_rs(ctx, rs, 0)
            scaled_down = scaled_down or scaled
        if scaled_down:
            await self._sync_rollout_status(ctx, [*old, new_rs], new_rs)
            return
        if self._old_pods_running(new_rs, old):
            await self._sync_rollout_status(ctx, [*old, new_rs], new_rs)
            return
        if new_rs is None:
            new_rs, old = await self._get_all(ctx, [*old], create=True)
        if _rs_replicas(new_rs) != _replicas(d):
            _, new_rs = await self._scale_rs(ctx, new_rs, _replicas(d))
        if deployment_complete(d, ctx.original_status):
            await self._cleanup(ctx, old)
        await self._sync_rollout_status(ctx, [*old, new_rs], new_rs)

    def _old_pods_running(self, new_rs: Any | None, old: list[Any]) -> bool:
        if sum(_rs_status(rs, "replicas") for rs in old) > 0:
            return True
        for rs in old:
            for pod in self.pod_informer.by_index(CONTROLLER_UID_INDEX, objects.uid_of(rs)):
                if not pod_is_terminal(pod):
                    return True
        return False

    async def _cleanup(self, ctx: _Sync, old: list[Any]) -> None:
        limit = ctx.d.spec.revision_history_limit
        if limit is None:
            return
        alive = [rs for rs in old if not is_being_deleted(rs)]
        diff = len(alive) - limit
        if diff <= 0:
            return
        alive.sort(key=lambda rs: (revision_of(rs), *_created(rs)))
        for rs in alive[:diff]:
            observed = _rs_status(rs, "observed_generation")
            if _rs_status(rs, "replicas") != 0 or _rs_replicas(rs) != 0 or (
                (objects.meta(rs, "generation") or 1) > observed
            ):
                continue
            try:
                await self.client.delete(ReplicaSet, objects.name_of(rs), objects.namespace_of(rs),
                                         preconditions_uid=objects.uid_of(rs))
            except NotFound:
                pass

    # -- status -------------------------------------------------------------------------------

    async def _sync_deployment_status(self, ctx: _Sync, all_rss: list[Any], new_rs: Any | None) -> None:
        status = deployment_status(ctx.d, all_rss, new_rs, ctx.conditions, now_text(self.clock),
                                   ctx.collision_count)
        await self._write_status(ctx, status)

    async def _sync_rollout_status(self, ctx: _Sync, all_rss: list[Any], new_rs: Any | None) -> None:
        d = ctx.d
        now = self.clock.now()
        now_str = now_text(self.clock)
        status = deployment_status(d, all_rss, new_rs, ctx.conditions, now_str, ctx.collision_count)
        conds: list[dict[str, Any]] = status.setdefault("conditions", [])
        if _progress_deadline(d) is None:
            remove_condition(conds, "Progressing")
        current = find_condition(conds, "Progressing")
        complete_already = (
            status.get("replicas", 0) == status.get("updatedReplicas", 0)
            and current is not None
            and current.get("reason") == NEW_RS_AVAILABLE
        )
        new_name = objects.name_of(new_rs) if new_rs is not None else ""
        if _progress_deadline(d) is not None and not complete_already:
            if deployment_complete(d, status):
                _set_progressing(conds, "True", NEW_RS_AVAILABLE,
                                 f'ReplicaSet "{new_name}" has successfully progressed.', now_str)
            elif deployment_progressing(ctx.original_status, status):
                msg = f'ReplicaSet "{new_name}" is progressing.' if new_rs is not None else ""
                cond = {"type": "Progressing", "status": "True", "lastUpdateTime": now_str,
                        "lastTransitionTime": now_str, "reason": RS_UPDATED}
                if msg:
                    cond["message"] = msg
                if current is not None and current.get("status") == "True":
                    cond["lastTransitionTime"] = current.get("lastTransitionTime", now_str)
                remove_condition(conds, "Progressing")
                conds.append(cond)
            elif deployment_timed_out(d, conds, now):
                _set_progressing(conds, "False", TIMED_OUT,
                                 f'ReplicaSet "{new_name}" has timed out progressing.', now_str)
                if current is None or current.get("reason") != TIMED_OUT:
                    await self.recorder.record(d, WARNING, TIMED_OUT,
                                               f'Deployment "{objects.name_of(d)}" has timed out progressing.')
        failure = _replica_failure(new_rs, all_rss)
        if failure is not None:
            set_condition(conds, "ReplicaFailure", failure.get("status", "True"), failure.get("reason", ""),
                          failure.get("message", ""), now_str, update_time_field="lastUpdateTime")
        else:
            remove_condition(conds, "ReplicaFailure")
        if not conds:
            status.pop("conditions")
        await self._write_status(ctx, status)
        ctx.requeue_after = _stuck_requeue(d, status, now)

    async def _write_status(self, ctx: _Sync, status: dict[str, Any]) -> None:
        if status == status_dict(ctx.d):
            return
        body = ctx.d.to_dict()
        body["status"] = status
        ctx.d = await self.client.update_status(body)


# -- helpers over sets of ReplicaSets --------------------------------------------------------------


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
