"""Volcano's kinds: the batch Job (batch.volcano.sh/v1alpha1), with its tasks, lifecycle
policies and plugins, and the Queue and PodGroup of its scheduler (scheduling.volcano.sh/
v1beta1).

The shapes are upstream's (volcano-sh/apis pkg/apis/batch/v1alpha1/job.go and
pkg/apis/scheduling/v1beta1/types.go), so a manifest written for a cluster running Volcano
applies here unchanged. Importing this module registers the kinds' defaulting and
validation; the API server's table printers read ``*_PRINTER_COLUMNS`` and the
``*_printer_cells`` functions, which give Volcano's columns.

What gpufleet does with them is in ``controllers/volcano`` and docs/volcano.md: a Job's
PodGroup is placed by the scheduler's gang cycle (all of minMember or none), and a Queue's
capability and state decide when a PodGroup leaves Pending (Inqueue).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from gpufleet.api import defaults as d
from gpufleet.api import validation as v
from gpufleet.api.intorstring import IntOrStringQuantity, KeepsTemplateNumbers
from gpufleet.api.k8s import K8sModel, ListMeta, ObjectMeta, PodTemplateSpec, Time
from gpufleet.api.quantity import parse_quantity

BATCH_GROUP = "batch.volcano.sh"
BATCH_VERSION = "v1alpha1"
BATCH_API_VERSION = f"{BATCH_GROUP}/{BATCH_VERSION}"
SCHEDULING_GROUP = "scheduling.volcano.sh"
SCHEDULING_VERSION = "v1beta1"
SCHEDULING_API_VERSION = f"{SCHEDULING_GROUP}/{SCHEDULING_VERSION}"

SCHEDULER_NAME = "volcano"
DEFAULT_QUEUE = "default"
DEFAULT_MAX_RETRY = 3

# The annotation (and Volcano's own spelling of it) that makes a pod a member of the
# Volcano PodGroup of that name, in its namespace.
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_GROUP_NAME_ANNOTATION = "scheduling.volcano.sh/group-name"

# Job phases (JobPhase).
PENDING = "Pending"
ABORTING = "Aborting"
ABORTED = "Aborted"
RUNNING = "Running"
RESTARTING = "Restarting"
COMPLETING = "Completing"
COMPLETED = "Completed"
TERMINATING = "Terminating"
TERMINATED = "Terminated"
FAILED = "Failed"
JOB_PHASES = (PENDING, ABORTING, ABORTED, RUNNING, RESTARTING, COMPLETING, COMPLETED, TERMINATING,
              TERMINATED, FAILED)
FINISHED_PHASES = (ABORTED, COMPLETED, TERMINATED, FAILED)

# Lifecycle policy events and actions (bus/v1alpha1).
ANY_EVENT = "*"
POD_FAILED = "PodFailed"
POD_EVICTED = "PodEvicted"
POD_PENDING = "PodPending"
POD_RUNNING = "PodRunning"
JOB_UNKNOWN = "Unknown"
TASK_COMPLETED = "TaskCompleted"
TASK_FAILED = "TaskFailed"
OUT_OF_SYNC = "OutOfSync"
COMMAND_ISSUED = "CommandIssued"
JOB_UPDATED = "JobUpdated"
EVENTS = (ANY_EVENT, POD_FAILED, POD_EVICTED, POD_PENDING, POD_RUNNING, JOB_UNKNOWN, TASK_COMPLETED,
          TASK_FAILED, OUT_OF_SYNC, COMMAND_ISSUED, JOB_UPDATED)

ABORT_JOB = "AbortJob"
RESTART_JOB = "RestartJob"
RESTART_TASK = "RestartTask"
RESTART_POD = "RestartPod"
TERMINATE_JOB = "TerminateJob"
COMPLETE_JOB = "CompleteJob"
RESUME_JOB = "ResumeJob"
SYNC_JOB = "SyncJob"
ACTIONS = (ABORT_JOB, RESTART_JOB, RESTART_TASK, RESTART_POD, TERMINATE_JOB, COMPLETE_JOB, RESUME_JOB, SYNC_JOB)

PLUGINS = ("env", "svc", "ssh", "pytorch")  # the ones gpufleet sets up; others are refused by name
# Plugins that need svc's host names; Volcano's webhook adds svc to a job that has one of them.
NEEDS_SVC = ("pytorch", "mpi", "tensorflow")

# PodGroup phases and condition types.
PG_PENDING = "Pending"
PG_RUNNING = "Running"
PG_UNKNOWN = "Unknown"
PG_INQUEUE = "Inqueue"
PG_COMPLETED = "Completed"
PG_PHASES = (PG_PENDING, PG_RUNNING, PG_UNKNOWN, PG_INQUEUE, PG_COMPLETED)
PG_UNSCHEDULABLE = "Unschedulable"
PG_SCHEDULED = "Scheduled"

# Queue states.
QUEUE_OPEN = "Open"
QUEUE_CLOSED = "Closed"
QUEUE_CLOSING = "Closing"
QUEUE_UNKNOWN = "Unknown"
QUEUE_STATES = (QUEUE_OPEN, QUEUE_CLOSED, QUEUE_CLOSING, QUEUE_UNKNOWN)


# -- batch.volcano.sh/v1alpha1 Job ---------------------------------------------------------


class LifecyclePolicy(K8sModel):
    """What the controller does (``action``) when ``event`` (or one of ``events``) happens,
    or when a pod exits with ``exitCode``."""

    action: str | None = Field(default=None, description="RestartJob, AbortJob, CompleteJob, TerminateJob, ...")
    event: str | None = Field(default=None, description="PodFailed, PodEvicted, TaskCompleted, * (any), ...")
    events: list[str] | None = Field(default=None, description="Several events that trigger the same action.")
    exit_code: int | None = Field(default=None, alias="exitCode",
                                  description="The exit code of a failed pod that triggers the action.")
    timeout: str | None = Field(default=None, description="Wait this long (a duration) before acting.")


class VolumeSpec(K8sModel):
    mount_path: str | None = Field(default=None, alias="mountPath")
    volume_claim_name: str | None = Field(default=None, alias="volumeClaimName")
    volume_claim: dict[str, Any] | None = Field(default=None, alias="volumeClaim")


class TaskSpec(KeepsTemplateNumbers):
    """One kind of pod of the job: its name, how many, made from which template."""

    name: str | None = Field(default=None, description="The task's name; pods are <job>-<task>-<index>.")
    replicas: int | None = Field(default=None, description="How many pods of this task.")
    min_available: int | None = Field(default=None, alias="minAvailable",
                                      description="The fewest pods of this task that must run (default replicas).")
    template: PodTemplateSpec | None = Field(default=None, description="The pod template of the task.")
    policies: list[LifecyclePolicy] | None = Field(
        default=None, description="Lifecycle policies of this task; they come before the job's.")
    topology_policy: str | None = Field(default=None, alias="topologyPolicy")
    max_retry: int | None = Field(default=None, alias="maxRetry")
    depends_on: dict[str, Any] | None = Field(default=None, alias="dependsOn")
    partition_policy: dict[str, Any] | None = Field(default=None, alias="partitionPolicy")


class JobSpec(K8sModel):
    """The tasks of the job, how many must run together, and what to do on which event."""

    scheduler_name: str | None = Field(default=None, alias="schedulerName",
                                       description="volcano (the default); gpufleet's scheduler answers to it.")
    min_available: int | None = Field(
        default=None, alias="minAvailable",
        description="The fewest pods that must run at once (gang); default the sum of the tasks' replicas.")
    volumes: list[VolumeSpec] | None = None
    tasks: list[TaskSpec] | None = Field(default=None, description="The tasks, each with replicas and a template.")
    policies: list[LifecyclePolicy] | None = Field(default=None, description="Lifecycle policies of the job.")
    plugins: dict[str, list[str]] | None = Field(
        default=None, description="Plugins that set the pods up: env (task index), svc (headless Service and "
                                  "host lists), ssh (a key pair shared by the pods), pytorch (MASTER_ADDR, "
                                  "MASTER_PORT, WORLD_SIZE, RANK).")
    running_estimate: str | None = Field(default=None, alias="runningEstimate")
    queue: str | None = Field(default=None, description="The Queue the job's PodGroup is admitted by (default).")
    max_retry: int | None = Field(default=None, alias="maxRetry",
                                  description="How many restarts before the job is Failed (default 3).")
    ttl_seconds_after_finished: int | None = Field(default=None, alias="ttlSecondsAfterFinished")
    priority_class_name: str | None = Field(default=None, alias="priorityClassName")
    min_success: int | None = Field(default=None, alias="minSuccess",
                                    description="The pods that must succeed for the job to be Completed.")
    network_topology: dict[str, Any] | None = Field(default=None, alias="networkTopology")


class JobState(K8sModel):
    phase: str | None = None
    reason: str | None = None
    message: str | None = None
    last_transition_time: Time | None = Field(default=None, alias="lastTransitionTime")


class TaskState(K8sModel):
    phase: dict[str, int] | None = None


class JobCondition(K8sModel):
    status: str
    last_transition_time: Time | None = Field(default=None, alias="lastTransitionTime")


class JobStatus(K8sModel):
    state: JobState | None = None
    min_available: int | None = Field(default=None, alias="minAvailable")
    task_status_count: dict[str, TaskState] | None = Field(default=None, alias="taskStatusCount")
    pending: int | None = None
    running: int | None = None
    succeeded: int | None = None
    failed: int | None = None
    terminating: int | None = None
    unknown: int | None = None
    version: int | None = None
    retry_count: int | None = Field(default=None, alias="retryCount")
    running_duration: str | None = Field(default=None, alias="runningDuration")
    controlled_resources: dict[str, str] | None = Field(default=None, alias="controlledResources")
    conditions: list[JobCondition] | None = None


class VolcanoJob(K8sModel):
    """A Volcano batch job: tasks placed together, with lifecycle policies."""

    API_VERSION: ClassVar[str] = BATCH_API_VERSION
    KIND: ClassVar[str] = "Job"

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: JobSpec | None = None
    status: JobStatus | None = None


class VolcanoJobList(K8sModel):
    API_VERSION: ClassVar[str] = BATCH_API_VERSION
    KIND: ClassVar[str] = "JobList"

    api_version: str | None = Field(default=None, alias="apiVersion")
    items: list[VolcanoJob]
    kind: str | None = None
    metadata: ListMeta | None = None


# -- scheduling.volcano.sh/v1beta1 Queue and PodGroup --------------------------------------


class QueueSpec(K8sModel):
    """A share of the cluster: its weight, the most it may use, whether it may be reclaimed."""

    weight: int | None = Field(default=None, description="Its share of the cluster against other queues (1).")
    capability: dict[str, IntOrStringQuantity] | None = Field(
        default=None, description="The most the queue's PodGroups may hold at once, per resource.")
    reclaimable: bool | None = Field(default=None, description="Whether others may reclaim what it over-uses.")
    extend_clusters: list[dict[str, Any]] | None = Field(default=None, alias="extendClusters")
    guarantee: dict[str, Any] | None = None
    affinity: dict[str, Any] | None = None
    type: str | None = None
    parent: str | None = None
    deserved: dict[str, IntOrStringQuantity] | None = None
    priority: int | None = None
    dequeue_strategy: str | None = Field(default=None, alias="dequeueStrategy")


class QueueStatus(K8sModel):
    state: str | None = None
    unknown: int | None = None
    pending: int | None = None
    running: int | None = None
    inqueue: int | None = None
    completed: int | None = None
    reservation: dict[str, Any] | None = None
    allocated: dict[str, IntOrStringQuantity] | None = None


class Queue(K8sModel):
    """A Volcano queue of PodGroups (cluster-scoped)."""

    API_VERSION: ClassVar[str] = SCHEDULING_API_VERSION
    KIND: ClassVar[str] = "Queue"

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: QueueSpec | None = None
    status: QueueStatus | None = None


class QueueList(K8sModel):
    API_VERSION: ClassVar[str] = SCHEDULING_API_VERSION
    KIND: ClassVar[str] = "QueueList"

    api_version: str | None = Field(default=None, alias="apiVersion")
    items: list[Queue]
    kind: str | None = None
    metadata: ListMeta | None = None


class VolcanoPodGroupSpec(K8sModel):
    min_member: int | None = Field(default=None, alias="minMember",
                                   description="The fewest members placed together; none is bound before.")
    min_task_member: dict[str, int] | None = Field(default=None, alias="minTaskMember")
    queue: str | None = Field(default=None, description="The Queue that admits the group (default).")
    priority_class_name: str | None = Field(default=None, alias="priorityClassName")
    min_resources: dict[str, IntOrStringQuantity] | None = Field(
        default=None, alias="minResources", description="What the group holds against its queue's capability.")
    network_topology: dict[str, Any] | None = Field(default=None, alias="networkTopology")
    sub_group_policy: list[dict[str, Any]] | None = Field(default=None, alias="subGroupPolicy")


class PodGroupCondition(K8sModel):
    type: str | None = None
    status: str | None = None
    transition_id: str | None = Field(default=None, alias="transitionID")
    last_transition_time: Time | None = Field(default=None, alias="lastTransitionTime")
    reason: str | None = None
    message: str | None = None


class VolcanoPodGroupStatus(K8sModel):
    phase: str | None = None
    conditions: list[PodGroupCondition] | None = None
    running: int | None = None
    succeeded: int | None = None
    failed: int | None = None


class VolcanoPodGroup(K8sModel):
    """Volcano's gang: pods annotated scheduling.k8s.io/group-name are placed together."""

    API_VERSION: ClassVar[str] = SCHEDULING_API_VERSION
    KIND: ClassVar[str] = "PodGroup"

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: VolcanoPodGroupSpec | None = None
    status: VolcanoPodGroupStatus | None = None


