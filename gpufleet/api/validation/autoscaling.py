"""autoscaling/v2 HorizontalPodAutoscaler and policy/v1 PodDisruptionBudget."""

from __future__ import annotations

from typing import Any

from gpufleet.api import k8s
from gpufleet.api.validation.core import (
    Errs,
    _enum,
    _names,
    _quantity,
    _validate_resource_name,
    validate_label_selector,
    validate_object_meta,
)
from gpufleet.api.validation.errors import Unquoted, forbidden, invalid, not_supported, required
from gpufleet.api.validation.names import is_dns1123_label, is_valid_path_segment_name
from gpufleet.api.validation.workloads import _not_more_than_100_percent, _validate_int_or_percent

METRIC_SOURCE_TYPES = ["Object", "Pods", "Resource", "External", "ContainerResource"]
METRIC_TARGET_TYPES = ["Utilization", "Value", "AverageValue"]
SELECT_POLICIES = ["Max", "Min", "Disabled"]
SCALING_POLICY_TYPES = ["Pods", "Percent"]
MAX_PERIOD_SECONDS = 1800
MAX_STABILIZATION_WINDOW_SECONDS = 3600
_METRIC_SOURCE_ATTRS = {
    "Object": ("object", "object"),
    "Pods": ("pods", "pods"),
    "Resource": ("resource", "resource"),
    "External": ("external", "external"),
    "ContainerResource": ("container_resource", "containerResource"),
}
_TARGET_FIELD_FOR_TYPE = {
    "Utilization": ("average_utilization", "averageUtilization"),
    "Value": ("value", "value"),
    "AverageValue": ("average_value", "averageValue"),
}


def _validate_cross_version_ref(ref: Any, path: str, errs: Errs) -> None:
    if ref is None:
        errs.append(required(path))
        return
    for attr in ("kind", "name"):
        value = getattr(ref, attr)
        if not value:
            errs.append(required(f"{path}.{attr}"))
        else:
            _names(value, f"{path}.{attr}", is_valid_path_segment_name, errs)


def _validate_metric_target(target: k8s.MetricTarget, path: str, errs: Errs) -> None:
    if not target.type:
        errs.append(required(f"{path}.type", "must specify a metric target type"))
    elif target.type not in METRIC_TARGET_TYPES:
        errs.append(
            invalid(f"{path}.type", target.type, "must be either Utilization, Value, or AverageValue")
        )
    for attr, alias in (("value", "value"), ("average_value", "averageValue")):
        raw = getattr(target, attr)
        if raw is not None:
            q = _quantity(raw, f"{path}.{alias}", errs)
            if q is not None and q <= 0:
                errs.append(invalid(f"{path}.{alias}", Unquoted(raw), "must be positive"))
    if target.average_utilization is not None and target.average_utilization < 1:
        errs.append(
            invalid(f"{path}.averageUtilization", target.average_utilization, "must be greater than 0")
        )


def _target_matches_type(target: k8s.MetricTarget, path: str, errs: Errs) -> None:
    """Deliberately stricter than Kubernetes, which ignores a target value its type never reads."""
    attr_alias = _TARGET_FIELD_FOR_TYPE.get(target.type)
    if attr_alias is not None and getattr(target, attr_alias[0]) is None:
        errs.append(required(f"{path}.{attr_alias[1]}", f"must be set when `type` is '{target.type}'"))


def _validate_metric(metric: k8s.MetricSpec, path: str, errs: Errs) -> None:
    if not metric.type:
        errs.append(required(f"{path}.type", "must specify a metric source type"))
    elif metric.type not in METRIC_SOURCE_TYPES:
        errs.append(not_supported(f"{path}.type", metric.type, METRIC_SOURCE_TYPES))
    present = [
        (attr, alias) for attr, alias in _METRIC_SOURCE_ATTRS.values() if getattr(metric, attr) is not None
    ]
    expected = _METRIC_SOURCE_ATTRS.get(metric.type)
    if expected is not None and getattr(metric, expected[0]) is None:
        errs.append(
            required(f"{path}.{expected[1]}", "must populate information for the given metric source")
        )
    if len(present) > 1:
        for attr, alias in present:
            if expected is None or attr != expected[0]:
                errs.append(forbidden(f"{path}.{alias}", "must populate the given metric source only"))
    if expected is None:
        return
    source = getattr(metric, expected[0])
    if source is None:
        return
    sp = f"{path}.{expected[1]}"
    tp = f"{sp}.target"
    before = len(errs)
    target = source.target
    if metric.type in ("Resource", "ContainerResource"):
        if not source.name:
            errs.append(required(f"{sp}.name", "must specify a resource name"))
        else:
            _validate_resource_name(source.name, f"{sp}.name", errs)
        if metric.type == "ContainerResource":
            if not source.container:
                errs.append(required(f"{sp}.container", "must specify a container"))
            else:
                _names(source.container, f"{sp}.container", is_dns1123_label, errs)
        if target.average_utilization is None and target.average_value is None:
            errs.append(
                required(
                    f"{tp}.averageUtilization", "must set either a target raw value or a target utilization"
                )
            )
        elif target.average_utilization is not None and target.average_value is not None:
            errs.append(
                forbidden(
                    f"{tp}.averageValue", "may not set both a target raw value and a target utilization"
                )
            )
    else:
        if not source.metric.name:
            errs.append(required(f"{sp}.metric.name", "must specify a metric name"))
        validate_label_selector(source.metric.selector, f"{sp}.metric.selector", errs)
        if metric.type == "Pods":
            if target.average_value is None:
                errs.append(required(f"{tp}.averageValue", "must specify a positive target averageValue"))
        elif metric.type == "Object":
            _validate_cross_version_ref(source.described_object, f"{sp}.describedObject", errs)
            if target.value is None and target.average_value is None:
                errs.append(required(f"{tp}.averageValue", "must set either a target value or averageValue"))
        elif metric.type == "External":
            if target.value is None and target.average_value is None:
                errs.append(
                    required(
                        f"{tp}.averageValue", "must set either a target value for metric or a per-pod target"
                    )
                )
            elif target.value is not None and target.average_value is not None:
                errs.append(
                    forbidden(
                        f"{tp}.value", "may not set both a target value for metric and a per-pod target"
                    )
                )
    _validate_metric_target(target, tp, errs)
    if len(errs) == before:
        _target_matches_type(target, tp, errs)


