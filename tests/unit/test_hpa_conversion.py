"""HorizontalPodAutoscaler autoscaling/v2 <-> autoscaling/v1 conversion (pure functions)."""

from __future__ import annotations

import copy
import json

import pytest

from gpufleet.api import conversion as c
from gpufleet.api.autoscaling_v1 import HorizontalPodAutoscalerV1
from gpufleet.api.k8s import HorizontalPodAutoscaler
from gpufleet.api.registry import REGISTRY

REF = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}
BEHAVIOR = {"scaleDown": {"stabilizationWindowSeconds": 300, "selectPolicy": "Max",
                          "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}}
CONDITIONS = [{"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale",
               "lastTransitionTime": "2026-01-01T00:00:00Z"}]


def cpu(value: int) -> dict:
    return {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                       "averageUtilization": value}}}


def pods_metric() -> dict:
    return {"type": "Pods", "pods": {"metric": {"name": "requests_per_second"},
                                     "target": {"type": "AverageValue", "averageValue": "10"}}}


def v2(metrics: list, current: list | None = None, **spec: object) -> dict:
    obj = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": "web", "namespace": "default", "annotations": {"team": "vision"}},
           "spec": {"scaleTargetRef": REF, "minReplicas": 1, "maxReplicas": 5, "metrics": metrics, **spec}}
    if current is not None:
        obj["status"] = {"currentReplicas": 2, "desiredReplicas": 3, "currentMetrics": current,
                         "conditions": CONDITIONS, "lastScaleTime": "2026-01-01T00:00:00Z"}
    return obj


def test_the_cpu_target_is_the_v1_field_and_nothing_else_is_annotated() -> None:
    v1 = c.hpa_v2_to_v1(v2([cpu(50)]))
    assert v1["apiVersion"] == "autoscaling/v1"
    assert v1["spec"] == {"scaleTargetRef": REF, "minReplicas": 1, "maxReplicas": 5,
                          "targetCPUUtilizationPercentage": 50}
    assert v1["metadata"]["annotations"] == {"team": "vision"}
    HorizontalPodAutoscalerV1.model_validate(v1)


def test_what_v1_cannot_express_travels_in_the_upstream_annotations() -> None:
    current = [{"type": "Pods", "pods": {"metric": {"name": "requests_per_second"},
                                         "current": {"averageValue": "12"}}},
               {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 40}}}]
    v1 = c.hpa_v2_to_v1(v2([pods_metric(), cpu(50)], current, behavior=BEHAVIOR))
    notes = v1["metadata"]["annotations"]
    assert json.loads(notes[c.METRICS_ANNOTATION]) == [pods_metric()]
    assert json.loads(notes[c.CURRENT_METRICS_ANNOTATION]) == current[:1]
    assert json.loads(notes[c.CONDITIONS_ANNOTATION]) == CONDITIONS
    assert json.loads(notes[c.BEHAVIOR_ANNOTATION]) == BEHAVIOR
    assert v1["spec"]["targetCPUUtilizationPercentage"] == 50
    assert v1["status"] == {"currentReplicas": 2, "desiredReplicas": 3, "currentCPUUtilizationPercentage": 40,
                            "lastScaleTime": "2026-01-01T00:00:00Z"}


@pytest.mark.parametrize("metrics", [
    [cpu(50)],
    [pods_metric(), cpu(70)],
    [cpu(70), pods_metric()],  # the cpu target not last: the order survives too
    [pods_metric()],
    [cpu(60), cpu(80)],
    [{"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "1Gi"}}}],
])
def test_v2_to_v1_to_v2_loses_nothing(metrics: list) -> None:
    current = [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 40,
                                                                           "averageValue": "250m"}}}]
    original = v2(metrics, current, behavior=BEHAVIOR)
    kept = copy.deepcopy(original)
    back = c.hpa_v1_to_v2(c.hpa_v2_to_v1(original))
    assert back == original
    assert original == kept  # the input is not changed
    HorizontalPodAutoscaler.model_validate(back)


def test_v2_without_annotations_or_status_round_trips() -> None:
    original = v2([cpu(50)])
    del original["metadata"]["annotations"]
    assert c.hpa_v1_to_v2(c.hpa_v2_to_v1(original)) == original