class VolcanoPodGroupList(K8sModel):
    API_VERSION: ClassVar[str] = SCHEDULING_API_VERSION
    KIND: ClassVar[str] = "PodGroupList"

    api_version: str | None = Field(default=None, alias="apiVersion")
    items: list[VolcanoPodGroup]
    kind: str | None = None
    metadata: ListMeta | None = None


# -- small readers -----------------------------------------------------------------------------


def tasks_of(job: VolcanoJob) -> list[TaskSpec]:
    return list((job.spec.tasks if job.spec is not None else None) or [])


def task_replicas(task: TaskSpec) -> int:
    return task.replicas if task.replicas is not None else 1


def total_replicas(job: VolcanoJob) -> int:
    return sum(task_replicas(t) for t in tasks_of(job))


def job_min_available(job: VolcanoJob) -> int:
    value = job.spec.min_available if job.spec is not None else None
    return value if value is not None and value > 0 else total_replicas(job)


def job_queue(job: VolcanoJob) -> str:
    return (job.spec.queue if job.spec is not None else None) or DEFAULT_QUEUE


def max_retry(job: VolcanoJob) -> int:
    value = job.spec.max_retry if job.spec is not None else None
    return value if value is not None and value > 0 else DEFAULT_MAX_RETRY


def plugins_of(job: VolcanoJob) -> dict[str, list[str]]:
    return dict((job.spec.plugins if job.spec is not None else None) or {})


