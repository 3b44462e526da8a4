"""The kinds of job a queue can hold (batch/v1 Job, kubeflow.org/v1 PyTorchJob, ray.io/v1
RayCluster and RayJob): how the
controller reads a job's pod sets, suspends it and steers its pod templates; the Workload's
name; and the condition helpers the job reconciler and the admission cycle share."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.api.k8s import Job
from gpufleet.client import objects
from gpufleet.controllers._common import (
    find_condition,
)

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


def _ray_pod_sets(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Kueue's pod sets of a RayCluster spec: ``head`` (1) and one per worker group (its
    replicas within minReplicas..maxReplicas, times numOfHosts; 0 while suspended)."""
    from gpufleet.api import ray

    head = (spec.get("headGroupSpec") or {}).get("template") or {}
    out = [{"name": "head", "count": 1, "template": head}]
    for g in spec.get("workerGroupSpecs") or []:
        group = ray.WorkerGroupSpec.model_validate(g)
        out.append({"name": g.get("groupName") or "", "count": ray.desired_replicas(group),
                    "template": g.get("template") or {}})
    return out


def _ray_templates(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {"head": spec.setdefault("headGroupSpec", {}).setdefault("template", {})}
    for g in spec.get("workerGroupSpecs") or []:
        out[g.get("groupName") or ""] = g.setdefault("template", {})
    return out


def _ray_pod_set_of(pod: Any) -> str:
    labels = objects.labels_of(pod)
    return "head" if labels.get("ray.io/node-type") == "head" else labels.get("ray.io/group", "")


def _ray_kinds() -> list[JobKind]:
    """RayCluster and RayJob, as Kueue's ray integrations read them. A RayJob's pod sets are
    its rayClusterSpec's (the cluster is made only once the job is admitted), plus
    ``submitter`` for the submitter Job of K8sJobMode."""
    try:
        from gpufleet.api import ray
        from gpufleet.controllers.ray.job import SUBMITTER_RESOURCES
    except ImportError:
        return []

    def job_pod_sets(job: dict[str, Any]) -> list[dict[str, Any]]:
        spec = job.get("spec") or {}
        out = _ray_pod_sets(spec.get("rayClusterSpec") or {})
        if (spec.get("submissionMode") or "K8sJobMode") == "K8sJobMode":
            template = spec.get("submitterPodTemplate") or {"spec": {"containers": [{
                "name": "ray-job-submitter", "resources": copy.deepcopy(SUBMITTER_RESOURCES)}]}}
            out.append({"name": "submitter", "count": 1, "template": template})
        return out

    def job_templates(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
        spec = job.setdefault("spec", {})
        return _ray_templates(spec.setdefault("rayClusterSpec", {}))

    def job_finished(job: dict[str, Any]) -> str | None:
        deployment = (job.get("status") or {}).get("jobDeploymentStatus")
        return {ray.DEPLOYMENT_COMPLETE: "Succeeded", ray.DEPLOYMENT_FAILED: "Failed"}.get(deployment or "")

    return [
        JobKind(kind=ray.CLUSTER_KIND, api_version=ray.API_VERSION, model=ray.RayCluster,
                suspend_path=("spec", "suspend"),
                pod_sets=lambda job: _ray_pod_sets(job.get("spec") or {}),
                templates=lambda job: _ray_templates(job.setdefault("spec", {})),
                finished=lambda job: None, pod_set_of=_ray_pod_set_of),
        JobKind(kind=ray.JOB_KIND, api_version=ray.API_VERSION, model=ray.RayJob,
                suspend_path=("spec", "suspend"), pod_sets=job_pod_sets, templates=job_templates,
                finished=job_finished, pod_set_of=_ray_pod_set_of),
    ]


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
