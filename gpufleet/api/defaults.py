"""Kubernetes defaulting for the built-in kinds.

The API server runs :func:`apply_defaults` on every create and update, before validation, so
a stored object carries exactly the values a real cluster would have filled in: controllers,
the scheduler and `kubectl get -o yaml` see the same object here and there, and a manifest
exported back to Kubernetes round-trips unchanged.

Defaulting only fills what is unset (``None``); it never overwrites a value the user gave, so
applying it twice gives the same object as applying it once. Values that are wrong are left
alone for validation to report.

The values and the places they are applied follow Kubernetes' ``pkg/apis/*/v1/defaults.go``.
Where gpufleet differs on purpose the function says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet.api import k8s

DEFAULT_SCHEDULER_NAME = "default-scheduler"
DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS = 30
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
FINALIZER_KUBERNETES = "kubernetes"
# 0644: what Kubernetes gives secret, configMap, projected and downwardAPI volumes.
DEFAULT_VOLUME_MODE = 0o644
DEFAULT_HPA_CPU_UTILIZATION = 80
MAX_INT32 = 2**31 - 1

Defaulter = Callable[[Any], None]


def apply_defaults(obj: Any) -> None:
    """Fill Kubernetes' defaults into ``obj`` in place; unknown types are left untouched."""
    for cls in type(obj).__mro__:
        fn = _DEFAULTERS.get(cls)
        if fn is not None:
            fn(obj)
            return


def register_defaulter(model: type, fn: Defaulter) -> None:
    """Let kinds defined outside this module (PyTorchJob, PodGroup, queues) plug in."""
    _DEFAULTERS[model] = fn


# --- pods -------------------------------------------------------------------------------


def image_tag(image: str | None) -> str:
    """The tag Kubernetes' image-name parser finds: 'latest' when untagged, '' for a bare digest."""
    if not image:
        return ""
    name, at, _digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        return last.rsplit(":", 1)[1]
    return "" if at else "latest"


def _default_probe(probe: k8s.Probe | None) -> None:
    if probe is None:
        return
    if probe.timeout_seconds is None:
        probe.timeout_seconds = 1
    if probe.period_seconds is None:
        probe.period_seconds = 10
    if probe.success_threshold is None:
        probe.success_threshold = 1
    if probe.failure_threshold is None:
        probe.failure_threshold = 3
    _default_http_get(probe.http_get)


def _default_http_get(action: k8s.HTTPGetAction | None) -> None:
    if action is None:
        return
    if not action.path:
        action.path = "/"
    if not action.scheme:
        action.scheme = "HTTP"


def _default_container(c: k8s.Container) -> None:
    if not c.image_pull_policy:
        c.image_pull_policy = "Always" if image_tag(c.image) == "latest" else "IfNotPresent"
    if not c.termination_message_path:
        c.termination_message_path = TERMINATION_MESSAGE_PATH
    if not c.termination_message_policy:
        c.termination_message_policy = "File"
    for port in c.ports or []:
        if not port.protocol:
            port.protocol = "TCP"
    for probe in (c.liveness_probe, c.readiness_probe, c.startup_probe):
        _default_probe(probe)
    if c.lifecycle is not None:
        for handler in (c.lifecycle.post_start, c.lifecycle.pre_stop):
            if handler is not None:
                _default_http_get(handler.http_get)
    for env in c.env or []:
        if env.value_from is not None and env.value_from.field_ref is not None:
            if not env.value_from.field_ref.api_version:
                env.value_from.field_ref.api_version = "v1"


def _default_volume(v: k8s.Volume) -> None:
    for source in (v.secret, v.config_map, v.projected, v.downward_api):
        if source is not None and source.default_mode is None:
            source.default_mode = DEFAULT_VOLUME_MODE


