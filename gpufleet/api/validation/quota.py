"""ResourceQuota and LimitRange."""

from __future__ import annotations

from fractions import Fraction

from gpufleet.api import k8s
from gpufleet.api.validation.core import (
    STANDARD_QUOTA_RESOURCES,
    Errs,
    _validate_quantity_value,
    _validate_resource_name,
    is_extended_resource,
    is_hugepages_resource,
    validate_object_meta,
)
from gpufleet.api.validation.errors import Unquoted, duplicate, forbidden, invalid, not_supported, required

QUOTA_SCOPES = [
    "BestEffort",
    "CrossNamespacePodAffinity",
    "NotBestEffort",
    "NotTerminating",
    "PriorityClass",
    "Terminating",
    "VolumeAttributesClass",
]
LIMIT_TYPES = ["Container", "Pod", "PersistentVolumeClaim"]


def _is_standard_quota_resource(name: str) -> bool:
    return (
        name in STANDARD_QUOTA_RESOURCES
        or is_hugepages_resource(name)
        or name.startswith("requests.hugepages-")
    )


def _validate_resource_quota(rq: k8s.ResourceQuota, errs: Errs) -> None:
    validate_object_meta(rq.metadata, errs)
    spec = rq.spec
    if spec is None:
        return
    for name, raw in (spec.hard or {}).items():
        p = f"spec.hard[{name}]"
        if (
            _validate_resource_name(name, p, errs)
            and "/" not in name
            and not _is_standard_quota_resource(name)
        ):
            errs.append(invalid(p, name, "must be a standard resource for quota"))
        elif not name.startswith(("requests.", "count/")) and is_extended_resource(name.removeprefix("limits.")):
            # Kubernetes accepts these and then never enforces them: an extended resource
            # cannot be overcommitted, so only its requests are counted.
            bare = name.removeprefix("limits.")
            errs.append(invalid(p, name, f"quota of an extended resource must be written requests.{bare}"))
        _validate_quantity_value(name, raw, p, errs)
    scopes = spec.scopes or []
    for scope in scopes:
        if scope not in QUOTA_SCOPES:
            errs.append(invalid("spec.scopes", scopes, "unsupported scope"))
    for pair in (("BestEffort", "NotBestEffort"), ("Terminating", "NotTerminating")):
        if set(pair) <= set(scopes):
            errs.append(invalid("spec.scopes", scopes, "conflicting scopes"))


def _pick(
    parsed: dict[str, dict[str, Fraction]], raw: dict[str, dict[str, str]], attr: str, name: str
) -> tuple[Fraction | None, str]:
    return parsed.get(attr, {}).get(name), raw.get(attr, {}).get(name, "")


def _validate_limit_range(lr: k8s.LimitRange, errs: Errs) -> None:
    validate_object_meta(lr.metadata, errs)
    if lr.spec is None:
        return
    seen_types: set[str] = set()
    for i, item in enumerate(lr.spec.limits):
        p = f"spec.limits[{i}]"
        # Deliberate difference: Kubernetes also accepts any domain-prefixed type name,
        # which nothing here would ever enforce.
        if item.type not in LIMIT_TYPES:
            errs.append(not_supported(f"{p}.type", item.type, LIMIT_TYPES))
        elif item.type in seen_types:
            errs.append(duplicate(f"{p}.type", item.type))
        seen_types.add(item.type)

        parsed: dict[str, dict[str, Fraction]] = {}
        raw: dict[str, dict[str, str]] = {}
        for attr, alias in (
            ("max", "max"),
            ("min", "min"),
            ("default", "default"),
            ("default_request", "defaultRequest"),
            ("max_limit_request_ratio", "maxLimitRequestRatio"),
        ):
            values = getattr(item, attr) or {}
            if item.type == "Pod" and attr in ("default", "default_request"):
                if values:
                    errs.append(forbidden(f"{p}.{alias}", "may not be specified when `type` is 'Pod'"))
                continue
            parsed[attr], raw[attr] = {}, {}
            for name, value in values.items():
                rp = f"{p}.{alias}[{name}]"
                _validate_resource_name(name, rp, errs)
                q = _validate_quantity_value(name, value, rp, errs)
                if q is not None:
                    parsed[attr][name], raw[attr][name] = q, str(value)
        if (
            item.type == "PersistentVolumeClaim"
            and "storage" not in (item.min or {})
            and "storage" not in (item.max or {})
        ):
            errs.append(
                required(
                    f"{p}.limits",
                    "either minimum or maximum storage value is required, but neither was provided",
                )
            )

        names = sorted(set().union(*(v.keys() for v in parsed.values())))
        for name in names:
            mn, mn_s = _pick(parsed, raw, "min", name)
            mx, mx_s = _pick(parsed, raw, "max", name)
            df, df_s = _pick(parsed, raw, "default", name)
            dr, dr_s = _pick(parsed, raw, "default_request", name)
            ratio, ratio_s = _pick(parsed, raw, "max_limit_request_ratio", name)
            if mn is not None and mx is not None and mn > mx:
                errs.append(
                    invalid(
                        f"{p}.min[{name}]",
                        Unquoted(mn_s),
                        f"min value {mn_s} is greater than max value {mx_s}",
                    )
                )
            if dr is not None and mn is not None and mn > dr:
                errs.append(
                    invalid(
                        f"{p}.defaultRequest[{name}]",
                        Unquoted(dr_s),
                        f"min value {mn_s} is greater than default request value {dr_s}",
                    )
                )
            if dr is not None and mx is not None and dr > mx:
                errs.append(
                    invalid(
                        f"{p}.defaultRequest[{name}]",
                        Unquoted(dr_s),
                        f"default request value {dr_s} is greater than max value {mx_s}",
                    )
                )
            if dr is not None and df is not None and dr > df:
                errs.append(
                    invalid(
                        f"{p}.defaultRequest[{name}]",
                        Unquoted(dr_s),
                        f"default request value {dr_s} is greater than default limit value {df_s}",
                    )
                )
            if df is not None and mn is not None and mn > df:
                errs.append(
                    invalid(
                        f"{p}.default[{name}]",
                        Unquoted(mn_s),
                        f"min value {mn_s} is greater than default value {df_s}",
                    )
                )
            if df is not None and mx is not None and df > mx:
                errs.append(
                    invalid(
                        f"{p}.default[{name}]",
                        Unquoted(mx_s),
                        f"default value {df_s} is greater than max value {mx_s}",
                    )
                )
            if ratio is not None and ratio < 1:
                errs.append(
                    invalid(
                        f"{p}.maxLimitRequestRatio[{name}]",
                        Unquoted(ratio_s),
                        f"ratio {ratio_s} is less than 1",
                    )
                )
            if ratio is not None and mn is not None and mx is not None and mn > 0 and ratio > mx / mn:
                errs.append(
                    invalid(
                        f"{p}.maxLimitRequestRatio[{name}]",
                        Unquoted(ratio_s),
                        f"ratio {ratio_s} is greater than max/min = {float(mx / mn):f}",
                    )
                )
