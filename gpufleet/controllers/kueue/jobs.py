"""The job reconciler: one Workload per queued job, and the job suspended, started with its
flavor's node labels, or put back as it was, as the Workload's admission says."""

from __future__ import annotations

import logging
from typing import Any

from gpufleet.api import kueue as kq
from gpufleet.client import objects
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import ApiError, Conflict, NotFound
from gpufleet.client.events import NORMAL
from gpufleet.controllers._common import (
    CONTROLLER_UID_INDEX,
    find_condition,
    is_being_deleted,
    now_text,
    pod_is_terminal,
    status_dict,
)
from gpufleet.controllers.kueue.kinds import (
    JOB_UID_LABEL,
    PRIORITY_CLASS_SOURCE,
    JobKind,
    _conditions,
    _is_true,
    _set,
    _wire,
    workload_name,
)

log = logging.getLogger(__name__)


class JobSync:
    """The job reconciler of KueueController."""

    # -- jobs -------------------------------------------------------------------------------------

    async def reconcile_job(self, key: str) -> Requeue | None:
        kind_name, _, obj_key = key.partition(":")
        kind = self.kinds[kind_name]
        job = self.job_informers[kind_name].get(obj_key)
        if job is None or is_being_deleted(job):
            return None
        queue = objects.labels_of(job).get(kq.QUEUE_NAME_LABEL)
        if not queue:
            return None
        try:
            return await self._sync_job(kind, job, queue)
        except (Conflict, NotFound):
            return Requeue(after=0.05)
        except ApiError as e:
            log.info("kueue: job %s: %s", key, e)
            return Requeue()

    async def _sync_job(self, kind: JobKind, job: Any, queue: str) -> Requeue | None:
        wire = _wire(job)
        wl = self._workload_for(job)
        finished = kind.finished(wire)
        if wl is None:
            if finished:
                return None
            if not kind.suspended(wire):
                await self._suspend(kind, job, "waiting for its queue to admit it")
            await self._create_workload(kind, job, queue)
            return None
        status = status_dict(wl)
        now = now_text(self.clock)
        if finished:
            conditions = _conditions(status)
            if _set(conditions, kq.FINISHED, "True", "Succeeded" if finished in ("Complete", "Succeeded")
                    else "Failed", f"Job finished: {finished}", now):
                await self._write_status(wl, {**status, "conditions": conditions})
            return None
        admitted = status.get("admission") is not None and _is_true(status, kq.QUOTA_RESERVED)
        evicted = _is_true(status, kq.EVICTED)
        if admitted and not evicted:
            if kind.suspended(wire):
                await self._start(kind, job, wl)
            return None
        if not kind.suspended(wire):
            await self._suspend(kind, job, (find_condition(status.get("conditions") or [], kq.EVICTED) or {}).get(
                "message", "") or "waiting for its queue to admit it")
            return None
        if admitted and evicted:
            # The quota goes back once the last pod of the job is gone.
            pods = [p for p in self.pods.by_index(CONTROLLER_UID_INDEX, objects.uid_of(job)) if not pod_is_terminal(p)]
            if pods:
                return None
            await self._restore(kind, job, wl)
            conditions = _conditions(status)
            _set(conditions, kq.QUOTA_RESERVED, "False", "Pending", "Evicted: waiting to be admitted again", now)
            _set(conditions, kq.ADMITTED, "False", "NoReservation", "The workload has no reservation", now)
            new = {k: v for k, v in status.items() if k != "admission"}
            new["conditions"] = conditions
            await self._write_status(wl, new)
        return None

    async def _create_workload(self, kind: JobKind, job: Any, queue: str) -> None:
        wire = _wire(job)
        pod_sets = kind.pod_sets(wire)
        priority, pc_name = self._priority(pod_sets)
        body: dict[str, Any] = {
            "apiVersion": kq.API_VERSION,
            "kind": "Workload",
            "metadata": {
                "name": workload_name(kind, job),
                "namespace": objects.namespace_of(job),
                "labels": {JOB_UID_LABEL: objects.uid_of(job)},
                "ownerReferences": [{
                    "apiVersion": kind.api_version, "kind": kind.kind, "name": objects.name_of(job),
                    "uid": objects.uid_of(job), "controller": True, "blockOwnerDeletion": True,
                }],
            },
            "spec": {"queueName": queue, "podSets": pod_sets, "priority": priority, "active": True},
        }
        if pc_name:
            body["spec"]["priorityClassName"] = pc_name
            body["spec"]["priorityClassSource"] = PRIORITY_CLASS_SOURCE
        try:
            created = await self.client.create(body)
        except ApiError as e:
            if e.code == 409:
                return
            raise
        self._written[objects.object_key(created)] = created
        await self.recorder.record(job, NORMAL, "CreatedWorkload",
                                   f"Created Workload: {objects.namespace_of(job)}/{objects.name_of(created)}")

    def _priority(self, pod_sets: list[dict[str, Any]]) -> tuple[int, str]:
        name = ""
        for ps in pod_sets:
            name = ((ps.get("template") or {}).get("spec") or {}).get("priorityClassName") or name
        if name:
            pc = self.priority_classes.get(name)
            return (int(pc.value) if pc is not None else 0), name
        for pc in self.priority_classes.list():
            if pc.global_default:
                return int(pc.value), objects.name_of(pc)
        return 0, ""

    async def _suspend(self, kind: JobKind, job: Any, why: str) -> None:
        body = _wire(job)
        kind.set_suspended(body, True)
        await self.client.update(body)
        await self.recorder.record(job, NORMAL, "Stopped", why)

    async def _start(self, kind: JobKind, job: Any, wl: Any) -> None:
        """Admitted: the pods go where the flavor is, then the job runs."""
        body = _wire(job)
        admission = status_dict(wl).get("admission") or {}
        flavors = {objects.name_of(f): f for f in self.flavors.list()}
        templates = kind.templates(body)
        for psa in admission.get("podSetAssignments") or []:
            template = templates.get(psa.get("name"))
            if template is None:
                continue
            labels: dict[str, str] = {}
            tolerations: list[dict[str, Any]] = []
            for flavor_name in dict.fromkeys((psa.get("flavors") or {}).values()):
                rf = flavors.get(flavor_name)
                if rf is not None and rf.spec is not None:
                    labels.update(rf.spec.node_labels or {})
                    tolerations.extend(t.to_dict() for t in rf.spec.tolerations or ())
            spec = template.setdefault("spec", {})
            if labels:
                spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **labels}
            if tolerations:
                have = spec.get("tolerations") or []
                spec["tolerations"] = have + [t for t in tolerations if t not in have]
        kind.set_suspended(body, False)
        await self.client.update(body)
        await self.recorder.record(job, NORMAL, "Started",
                                   f"Admitted by clusterQueue {admission.get('clusterQueue', '')}")

    async def _restore(self, kind: JobKind, job: Any, wl: Any) -> None:
        """Put back the node selectors the job had before it was admitted."""
        body = _wire(job)
        original = {ps.name: (ps.template.spec.to_dict() if ps.template.spec is not None else {})
                    for ps in (wl.spec.pod_sets if wl.spec is not None else [])}
        changed = False
        for name, template in kind.templates(body).items():
            if name not in original:
                continue
            spec = template.setdefault("spec", {})
            for field_name in ("nodeSelector", "tolerations"):
                want = original[name].get(field_name)
                if spec.get(field_name) != want:
                    if want:
                        spec[field_name] = want
                    else:
                        spec.pop(field_name, None)
                    changed = True
        if changed:
            await self.client.update(body)