def policy_events(policy: LifecyclePolicy) -> list[str]:
    return [e for e in [policy.event, *(policy.events or [])] if e]


def group_annotation(annotations: dict[str, str] | None) -> str | None:
    """The Volcano PodGroup a pod's annotations make it a member of, if any."""
    annotations = annotations or {}
    return annotations.get(GROUP_NAME_ANNOTATION) or annotations.get(VOLCANO_GROUP_NAME_ANNOTATION) or None


def queue_capability(queue: Queue) -> dict[str, IntOrStringQuantity]:
    return dict((queue.spec.capability if queue.spec is not None else None) or {})


def queue_state(queue: Queue) -> str:
    """The state a Queue is in: status.state once the queue controller wrote it, else Open."""
    return (queue.status.state if queue.status is not None else None) or QUEUE_OPEN


# -- defaulting ------------------------------------------------------------------------------


def _default_job(job: VolcanoJob) -> None:
    """Volcano's mutating webhook: schedulerName volcano, queue default, maxRetry 3, task
    names default<i>, replicas and minAvailable from the tasks."""
    if job.spec is None:
        return
    spec = job.spec
    if not spec.scheduler_name:
        spec.scheduler_name = SCHEDULER_NAME
    if not spec.queue:
        spec.queue = DEFAULT_QUEUE
    if spec.max_retry is None or spec.max_retry == 0:
        spec.max_retry = DEFAULT_MAX_RETRY
    for i, task in enumerate(spec.tasks or []):
        if not task.name:
            task.name = f"default{i}"
        if task.replicas is None:
            task.replicas = 1
        if task.min_available is None:
            task.min_available = task.replicas
    if spec.min_available is None:
        spec.min_available = sum(t.min_available or 0 for t in spec.tasks or [])
    if spec.plugins is not None and any(p in spec.plugins for p in NEEDS_SVC) and "svc" not in spec.plugins:
        spec.plugins["svc"] = []


