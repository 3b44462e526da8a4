import copy
import importlib.util
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpufleet.api import k8s
from gpufleet.api.registry import REGISTRY

REPO = Path(__file__).resolve().parents[2]


def deployment_manifest() -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "llm-server",
            "namespace": "team-a",
            "labels": {"app": "llm"},
            "annotations": {"gpufleet.io/owner": "alice"},
            "creationTimestamp": "2024-05-01T12:00:00Z",
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "llm"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": "llm"}},
                "spec": {
                    "hostIPC": True,
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {
                            "key": "dedicated",
                            "operator": "Equal",
                            "value": "llm",
                            "effect": "NoExecute",
                            "tolerationSeconds": 300,
                        },
                    ],
                    "containers": [
                        {
                            "name": "server",
                            "image": "vllm/vllm-openai:latest",
                            "imagePullPolicy": "IfNotPresent",
                            "args": ["--model", "/models/llama"],
                            "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                            "env": [
                                {"name": "HF_HOME", "value": "/cache"},
                                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                            ],
                            "resources": {
                                "requests": {"cpu": 1, "memory": "1Gi"},
                                "limits": {"cpu": 1, "memory": "1Gi", "nvidia.com/gpu": 1},
                            },
                            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
                        }
                    ],
                },
            },
        },
    }


def test_deployment_round_trips_with_wire_names():
    manifest = deployment_manifest()
    out = k8s.Deployment.from_dict(copy.deepcopy(manifest)).to_dict()

    # YAML numbers become quantity strings; everything else comes back untouched.
    expected = copy.deepcopy(manifest)
    container = expected["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
    }
    assert out == expected
    assert out["spec"]["template"]["spec"]["hostIPC"] is True
    assert k8s.Deployment.from_dict(out).to_dict() == out


def test_typed_access_uses_python_names():
    d = k8s.Deployment.from_dict(deployment_manifest())
    pod_spec = d.spec.template.spec
    assert pod_spec.host_ipc is True
    assert pod_spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    assert pod_spec.tolerations[1].toleration_seconds == 300
    assert d.metadata.creation_timestamp == datetime(2024, 5, 1, 12, tzinfo=UTC)


def test_python_names_are_accepted_on_input():
    c = k8s.Container(name="c", image_pull_policy="Always", env_from=[])
    assert c.to_dict() == {"name": "c", "imagePullPolicy": "Always", "envFrom": []}


def test_unknown_field_is_reported_with_its_wire_path():
    manifest = deployment_manifest()
    manifest["spec"]["foo"] = 1
    with pytest.raises(ValidationError) as exc:
        k8s.Deployment.from_dict(manifest)
    errors = exc.value.errors(include_url=False)
    assert [(e["type"], e["loc"]) for e in errors] == [("extra_forbidden", ("spec", "foo"))]


def test_unknown_nested_field_loc_uses_json_names():
    manifest = deployment_manifest()
    manifest["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(ValidationError) as exc:
        k8s.Deployment.from_dict(manifest)
    (error,) = exc.value.errors()
    assert error["loc"] == ("spec", "template", "spec", "containers", 0, "imagePullPolicyy")


def test_container_requires_name():
    with pytest.raises(ValidationError) as exc:
        k8s.Container.from_dict({"image": "busybox"})
    (error,) = exc.value.errors()
    assert (error["type"], error["loc"]) == ("missing", ("name",))


def test_object_kinds_do_not_require_api_version_kind_or_metadata():
    assert k8s.Pod.from_dict({}).to_dict() == {}
    assert k8s.Event.from_dict({"involvedObject": {"kind": "Pod", "name": "p"}}).metadata is None


def test_references_keep_their_required_kind():
    with pytest.raises(ValidationError):
        k8s.OwnerReference.from_dict({"name": "rs", "uid": "1"})


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        ("2024-05-01T12:00:00Z", "2024-05-01T12:00:00Z"),
        ("2024-05-01T12:00:00.000000Z", "2024-05-01T12:00:00Z"),
        ("2024-05-01T12:00:00.123456Z", "2024-05-01T12:00:00.123456Z"),
        ("2024-05-01T12:00:00.5Z", "2024-05-01T12:00:00.500000Z"),
        ("2024-05-01T14:00:00+02:00", "2024-05-01T12:00:00Z"),
    ],
)
def test_timestamps_serialize_as_rfc3339_utc(wire, expected):
    meta = k8s.ObjectMeta.from_dict({"creationTimestamp": wire})
    assert meta.to_dict() == {"creationTimestamp": expected}


