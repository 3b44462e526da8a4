"""PyTorchJob (kubeflow.org/v1), the distributed-training kind of the Kubeflow training
operator: a Master and Workers made from pod templates, torchrun's elastic settings, and the
run policy shared by every Kubeflow job.

The shape is upstream's (pkg/apis/kubeflow.org/v1 pytorch_types.go and common_types.go), so
a manifest written for a cluster running the training operator applies here unchanged.
Importing this module registers the kind's defaulting and validation; the API server's
table printer reads ``PRINTER_COLUMNS`` and ``printer_cells``.

The scale subresource maps to ``spec.pytorchReplicaSpecs.Worker.replicas`` (as upstream's
CRD declares it), so validation is also what refuses a scale outside
``elasticPolicy.minReplicas..maxReplicas``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field

from gpufleet.api import defaults as d
from gpufleet.api import validation as v
from gpufleet.api.intorstring import IntOrStringQuantity, KeepsTemplateNumbers
from gpufleet.api.k8s import K8sModel, ListMeta, MetricSpec, ObjectMeta, PodTemplateSpec, Time
from gpufleet.api.kubeflow_names import (  # noqa: F401 (re-exported)
    API_VERSION,
    DEFAULT_CONTAINER_NAME,
    DEFAULT_PORT,
    DEFAULT_PORT_NAME,
    GROUP,
    KIND,
    RENDEZVOUS_PORT_ANNOTATION,
    VERSION,
    rendezvous_port,
)
from gpufleet.api.quantity import parse_quantity

MASTER = "Master"
WORKER = "Worker"
REPLICA_TYPES = (MASTER, WORKER)

# Where the scale subresource reads and writes (upstream's CRD scale paths).
SCALE_SPEC_REPLICAS_PATH = "spec.pytorchReplicaSpecs.Worker.replicas"
SCALE_STATUS_REPLICAS_PATH = "status.replicaStatuses.Worker.active"
SCALE_LABEL_SELECTOR_PATH = "status.replicaStatuses.Worker.selector"

RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("All", "Running", "None")
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")
# runPolicy.managedBy: this controller, or MultiKueue (another cluster runs the job).
TRAINING_OPERATOR = "kubeflow.org/training-operator"
MANAGED_BY = (TRAINING_OPERATOR, "kueue.x-k8s.io/multikueue")
NPROC_WORDS = ("auto", "cpu", "gpu")

# JobConditionType values.
CREATED = "Created"
RUNNING = "Running"
RESTARTING = "Restarting"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
CONDITION_TYPES = (CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)


def _int_to_str(value: Any) -> Any:
    # nprocPerNode is a string upstream ("auto", "gpu", "4"); YAML's `nprocPerNode: 4` is an int.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


IntOrWord = Annotated[str, BeforeValidator(_int_to_str)]


class ReplicaSpec(KeepsTemplateNumbers):
    """How many pods of one replica type, made from which template, restarted how.

    The template is a built-in PodTemplateSpec, but the job is a custom resource: quantities
    its client wrote as numbers (``nvidia.com/gpu: 1``) are stored as numbers, as upstream's
    CRD (int-or-string) keeps them; the pods made from it get Kubernetes' strings."""

    replicas: int | None = Field(default=None, description="How many pods of this type; the Master has exactly 1.")
    template: PodTemplateSpec | None = Field(default=None, description="The pod template of this type.")
    restart_policy: str | None = Field(
        default=None, alias="restartPolicy",
        description="Always, OnFailure, Never or ExitCode (restart on retryable exit codes only).")


class SchedulingPolicy(K8sModel):
    """What gang scheduling and queueing need to know about the job."""

    min_available: int | None = Field(default=None, alias="minAvailable")
    queue: str | None = None
    min_resources: dict[str, IntOrStringQuantity] | None = Field(default=None, alias="minResources")
    priority_class: str | None = Field(default=None, alias="priorityClass")
    schedule_timeout_seconds: int | None = Field(default=None, alias="scheduleTimeoutSeconds")


class RunPolicy(K8sModel):
    """The policy shared by Kubeflow's job kinds: cleanup, limits, scheduling, suspension."""

    clean_pod_policy: str | None = Field(
        default=None, alias="cleanPodPolicy",
        description="Which pods to delete when the job finishes: All, Running or None.")
    ttl_seconds_after_finished: int | None = Field(
        default=None, alias="ttlSecondsAfterFinished",
        description="Delete the finished job this many seconds after it succeeded or failed.")
    active_deadline_seconds: int | None = Field(
        default=None, alias="activeDeadlineSeconds",
        description="Fail the job once it has been active this many seconds.")
    backoff_limit: int | None = Field(
        default=None, alias="backoffLimit", description="How many restarts before the job is marked Failed.")
    scheduling_policy: SchedulingPolicy | None = Field(
        default=None, alias="schedulingPolicy",
        description="Gang scheduling: the minimum members, queue, priority class and timeout of its PodGroup.")
    suspend: bool | None = Field(
        default=None, description="While true no pods run; setting it deletes the running ones.")
    managed_by: str | None = Field(
        default=None, alias="managedBy",
        description="The controller that reconciles the job: kubeflow.org/training-operator (the default) "
                    "or kueue.x-k8s.io/multikueue.")


