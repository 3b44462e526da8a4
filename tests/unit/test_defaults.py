import copy

import pytest

from gpufleet.api import k8s
from gpufleet.api.defaults import apply_defaults, image_tag


def pod_manifest(**spec_overrides) -> dict:
    spec = {
        "containers": [
            {
                "name": "trainer",
                "image": "pytorch/pytorch:2.3.0-cuda12.1",
                "ports": [{"containerPort": 29500}],
                "resources": {"limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"}},
            }
        ]
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train-0", "namespace": "ml"},
        "spec": spec,
    }


def template(**spec_overrides) -> dict:
    spec = {"containers": [{"name": "server", "image": "vllm/vllm-openai:v0.5.0"}]}
    spec.update(spec_overrides)
    return {"metadata": {"labels": {"app": "llm"}}, "spec": spec}


def deployment_manifest(**spec_overrides) -> dict:
    spec = {"selector": {"matchLabels": {"app": "llm"}}, "template": template()}
    spec.update(spec_overrides)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": spec,
    }


def job_manifest(**spec_overrides) -> dict:
    spec = {"template": template(restartPolicy="Never")}
    spec.update(spec_overrides)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "eval", "namespace": "ml"},
        "spec": spec,
    }


def hpa_manifest(**spec_overrides) -> dict:
    spec = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
        "maxReplicas": 8,
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": spec,
    }


def defaulted(model: type, manifest: dict):
    obj = model.model_validate(manifest)
    apply_defaults(obj)
    return obj


# --- pods --------------------------------------------------------------------------------


def test_pod_spec_defaults():
    pod = defaulted(k8s.Pod, pod_manifest())
    spec = pod.spec
    assert spec.restart_policy == "Always"
    assert spec.dns_policy == "ClusterFirst"
    assert spec.termination_grace_period_seconds == 30
    assert spec.scheduler_name == "default-scheduler"
    assert spec.security_context == k8s.PodSecurityContext()
    assert spec.enable_service_links is True
    assert pod.to_dict()["spec"]["securityContext"] == {}


def test_container_defaults():
    c = defaulted(k8s.Pod, pod_manifest()).spec.containers[0]
    assert c.image_pull_policy == "IfNotPresent"
    assert c.termination_message_path == "/dev/termination-log"
    assert c.termination_message_policy == "File"
    assert c.ports[0].protocol == "TCP"


@pytest.mark.parametrize(
    "image, policy",
    [
        ("nginx", "Always"),
        ("nginx:latest", "Always"),
        ("registry.local:5000/team/nginx", "Always"),
        ("registry.local:5000/team/nginx:1.25", "IfNotPresent"),
        ("nginx:1.25", "IfNotPresent"),
        ("nginx@sha256:" + "a" * 64, "IfNotPresent"),
        ("nginx:latest@sha256:" + "a" * 64, "Always"),
    ],
)
def test_image_pull_policy_follows_the_tag(image, policy):
    manifest = pod_manifest()
    manifest["spec"]["containers"][0]["image"] = image
    assert defaulted(k8s.Pod, manifest).spec.containers[0].image_pull_policy == policy


def test_image_tag_parsing():
    assert image_tag("localhost:5000/img") == "latest"
    assert image_tag("img:v1") == "v1"
    assert image_tag("") == ""


