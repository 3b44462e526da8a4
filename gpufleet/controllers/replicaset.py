"""ReplicaSet: keep ``spec.replicas`` pods from ``spec.template`` in existence.

As Kubernetes' replicaset controller does:
- pods are created from the template with a generated name ``<rs>-<5 chars>`` and an owner
  reference (controller, blockOwnerDeletion), in slow-start batches (1, 2, 4, ...), at most
  500 per sync; scale-down deletes the pods ranked cheapest to lose first (see
  ``_common.pod_deletion_rank``);
- expectations: after creating or deleting, the controller waits until its informer has seen
  every one of those pods before it acts on counts again, so a lagging cache never causes a
  second round of creates;
- only active pods count: finished ones (Succeeded/Failed) and ones being deleted are not
  replicas, so a failed pod is replaced at once (it is left in place, as Kubernetes leaves it
  for the pod garbage collector);
- orphans matching the selector are adopted, owned pods that stopped matching are released;
- status (replicas, fullyLabeledReplicas, readyReplicas, availableReplicas with
  minReadySeconds, observedGeneration, and a ReplicaFailure condition whose message is the
  API's answer when creating or deleting failed) is computed by ``replica_set_status`` and
  written only when it changed.

Not done: the terminatingReplicas status field, and pod deletion cost beyond reading its
annotation.
"""

from __future__ import annotations

import logging
from typing import Any

from gpufleet.api.k8s import Pod, ReplicaSet
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import ApiError
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.controllers._common import (
    BURST_REPLICAS,
    CONTROLLER_UID_INDEX,
    RefManager,
    error_text,
    find_condition,
    generate_name_prefix,
    index_by_controller,
    is_being_deleted,
    owner_reference,
    pod_available_at,
    pod_from_template,
    pod_is_active,
    pod_is_available,
    pod_is_ready,
    pods_to_delete,
    remove_condition,
    selector_from,
    set_condition,
    status_dict,
)
from gpufleet.controllers.actions import Actions, Create, Delete, Instant
from gpufleet.controllers.base import OwnerController

log = logging.getLogger(__name__)

API_VERSION = "apps/v1"
KIND = "ReplicaSet"


def replica_set_status(
    rs: Any, pods: list[Any], manage_error: BaseException | None, now: float, now_str: str
) -> dict[str, Any]:
    """The status a ReplicaSet should have, given its active pods and how managing them went."""
    template_meta = rs.spec.template.metadata if rs.spec.template is not None else None
    template_labels = (template_meta.labels if template_meta is not None else None) or {}
    min_ready = rs.spec.min_ready_seconds or 0
    fully_labeled = ready = available = 0
    for pod in pods:
        labels = objects.labels_of(pod)
        if all(labels.get(k) == v for k, v in template_labels.items()):
            fully_labeled += 1
        if pod_is_ready(pod):
            ready += 1
            if pod_is_available(pod, min_ready, now):
                available += 1
    current = status_dict(rs)
    conditions = [dict(c) for c in current.get("conditions") or []]
    failure = find_condition(conditions, "ReplicaFailure")
    if manage_error is not None and failure is None:
        diff = len(pods) - (rs.spec.replicas or 0)
        reason = "FailedCreate" if diff < 0 else "FailedDelete"
        set_condition(conditions, "ReplicaFailure", "True", reason, error_text(manage_error), now_str)
    elif manage_error is None and failure is not None:
        remove_condition(conditions, "ReplicaFailure")
    status: dict[str, Any] = {"replicas": len(pods)}
    if fully_labeled:
        status["fullyLabeledReplicas"] = fully_labeled
    if ready:
        status["readyReplicas"] = ready
    if available:
        status["availableReplicas"] = available
    status["observedGeneration"] = objects.meta(rs, "generation") or 1
    if conditions:
        status["conditions"] = conditions
    return status


def decide_replicas(rs: Any, pods: list[Any], related: list[Any], *, expectations_satisfied: bool = True,
                    burst_replicas: int = BURST_REPLICAS) -> Actions:
    """Create or delete pods so that ``pods`` (the active pods the set owns) number
    ``spec.replicas``: at most ``burst_replicas`` per sync, the pods cheapest to lose first
    (``related``: the pods of sibling sets, for the pods-per-node rank). Nothing while the
    cache has not seen the last sync's creates and deletes, or while the set is being deleted."""
    if not expectations_satisfied:
        return Actions(reason="WaitingForCache")
    if is_being_deleted(rs):
        return Actions(reason="Deleting")
    want = rs.spec.replicas if rs.spec.replicas is not None else 1
    diff = len(pods) - want
    if diff < 0:
        body = pod_from_template(
            rs.spec.template,
            namespace=objects.namespace_of(rs),
            generate_name=generate_name_prefix(objects.name_of(rs)),
            owner_ref=owner_reference(rs, API_VERSION, KIND),
        )
        create = Create(body, expect=True, success_reason="SuccessfulCreate", failure_reason="FailedCreate")
        return Actions(creates=[create] * min(-diff, burst_replicas), reason="ScaleUp")
    if diff > 0:
        victims = pods_to_delete(pods, min(diff, burst_replicas), related)
        deletes = [Delete(Pod, objects.name_of(p), objects.namespace_of(p), uid=objects.uid_of(p), expect=True,
                          success_reason="SuccessfulDelete", failure_reason="FailedDelete") for p in victims]
        return Actions(deletes=deletes, reason="ScaleDown")
    return Actions(reason="InSync")


