"""A Deployment's sync as decisions: the Deployment, its ReplicaSets and their pods in,
``Actions`` out, touching nothing.

A sync takes one of four paths (``strategy``): a Deployment being deleted only has its status
written; a paused one, or one whose size changed (``is_scaling_event``), is resized without
rolling; otherwise RollingUpdate or Recreate moves it towards its template. Creating the new
ReplicaSet is the one write whose answer the rest of the sync needs (its name and version), so
it is decided first (``decide_new_replica_set``) and applied on its own; ``decide`` then
decides every other write of the sync on the sets as they are after each of its own writes
(``_Plan`` keeps that picture): ReplicaSet updates in order, each with its Event, the
revision annotation, deleting old sets past the history limit, the status and when to look
again. ``decide_collision`` and ``decide_create_failed`` are what a failed create leaves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufleet.api.k8s import Deployment, ReplicaSet
from gpufleet.client import objects
from gpufleet.client.events import NORMAL, WARNING
from gpufleet.controllers._common import (
    error_text,
    find_condition,
    is_being_deleted,
    owner_reference,
    pod_is_terminal,
    remove_condition,
    set_condition,
    status_dict,
)
from gpufleet.controllers.actions import Actions, Create, Delete, Event, Instant, Patch, Update
from gpufleet.controllers.deployment.model import (
    API_VERSION,
    DESIRED_REPLICAS,
    FAILED_RS_CREATE,
    FOUND_NEW_RS,
    KIND,
    NEW_RS_AVAILABLE,
    NEW_RS_CREATED,
    PAUSED,
    POD_TEMPLATE_HASH,
    RESUMED,
    REVISION,
    RS_UPDATED,
    TIMED_OUT,
    _active,
    _created,
    _find_active_or_latest,
    _is_rolling,
    _is_saturated,
    _progress_deadline,
    _proportion,
    _replace,
    _replica_failure,
    _replicas,
    _rs_replicas,
    _rs_status,
    _set_new_rs_annotations,
    _set_progressing,
    _set_replicas_annotations,
    _stuck_requeue,
    compute_hash,
    deployment_complete,
    deployment_progressing,
    deployment_status,
    deployment_timed_out,
    equal_ignore_hash,
    find_new_replica_set,
    max_surge,
    max_unavailable,
    revision_of,
)

STATUS_ONLY, SYNC, ROLLING, RECREATE = "StatusOnly", "Sync", "RollingUpdate", "Recreate"
NEW_RS_TAG = "new-replica-set"


@dataclass(frozen=True)
class Observed:
    """What a sync decides on: the Deployment, the ReplicaSets it owns (claimed), the pods of
    each set by the set's uid (Recreate waits for old pods to be gone), and the new set this
    sync created, when it did (``fresh``: created now, not found existing)."""

    d: Any
    rss: list[Any]
    pods: dict[str, list[Any]] = field(default_factory=dict)
    created: Any | None = None
    fresh: bool = False


def selects_all(d: Any) -> bool:
    sel = d.spec.selector
    return sel is None or (not sel.match_labels and not sel.match_expressions)


def decide_selecting_all(d: Any) -> Actions:
    """A Deployment without a selector is refused, with an Event; its generation is observed."""
    actions = Actions(reason="SelectingAll")
    actions.event(WARNING, "SelectingAll", "This deployment is selecting all pods. A non-empty selector is required.")
    original = status_dict(d)
    generation = objects.meta(d, "generation") or 1
    if generation != original.get("observedGeneration"):
        actions.status = {**original, "observedGeneration": generation}
    return actions


def is_scaling_event(d: Any, rss: list[Any]) -> bool:
    """An active set's desired-replicas annotation differs from spec.replicas: resized."""
    new_rs = find_new_replica_set(d, rss)
    old = [rs for rs in rss if rs is not new_rs]
    for rs in _active([*old, new_rs]):
        desired = (objects.meta(rs, "annotations") or {}).get(DESIRED_REPLICAS)
        if desired is None:
            continue
        try:
            if int(desired) != _replicas(d):
                return True
        except ValueError:
            continue
    return False