def _default_queue(queue: Queue) -> None:
    if queue.spec is None:
        queue.spec = QueueSpec()
    if queue.spec.weight is None or queue.spec.weight == 0:
        queue.spec.weight = 1
    if queue.spec.reclaimable is None:
        queue.spec.reclaimable = True


def _default_podgroup(pg: VolcanoPodGroup) -> None:
    if pg.spec is not None and not pg.spec.queue:
        pg.spec.queue = DEFAULT_QUEUE


d.register_defaulter(VolcanoJob, _default_job)
d.register_defaulter(Queue, _default_queue)
d.register_defaulter(VolcanoPodGroup, _default_podgroup)


# -- validation ------------------------------------------------------------------------------


def _validate_quantities(path: str, values: dict[str, Any] | None, errs: list[v.FieldError]) -> None:
    for name, quantity in (values or {}).items():
        try:
            amount = parse_quantity(quantity)
        except ValueError:
            errs.append(v.invalid(f"{path}[{name}]", quantity, "must be a quantity such as 8, 500m or 16Gi"))
            continue
        if amount < 0:
            errs.append(v.invalid(f"{path}[{name}]", v.Unquoted(str(quantity)), "must be non-negative"))


def _validate_policies(path: str, policies: list[LifecyclePolicy] | None, errs: list[v.FieldError]) -> None:
    for i, p in enumerate(policies or []):
        at = f"{path}[{i}]"
        events = policy_events(p)
        if p.event and p.events:
            errs.append(v.invalid(f"{at}.events", p.events, "set event or events, not both"))
        if not events and p.exit_code is None:
            errs.append(v.required(f"{at}.event", "an event (PodFailed, PodEvicted, TaskCompleted, ...) or an exitCode"))
        if events and p.exit_code is not None:
            errs.append(v.invalid(f"{at}.exitCode", p.exit_code, "set an event or an exitCode, not both"))
        for e in events:
            if e not in EVENTS:
                errs.append(v.not_supported(f"{at}.event", e, EVENTS))
        if p.exit_code is not None and p.exit_code == 0:
            errs.append(v.invalid(f"{at}.exitCode", 0, "0 is success and cannot trigger a policy"))
        if not p.action:
            errs.append(v.required(f"{at}.action", "what to do: RestartJob, AbortJob, CompleteJob, TerminateJob"))
        elif p.action not in ACTIONS:
            errs.append(v.not_supported(f"{at}.action", p.action, ACTIONS))


