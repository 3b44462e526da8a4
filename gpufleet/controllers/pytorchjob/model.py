"""A PyTorchJob's names, labels, annotations and the pure facts read from a job and its
pods: members, leader, ports, attempts, conditions."""

from __future__ import annotations

import zlib
from typing import Any

from gpufleet.api.kubeflow import (
    FAILED,
    MASTER,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    WORKER,
    PyTorchJob,
    elastic_bounds,
    is_elastic,
    replica_specs,
    replicas_of,
)
from gpufleet.api.podresources import container_gpu_request
from gpufleet.client import objects
from gpufleet.controllers._common import find_condition, is_being_deleted, pod_phase, status_dict

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
OPERATOR_NAME = "pytorchjob-controller"

JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"

ATTEMPT_ANNOTATION = "gpufleet.io/gang-attempt"
RESTARTS_ANNOTATION = "gpufleet.io/gang-restarts"
HARDWARE_RESTARTS_ANNOTATION = "gpufleet.io/hardware-restarts"
GANG_SIZE_ANNOTATION = "gpufleet.io/gang-size"
RESIZE_ANNOTATION = "gpufleet.io/elastic-resize"
CHECKPOINT_ANNOTATION = "gpufleet.io/checkpoint-dir"
AUTOSCALE_ANNOTATION = "gpufleet.io/elastic-autoscale"
ELASTIC_REASON_ANNOTATION = "gpufleet.io/elastic-reason"
CHECKPOINT_ENV = "GPUFLEET_CHECKPOINT_DIR"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PODGROUP_API_VERSION = "scheduling.x-k8s.io/v1alpha1"
DEFAULT_CHECKPOINT_ROOT = "/var/tmp/gpufleet/checkpoints"
GANG_PENDING = "GangPending"
GANG_SCHEDULED = "GangScheduled"
PORT_BASE = 20000
PORT_SPAN = 20000


# -- pure helpers -----------------------------------------------------------------------------


def pod_name(job_name: str, rtype: str, index: int) -> str:
    return f"{job_name}-{rtype.lower()}-{index}"


def gang_members(job: PyTorchJob) -> list[tuple[str, int]]:
    """(replica type, index) of every pod the job wants now, the leader first."""
    out: list[tuple[str, int]] = []
    if MASTER in replica_specs(job):
        out.append((MASTER, 0))
    out.extend((WORKER, i) for i in range(replicas_of(job, WORKER)))
    return out


def _pods_share_host_network(node: Any) -> bool:
    """Whether the node's pods share its network (the process and simulated runtimes), as
    its agent reports in nodeInfo.containerRuntimeVersion; podman gives each pod its own."""
    status = getattr(node, "status", None)
    info = getattr(status, "node_info", None) if status is not None else None
    version = (getattr(info, "container_runtime_version", "") or "") if info is not None else ""
    return not version.startswith("podman://")


def leader(job: PyTorchJob) -> tuple[str, int]:
    return (MASTER, 0) if MASTER in replica_specs(job) else (WORKER, 0)


def node_rank(job: PyTorchJob, rtype: str, index: int) -> int:
    return index + 1 if rtype == WORKER and MASTER in replica_specs(job) else index


def job_port(job: PyTorchJob, attempt: int) -> int:
    ep = job.spec.elastic_policy if job.spec is not None else None
    if ep is not None and ep.rdzv_port:
        return ep.rdzv_port
    seed = f"{objects.uid_of(job)}/{attempt}".encode()
    return PORT_BASE + zlib.crc32(seed) % PORT_SPAN


def nproc_per_node(job: PyTorchJob, container: dict[str, Any]) -> str:
    ep = job.spec.elastic_policy if job.spec is not None else None
    if ep is not None and ep.n_proc_per_node:
        return str(ep.n_proc_per_node)
    if job.spec is not None and job.spec.nproc_per_node:
        return job.spec.nproc_per_node
    gpus = container_gpu_request(container)
    return str(gpus) if gpus > 0 else "1"


def checkpoint_dir(job: PyTorchJob, root: str) -> str:
    annotations = objects.meta(job, "annotations") or {}
    if annotations.get(CHECKPOINT_ANNOTATION):
        return annotations[CHECKPOINT_ANNOTATION]
    return f"{root.rstrip('/')}/{objects.namespace_of(job)}/{objects.name_of(job)}-{objects.uid_of(job)[:8]}"


def gang_restarts(job: PyTorchJob) -> int:
    try:
        return int((objects.meta(job, "annotations") or {}).get(RESTARTS_ANNOTATION, 0))
    except ValueError:
        return 0


def hardware_restarts(job: PyTorchJob) -> int:
    """How often work moved off failed hardware (gang restarts and members replaced)."""
    try:
        return int((objects.meta(job, "annotations") or {}).get(HARDWARE_RESTARTS_ANNOTATION, 0))
    except ValueError:
        return 0


def gang_attempt(job: PyTorchJob) -> int:
    """The gang's generation: moves on with every restart, for a failure or a resize."""
    try:
        return int((objects.meta(job, "annotations") or {}).get(ATTEMPT_ANNOTATION, gang_restarts(job)))
    except ValueError:
        return gang_restarts(job)