def _default_pod_spec(spec: k8s.PodSpec, *, restart_policy: str | None = "Always") -> None:
    """What every PodSpec gets, in a Pod or in a template (Kubernetes' SetDefaults_PodSpec)."""
    if not spec.dns_policy:
        spec.dns_policy = "ClusterFirst"
    if not spec.restart_policy and restart_policy is not None:
        spec.restart_policy = restart_policy
    if spec.security_context is None:
        spec.security_context = k8s.PodSecurityContext()
    if spec.termination_grace_period_seconds is None:
        spec.termination_grace_period_seconds = DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS
    if not spec.scheduler_name:
        spec.scheduler_name = DEFAULT_SCHEDULER_NAME
    for c in [*(spec.init_containers or []), *spec.containers]:
        _default_container(c)
    for v in spec.volumes or []:
        _default_volume(v)


def _requests_from_limits(c: k8s.Container) -> None:
    if c.resources is None or not c.resources.limits:
        return
    requests = dict(c.resources.requests or {})
    for name, value in c.resources.limits.items():
        requests.setdefault(name, value)
    c.resources.requests = requests


def _default_pod(pod: k8s.Pod) -> None:
    spec = pod.spec
    if spec is None:
        return  # validation reports the missing containers
    _default_pod_spec(spec)
    # Kubernetes does the next three for Pods only, not for templates: the pods a controller
    # stamps out get them when they are created, and templates stay as the user wrote them.
    for c in [*(spec.init_containers or []), *spec.containers]:
        _requests_from_limits(c)
    if spec.enable_service_links is None:
        spec.enable_service_links = True
    # v1's deprecated serviceAccount is an alias of serviceAccountName, which wins when both
    # are given; a v1 pod shows both (Kubernetes' PodSpec conversion).
    if spec.service_account_name or spec.service_account:
        spec.service_account_name = spec.service_account_name or spec.service_account
        spec.service_account = spec.service_account_name
    if spec.host_network:
        for c in [*(spec.init_containers or []), *spec.containers]:
            for port in c.ports or []:
                if port.host_port is None:
                    port.host_port = port.container_port


def _default_pod_template(
    template: k8s.PodTemplateSpec | None, *, restart_policy: str | None = "Always"
) -> None:
    if template is not None and template.spec is not None:
        _default_pod_spec(template.spec, restart_policy=restart_policy)


# --- workloads --------------------------------------------------------------------------


def _default_deployment(d: k8s.Deployment) -> None:
    spec = d.spec
    if spec.replicas is None:
        spec.replicas = 1
    if spec.strategy is None:
        spec.strategy = k8s.DeploymentStrategy()
    if not spec.strategy.type:
        spec.strategy.type = "RollingUpdate"
    if spec.strategy.type == "RollingUpdate":
        if spec.strategy.rolling_update is None:
            spec.strategy.rolling_update = k8s.RollingUpdateDeployment()
        ru = spec.strategy.rolling_update
        if ru.max_unavailable is None:
            ru.max_unavailable = "25%"
        if ru.max_surge is None:
            ru.max_surge = "25%"
    if spec.revision_history_limit is None:
        spec.revision_history_limit = 10
    if spec.progress_deadline_seconds is None:
        spec.progress_deadline_seconds = 600
    _default_pod_template(spec.template)


def _default_replica_set(rs: k8s.ReplicaSet) -> None:
    if rs.spec.replicas is None:
        rs.spec.replicas = 1
    _default_pod_template(rs.spec.template)


def _default_stateful_set(sts: k8s.StatefulSet) -> None:
    spec = sts.spec
    if not spec.pod_management_policy:
        spec.pod_management_policy = "OrderedReady"
    if spec.update_strategy is None:
        spec.update_strategy = k8s.StatefulSetUpdateStrategy()
    strategy = spec.update_strategy
    if not strategy.type:
        strategy.type = "RollingUpdate"
        if strategy.rolling_update is None:
            strategy.rolling_update = k8s.RollingUpdateStatefulSetStrategy()
    if strategy.type == "RollingUpdate" and strategy.rolling_update is not None \
            and strategy.rolling_update.partition is None:
        strategy.rolling_update.partition = 0
    if spec.persistent_volume_claim_retention_policy is None:
        spec.persistent_volume_claim_retention_policy = k8s.StatefulSetPersistentVolumeClaimRetentionPolicy()
    policy = spec.persistent_volume_claim_retention_policy
    if not policy.when_deleted:
        policy.when_deleted = "Retain"
    if not policy.when_scaled:
        policy.when_scaled = "Retain"
    if spec.replicas is None:
        spec.replicas = 1
    if spec.revision_history_limit is None:
        spec.revision_history_limit = 10
    for claim in spec.volume_claim_templates or []:
        _default_persistent_volume_claim(claim)
    _default_pod_template(spec.template)


