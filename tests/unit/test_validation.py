import copy
from datetime import UTC, datetime

import pytest

from gpufleet.api import k8s
from gpufleet.api.defaults import apply_defaults
from gpufleet.api.validation import (
    FieldError,
    Unquoted,
    aggregate_message,
    go_value,
    register_validator,
    validate,
    validate_create,
    validate_update,
)

SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


# --- factories ---------------------------------------------------------------------------


def container(**overrides) -> dict:
    c = {
        "name": "server",
        "image": "vllm/vllm-openai:v0.5.0",
        "ports": [{"name": "http", "containerPort": 8000}],
        "env": [{"name": "HF_HOME", "value": "/cache"}],
        "resources": {
            "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
            "limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"},
        },
        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
        "livenessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 5},
    }
    c.update(overrides)
    return c


def pod_spec(**overrides) -> dict:
    spec = {
        "containers": [container()],
        "volumes": [{"name": "cache", "emptyDir": {}}],
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "inference-high",
    }
    spec.update(overrides)
    return spec


def pod(**spec_overrides) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "llm-0", "namespace": "ml", "labels": {"app": "llm"}},
        "spec": pod_spec(**spec_overrides),
    }


def template(**spec_overrides) -> dict:
    return {"metadata": {"labels": {"app": "llm", "tier": "serving"}}, "spec": pod_spec(**spec_overrides)}


def deployment(**spec_overrides) -> dict:
    spec = {"replicas": 2, "selector": {"matchLabels": {"app": "llm"}}, "template": template()}
    spec.update(spec_overrides)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": spec,
    }


def replica_set(**spec_overrides) -> dict:
    spec = {"replicas": 2, "selector": {"matchLabels": {"app": "llm"}}, "template": template()}
    spec.update(spec_overrides)
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "llm-5d4f", "namespace": "ml"},
        "spec": spec,
    }


def job(**spec_overrides) -> dict:
    spec = {"backoffLimit": 2, "template": template(restartPolicy="OnFailure")}
    spec.update(spec_overrides)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "eval", "namespace": "ml"},
        "spec": spec,
    }


def service(**spec_overrides) -> dict:
    spec = {"selector": {"app": "llm"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    spec.update(spec_overrides)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": spec,
    }


def hpa(**spec_overrides) -> dict:
    spec = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
        "minReplicas": 1,
        "maxReplicas": 8,
        "metrics": [
            {
                "type": "Resource",
                "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}},
            },
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": "requests_per_second"},
                    "target": {"type": "AverageValue", "averageValue": "20"},
                },
            },
        ],
        "behavior": {
            "scaleDown": {
                "stabilizationWindowSeconds": 120,
                "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
            }
        },
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": spec,
    }


def limit_range(*items) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "limits", "namespace": "ml"},
        "spec": {"limits": list(items)},
    }


