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

The cycle wakes only for what can change a decision (see ``node_admission_view`` and
``pod_usage_view``): never for a node's heartbeat, and not at all for nodes and pods while
there is no ClusterQueue; without ClusterQueues and Workloads it runs no pass. ``pokes``
counts what woke it, by kind, ``events_seen`` the events it looked at, ``passes`` the passes.

The API server creates queued jobs suspended (``gpufleet.apiserver.admission.queues``); a job that
is running without an admitted Workload is suspended here as well.

Resources a ClusterQueue does not cover are not counted against it (Kueue refuses such
workloads); GPUs are what the queues are for.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from gpufleet.api import kueue as kq
from gpufleet.api.gpu import GPU_INDICES_ANNOTATION, GPUS_ANNOTATION
from gpufleet.api.k8s import Namespace, Node, Pod, PriorityClass
from gpufleet.api.podresources import pod_gpu_request
from gpufleet.api.taints import NO_EXECUTE, NO_SCHEDULE, taint_tuples
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Controller
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.client.workqueue import WorkQueue
from gpufleet.controllers._common import (
    controller_uid,
    index_by_controller,
    is_being_deleted,
    pod_is_terminal,
)
from gpufleet.controllers.base import ControllerBase
from gpufleet.controllers.kueue.cycle import PENDING_REFRESHES_PER_PASS, AdmissionCycle, _node_ready
from gpufleet.controllers.kueue.jobs import JobSync
from gpufleet.controllers.kueue.kinds import (
    BATCH_JOB,
    CYCLE,
    OWNER_UID_INDEX,
    JobKind,
    _pytorch_kind,
    _ray_kinds,
    _rv,
    _wire,
)
from gpufleet.queueing.policies import STEPS_DONE_ANNOTATION, TOTAL_STEPS_ANNOTATION

log = logging.getLogger(__name__)


# Seconds an admission pass waits after what woke it, so that the events of one change are
# decided on together (as the Job controller's syncJobBatchPeriod batches a job's pod events).
BATCH_PERIOD = 0.1


def _spec(obj: Any) -> Any:
    return getattr(obj, "spec", None)


def _priority(pc: Any) -> Any:
    return (getattr(pc, "value", None), getattr(pc, "preemption_policy", None))


def node_admission_view(node: Any) -> tuple[Any, ...]:
    """What the admission cycle reads of a Node: readiness (the Ready condition's status, not
    its heartbeat times), unschedulable, taints, labels, the GPU annotation and allocatable."""
    spec, status = getattr(node, "spec", None), getattr(node, "status", None)
    annotations = objects.meta(node, "annotations") or {}
    return (
        _node_ready(node),
        bool(spec is not None and spec.unschedulable),
        taint_tuples(spec.taints if spec is not None else None, (NO_SCHEDULE, NO_EXECUTE)),
        objects.labels_of(node),
        annotations.get(GPUS_ANNOTATION),
        (status.allocatable if status is not None else None) or {},
    )


def pod_usage_view(pod: Any) -> tuple[Any, ...]:
    """What the admission cycle reads of a pod: where it is bound, whether it still holds its
    resources (not terminal), and which GPUs (the scheduler's indices annotation)."""
    annotations = objects.meta(pod, "annotations") or {}
    return (pod.spec.node_name, pod_is_terminal(pod), annotations.get(GPU_INDICES_ANNOTATION),
            is_being_deleted(pod))


def workload_decision_view(wl: Any) -> tuple[Any, ...]:
    """What the cycle and the job reconciler decide on in a Workload: all of it but the
    resourceVersion, managed fields and the details of its wait (a QuotaReserved condition
    that is not True, whose reason and message only the cycle writes). A pass that writes
    why workloads wait does not wake another pass."""
    meta = getattr(wl, "metadata", None)
    meta_view = meta.model_dump(exclude={"resource_version", "managed_fields"}) if meta is not None else None
    status = getattr(wl, "status", None)
    status_view: Any = None
    if status is not None:
        status_view = status.to_dict()
        conditions = []
        for c in status_view.pop("conditions", None) or []:
            if c.get("type") == kq.QUOTA_RESERVED and c.get("status") != "True":
                c = {"type": c.get("type"), "status": c.get("status")}
            conditions.append(c)
        status_view["conditions"] = conditions
    return meta_view, getattr(wl, "spec", None), status_view


def _progress_view(job: Any) -> tuple[Any, Any]:
    annotations = objects.meta(job, "annotations") or {}
    return annotations.get(TOTAL_STEPS_ANNOTATION), annotations.get(STEPS_DONE_ANNOTATION)


# -- the controller -----------------------------------------------------------------------------------