def _default_daemon_set(ds: k8s.DaemonSet) -> None:
    spec = ds.spec
    if spec.update_strategy is None:
        spec.update_strategy = k8s.DaemonSetUpdateStrategy()
    strategy = spec.update_strategy
    if not strategy.type:
        strategy.type = "RollingUpdate"
    if strategy.type == "RollingUpdate":
        if strategy.rolling_update is None:
            strategy.rolling_update = k8s.RollingUpdateDaemonSet()
        if strategy.rolling_update.max_unavailable is None:
            strategy.rolling_update.max_unavailable = 1
        if strategy.rolling_update.max_surge is None:
            strategy.rolling_update.max_surge = 0
    if spec.revision_history_limit is None:
        spec.revision_history_limit = 10
    _default_pod_template(spec.template)


def _default_job(job: k8s.Job) -> None:
    spec = job.spec
    if spec is None:
        return
    # A non-parallel job may leave both unset; a work-queue job sets only parallelism and
    # must keep completions unset.
    if spec.completions is None and spec.parallelism is None:
        spec.completions = 1
        spec.parallelism = 1
    if spec.parallelism is None:
        spec.parallelism = 1
    if spec.backoff_limit is None:
        spec.backoff_limit = MAX_INT32 if spec.backoff_limit_per_index is not None else 6
    if spec.completion_mode is None:
        spec.completion_mode = "NonIndexed"
    if spec.suspend is None:
        spec.suspend = False
    for rule in (spec.pod_failure_policy.rules if spec.pod_failure_policy is not None else None) or []:
        for pattern in rule.on_pod_conditions or []:
            if pattern.status is None:
                pattern.status = "True"
    if spec.pod_replacement_policy is None:
        spec.pod_replacement_policy = (
            "Failed" if spec.pod_failure_policy is not None else "TerminatingOrFailed"
        )
    template_labels = spec.template.metadata.labels if spec.template.metadata is not None else None
    if template_labels is not None:
        if job.metadata is None:
            job.metadata = k8s.ObjectMeta()
        if not job.metadata.labels:
            job.metadata.labels = dict(template_labels)
    # Kubernetes would default the template's restartPolicy to Always and then reject the
    # Job for it; leaving it unset lets validation say what is actually wanted.
    _default_pod_template(spec.template, restart_policy=None)


def _default_cron_job(cj: k8s.CronJob) -> None:
    spec = cj.spec
    if not spec.concurrency_policy:
        spec.concurrency_policy = "Allow"
    if spec.suspend is None:
        spec.suspend = False
    if spec.successful_jobs_history_limit is None:
        spec.successful_jobs_history_limit = 3
    if spec.failed_jobs_history_limit is None:
        spec.failed_jobs_history_limit = 1
    # Kubernetes defaults the Job template's pod template only; its Job fields (completions,
    # backoffLimit, ...) are defaulted on each Job made from it. restartPolicy: as for a Job.
    if spec.job_template.spec is not None:
        _default_pod_template(spec.job_template.spec.template, restart_policy=None)


# --- services ---------------------------------------------------------------------------


def _externally_accessible(spec: k8s.ServiceSpec) -> bool:
    return spec.type in ("LoadBalancer", "NodePort") or (spec.type == "ClusterIP" and bool(spec.external_ips))