VALID = {
    "Pod": (k8s.Pod, pod()),
    "Deployment": (k8s.Deployment, deployment()),
    "ReplicaSet": (k8s.ReplicaSet, replica_set()),
    "Job": (k8s.Job, job(completions=4, parallelism=2, completionMode="Indexed")),
    "Service": (k8s.Service, service()),
    "HorizontalPodAutoscaler": (k8s.HorizontalPodAutoscaler, hpa()),
    "PodDisruptionBudget": (
        k8s.PodDisruptionBudget,
        {
            "metadata": {"name": "llm", "namespace": "ml"},
            "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "llm"}}},
        },
    ),
    "ResourceQuota": (
        k8s.ResourceQuota,
        {
            "metadata": {"name": "team-a", "namespace": "ml"},
            "spec": {
                "hard": {
                    "requests.cpu": "64",
                    "limits.memory": "512Gi",
                    "requests.nvidia.com/gpu": "16",
                    "pods": "100",
                    "count/jobs.batch": "20",
                }
            },
        },
    ),
    "LimitRange": (
        k8s.LimitRange,
        limit_range(
            {
                "type": "Container",
                "min": {"cpu": "100m"},
                "defaultRequest": {"cpu": "500m"},
                "default": {"cpu": "1"},
                "max": {"cpu": "8"},
            },
            {"type": "Pod", "max": {"nvidia.com/gpu": "8"}},
            {"type": "PersistentVolumeClaim", "max": {"storage": "1Ti"}},
        ),
    ),
    "PriorityClass": (
        k8s.PriorityClass,
        {"metadata": {"name": "inference-high"}, "value": 100000, "description": "serving"},
    ),
    "SystemPriorityClass": (
        k8s.PriorityClass,
        {"metadata": {"name": "system-node-critical"}, "value": 2000001000},
    ),
    "Namespace": (k8s.Namespace, {"metadata": {"name": "ml"}}),
    "Node": (
        k8s.Node,
        {
            "metadata": {
                "name": "gpu-01.rack-a",
                "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            },
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            "status": {"capacity": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"}},
        },
    ),
    "Lease": (
        k8s.Lease,
        {
            "metadata": {"name": "gpu-01", "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": "gpu-01", "leaseDurationSeconds": 40},
        },
    ),
    "Event": (
        k8s.Event,
        {
            "metadata": {"name": "llm-0.17a2b", "namespace": "ml"},
            "involvedObject": {"kind": "Pod", "name": "llm-0", "namespace": "ml"},
            "reason": "Scheduled",
            "type": "Normal",
        },
    ),
    "ConfigMap": (
        k8s.ConfigMap,
        {"metadata": {"name": "cfg", "namespace": "ml"}, "data": {"model.yaml": "name: llama"}},
    ),
    "Secret": (
        k8s.Secret,
        {
            "metadata": {"name": "hf-token", "namespace": "ml"},
            "data": {"token": "c2VjcmV0"},
            "stringData": {"user": "me"},
        },
    ),
    "ServiceAccount": (k8s.ServiceAccount, {"metadata": {"name": "trainer", "namespace": "ml"}}),
}


def build(model, manifest, *, defaults: bool = True):
    obj = model.model_validate(copy.deepcopy(manifest))
    if defaults:
        apply_defaults(obj)
    return obj


def errors_of(model, manifest, *, defaults: bool = True) -> list[FieldError]:
    return validate_create(build(model, manifest, defaults=defaults))


def messages(model, manifest, **kw) -> list[str]:
    return [e.message() for e in errors_of(model, manifest, **kw)]


def kinds(model, manifest, **kw) -> list[tuple[str, str]]:
    return [(e.type, e.field) for e in errors_of(model, manifest, **kw)]


# --- every kind has a valid manifest -----------------------------------------------------


@pytest.mark.parametrize("name", list(VALID))
@pytest.mark.parametrize("defaults", [True, False])
def test_valid_manifest_of_every_kind(name, defaults):
    model, manifest = VALID[name]
    assert messages(model, manifest, defaults=defaults) == []


@pytest.mark.parametrize("name", list(VALID))
def test_unchanged_update_of_every_kind_is_valid(name):
    model, manifest = VALID[name]
    old = build(model, manifest)
    assert validate_update(build(model, manifest), old) == []


# --- messages render as Kubernetes renders them -------------------------------------------


def test_message_formats_match_kubernetes():
    assert (
        FieldError("FieldValueRequired", "spec.containers[0].image").message()
        == "spec.containers[0].image: Required value"
    )
    assert (
        FieldError("FieldValueInvalid", "metadata.name", "Web_1", SUBDOMAIN_MSG).message()
        == f'metadata.name: Invalid value: "Web_1": {SUBDOMAIN_MSG}'
    )
    assert (
        FieldError("FieldValueDuplicate", "spec.ports[1].name", "http").message()
        == 'spec.ports[1].name: Duplicate value: "http"'
    )
    assert FieldError("FieldValueForbidden", "spec", "", "nope").message() == "spec: Forbidden: nope"
    assert FieldError(
        "FieldValueTooLong", "metadata.annotations", "", "must have at most 262144 bytes"
    ).message() == ("metadata.annotations: Too long: must have at most 262144 bytes")
    assert FieldError("FieldValueNotFound", "x", "data").message() == 'x: Not found: "data"'
    assert FieldError("FieldValueTypeInvalid", "x", 1.5, "must be an integer or a string").message() == (
        "x: Invalid value: 1.5: must be an integer or a string"
    )


def test_go_value_rendering():
    assert go_value(3) == "3"
    assert go_value(True) == "true"
    assert go_value(None) == "null"
    assert go_value(Unquoted("25%")) == "25%"
    assert go_value('say "hi"\n') == '"say \\"hi\\"\\n"'
    assert go_value({"b": "2", "a": "1"}) == 'map[string]string{"a":"1", "b":"2"}'
    assert go_value(["x", "y"]) == '[]string{"x", "y"}'
    assert go_value(k8s.LabelSelector(match_labels={"app": "x"})) == '{"matchLabels":{"app":"x"}}'


def test_cause_and_aggregate_message():
    a = FieldError("FieldValueRequired", "spec.containers")
    b = FieldError("FieldValueInvalid", "spec.replicas", -1, "must be greater than or equal to 0")
    assert a.to_cause() == {
        "reason": "FieldValueRequired",
        "message": "Required value",
        "field": "spec.containers",
    }
    assert aggregate_message([a]) == "spec.containers: Required value"
    assert aggregate_message([a, b, a]) == (
        "[spec.containers: Required value, spec.replicas: Invalid value: -1: must be greater than or equal to 0]"
    )


def test_deployment_reports_every_problem_at_once():
    manifest = deployment()
    manifest["metadata"]["name"] = "Web_1"
    manifest["spec"]["template"]["spec"]["containers"][0]["image"] = ""
    manifest["spec"]["selector"] = {"matchLabels": {"app": "web"}}
    assert messages(k8s.Deployment, manifest) == [
        f'metadata.name: Invalid value: "Web_1": {SUBDOMAIN_MSG}',
        'spec.template.metadata.labels: Invalid value: map[string]string{"app":"llm", "tier":"serving"}: '
        "`selector` does not match template `labels`",
        "spec.template.spec.containers[0].image: Required value",
    ]


def test_restart_policy_unsupported_message():
    assert messages(k8s.Pod, pod(restartPolicy="Sometimes")) == [
        'spec.restartPolicy: Unsupported value: "Sometimes": supported values: "Always", "Never", "OnFailure"'
    ]


# --- metadata ----------------------------------------------------------------------------


def test_name_required_unless_generate_name():
    manifest = pod()
    del manifest["metadata"]["name"]
    assert messages(k8s.Pod, manifest) == ["metadata.name: Required value: name or generateName is required"]
    manifest["metadata"]["generateName"] = "llm-"
    assert messages(k8s.Pod, manifest) == []
    manifest["metadata"]["generateName"] = "LLM-"
    assert kinds(k8s.Pod, manifest) == [("FieldValueInvalid", "metadata.generateName")]


def test_missing_metadata():
    manifest = pod()
    del manifest["metadata"]
    assert kinds(k8s.Pod, manifest) == [("FieldValueRequired", "metadata.name")]


def test_namespace_names_are_labels():
    assert messages(k8s.Namespace, {"metadata": {"name": "team.a"}}) == [
        'metadata.name: Invalid value: "team.a": must not contain dots'
    ]
    assert messages(k8s.Namespace, {"metadata": {"name": "Team"}}) == [
        f'metadata.name: Invalid value: "Team": {LABEL_MSG}'
    ]


def test_service_names_are_dns1035_labels():
    manifest = service()
    manifest["metadata"]["name"] = "1llm"
    assert messages(k8s.Service, manifest) == [
        'metadata.name: Invalid value: "1llm": a DNS-1035 label must consist of lower case alphanumeric characters '
        "or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
        "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
    ]


def test_long_names():
    manifest = pod()
    manifest["metadata"]["name"] = "a" * 254
    assert messages(k8s.Pod, manifest) == [
        f'metadata.name: Invalid value: "{"a" * 254}": must be no more than 253 characters'
    ]


def test_namespace_field_rules():
    manifest = pod()
    manifest["metadata"]["namespace"] = "Team_A"
    assert kinds(k8s.Pod, manifest) == [("FieldValueInvalid", "metadata.namespace")]
    assert messages(k8s.Node, {"metadata": {"name": "n", "namespace": "ml"}}) == [
        "metadata.namespace: Forbidden: not allowed on this type"
    ]


def test_label_key_and_value_rules():
    manifest = pod()
    manifest["metadata"]["labels"] = {
        "example.com/app": "ok",
        "-bad": "x",
        "Example_com/x": "y",
        "tier": "no way",
    }
    assert messages(k8s.Pod, manifest) == [
        "metadata.labels: Invalid value: \"-bad\": name part must consist of alphanumeric characters, '-', '_' or "
        "'.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', "
        "regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
        f'metadata.labels: Invalid value: "Example_com/x": prefix part {SUBDOMAIN_MSG}',
        'metadata.labels: Invalid value: "no way": a valid label must be an empty string or consist of alphanumeric '
        "characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
        "'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
    ]


def test_label_key_with_two_slashes_and_long_value():
    manifest = pod()
    manifest["metadata"]["labels"] = {"a/b/c": "x" * 64}
    got = messages(k8s.Pod, manifest)
    assert got[0].startswith('metadata.labels: Invalid value: "a/b/c": a qualified name must consist of')
    assert got[1] == f'metadata.labels: Invalid value: "{"x" * 64}": must be no more than 63 characters'


def test_annotations():
    manifest = pod()
    manifest["metadata"]["annotations"] = {"Example.com/Owner": "alice", "bad key": "x"}
    assert kinds(k8s.Pod, manifest) == [("FieldValueInvalid", "metadata.annotations")]
    manifest["metadata"]["annotations"] = {"big": "x" * (256 * 1024)}
    assert messages(k8s.Pod, manifest) == ["metadata.annotations: Too long: must have at most 262144 bytes"]


def test_owner_references_and_finalizers():
    manifest = pod()
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "llm-5d4f",
        "uid": "u1",
        "controller": True,
    }
    manifest["metadata"]["ownerReferences"] = [owner, {**owner, "name": "other", "uid": ""}]
    manifest["metadata"]["finalizers"] = ["example.com/cleanup", "cleanup"]
    manifest["metadata"]["generation"] = -1
    assert kinds(k8s.Pod, manifest) == [
        ("FieldValueInvalid", "metadata.generation"),
        ("FieldValueInvalid", "metadata.ownerReferences.uid"),
        ("FieldValueInvalid", "metadata.ownerReferences"),
        ("FieldValueInvalid", "metadata.finalizers[1]"),
    ]


# --- pods --------------------------------------------------------------------------------


def test_pod_needs_a_container():
    assert messages(k8s.Pod, pod(containers=[])) == ["spec.containers: Required value"]
    manifest = pod()
    del manifest["spec"]
    assert messages(k8s.Pod, manifest) == ["spec.containers: Required value"]


def test_container_names():
    manifest = pod(
        containers=[container(), container(name="server", ports=[]), container(name="Side_car", ports=[])],
        initContainers=[{"name": "server", "image": "busybox"}],
    )
    assert messages(k8s.Pod, manifest) == [
        'spec.containers[1].name: Duplicate value: "server"',
        f'spec.containers[2].name: Invalid value: "Side_car": {LABEL_MSG}',
        'spec.initContainers[0].name: Duplicate value: "server"',
    ]


def test_image_required_and_trimmed():
    assert messages(k8s.Pod, pod(containers=[container(image="")])) == [
        "spec.containers[0].image: Required value"
    ]
    assert messages(k8s.Pod, pod(containers=[container(image=" nginx")])) == [
        'spec.containers[0].image: Invalid value: " nginx": must not have leading or trailing whitespace'
    ]


def test_container_ports():
    ports = [
        {"name": "http", "containerPort": 8000},
        {"name": "http", "containerPort": 8001},
        {"containerPort": 70000},
        {"containerPort": 0},
        {"containerPort": 8000, "protocol": "TCP"},
        {"containerPort": 9000, "protocol": "HTTP"},
        {"name": "Metrics", "containerPort": 9100, "hostPort": 99999},
    ]
    assert messages(k8s.Pod, pod(containers=[container(ports=ports)]), defaults=False) == [
        'spec.containers[0].ports[1].name: Duplicate value: "http"',
        "spec.containers[0].ports[2].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
        "spec.containers[0].ports[3].containerPort: Required value",
        "spec.containers[0].ports[4]: Duplicate value: 8000/TCP",
        'spec.containers[0].ports[5].protocol: Unsupported value: "HTTP": supported values: "SCTP", "TCP", "UDP"',
        'spec.containers[0].ports[6].name: Invalid value: "Metrics": must contain only alpha-numeric characters '
        "(a-z, 0-9), and hyphens (-)",
        "spec.containers[0].ports[6].hostPort: Invalid value: 99999: must be between 1 and 65535, inclusive",
    ]


def test_host_ports_conflict_across_containers():
    manifest = pod(
        containers=[
            container(ports=[{"containerPort": 80, "hostPort": 8080}]),
            container(name="b", ports=[{"containerPort": 81, "hostPort": 8080}]),
        ]
    )
    assert messages(k8s.Pod, manifest) == [
        'spec.containers[1].ports[0].hostPort: Duplicate value: "TCP//8080"'
    ]


def test_host_ports_conflict_within_one_init_container_only():
    same = {"containerPort": 80, "hostPort": 8080}
    init = [
        {"name": "a", "image": "busybox", "ports": [same]},
        {"name": "b", "image": "busybox", "ports": [same, {"containerPort": 81, "hostPort": 8080}]},
    ]
    assert messages(k8s.Pod, pod(initContainers=init)) == [
        'spec.initContainers[1].ports[1].hostPort: Duplicate value: "TCP//8080"'
    ]


def test_host_network_requires_matching_host_port():
    manifest = pod(hostNetwork=True, containers=[container(ports=[{"containerPort": 80, "hostPort": 81}])])
    assert messages(k8s.Pod, manifest) == [
        "spec.containers[0].ports[0].hostPort: Invalid value: 81: must match `containerPort` when `hostNetwork` is true"
    ]


def test_env_var_names():
    env = [{"name": "1BAD", "value": "x"}, {"name": "GOOD.name-1"}, {"name": ""}]
    assert messages(k8s.Pod, pod(containers=[container(env=env)])) == [
        'spec.containers[0].env[0].name: Invalid value: "1BAD": a valid environment variable name must consist of '
        "alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or "
        "'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')",
        "spec.containers[0].env[2].name: Required value",
    ]


def test_env_value_from():
    env = [
        {"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "B", "valueFrom": {}},
        {
            "name": "C",
            "valueFrom": {
                "fieldRef": {"fieldPath": "spec.nodeName"},
                "secretKeyRef": {"name": "s", "key": "k"},
            },
        },
    ]
    assert messages(k8s.Pod, pod(containers=[container(env=env)])) == [
        'spec.containers[0].env[0].valueFrom: Invalid value: "": may not be specified when `value` is not empty',
        'spec.containers[0].env[1].valueFrom: Invalid value: "": must specify one of: `fieldRef`, '
        "`resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
        'spec.containers[0].env[2].valueFrom: Invalid value: "": may not have more than one field specified at a time',
    ]


def test_quantities_must_parse_and_not_be_negative():
    resources = {"requests": {"cpu": "lots", "memory": "-1Gi"}, "limits": {"cpu": "2"}}
    assert messages(k8s.Pod, pod(containers=[container(resources=resources)])) == [
        'spec.containers[0].resources.requests[cpu]: Invalid value: "lots": quantities must match the regular '
        "expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        'spec.containers[0].resources.requests[memory]: Invalid value: "-1Gi": must be greater than or equal to 0',
    ]


def test_requests_may_not_exceed_limits():
    resources = {"requests": {"cpu": "4", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1024Mi"}}
    assert messages(k8s.Pod, pod(containers=[container(resources=resources)])) == [
        'spec.containers[0].resources.requests: Invalid value: "4": must be less than or equal to cpu limit of 2'
    ]


def test_gpus_are_whole_and_never_overcommitted():
    cases = {
        "fraction": {"limits": {"nvidia.com/gpu": "0.5"}},
        "unequal": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
        "no-limit": {"requests": {"nvidia.com/gpu": "1"}},
    }
    got = {name: messages(k8s.Pod, pod(containers=[container(resources=res)])) for name, res in cases.items()}
    assert got == {
        "fraction": [
            "spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: 0.5: must be an integer",
            "spec.containers[0].resources.requests[nvidia.com/gpu]: Invalid value: 0.5: must be an integer",
        ],
        "unequal": [
            'spec.containers[0].resources.requests: Invalid value: "1": must be equal to nvidia.com/gpu limit of 2'
        ],
        "no-limit": [
            "spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources"
        ],
    }


def test_resource_names():
    resources = {"limits": {"gpu": "1", "example.com/": "1", "nvidia.com/gpu": "1"}}
    assert messages(k8s.Pod, pod(containers=[container(resources=resources)]), defaults=False) == [
        'spec.containers[0].resources.limits[gpu]: Invalid value: "gpu": must be a standard resource for containers',
        'spec.containers[0].resources.limits[example.com/]: Invalid value: "example.com/": name part must be non-empty',
        'spec.containers[0].resources.limits[example.com/]: Invalid value: "example.com/": name part must consist of '
        "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. "
        "'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
    ]


def test_volumes_and_mounts():
    volumes = [
        {"name": "cache", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
        {"name": "x"},
        {"name": "y", "emptyDir": {}, "hostPath": {"path": "/data"}},
    ]
    mounts = [
        {"name": "cache", "mountPath": "/cache"},
        {"name": "models", "mountPath": "/models"},
        {"name": "cache", "mountPath": "/cache"},
        {"name": "y", "mountPath": "/y", "subPath": "../etc"},
    ]
    assert messages(k8s.Pod, pod(volumes=volumes, containers=[container(volumeMounts=mounts)])) == [
        'spec.volumes[1].name: Duplicate value: "cache"',
        "spec.volumes[2]: Required value: must specify a volume type",
        "spec.volumes[3].hostPath: Forbidden: may not specify more than 1 volume type",
        'spec.containers[0].volumeMounts[1].name: Not found: "models"',
        'spec.containers[0].volumeMounts[2].mountPath: Invalid value: "/cache": must be unique',
        "spec.containers[0].volumeMounts[3].subPath: Invalid value: \"../etc\": must not contain '..'",
    ]


def test_probes():
    c = container(
        livenessProbe={"exec": {"command": ["true"]}, "httpGet": {"port": 8000}, "successThreshold": 2},
        readinessProbe={"periodSeconds": -1, "terminationGracePeriodSeconds": 5},
        startupProbe={"tcpSocket": {"port": "not_a_port"}},
    )
    assert messages(k8s.Pod, pod(containers=[c])) == [
        "spec.containers[0].livenessProbe.httpGet: Forbidden: may not specify more than 1 handler type",
        "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
        "spec.containers[0].readinessProbe: Required value: must specify a handler type",
        "spec.containers[0].readinessProbe.periodSeconds: Invalid value: -1: must be greater than or equal to 0",
        "spec.containers[0].readinessProbe.terminationGracePeriodSeconds: Invalid value: 5: must not be set for readinessProbes",
        'spec.containers[0].startupProbe.tcpSocket.port: Invalid value: "not_a_port": must contain only '
        "alpha-numeric characters (a-z, 0-9), and hyphens (-)",
    ]


def test_exec_probe_needs_a_command_and_lifecycle_is_checked():
    c = container(
        livenessProbe={"exec": {}},
        lifecycle={"preStop": {"sleep": {"seconds": 60}}, "postStart": {"httpGet": {"port": 0}}},
    )
    assert messages(k8s.Pod, pod(containers=[c])) == [
        "spec.containers[0].lifecycle.postStart.httpGet.port: Invalid value: 0: must be between 1 and 65535, inclusive",
        "spec.containers[0].lifecycle.preStop.sleep: Invalid value: 60: must be greater than 0 and less than "
        "terminationGracePeriodSeconds (30)",
        "spec.containers[0].livenessProbe.exec.command: Required value",
    ]


def test_init_containers_without_restart_always_have_no_probes():
    init = {"name": "fetch", "image": "busybox", "readinessProbe": {"exec": {"command": ["true"]}}}
    sidecar = {
        "name": "proxy",
        "image": "envoy",
        "restartPolicy": "Always",
        "readinessProbe": {"exec": {"command": ["true"]}},
    }
    other = {"name": "other", "image": "busybox", "restartPolicy": "OnFailure"}
    assert messages(k8s.Pod, pod(initContainers=[init, sidecar, other])) == [
        "spec.initContainers[0].readinessProbe: Forbidden: may not be set for init containers without restartPolicy=Always",
        'spec.initContainers[2].restartPolicy: Unsupported value: "OnFailure": supported values: "Always"',
    ]
    assert messages(k8s.Pod, pod(containers=[container(restartPolicy="Always")])) == [
        "spec.containers[0].restartPolicy: Forbidden: may not be set for non-init containers"
    ]


def test_scheduling_fields():
    manifest = pod(
        priorityClassName="High_Priority",
        preemptionPolicy="Sometimes",
        nodeSelector={"nvidia.com/gpu.product": "H100 80GB"},
        activeDeadlineSeconds=0,
        dnsPolicy="Cluster",
        serviceAccountName="Trainer",
        schedulingGates=[{"name": "gpufleet.io/quota"}, {"name": "gpufleet.io/quota"}],
    )
    assert kinds(k8s.Pod, manifest) == [
        ("FieldValueNotSupported", "spec.dnsPolicy"),
        ("FieldValueInvalid", "spec.nodeSelector"),
        ("FieldValueDuplicate", "spec.schedulingGates[1]"),
        ("FieldValueInvalid", "spec.serviceAccountName"),
        ("FieldValueInvalid", "spec.priorityClassName"),
        ("FieldValueInvalid", "spec.activeDeadlineSeconds"),
        ("FieldValueNotSupported", "spec.preemptionPolicy"),
    ]


def test_dns_none_needs_config():
    assert messages(k8s.Pod, pod(dnsPolicy="None")) == [
        "spec.dnsConfig: Required value: must provide `dnsConfig` when `dnsPolicy` is None"
    ]


def test_tolerations():
    tolerations = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "value": "true"},
        {"key": "dedicated", "operator": "Like", "value": "x"},
        {"key": "dedicated", "value": "x", "effect": "NoRun"},
        {"operator": "Equal", "value": "x"},
        {"key": "k", "value": "v", "effect": "NoSchedule", "tolerationSeconds": 30},
    ]
    assert messages(k8s.Pod, pod(tolerations=tolerations)) == [
        "spec.tolerations[0].operator: Invalid value: \"true\": value must be empty when `operator` is 'Exists'",
        'spec.tolerations[1].operator: Unsupported value: "Like": supported values: "Equal", "Exists"',
        'spec.tolerations[2].effect: Unsupported value: "NoRun": supported values: "NoSchedule", "PreferNoSchedule", "NoExecute"',
        'spec.tolerations[3].operator: Invalid value: "Equal": operator must be Exists when `key` is empty, which '
        'means "match all values and all keys"',
        "spec.tolerations[4].effect: Invalid value: \"NoSchedule\": effect must be 'NoExecute' when `tolerationSeconds` is set",
    ]


def test_affinity_and_spread():
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["a"]}]}
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 0, "preference": {"matchExpressions": [{"key": "rack", "operator": "Exists"}]}}
            ],
        },
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": ""}]},
    }
    spread = [{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "Maybe"}]
    assert kinds(k8s.Pod, pod(affinity=affinity, topologySpreadConstraints=spread)) == [
        (
            "FieldValueInvalid",
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator",
        ),
        (
            "FieldValueInvalid",
            "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
        ),
        (
            "FieldValueRequired",
            "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey",
        ),
        # as in Kubernetes: required, then the label-key rules (empty name part, regex)
        (
            "FieldValueInvalid",
            "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey",
        ),
        (
            "FieldValueInvalid",
            "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey",
        ),
        ("FieldValueInvalid", "spec.topologySpreadConstraints[0].maxSkew"),
        ("FieldValueNotSupported", "spec.topologySpreadConstraints[0].whenUnsatisfiable"),
    ]


