"""LimitRanger admission: per-container and per-pod defaults and bounds from a namespace's
LimitRanges, as Kubernetes' LimitRanger plugin applies them to pods.

Mutating (before quota, so a defaulted pod is charged what it will really ask for): every
container and init container lacking a request or limit that a ``type: Container`` item
names in ``defaultRequest`` / ``default`` gets it, and the pod is annotated
``kubernetes.io/limit-ranger`` with what was set. Validating: ``min``, ``max`` and
``maxLimitRequestRatio`` of Container items hold for each container, of Pod items for the
pod's totals; every violation is reported at once in a 403 like
``pods "x" is forbidden: maximum cpu usage per Container is 2, but limit is 4``.
GPUs (``nvidia.com/gpu``) are resources like any other here.

Pods are checked on create only: their containers' resources cannot change afterwards.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from gpufleet.api import podresources
from gpufleet.api.quantity import format_quantity, parse_quantity
from gpufleet.apiserver.admission import AdmissionContext
from gpufleet.apiserver.errors import forbidden
from gpufleet.store import base as store_base

LIMIT_RANGES = "limitranges"
ANNOTATION = "kubernetes.io/limit-ranger"


def _applies(ctx: AdmissionContext) -> bool:
    return ctx.operation == "CREATE" and not ctx.subresource and ctx.rt.key == "pods"


async def _limit_ranges(ctx: AdmissionContext) -> list[dict[str, Any]]:
    items = await store_base.list_items(ctx.server.store, LIMIT_RANGES, ctx.namespace)
    return sorted(items, key=lambda lr: lr["metadata"]["name"])


def _items(lr: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [i for i in (lr.get("spec") or {}).get("limits") or [] if i.get("type") == kind]


def apply_defaults(limit_ranges: list[dict[str, Any]], pod: dict[str, Any]) -> None:
    """Fill missing container requests/limits from the Container items' defaults."""
    notes: list[str] = []
    for lr in limit_ranges:
        default_requests: dict[str, Any] = {}
        default_limits: dict[str, Any] = {}
        for item in _items(lr, "Container"):
            default_requests.update(item.get("defaultRequest") or {})
            default_limits.update(item.get("default") or {})
        if not default_requests and not default_limits:
            continue
        spec = pod.setdefault("spec", {})
        for key, label in (("containers", "container"), ("initContainers", "init container")):
            for c in spec.get(key) or []:
                res = c.setdefault("resources", {})
                set_req, set_lim = [], []
                limits = res.setdefault("limits", {})
                for name, value in default_limits.items():
                    if name not in limits:
                        limits[name] = value
                        set_lim.append(name)
                requests = res.setdefault("requests", {})
                for name, value in default_requests.items():
                    if name not in requests:
                        requests[name] = value
                        set_req.append(name)
                for which in ("limits", "requests"):
                    if not res[which]:
                        del res[which]
                if set_req:
                    notes.append(f"{', '.join(sorted(set_req))} request for {label} {c.get('name', '')}")
                if set_lim:
                    notes.append(f"{', '.join(sorted(set_lim))} limit for {label} {c.get('name', '')}")
    if notes:
        meta = pod.setdefault("metadata", {})
        annotations = meta.get("annotations") or {}
        annotations[ANNOTATION] = "LimitRanger plugin set: " + "; ".join(notes)
        meta["annotations"] = annotations


def _value(raw: Any) -> Fraction | None:
    try:
        return parse_quantity(raw)
    except (ValueError, TypeError):
        return None


def _min(kind: str, name: str, enforced: Any, requests: dict, limits: dict) -> str | None:
    if name not in requests:
        return f"minimum {name} usage per {kind} is {enforced}.  No request is specified"
    e = _value(enforced)
    if e is None:
        return None
    if (_value(requests[name]) or 0) < e:
        return f"minimum {name} usage per {kind} is {enforced}, but request is {requests[name]}"
    if name in limits and (_value(limits[name]) or 0) < e:
        return f"minimum {name} usage per {kind} is {enforced}, but limit is {limits[name]}"
    return None


def _max(kind: str, name: str, enforced: Any, requests: dict, limits: dict) -> str | None:
    if name not in limits:
        return f"maximum {name} usage per {kind} is {enforced}.  No limit is specified"
    e = _value(enforced)
    if e is None:
        return None
    if (_value(limits[name]) or 0) > e:
        return f"maximum {name} usage per {kind} is {enforced}, but limit is {limits[name]}"
    if name in requests and (_value(requests[name]) or 0) > e:
        return f"maximum {name} usage per {kind} is {enforced}, but request is {requests[name]}"
    return None


def _ratio(kind: str, name: str, enforced: Any, requests: dict, limits: dict) -> str | None:
    req = _value(requests.get(name)) if name in requests else None
    lim = _value(limits.get(name)) if name in limits else None
    if not req:
        return (f"{name} max limit to request ratio per {kind} is {enforced}, "
                "but no request is specified or request is 0")
    if not lim:
        return (f"{name} max limit to request ratio per {kind} is {enforced}, "
                "but no limit is specified or limit is 0")
    e = _value(enforced)
    if e is not None and lim / req > e:
        return (f"{name} max limit to request ratio per {kind} is {enforced}, "
                f"but provided ratio is {float(lim / req):f}")
    return None


def _check(kind: str, item: dict[str, Any], requests: dict, limits: dict, errors: list[str]) -> None:
    for checks, fn in (("min", _min), ("max", _max), ("maxLimitRequestRatio", _ratio)):
        for name, enforced in sorted((item.get(checks) or {}).items()):
            problem = fn(kind, name, enforced, requests, limits)
            if problem:
                errors.append(problem)


def _shown(values: dict[str, Fraction]) -> dict[str, str]:
    return {k: format_quantity(v, "memory" if k == "memory" else "plain") for k, v in values.items()}


def violations(limit_ranges: list[dict[str, Any]], pod: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    spec = pod.get("spec") or {}
    for lr in limit_ranges:
        for item in _items(lr, "Container"):
            for key in ("containers", "initContainers"):
                for c in spec.get(key) or []:
                    res = c.get("resources") or {}
                    _check("Container", item, res.get("requests") or {}, res.get("limits") or {}, errors)
        for item in _items(lr, "Pod"):
            # The LimitRanger bounds what the containers ask for: pod overhead is left out.
            requests = podresources.pod_requests(pod, exclude_overhead=True)
            limits = podresources.pod_limits(pod, exclude_overhead=True)
            _check("Pod", item, _shown(requests), _shown(limits), errors)
    return errors


class LimitRangerAdmission:
    name = "LimitRanger"

    async def admit(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if not _applies(ctx):
            return
        ranges = await _limit_ranges(ctx)
        if ranges:
            apply_defaults(ranges, obj)

    async def validate(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if not _applies(ctx):
            return
        ranges = await _limit_ranges(ctx)
        if not ranges:
            return
        errors = violations(ranges, obj)
        if errors:
            # Go's aggregate error: one message as is, several in brackets.
            text = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
            raise forbidden(f'{ctx.rt.key} "{ctx.name}" is forbidden: {text}', ctx.rt, ctx.name)