def strategy(d: Any, rss: list[Any]) -> str:
    """Which path a sync takes."""
    if is_being_deleted(d):
        return STATUS_ONLY
    if d.spec.paused or is_scaling_event(d, rss):
        return SYNC
    return ROLLING if _is_rolling(d) else RECREATE


def paused_conditions(d: Any, now: Instant) -> list[dict[str, Any]]:
    """The conditions the sync starts from: Progressing Unknown while paused (DeploymentPaused)
    and on resume (DeploymentResumed), unless the deadline already passed."""
    conds = [dict(c) for c in status_dict(d).get("conditions") or []]
    if _progress_deadline(d) is None:
        return conds
    cond = find_condition(conds, "Progressing")
    if cond is not None and cond.get("reason") == TIMED_OUT:
        return conds
    paused_now = cond is not None and cond.get("reason") == PAUSED
    if d.spec.paused and not paused_now:
        _set_progressing(conds, "Unknown", PAUSED, "Deployment is paused", now.text)
    elif not d.spec.paused and paused_now:
        _set_progressing(conds, "Unknown", RESUMED, "Deployment is resumed", now.text)
    return conds


def old_pods_running(old: list[Any], pods: dict[str, list[Any]]) -> bool:
    if sum(_rs_status(rs, "replicas") for rs in old) > 0:
        return True
    return any(not pod_is_terminal(p) for rs in old for p in pods.get(objects.uid_of(rs), []))


def new_rs_new_replicas(d: Any, all_rss: list[Any], new_rs: Any | None) -> int:
    """The new set's size: all of spec.replicas for Recreate; for RollingUpdate as far as the
    surge allows."""
    if not _is_rolling(d):
        return _replicas(d)
    current_new = _rs_replicas(new_rs) if new_rs is not None else 0
    current_total = sum(_rs_replicas(rs) for rs in all_rss if rs is not None)
    max_total = _replicas(d) + max_surge(d)
    if current_total >= max_total:
        return current_new
    scale_up = min(max_total - current_total, _replicas(d) - current_new)
    return current_new + max(scale_up, 0)


def _new_revision(old: list[Any]) -> str:
    return str(max([revision_of(rs) for rs in old] or [0]) + 1)


def new_replica_set_body(d: Any, old: list[Any]) -> dict[str, Any]:
    """The ReplicaSet ``<deployment>-<pod-template-hash>`` for the Deployment's template."""
    collision_count = status_dict(d).get("collisionCount")
    template = d.spec.template.to_dict()
    pod_hash = compute_hash(template, collision_count)
    labels = {**((template.get("metadata") or {}).get("labels") or {}), POD_TEMPLATE_HASH: pod_hash}
    template.setdefault("metadata", {})["labels"] = labels
    selector = d.spec.selector.to_dict()
    selector["matchLabels"] = {**(selector.get("matchLabels") or {}), POD_TEMPLATE_HASH: pod_hash}
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{objects.name_of(d)}-{pod_hash}",
            "namespace": objects.namespace_of(d),
            "labels": labels,
            "ownerReferences": [owner_reference(d, API_VERSION, KIND)],
        },
        "spec": {
            "replicas": new_rs_new_replicas(d, old, None),
            "minReadySeconds": d.spec.min_ready_seconds or 0,
            "selector": selector,
            "template": template,
        },
    }
    _set_new_rs_annotations(d, body, _new_revision(old), exists=False)
    return body


def decide_new_replica_set(obs: Observed) -> Actions:
    """Create the ReplicaSet of the current template when the rollout needs it and none has it:
    at once for RollingUpdate; for Recreate once every old set is scaled to zero and its pods
    are gone."""
    d, rss = obs.d, obs.rss
    path = strategy(d, rss)
    if path not in (ROLLING, RECREATE) or find_new_replica_set(d, rss) is not None:
        return Actions(reason="NoNewReplicaSet")
    if path == RECREATE and (any(_rs_replicas(rs) for rs in rss) or old_pods_running(rss, obs.pods)):
        return Actions(reason="WaitingForOldPods")
    body = new_replica_set_body(d, rss)
    return Actions(creates=[Create(body, tag=NEW_RS_TAG)], reason="CreateNewReplicaSet")