class RDZVConf(K8sModel):
    key: str | None = None
    value: str | None = None


class ElasticPolicy(K8sModel):
    """torchrun's elastic settings: how many nodes (Workers), rendezvous, restarts."""

    min_replicas: int | None = Field(
        default=None, alias="minReplicas",
        description="The fewest Workers the job may shrink to; `kubectl scale` below it is refused.")
    max_replicas: int | None = Field(
        default=None, alias="maxReplicas",
        description="The most Workers the job may grow to; at least minReplicas.")
    rdzv_backend: str | None = Field(
        default=None, alias="rdzvBackend", description="torchrun's rendezvous backend: c10d, etcd or etcd-v2.")
    rdzv_port: int | None = Field(default=None, alias="rdzvPort", description="The rendezvous endpoint's port.")
    rdzv_host: str | None = Field(default=None, alias="rdzvHost", description="The rendezvous endpoint's host.")
    rdzv_id: str | None = Field(default=None, alias="rdzvId", description="The rendezvous id (--rdzv_id).")
    rdzv_conf: list[RDZVConf] | None = Field(
        default=None, alias="rdzvConf",
        description="Further rendezvous settings as key/value pairs (--rdzv_conf key1=value1,...).")
    standalone: bool | None = Field(
        default=None, description="Run a local c10d rendezvous on port 29400 (--standalone).")
    n_proc_per_node: int | None = Field(
        default=None, alias="nProcPerNode",
        description="Deprecated: processes per Worker; use spec.nprocPerNode instead.")
    max_restarts: int | None = Field(
        default=None, alias="maxRestarts",
        description="How often torchrun restarts the worker group before the job fails (--max_restarts).")
    metrics: list[MetricSpec] | None = Field(
        default=None,
        description="Metrics to scale the Workers on between minReplicas and maxReplicas, as in an "
                    "autoscaling/v2 HorizontalPodAutoscaler.")


class PyTorchJobSpec(K8sModel):
    """What to train: the Master and Workers, the run policy and, for torchrun, the elastic policy."""

    run_policy: RunPolicy | None = Field(
        default=None, alias="runPolicy",
        description="Cleanup, restart limit, deadline, gang scheduling and suspension of the job.")
    elastic_policy: ElasticPolicy | None = Field(
        default=None, alias="elasticPolicy",
        description="Makes the job elastic under torchrun: the Workers may be resized between minReplicas "
                    "and maxReplicas.")
    pytorch_replica_specs: dict[str, ReplicaSpec] | None = Field(
        default=None, alias="pytorchReplicaSpecs",
        description="The replica types, Master and Worker, each with its count and pod template.")
    nproc_per_node: IntOrWord | None = Field(
        default=None, alias="nprocPerNode",
        description="Processes per Worker pod: auto, cpu, gpu or a number (torchrun --nproc_per_node).")


class JobCondition(K8sModel):
    type: str
    status: str
    reason: str | None = None
    message: str | None = None
    last_update_time: Time | None = Field(default=None, alias="lastUpdateTime")
    last_transition_time: Time | None = Field(default=None, alias="lastTransitionTime")


class LabelSelectorModel(K8sModel):
    match_labels: dict[str, str] | None = Field(default=None, alias="matchLabels")
    match_expressions: list[dict[str, Any]] | None = Field(default=None, alias="matchExpressions")


class ReplicaStatus(K8sModel):
    active: int | None = None
    succeeded: int | None = None
    failed: int | None = None
    label_selector: LabelSelectorModel | None = Field(default=None, alias="labelSelector")
    selector: str | None = None


class JobStatus(K8sModel):
    conditions: list[JobCondition] | None = None
    replica_statuses: dict[str, ReplicaStatus] | None = Field(default=None, alias="replicaStatuses")
    start_time: Time | None = Field(default=None, alias="startTime")
    completion_time: Time | None = Field(default=None, alias="completionTime")
    last_reconcile_time: Time | None = Field(default=None, alias="lastReconcileTime")


class PyTorchJob(K8sModel):
    """A distributed PyTorch training job."""

    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = KIND

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: PyTorchJobSpec | None = None
    status: JobStatus | None = None


class PyTorchJobList(K8sModel):
    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "PyTorchJobList"

    api_version: str | None = Field(default=None, alias="apiVersion")
    items: list[PyTorchJob]
    kind: str | None = None
    metadata: ListMeta | None = None