def test_undefaulted_enum_set_to_empty_is_required():
    manifest = pod(restartPolicy="")
    manifest["spec"]["containers"][0]["imagePullPolicy"] = ""
    assert kinds(k8s.Pod, manifest, defaults=False) == [
        ("FieldValueRequired", "spec.containers[0].imagePullPolicy"),
        ("FieldValueRequired", "spec.restartPolicy"),
    ]
    manifest["spec"]["containers"][0]["imagePullPolicy"] = "Sometimes"
    assert kinds(k8s.Pod, manifest, defaults=False)[0] == (
        "FieldValueNotSupported",
        "spec.containers[0].imagePullPolicy",
    )


# --- deployments and replica sets --------------------------------------------------------


def test_deployment_spec_rules():
    manifest = deployment(
        replicas=-1,
        revisionHistoryLimit=-1,
        minReadySeconds=30,
        progressDeadlineSeconds=30,
        template=template(restartPolicy="Never", activeDeadlineSeconds=60),
    )
    assert messages(k8s.Deployment, manifest) == [
        "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
        'spec.template.spec.restartPolicy: Unsupported value: "Never": supported values: "Always"',
        "spec.template.spec.activeDeadlineSeconds: Invalid value: 60: activeDeadlineSeconds in ReplicaSet is not Supported",
        "spec.revisionHistoryLimit: Invalid value: -1: must be greater than or equal to 0",
        "spec.progressDeadlineSeconds: Invalid value: 30: must be greater than minReadySeconds",
    ]