class KueueController(JobSync, AdmissionCycle, ControllerBase):
    name = "kueue"
    component = "kueue-admission"

    def __init__(
        self, client: Client, informers: SharedInformerFactory, *,
        fair_sharing: bool = False,
        batch_period: float = BATCH_PERIOD,
        pending_refreshes: int = PENDING_REFRESHES_PER_PASS,
        **kwargs: Any,
    ) -> None:
        super().__init__(client, informers, **kwargs)
        self.fair_sharing = fair_sharing
        self.batch_period = batch_period
        # Message-only rewrites of waiting workloads per pass (0: a message is written when
        # the reason changes, never refreshed; a trace replay that no one reads).
        self.pending_refreshes = pending_refreshes
        self.kinds: dict[str, JobKind] = {"Job": BATCH_JOB}
        pytorch = _pytorch_kind()
        for extra in ([pytorch] if pytorch is not None else []) + _ray_kinds():
            if client.registry.by_api_version_kind(extra.api_version, extra.kind):
                self.kinds[extra.kind] = extra
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

        self.job_queue = WorkQueue(f"{self.name}-jobs", clock=self.clock)
        self.jobs = Controller(f"{self.name}-jobs", self.reconcile_job, self.job_queue, workers=self.workers)
        for kind_name, informer in self.job_informers.items():
            informer.add_event_handler(*self._job_handlers(kind_name))
        self.workloads.add_event_handler(self._workload_event, self._workload_updated, self._workload_event)
        self.pods.add_event_handler(self._pod_event, self._pod_updated, self._pod_event)
        # One admission cycle at a time: it decides from the whole picture.
        self.cycle_queue = WorkQueue(f"{self.name}-cycle", clock=self.clock)
        self.cycles = Controller(f"{self.name}-cycle", self.run_cycle, self.cycle_queue, workers=1)
        # Only what can change a decision wakes the cycle: the spec of queues and flavors (not
        # the status the cycle writes), namespaces' labels, priority values, and of nodes what
        # admission reads (never a heartbeat: a fleet's nodes write one every few seconds).
        for informer, view in ((self.cluster_queues, _spec), (self.local_queues, _spec), (self.flavors, _spec),
                               (self.namespaces, objects.labels_of), (self.priority_classes, _priority),
                               (self.nodes, node_admission_view)):
            informer.add_event_handler(self._poke, self._updated_by(view), self._poke)
        # Events seen and admission passes run, by what woke them: how the cycle is observed.
        self.events_seen: Counter[str] = Counter()
        self.pokes: Counter[str] = Counter()
        self.passes = 0
        # Writes not yet seen by the informer: key -> the object as written.
        self._written: dict[str, Any] = {}
        # Workload key -> wait kind last announced with an Event.
        self._announced: dict[str, str] = {}
        # Workload key -> what is known of its job's progress (queueing policies).
        self.progress: dict[str, Any] = {}
        # Workload key -> (resourceVersion, what the cycle parsed of it at that version, the
        # object it was read from, (its job's informer and key, its owner's uid)).
        self._parsed: dict[str, tuple[int, Any, Any, Any]] = {}
        # Workload key -> (the inputs, the WorkloadInfo) of a workload without quota, last pass.
        self._infos: dict[str, tuple[tuple[Any, ...], Any]] = {}
        # What admission.ranked worked out for each WorkloadInfo at the last pass.
        self._ranks: dict[str, Any] = {}
        # Workload key -> the informer's object, when it was not queued (finished, inactive).
        self._finished: dict[str, Any] = {}
        # Workload key -> (resourceVersion, wait kind, message) last written as its wait.
        self._pending_memo: dict[str, tuple[int, str, str]] = {}

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

        def updated(old: Any, new: Any) -> None:
            enqueue(new)
            # A job's reported progress orders the shortest-remaining-service queues.
            if _progress_view(old) != _progress_view(new):
                self._poke(new)

        return enqueue, updated, enqueue

    def _poke(self, obj: Any = None) -> None:
        kind = type(obj).__name__ if obj is not None else "Workload"
        self.events_seen[kind] += 1
        if kind in ("Node", "Pod", "Namespace", "PriorityClass") and not self.cluster_queues.list():
            # Without ClusterQueues nothing is admitted: capacity and usage change no decision.
            return
        self.pokes[kind] += 1
        # What one change sets off (an admission unsuspends a job, its pods are made, bound,
        # start) is looked at in one pass, not a pass per step of it.
        self.cycle_queue.add_after(CYCLE, self.batch_period)

    def _updated_by(self, view: Callable[[Any], Any]) -> Callable[[Any, Any], None]:
        def updated(old: Any, new: Any) -> None:
            if view(old) != view(new) or is_being_deleted(old) != is_being_deleted(new):
                self._poke(new)
            else:
                self.events_seen[type(new).__name__] += 1

        return updated

    def _workload_event(self, wl: Any) -> None:
        self._poke(wl)
        ref = objects.controller_ref(wl)
        if ref is not None and objects.field(ref, "kind") in self.kinds:
            ns = objects.namespace_of(wl)
            self.job_queue.add(f"{objects.field(ref, 'kind')}:{ns}/{objects.field(ref, 'name')}")

    def _workload_updated(self, old: Any, new: Any) -> None:
        if workload_decision_view(old) == workload_decision_view(new):
            self.events_seen["Workload"] += 1  # only its wait's message: what a pass wrote
            return
        self._workload_event(new)

    def _pod_event(self, pod: Any, *, usage_changed: bool = True) -> None:
        ref = objects.controller_ref(pod)
        if ref is None or objects.field(ref, "kind") not in self.kinds:
            # Other pods matter only for the GPUs they hold on a node.
            if usage_changed and getattr(pod.spec, "node_name", None) and pod_gpu_request(pod):
                self._poke(pod)
            else:
                self.events_seen["Pod"] += 1
            return
        if usage_changed:
            self._poke(pod)
        self.job_queue.add(f"{objects.field(ref, 'kind')}:{objects.namespace_of(pod)}/{objects.field(ref, 'name')}")

    def _pod_updated(self, old: Any, new: Any) -> None:
        # The job reconciler follows its pods' phases; the cycle only what they hold.
        if (old.spec.node_name, getattr(old.status, "phase", None), is_being_deleted(old)) != (
                new.spec.node_name, getattr(new.status, "phase", None), is_being_deleted(new)):
            self._pod_event(new, usage_changed=pod_usage_view(old) != pod_usage_view(new))
        else:
            self.events_seen["Pod"] += 1

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


