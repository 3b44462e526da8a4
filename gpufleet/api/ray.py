"""KubeRay's kinds (ray.io/v1): RayCluster, a Ray head and groups of Ray workers made from
pod templates, and RayJob, a Ray program run on a RayCluster of its own.

The shapes are KubeRay's (ray-operator/apis/ray/v1 raycluster_types.go and rayjob_types.go),
so a manifest written for a cluster running the KubeRay operator applies here unchanged.
Importing this module registers the kinds' defaulting and validation; the API server's
table printer reads ``*_PRINTER_COLUMNS`` and the ``*_printer_cells`` functions.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field

from gpufleet.api import defaults as d
from gpufleet.api import validation as v
from gpufleet.api.intorstring import KeepsTemplateNumbers
from gpufleet.api.k8s import K8sModel, ListMeta, ObjectMeta, PodTemplateSpec, Time

GROUP = "ray.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
CLUSTER_KIND = "RayCluster"
JOB_KIND = "RayJob"

# RayCluster status.state (KubeRay's ClusterState).
READY = "ready"
SUSPENDED = "suspended"
# RayCluster conditions (KubeRay's RayClusterConditionType).
PROVISIONED = "RayClusterProvisioned"
HEAD_POD_READY = "HeadPodReady"
REPLICA_FAILURE = "ReplicaFailure"
CLUSTER_SUSPENDED = "RayClusterSuspended"

# RayJob status.jobStatus (Ray's JobStatus) and status.jobDeploymentStatus (KubeRay's).
JOB_PENDING = "PENDING"
JOB_RUNNING = "RUNNING"
JOB_STOPPED = "STOPPED"
JOB_SUCCEEDED = "SUCCEEDED"
JOB_FAILED = "FAILED"
TERMINAL_JOB_STATUSES = (JOB_STOPPED, JOB_SUCCEEDED, JOB_FAILED)
DEPLOYMENT_NEW = ""
DEPLOYMENT_INITIALIZING = "Initializing"
DEPLOYMENT_RUNNING = "Running"
DEPLOYMENT_COMPLETE = "Complete"
DEPLOYMENT_FAILED = "Failed"
DEPLOYMENT_SUSPENDING = "Suspending"
DEPLOYMENT_SUSPENDED = "Suspended"
# KubeRay's HTTPMode (the operator posting to the dashboard) is not served yet.
SUBMISSION_MODES = ("K8sJobMode",)

SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")


def _to_str(value: Any) -> Any:
    # rayStartParams is map[string]string upstream; YAML's `num-cpus: 1` is an int.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


StartParam = Annotated[str, BeforeValidator(_to_str)]


class ScaleStrategy(K8sModel):
    workers_to_delete: list[str] | None = Field(
        default=None, alias="workersToDelete",
        description="Worker pods to delete, by name; replicas must be lowered with them (the autoscaler does both).")


class HeadGroupSpec(KeepsTemplateNumbers):
    """The Ray head: its pod template, its `ray start` parameters and its Service."""

    service_type: str | None = Field(default=None, alias="serviceType",
                                     description="The head Service's type (ClusterIP, NodePort, LoadBalancer).")
    head_service: dict[str, Any] | None = Field(default=None, alias="headService",
                                                description="A Service to use as the head Service, merged over the "
                                                            "generated one.")
    enable_ingress: bool | None = Field(default=None, alias="enableIngress")
    ray_start_params: dict[str, StartParam] | None = Field(
        default=None, alias="rayStartParams",
        description="Flags of `ray start --head`, without the dashes (e.g. dashboard-host: 0.0.0.0).")
    template: PodTemplateSpec | None = Field(default=None, description="The head pod's template.")


class WorkerGroupSpec(KeepsTemplateNumbers):
    """A group of identical Ray workers."""

    group_name: str | None = Field(default=None, alias="groupName", description="The group's name, unique.")
    replicas: int | None = Field(default=None, description="How many workers (clamped to minReplicas..maxReplicas).")
    min_replicas: int | None = Field(default=None, alias="minReplicas", description="The fewest workers (default 0).")
    max_replicas: int | None = Field(default=None, alias="maxReplicas",
                                     description="The most workers (default 2147483647).")
    idle_timeout_seconds: int | None = Field(default=None, alias="idleTimeoutSeconds")
    num_of_hosts: int | None = Field(default=None, alias="numOfHosts",
                                     description="Pods per replica (multi-host workers); 1 by default.")
    suspend: bool | None = Field(default=None, description="While true the group has no workers.")
    ray_start_params: dict[str, StartParam] | None = Field(
        default=None, alias="rayStartParams", description="Flags of the workers' `ray start`, without the dashes.")
    template: PodTemplateSpec | None = Field(default=None, description="The workers' pod template.")
    scale_strategy: ScaleStrategy | None = Field(default=None, alias="scaleStrategy")


class AutoscalerOptions(K8sModel):
    upscaling_mode: str | None = Field(default=None, alias="upscalingMode")
    idle_timeout_seconds: int | None = Field(default=None, alias="idleTimeoutSeconds")
    image: str | None = None
    image_pull_policy: str | None = Field(default=None, alias="imagePullPolicy")
    resources: dict[str, Any] | None = None
    env: list[dict[str, Any]] | None = None
    env_from: list[dict[str, Any]] | None = Field(default=None, alias="envFrom")
    volume_mounts: list[dict[str, Any]] | None = Field(default=None, alias="volumeMounts")
    security_context: dict[str, Any] | None = Field(default=None, alias="securityContext")
    version: str | None = Field(default=None, description="v1 or v2: which of Ray's autoscalers runs (v2 here when unset).")


class RayClusterSpec(K8sModel):
    head_group_spec: HeadGroupSpec | None = Field(default=None, alias="headGroupSpec",
                                                  description="The Ray head.")
    worker_group_specs: list[WorkerGroupSpec] | None = Field(default=None, alias="workerGroupSpecs",
                                                             description="The groups of Ray workers.")
    ray_version: str | None = Field(default=None, alias="rayVersion")
    enable_in_tree_autoscaling: bool | None = Field(default=None, alias="enableInTreeAutoscaling")
    autoscaler_options: AutoscalerOptions | None = Field(default=None, alias="autoscalerOptions")
    head_service_annotations: dict[str, str] | None = Field(default=None, alias="headServiceAnnotations")
    suspend: bool | None = Field(default=None, description="While true the cluster has no pods.")
    managed_by: str | None = Field(default=None, alias="managedBy")


class HeadInfo(K8sModel):
    pod_ip: str | None = Field(default=None, alias="podIP")
    service_ip: str | None = Field(default=None, alias="serviceIP")
    pod_name: str | None = Field(default=None, alias="podName")
    service_name: str | None = Field(default=None, alias="serviceName")


class Condition(K8sModel):
    type: str
    status: str
    reason: str | None = None
    message: str | None = None
    last_transition_time: Time | None = Field(default=None, alias="lastTransitionTime")
    observed_generation: int | None = Field(default=None, alias="observedGeneration")


class RayClusterStatus(K8sModel):
    state: str | None = None
    conditions: list[Condition] | None = None
    ready_worker_replicas: int | None = Field(default=None, alias="readyWorkerReplicas")
    available_worker_replicas: int | None = Field(default=None, alias="availableWorkerReplicas")
    desired_worker_replicas: int | None = Field(default=None, alias="desiredWorkerReplicas")
    min_worker_replicas: int | None = Field(default=None, alias="minWorkerReplicas")
    max_worker_replicas: int | None = Field(default=None, alias="maxWorkerReplicas")
    desired_cpu: str | None = Field(default=None, alias="desiredCPU")
    desired_memory: str | None = Field(default=None, alias="desiredMemory")
    desired_gpu: str | None = Field(default=None, alias="desiredGPU")
    desired_tpu: str | None = Field(default=None, alias="desiredTPU")
    last_update_time: Time | None = Field(default=None, alias="lastUpdateTime")
    state_transition_times: dict[str, Time] | None = Field(default=None, alias="stateTransitionTimes")
    endpoints: dict[str, str] | None = None
    head: HeadInfo | None = None
    reason: str | None = None
    observed_generation: int | None = Field(default=None, alias="observedGeneration")


class RayCluster(K8sModel):
    """A Ray cluster: a head and groups of workers."""

    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = CLUSTER_KIND

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: RayClusterSpec | None = None
    status: RayClusterStatus | None = None


class RayClusterList(K8sModel):
    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "RayClusterList"

    api_version: str | None = Field(default=None, alias="apiVersion")
    items: list[RayCluster]
    kind: str | None = None
    metadata: ListMeta | None = None


class RayJobSpec(K8sModel):
    entrypoint: str | None = Field(default=None, description="The command the job runs on the cluster.")
    runtime_env_yaml: str | None = Field(default=None, alias="runtimeEnvYAML",
                                         description="Ray's runtime environment of the job, as YAML.")
    job_id: str | None = Field(default=None, alias="jobId", description="The submission id (generated when unset).")
    metadata: dict[str, str] | None = None
    shutdown_after_job_finishes: bool | None = Field(
        default=None, alias="shutdownAfterJobFinishes",
        description="Delete the RayCluster once the job finished (after ttlSecondsAfterFinished).")
    ttl_seconds_after_finished: int | None = Field(default=None, alias="ttlSecondsAfterFinished")
    active_deadline_seconds: int | None = Field(
        default=None, alias="activeDeadlineSeconds",
        description="Fail the job (reason DeadlineExceeded) once it has been active this many seconds.")
    ray_cluster_spec: RayClusterSpec | None = Field(default=None, alias="rayClusterSpec",
                                                    description="The RayCluster made for the job.")
    cluster_selector: dict[str, str] | None = Field(default=None, alias="clusterSelector",
                                                    description="Run on an existing RayCluster instead "
                                                                "(ray.io/cluster: <name>).")
    submitter_pod_template: PodTemplateSpec | None = Field(default=None, alias="submitterPodTemplate")
    submission_mode: str | None = Field(default=None, alias="submissionMode",
                                        description="K8sJobMode: a submitter Job runs `ray job submit`.")
    entrypoint_num_cpus: float | None = Field(default=None, alias="entrypointNumCpus")
    entrypoint_num_gpus: float | None = Field(default=None, alias="entrypointNumGpus")
    entrypoint_resources: str | None = Field(default=None, alias="entrypointResources")
    backoff_limit: int | None = Field(default=None, alias="backoffLimit")
    suspend: bool | None = None
    managed_by: str | None = Field(default=None, alias="managedBy")


class RayJobStatus(K8sModel):
    job_id: str | None = Field(default=None, alias="jobId")
    ray_cluster_name: str | None = Field(default=None, alias="rayClusterName")
    dashboard_url: str | None = Field(default=None, alias="dashboardURL")
    job_status: str | None = Field(default=None, alias="jobStatus")
    job_deployment_status: str | None = Field(default=None, alias="jobDeploymentStatus")
    reason: str | None = None
    message: str | None = None
    start_time: Time | None = Field(default=None, alias="startTime")
    end_time: Time | None = Field(default=None, alias="endTime")
    succeeded: int | None = None
    failed: int | None = None
    ray_cluster_status: RayClusterStatus | None = Field(default=None, alias="rayClusterStatus")
    observed_generation: int | None = Field(default=None, alias="observedGeneration")


class RayJob(K8sModel):
    """A Ray program run to completion on a RayCluster."""

    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = JOB_KIND

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: RayJobSpec | None = None
    status: RayJobStatus | None = None


class RayJobList(K8sModel):
    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "RayJobList"

    api_version: str | None = Field(default=None, alias="apiVersion")
    items: list[RayJob]
    kind: str | None = None
    metadata: ListMeta | None = None


# -- small readers shared by the controllers, the printer and validation ----------------------

MAX_REPLICAS = 2147483647
AUTOSCALER_VERSIONS = ("v1", "v2")


def worker_groups(spec: RayClusterSpec | None) -> list[WorkerGroupSpec]:
    return list((spec.worker_group_specs if spec is not None else None) or [])


def group_bounds(group: WorkerGroupSpec) -> tuple[int, int]:
    lo = group.min_replicas if group.min_replicas is not None else 0
    hi = group.max_replicas if group.max_replicas is not None else MAX_REPLICAS
    return lo, hi


def desired_replicas(group: WorkerGroupSpec, cluster_suspended: bool = False) -> int:
    """The workers a group wants, as KubeRay counts them: 0 while suspended, else replicas
    (minReplicas when unset) clamped to minReplicas..maxReplicas, times numOfHosts."""
    if cluster_suspended or group.suspend:
        return 0
    lo, hi = group_bounds(group)
    n = group.replicas if group.replicas is not None else lo
    return max(lo, min(hi, n)) * (group.num_of_hosts or 1)


# -- defaulting ------------------------------------------------------------------------------


def _default_cluster_spec(spec: RayClusterSpec | None) -> None:
    if spec is None:
        return
    head = spec.head_group_spec
    if head is not None:
        if head.ray_start_params is None:
            head.ray_start_params = {}
        if head.service_type is None:
            head.service_type = "ClusterIP"
    for group in worker_groups(spec):
        if group.ray_start_params is None:
            group.ray_start_params = {}
        if group.num_of_hosts is None:
            group.num_of_hosts = 1
        if group.min_replicas is None:
            group.min_replicas = 0
        if group.max_replicas is None:
            group.max_replicas = MAX_REPLICAS
        if group.replicas is None:
            group.replicas = group.min_replicas


def _default_cluster(cluster: RayCluster) -> None:
    _default_cluster_spec(cluster.spec)


def _default_job(job: RayJob) -> None:
    if job.spec is None:
        return
    _default_cluster_spec(job.spec.ray_cluster_spec)
    if job.spec.submission_mode is None:
        job.spec.submission_mode = "K8sJobMode"
    if job.spec.shutdown_after_job_finishes is None:
        job.spec.shutdown_after_job_finishes = False
    if job.spec.ttl_seconds_after_finished is None:
        job.spec.ttl_seconds_after_finished = 0
    if job.spec.backoff_limit is None:
        job.spec.backoff_limit = 0


d.register_defaulter(RayCluster, _default_cluster)
d.register_defaulter(RayJob, _default_job)


# -- validation ------------------------------------------------------------------------------


def validate_cluster_spec(spec: RayClusterSpec | None, path: str, errs: list[v.FieldError]) -> None:
    if spec is None:
        errs.append(v.required(path, "a headGroupSpec"))
        return
    head = spec.head_group_spec
    if head is None:
        errs.append(v.required(f"{path}.headGroupSpec", "the Ray head's pod template"))
    else:
        if head.service_type is not None and head.service_type not in SERVICE_TYPES:
            errs.append(v.not_supported(f"{path}.headGroupSpec.serviceType", head.service_type, SERVICE_TYPES))
        _validate_template(head.template, f"{path}.headGroupSpec.template", errs)
    opts = spec.autoscaler_options
    if opts is not None and opts.version is not None and opts.version not in AUTOSCALER_VERSIONS:
        errs.append(v.not_supported(f"{path}.autoscalerOptions.version", opts.version, AUTOSCALER_VERSIONS))
    seen: set[str] = set()
    for i, group in enumerate(worker_groups(spec)):
        gp = f"{path}.workerGroupSpecs[{i}]"
        if not group.group_name:
            errs.append(v.required(f"{gp}.groupName", "a name for the worker group"))
        elif group.group_name in seen:
            errs.append(v.duplicate(f"{gp}.groupName", group.group_name, "worker group names must be unique"))
        else:
            seen.add(group.group_name)
        for attr, alias in (("replicas", "replicas"), ("min_replicas", "minReplicas"),
                            ("max_replicas", "maxReplicas"), ("idle_timeout_seconds", "idleTimeoutSeconds")):
            value = getattr(group, attr)
            if value is not None and value < 0:
                errs.append(v.invalid(f"{gp}.{alias}", value, "must be greater than or equal to 0"))
        if group.num_of_hosts is not None and group.num_of_hosts < 1:
            errs.append(v.invalid(f"{gp}.numOfHosts", group.num_of_hosts, "must be greater than or equal to 1"))
        lo, hi = group_bounds(group)
        if hi < lo:
            errs.append(v.invalid(f"{gp}.maxReplicas", hi, f"must be greater than or equal to minReplicas ({lo})"))
        _validate_template(group.template, f"{gp}.template", errs)


def _validate_template(template: PodTemplateSpec | None, path: str, errs: list[v.FieldError]) -> None:
    if template is None or template.spec is None or not template.spec.containers:
        errs.append(v.required(f"{path}.spec.containers", "at least one container (the first runs Ray)"))
        return
    v.validate_pod_template(template, path, errs)


def _validate_cluster(cluster: RayCluster, errs: list[v.FieldError]) -> None:
    v.validate_object_meta(cluster.metadata, errs)
    validate_cluster_spec(cluster.spec, "spec", errs)


def _validate_job(job: RayJob, errs: list[v.FieldError]) -> None:
    v.validate_object_meta(job.metadata, errs)
    spec = job.spec
    if spec is None:
        errs.append(v.required("spec", "an entrypoint and a rayClusterSpec or clusterSelector"))
        return
    if spec.ray_cluster_spec is not None and spec.cluster_selector:
        errs.append(v.invalid("spec.clusterSelector", v.Unquoted("{...}"),
                              "give either rayClusterSpec (a cluster made for the job) or clusterSelector "
                              "(an existing cluster), not both"))
    elif spec.ray_cluster_spec is None and not spec.cluster_selector:
        errs.append(v.required("spec.rayClusterSpec", "the cluster to run on, or spec.clusterSelector"))
    if spec.ray_cluster_spec is not None:
        validate_cluster_spec(spec.ray_cluster_spec, "spec.rayClusterSpec", errs)
    if spec.submission_mode is not None and spec.submission_mode not in SUBMISSION_MODES:
        errs.append(v.not_supported("spec.submissionMode", spec.submission_mode, SUBMISSION_MODES))
    if not spec.entrypoint and spec.submitter_pod_template is None:
        errs.append(v.required("spec.entrypoint", "the command to run, e.g. python train.py"))
    for attr, alias in (("ttl_seconds_after_finished", "ttlSecondsAfterFinished"), ("backoff_limit", "backoffLimit")):
        value = getattr(spec, attr)
        if value is not None and value < 0:
            errs.append(v.invalid(f"spec.{alias}", value, "must be greater than or equal to 0"))
    if spec.active_deadline_seconds is not None and spec.active_deadline_seconds <= 0:
        errs.append(v.invalid("spec.activeDeadlineSeconds", spec.active_deadline_seconds, "must be greater than 0"))
    if spec.submitter_pod_template is not None:
        _validate_template(spec.submitter_pod_template, "spec.submitterPodTemplate", errs)


v.register_validator(RayCluster, _validate_cluster)
v.register_validator(RayJob, _validate_job)


# -- printing ------------------------------------------------------------------------------

# KubeRay's printer columns (kubebuilder:printcolumn), in its order; Age is added by the printer.
CLUSTER_PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Desired Workers", "type": "integer", "description": "status.desiredWorkerReplicas"},
    {"name": "Available Workers", "type": "integer", "description": "status.availableWorkerReplicas"},
    {"name": "CPUs", "description": "status.desiredCPU"},
    {"name": "Memory", "description": "status.desiredMemory"},
    {"name": "GPUs", "description": "status.desiredGPU"},
    {"name": "Status", "description": "status.state"},
)
CLUSTER_WIDE_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Head Pod IP", "description": "status.head.podIP", "priority": 1},
    {"name": "Head Service IP", "description": "status.head.serviceIP", "priority": 1},
)


def cluster_printer_cells(obj: dict[str, Any]) -> list[Any]:
    st = obj.get("status") or {}
    return [st.get("desiredWorkerReplicas", 0), st.get("availableWorkerReplicas", 0), st.get("desiredCPU", ""),
            st.get("desiredMemory", ""), st.get("desiredGPU", ""), st.get("state", "")]


def cluster_wide_cells(obj: dict[str, Any]) -> list[Any]:
    head = (obj.get("status") or {}).get("head") or {}
    return [head.get("podIP", ""), head.get("serviceIP", "")]


JOB_PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Job Status", "description": "status.jobStatus"},
    {"name": "Deployment Status", "description": "status.jobDeploymentStatus"},
    {"name": "Ray Cluster Name", "description": "status.rayClusterName"},
    {"name": "Start Time", "description": "status.startTime"},
    {"name": "End Time", "description": "status.endTime"},
)


def job_printer_cells(obj: dict[str, Any]) -> list[Any]:
    st = obj.get("status") or {}
    return [st.get("jobStatus", ""), st.get("jobDeploymentStatus", ""), st.get("rayClusterName", ""),
            st.get("startTime", ""), st.get("endTime", "")]