def decide_collision(d: Any, found: Any) -> Actions | None:
    """The new set's name was taken: by this Deployment's own set of the same template (a slow
    cache), which is then the new set (None); or by another, which raises
    ``status.collisionCount`` so the next sync hashes to another name."""
    ref = objects.controller_ref(found)
    if ref is not None and objects.field(ref, "uid") == objects.uid_of(d) \
            and equal_ignore_hash(d.spec.template, found.spec.template):
        return None
    original = status_dict(d)
    count = (original.get("collisionCount") or 0) + 1
    return Actions(status={**original, "collisionCount": count}, reason="HashCollision")


def decide_create_failed(d: Any, name: str, error: BaseException, now: Instant) -> Actions:
    """Creating the new set failed: Progressing False (ReplicaSetCreateError) and an Event."""
    msg = f'Failed to create new replica set "{name}": {error_text(error)}'
    actions = Actions(reason=FAILED_RS_CREATE)
    if _progress_deadline(d) is not None:
        conds = paused_conditions(d, now)
        _set_progressing(conds, "False", FAILED_RS_CREATE, msg, now.text)
        status = {**status_dict(d), "conditions": conds}
        actions.status = status if status != status_dict(d) else None
    actions.event(WARNING, FAILED_RS_CREATE, msg)
    return actions