def _validate_job(job: VolcanoJob, errs: list[v.FieldError]) -> None:
    v.validate_object_meta(job.metadata, errs)
    spec = job.spec
    if spec is None or not spec.tasks:
        errs.append(v.required("spec.tasks", "at least one task with replicas and a pod template"))
        return
    names: set[str] = set()
    total = 0
    for i, task in enumerate(spec.tasks):
        at = f"spec.tasks[{i}]"
        name = task.name or f"default{i}"
        if name in names:
            errs.append(v.duplicate(f"{at}.name", name))
        names.add(name)
        if task.name:
            errs.extend(v.invalid(f"{at}.name", task.name, msg) for msg in v.is_dns1123_label(task.name))
        replicas = task_replicas(task)
        if replicas < 0:
            errs.append(v.invalid(f"{at}.replicas", replicas, "must be greater than or equal to 0"))
        total += max(replicas, 0)
        if task.min_available is not None and not 0 <= task.min_available <= replicas:
            errs.append(v.invalid(f"{at}.minAvailable", task.min_available,
                                  f"must be between 0 and the task's replicas ({replicas})"))
        if task.template is None:
            errs.append(v.required(f"{at}.template", "the pod template of the task"))
        else:
            v.validate_pod_template(task.template, f"{at}.template", errs)
        _validate_policies(f"{at}.policies", task.policies, errs)
    if spec.min_available is not None and spec.min_available < 0:
        errs.append(v.invalid("spec.minAvailable", spec.min_available, "must be greater than or equal to 0"))
    elif spec.min_available is not None and spec.min_available > total:
        errs.append(v.invalid("spec.minAvailable", spec.min_available,
                              f"must not be greater than the total replicas of the tasks ({total})"))
    if spec.max_retry is not None and spec.max_retry < 0:
        errs.append(v.invalid("spec.maxRetry", spec.max_retry, "must be greater than or equal to 0"))
    if spec.ttl_seconds_after_finished is not None and spec.ttl_seconds_after_finished < 0:
        errs.append(v.invalid("spec.ttlSecondsAfterFinished", spec.ttl_seconds_after_finished,
                              "must be greater than or equal to 0"))
    if spec.min_success is not None and not 1 <= spec.min_success <= max(total, 1):
        errs.append(v.invalid("spec.minSuccess", spec.min_success,
                              f"must be between 1 and the total replicas of the tasks ({total})"))
    _validate_policies("spec.policies", spec.policies, errs)
    for name in spec.plugins or {}:
        if name not in PLUGINS:
            errs.append(v.not_supported("spec.plugins", name, PLUGINS))