def test_deployment_selector_rules():
    assert messages(k8s.Deployment, deployment(selector={})) == [
        "spec.selector: Invalid value: {}: empty selector is invalid for deployment"
    ]
    selector = {
        "matchExpressions": [
            {"key": "app", "operator": "In"},
            {"key": "tier", "operator": "Exists", "values": ["x"]},
        ]
    }
    assert messages(k8s.Deployment, deployment(selector=selector)) == [
        "spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
        "spec.selector.matchExpressions[1].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
        'spec.template.metadata.labels: Invalid value: map[string]string{"app":"llm", "tier":"serving"}: '
        "`selector` does not match template `labels`",
    ]
    bad_op = {"matchExpressions": [{"key": "app", "operator": "Near", "values": ["llm"]}]}
    assert messages(k8s.Deployment, deployment(selector=bad_op)) == [
        'spec.selector.matchExpressions[0].operator: Invalid value: "Near": not a valid selector operator'
    ]


def test_selector_expressions_that_match():
    selector = {
        "matchLabels": {"app": "llm"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["serving", "batch"]},
            {"key": "canary", "operator": "DoesNotExist"},
            {"key": "app", "operator": "NotIn", "values": ["web"]},
            {"key": "tier", "operator": "Exists"},
        ],
    }
    assert messages(k8s.Deployment, deployment(selector=selector)) == []