@pytest.mark.parametrize("v1", [
    {"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "web"},
     "spec": {"scaleTargetRef": REF, "minReplicas": 1, "maxReplicas": 3, "targetCPUUtilizationPercentage": 50}},
    {"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "web"},
     "spec": {"scaleTargetRef": REF, "maxReplicas": 3}},
    {"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
     "metadata": {"name": "web", "labels": {"a": "b"}},
     "spec": {"scaleTargetRef": REF, "minReplicas": 2, "maxReplicas": 4, "targetCPUUtilizationPercentage": 75},
     "status": {"observedGeneration": 3, "currentReplicas": 2, "desiredReplicas": 4,
                "currentCPUUtilizationPercentage": 90, "lastScaleTime": "2026-01-01T00:00:00Z"}},
])
def test_v1_to_v2_to_v1_is_the_identity(v1: dict) -> None:
    stored = c.hpa_v1_to_v2(v1)
    HorizontalPodAutoscaler.model_validate(stored)
    assert c.hpa_v2_to_v1(stored) == v1


def test_v1_target_becomes_the_v2_cpu_metric() -> None:
    stored = c.hpa_v1_to_v2({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
                             "metadata": {"name": "web"},
                             "spec": {"scaleTargetRef": REF, "maxReplicas": 3, "targetCPUUtilizationPercentage": 50}})
    assert stored["apiVersion"] == "autoscaling/v2"
    assert stored["spec"]["metrics"] == [cpu(50)]


def test_a_v1_edit_of_the_target_changes_the_cpu_metric_in_place() -> None:
    v1 = c.hpa_v2_to_v1(v2([cpu(70), pods_metric()]))
    v1["spec"]["targetCPUUtilizationPercentage"] = 30
    assert c.hpa_v1_to_v2(v1)["spec"]["metrics"] == [cpu(30), pods_metric()]
    del v1["spec"]["targetCPUUtilizationPercentage"]
    assert c.hpa_v1_to_v2(v1)["spec"]["metrics"] == [pods_metric()]


def test_a_malformed_annotation_is_an_error_naming_it() -> None:
    bad = {"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": "web", "annotations": {c.METRICS_ANNOTATION: "{not json"}},
           "spec": {"scaleTargetRef": REF, "maxReplicas": 3}}
    with pytest.raises(c.ConversionError) as err:
        c.hpa_v1_to_v2(bad)
    assert err.value.field == f"metadata.annotations[{c.METRICS_ANNOTATION}]"


def test_v2_validation_paths_become_v1_paths() -> None:
    stored = v2([pods_metric(), cpu(0)])
    assert c.hpa_v1_field_path("spec.metrics[1].resource.target.averageUtilization", stored) == \
        "spec.targetCPUUtilizationPercentage"
    assert c.hpa_v1_field_path("spec.metrics[0].pods.target.averageValue", stored) == \
        f"metadata.annotations[{c.METRICS_ANNOTATION}]"
    assert c.hpa_v1_field_path("spec.behavior.scaleDown.policies[0].value", stored) == \
        f"metadata.annotations[{c.BEHAVIOR_ANNOTATION}]"
    assert c.hpa_v1_field_path("spec.maxReplicas", stored) == "spec.maxReplicas"


def test_the_registry_serves_v1_from_v2_storage() -> None:
    v1 = REGISTRY.by_resource("autoscaling", "v1", "horizontalpodautoscalers")
    v2_rt = REGISTRY.by_resource("autoscaling", "v2", "horizontalpodautoscalers")
    assert v1 is not None and v2_rt is not None
    assert not v1.is_storage and v2_rt.is_storage
    assert REGISTRY.storage_of(v1) is v2_rt
    assert REGISTRY.by_key("horizontalpodautoscalers.autoscaling") is v2_rt
    assert v1 not in REGISTRY.all() and v1 in REGISTRY.served()
    assert REGISTRY.groups()["autoscaling"] == ["v2", "v1"]  # v2 preferred
    assert REGISTRY.resolve("hpa") is v2_rt