def test_explicit_values_are_kept():
    manifest = pod_manifest(restartPolicy="OnFailure", dnsPolicy="Default", terminationGracePeriodSeconds=5)
    manifest["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    pod = defaulted(k8s.Pod, manifest)
    assert pod.spec.restart_policy == "OnFailure"
    assert pod.spec.dns_policy == "Default"
    assert pod.spec.termination_grace_period_seconds == 5
    assert pod.spec.containers[0].image_pull_policy == "Never"


def test_requests_default_from_limits_including_gpus():
    pod = defaulted(k8s.Pod, pod_manifest())
    assert pod.spec.containers[0].resources.requests == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"}


def test_requests_given_are_not_overwritten():
    manifest = pod_manifest()
    manifest["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1"}
    pod = defaulted(k8s.Pod, manifest)
    assert pod.spec.containers[0].resources.requests == {"cpu": "1", "memory": "16Gi", "nvidia.com/gpu": "2"}


def test_init_containers_are_defaulted_too():
    manifest = pod_manifest(
        initContainers=[{"name": "fetch", "image": "busybox", "resources": {"limits": {"cpu": "1"}}}]
    )
    init = defaulted(k8s.Pod, manifest).spec.init_containers[0]
    assert init.image_pull_policy == "Always"
    assert init.resources.requests == {"cpu": "1"}


def test_probe_defaults():
    manifest = pod_manifest()
    manifest["spec"]["containers"][0]["livenessProbe"] = {"httpGet": {"port": 8000}}
    manifest["spec"]["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": "http"}, "periodSeconds": 3}
    c = defaulted(k8s.Pod, manifest).spec.containers[0]
    live = c.liveness_probe
    assert (live.timeout_seconds, live.period_seconds, live.success_threshold, live.failure_threshold) == (
        1,
        10,
        1,
        3,
    )
    assert (live.http_get.path, live.http_get.scheme) == ("/", "HTTP")
    assert c.readiness_probe.period_seconds == 3


def test_host_network_pods_get_host_ports():
    pod = defaulted(k8s.Pod, pod_manifest(hostNetwork=True))
    assert pod.spec.containers[0].ports[0].host_port == 29500


def test_volume_modes_and_field_ref_version():
    manifest = pod_manifest(
        volumes=[{"name": "creds", "secret": {"secretName": "hf"}}, {"name": "cache", "emptyDir": {}}]
    )
    manifest["spec"]["containers"][0]["env"] = [
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    ]
    pod = defaulted(k8s.Pod, manifest)
    assert pod.spec.volumes[0].secret.default_mode == 0o644
    assert pod.spec.containers[0].env[0].value_from.field_ref.api_version == "v1"


