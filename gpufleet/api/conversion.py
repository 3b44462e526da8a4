"""Conversion between the served versions of a kind and the version it is stored in.

A kind served in several versions keeps one storage version; every other version is a view
converted on the way in (request bodies) and on the way out (responses, watch events). The
functions here are pure: wire dicts in, wire dicts out.

HorizontalPodAutoscaler is stored as autoscaling/v2 and also served as autoscaling/v1, as in
Kubernetes (pkg/apis/autoscaling/v1/conversion.go): v1's targetCPUUtilizationPercentage is the
Resource cpu Utilization metric of v2, and what v1 cannot express travels in the annotations
upstream uses, so a v2 object read and written back through v1 loses nothing:

- ``autoscaling.alpha.kubernetes.io/metrics``: spec.metrics other than the cpu target;
- ``autoscaling.alpha.kubernetes.io/current-metrics``: status.currentMetrics likewise;
- ``autoscaling.alpha.kubernetes.io/conditions``: status.conditions;
- ``autoscaling.alpha.kubernetes.io/behavior``: spec.behavior.

The annotations hold the autoscaling/v2 JSON of those fields. When the cpu entry is not the
plain last one (other fields set, or not last in the list) the annotation holds the whole list,
and the v1 field then only updates the value in its place.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

METRICS_ANNOTATION = "autoscaling.alpha.kubernetes.io/metrics"
CURRENT_METRICS_ANNOTATION = "autoscaling.alpha.kubernetes.io/current-metrics"
CONDITIONS_ANNOTATION = "autoscaling.alpha.kubernetes.io/conditions"
BEHAVIOR_ANNOTATION = "autoscaling.alpha.kubernetes.io/behavior"
HPA_ANNOTATIONS = (METRICS_ANNOTATION, CURRENT_METRICS_ANNOTATION, CONDITIONS_ANNOTATION, BEHAVIOR_ANNOTATION)


class ConversionError(ValueError):
    """The object cannot be converted; ``field`` is its path in the version the client sent."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Conversion:
    """How a served version maps to its storage version."""

    to_storage: Callable[[Obj], Obj]
    from_storage: Callable[[Obj], Obj]
    # A field path of the storage version -> the path a client of this version wrote
    # (used to word validation errors); the storage-version object is the second argument.
    field_path: Callable[[str, Obj], str]
    # A field selector's label of this version -> the stored version's (None: not supported);
    # unset: the labels are the same.
    field_label: Callable[[str], str | None] | None = None


# --- HorizontalPodAutoscaler autoscaling/v2 <-> autoscaling/v1 ---------------------------------

_V1 = "autoscaling/v1"
_V2 = "autoscaling/v2"


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _cpu_target_index(metrics: list[Any]) -> int | None:
    for i, m in enumerate(metrics):
        if not isinstance(m, dict) or m.get("type") != "Resource":
            continue
        res = m.get("resource") or {}
        target = res.get("target") or {}
        if res.get("name") == "cpu" and target.get("type") == "Utilization" and \
                target.get("averageUtilization") is not None:
            return i
    return None


def _cpu_current_index(metrics: list[Any]) -> int | None:
    for i, m in enumerate(metrics):
        if not isinstance(m, dict) or m.get("type") != "Resource":
            continue
        res = m.get("resource") or {}
        if res.get("name") == "cpu" and (res.get("current") or {}).get("averageUtilization") is not None:
            return i
    return None


def _cpu_target(value: int) -> Obj:
    return {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                        "averageUtilization": value}}}