def _default_service(svc: k8s.Service) -> None:
    if svc.spec is None:
        svc.spec = k8s.ServiceSpec()
    spec = svc.spec
    if not spec.session_affinity:
        spec.session_affinity = "None"
    if spec.session_affinity == "None":
        spec.session_affinity_config = None
    if not spec.type:
        spec.type = "ClusterIP"
    for port in spec.ports or []:
        if not port.protocol:
            port.protocol = "TCP"
        if port.target_port is None or port.target_port == 0 or port.target_port == "":
            port.target_port = port.port
    if _externally_accessible(spec) and not spec.external_traffic_policy:
        spec.external_traffic_policy = "Cluster"
    if spec.internal_traffic_policy is None and spec.type in ("ClusterIP", "NodePort", "LoadBalancer"):
        spec.internal_traffic_policy = "Cluster"
    if spec.type == "LoadBalancer" and spec.allocate_load_balancer_node_ports is None:
        spec.allocate_load_balancer_node_ports = True


# --- autoscaling ------------------------------------------------------------------------


def _scale_up_rules() -> k8s.HPAScalingRules:
    return k8s.HPAScalingRules(
        stabilization_window_seconds=0,
        select_policy="Max",
        policies=[
            k8s.HPAScalingPolicy(type="Percent", value=100, period_seconds=15),
            k8s.HPAScalingPolicy(type="Pods", value=4, period_seconds=15),
        ],
    )


def _scale_down_rules() -> k8s.HPAScalingRules:
    return k8s.HPAScalingRules(
        stabilization_window_seconds=300,
        select_policy="Max",
        policies=[k8s.HPAScalingPolicy(type="Percent", value=100, period_seconds=15)],
    )


def _fill_rules(given: k8s.HPAScalingRules | None, defaults: k8s.HPAScalingRules) -> k8s.HPAScalingRules:
    if given is None:
        return defaults
    if given.select_policy is None:
        given.select_policy = defaults.select_policy
    if given.stabilization_window_seconds is None:
        given.stabilization_window_seconds = defaults.stabilization_window_seconds
    # An explicit empty list stays empty so that validation can reject it, as Kubernetes does.
    if given.policies is None:
        given.policies = defaults.policies
    return given


def _default_hpa(hpa: k8s.HorizontalPodAutoscaler) -> None:
    spec = hpa.spec
    if spec.min_replicas is None:
        spec.min_replicas = 1
    if not spec.metrics:
        spec.metrics = [
            k8s.MetricSpec(
                type="Resource",
                resource=k8s.ResourceMetricSource(
                    name="cpu",
                    target=k8s.MetricTarget(
                        type="Utilization", average_utilization=DEFAULT_HPA_CPU_UTILIZATION
                    ),
                ),
            )
        ]
    # Deliberate difference: Kubernetes fills behavior only when the user wrote one and leaves
    # the scale-down window to a controller flag (300s). We always write the documented
    # defaults into the object so the hpa controller reads one source of truth, and the
    # exported object means the same on a real cluster.
    if spec.behavior is None:
        spec.behavior = k8s.HorizontalPodAutoscalerBehavior()
    spec.behavior.scale_up = _fill_rules(spec.behavior.scale_up, _scale_up_rules())
    spec.behavior.scale_down = _fill_rules(spec.behavior.scale_down, _scale_down_rules())


# --- cluster objects --------------------------------------------------------------------


def _default_priority_class(pc: k8s.PriorityClass) -> None:
    if pc.preemption_policy is None:
        pc.preemption_policy = "PreemptLowerPriority"


# --- storage ----------------------------------------------------------------------------


def _pending(obj: k8s.PersistentVolume | k8s.PersistentVolumeClaim, status: type) -> None:
    """A new volume or claim is Pending until the PV controller has looked at it."""
    if obj.status is None:
        obj.status = status()
    if not obj.status.phase:
        obj.status.phase = "Pending"