def test_deployment_strategy_rules():
    cases = {
        "type": {"type": "BlueGreen"},
        "zero": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}},
        "percent": {"rollingUpdate": {"maxSurge": "25", "maxUnavailable": "150%"}},
        "negative": {"rollingUpdate": {"maxSurge": -1}},
        "float": {"rollingUpdate": {"maxSurge": 1.5}},
        "recreate": {"type": "Recreate", "rollingUpdate": {"maxSurge": 1}},
    }
    got = {name: messages(k8s.Deployment, deployment(strategy=s)) for name, s in cases.items()}
    assert got == {
        "type": [
            'spec.strategy.type: Unsupported value: "BlueGreen": supported values: "Recreate", "RollingUpdate"'
        ],
        "zero": [
            "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0%: may not be 0 when `maxSurge` is 0"
        ],
        "percent": [
            "spec.strategy.rollingUpdate.maxSurge: Invalid value: 25: a valid percent string must be a numeric string "
            "followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
            "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 150%: must not be greater than 100%",
        ],
        "negative": [
            "spec.strategy.rollingUpdate.maxSurge: Invalid value: -1: must be greater than or equal to 0"
        ],
        "float": ["spec.strategy.rollingUpdate.maxSurge: Invalid value: 1.5: must be an integer or a string"],
        "recreate": [
            "spec.strategy.rollingUpdate: Forbidden: may not be specified when strategy `type` is 'Recreate'"
        ],
    }


def test_replica_set_rules():
    manifest = replica_set(replicas=-2, selector={"matchLabels": {"app": "other"}})
    assert messages(k8s.ReplicaSet, manifest) == [
        "spec.replicas: Invalid value: -2: must be greater than or equal to 0",
        'spec.template.metadata.labels: Invalid value: map[string]string{"app":"llm", "tier":"serving"}: '
        "`selector` does not match template `labels`",
    ]
    no_template = replica_set()
    del no_template["spec"]["template"]
    assert messages(k8s.ReplicaSet, no_template) == ["spec.template: Required value"]


# --- jobs --------------------------------------------------------------------------------


def test_job_counts_and_deadline():
    manifest = job(parallelism=-1, completions=-1, backoffLimit=-1, activeDeadlineSeconds=0)
    assert messages(k8s.Job, manifest) == [
        "spec.parallelism: Invalid value: -1: must be greater than or equal to 0",
        "spec.completions: Invalid value: -1: must be greater than or equal to 0",
        "spec.backoffLimit: Invalid value: -1: must be greater than or equal to 0",
        "spec.activeDeadlineSeconds: Invalid value: 0: must be greater than zero",
    ]


def test_job_restart_policy():
    assert messages(k8s.Job, job(template=template(restartPolicy="Always"))) == [
        'spec.template.spec.restartPolicy: Unsupported value: "Always": supported values: "OnFailure", "Never"'
    ]
    assert messages(k8s.Job, job(template=template())) == [
        'spec.template.spec.restartPolicy: Required value: valid values: "OnFailure", "Never"'
    ]


def test_job_selector_and_completion_mode():
    manifest = job(selector={"matchLabels": {"app": "other"}}, manualSelector=True, completionMode="Sharded")
    assert messages(k8s.Job, manifest) == [
        'spec.completionMode: Unsupported value: "Sharded": supported values: "NonIndexed", "Indexed"',
        'spec.template.metadata.labels: Invalid value: map[string]string{"app":"llm", "tier":"serving"}: '
        "`selector` does not match template `labels`",
    ]
    assert messages(k8s.Job, job(completionMode="Indexed", parallelism=2)) == [
        "spec.completions: Required value: when completion mode is Indexed"
    ]


# --- services ----------------------------------------------------------------------------


def test_service_type_and_ports_required():
    assert messages(k8s.Service, service(type="Mesh")) == [
        'spec.type: Unsupported value: "Mesh": supported values: "ClusterIP", "ExternalName", "LoadBalancer", "NodePort"'
    ]
    assert messages(k8s.Service, service(ports=[])) == ["spec.ports: Required value"]
    assert messages(k8s.Service, service(ports=[], clusterIP="None")) == []
    assert messages(k8s.Service, service(ports=[], type="ExternalName")) == [
        "spec.externalName: Required value"
    ]
    assert (
        messages(k8s.Service, service(ports=[], type="ExternalName", externalName="models.example.com."))
        == []
    )