def _validate_scaling_rules(rules: k8s.HPAScalingRules | None, path: str, errs: Errs) -> None:
    if rules is None:
        return
    window = rules.stabilization_window_seconds
    if window is not None and window < 0:
        errs.append(
            invalid(f"{path}.stabilizationWindowSeconds", window, "must be greater than or equal to zero")
        )
    if window is not None and window > MAX_STABILIZATION_WINDOW_SECONDS:
        errs.append(
            invalid(
                f"{path}.stabilizationWindowSeconds",
                window,
                f"must be less than or equal to {MAX_STABILIZATION_WINDOW_SECONDS}",
            )
        )
    if rules.select_policy is not None and rules.select_policy not in SELECT_POLICIES:
        errs.append(not_supported(f"{path}.selectPolicy", rules.select_policy, SELECT_POLICIES))
    if rules.policies is not None and not rules.policies:
        errs.append(required(f"{path}.policies", "must specify at least one Policy"))
    for i, policy in enumerate(rules.policies or []):
        p = f"{path}.policies[{i}]"
        if policy.type not in SCALING_POLICY_TYPES:
            errs.append(not_supported(f"{p}.type", policy.type, SCALING_POLICY_TYPES))
        if policy.value <= 0:
            errs.append(invalid(f"{p}.value", policy.value, "must be greater than zero"))
        if policy.period_seconds <= 0:
            errs.append(invalid(f"{p}.periodSeconds", policy.period_seconds, "must be greater than zero"))
        if policy.period_seconds > MAX_PERIOD_SECONDS:
            errs.append(
                invalid(
                    f"{p}.periodSeconds",
                    policy.period_seconds,
                    f"must be less than or equal to {MAX_PERIOD_SECONDS}",
                )
            )
    if rules.tolerance is not None:
        q = _quantity(rules.tolerance, f"{path}.tolerance", errs)
        if q is not None and q < 0:
            errs.append(
                invalid(f"{path}.tolerance", Unquoted(rules.tolerance), "must be greater than or equal to 0")
            )


def _validate_hpa(hpa: k8s.HorizontalPodAutoscaler, errs: Errs) -> None:
    validate_object_meta(hpa.metadata, errs)
    spec = hpa.spec
    # Deliberate difference: Kubernetes requires minReplicas >= 1 unless the alpha
    # HPAScaleToZero gate is on. gpufleet scales model servers to zero, so 0 is allowed.
    if spec.min_replicas is not None and spec.min_replicas < 0:
        errs.append(invalid("spec.minReplicas", spec.min_replicas, "must be greater than or equal to 0"))
    if spec.max_replicas < 1:
        errs.append(invalid("spec.maxReplicas", spec.max_replicas, "must be greater than 0"))
    if spec.min_replicas is not None and spec.max_replicas < spec.min_replicas:
        errs.append(
            invalid("spec.maxReplicas", spec.max_replicas, "must be greater than or equal to `minReplicas`")
        )
    # Kubernetes stops after the first failing group (ref, metrics, behavior); all are reported here.
    _validate_cross_version_ref(spec.scale_target_ref, "spec.scaleTargetRef", errs)
    for i, metric in enumerate(spec.metrics or []):
        _validate_metric(metric, f"spec.metrics[{i}]", errs)
    if spec.behavior is not None:
        _validate_scaling_rules(spec.behavior.scale_up, "spec.behavior.scaleUp", errs)
        _validate_scaling_rules(spec.behavior.scale_down, "spec.behavior.scaleDown", errs)


# --- policy -----------------------------------------------------------------------------


def _validate_pdb(pdb: k8s.PodDisruptionBudget, errs: Errs) -> None:
    validate_object_meta(pdb.metadata, errs)
    spec = pdb.spec
    if spec is None:
        return
    if spec.min_available is not None and spec.max_unavailable is not None:
        errs.append(
            invalid(
                "spec.minAvailable",
                Unquoted(str(spec.min_available)),
                "minAvailable and maxUnavailable cannot be both set",
            )
        )
    for attr, alias in (("min_available", "minAvailable"), ("max_unavailable", "maxUnavailable")):
        value = getattr(spec, attr)
        if value is not None:
            _validate_int_or_percent(value, f"spec.{alias}", errs)
            _not_more_than_100_percent(value, f"spec.{alias}", errs)
    validate_label_selector(spec.selector, "spec.selector", errs)
    if spec.unhealthy_pod_eviction_policy is not None:
        _enum(
            spec.unhealthy_pod_eviction_policy,
            "spec.unhealthyPodEvictionPolicy",
            ["AlwaysAllow", "IfHealthyBudget"],
            errs,
        )
