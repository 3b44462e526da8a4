"""A Volcano Job's names, labels and annotations, and the pure facts read from a job and
its pods: which task and index a pod is, its version, its counts by phase."""

from __future__ import annotations

from typing import Any

from gpufleet.api import volcano as vc
from gpufleet.client import objects
from gpufleet.controllers._common import is_being_deleted, pod_phase, status_dict

KIND = "Job"
API_VERSION = vc.BATCH_API_VERSION
KIND_REF = f"{API_VERSION}/{KIND}"

JOB_NAME_KEY = "volcano.sh/job-name"
JOB_NAMESPACE_KEY = "volcano.sh/job-namespace"
QUEUE_NAME_KEY = "volcano.sh/queue-name"
TASK_SPEC_KEY = "volcano.sh/task-spec"
TASK_INDEX_KEY = "volcano.sh/task-index"
JOB_VERSION_KEY = "volcano.sh/job-version"
JOB_RETRY_COUNT_KEY = "volcano.sh/job-retry-count"
TEMPLATE_UID_KEY = "volcano.sh/template-uid"

# Plugins: what ``controlledResources`` records for each, as Volcano does.
ENV_PLUGIN = "env"
SVC_PLUGIN = "svc"
SSH_PLUGIN = "ssh"
PYTORCH_PLUGIN = "pytorch"

ACTIVE_PHASES = ("Pending", "Running")


def pod_name(job_name: str, task: str, index: int) -> str:
    return f"{job_name}-{task}-{index}"


def podgroup_name(job: Any) -> str:
    """Volcano's (1.8 on): ``<job>-<job uid>``."""
    return f"{objects.name_of(job)}-{objects.uid_of(job)}"


def svc_configmap_name(job: Any) -> str:
    return f"{objects.name_of(job)}-svc"


def ssh_secret_name(job: Any) -> str:
    return f"{objects.name_of(job)}-ssh"


def pod_task(pod: Any) -> str:
    return (objects.meta(pod, "annotations") or {}).get(TASK_SPEC_KEY) or objects.labels_of(pod).get(TASK_SPEC_KEY, "")


def pod_index(pod: Any) -> int:
    try:
        return int(objects.labels_of(pod).get(TASK_INDEX_KEY, ""))
    except ValueError:
        return -1


def pod_version(pod: Any) -> int:
    try:
        return int((objects.meta(pod, "annotations") or {}).get(JOB_VERSION_KEY, "0"))
    except ValueError:
        return 0


def phase_of(job: Any) -> str:
    """The job's phase, "" before the controller first wrote one."""
    return ((status_dict(job).get("state") or {}).get("phase")) or ""


def version_of(job: Any) -> int:
    return int(status_dict(job).get("version") or 0)


def retry_count(job: Any) -> int:
    return int(status_dict(job).get("retryCount") or 0)


def is_active(pod: Any) -> bool:
    return not is_being_deleted(pod) and pod_phase(pod) in ACTIVE_PHASES


def counts(pods: list[Any]) -> dict[str, int]:
    """Volcano's status counts: pending, running, succeeded, failed, terminating, unknown."""
    out = {"pending": 0, "running": 0, "succeeded": 0, "failed": 0, "terminating": 0, "unknown": 0}
    for p in pods:
        phase = pod_phase(p)
        if is_being_deleted(p) and phase in ACTIVE_PHASES:
            out["terminating"] += 1
        elif phase in ("Pending", "Running", "Succeeded", "Failed"):
            out[phase.lower()] += 1
        else:
            out["unknown"] += 1
    return out


def task_status_count(pods: list[Any]) -> dict[str, Any]:
    out: dict[str, dict[str, dict[str, int]]] = {}
    for p in pods:
        task = pod_task(p)
        if not task:
            continue
        phases = out.setdefault(task, {"phase": {}})["phase"]
        phase = pod_phase(p) or "Unknown"
        phases[phase] = phases.get(phase, 0) + 1
    return out


def matching_policy(job: vc.VolcanoJob, task: str | None, event: str, code: int | None) -> vc.LifecyclePolicy | None:
    """The lifecycle policy that ``event`` of a pod of ``task`` (exiting with ``code``)
    triggers: the task's policies first, then the job's; a policy matches by its event(s)
    (``*`` matches any), or by ``exitCode`` for a failed pod."""
    spec = next((t for t in vc.tasks_of(job) if t.name == task), None)
    for policy in [*((spec.policies if spec is not None else None) or []),
                   *((job.spec.policies if job.spec is not None else None) or [])]:
        if policy.exit_code is not None:
            if event == vc.POD_FAILED and code is not None and code == policy.exit_code:
                return policy
            continue
        events = vc.policy_events(policy)
        if event in events or vc.ANY_EVENT in events:
            return policy
    return None