def test_service_ports():
    ports = [
        {"name": "http", "port": 80, "targetPort": 70000},
        {"name": "http", "port": 0, "targetPort": "Web_UI"},
        {"port": 443},
        {"name": "dup", "port": 80, "protocol": "TCP"},
    ]
    assert messages(k8s.Service, service(ports=ports)) == [
        "spec.ports[0].targetPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
        'spec.ports[1].name: Duplicate value: "http"',
        "spec.ports[1].port: Invalid value: 0: must be between 1 and 65535, inclusive",
        'spec.ports[1].targetPort: Invalid value: "Web_UI": must contain only alpha-numeric characters (a-z, 0-9), '
        "and hyphens (-)",
        "spec.ports[2].name: Required value",
        "spec.ports[3]: Duplicate value: 80/TCP",
    ]


def test_service_node_ports_and_ips():
    ports = [{"name": "a", "port": 80, "nodePort": 8080}, {"name": "b", "port": 81, "nodePort": 30080}]
    assert messages(k8s.Service, service(type="NodePort", ports=ports)) == [
        "spec.ports[0].nodePort: Invalid value: 8080: provided port is not in the valid range. The range of valid "
        "ports is 30000-32767"
    ]
    assert messages(k8s.Service, service(ports=[{"port": 80, "nodePort": 30080}])) == [
        "spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"
    ]
    assert messages(k8s.Service, service(clusterIP="10.0.0.300", sessionAffinity="Sticky")) == [
        'spec.clusterIP: Invalid value: "10.0.0.300": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)',
        'spec.sessionAffinity: Unsupported value: "Sticky": supported values: "ClientIP", "None"',
    ]


# --- autoscaling -------------------------------------------------------------------------


def test_hpa_replica_bounds():
    assert messages(k8s.HorizontalPodAutoscaler, hpa(minReplicas=0)) == []  # scale to zero is allowed here
    assert messages(k8s.HorizontalPodAutoscaler, hpa(minReplicas=4, maxReplicas=2)) == [
        "spec.maxReplicas: Invalid value: 2: must be greater than or equal to `minReplicas`"
    ]
    assert messages(k8s.HorizontalPodAutoscaler, hpa(minReplicas=-1, maxReplicas=0)) == [
        "spec.minReplicas: Invalid value: -1: must be greater than or equal to 0",
        "spec.maxReplicas: Invalid value: 0: must be greater than 0",
    ]


def test_hpa_scale_target_ref():
    manifest = hpa(scaleTargetRef={"kind": "", "name": "a/b"})
    assert messages(k8s.HorizontalPodAutoscaler, manifest) == [
        "spec.scaleTargetRef.kind: Required value",
        "spec.scaleTargetRef.name: Invalid value: \"a/b\": may not contain '/'",
    ]


def test_hpa_metric_sources():
    metrics = [
        {"type": "Custom"},
        {
            "type": "Resource",
            "pods": {"metric": {"name": "x"}, "target": {"type": "AverageValue", "averageValue": "1"}},
        },
        {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}},
        {
            "type": "Resource",
            "resource": {"name": "memory", "target": {"type": "Utilization", "averageValue": "1Gi"}},
        },
        {
            "type": "Pods",
            "pods": {"metric": {"name": "rps"}, "target": {"type": "Total", "averageValue": "0"}},
        },
        {
            "type": "External",
            "external": {
                "metric": {"name": "queue"},
                "target": {"type": "Value", "value": "5", "averageValue": "1"},
            },
        },
        {
            "type": "Object",
            "object": {
                "describedObject": {"kind": "Service", "name": "llm"},
                "metric": {"name": "rps"},
                "target": {"type": "Value"},
            },
        },
    ]
    assert messages(k8s.HorizontalPodAutoscaler, hpa(metrics=metrics)) == [
        'spec.metrics[0].type: Unsupported value: "Custom": supported values: "Object", "Pods", "Resource", "External", "ContainerResource"',
        "spec.metrics[1].resource: Required value: must populate information for the given metric source",
        "spec.metrics[2].resource.target.averageUtilization: Required value: must set either a target raw value or a target utilization",
        "spec.metrics[3].resource.target.averageUtilization: Required value: must be set when `type` is 'Utilization'",
        'spec.metrics[4].pods.target.type: Invalid value: "Total": must be either Utilization, Value, or AverageValue',
        "spec.metrics[4].pods.target.averageValue: Invalid value: 0: must be positive",
        "spec.metrics[5].external.target.value: Forbidden: may not set both a target value for metric and a per-pod target",
        "spec.metrics[6].object.target.averageValue: Required value: must set either a target value or averageValue",
    ]


def test_hpa_metric_with_two_sources():
    metric = {
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}},
        "external": {"metric": {"name": "q"}, "target": {"type": "Value", "value": "1"}},
    }
    assert messages(k8s.HorizontalPodAutoscaler, hpa(metrics=[metric])) == [
        "spec.metrics[0].external: Forbidden: must populate the given metric source only"
    ]


def test_hpa_behavior():
    behavior = {
        "scaleUp": {
            "stabilizationWindowSeconds": 3601,
            "selectPolicy": "Avg",
            "policies": [
                {"type": "Pods", "value": 0, "periodSeconds": 0},
                {"type": "Nodes", "value": 1, "periodSeconds": 1801},
            ],
        },
        "scaleDown": {"stabilizationWindowSeconds": -1, "policies": []},
    }
    assert messages(k8s.HorizontalPodAutoscaler, hpa(behavior=behavior)) == [
        "spec.behavior.scaleUp.stabilizationWindowSeconds: Invalid value: 3601: must be less than or equal to 3600",
        'spec.behavior.scaleUp.selectPolicy: Unsupported value: "Avg": supported values: "Max", "Min", "Disabled"',
        "spec.behavior.scaleUp.policies[0].value: Invalid value: 0: must be greater than zero",
        "spec.behavior.scaleUp.policies[0].periodSeconds: Invalid value: 0: must be greater than zero",
        'spec.behavior.scaleUp.policies[1].type: Unsupported value: "Nodes": supported values: "Pods", "Percent"',
        "spec.behavior.scaleUp.policies[1].periodSeconds: Invalid value: 1801: must be less than or equal to 1800",
        "spec.behavior.scaleDown.stabilizationWindowSeconds: Invalid value: -1: must be greater than or equal to zero",
        "spec.behavior.scaleDown.policies: Required value: must specify at least one Policy",
    ]


# --- policy, quota, limits ---------------------------------------------------------------


def test_pdb():
    manifest = {"metadata": {"name": "llm"}, "spec": {"minAvailable": 1, "maxUnavailable": "120%"}}
    assert messages(k8s.PodDisruptionBudget, manifest) == [
        "spec.minAvailable: Invalid value: 1: minAvailable and maxUnavailable cannot be both set",
        "spec.maxUnavailable: Invalid value: 120%: must not be greater than 100%",
    ]
    policy = {"metadata": {"name": "llm"}, "spec": {"unhealthyPodEvictionPolicy": "Never"}}
    assert messages(k8s.PodDisruptionBudget, policy) == [
        'spec.unhealthyPodEvictionPolicy: Unsupported value: "Never": supported values: "AlwaysAllow", '
        '"IfHealthyBudget"'
    ]