def test_microtime_fields_round_trip():
    lease = {"spec": {"holderIdentity": "node-1", "renewTime": "2024-05-01T12:00:00.123456Z"}}
    assert k8s.Lease.from_dict(lease).to_dict() == lease


@pytest.mark.parametrize(("value", "expected"), [(1, "1"), (0.5, "0.5"), (2.0, "2"), ("500m", "500m")])
def test_quantities_accept_yaml_numbers(value, expected):
    r = k8s.ResourceRequirements.from_dict({"requests": {"cpu": value}})
    assert r.requests == {"cpu": expected}


def test_quantity_rejects_booleans():
    with pytest.raises(ValidationError):
        k8s.ResourceRequirements.from_dict({"limits": {"cpu": True}})


def test_kind_constants():
    assert (k8s.Pod.API_VERSION, k8s.Pod.KIND) == ("v1", "Pod")
    assert (k8s.Deployment.API_VERSION, k8s.Deployment.KIND) == ("apps/v1", "Deployment")
    assert k8s.HorizontalPodAutoscaler.API_VERSION == "autoscaling/v2"
    assert (k8s.Scale.API_VERSION, k8s.Scale.KIND) == ("autoscaling/v1", "Scale")
    assert (k8s.PodList.API_VERSION, k8s.PodList.KIND) == ("v1", "PodList")
    assert "API_VERSION" not in k8s.Pod.model_fields
    assert "apiVersion" not in k8s.Pod.from_dict({}).to_dict()


def test_registry_models_match_their_kinds():
    for t in REGISTRY.all():
        assert (t.model.API_VERSION, t.model.KIND) == (t.api_version, t.kind), t.kind


def test_keyword_field_names():
    meta = k8s.ListMeta.from_dict({"continue": "token", "resourceVersion": "7"})
    assert meta.continue_ == "token"
    assert meta.to_dict() == {"continue": "token", "resourceVersion": "7"}
    assert k8s.ListMeta(continue_="t").to_dict() == {"continue": "t"}


def test_core_event_with_involved_object():
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "p.17a", "namespace": "default"},
        "involvedObject": {
            "kind": "Pod",
            "namespace": "default",
            "name": "p",
            "uid": "u-1",
            "apiVersion": "v1",
            "fieldPath": "spec.containers{server}",
        },
        "reason": "Scheduled",
        "message": "Successfully assigned default/p to node-1",
        "type": "Normal",
        "source": {"component": "gpufleet-scheduler"},
        "firstTimestamp": "2024-05-01T12:00:00Z",
        "lastTimestamp": "2024-05-01T12:00:05Z",
        "eventTime": "2024-05-01T12:00:00.250000Z",
        "count": 1,
        "series": {"count": 2, "lastObservedTime": "2024-05-01T12:00:05.000001Z"},
        "reportingComponent": "gpufleet-scheduler",
        "reportingInstance": "scheduler-0",
    }
    ev = k8s.Event.from_dict(event)
    assert ev.involved_object.field_path == "spec.containers{server}"
    assert ev.to_dict() == event
    with pytest.raises(ValidationError):
        k8s.Event.from_dict({"reason": "Scheduled"})