def resize_in_place(job: PyTorchJob) -> bool:
    """Whether Workers are added and removed under a running torchrun group (elastic jobs)
    rather than by restarting the gang at the new size from its checkpoint (jobs without an
    elasticPolicy, and elastic ones annotated ``gpufleet.io/elastic-resize: restart``)."""
    return is_elastic(job) and (objects.meta(job, "annotations") or {}).get(RESIZE_ANNOTATION) != "restart"


def pod_gang_size(pod: Any) -> int | None:
    try:
        return int((objects.meta(pod, "annotations") or {}).get(GANG_SIZE_ANNOTATION, ""))
    except ValueError:
        return None


def pod_attempt(pod: Any) -> int:
    try:
        return int((objects.meta(pod, "annotations") or {}).get(ATTEMPT_ANNOTATION, 0))
    except ValueError:
        return 0


def pod_member(pod: Any) -> tuple[str, int] | None:
    labels = objects.labels_of(pod)
    rtype = {"master": MASTER, "worker": WORKER}.get(labels.get(REPLICA_TYPE_LABEL, ""))
    try:
        index = int(labels.get(REPLICA_INDEX_LABEL, ""))
    except ValueError:
        return None
    return (rtype, index) if rtype else None


def exit_code(pod: Any) -> int | None:
    status = getattr(pod, "status", None)
    for cs in (status.container_statuses if status is not None else None) or []:
        term = cs.state.terminated if cs.state is not None else None
        if term is not None and term.exit_code:
            return term.exit_code
    return None


def failure_is_retryable(restart_policy: str | None, code: int | None) -> bool:
    """Upstream's rule: Never does not restart; ExitCode restarts only on codes above 127
    (killed by a signal: preemption, OOM, a lost node); OnFailure and Always restart."""
    if restart_policy == "Never":
        return False
    if restart_policy == "ExitCode":
        return code is None or code > 127
    return True


def condition_true(job: Any, type_: str) -> bool:
    cond = find_condition(_conditions(job), type_)
    return cond is not None and cond.get("status") == "True"


def is_finished(job: Any) -> str | None:
    for t in (SUCCEEDED, FAILED):
        if condition_true(job, t):
            return t
    return None


def _conditions(job: Any) -> list[dict[str, Any]]:
    return [dict(c) for c in status_dict(job).get("conditions") or []]


def set_job_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
                      now: str) -> bool:
    """Kubeflow's setCondition: a condition with the same status and reason is left alone;
    Running and Restarting exclude each other, and Succeeded/Failed end Running."""
    current = find_condition(conditions, type_)
    if current is not None and current.get("status") == status and current.get("reason") == reason:
        return False
    if current is None and status == "False":
        return False
    new = {"type": type_, "status": status, "reason": reason, "message": message, "lastUpdateTime": now,
           "lastTransitionTime": now}
    if current is not None and current.get("status") == status:
        new["lastTransitionTime"] = current.get("lastTransitionTime", now)
    conditions[:] = [c for c in conditions if c.get("type") != type_]
    if status == "True":
        ends = {RUNNING: (RESTARTING,), RESTARTING: (RUNNING,), SUCCEEDED: (RUNNING, RESTARTING),
                FAILED: (RUNNING, RESTARTING)}.get(type_, ())
        for c in conditions:
            if c.get("type") in ends and c.get("status") == "True":
                c.update(status="False", lastUpdateTime=now, lastTransitionTime=now)
    conditions.append(new)
    return True


def _bound(pod: Any) -> bool:
    return bool(pod.spec is not None and pod.spec.node_name)


def gang_wait_reason(pods: list[Any]) -> str | None:
    """Why the scheduler holds the gang back: the message of the PodScheduled=False
    condition that the scheduler writes, the same for the whole gang, on each member it
    did not place. None when no member waits, or while the members disagree (a gang cycle
    is under way, or a member arrived after the last one)."""
    messages: set[str | None] = set()
    for p in pods:
        if _bound(p) or pod_phase(p) != "Pending" or is_being_deleted(p):
            continue
        conds = (p.status.conditions if p.status is not None else None) or []
        messages.add(next((c.message for c in conds if c.type == "PodScheduled" and c.status == "False"), None))
    if len(messages) != 1:
        return None
    return messages.pop() or None


def _reason(what: str) -> str:
    return f"PyTorchJob{what}"



KIND_REF = f"{API_VERSION}/{KIND}"


def rendezvous_name(job: Any) -> str:
    return f"{objects.name_of(job)}-rendezvous"


def autoscale_enabled(job: Any) -> bool:
    """Whether the controller resizes this elastic job by itself."""
    if not is_elastic(job):
        return False
    if (objects.meta(job, "annotations") or {}).get(AUTOSCALE_ANNOTATION, "").lower() == "false":
        return False
    if QUEUE_NAME_LABEL in objects.labels_of(job):
        return False  # its queue admitted a size; growing would go around the quota
    lo, hi = elastic_bounds(job)
    return hi > lo
