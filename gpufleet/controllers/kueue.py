"""Team queues (Kueue's kueue.x-k8s.io/v1beta1): jobs labelled ``kueue.x-k8s.io/queue-name``
wait, suspended, until their ClusterQueue admits them.

Three loops, as in Kueue:

- the job reconciler keeps one Workload per queued job (batch/v1 Job, kubeflow.org/v1
  PyTorchJob): created from the job's pod sets, owned by the job. When the Workload is
  admitted it writes the flavor's node labels into the job's pod templates and unsuspends
  it; when the Workload is evicted (preempted) it suspends the job, waits for its pods to be
  gone (the whole gang), puts the templates back and releases the quota; when the job
  finishes it marks the Workload Finished;
- the admission cycle (one at a time) reads queues, flavors, nodes, pods and Workloads from
  the informers, runs ``gpufleet.queueing.admission.schedule`` and writes what it decided:
  ``status.admission`` with conditions QuotaReserved and Admitted, or Evicted and Preempted
  on the victims, or QuotaReserved=False whose reason says what the workload waits for
  (Quota, Shape, Priority, Preempting, Queued, Inadmissible) and whose message says exactly;
- queue status: pending, reserving and admitted counts, flavor usage, fair share, and how
  many pending workloads wait for what (``status.pendingReasons``, gpufleet's addition).

The API server creates queued jobs suspended (``gpufleet.apiserver.admission.queues``); a job that
is running without an admitted Workload is suspended here as well.

Resources a ClusterQueue does not cover are not counted against it (Kueue refuses such
workloads); GPUs are what the queues are for.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gpufleet.api import kueue as kq
from gpufleet.api.gpu import (
    DEFAULT_GROUP,
    GPU_INDICES_ANNOTATION,
    GPU_RESOURCE,
    GPU_TOPOLOGY_ANNOTATION,
    GPUS_ANNOTATION,
    SAME_GROUP,
    parse_gpu_indices,
    parse_gpus_annotation,
)
from gpufleet.api.k8s import Job, Namespace, Node, Pod, PodSpec, PriorityClass
from gpufleet.api.podresources import pod_gpu_request, pod_requests
from gpufleet.api.quantity import parse_quantity, whole_amount
from gpufleet.api.selectors import LabelSelector
from gpufleet.api.taints import NO_EXECUTE, NO_SCHEDULE, taint_tuples, toleration_tuples
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Controller, Requeue
from gpufleet.client.errors import ApiError, Conflict, NotFound
from gpufleet.client.events import NORMAL, EventRecorder
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.client.workqueue import WorkQueue
from gpufleet.controllers._common import (
    CONTROLLER_UID_INDEX,
    controller_uid,
    find_condition,
    index_by_controller,
    is_being_deleted,
    now_text,
    pod_is_terminal,
    status_dict,
    timestamp,
)
from gpufleet.queueing import admission as adm
from gpufleet.utils.clock import REAL_CLOCK, Clock, rfc3339

log = logging.getLogger(__name__)

CYCLE = "cycle"
OWNER_UID_INDEX = "kueueOwnerUID"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PRIORITY_CLASS_SOURCE = "scheduling.k8s.io/priorityclass"


# -- the kinds of job a queue can hold ------------------------------------------------------------


@dataclass(frozen=True)
class JobKind:
    """How the controller reads and steers one kind of job."""

    kind: str
    api_version: str
    model: Any
    suspend_path: tuple[str, ...]
    pod_sets: Callable[[dict[str, Any]], list[dict[str, Any]]]  # wire job -> wire podSets
    templates: Callable[[dict[str, Any]], dict[str, dict[str, Any]]]  # pod set name -> template (in place)
    finished: Callable[[dict[str, Any]], str | None]
    pod_set_of: Callable[[Any], str]

    @property
    def prefix(self) -> str:
        return self.kind.lower()

    def suspended(self, job: dict[str, Any]) -> bool:
        node: Any = job
        for key in self.suspend_path:
            node = (node or {}).get(key) if isinstance(node, dict) else None
        return bool(node)

    def set_suspended(self, job: dict[str, Any], value: bool) -> None:
        node = job
        for key in self.suspend_path[:-1]:
            node = node.setdefault(key, {})
        node[self.suspend_path[-1]] = value


def _true_condition_type(job: dict[str, Any], types: tuple[str, ...]) -> str | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in types and c.get("status") == "True":
            return c["type"]
    return None


def _batch_pod_sets(job: dict[str, Any]) -> list[dict[str, Any]]:
    spec = job.get("spec") or {}
    count = spec.get("parallelism")
    count = 1 if count is None else count
    if spec.get("completions") is not None:
        count = min(count, spec["completions"])
    return [{"name": "main", "count": count, "template": spec.get("template") or {}}]


BATCH_JOB = JobKind(
    kind="Job",
    api_version="batch/v1",
    model=Job,
    suspend_path=("spec", "suspend"),
    pod_sets=_batch_pod_sets,
    templates=lambda job: {"main": job.setdefault("spec", {}).setdefault("template", {})},
    finished=lambda job: _true_condition_type(job, ("Complete", "Failed")),
    pod_set_of=lambda pod: "main",
)


def _pytorch_kind() -> JobKind | None:
    try:
        from gpufleet.api import kubeflow
    except ImportError:
        return None

    def pod_sets(job: dict[str, Any]) -> list[dict[str, Any]]:
        specs = (job.get("spec") or {}).get("pytorchReplicaSpecs") or {}
        out = []
        for rtype in kubeflow.REPLICA_TYPES:
            rs = specs.get(rtype)
            if rs is None:
                continue
            count = rs.get("replicas")
            out.append({"name": rtype.lower(), "count": 1 if count is None else count,
                        "template": rs.get("template") or {}})
        return out

    def templates(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
        specs = job.setdefault("spec", {}).setdefault("pytorchReplicaSpecs", {})
        return {rtype.lower(): rs.setdefault("template", {}) for rtype, rs in specs.items()}

    def pod_set_of(pod: Any) -> str:
        return objects.labels_of(pod).get("training.kubeflow.org/replica-type", "").lower()

    return JobKind(
        kind=kubeflow.KIND,
        api_version=kubeflow.API_VERSION,
        model=kubeflow.PyTorchJob,
        suspend_path=("spec", "runPolicy", "suspend"),
        pod_sets=pod_sets,
        templates=templates,
        finished=lambda job: _true_condition_type(job, ("Succeeded", "Failed")),
        pod_set_of=pod_set_of,
    )


def workload_name(kind: JobKind, job: Any) -> str:
    """Kueue's naming: <kind>-<job name>-<5 hex of a hash>, within 253 characters."""
    digest = hashlib.sha256(f"{kind.kind}/{objects.name_of(job)}/{objects.uid_of(job)}".encode()).hexdigest()[:5]
    return f"{kind.prefix}-{objects.name_of(job)}"[:240] + f"-{digest}"


