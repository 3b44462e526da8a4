"""The StatefulSet decision: ``decide(observed, now) -> Actions``, a pure function.

It follows Kubernetes' updateStatefulSet, in this order:

1. revisions: the template's ControllerRevision is found (renumbered when it is an earlier
   one come back) or created; the current revision is the status's, else the update one;
2. status, from the pods observed (written only when it changed);
3. each ordinal in ``[start, start+replicas)``, lowest first: a missing pod is created (its
   claims first), a finished one deleted to be made again; with OrderedReady one step per
   sync and nothing past a pod that is not yet Running and Ready (available, with
   minReadySeconds) or still terminating; with Parallel every ordinal at once;
4. pods of ordinals beyond the range, highest first: deleted, with OrderedReady one at a
   time and only while every other pod is healthy (the first unhealthy one may go);
5. RollingUpdate: from the highest ordinal down to ``partition``, the first pod not of the
   update revision is deleted (it comes back at the update revision), one at a time, waiting
   for each to be healthy again; OnDelete: nothing, a pod deleted by hand comes back new;
6. claims' owner references follow the retention policy; old revisions beyond
   revisionHistoryLimit are deleted.

A recreated pod of an ordinal below the partition gets the current revision's template.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufleet.api.k8s import ControllerRevision, PersistentVolumeClaim, Pod
from gpufleet.client import objects
from gpufleet.controllers import history
from gpufleet.controllers._common import is_being_deleted, pod_available_at, status_dict
from gpufleet.controllers.actions import Actions, Create, Delete, Instant, Patch
from gpufleet.controllers.statefulset.model import (
    claim_body,
    claim_name,
    claim_owner_references,
    in_range,
    is_finished,
    is_healthy,
    ordinal_of,
    pod_body,
    replicas,
    revision_of,
    set_status,
    start_ordinal,
)

KIND = "StatefulSet"


@dataclass
class Observed:
    sts: Any
    pods: list[Any]  # the pods the set owns, in any phase
    claims: dict[str, Any] = field(default_factory=dict)  # the namespace's claims by name
    revisions: list[Any] = field(default_factory=list)  # the set's ControllerRevisions
    expectations_satisfied: bool = True


@dataclass
class Revisions:
    current: str
    current_template: dict[str, Any]
    update: str
    update_template: dict[str, Any]
    collision_count: int
    actions: Actions


def decide_revisions(sts: Any, revisions: list[Any]) -> Revisions:
    """The current and update revisions, and the writes that make the update one exist."""
    collision = (sts.status.collision_count if sts.status is not None else None) or 0
    template = history.template_dict(sts.spec.template)
    found = history.update_revision(sts, KIND, template, revisions, collision, hash_data=True)
    current, current_template = found.name, template
    wanted = sts.status.current_revision if sts.status is not None else None
    for r in revisions:
        if wanted and objects.name_of(r) == wanted:
            current, current_template = wanted, history.template_of(r)
    return Revisions(current, current_template, found.name, template, found.collision_count, found.actions)


def _pod_template(sts: Any, revs: Revisions, ordinal: int) -> tuple[dict[str, Any], str]:
    """The template (and revision) a new pod of ``ordinal`` is made from: the current one
    below the partition of a rolling update, else the update one."""
    strategy = sts.spec.update_strategy
    if strategy is not None and (strategy.type or "RollingUpdate") == "RollingUpdate":
        ru = strategy.rolling_update
        start = start_ordinal(sts)
        if ru is not None and ru.partition is not None:
            below = ordinal < start + ru.partition
        else:
            below = ordinal < start + ((sts.status.current_replicas or 0) if sts.status is not None else 0)
        if below:
            return revs.current_template, revs.current
    return revs.update_template, revs.update


class _Plan:
    def __init__(self, obs: Observed, revs: Revisions, now: Instant) -> None:
        self.obs = obs
        self.sts = obs.sts
        self.revs = revs
        self.now = now
        self.actions = revs.actions
        self.min_ready = self.sts.spec.min_ready_seconds or 0
        self.ns = objects.namespace_of(self.sts)

    def healthy(self, pod: Any) -> bool:
        return is_healthy(pod, self.min_ready, self.now.wall)

    def create(self, ordinal: int) -> bool:
        """Create the pod of ``ordinal`` (after its missing claims). False when one of its
        claims is being deleted: the pod waits for it to go."""
        sts = self.sts
        for tpl in sts.spec.volume_claim_templates or []:
            name = claim_name(tpl.metadata.name, sts, ordinal)
            claim = self.obs.claims.get(name)
            if claim is not None:
                if is_being_deleted(claim):
                    self.actions.reason = "WaitingForClaim"
                    return False
                continue
            body = claim_body(sts, tpl, ordinal)
            refs = claim_owner_references(sts, body, None, False)
            if refs:
                body["metadata"]["ownerReferences"] = refs
            self.actions.creates.append(Create(body, on_exists="ignore", success_reason="SuccessfulCreate",
                                               failure_reason="FailedCreate"))
        template, revision = _pod_template(sts, self.revs, ordinal)
        self.actions.creates.append(Create(pod_body(sts, template, revision, ordinal), expect=True,
                                           on_exists="ignore", success_reason="SuccessfulCreate",
                                           failure_reason="FailedCreate"))
        return True

    def delete(self, pod: Any) -> None:
        self.actions.deletes.append(Delete(Pod, objects.name_of(pod), self.ns, uid=objects.uid_of(pod), expect=True,
                                           success_reason="SuccessfulDelete", failure_reason="FailedDelete"))

    def fix_claims(self, pod: Any, condemned: bool) -> None:
        ordinal = ordinal_of(self.sts, pod)
        for tpl in self.sts.spec.volume_claim_templates or []:
            claim = self.obs.claims.get(claim_name(tpl.metadata.name, self.sts, ordinal))
            if claim is None or is_being_deleted(claim):
                continue
            want = claim_owner_references(self.sts, claim, pod, condemned)
            have = [r.to_dict() for r in objects.meta(claim, "ownerReferences") or []]
            if sorted(map(_ref_key, want)) != sorted(map(_ref_key, have)):
                self.actions.patches.append(Patch(PersistentVolumeClaim, objects.name_of(claim), self.ns,
                                                  {"metadata": {"ownerReferences": want or None}}))


def _ref_key(ref: dict[str, Any]) -> tuple[str, ...]:
    return (ref.get("apiVersion", ""), ref.get("kind", ""), ref.get("name", ""), ref.get("uid", ""))


def availability_recheck(pods: list[Any], min_ready: int, now: float) -> float | None:
    if not min_ready:
        return None
    pending = [at for p in pods if (at := pod_available_at(p, min_ready)) is not None and at >= now]
    return max(min(pending) - now, 0.0) + 0.001 if pending else None


def decide(obs: Observed, now: Instant) -> Actions:
    sts = obs.sts
    revs = decide_revisions(sts, obs.revisions)
    plan = _Plan(obs, revs, now)
    actions = plan.actions
    own = [p for p in obs.pods if ordinal_of(sts, p) is not None]
    status = set_status(sts, own, revs.current, revs.update, revs.collision_count, plan.min_ready, now.wall)
    if status != status_dict(sts):
        actions.status = status
    actions.requeue(availability_recheck(own, plan.min_ready, now.wall))
    if not obs.expectations_satisfied:
        actions.reason = "WaitingForCache"
        return actions
    if is_being_deleted(sts):
        actions.reason = "Deleting"
        return actions
    _truncate_history(obs, revs, actions)
    replica_pods: dict[int, Any] = {}
    condemned: list[Any] = []
    for p in own:
        ordinal = ordinal_of(sts, p)
        assert ordinal is not None
        if in_range(sts, ordinal):
            replica_pods[ordinal] = p
        else:
            condemned.append(p)
    condemned.sort(key=lambda p: ordinal_of(sts, p) or 0)
    for p in replica_pods.values():
        plan.fix_claims(p, False)
    for p in condemned:
        plan.fix_claims(p, True)
    if not _replicas(plan, replica_pods):
        return actions
    if not _scale_down(plan, replica_pods, condemned):
        return actions
    _rolling_update(plan, replica_pods)
    if not actions.reason:
        actions.reason = "InSync"
    return actions


def _replicas(plan: _Plan, replica_pods: dict[int, Any]) -> bool:
    """Create, replace or wait for the replicas in ordinal order; False when this sync stops here."""
    sts, actions = plan.sts, plan.actions
    monotonic = (sts.spec.pod_management_policy or "OrderedReady") != "Parallel"
    start = start_ordinal(sts)
    for ordinal in range(start, start + replicas(sts)):
        pod = replica_pods.get(ordinal)
        if pod is None:
            created = plan.create(ordinal)
            if not created or monotonic:
                actions.reason = actions.reason or "CreatePod"
                return False
            actions.reason = "CreatePod"
            continue
        if is_finished(pod) and not is_being_deleted(pod):
            plan.delete(pod)
            actions.reason = "ReplaceFinished"
            if monotonic:
                return False
            continue
        if is_being_deleted(pod):
            if monotonic:
                actions.reason = "WaitingForTermination"
                return False
            continue
        if not plan.healthy(pod) and monotonic:
            actions.reason = "WaitingForReady"
            return False
    return True


def _scale_down(plan: _Plan, replica_pods: dict[int, Any], condemned: list[Any]) -> bool:
    sts, actions = plan.sts, plan.actions
    monotonic = (sts.spec.pod_management_policy or "OrderedReady") != "Parallel"
    first_unhealthy = None
    for p in [*(replica_pods[o] for o in sorted(replica_pods)), *reversed(condemned)]:
        if not plan.healthy(p):
            first_unhealthy = p
            break
    for p in reversed(condemned):
        if is_being_deleted(p):
            if monotonic:
                actions.reason = "WaitingForTermination"
                return False
            continue
        if monotonic and not plan.healthy(p) and p is not first_unhealthy:
            actions.reason = "WaitingForReady"
            return False
        plan.delete(p)
        actions.reason = "ScaleDown"
        if monotonic:
            return False
    return True


def _rolling_update(plan: _Plan, replica_pods: dict[int, Any]) -> None:
    sts, actions = plan.sts, plan.actions
    strategy = sts.spec.update_strategy
    if strategy is not None and strategy.type == "OnDelete":
        return
    ru = strategy.rolling_update if strategy is not None else None
    start = start_ordinal(sts)
    partition = (ru.partition or 0) if ru is not None else 0
    for ordinal in range(start + replicas(sts) - 1, start + partition - 1, -1):
        pod = replica_pods.get(ordinal)
        if pod is None:
            actions.reason = "WaitingForReady"
            return
        if revision_of(pod) != plan.revs.update and not is_being_deleted(pod):
            plan.delete(pod)
            actions.reason = "RollingUpdate"
            return
        if not plan.healthy(pod):
            actions.reason = "WaitingForReady"
            return


def _truncate_history(obs: Observed, revs: Revisions, actions: Actions) -> None:
    live = {revs.current, revs.update} | {revision_of(p) for p in obs.pods}
    limit = obs.sts.spec.revision_history_limit
    for r in history.to_truncate(obs.revisions, live, 10 if limit is None else limit):
        actions.deletes.append(Delete(ControllerRevision, objects.name_of(r), objects.namespace_of(r),
                                      uid=objects.uid_of(r), must=False))