def _validate_queue(queue: Queue, errs: list[v.FieldError]) -> None:
    v.validate_object_meta(queue.metadata, errs)
    spec = queue.spec
    if spec is None:
        return
    if spec.weight is not None and spec.weight < 0:
        errs.append(v.invalid("spec.weight", spec.weight, "must be greater than or equal to 1"))
    _validate_quantities("spec.capability", spec.capability, errs)
    _validate_quantities("spec.deserved", spec.deserved, errs)
    status = queue.status
    if status is not None and status.state is not None and status.state not in QUEUE_STATES:
        errs.append(v.not_supported("status.state", status.state, QUEUE_STATES))


def _validate_podgroup(pg: VolcanoPodGroup, errs: list[v.FieldError]) -> None:
    v.validate_object_meta(pg.metadata, errs)
    spec = pg.spec
    if spec is not None:
        if spec.min_member is not None and spec.min_member < 0:
            errs.append(v.invalid("spec.minMember", spec.min_member, "must be greater than or equal to 0"))
        for task, n in (spec.min_task_member or {}).items():
            if n < 0:
                errs.append(v.invalid(f"spec.minTaskMember[{task}]", n, "must be greater than or equal to 0"))
        _validate_quantities("spec.minResources", spec.min_resources, errs)
    status = pg.status
    if status is not None and status.phase is not None and status.phase not in PG_PHASES:
        errs.append(v.not_supported("status.phase", status.phase, PG_PHASES))