# -- small readers shared by the controller, the printer and validation ----------------------


def replica_specs(job: PyTorchJob) -> dict[str, ReplicaSpec]:
    return dict((job.spec.pytorch_replica_specs if job.spec is not None else None) or {})


def replicas_of(job: PyTorchJob, rtype: str) -> int:
    spec = replica_specs(job).get(rtype)
    if spec is None:
        return 0
    return spec.replicas if spec.replicas is not None else 1


def run_policy(job: PyTorchJob) -> RunPolicy:
    return (job.spec.run_policy if job.spec is not None else None) or RunPolicy()


def is_elastic(job: PyTorchJob) -> bool:
    return job.spec is not None and job.spec.elastic_policy is not None


def elastic_bounds(job: PyTorchJob) -> tuple[int, int]:
    """(minReplicas, maxReplicas) of the Workers, each defaulting to the Worker replicas."""
    workers = replicas_of(job, WORKER)
    ep = job.spec.elastic_policy if job.spec is not None else None
    if ep is None:
        return workers, workers
    lo = ep.min_replicas if ep.min_replicas is not None else workers
    hi = ep.max_replicas if ep.max_replicas is not None else max(workers, lo)
    return lo, hi


# -- defaulting ------------------------------------------------------------------------------


def _default(job: PyTorchJob) -> None:
    """Upstream's SetDefaults_PyTorchJob: replica type names in CamelCase, replicas 1,
    restartPolicy OnFailure, cleanPodPolicy None, elastic bounds from the Worker replicas."""
    if job.spec is None:
        return
    specs = job.spec.pytorch_replica_specs
    if specs:
        renamed: dict[str, ReplicaSpec] = {}
        for name, spec in specs.items():
            canonical = next((t for t in REPLICA_TYPES if t.lower() == name.lower()), name)
            renamed[canonical] = spec
        job.spec.pytorch_replica_specs = renamed
        for spec in renamed.values():
            if spec is None:
                continue
            if spec.replicas is None:
                spec.replicas = 1
            if spec.restart_policy is None:
                spec.restart_policy = "OnFailure"
    if job.spec.run_policy is None:
        job.spec.run_policy = RunPolicy()
    if job.spec.run_policy.clean_pod_policy is None:
        job.spec.run_policy.clean_pod_policy = "None"
    ep = job.spec.elastic_policy
    if ep is not None:
        workers = replicas_of(job, WORKER)
        if ep.min_replicas is None:
            ep.min_replicas = workers
        if ep.max_replicas is None:
            ep.max_replicas = max(workers, ep.min_replicas)
        if ep.rdzv_backend is None:
            ep.rdzv_backend = "c10d"


d.register_defaulter(PyTorchJob, _default)


# -- validation ------------------------------------------------------------------------------


def _validate(job: PyTorchJob, errs: list[v.FieldError]) -> None:
    v.validate_object_meta(job.metadata, errs)
    spec = job.spec
    if spec is None:
        errs.append(v.required("spec.pytorchReplicaSpecs", "a Master and/or Worker replica spec"))
        return
    specs = spec.pytorch_replica_specs
    if not specs:
        errs.append(v.required("spec.pytorchReplicaSpecs", "a Master and/or Worker replica spec"))
    for name, rs in (specs or {}).items():
        path = f"spec.pytorchReplicaSpecs[{name}]"
        if name not in REPLICA_TYPES:
            errs.append(v.not_supported("spec.pytorchReplicaSpecs", name, REPLICA_TYPES))
            continue
        if rs is None:
            errs.append(v.required(path))
            continue
        if rs.replicas is not None and rs.replicas < 0:
            errs.append(v.invalid(f"{path}.replicas", rs.replicas, "must be greater than or equal to 0"))
        if name == MASTER and rs.replicas is not None and rs.replicas != 1:
            errs.append(v.invalid(f"{path}.replicas", rs.replicas, "there must be exactly 1 Master replica"))
        if rs.restart_policy is not None and rs.restart_policy not in RESTART_POLICIES:
            errs.append(v.not_supported(f"{path}.restartPolicy", rs.restart_policy, RESTART_POLICIES))
        v.validate_pod_template(rs.template, f"{path}.template", errs)
    if spec.nproc_per_node is not None:
        npn = spec.nproc_per_node
        if npn not in NPROC_WORDS and not (npn.isdigit() and int(npn) > 0):
            errs.append(v.invalid("spec.nprocPerNode", npn, 'must be a positive number, "auto", "cpu" or "gpu"'))
    _validate_run_policy(spec.run_policy, errs)
    ep = spec.elastic_policy
    if ep is not None:
        _validate_elastic(job, ep, errs)


