"""Team queues in the API server: a mutating admission plugin that creates queued
jobs suspended, and the `get` columns of the queue kinds.

Kueue sets ``suspend: true`` on every job carrying ``kueue.x-k8s.io/queue-name`` with a
mutating webhook, so no pod of it exists before the queue admits it; the plugin does the
same for batch Jobs (``spec.suspend``), PyTorchJobs (``spec.runPolicy.suspend``), RayClusters
and RayJobs (``spec.suspend``).
"""

from __future__ import annotations

from typing import Any

from gpufleet.api.kueue import GROUP, QUEUE_NAME_LABEL, QUOTA_RESERVED
from gpufleet.api.validation.errors import INVALID, FieldError
from gpufleet.apiserver.admission import AdmissionContext
from gpufleet.apiserver.errors import invalid
from gpufleet.apiserver.server import ApiServer
from gpufleet.apiserver.tables import AGE_COLUMN, NAME_COLUMN, Column, age_cell, register_printer

# (group, kind) -> path of the suspend flag in the object.
SUSPEND_PATHS: dict[tuple[str, str], tuple[str, ...]] = {
    ("batch", "Job"): ("spec", "suspend"),
    ("kubeflow.org", "PyTorchJob"): ("spec", "runPolicy", "suspend"),
    ("ray.io", "RayCluster"): ("spec", "suspend"),
    ("ray.io", "RayJob"): ("spec", "suspend"),
}


class QueuedJobSuspender:
    """Mutating admission: a job created with a queue-name label starts suspended."""

    name = "KueueSuspendQueuedJobs"

    async def admit(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if ctx.operation not in ("CREATE", "UPDATE") or ctx.subresource:
            return
        path = SUSPEND_PATHS.get((ctx.rt.group, ctx.rt.kind))
        if path is None:
            return
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if not labels.get(QUEUE_NAME_LABEL):
            return
        if (ctx.rt.group, ctx.rt.kind) == ("ray.io", "RayJob"):
            errors = queued_rayjob_errors(obj)
            if errors:
                raise invalid(ctx.rt, ctx.name or (obj.get("metadata") or {}).get("name", ""),
                              [e.to_cause() for e in errors])
        if ctx.operation != "CREATE":
            return
        node = obj
        for key in path[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                child = node[key] = {}
            node = child
        node[path[-1]] = True


def queued_rayjob_errors(job: dict[str, Any]) -> list[FieldError]:
    """What Kueue's RayJob webhook refuses in a queued RayJob: the quota is held by the
    cluster the job makes, so the job must make its own and delete it when done."""
    spec = job.get("spec") or {}
    errors = []
    if not spec.get("shutdownAfterJobFinishes"):
        errors.append(FieldError(INVALID, "spec.shutdownAfterJobFinishes", bool(spec.get("shutdownAfterJobFinishes")),
                                 "a kueue managed job should delete the cluster after finishing"))
    if spec.get("clusterSelector"):
        errors.append(FieldError(INVALID, "spec.clusterSelector", spec["clusterSelector"],
                                 "a kueue managed job should not use an existing cluster"))
    return errors


def install(api: ApiServer) -> None:
    """Register the queue kinds' columns; add the suspending plugin to ``api`` unless its
    chain (admission.standard_plugins, or one of its own) already has it."""
    if not any(isinstance(p, QueuedJobSuspender) for p in api.mutating):
        api.mutating.append(QueuedJobSuspender())
    register_printers()


# -- `get` columns --------------------------------------------------------------------------


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("spec") or {}


def _status(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("status") or {}


def _reasons(status: dict[str, Any]) -> str:
    reasons = status.get("pendingReasons") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(reasons.items()) if v) or "<none>"


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in _status(obj).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


_PENDING = Column("Pending Workloads", type="integer", description="Number of pending workloads.")
_ADMITTED = Column("Admitted Workloads", type="integer", description="Number of admitted workloads.")
_WAITING = Column("Waiting For", description="How many pending workloads wait for what: quota, a node shape "
                                              "that fits, priority, preemptions to finish.")

_CLUSTER_QUEUE_COLUMNS = (
    NAME_COLUMN,
    Column("Cohort", description="Cohort that this ClusterQueue belongs to."),
    Column("Strategy", description="The queueing strategy used to prioritize workloads.", priority=1),
    _PENDING,
    _ADMITTED,
    _WAITING,
    AGE_COLUMN,
)


def _cluster_queue_row(obj: dict[str, Any], now: float) -> list[Any]:
    spec, status = _spec(obj), _status(obj)
    return [_meta(obj).get("name", ""), spec.get("cohort", ""), spec.get("queueingStrategy", ""),
            int(status.get("pendingWorkloads") or 0), int(status.get("admittedWorkloads") or 0),
            _reasons(status), age_cell(obj, now)]


_LOCAL_QUEUE_COLUMNS = (
    NAME_COLUMN,
    Column("ClusterQueue", description="Backing ClusterQueue."),
    _PENDING,
    _ADMITTED,
    _WAITING,
    AGE_COLUMN,
)


def _local_queue_row(obj: dict[str, Any], now: float) -> list[Any]:
    status = _status(obj)
    return [_meta(obj).get("name", ""), _spec(obj).get("clusterQueue", ""),
            int(status.get("pendingWorkloads") or 0), int(status.get("admittedWorkloads") or 0),
            _reasons(status), age_cell(obj, now)]


_WORKLOAD_COLUMNS = (
    NAME_COLUMN,
    Column("Queue", description="Name of the queue this workload was submitted to."),
    Column("Reserved in", description="Name of the ClusterQueue where the workload is reserving quota."),
    Column("Admitted", description="Admission status."),
    Column("Finished", description="Workload finished."),
    Column("Waiting For", description="Why the workload waits: Quota, Shape, Priority, Preempting, Queued, "
                                      "Inadmissible."),
    Column("Message", description="What it waits for, in full.", priority=1),
    AGE_COLUMN,
)


def _workload_row(obj: dict[str, Any], now: float) -> list[Any]:
    status = _status(obj)
    admission = status.get("admission") or {}
    admitted = _condition(obj, "Admitted")
    finished = _condition(obj, "Finished")
    reserved = _condition(obj, QUOTA_RESERVED)
    waiting, message = "", ""
    if reserved is not None and reserved.get("status") == "False" and not (finished or {}).get("status") == "True":
        waiting, message = reserved.get("reason", ""), reserved.get("message", "")
    return [_meta(obj).get("name", ""), _spec(obj).get("queueName", ""), admission.get("clusterQueue", ""),
            (admitted or {}).get("status", ""), (finished or {}).get("status", ""), waiting, message,
            age_cell(obj, now)]


_RESOURCE_FLAVOR_COLUMNS = (
    NAME_COLUMN,
    Column("Node Labels", description="Labels of the nodes this flavor stands for."),
    AGE_COLUMN,
)


def _resource_flavor_row(obj: dict[str, Any], now: float) -> list[Any]:
    labels = _spec(obj).get("nodeLabels") or {}
    return [_meta(obj).get("name", ""), ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>",
            age_cell(obj, now)]


def register_printers() -> None:
    register_printer("ClusterQueue", _CLUSTER_QUEUE_COLUMNS, _cluster_queue_row, group=GROUP)
    register_printer("LocalQueue", _LOCAL_QUEUE_COLUMNS, _local_queue_row, group=GROUP)
    register_printer("Workload", _WORKLOAD_COLUMNS, _workload_row, group=GROUP)
    register_printer("ResourceFlavor", _RESOURCE_FLAVOR_COLUMNS, _resource_flavor_row, group=GROUP)