def test_pod_template_gets_pod_spec_defaults_but_not_pod_only_ones():
    tmpl = k8s.PodTemplateSpec.model_validate(
        template(containers=[{"name": "s", "image": "x:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}])
    )
    apply_defaults(tmpl)
    assert tmpl.spec.restart_policy == "Always"
    assert tmpl.spec.containers[0].termination_message_policy == "File"
    # As in Kubernetes: the pods made from the template get these when they are created.
    assert tmpl.spec.containers[0].resources.requests is None
    assert tmpl.spec.enable_service_links is None


# --- workloads ---------------------------------------------------------------------------


def test_deployment_defaults():
    d = defaulted(k8s.Deployment, deployment_manifest())
    assert d.spec.replicas == 1
    assert d.spec.strategy.type == "RollingUpdate"
    assert d.spec.strategy.rolling_update.max_surge == "25%"
    assert d.spec.strategy.rolling_update.max_unavailable == "25%"
    assert d.spec.revision_history_limit == 10
    assert d.spec.progress_deadline_seconds == 600
    assert d.spec.template.spec.restart_policy == "Always"
    assert d.spec.template.spec.containers[0].image_pull_policy == "IfNotPresent"


def test_deployment_recreate_gets_no_rolling_update():
    d = defaulted(k8s.Deployment, deployment_manifest(strategy={"type": "Recreate"}))
    assert d.spec.strategy.rolling_update is None


def test_deployment_partial_rolling_update_is_completed():
    d = defaulted(k8s.Deployment, deployment_manifest(strategy={"rollingUpdate": {"maxSurge": 1}}))
    assert d.spec.strategy.rolling_update.max_surge == 1
    assert d.spec.strategy.rolling_update.max_unavailable == "25%"


def test_replica_set_defaults():
    rs = defaulted(
        k8s.ReplicaSet,
        {
            "metadata": {"name": "llm-abc"},
            "spec": {"selector": {"matchLabels": {"app": "llm"}}, "template": template()},
        },
    )
    assert rs.spec.replicas == 1
    assert rs.spec.template.spec.dns_policy == "ClusterFirst"


def test_job_defaults():
    job = defaulted(k8s.Job, job_manifest())
    spec = job.spec
    assert (spec.parallelism, spec.completions, spec.backoff_limit) == (1, 1, 6)
    assert spec.completion_mode == "NonIndexed"
    assert spec.suspend is False
    assert spec.pod_replacement_policy == "TerminatingOrFailed"
    assert job.metadata.labels == {"app": "llm"}
    assert spec.template.spec.restart_policy == "Never"


def test_job_with_parallelism_only_keeps_completions_unset():
    job = defaulted(k8s.Job, job_manifest(parallelism=4))
    assert job.spec.parallelism == 4
    assert job.spec.completions is None


def test_job_template_restart_policy_is_not_defaulted():
    manifest = job_manifest()
    del manifest["spec"]["template"]["spec"]["restartPolicy"]
    job = defaulted(k8s.Job, manifest)
    assert job.spec.template.spec.restart_policy is None
    assert job.spec.template.spec.dns_policy == "ClusterFirst"


def test_job_backoff_limit_with_per_index_limit():
    job = defaulted(k8s.Job, job_manifest(completionMode="Indexed", completions=4, backoffLimitPerIndex=1))
    assert job.spec.backoff_limit == 2**31 - 1


def test_job_keeps_its_own_labels():
    manifest = job_manifest()
    manifest["metadata"]["labels"] = {"team": "eval"}
    assert defaulted(k8s.Job, manifest).metadata.labels == {"team": "eval"}


# --- services ----------------------------------------------------------------------------


def test_service_defaults():
    svc = defaulted(
        k8s.Service,
        {
            "metadata": {"name": "llm"},
            "spec": {"selector": {"app": "llm"}, "ports": [{"port": 80}, {"port": 81, "targetPort": "http"}]},
        },
    )
    assert svc.spec.type == "ClusterIP"
    assert svc.spec.session_affinity == "None"
    assert svc.spec.internal_traffic_policy == "Cluster"
    assert svc.spec.external_traffic_policy is None
    assert [p.protocol for p in svc.spec.ports] == ["TCP", "TCP"]
    assert [p.target_port for p in svc.spec.ports] == [80, "http"]


def test_load_balancer_service_defaults():
    svc = defaulted(
        k8s.Service, {"metadata": {"name": "llm"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}
    )
    assert svc.spec.external_traffic_policy == "Cluster"
    assert svc.spec.allocate_load_balancer_node_ports is True


# --- autoscaling -------------------------------------------------------------------------


def test_hpa_defaults():
    hpa = defaulted(k8s.HorizontalPodAutoscaler, hpa_manifest())
    spec = hpa.to_dict()["spec"]
    assert spec["minReplicas"] == 1
    assert spec["metrics"] == [
        {
            "type": "Resource",
            "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
        }
    ]
    assert spec["behavior"] == {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": 100, "periodSeconds": 15},
                {"type": "Pods", "value": 4, "periodSeconds": 15},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": 300,
            "selectPolicy": "Max",
            "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
        },
    }


def test_hpa_behavior_given_in_part_is_completed():
    hpa = defaulted(
        k8s.HorizontalPodAutoscaler,
        hpa_manifest(minReplicas=0, behavior={"scaleDown": {"stabilizationWindowSeconds": 60}}),
    )
    assert hpa.spec.min_replicas == 0
    down = hpa.spec.behavior.scale_down
    assert down.stabilization_window_seconds == 60
    assert down.select_policy == "Max"
    assert [(p.type, p.value, p.period_seconds) for p in down.policies] == [("Percent", 100, 15)]
    assert hpa.spec.behavior.scale_up.stabilization_window_seconds == 0


def test_hpa_explicit_empty_policies_stay_empty_for_validation():
    hpa = defaulted(k8s.HorizontalPodAutoscaler, hpa_manifest(behavior={"scaleUp": {"policies": []}}))
    assert hpa.spec.behavior.scale_up.policies == []


def test_hpa_given_metrics_are_kept():
    metric = {
        "type": "Pods",
        "pods": {
            "metric": {"name": "requests_per_second"},
            "target": {"type": "AverageValue", "averageValue": "10"},
        },
    }
    hpa = defaulted(k8s.HorizontalPodAutoscaler, hpa_manifest(metrics=[metric]))
    assert [m.type for m in hpa.spec.metrics] == ["Pods"]


# --- cluster objects ---------------------------------------------------------------------


def test_priority_class_default():
    pc = defaulted(k8s.PriorityClass, {"metadata": {"name": "high"}, "value": 1000})
    assert pc.preemption_policy == "PreemptLowerPriority"


def test_namespace_defaults():
    ns = defaulted(k8s.Namespace, {"metadata": {"name": "ml"}})
    assert ns.spec.finalizers == ["kubernetes"]
    assert ns.status.phase == "Active"
    assert ns.metadata.labels == {"kubernetes.io/metadata.name": "ml"}


def test_namespace_finalizer_is_not_re_added_to_a_stored_namespace():
    # The namespace controller removes the finalizer while deleting; defaulting on that
    # update must not put it back.
    ns = defaulted(
        k8s.Namespace,
        {"metadata": {"name": "ml"}, "spec": {"finalizers": []}, "status": {"phase": "Terminating"}},
    )
    assert ns.spec.finalizers == []
    assert ns.status.phase == "Terminating"


def test_secret_type_default():
    assert defaulted(k8s.Secret, {"metadata": {"name": "hf"}}).type == "Opaque"
    assert (
        defaulted(k8s.Secret, {"metadata": {"name": "tls"}, "type": "kubernetes.io/tls"}).type
        == "kubernetes.io/tls"
    )


def test_node_allocatable_defaults_to_capacity():
    node = defaulted(
        k8s.Node,
        {"metadata": {"name": "gpu-01"}, "status": {"capacity": {"cpu": "64", "nvidia.com/gpu": "8"}}},
    )
    assert node.status.allocatable == {"cpu": "64", "nvidia.com/gpu": "8"}


def test_limit_range_item_defaults_like_kubernetes():
    lr = defaulted(
        k8s.LimitRange,
        {
            "metadata": {"name": "limits"},
            "spec": {
                "limits": [
                    {
                        "type": "Container",
                        "max": {"cpu": "8", "nvidia.com/gpu": "4"},
                        "min": {"memory": "1Gi"},
                    },
                    {"type": "Pod", "max": {"cpu": "16"}},
                ]
            },
        },
    )
    container, pod = lr.spec.limits
    assert container.default == {"cpu": "8", "nvidia.com/gpu": "4"}
    assert container.default_request == {"cpu": "8", "nvidia.com/gpu": "4", "memory": "1Gi"}
    assert pod.default is None and pod.default_request is None


def test_kinds_without_defaults_are_untouched():
    quota = k8s.ResourceQuota.model_validate(
        {"metadata": {"name": "q"}, "spec": {"hard": {"nvidia.com/gpu": "8"}}}
    )
    before = quota.to_dict()
    apply_defaults(quota)
    assert quota.to_dict() == before
    apply_defaults(object())  # not a model at all: nothing to do


# --- idempotence -------------------------------------------------------------------------

MANIFESTS = [
    (k8s.Pod, pod_manifest(hostNetwork=True)),
    (k8s.Deployment, deployment_manifest()),
    (k8s.Job, job_manifest()),
    (k8s.Service, {"metadata": {"name": "svc"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}}),
    (k8s.HorizontalPodAutoscaler, hpa_manifest(behavior={"scaleUp": {"selectPolicy": "Min"}})),
    (k8s.PriorityClass, {"metadata": {"name": "high"}, "value": 10}),
    (k8s.Namespace, {"metadata": {"name": "ml"}}),
    (k8s.Node, {"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "1"}}}),
    (k8s.Secret, {"metadata": {"name": "s"}}),
    (
        k8s.LimitRange,
        {"metadata": {"name": "l"}, "spec": {"limits": [{"type": "Container", "max": {"cpu": "1"}}]}},
    ),
]


@pytest.mark.parametrize("model, manifest", MANIFESTS, ids=[m.__name__ for m, _ in MANIFESTS])
def test_defaults_are_idempotent(model, manifest):
    once = defaulted(model, copy.deepcopy(manifest))
    twice = defaulted(model, copy.deepcopy(manifest))
    apply_defaults(twice)
    assert twice.to_dict() == once.to_dict()
    # and what was stored reads back to the same defaulted object
    assert defaulted(model, once.to_dict()).to_dict() == once.to_dict()