def decide_status(rs: Any, pods: list[Any], manage_error: BaseException | None, now: Instant) -> Actions:
    """The status to write (None when it is the set's status already) and when to look again
    for pods that become available with minReadySeconds."""
    status = replica_set_status(rs, pods, manage_error, now.wall, now.text)
    actions = Actions(status=status if status != status_dict(rs) else None, reason="Status")
    actions.requeue(availability_recheck(rs, pods, now.wall))
    return actions


def availability_recheck(rs: Any, pods: list[Any], now: float) -> float | None:
    """Seconds until the next ready pod counts as available, None when none is waiting."""
    min_ready = rs.spec.min_ready_seconds or 0
    if not min_ready:
        return None
    pending = [at for p in pods if (at := pod_available_at(p, min_ready)) is not None and at >= now]
    if not pending:
        return None
    return max(min(pending) - now, 0.0) + 0.001


class ReplicaSetController(OwnerController):
    name = "replicaset"
    kind = KIND
    owner_model = ReplicaSet

    def __init__(
        self, client: Client, informers: SharedInformerFactory, *,
        burst_replicas: int = BURST_REPLICAS,
        **kwargs: Any,
    ) -> None:
        super().__init__(client, informers, **kwargs)
        self.burst_replicas = burst_replicas
        self.rs_informer = self.owners
        self.pod_informer = informers.informer(Pod)
        index_by_controller(self.rs_informer)
        index_by_controller(self.pod_informer)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self.child_deleted)

    # -- pod events -----------------------------------------------------------------------

    def _enqueue_matching(self, pod: Any) -> None:
        self.enqueue_matching(pod, lambda rs: selector_from(rs.spec.selector))

    def _pod_added(self, pod: Any) -> None:
        self.child_added(pod, lambda rs: selector_from(rs.spec.selector))

    def _pod_updated(self, old: Any, new: Any) -> None:
        if objects.resource_version_of(old) == objects.resource_version_of(new):
            return
        labels_changed = objects.labels_of(old) != objects.labels_of(new)
        if is_being_deleted(new):
            self.child_deleted(new)
            if labels_changed:
                self.child_deleted(old)
            return
        ref_changed = self.enqueue_old_owner(old, new)
        if objects.controller_ref(new) is not None:
            key = self.enqueue_owner(new)
            if key:
                rs = self.rs_informer.get(key)
                min_ready = (rs.spec.min_ready_seconds or 0) if rs is not None else 0
                if min_ready and not pod_is_ready(old) and pod_is_ready(new):
                    # Becoming available is a change no event announces.
                    self.queue.add_after(key, min_ready + 0.001)
            return
        if labels_changed or ref_changed:
            self._enqueue_matching(new)

    # -- sync -----------------------------------------------------------------------------

    async def sync(self, key: str, rs: Any) -> Requeue | None:
        needs_sync = self.expectations.satisfied(key)
        ns = objects.namespace_of(rs)
        selector = selector_from(rs.spec.selector)
        candidates = [p for p in self.pod_informer.by_index(NAMESPACE_INDEX, ns) if pod_is_active(p)]
        refs = RefManager(self.client, rs, API_VERSION, KIND, selector, Pod)
        try:
            pods = await refs.claim(candidates)
        except ApiError as e:
            log.info("replicaset %s: adopting or releasing pods failed: %s", key, e)
            return Requeue()

        manage = decide_replicas(rs, pods, self._related_pods(rs) if needs_sync else [],
                                 expectations_satisfied=needs_sync, burst_replicas=self.burst_replicas)
        manage_error = (await self.act(key, rs, manage, raise_errors=False)).error

        status = decide_status(rs, pods, manage_error, self.now())
        try:
            await self.act(key, rs, status)
        except ApiError as e:
            # A Conflict: the cache is behind a write; the event that follows requeues us.
            return self.retry_later(key, e, "status not written: ")

        if manage_error is not None:
            log.info("replicaset %s: %s", key, error_text(manage_error))
            return Requeue()
        return self.requeue(status)

    def _related_pods(self, rs: Any) -> list[Any]:
        """Pods of every replica set sharing this one's controller (one Deployment's old and
        new sets), so scale-down can prefer nodes where the workload is doubled up."""
        owner_uid = objects.field(objects.controller_ref(rs), "uid")
        if not owner_uid:
            return []
        out: list[Any] = []
        for sibling in self.rs_informer.by_index(CONTROLLER_UID_INDEX, owner_uid):
            out.extend(self.pod_informer.by_index(CONTROLLER_UID_INDEX, objects.uid_of(sibling)))
        return out