def _default_persistent_volume(pv: k8s.PersistentVolume) -> None:
    # Kubernetes' SetDefaults_PersistentVolume: a new volume is Pending until the PV
    # controller has looked at it.
    if pv.spec is not None:
        if not pv.spec.persistent_volume_reclaim_policy:
            pv.spec.persistent_volume_reclaim_policy = "Retain"
        if pv.spec.volume_mode is None:
            pv.spec.volume_mode = "Filesystem"
    _pending(pv, k8s.PersistentVolumeStatus)


def _default_persistent_volume_claim(pvc: k8s.PersistentVolumeClaim) -> None:
    if pvc.spec is not None and pvc.spec.volume_mode is None:
        pvc.spec.volume_mode = "Filesystem"
    _pending(pvc, k8s.PersistentVolumeClaimStatus)


def _default_storage_class(sc: k8s.StorageClass) -> None:
    if sc.reclaim_policy is None:
        sc.reclaim_policy = "Delete"
    if sc.volume_binding_mode is None:
        sc.volume_binding_mode = "Immediate"


def _default_namespace(ns: k8s.Namespace) -> None:
    if ns.metadata is not None and ns.metadata.name:
        labels = dict(ns.metadata.labels or {})
        labels[NAMESPACE_NAME_LABEL] = ns.metadata.name
        ns.metadata.labels = labels
    # The "kubernetes" finalizer is a create-time default: the namespace controller removes
    # it while deleting, and re-adding it on that update would block deletion forever. A
    # namespace without a phase has not been stored yet.
    created = ns.status is not None and bool(ns.status.phase)
    if not created:
        if ns.spec is None:
            ns.spec = k8s.NamespaceSpec()
        finalizers = list(ns.spec.finalizers or [])
        if FINALIZER_KUBERNETES not in finalizers:
            finalizers.append(FINALIZER_KUBERNETES)
        ns.spec.finalizers = finalizers
    if ns.status is None:
        ns.status = k8s.NamespaceStatus()
    if not ns.status.phase:
        ns.status.phase = "Active"


def _default_node(node: k8s.Node) -> None:
    status = node.status
    if status is not None and status.allocatable is None and status.capacity is not None:
        status.allocatable = dict(status.capacity)


def _default_secret(secret: k8s.Secret) -> None:
    if not secret.type:
        secret.type = "Opaque"


def _default_limit_range(lr: k8s.LimitRange) -> None:
    # Kubernetes' SetDefaults_LimitRangeItem: the object itself gets its implied defaults,
    # so admission (which applies them to pods) has nothing to infer.
    if lr.spec is None:
        return
    for item in lr.spec.limits:
        if item.type != "Container":
            continue
        default = dict(item.default or {})
        default_request = dict(item.default_request or {})
        for name, value in (item.max or {}).items():
            default.setdefault(name, value)
        for name, value in default.items():
            default_request.setdefault(name, value)
        for name, value in (item.min or {}).items():
            default_request.setdefault(name, value)
        item.default = default
        item.default_request = default_request


_DEFAULTERS: dict[type, Defaulter] = {
    k8s.Pod: _default_pod,
    k8s.PodTemplateSpec: _default_pod_template,
    k8s.PodSpec: _default_pod_spec,
    k8s.Deployment: _default_deployment,
    k8s.ReplicaSet: _default_replica_set,
    k8s.StatefulSet: _default_stateful_set,
    k8s.DaemonSet: _default_daemon_set,
    k8s.Job: _default_job,
    k8s.CronJob: _default_cron_job,
    k8s.Service: _default_service,
    k8s.HorizontalPodAutoscaler: _default_hpa,
    k8s.PriorityClass: _default_priority_class,
    k8s.Namespace: _default_namespace,
    k8s.Node: _default_node,
    k8s.Secret: _default_secret,
    k8s.LimitRange: _default_limit_range,
    k8s.PersistentVolume: _default_persistent_volume,
    k8s.PersistentVolumeClaim: _default_persistent_volume_claim,
    k8s.StorageClass: _default_storage_class,
}