def test_resource_quota():
    hard = {"cpu": "many", "memory": "-1", "gpus": "4", "pods": "1.5", "requests.nvidia.com/gpu": "8"}
    manifest = {"metadata": {"name": "q"}, "spec": {"hard": hard, "scopes": ["BestEffort", "NotBestEffort"]}}
    assert messages(k8s.ResourceQuota, manifest) == [
        'spec.hard[cpu]: Invalid value: "many": quantities must match the regular expression '
        "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        'spec.hard[memory]: Invalid value: "-1": must be greater than or equal to 0',
        'spec.hard[gpus]: Invalid value: "gpus": must be a standard resource for quota',
        "spec.hard[pods]: Invalid value: 1.5: must be an integer",
        'spec.scopes: Invalid value: []string{"BestEffort", "NotBestEffort"}: conflicting scopes',
    ]
    assert kinds(k8s.ResourceQuota, {"metadata": {"name": "q"}, "spec": {"scopes": ["Cheap"]}}) == [
        ("FieldValueInvalid", "spec.scopes")
    ]


def test_limit_range_ordering():
    item = {
        "type": "Container",
        "min": {"cpu": "2"},
        "defaultRequest": {"cpu": "1"},
        "default": {"cpu": "500m"},
        "max": {"cpu": "250m"},
    }
    assert messages(k8s.LimitRange, limit_range(item)) == [
        "spec.limits[0].min[cpu]: Invalid value: 2: min value 2 is greater than max value 250m",
        "spec.limits[0].defaultRequest[cpu]: Invalid value: 1: min value 2 is greater than default request value 1",
        "spec.limits[0].defaultRequest[cpu]: Invalid value: 1: default request value 1 is greater than max value 250m",
        "spec.limits[0].defaultRequest[cpu]: Invalid value: 1: default request value 1 is greater than default limit value 500m",
        "spec.limits[0].default[cpu]: Invalid value: 2: min value 2 is greater than default value 500m",
        "spec.limits[0].default[cpu]: Invalid value: 250m: default value 500m is greater than max value 250m",
    ]


def test_limit_range_types():
    items = [
        {"type": "Namespace", "max": {"cpu": "1"}},
        {"type": "Pod", "default": {"cpu": "1"}},
        {"type": "Pod", "max": {"cpu": "1"}},
        {"type": "PersistentVolumeClaim", "max": {"cpu": "1"}},
        {"type": "Container", "maxLimitRequestRatio": {"cpu": "500m"}},
    ]
    assert messages(k8s.LimitRange, limit_range(*items)) == [
        'spec.limits[0].type: Unsupported value: "Namespace": supported values: "Container", "Pod", "PersistentVolumeClaim"',
        "spec.limits[1].default: Forbidden: may not be specified when `type` is 'Pod'",
        'spec.limits[2].type: Duplicate value: "Pod"',
        "spec.limits[3].limits: Required value: either minimum or maximum storage value is required, but neither was provided",
        "spec.limits[4].maxLimitRequestRatio[cpu]: Invalid value: 500m: ratio 500m is less than 1",
    ]


# --- cluster objects ---------------------------------------------------------------------


def test_priority_class():
    assert messages(k8s.PriorityClass, {"metadata": {"name": "huge"}, "value": 1_000_000_001}) == [
        "value: Forbidden: maximum allowed value of a user defined priority is 1000000000"
    ]
    assert messages(k8s.PriorityClass, {"metadata": {"name": "system-vip"}, "value": 5}) == [
        "metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system use only. "
        "error: system-vip is not a known system priority class"
    ]
    assert kinds(
        k8s.PriorityClass, {"metadata": {"name": "p"}, "value": 1, "preemptionPolicy": "Always"}
    ) == [("FieldValueNotSupported", "preemptionPolicy")]


def test_namespace_finalizers():
    assert messages(k8s.Namespace, {"metadata": {"name": "ml"}, "spec": {"finalizers": ["cleanup"]}}) == [
        'spec.finalizers[0]: Invalid value: "cleanup": name is neither a standard finalizer name nor is it fully qualified'
    ]


def test_node_taints():
    taints = [
        {"key": "nvidia.com/gpu", "effect": "NoRun"},
        {"key": "bad key", "effect": "NoSchedule"},
        {"key": "a", "value": "x", "effect": "NoSchedule"},
        {"key": "a", "value": "y", "effect": "NoSchedule"},
    ]
    got = messages(k8s.Node, {"metadata": {"name": "gpu-01"}, "spec": {"taints": taints}})
    assert (
        got[0]
        == 'spec.taints[0].effect: Unsupported value: "NoRun": supported values: "NoSchedule", "PreferNoSchedule", "NoExecute"'
    )
    assert got[1].startswith('spec.taints[1].key: Invalid value: "bad key": name part must consist of')
    assert got[2].startswith("spec.taints[3]: Duplicate value: ")
    assert got[2].endswith(": taints must be unique by key and effect pair")
    assert len(got) == 3


def test_node_capacity_quantities():
    node = {"metadata": {"name": "n"}, "status": {"capacity": {"nvidia.com/gpu": "eight"}}}
    assert kinds(k8s.Node, node, defaults=False) == [("FieldValueInvalid", "status.capacity[nvidia.com/gpu]")]


def test_lease():
    manifest = {"metadata": {"name": "n"}, "spec": {"leaseDurationSeconds": 0, "leaseTransitions": -1}}
    assert messages(k8s.Lease, manifest) == [
        "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0",
        "spec.leaseTransitions: Invalid value: -1: must be greater than or equal to 0",
    ]


def test_event():
    manifest = {
        "metadata": {"name": "e", "namespace": "ml"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "other"},
        "type": "Info",
    }
    assert messages(k8s.Event, manifest) == [
        'involvedObject.namespace: Invalid value: "other": does not match event.namespace',
        'type: Unsupported value: "Info": supported values: "Normal", "Warning"',
    ]
    orphan = k8s.Event.model_construct(
        metadata=k8s.ObjectMeta(name="e"), involved_object=None, type=None, count=None
    )
    assert [e.message() for e in validate_create(orphan)] == ["involvedObject: Required value"]


def test_config_map_and_secret():
    cm = {"metadata": {"name": "c"}, "data": {"bad key": "x", "a": "1"}, "binaryData": {"a": "MQ=="}}
    assert kinds(k8s.ConfigMap, cm) == [
        ("FieldValueInvalid", "data[bad key]"),
        ("FieldValueInvalid", "data[a]"),
    ]
    secret = {"metadata": {"name": "s"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "not base64!"}}
    assert messages(k8s.Secret, secret) == [
        'data[tls.crt]: Invalid value: "<secret contents redacted>": must be base64-encoded',
        "data[tls.key]: Required value",
    ]
    big = {"metadata": {"name": "c"}, "data": {"blob": "x" * (1024 * 1024 + 1)}}
    assert messages(k8s.ConfigMap, big) == [": Too long: must have at most 1048576 bytes"]


