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

import asyncio
import logging
from typing import Any

from gpufleet.api.k8s import Pod, ReplicaSet
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Controller, Requeue
from gpufleet.client.errors import ApiError, NotFound
from gpufleet.client.events import NORMAL, WARNING, EventRecorder
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.client.workqueue import WorkQueue
from gpufleet.controllers._common import (
    BURST_REPLICAS,
    CONTROLLER_UID_INDEX,
    Expectations,
    RefManager,
    error_text,
    find_condition,
    generate_name_prefix,
    index_by_controller,
    is_being_deleted,
    now_text,
    owner_reference,
    pod_available_at,
    pod_from_template,
    pod_is_active,
    pod_is_available,
    pod_is_ready,
    pods_to_delete,
    remove_condition,
    resolve_controller,
    selector_from,
    set_condition,
    slow_start_batch,
    status_dict,
    write_status,
)
from gpufleet.utils.clock import REAL_CLOCK, Clock

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


class ReplicaSetController:
    name = "replicaset"

    def __init__(
        self,
        client: Client,
        informers: SharedInformerFactory,
        *,
        clock: Clock = REAL_CLOCK,
        recorder: EventRecorder | None = None,
        workers: int = 2,
        burst_replicas: int = BURST_REPLICAS,
    ) -> None:
        self.client = client
        self.clock = clock
        self.recorder = recorder or EventRecorder(client, "replicaset-controller", clock=clock)
        self.burst_replicas = burst_replicas
        self.expectations = Expectations(clock)
        self.rs_informer = informers.informer(ReplicaSet)
        self.pod_informer = informers.informer(Pod)
        index_by_controller(self.rs_informer)
        index_by_controller(self.pod_informer)
        self.queue = WorkQueue(self.name, clock=clock)
        self.controller = Controller(self.name, self.reconcile, self.queue, workers=workers)
        self.controller.watch(self.rs_informer)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_deleted)

    async def start(self) -> None:
        await self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()

    # -- pod events -----------------------------------------------------------------------

    def _owner_key(self, pod: Any) -> str | None:
        rs = resolve_controller(self.rs_informer, pod, KIND)
        return objects.object_key(rs) if rs is not None else None

    def _enqueue_matching(self, pod: Any) -> None:
        # An orphan may be adopted by any replica set whose selector matches it.
        labels = objects.labels_of(pod)
        for rs in self.rs_informer.by_index(NAMESPACE_INDEX, objects.namespace_of(pod)):
            if selector_from(rs.spec.selector).matches(labels):
                self.queue.add(objects.object_key(rs))

    def _pod_added(self, pod: Any) -> None:
        if is_being_deleted(pod):
            self._pod_deleted(pod)
            return
        if objects.controller_ref(pod) is not None:
            key = self._owner_key(pod)
            if key:
                self.expectations.creation_observed(key)
                self.queue.add(key)
            return
        self._enqueue_matching(pod)

    def _pod_updated(self, old: Any, new: Any) -> None:
        if objects.resource_version_of(old) == objects.resource_version_of(new):
            return
        labels_changed = objects.labels_of(old) != objects.labels_of(new)
        if is_being_deleted(new):
            self._pod_deleted(new)
            if labels_changed:
                self._pod_deleted(old)
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
                rs = self.rs_informer.get(key)
                min_ready = (rs.spec.min_ready_seconds or 0) if rs is not None else 0
                if min_ready and not pod_is_ready(old) and pod_is_ready(new):
                    # Becoming available is a change no event announces.
                    self.queue.add_after(key, min_ready + 0.001)
            return
        if labels_changed or ref_changed:
            self._enqueue_matching(new)

    def _pod_deleted(self, pod: Any) -> None:
        key = self._owner_key(pod)
        if key:
            self.expectations.deletion_observed(key, objects.object_key(pod))
            self.queue.add(key)

    # -- sync -----------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Requeue | None:
        rs = self.rs_informer.get(key)
        if rs is None:
            self.expectations.forget(key)
            return None
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

        manage_error: BaseException | None = None
        if needs_sync and not is_being_deleted(rs):
            try:
                await self._manage_replicas(key, rs, pods)
            except ApiError as e:
                manage_error = e

        now = self.clock.now()
        status = replica_set_status(rs, pods, manage_error, now, now_text(self.clock))
        try:
            await write_status(self.client, rs, status)
        except NotFound:
            return None
        except ApiError as e:
            # A Conflict: the cache is behind a write; the event that follows requeues us.
            log.info("replicaset %s: status not written: %s", key, e)
            return Requeue()

        if manage_error is not None:
            log.info("replicaset %s: %s", key, error_text(manage_error))
            return Requeue()
        return self._requeue_for_availability(rs, pods, now)

    def _requeue_for_availability(self, rs: Any, pods: list[Any], now: float) -> Requeue | None:
        min_ready = rs.spec.min_ready_seconds or 0
        if not min_ready:
            return None
        pending = [at for p in pods if (at := pod_available_at(p, min_ready)) is not None and at >= now]
        if not pending:
            return None
        return Requeue(after=max(min(pending) - now, 0.0) + 0.001)

    async def _manage_replicas(self, key: str, rs: Any, pods: list[Any]) -> None:
        want = rs.spec.replicas if rs.spec.replicas is not None else 1
        diff = len(pods) - want
        if diff < 0:
            await self._create_pods(key, rs, min(-diff, self.burst_replicas))
        elif diff > 0:
            await self._delete_pods(key, rs, pods, min(diff, self.burst_replicas))

    async def _create_pods(self, key: str, rs: Any, count: int) -> None:
        ns = objects.namespace_of(rs)
        body = pod_from_template(
            rs.spec.template,
            namespace=ns,
            generate_name=generate_name_prefix(objects.name_of(rs)),
            owner_ref=owner_reference(rs, API_VERSION, KIND),
        )
        self.expectations.expect_creations(key, count)

        async def create_one() -> None:
            try:
                pod = await self.client.create(body, ns, raw=True)
            except ApiError as e:
                await self.recorder.record(rs, WARNING, "FailedCreate", f"Error creating: {error_text(e)}")
                raise
            await self.recorder.record(rs, NORMAL, "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}")

        created, error = await slow_start_batch(count, create_one)
        # Pods never created will never be observed.
        for _ in range(count - created):
            self.expectations.creation_observed(key)
        if error is not None:
            raise error

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

    async def _delete_pods(self, key: str, rs: Any, pods: list[Any], count: int) -> None:
        victims = pods_to_delete(pods, count, self._related_pods(rs))
        self.expectations.expect_deletions(key, [objects.object_key(p) for p in victims])

        async def delete_one(pod: Any) -> ApiError | None:
            name, ns = objects.name_of(pod), objects.namespace_of(pod)
            try:
                await self.client.delete(Pod, name, ns, preconditions_uid=objects.uid_of(pod))
            except NotFound:
                self.expectations.deletion_observed(key, objects.object_key(pod))
                return None
            except ApiError as e:
                # Never deleted, so its deletion will never be observed.
                self.expectations.deletion_observed(key, objects.object_key(pod))
                await self.recorder.record(rs, WARNING, "FailedDelete", f"Error deleting: {error_text(e)}")
                return e
            await self.recorder.record(rs, NORMAL, "SuccessfulDelete", f"Deleted pod: {name}")
            return None

        errors = [e for e in await asyncio.gather(*(delete_one(p) for p in victims)) if e is not None]
        if errors:
            raise errors[0]