def test_hpa_v2_with_resource_metric_and_behavior():
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "llm", "namespace": "team-a"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm-server"},
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
                        "target": {"type": "AverageValue", "averageValue": "10"},
                    },
                },
            ],
            "behavior": {
                "scaleDown": {
                    "stabilizationWindowSeconds": 300,
                    "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}],
                },
                "scaleUp": {
                    "selectPolicy": "Max",
                    "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}],
                },
            },
        },
    }
    obj = k8s.HorizontalPodAutoscaler.from_dict(hpa)
    assert obj.spec.metrics[0].resource.target.average_utilization == 70
    assert obj.spec.behavior.scale_up.policies[0].period_seconds == 15
    assert obj.to_dict() == hpa


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_k8s_models", REPO / "tools" / "gen_k8s_models.py")
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the module executes.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.mark.parametrize(
    ("client", "expected"),
    [
        ("V1Pod", "Pod"),
        ("CoreV1Event", "Event"),
        ("CoreV1EventSeries", "EventSeries"),
        ("CoreV1EndpointPort", "EndpointPort"),
        ("V2HorizontalPodAutoscaler", "HorizontalPodAutoscaler"),
        ("V2MetricSpec", "MetricSpec"),
        ("V1beta1PodGroup", "PodGroup"),
        ("RbacV1Subject", "Subject"),
    ],
)
def test_generator_drops_version_prefixes(gen, client, expected):
    assert gen.short_name(client) == expected


def test_generator_keeps_full_names_for_the_losers_of_a_collision(gen):
    names, notes = gen.assign_names(
        [
            "V2CrossVersionObjectReference",
            "V1CrossVersionObjectReference",
            "DiscoveryV1EndpointPort",
            "CoreV1EndpointPort",
            "V1Pod",
        ]
    )
    assert names == {
        "V1CrossVersionObjectReference": "CrossVersionObjectReference",
        "V2CrossVersionObjectReference": "V2CrossVersionObjectReference",
        "CoreV1EndpointPort": "EndpointPort",
        "DiscoveryV1EndpointPort": "DiscoveryV1EndpointPort",
        "V1Pod": "Pod",
    }
    assert len(notes) == 2


@pytest.mark.parametrize(
    ("client_type", "expected"),
    [
        ("list[V1Container]", "list[Container]"),
        ("List[V1Container]", "list[Container]"),
        ("dict(str, str)", "dict[str, str]"),
        ("Dict[str, List[str]]", "dict[str, list[str]]"),
        ("dict(str, list[str])", "dict[str, list[str]]"),
        ("object", "Any"),
        ("datetime", "Time"),
    ],
)
def test_generator_reads_both_client_type_spellings(gen, client_type, expected):
    assert gen.annotation_for(client_type, {"V1Container": "Container"}, quantity=False) == expected


def test_generated_module_is_up_to_date(gen):
    pytest.importorskip("kubernetes")
    assert gen.main(["--check"]) == 0


def test_generator_reads_descriptions_from_both_client_styles(gen):
    class V1Thing:
        """Thing does things.

        NOTE: This class is auto generated by OpenAPI Generator.
        """

        @property
        def size(self):
            """Gets the size of this V1Thing.  # noqa: E501

            How big the thing is.  # noqa: E501

            :return: The size of this V1Thing.  # noqa: E501
            :rtype: int
            """

    assert gen.field_description(V1Thing, "size") == "How big the thing is."
    assert gen.field_description(V1Thing, "missing") == ""
    assert gen.class_description(V1Thing) == "Thing does things."
    models = pytest.importorskip("kubernetes.client.models")
    assert gen.field_description(models.V1DeploymentSpec, "replicas").startswith("Number of desired pods.")


def test_generator_writes_descriptions_reproducibly(gen, tmp_path):
    text = gen.render_descriptions({"B.x": "second", "A": "first"})
    assert text.index('"A"') < text.index('"B.x"')
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    gen.write_descriptions(a, text)
    gen.write_descriptions(b, text)
    assert a.read_bytes() == b.read_bytes()
    assert gen.read_descriptions(a) == text
    assert gen.read_descriptions(tmp_path / "missing.json.gz") == ""