def _validate_run_policy(rp: RunPolicy | None, errs: list[v.FieldError]) -> None:
    if rp is None:
        return
    if rp.clean_pod_policy is not None and rp.clean_pod_policy not in CLEAN_POD_POLICIES:
        errs.append(v.not_supported("spec.runPolicy.cleanPodPolicy", rp.clean_pod_policy, CLEAN_POD_POLICIES))
    for attr, alias in (("ttl_seconds_after_finished", "ttlSecondsAfterFinished"), ("backoff_limit", "backoffLimit")):
        value = getattr(rp, attr)
        if value is not None and value < 0:
            errs.append(v.invalid(f"spec.runPolicy.{alias}", value, "must be greater than or equal to 0"))
    if rp.active_deadline_seconds is not None and rp.active_deadline_seconds <= 0:
        errs.append(v.invalid("spec.runPolicy.activeDeadlineSeconds", rp.active_deadline_seconds,
                              "must be greater than 0"))
    if rp.managed_by is not None and rp.managed_by not in MANAGED_BY:
        errs.append(v.not_supported("spec.runPolicy.managedBy", rp.managed_by, MANAGED_BY))
    sp = rp.scheduling_policy
    if sp is not None:
        if sp.min_available is not None and sp.min_available < 1:
            errs.append(v.invalid("spec.runPolicy.schedulingPolicy.minAvailable", sp.min_available,
                                  "must be greater than or equal to 1"))
        if sp.schedule_timeout_seconds is not None and sp.schedule_timeout_seconds < 0:
            errs.append(v.invalid("spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds",
                                  sp.schedule_timeout_seconds, "must be greater than or equal to 0"))
        for name, quantity in (sp.min_resources or {}).items():
            path = f"spec.runPolicy.schedulingPolicy.minResources[{name}]"
            try:
                amount = parse_quantity(quantity)
            except ValueError:
                errs.append(v.invalid(path, quantity, "must be a quantity such as 8, 500m or 16Gi"))
                continue
            if amount < 0:
                errs.append(v.invalid(path, v.Unquoted(str(quantity)), "must be non-negative"))


def _validate_elastic(job: PyTorchJob, ep: ElasticPolicy, errs: list[v.FieldError]) -> None:
    path = "spec.elasticPolicy"
    if ep.min_replicas is not None and ep.min_replicas < 1:
        errs.append(v.invalid(f"{path}.minReplicas", ep.min_replicas, "must be greater than or equal to 1"))
    if ep.min_replicas is not None and ep.max_replicas is not None and ep.max_replicas < ep.min_replicas:
        errs.append(v.invalid(f"{path}.maxReplicas", ep.max_replicas,
                              f"must be greater than or equal to minReplicas ({ep.min_replicas})"))
    if ep.rdzv_backend is not None and ep.rdzv_backend not in RDZV_BACKENDS:
        errs.append(v.not_supported(f"{path}.rdzvBackend", ep.rdzv_backend, RDZV_BACKENDS))
    if ep.rdzv_port is not None and not 1 <= ep.rdzv_port <= 65535:
        errs.append(v.invalid(f"{path}.rdzvPort", ep.rdzv_port, "must be between 1 and 65535, inclusive"))
    if ep.max_restarts is not None and ep.max_restarts < 0:
        errs.append(v.invalid(f"{path}.maxRestarts", ep.max_restarts, "must be greater than or equal to 0"))
    if ep.n_proc_per_node is not None and ep.n_proc_per_node < 1:
        errs.append(v.invalid(f"{path}.nProcPerNode", ep.n_proc_per_node, "must be greater than or equal to 1"))
    worker = replica_specs(job).get(WORKER)
    if worker is None:
        errs.append(v.required("spec.pytorchReplicaSpecs[Worker]", "an elastic job resizes its Workers"))
        return
    lo, hi = elastic_bounds(job)
    n = worker.replicas if worker.replicas is not None else 1
    if lo <= hi and not lo <= n <= hi:
        errs.append(v.invalid("spec.pytorchReplicaSpecs[Worker].replicas", n,
                              f"must be between elasticPolicy.minReplicas ({lo}) and maxReplicas ({hi}); "
                              "change the bounds or choose a count within them"))


v.register_validator(PyTorchJob, _validate)


# -- printing ------------------------------------------------------------------------------

PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "State", "description": "The latest condition of the job."},
    {"name": "Workers", "type": "string", "description": "Active Workers / wanted Workers."},
)


def state_of(obj: dict[str, Any]) -> str:
    """The type of the last condition that is True, as upstream's printer column shows it."""
    conds = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    return conds[-1].get("type", "") if conds else ""


def printer_cells(obj: dict[str, Any]) -> list[Any]:
    specs = (obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    worker = specs.get(WORKER) or {}
    want = worker.get("replicas", 1 if worker else 0)
    active = (((obj.get("status") or {}).get("replicaStatuses") or {}).get(WORKER) or {}).get("active") or 0
    return [state_of(obj), f"{active}/{want}"]