class _Plan:
    """The writes of one sync so far, and the sets as they will be after them."""

    def __init__(self, obs: Observed, now: Instant) -> None:
        self.obs = obs
        self.d = obs.d
        self.now = now
        self.original = status_dict(obs.d)
        self.conditions = paused_conditions(obs.d, now)
        self.collision_count = self.original.get("collisionCount")
        self.actions = Actions()

    def scale_rs(self, rs: Any, new_scale: int) -> tuple[bool, Any]:
        """Resize ``rs`` (and stamp the replica annotations on it); the set as the API will
        answer, its generation moved with the spec."""
        d = self.d
        old_scale = _rs_replicas(rs)
        body = rs.to_dict()
        annotations_changed = _set_replicas_annotations(body, _replicas(d), _replicas(d) + max_surge(d))
        if old_scale == new_scale and not annotations_changed:
            return False, rs
        body["spec"]["replicas"] = new_scale
        event = None
        if old_scale != new_scale:
            direction = "up" if old_scale < new_scale else "down"
            event = Event(NORMAL, "ScalingReplicaSet",
                          f"Scaled {direction} replica set {objects.name_of(rs)} from {old_scale} to {new_scale}")
            body["metadata"]["generation"] = (objects.meta(rs, "generation") or 1) + 1
        self.actions.updates.append(Update(body, event))
        return old_scale != new_scale, ReplicaSet.from_dict(body)

    # -- the new set ------------------------------------------------------------------------

    def get_all(self, rss: list[Any], create: bool) -> tuple[Any | None, list[Any]]:
        existing = find_new_replica_set(self.d, rss)
        old = [rs for rs in rss if rs is not existing]
        return self.new_replica_set(old, existing, create), old

    def new_replica_set(self, old: list[Any], existing: Any | None, create: bool) -> Any | None:
        d = self.d
        new_revision = _new_revision(old)
        if existing is not None:
            body = existing.to_dict()
            changed = _set_new_rs_annotations(d, body, new_revision, exists=True)
            if (body["spec"].get("minReadySeconds") or 0) != (d.spec.min_ready_seconds or 0):
                body["spec"]["minReadySeconds"] = d.spec.min_ready_seconds or 0
                body["metadata"]["generation"] = (objects.meta(existing, "generation") or 1) + 1
                changed = True
            if changed:
                self.actions.updates.append(Update(body))
                return ReplicaSet.from_dict(body)
            self.set_revision((body["metadata"].get("annotations") or {}).get(REVISION))
            if _progress_deadline(d) is not None and find_condition(self.conditions, "Progressing") is None:
                _set_progressing(self.conditions, "True", FOUND_NEW_RS,
                                 f'Found new replica set "{objects.name_of(existing)}"', self.now.text)
            return existing
        created = self.obs.created
        if not create or created is None:
            return None
        name = objects.name_of(created)
        if self.obs.fresh and _rs_replicas(created) > 0:
            self.actions.event(NORMAL, "ScalingReplicaSet",
                               f"Scaled up replica set {name} from 0 to {_rs_replicas(created)}")
        self.set_revision(new_revision)
        if self.obs.fresh and _progress_deadline(d) is not None:
            _set_progressing(self.conditions, "True", NEW_RS_CREATED, f'Created new replica set "{name}"',
                             self.now.text)
        return created

    def set_revision(self, revision: str | None) -> None:
        if not revision or (objects.meta(self.d, "annotations") or {}).get(REVISION) == revision:
            return
        self.actions.patches.append(Patch(Deployment, objects.name_of(self.d), objects.namespace_of(self.d),
                                          {"metadata": {"annotations": {REVISION: revision}}}, owner=True))

    # -- status -----------------------------------------------------------------------------

    def write_status(self, status: dict[str, Any]) -> None:
        self.actions.status = status if status != self.original else None

    def deployment_status(self, all_rss: list[Any], new_rs: Any | None) -> None:
        self.write_status(deployment_status(self.d, all_rss, new_rs, self.conditions, self.now.text,
                                            self.collision_count))

    def rollout_status(self, all_rss: list[Any], new_rs: Any | None) -> None:
        d, now, now_str = self.d, self.now.wall, self.now.text
        status = deployment_status(d, all_rss, new_rs, self.conditions, now_str, self.collision_count)
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
            elif deployment_progressing(self.original, status):
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
                    self.actions.event(WARNING, TIMED_OUT,
                                       f'Deployment "{objects.name_of(d)}" has timed out progressing.')
        failure = _replica_failure(new_rs, all_rss)
        if failure is not None:
            set_condition(conds, "ReplicaFailure", failure.get("status", "True"), failure.get("reason", ""),
                          failure.get("message", ""), now_str, update_time_field="lastUpdateTime")
        else:
            remove_condition(conds, "ReplicaFailure")
        if not conds:
            status.pop("conditions")
        self.write_status(status)
        self.actions.requeue_after = _stuck_requeue(d, status, now)

    # -- old sets past the history limit ----------------------------------------------------

    def cleanup(self, old: list[Any]) -> None:
        limit = self.d.spec.revision_history_limit
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
            self.actions.deletes.append(Delete(ReplicaSet, objects.name_of(rs), objects.namespace_of(rs),
                                               uid=objects.uid_of(rs)))


# -- the paths --------------------------------------------------------------------------------


def decide(obs: Observed, now: Instant) -> Actions:
    """Every write of one sync but creating the new set (``obs.created`` is its answer)."""
    plan = _Plan(obs, now)
    rss = list(obs.rss)
    path = strategy(obs.d, rss)
    if path == STATUS_ONLY:
        new_rs, old = plan.get_all(rss, create=False)
        plan.deployment_status([*old, new_rs], new_rs)
    elif path == SYNC:
        _sync(plan, rss)
    elif path == ROLLING:
        _rollout_rolling(plan, rss)
    else:
        _rollout_recreate(plan, rss)
    plan.actions.reason = path
    return plan.actions


def _sync(plan: _Plan, rss: list[Any]) -> None:
    new_rs, old = plan.get_all(rss, create=False)
    new_rs, old = _scale(plan, new_rs, old)
    if plan.d.spec.paused:
        plan.cleanup(old)
    plan.deployment_status([*old, new_rs], new_rs)