# -- small helpers ----------------------------------------------------------------------------------


def _wire(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else obj.to_dict()


def _rv(obj: Any) -> int:
    try:
        return int(objects.resource_version_of(obj) or 0)
    except ValueError:
        return 0


def _conditions(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(c) for c in status.get("conditions") or []]


def _is_true(status: dict[str, Any], type_: str) -> bool:
    c = find_condition(status.get("conditions") or [], type_)
    return c is not None and c.get("status") == "True"


def _set(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str, now: str) -> bool:
    """metav1.Condition semantics: the transition time moves only when the status does."""
    current = find_condition(conditions, type_)
    if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (
            status, reason, message):
        return False
    new = {"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": now if current is None or current.get("status") != status
           else current.get("lastTransitionTime", now)}
    if current is not None:
        conditions.remove(current)
    conditions.append(new)
    return True


def _amounts(requests: Mapping[str, Fraction]) -> dict[str, int]:
    """A pod's requests as the queue counts them (cpu in millicores), zero ones left out."""
    return {k: n for k, v in requests.items() if (n := whole_amount(k, v))}


def _node_ready(node: Any) -> bool:
    status = getattr(node, "status", None)
    for c in (status.conditions if status is not None else None) or []:
        if c.type == "Ready":
            return c.status == "True"
    return False


def _node_groups(node: Any) -> dict[str, int]:
    annotations = objects.meta(node, "annotations") or {}
    devices = parse_gpus_annotation(annotations[GPUS_ANNOTATION]) if GPUS_ANNOTATION in annotations else None
    if devices:
        groups: dict[str, int] = {}
        for d in devices:
            if d.healthy:
                groups[d.group] = groups.get(d.group, 0) + 1
        return groups
    status = getattr(node, "status", None)
    alloc = (status.allocatable if status is not None else None) or {}
    gpus = int(parse_quantity(alloc.get(GPU_RESOURCE, "0")))
    return {DEFAULT_GROUP: gpus} if gpus else {}


def _pod_gpu_groups(pod: Any, node: Any | None) -> dict[str, int]:
    gpus = pod_gpu_request(pod)
    if not gpus:
        return {}
    annotations = objects.meta(pod, "annotations") or {}
    devices = None
    if node is not None:
        node_ann = objects.meta(node, "annotations") or {}
        if GPUS_ANNOTATION in node_ann:
            devices = parse_gpus_annotation(node_ann[GPUS_ANNOTATION])
    indices = parse_gpu_indices(annotations.get(GPU_INDICES_ANNOTATION, ""))
    if devices and indices:
        by_index = {d.index: d.group for d in devices}
        out: dict[str, int] = {}
        for i in indices:
            g = by_index.get(i, DEFAULT_GROUP)
            out[g] = out.get(g, 0) + 1
        return out
    if devices:
        # Not yet told which GPUs: charge the largest group (what the scheduler fills first).
        groups: dict[str, int] = {}
        for d in devices:
            groups[d.group] = groups.get(d.group, 0) + 1
        return {max(groups, key=lambda g: groups[g]): gpus}
    return {DEFAULT_GROUP: gpus}


# -- the controller -----------------------------------------------------------------------------------


class KueueController:
    name = "kueue"

    def __init__(
        self,
        client: Client,
        informers: SharedInformerFactory,
        *,
        clock: Clock = REAL_CLOCK,
        recorder: EventRecorder | None = None,
        workers: int = 2,
        fair_sharing: bool = False,
    ) -> None:
        self.client = client
        self.clock = clock
        self.recorder = recorder or EventRecorder(client, "kueue-admission", clock=clock)
        self.fair_sharing = fair_sharing
        self.kinds: dict[str, JobKind] = {"Job": BATCH_JOB}
        pytorch = _pytorch_kind()
        if pytorch is not None and client.registry.by_api_version_kind(pytorch.api_version, pytorch.kind):
            self.kinds[pytorch.kind] = pytorch
        self.job_informers = {k: informers.informer(kind.model) for k, kind in self.kinds.items()}
        self.workloads = informers.informer(kq.Workload)
        self.workloads.add_indexer(OWNER_UID_INDEX, controller_uid)
        self.cluster_queues = informers.informer(kq.ClusterQueue)
        self.local_queues = informers.informer(kq.LocalQueue)
        self.flavors = informers.informer(kq.ResourceFlavor)
        self.pods = informers.informer(Pod)
        index_by_controller(self.pods)
        self.nodes = informers.informer(Node)
        self.namespaces = informers.informer(Namespace)
        self.priority_classes = informers.informer(PriorityClass)

        self.job_queue = WorkQueue(f"{self.name}-jobs", clock=clock)
        self.jobs = Controller(f"{self.name}-jobs", self.reconcile_job, self.job_queue, workers=workers)
        for kind_name, informer in self.job_informers.items():
            informer.add_event_handler(*self._job_handlers(kind_name))
        self.workloads.add_event_handler(self._workload_event, lambda old, new: self._workload_event(new),
                                         self._workload_event)
        self.pods.add_event_handler(self._pod_event, self._pod_updated, self._pod_event)
        # One admission cycle at a time: it decides from the whole picture.
        self.cycle_queue = WorkQueue(f"{self.name}-cycle", clock=clock)
        self.cycles = Controller(f"{self.name}-cycle", self.run_cycle, self.cycle_queue, workers=1)
        for informer in (self.cluster_queues, self.local_queues, self.flavors, self.nodes, self.namespaces,
                         self.priority_classes):
            informer.add_event_handler(self._poke, lambda old, new: self._poke(new), self._poke)
        # Writes not yet seen by the informer: key -> the object as written.
        self._written: dict[str, Any] = {}
        # Workload key -> wait kind last announced with an Event.
        self._announced: dict[str, str] = {}

    async def start(self) -> None:
        await self.jobs.start()
        await self.cycles.start()
        self.cycle_queue.add(CYCLE)

    async def stop(self) -> None:
        await self.cycles.stop()
        await self.jobs.stop()

    # -- events -----------------------------------------------------------------------------------

    def _job_handlers(self, kind_name: str) -> tuple[Callable, Callable, Callable]:
        def enqueue(obj: Any) -> None:
            self.job_queue.add(f"{kind_name}:{objects.object_key(obj)}")

        return enqueue, lambda old, new: enqueue(new), enqueue

    def _poke(self, _obj: Any = None) -> None:
        self.cycle_queue.add(CYCLE)

    def _workload_event(self, wl: Any) -> None:
        self._poke()
        ref = objects.controller_ref(wl)
        if ref is not None and objects.field(ref, "kind") in self.kinds:
            ns = objects.namespace_of(wl)
            self.job_queue.add(f"{objects.field(ref, 'kind')}:{ns}/{objects.field(ref, 'name')}")

    def _pod_event(self, pod: Any) -> None:
        ref = objects.controller_ref(pod)
        if ref is None or objects.field(ref, "kind") not in self.kinds:
            # Other pods matter only for the GPUs they hold.
            if getattr(pod.spec, "node_name", None):
                self._poke()
            return
        self._poke()
        self.job_queue.add(f"{objects.field(ref, 'kind')}:{objects.namespace_of(pod)}/{objects.field(ref, 'name')}")

    def _pod_updated(self, old: Any, new: Any) -> None:
        if (old.spec.node_name, getattr(old.status, "phase", None), is_being_deleted(old)) != (
                new.spec.node_name, getattr(new.status, "phase", None), is_being_deleted(new)):
            self._pod_event(new)

    # -- reading through our own writes -------------------------------------------------------------

    def _fresh(self, informer: Any, key: str) -> Any | None:
        cached = informer.get(key)
        mine = self._written.get(key)
        if mine is None:
            return cached
        if cached is None or _rv(cached) >= _rv(mine):
            self._written.pop(key, None)
            return cached
        return mine

    def _workload_for(self, job: Any) -> Any | None:
        found = self.workloads.by_index(OWNER_UID_INDEX, objects.uid_of(job))
        if not found:
            return None
        return self._fresh(self.workloads, objects.object_key(found[0]))

    async def _write_status(self, wl: Any, status: dict[str, Any]) -> Any:
        body = _wire(wl)
        body["status"] = status
        written = await self.client.update_status(body)
        self._written[objects.object_key(written)] = written
        return written

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

    # -- the admission cycle ------------------------------------------------------------------------

    async def run_cycle(self, _key: str) -> Requeue | None:
        try:
            return await self._cycle()
        except (Conflict, NotFound):
            return Requeue(after=0.05)

    def _snapshot(self) -> tuple[dict[str, adm.ClusterQueueInfo], dict[str, adm.FlavorInfo],
                                 list[adm.WorkloadInfo], list[adm.NodeInfo], dict[str, Any]]:
        flavors = {}
        for rf in self.flavors.list():
            labels = dict(rf.spec.node_labels or {}) if rf.spec is not None else {}
            tolerations = toleration_tuples(rf.spec.tolerations if rf.spec is not None else None)
            flavors[objects.name_of(rf)] = adm.FlavorInfo(objects.name_of(rf), labels, tolerations)
        queues = {objects.name_of(cq): self._queue_info(cq, flavors) for cq in self.cluster_queues.list()}

        nodes: dict[str, adm.NodeInfo] = {}
        node_objs = {objects.name_of(n): n for n in self.nodes.list()}
        for name, n in node_objs.items():
            if not _node_ready(n) or (n.spec is not None and n.spec.unschedulable):
                continue
            groups = _node_groups(n)
            if groups:
                taints = taint_tuples(n.spec.taints if n.spec else None, (NO_SCHEDULE, NO_EXECUTE))
                nodes[name] = adm.NodeInfo(name, objects.labels_of(n), groups, taints=taints)
        placed: dict[str, list[adm.Placement]] = {}
        bound_per_set: dict[str, dict[str, int]] = {}
        for pod in self.pods.list():
            node_name = pod.spec.node_name
            if not node_name or pod_is_terminal(pod):
                continue
            groups = _pod_gpu_groups(pod, node_objs.get(node_name))
            owner = controller_uid(pod)
            if node_name in nodes:
                used = nodes[node_name].used
                for g, n in groups.items():
                    used[g] = used.get(g, 0) + n
            if owner:
                if groups:
                    placed.setdefault(owner, []).append(adm.Placement(node_name, groups))
                ref = objects.controller_ref(pod)
                kind = self.kinds.get(objects.field(ref, "kind"))
                if kind is not None:
                    per = bound_per_set.setdefault(owner, {})
                    ps = kind.pod_set_of(pod)
                    per[ps] = per.get(ps, 0) + 1

        workloads: list[adm.WorkloadInfo] = []
        models: dict[str, Any] = {}
        for cached in self.workloads.list():
            key = objects.object_key(cached)
            wl = self._fresh(self.workloads, key)
            if wl is None or wl.spec is None or is_being_deleted(wl):
                continue
            status = status_dict(wl)
            if _is_true(status, kq.FINISHED):
                continue
            if wl.spec.active is False and status.get("admission") is None:
                continue  # deactivated: not queued until spec.active is true again
            info = self._workload_info(wl, status, placed, bound_per_set)
            workloads.append(info)
            models[key] = wl
        return queues, flavors, workloads, list(nodes.values()), models

    def _queue_info(self, cq: Any, flavors: dict[str, adm.FlavorInfo]) -> adm.ClusterQueueInfo:
        spec = cq.spec or kq.ClusterQueueSpec()
        groups: list[adm.ResourceGroupInfo] = []
        quotas: dict[tuple[str, str], adm.Quota] = {}
        missing: list[str] = []
        for g in spec.resource_groups or []:
            groups.append(adm.ResourceGroupInfo(tuple(g.covered_resources), tuple(f.name for f in g.flavors)))
            for f in g.flavors:
                if f.name not in flavors:
                    missing.append(f.name)
                for r in f.resources:
                    quotas[(f.name, r.name)] = adm.Quota(
                        whole_amount(r.name, r.nominal_quota),
                        whole_amount(r.name, r.borrowing_limit) if r.borrowing_limit is not None else None,
                        whole_amount(r.name, r.lending_limit) if r.lending_limit is not None else None,
                    )
        p = spec.preemption or kq.ClusterQueuePreemption()
        bwc = p.borrow_within_cohort or kq.BorrowWithinCohort()
        weight = 1.0
        if spec.fair_sharing is not None and spec.fair_sharing.weight is not None:
            weight = float(parse_quantity(spec.fair_sharing.weight))
        inactive = ""
        if missing:
            inactive = "flavor(s) not found: " + ", ".join(sorted(set(missing)))
        elif spec.stop_policy not in (None, "None"):
            inactive = f"stopPolicy is {spec.stop_policy}"
        return adm.ClusterQueueInfo(
            name=objects.name_of(cq),
            groups=groups,
            quotas=quotas,
            cohort=spec.cohort or "",
            weight=weight,
            strategy=spec.queueing_strategy or "BestEffortFIFO",
            reclaim_within_cohort=p.reclaim_within_cohort or "Never",
            borrow_within_cohort=bwc.policy or "Never",
            borrow_max_priority=bwc.max_priority_threshold,
            within_cluster_queue=p.within_cluster_queue or "Never",
            when_can_borrow=(spec.flavor_fungibility.when_can_borrow if spec.flavor_fungibility else None) or "Borrow",
            inactive=inactive,
        )

    def _workload_info(self, wl: Any, status: dict[str, Any], placed: dict[str, list[adm.Placement]],
                       bound_per_set: dict[str, dict[str, int]]) -> adm.WorkloadInfo:
        ns = objects.namespace_of(wl)
        problem = ""
        cq_name = ""
        lq = self.local_queues.get(f"{ns}/{wl.spec.queue_name}") if wl.spec.queue_name else None
        admission = status.get("admission")
        if admission is not None:
            cq_name = admission.get("clusterQueue", "")
        elif lq is None:
            problem = f"LocalQueue {wl.spec.queue_name} doesn't exist"
        else:
            cq_name = (lq.spec.cluster_queue if lq.spec is not None else "") or ""
            cq = self.cluster_queues.get(cq_name)
            if cq is None:
                problem = f"ClusterQueue {cq_name} doesn't exist"
            elif lq.spec is not None and lq.spec.stop_policy not in (None, "None"):
                problem = f"LocalQueue {wl.spec.queue_name} is stopped"
            else:
                ns_obj = self.namespaces.get(ns)
                sel = cq.spec.namespace_selector if cq.spec is not None else None
                if sel is not None and ns_obj is not None and not LabelSelector.from_dict(sel.to_dict()).matches(
                        objects.labels_of(ns_obj)):
                    problem = f"namespace {ns} doesn't match ClusterQueue {cq_name}'s namespaceSelector"
        pod_sets = []
        for ps in wl.spec.pod_sets:
            spec = ps.template.spec or PodSpec(containers=[])
            annotations = (ps.template.metadata.annotations if ps.template.metadata is not None else None) or {}
            pod_sets.append(adm.PodSetInfo(
                ps.name, ps.count, _amounts(pod_requests(spec)), dict(spec.node_selector or {}),
                annotations.get(GPU_TOPOLOGY_ANNOTATION) == SAME_GROUP, toleration_tuples(spec.tolerations)))
        conditions = status.get("conditions") or []
        evicted = find_condition(conditions, kq.EVICTED)
        ts = timestamp(objects.meta(wl, "creationTimestamp")) or 0.0
        if evicted is not None and evicted.get("status") == "True":
            ts = timestamp(evicted.get("lastTransitionTime")) or ts
        owner = controller_uid(wl) or ""
        assignment = None
        unbound: dict[str, int] = {}
        if admission is not None:
            assignment = {psa["name"]: dict(psa.get("flavors") or {}) for psa in admission.get("podSetAssignments")
                          or []}
            bound = bound_per_set.get(owner, {})
            unbound = {ps.name: max(0, ps.count - bound.get(ps.name, 0)) for ps in wl.spec.pod_sets}
        reserved = find_condition(conditions, kq.QUOTA_RESERVED)
        return adm.WorkloadInfo(
            key=objects.object_key(wl),
            cluster_queue=cq_name,
            pod_sets=pod_sets,
            priority=wl.spec.priority or 0,
            timestamp=ts,
            admission=assignment,
            admitted_at=timestamp((reserved or {}).get("lastTransitionTime")) or 0.0,
            evicting=admission is not None and evicted is not None and evicted.get("status") == "True",
            placed=placed.get(owner, []),
            unbound=unbound,
            problem=problem,
            preempted_by=_preemptor(find_condition(conditions, kq.PREEMPTED)),
        )

    async def _cycle(self) -> Requeue | None:
        queues, flavors, workloads, nodes, models = self._snapshot()
        # Declaring a fairSharing weight on any ClusterQueue turns fair sharing on, too.
        fair = self.fair_sharing or any(cq.spec is not None and cq.spec.fair_sharing is not None
                                        for cq in self.cluster_queues.list())
        result = adm.schedule(queues, flavors, workloads, nodes, fair_sharing=fair)
        now = now_text(self.clock)
        infos = {w.key: w for w in workloads}
        for key, wl in models.items():
            # Deactivated while holding quota: stopped like a preempted one.
            if wl.spec.active is False and not infos[key].evicting:
                await self._evict(wl, adm.Preemption("", "InactiveWorkload", "The workload is deactivated"), now,
                                  reason="InactiveWorkload")
        for key, assignment in result.admitted.items():
            await self._admit(models[key], infos[key], assignment, key in result.borrowing, now)
        for key, pre in result.preempted.items():
            await self._evict(models[key], pre, now)
        for key, wait in result.waiting.items():
            await self._pending(models[key], wait, now)
        await self._queue_statuses(queues, workloads, result)
        return None

    async def _admit(self, wl: Any, info: adm.WorkloadInfo, assignment: adm.Assignment, borrowing: bool,
                     now: str) -> None:
        status = status_dict(wl)
        conditions = _conditions(status)
        assignments = []
        for ps in info.pod_sets:
            flavors = assignment.get(ps.name) or {}
            usage = {r: _format(r, a * ps.count) for r, a in ps.requests.items() if r in flavors}
            assignments.append({"name": ps.name, "flavors": flavors, "resourceUsage": usage, "count": ps.count})
        waited = max(0.0, self.clock.now() - info.timestamp)
        message = f"Quota reserved in ClusterQueue {info.cluster_queue}, wait time since queued was {math.ceil(waited)}s"
        # To the microsecond: preemption gives up the most recently admitted first.
        _set(conditions, kq.QUOTA_RESERVED, "True", "QuotaReserved", message, rfc3339(self.clock.now(), micro=True))
        _set(conditions, kq.ADMITTED, "True", "Admitted", "The workload is admitted", now)
        if find_condition(conditions, kq.EVICTED) is not None:
            _set(conditions, kq.EVICTED, "False", "QuotaReserved", "Previously: evicted, now admitted again", now)
        if find_condition(conditions, kq.PREEMPTED) is not None:
            _set(conditions, kq.PREEMPTED, "False", "QuotaReserved", "Previously: preempted, now admitted again", now)
        new = {**status, "conditions": conditions,
               "admission": {"clusterQueue": info.cluster_queue, "podSetAssignments": assignments}}
        await self._write_status(wl, new)
        self._announced.pop(info.key, None)
        await self.recorder.record(wl, NORMAL, "QuotaReserved", message + (" (borrowing)" if borrowing else ""))
        await self.recorder.record(wl, NORMAL, "Admitted", f"Admitted by ClusterQueue {info.cluster_queue}")

    async def _evict(self, wl: Any, pre: adm.Preemption, now: str, *, reason: str = "Preempted") -> None:
        status = status_dict(wl)
        conditions = _conditions(status)
        _set(conditions, kq.EVICTED, "True", reason, pre.message, now)
        if reason == "Preempted":
            _set(conditions, kq.PREEMPTED, "True", pre.reason, pre.message, now)
        await self._write_status(wl, {**status, "conditions": conditions})
        await self.recorder.record(wl, NORMAL, reason, pre.message)

    async def _pending(self, wl: Any, wait: adm.Wait, now: str) -> None:
        status = status_dict(wl)
        conditions = _conditions(status)
        if _set(conditions, kq.QUOTA_RESERVED, "False", wait.kind, wait.message, now):
            await self._write_status(wl, {**status, "conditions": conditions})
        key = objects.object_key(wl)
        if self._announced.get(key) != wait.kind:
            self._announced[key] = wait.kind
            await self.recorder.record(wl, NORMAL, "Pending", wait.message)
            job = self._owner_job(wl)
            if job is not None:
                await self.recorder.record(job, NORMAL, "Pending", f"{wait.kind}: {wait.message}")

    def _owner_job(self, wl: Any) -> Any | None:
        ref = objects.controller_ref(wl)
        if ref is None:
            return None
        informer = self.job_informers.get(objects.field(ref, "kind"))
        if informer is None:
            return None
        return informer.get(f"{objects.namespace_of(wl)}/{objects.field(ref, 'name')}")

    # -- queue status ---------------------------------------------------------------------------

    async def _queue_statuses(self, queues: dict[str, adm.ClusterQueueInfo], workloads: list[adm.WorkloadInfo],
                              result: adm.CycleResult) -> None:
        holding = {w.key: (result.admitted.get(w.key) or w.admission) for w in workloads
                   if w.admission is not None or w.key in result.admitted}
        usage: adm.Usage = {}
        for w in workloads:
            assignment = holding.get(w.key)
            if assignment is None:
                continue
            per = usage.setdefault(w.cluster_queue, {})
            for fr, amount in adm.workload_usage(w, assignment).items():
                per[fr] = per.get(fr, 0) + amount
        quotas = adm.Quotas(queues)
        per_queue: dict[str, dict[str, Any]] = {}
        per_local: dict[str, dict[str, Any]] = {}
        for w in workloads:
            reason = result.waiting.get(w.key)
            lq_key = f"{w.key.partition('/')[0]}/{self._queue_name(w.key)}"
            for bucket in (per_queue.setdefault(w.cluster_queue, {}), per_local.setdefault(lq_key, {})):
                if w.key in holding:
                    bucket["admitted"] = bucket.get("admitted", 0) + 1
                else:
                    bucket["pending"] = bucket.get("pending", 0) + 1
                    if reason is not None:
                        reasons = bucket.setdefault("reasons", {})
                        reasons[reason.kind] = reasons.get(reason.kind, 0) + 1
        for cq in self.cluster_queues.list():
            name = objects.name_of(cq)
            info = queues.get(name)
            counts = per_queue.get(name, {})
            used = usage.get(name, {})
            flavors_usage = []
            if info is not None:
                for g in info.groups:
                    for f in g.flavors:
                        resources = []
                        for r in g.resources:
                            total = used.get((f, r), 0)
                            nominal = info.quotas[(f, r)].nominal if (f, r) in info.quotas else 0
                            resources.append({"name": r, "total": _format(r, total),
                                              "borrowed": _format(r, max(0, total - nominal))})
                        flavors_usage.append({"name": f, "resources": resources})
            status = status_dict(cq)
            conditions = _conditions(status)
            active = info is not None and not info.inactive
            _set(conditions, "Active", "True" if active else "False", "Ready" if active else "Inactive",
                 "Can admit new workloads" if active else (info.inactive if info else ""), now_text(self.clock))
            share = quotas.share(info, usage) if info is not None else 0.0
            new = {
                **status,
                "flavorsReservation": flavors_usage,
                "flavorsUsage": flavors_usage,
                "pendingWorkloads": counts.get("pending", 0),
                "reservingWorkloads": counts.get("admitted", 0),
                "admittedWorkloads": counts.get("admitted", 0),
                "pendingReasons": counts.get("reasons", {}),
                "fairSharing": {"weightedShare": int(share) if math.isfinite(share) else 2**62},
                "conditions": conditions,
            }
            if _same_status(status, new):
                continue
            try:
                await self.client.update_status({**_wire(cq), "status": new})
            except (Conflict, NotFound):
                self._poke()
        for lq in self.local_queues.list():
            key = objects.object_key(lq)
            counts = per_local.get(key, {})
            status = status_dict(lq)
            new = {
                **status,
                "pendingWorkloads": counts.get("pending", 0),
                "reservingWorkloads": counts.get("admitted", 0),
                "admittedWorkloads": counts.get("admitted", 0),
                "pendingReasons": counts.get("reasons", {}),
            }
            if _same_status(status, new):
                continue
            try:
                await self.client.update_status({**_wire(lq), "status": new})
            except (Conflict, NotFound):
                self._poke()

    def _queue_name(self, wl_key: str) -> str:
        wl = self._fresh(self.workloads, wl_key)
        return (wl.spec.queue_name if wl is not None and wl.spec is not None else "") or ""


_PREEMPTOR = re.compile(r"accommodate a workload \(([^)\s]+)\)")


def _preemptor(cond: dict[str, Any] | None) -> str:
    """The workload named in a Preempted=True condition's message (written by adm)."""
    if cond is None or cond.get("status") != "True":
        return ""
    m = _PREEMPTOR.search(cond.get("message") or "")
    return m.group(1) if m else ""


def _same_status(old: dict[str, Any], new: dict[str, Any]) -> bool:
    def strip(s: dict[str, Any]) -> dict[str, Any]:
        out = dict(s)
        out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                             for c in s.get("conditions") or []]
        return out

    return strip(old) == strip(new)


def _format(resource: str, amount: int) -> str:
    if resource == "cpu":
        return str(amount // 1000) if amount % 1000 == 0 else f"{amount}m"
    return str(amount)
