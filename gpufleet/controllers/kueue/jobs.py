"""The job reconciler: one Workload per queued job, and the job suspended, started with its
flavor's node labels, or put back as it was, as the Workload's admission says.

``decide_job(observed, now)`` is the whole decision, touching nothing: the job (a wire dict),
its Workload, how many of its pods are still running, the flavors and the priority in; a
``JobDecision`` out (the job's Actions: its update and Event, the Workload to create; and the
Workload's new status). ``JobSync._sync_job`` gathers what it reads and applies the decision.

| the job and its Workload                           | decision                                  |
|----------------------------------------------------|-------------------------------------------|
| no Workload, job finished                          | nothing (``finished-unqueued``)           |
| no Workload                                        | suspend the job if it runs; create it     |
| job finished                                       | Workload Finished=True (``finished``)     |
| admitted, not evicted                              | start the job if suspended (``admitted``) |
| not admitted or evicted, job running               | suspend the job (``suspend``)             |
| admitted and evicted, job suspended, pods left     | wait for them (``evicted-pods-left``)     |
| admitted and evicted, job suspended, no pods left  | put the templates back, release the quota |
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
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
from gpufleet.controllers.actions import Actions, Create, Event, Update, apply
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

WAITING = "waiting for its queue to admit it"
CREATED_WORKLOAD = "workload"  # the tag of the Workload's create


@dataclass(frozen=True)
class JobObserved:
    """What one sync of a queued job reads. ``job``: its wire dict; ``workload``: its Workload
    (a model, read through the controller's own writes), None when it has none; ``live_pods``:
    its pods not yet terminal; ``flavors``: ResourceFlavors by name; ``priority``: the priority
    and PriorityClass name of its pod sets (used when the Workload is created)."""

    kind: JobKind
    job: dict[str, Any]
    queue: str
    workload: Any | None = None
    live_pods: int = 0
    flavors: Mapping[str, Any] = field(default_factory=dict)
    priority: tuple[int, str] = (0, "")


@dataclass
class JobDecision:
    """``job``: the Actions about the job (its update with its Event, the Workload to create);
    ``workload``: the Actions about its Workload (its new status, when it changes)."""

    job: Actions = field(default_factory=Actions)
    workload: Actions = field(default_factory=Actions)

    @property
    def reason(self) -> str:
        return self.job.reason


def decide_job(observed: JobObserved, now: str) -> JobDecision:
    """The decision for one queued job (see the table in the module's docstring)."""
    kind, wire, wl = observed.kind, observed.job, observed.workload
    out = JobDecision()
    finished = kind.finished(wire)
    if wl is None:
        if finished:
            out.job.reason = "finished-unqueued"
            return out
        out.job.reason = "create-workload"
        if not kind.suspended(wire):
            out.job.updates.append(suspended_update(kind, wire, WAITING))
        out.job.creates.append(Create(workload_body(kind, wire, observed.queue, observed.priority),
                                      on_exists="ignore", tag=CREATED_WORKLOAD))
        return out
    status = status_dict(wl)
    if finished:
        out.job.reason = "finished"
        conditions = _conditions(status)
        if _set(conditions, kq.FINISHED, "True", "Succeeded" if finished in ("Complete", "Succeeded")
                else "Failed", f"Job finished: {finished}", now):
            out.workload.status = {**status, "conditions": conditions}
        return out
    admitted = status.get("admission") is not None and _is_true(status, kq.QUOTA_RESERVED)
    evicted = _is_true(status, kq.EVICTED)
    if admitted and not evicted:
        out.job.reason = "admitted"
        if kind.suspended(wire):
            out.job.updates.append(started_update(kind, wire, status, observed.flavors))
        return out
    if not kind.suspended(wire):
        out.job.reason = "suspend"
        why = (find_condition(status.get("conditions") or [], kq.EVICTED) or {}).get("message", "") or WAITING
        out.job.updates.append(suspended_update(kind, wire, why))
        return out
    if not (admitted and evicted):
        out.job.reason = "waiting"
        return out
    # The quota goes back once the last pod of the job is gone.
    if observed.live_pods:
        out.job.reason = "evicted-pods-left"
        return out
    out.job.reason = "evicted-release"
    restored = restored_body(kind, wire, wl)
    if restored is not None:
        out.job.updates.append(Update(restored))
    conditions = _conditions(status)
    _set(conditions, kq.QUOTA_RESERVED, "False", "Pending", "Evicted: waiting to be admitted again", now)
    _set(conditions, kq.ADMITTED, "False", "NoReservation", "The workload has no reservation", now)
    new = {k: v for k, v in status.items() if k != "admission"}
    new["conditions"] = conditions
    out.workload.status = new
    return out


def workload_body(kind: JobKind, job: dict[str, Any], queue: str, priority: tuple[int, str]) -> dict[str, Any]:
    """The Workload of ``job``: its pod sets, queue and priority, owned by the job."""
    value, pc_name = priority
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
        "spec": {"queueName": queue, "podSets": kind.pod_sets(job), "priority": value, "active": True},
    }
    if pc_name:
        body["spec"]["priorityClassName"] = pc_name
        body["spec"]["priorityClassSource"] = PRIORITY_CLASS_SOURCE
    return body


def suspended_update(kind: JobKind, job: dict[str, Any], why: str) -> Update:
    body = copy.deepcopy(job)
    kind.set_suspended(body, True)
    return Update(body, event=Event(NORMAL, "Stopped", why))


def started_update(kind: JobKind, job: dict[str, Any], wl_status: dict[str, Any],
                   flavors: Mapping[str, Any]) -> Update:
    """Admitted: the pods go where the flavor is, then the job runs."""
    body = copy.deepcopy(job)
    admission = wl_status.get("admission") or {}
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
    return Update(body, event=Event(NORMAL, "Started", f"Admitted by clusterQueue {admission.get('clusterQueue', '')}"))


def restored_body(kind: JobKind, job: dict[str, Any], wl: Any) -> dict[str, Any] | None:
    """The job with the node selectors and tolerations it had before it was admitted (from its
    Workload's pod sets); None when it has them already."""
    body = copy.deepcopy(job)
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
    return body if changed else None


class JobSync:
    """The job reconciler of KueueController: gather, ``decide_job``, apply."""

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

    def _observe_job(self, kind: JobKind, job: Any, queue: str) -> JobObserved:
        wire = _wire(job)
        wl = self._workload_for(job)
        live = [p for p in self.pods.by_index(CONTROLLER_UID_INDEX, objects.uid_of(job)) if not pod_is_terminal(p)]
        return JobObserved(
            kind=kind, job=wire, queue=queue, workload=wl, live_pods=len(live),
            flavors={objects.name_of(f): f for f in self.flavors.list()},
            priority=self._priority(kind.pod_sets(wire)) if wl is None else (0, ""),
        )

    async def _sync_job(self, kind: JobKind, job: Any, queue: str) -> Requeue | None:
        observed = self._observe_job(kind, job, queue)
        decision = decide_job(observed, now_text(self.clock))
        outcome = await apply(self.client, decision.job, owner=job, recorder=self.recorder)
        created = outcome.answers.get(CREATED_WORKLOAD)
        if created is not None:
            self._written[objects.object_key(created)] = self.client.decode(created)
            await self.recorder.record(job, NORMAL, "CreatedWorkload",
                                       f"Created Workload: {objects.namespace_of(job)}/{objects.name_of(created)}")
        if decision.workload.status is not None:
            written = await apply(self.client, decision.workload, owner=observed.workload)
            if written.owner is not None:
                self._written[objects.object_key(written.owner)] = self.client.decode(written.owner)
        return None

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