def _scale(plan: _Plan, new_rs: Any | None, old: list[Any]) -> tuple[Any | None, list[Any]]:
    """Resize for a changed spec.replicas: the only active set takes it all; during a rollout
    every active set grows or shrinks in proportion to its size."""
    d = plan.d
    want = _replicas(d)
    active_or_latest = _find_active_or_latest(new_rs, old)
    if active_or_latest is not None:
        if _rs_replicas(active_or_latest) == want:
            return new_rs, old
        _, updated = plan.scale_rs(active_or_latest, want)
        return _replace(new_rs, old, active_or_latest, updated)

    if _is_saturated(d, new_rs):
        for rs in _active(old):
            _, updated = plan.scale_rs(rs, 0)
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
            proportion = _proportion(rs, d, plan.original, to_add, added)
            sizes[objects.name_of(rs)] = _rs_replicas(rs) + proportion
            added += proportion
        else:
            sizes[objects.name_of(rs)] = _rs_replicas(rs)
    if to_add != 0 and all_rss:
        first = objects.name_of(all_rss[0])
        sizes[first] = max(sizes[first] + to_add - added, 0)
    for rs in all_rss:
        _, updated = plan.scale_rs(rs, sizes[objects.name_of(rs)])
        new_rs, old = _replace(new_rs, old, rs, updated)
    return new_rs, old


def _rollout_rolling(plan: _Plan, rss: list[Any]) -> None:
    d = plan.d
    new_rs, old = plan.get_all(rss, create=True)
    # Scale the new set up, as far as the surge allows.
    if new_rs is not None and _rs_replicas(new_rs) != _replicas(d):
        if _rs_replicas(new_rs) > _replicas(d):
            target = _replicas(d)
        else:
            target = new_rs_new_replicas(d, [*old, new_rs], new_rs)
        scaled, new_rs = plan.scale_rs(new_rs, target)
        if scaled:
            plan.rollout_status([*old, new_rs], new_rs)
            return
    # Scale old sets down, as far as availability allows.
    scaled, old = _reconcile_old_replica_sets(plan, [*old, new_rs], old, new_rs)
    if scaled:
        plan.rollout_status([*old, new_rs], new_rs)
        return
    if deployment_complete(d, plan.original):
        plan.cleanup(old)
    plan.rollout_status([*old, new_rs], new_rs)


def _reconcile_old_replica_sets(plan: _Plan, all_rss: list[Any], old: list[Any],
                                new_rs: Any | None) -> tuple[bool, list[Any]]:
    d = plan.d
    old_pods = sum(_rs_replicas(rs) for rs in old)
    if old_pods == 0:
        return False, old
    all_pods = sum(_rs_replicas(rs) for rs in all_rss if rs is not None)
    min_available = _replicas(d) - max_unavailable(d)
    new_unavailable = (_rs_replicas(new_rs) - _rs_status(new_rs, "available_replicas")) if new_rs is not None else 0
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
        _, old[i] = plan.scale_rs(rs, replicas - count)
        cleaned += count

    # Then available ones, as far as the availability floor allows.
    available_now = sum(_rs_status(rs, "available_replicas") for rs in [*old, new_rs] if rs is not None)
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
            _, old[i] = plan.scale_rs(rs, replicas - count)
            scaled_down += count
    return cleaned + scaled_down > 0, old


def _rollout_recreate(plan: _Plan, rss: list[Any]) -> None:
    d = plan.d
    new_rs, old = plan.get_all(rss, create=False)
    scaled_down = False
    for i, rs in enumerate(old):
        if _rs_replicas(rs) == 0:
            continue
        scaled, old[i] = plan.scale_rs(rs, 0)
        scaled_down = scaled_down or scaled
    if scaled_down or old_pods_running(old, plan.obs.pods):
        plan.rollout_status([*old, new_rs], new_rs)
        return
    if new_rs is None:
        new_rs, old = plan.get_all(old, create=True)
    if new_rs is not None and _rs_replicas(new_rs) != _replicas(d):
        _, new_rs = plan.scale_rs(new_rs, _replicas(d))
    if deployment_complete(d, plan.original):
        plan.cleanup(old)
    plan.rollout_status([*old, new_rs], new_rs)