def _cpu_current(value: int) -> Obj:
    return {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": value}}}


def _split(metrics: list[Any], index: int | None, plain: Callable[[int], Obj], value: int | None) -> list[Any] | None:
    """What the annotation keeps of ``metrics`` once the cpu entry at ``index`` is a v1 field:
    the others when the cpu entry is plain and last, else the whole list (None: nothing)."""
    if index is None:
        return metrics or None
    if index == len(metrics) - 1 and value is not None and metrics[index] == plain(value):
        return metrics[:-1] or None
    return metrics


def _cpu_to_v1(metrics: list[Any], cpu_index: Callable[[list[Any]], int | None], field: str,
               plain: Callable[[int], Obj], out: Obj, out_key: str, notes: dict[str, str], annotation: str) -> None:
    """The cpu utilization entry of v2 ``metrics`` as v1's ``out[out_key]``; the rest in ``annotation``."""
    index = cpu_index(metrics)
    value = metrics[index]["resource"][field]["averageUtilization"] if index is not None else None
    if value is not None:
        out[out_key] = value
    kept = _split(metrics, index, plain, value)
    if kept:
        notes[annotation] = _dumps(kept)


def _join(kept: list[Any] | None, cpu_index: Callable[[list[Any]], int | None], plain: Callable[[int], Obj],
          value: int | None, set_value: Callable[[Obj, int], None]) -> list[Any] | None:
    metrics = copy.deepcopy(kept) if kept else []
    index = cpu_index(metrics)
    if index is not None:
        if value is None:
            del metrics[index]
        else:
            set_value(metrics[index], value)
    elif value is not None:
        metrics.append(plain(value))
    return metrics or None


def _set_target(m: Obj, value: int) -> None:
    m["resource"]["target"]["averageUtilization"] = value


def _set_current(m: Obj, value: int) -> None:
    m["resource"]["current"]["averageUtilization"] = value


def hpa_v2_to_v1(obj: Obj) -> Obj:
    """An autoscaling/v2 HorizontalPodAutoscaler as autoscaling/v1."""
    out: Obj = {k: copy.deepcopy(v) for k, v in obj.items() if k not in ("spec", "status")}
    out["apiVersion"] = _V1
    out.setdefault("kind", "HorizontalPodAutoscaler")
    notes: dict[str, str] = {}
    spec = obj.get("spec")
    if isinstance(spec, dict):
        v1spec: Obj = {k: copy.deepcopy(spec[k]) for k in ("scaleTargetRef", "minReplicas", "maxReplicas")
                       if k in spec}
        _cpu_to_v1(list(spec.get("metrics") or []), _cpu_target_index, "target", _cpu_target,
                   v1spec, "targetCPUUtilizationPercentage", notes, METRICS_ANNOTATION)
        if spec.get("behavior") is not None:
            notes[BEHAVIOR_ANNOTATION] = _dumps(spec["behavior"])
        out["spec"] = v1spec
    status = obj.get("status")
    if isinstance(status, dict):
        v1status: Obj = {k: copy.deepcopy(status[k]) for k in ("observedGeneration", "lastScaleTime")
                         if k in status}
        v1status["currentReplicas"] = status.get("currentReplicas", 0)
        v1status["desiredReplicas"] = status.get("desiredReplicas", 0)
        _cpu_to_v1(list(status.get("currentMetrics") or []), _cpu_current_index, "current", _cpu_current,
                   v1status, "currentCPUUtilizationPercentage", notes, CURRENT_METRICS_ANNOTATION)
        if status.get("conditions"):
            notes[CONDITIONS_ANNOTATION] = _dumps(status["conditions"])
        out["status"] = v1status
    if notes:
        meta = out.setdefault("metadata", {})
        meta["annotations"] = {**(meta.get("annotations") or {}), **notes}
    return out


def _annotation(annotations: dict[str, Any], key: str, want: type) -> Any:
    raw = annotations.pop(key, None)
    if raw is None:
        return None
    field = f"metadata.annotations[{key}]"
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except ValueError as e:
        raise ConversionError(field, f"Invalid value: must be the JSON of autoscaling/v2 fields: {e}") from None
    if not isinstance(value, want):
        kind = "a list" if want is list else "an object"
        raise ConversionError(field, f"Invalid value: must be the JSON of {kind} in autoscaling/v2 form")
    return value


def hpa_v1_to_v2(obj: Obj) -> Obj:
    """An autoscaling/v1 HorizontalPodAutoscaler as autoscaling/v2 (the stored form)."""
    out: Obj = {k: copy.deepcopy(v) for k, v in obj.items() if k not in ("spec", "status")}
    out["apiVersion"] = _V2
    out.setdefault("kind", "HorizontalPodAutoscaler")
    meta = out.get("metadata")
    annotations: dict[str, Any] = {}
    if isinstance(meta, dict) and isinstance(meta.get("annotations"), dict):
        annotations = meta["annotations"]
    metrics = _annotation(annotations, METRICS_ANNOTATION, list)
    current = _annotation(annotations, CURRENT_METRICS_ANNOTATION, list)
    conditions = _annotation(annotations, CONDITIONS_ANNOTATION, list)
    behavior = _annotation(annotations, BEHAVIOR_ANNOTATION, dict)
    if isinstance(meta, dict) and "annotations" in meta and not annotations:
        del meta["annotations"]
    spec = obj.get("spec")
    if isinstance(spec, dict):
        v2spec: Obj = {k: copy.deepcopy(spec[k]) for k in ("scaleTargetRef", "minReplicas", "maxReplicas")
                       if k in spec}
        joined = _join(metrics, _cpu_target_index, _cpu_target, spec.get("targetCPUUtilizationPercentage"),
                       _set_target)
        if joined:
            v2spec["metrics"] = joined
        if behavior is not None:
            v2spec["behavior"] = behavior
        out["spec"] = v2spec
    status = obj.get("status")
    if isinstance(status, dict):
        v2status: Obj = {k: copy.deepcopy(status[k]) for k in ("observedGeneration", "lastScaleTime",
                                                                "currentReplicas") if k in status}
        v2status["desiredReplicas"] = status.get("desiredReplicas", 0)
        joined = _join(current, _cpu_current_index, _cpu_current, status.get("currentCPUUtilizationPercentage"),
                       _set_current)
        if joined:
            v2status["currentMetrics"] = joined
        if conditions:
            v2status["conditions"] = conditions
        out["status"] = v2status
    return out


_METRIC_PATH = re.compile(r"^spec\.metrics\[(\d+)\](.*)$")


def hpa_v1_field_path(field: str, v2: Obj) -> str:
    """Where a v1 client wrote what a validation error of the stored v2 object names."""
    m = _METRIC_PATH.match(field or "")
    if m:
        metrics = list((v2.get("spec") or {}).get("metrics") or [])
        index = _cpu_target_index(metrics)
        if index == int(m.group(1)) and m.group(2) == ".resource.target.averageUtilization":
            return "spec.targetCPUUtilizationPercentage"
        return f"metadata.annotations[{METRICS_ANNOTATION}]"
    if field == "spec.behavior" or (field or "").startswith("spec.behavior."):
        return f"metadata.annotations[{BEHAVIOR_ANNOTATION}]"
    return field


HPA_V1 = Conversion(to_storage=hpa_v1_to_v2, from_storage=hpa_v2_to_v1, field_path=hpa_v1_field_path)