v.register_validator(VolcanoJob, _validate_job)
v.register_validator(Queue, _validate_queue)
v.register_validator(VolcanoPodGroup, _validate_podgroup)


# -- printing (Volcano's CRD columns) -----------------------------------------------------------

JOB_PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "STATUS", "description": "The job's phase (status.state.phase)."},
    {"name": "minAvailable", "type": "integer", "description": "Pods that must run together."},
    {"name": "RUNNINGS", "type": "integer", "description": "Pods running."},
)
JOB_WIDE_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "QUEUE", "priority": 1, "description": "The job's queue."},
)


def job_printer_cells(obj: dict[str, Any]) -> list[Any]:
    status = obj.get("status") or {}
    return [(status.get("state") or {}).get("phase") or "", int(status.get("minAvailable") or 0),
            int(status.get("running") or 0)]


def job_wide_cells(obj: dict[str, Any]) -> list[Any]:
    return [(obj.get("spec") or {}).get("queue") or ""]


PODGROUP_PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "STATUS", "description": "The group's phase."},
    {"name": "minMember", "type": "integer", "description": "Members placed together."},
    {"name": "RUNNINGS", "type": "integer", "description": "Members running."},
)
PODGROUP_WIDE_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "QUEUE", "priority": 1, "description": "The group's queue."},
)


def podgroup_printer_cells(obj: dict[str, Any]) -> list[Any]:
    status = obj.get("status") or {}
    return [status.get("phase") or "", int((obj.get("spec") or {}).get("minMember") or 0),
            int(status.get("running") or 0)]


def podgroup_wide_cells(obj: dict[str, Any]) -> list[Any]:
    return [(obj.get("spec") or {}).get("queue") or ""]


QUEUE_PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "PARENT", "description": "The parent queue."},
)


def queue_printer_cells(obj: dict[str, Any]) -> list[Any]:
    return [(obj.get("spec") or {}).get("parent") or ""]


# -- the gang a Volcano PodGroup is to the scheduler ----------------------------------------------


def gang_view(vpg: VolcanoPodGroup) -> tuple[Any, str | None]:
    """What the scheduler's gang cycle reads of a Volcano PodGroup: a scheduling.x-k8s.io
    PodGroup of the same name with its minMember (at least 1) and minResources, and why the
    gang is held back (None when it may be placed). A group still Pending has not been
    admitted by its Queue (``controllers/volcano``): Volcano's scheduler does not place its
    pods either."""
    from gpufleet.api import podgroup as pg_api

    spec = vpg.spec or VolcanoPodGroupSpec()
    view = pg_api.PodGroup(
        apiVersion=SCHEDULING_API_VERSION, kind="PodGroup", metadata=vpg.metadata,
        spec=pg_api.PodGroupSpec(minMember=max(1, spec.min_member or 1), minResources=spec.min_resources),
    )
    phase = (vpg.status.phase if vpg.status is not None else None) or PG_PENDING
    hold = None
    if phase == PG_PENDING:
        meta = vpg.metadata or ObjectMeta()
        hold = (f"pod group {meta.namespace}/{meta.name} is Pending: queue {spec.queue or DEFAULT_QUEUE} "
                "has not admitted it yet")
    return view, hold