def test_unknown_kinds_get_metadata_rules_and_can_register_their_own():
    endpoints = k8s.Endpoints.model_validate({"metadata": {"name": "Bad_Name"}})
    assert [e.field for e in validate_create(endpoints)] == ["metadata.name"]

    class Widget(k8s.ConfigMap):
        pass

    def check(obj, errs):
        errs.append(FieldError("FieldValueRequired", "spec.size"))

    register_validator(Widget, check)
    assert [e.message() for e in validate_create(Widget(metadata=k8s.ObjectMeta(name="w")))] == [
        "spec.size: Required value"
    ]


# --- updates -----------------------------------------------------------------------------


def updated(model, manifest, change):
    old = build(model, manifest)
    new_manifest = copy.deepcopy(manifest)
    change(new_manifest)
    return build(model, new_manifest), old


def update_messages(model, manifest, change) -> list[str]:
    new, old = updated(model, manifest, change)
    return [e.message() for e in validate_update(new, old)]


def test_identity_metadata_is_immutable():
    manifest = pod()
    manifest["metadata"].update(uid="u-1", creationTimestamp="2024-05-01T12:00:00Z")

    def change(m):
        m["metadata"].update(
            name="llm-1", namespace="other", uid="u-2", creationTimestamp="2024-05-02T12:00:00Z"
        )

    assert update_messages(k8s.Pod, manifest, change) == [
        'metadata.name: Invalid value: "llm-1": field is immutable',
        'metadata.namespace: Invalid value: "other": field is immutable',
        'metadata.uid: Invalid value: "u-2": field is immutable',
        "metadata.creationTimestamp: Invalid value: 2024-05-02 12:00:00 +0000 UTC: field is immutable",
    ]


def test_fields_left_out_of_an_update_are_not_changes():
    manifest = pod()
    manifest["metadata"].update(uid="u-1", creationTimestamp=datetime(2024, 5, 1, tzinfo=UTC).isoformat())

    def change(m):
        del m["metadata"]["uid"]
        del m["metadata"]["creationTimestamp"]
        m["metadata"]["labels"]["version"] = "2"

    assert update_messages(k8s.Pod, manifest, change) == []


def test_pod_update_allows_images_deadline_tolerations_and_gate_removal():
    manifest = pod(activeDeadlineSeconds=600, schedulingGates=[{"name": "gpufleet.io/quota"}])

    def change(m):
        m["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.6.0"
        m["spec"]["activeDeadlineSeconds"] = 300
        m["spec"]["tolerations"].append({"key": "spot", "operator": "Exists"})
        m["spec"]["schedulingGates"] = []
        m["spec"]["nodeSelector"]["topology.kubernetes.io/zone"] = "a"

    assert update_messages(k8s.Pod, manifest, change) == []


def test_pod_update_rejects_other_spec_changes():
    def change(m):
        m["spec"]["containers"][0]["ports"][0]["containerPort"] = 9000

    got = update_messages(k8s.Pod, pod(), change)
    assert len(got) == 1
    assert got[0].startswith(
        "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
        "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing "
        "tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)\n"
    )
    assert "spec.containers[0].ports[0].containerPort: 8000 -> 9000" in got[0]


def test_pod_update_limits():
    def more(m):
        m["spec"]["containers"].append(container(name="sidecar", ports=[]))

    assert update_messages(k8s.Pod, pod(), more) == [
        "spec.containers: Forbidden: pod updates may not add or remove containers"
    ]

    def longer(m):
        m["spec"]["activeDeadlineSeconds"] = 900
        m["spec"]["tolerations"][0]["effect"] = "NoExecute"
        m["spec"]["schedulingGates"] = [{"name": "example.com/new"}]

    assert update_messages(k8s.Pod, pod(activeDeadlineSeconds=600), longer) == [
        "spec.activeDeadlineSeconds: Invalid value: 900: must be less than or equal to previous value",
        "spec.tolerations: Forbidden: existing toleration can not be modified except its tolerationSeconds",
        "spec.schedulingGates[0].name: Forbidden: only deletion is allowed, but found new scheduling gate 'example.com/new'",
    ]

    def unset(m):
        del m["spec"]["activeDeadlineSeconds"]

    assert update_messages(k8s.Pod, pod(activeDeadlineSeconds=600), unset) == [
        "spec.activeDeadlineSeconds: Invalid value: null: must not update from a positive integer to nil value"
    ]


def test_workload_selectors_are_immutable():
    def change(m):
        m["spec"]["selector"] = {"matchLabels": {"app": "llm", "tier": "serving"}}
        m["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.6.0"

    expected = [
        'spec.selector: Invalid value: {"matchLabels":{"app":"llm","tier":"serving"}}: field is immutable'
    ]
    assert update_messages(k8s.Deployment, deployment(), change) == expected
    assert update_messages(k8s.ReplicaSet, replica_set(), change) == expected


def test_job_template_and_completions_are_immutable():
    def change(m):
        m["spec"]["template"]["spec"]["containers"][0]["image"] = "other:1"
        m["spec"]["completions"] = 3
        m["spec"]["parallelism"] = 5

    got = update_messages(k8s.Job, job(), change)
    assert [g.split(":")[0] for g in got] == ["spec.template", "spec.completions"]
    assert all(g.endswith(": field is immutable") for g in got)

    def reselect(m):
        m["spec"]["selector"] = {"matchLabels": {"app": "llm"}}

    assert [g.split(":")[0] for g in update_messages(k8s.Job, job(), reselect)] == ["spec.selector"]
    assert all(g.endswith(": field is immutable") for g in got)

    def resize(m):
        m["spec"]["completions"] = 8
        m["spec"]["parallelism"] = 8

    assert update_messages(k8s.Job, job(completionMode="Indexed", completions=4, parallelism=4), resize) == []


def test_service_cluster_ip_is_immutable_once_set():
    allocated = service(clusterIP="10.96.0.10")

    def change(m):
        m["spec"]["clusterIP"] = "10.96.0.11"

    def omit(m):
        del m["spec"]["clusterIP"]

    assert update_messages(k8s.Service, allocated, change) == [
        'spec.clusterIP: Invalid value: "10.96.0.11": field is immutable'
    ]
    assert update_messages(k8s.Service, allocated, omit) == []


def test_priority_class_value_is_immutable():
    def change(m):
        m["value"] = 7

    assert update_messages(k8s.PriorityClass, {"metadata": {"name": "p"}, "value": 5}, change) == [
        "value: Forbidden: may not be changed in an update."
    ]


def test_immutable_secret():
    manifest = {"metadata": {"name": "s"}, "data": {"k": "dg=="}, "immutable": True}

    def change(m):
        m["data"]["k"] = "dzI="
        m["immutable"] = False

    assert update_messages(k8s.Secret, manifest, change) == [
        "immutable: Forbidden: field is immutable when `immutable` is set",
        "data: Forbidden: field is immutable when `immutable` is set",
    ]


def test_validate_dispatch_and_type_mismatch():
    obj = build(*VALID["Pod"])
    assert validate(obj) == [] and validate(obj, build(*VALID["Pod"])) == []
    with pytest.raises(TypeError):
        validate_update(obj, build(*VALID["Namespace"]))
