"""ResourceQuota arithmetic: what an object costs, which quotas it falls under, what a
namespace uses.

Pure functions over plain JSON dicts, shared by the API server's quota admission (which
charges a quota before an object is stored) and the resourcequota controller (which
recomputes usage from the objects that exist). They follow Kubernetes' quota evaluators
(``pkg/quota/v1/evaluator/core/pods.go`` and the generic object-count evaluator):

- a pod costs ``count/pods`` always, and ``pods``, ``cpu``/``requests.cpu``, ``limits.cpu``,
  ``memory``/``requests.memory``, ``limits.memory``, ``requests.<extended>`` (such as
  ``requests.nvidia.com/gpu``) while it is not terminal (Succeeded/Failed) and not past its
  deletion grace period;
- any other object costs ``count/<resource>.<group>`` and, for services, configmaps,
  secrets, resourcequotas, persistentvolumeclaims and replicationcontrollers, the bare
  plural as well;
- a quota with scopes (Terminating, NotTerminating, BestEffort, NotBestEffort, PriorityClass
  through ``scopeSelector``) covers only pods that match all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from fractions import Fraction
from typing import Any

from gpufleet.api import podresources
from gpufleet.api.quantity import format_quantity, parse_quantity

# Resources a quota may name that a pod is charged for (besides requests.<extended> and hugepages).
POD_RESOURCES = frozenset({
    "count/pods", "pods", "cpu", "memory", "ephemeral-storage",
    "requests.cpu", "requests.memory", "requests.ephemeral-storage",
    "limits.cpu", "limits.memory", "limits.ephemeral-storage",
})
# Quota on these requires every container to state the matching request or limit.
_MUST_SPECIFY = frozenset({"cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"})
# Bare names that count objects of a kind (legacy spelling of count/<resource>).
LEGACY_COUNT = {
    "services": "services",
    "configmaps": "configmaps",
    "secrets": "secrets",
    "resourcequotas": "resourcequotas",
    "persistentvolumeclaims": "persistentvolumeclaims",
    "replicationcontrollers": "replicationcontrollers",
}
_TERMINAL = ("Succeeded", "Failed")


def _is_native(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name


def is_extended(name: str) -> bool:
    return not _is_native(name) and not name.startswith("requests.") and not name.startswith("limits.")


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def _containers(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    return [c for c in spec.get(key) or [] if isinstance(c, Mapping)]


def _resources(container: Mapping[str, Any], which: str) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    for name, raw in ((container.get("resources") or {}).get(which) or {}).items():
        try:
            out[name] = parse_quantity(raw)
        except ValueError:
            continue
    return out


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    return podresources.pod_requests(pod)


def pod_limits(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    return podresources.pod_limits(pod)


def _compute_usage(requests: Mapping[str, Fraction], limits: Mapping[str, Fraction]) -> dict[str, Fraction]:
    """podComputeUsageHelper: one pod (or container) in quota resource names."""
    out: dict[str, Fraction] = {"pods": Fraction(1)}
    for base in ("cpu", "memory", "ephemeral-storage"):
        if base in requests:
            out[base] = requests[base]
            out[f"requests.{base}"] = requests[base]
        if base in limits:
            out[f"limits.{base}"] = limits[base]
    for name, amount in requests.items():
        if name.startswith("hugepages-"):
            out[name] = amount
            out[f"requests.{name}"] = amount
        elif is_extended(name):
            # Extended resources cannot be overcommitted, so only requests.<name> is tracked.
            out[f"requests.{name}"] = amount
    return out


def pod_is_charged(pod: Mapping[str, Any], now: float | None) -> bool:
    """Compute resources of a pod count until it is terminal or past its deletion grace."""
    if (pod.get("status") or {}).get("phase") in _TERMINAL:
        return False
    meta = pod.get("metadata") or {}
    deleted = meta.get("deletionTimestamp")
    grace = meta.get("deletionGracePeriodSeconds")
    if deleted and grace is not None and now is not None:
        try:
            deadline = datetime.fromisoformat(str(deleted).replace("Z", "+00:00")).timestamp() + grace
        except ValueError:
            return True
        if now > deadline:
            return False
    return True


def count_resource(resource_key: str) -> str:
    """'pods' -> 'count/pods', 'deployments.apps' -> 'count/deployments.apps'."""
    return f"count/{resource_key}"


def object_usage(resource_key: str, obj: Mapping[str, Any], now: float | None = None) -> dict[str, Fraction]:
    """What one object of ``resource_key`` ('pods', 'deployments.apps') costs."""
    out = {count_resource(resource_key): Fraction(1)}
    if resource_key == "pods":
        if pod_is_charged(obj, now):
            out.update(_compute_usage(pod_requests(obj), pod_limits(obj)))
        return out
    if resource_key in LEGACY_COUNT:
        out[resource_key] = Fraction(1)
    if resource_key == "services":
        stype = _spec(obj).get("type")
        if stype == "LoadBalancer":
            out["services.loadbalancers"] = Fraction(1)
        if stype in ("NodePort", "LoadBalancer"):
            out["services.nodeports"] = Fraction(
                sum(1 for p in _spec(obj).get("ports") or [] if isinstance(p, Mapping)))
    return out


def resource_charged_by(name: str) -> str | None:
    """The resource key whose objects a quota entry counts: 'requests.cpu' -> 'pods',
    'count/deployments.apps' -> 'deployments.apps', 'services' -> 'services'."""
    if name.startswith("count/"):
        return name[len("count/"):]
    if name in LEGACY_COUNT:
        return LEGACY_COUNT[name]
    if name in ("services.loadbalancers", "services.nodeports"):
        return "services"
    if name in POD_RESOURCES or name.startswith(("hugepages-", "requests.hugepages-")):
        return "pods"
    if name.startswith("requests.") and is_extended(name[len("requests."):]):
        return "pods"
    return None


def matching_resources(resource_key: str, hard_names: Iterable[str]) -> list[str]:
    """The entries of a quota's hard list that objects of ``resource_key`` are charged for."""
    return sorted(n for n in hard_names if resource_charged_by(n) == resource_key)


def quota_scope_selectors(rq: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = _spec(rq)
    out: list[dict[str, Any]] = [{"scopeName": s, "operator": "Exists"} for s in spec.get("scopes") or []]
    out.extend(dict(e) for e in ((spec.get("scopeSelector") or {}).get("matchExpressions") or []))
    return out


def is_best_effort(pod: Mapping[str, Any]) -> bool:
    spec = _spec(pod)
    for key in ("containers", "initContainers"):
        for c in _containers(spec, key):
            res = c.get("resources") or {}
            for which in ("requests", "limits"):
                if any(n in ("cpu", "memory") for n in res.get(which) or {}):
                    return False
    return True


def _pod_matches_scope(selector: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    scope = selector.get("scopeName")
    spec = _spec(pod)
    if scope in ("Terminating", "NotTerminating"):
        deadline = spec.get("activeDeadlineSeconds")
        terminating = isinstance(deadline, int) and deadline >= 0
        return terminating if scope == "Terminating" else not terminating
    if scope in ("BestEffort", "NotBestEffort"):
        best = is_best_effort(pod)
        return best if scope == "BestEffort" else not best
    if scope == "PriorityClass":
        name = spec.get("priorityClassName") or ""
        op = selector.get("operator")
        values = selector.get("values") or []
        if op == "Exists":
            return bool(name)
        if op == "DoesNotExist":
            return not name
        if op == "In":
            return bool(name) and name in values
        if op == "NotIn":
            return not name or name not in values
        return False
    if scope == "CrossNamespacePodAffinity":
        affinity = spec.get("affinity") or {}
        for kind in ("podAffinity", "podAntiAffinity"):
            terms = affinity.get(kind) or {}
            for term in terms.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
                if term.get("namespaces") or term.get("namespaceSelector") is not None:
                    return True
            for weighted in terms.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
                term = weighted.get("podAffinityTerm") or {}
                if term.get("namespaces") or term.get("namespaceSelector") is not None:
                    return True
        return False
    return False


def quota_matches(rq: Mapping[str, Any], resource_key: str, obj: Mapping[str, Any]) -> bool:
    """Whether ``rq`` limits ``obj`` at all: it names a resource the object is charged for
    and the object matches every one of its scopes (scoped quotas cover only pods)."""
    if not matching_resources(resource_key, (_spec(rq).get("hard") or {}).keys()):
        return False
    for selector in quota_scope_selectors(rq):
        if resource_key != "pods" or not _pod_matches_scope(selector, obj):
            return False
    return True


def missing_requirements(rq: Mapping[str, Any], pod: Mapping[str, Any]) -> str | None:
    """Kubernetes' pod Constraints: quota on cpu or memory requests/limits requires every
    container to state them. Returns the "must specify ..." text, or None."""
    required = _MUST_SPECIFY & set((_spec(rq).get("hard") or {}).keys())
    if not required:
        return None
    missing: dict[str, list[str]] = {}
    spec = _spec(pod)
    for key in ("containers", "initContainers"):
        for c in _containers(spec, key):
            have = _compute_usage(_resources(c, "requests"), _resources(c, "limits"))
            for name in sorted(required - set(have)):
                names = missing.setdefault(name, [])
                if c.get("name", "") not in names:
                    names.append(c.get("name", ""))
    if not missing:
        return None
    parts = [f"{name} for: {','.join(sorted(missing[name]))}" for name in sorted(missing)]
    return "must specify " + "; ".join(parts)


def parse_list(values: Mapping[str, Any] | None) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    for name, raw in (values or {}).items():
        try:
            out[name] = parse_quantity(raw)
        except ValueError:
            continue
    return out


def quota_usage(
    rq: Mapping[str, Any], objects: Mapping[str, Iterable[Mapping[str, Any]]], now: float | None = None
) -> dict[str, Fraction]:
    """status.used of a quota, from every object of its namespace (``objects``: resource key ->
    objects) that it covers; a resource nothing uses is 0."""
    hard = (_spec(rq).get("hard") or {}).keys()
    used = {name: Fraction(0) for name in hard}
    for resource_key in {resource_charged_by(n) for n in hard} - {None}:
        assert resource_key is not None
        names = matching_resources(resource_key, hard)
        for obj in objects.get(resource_key, ()):
            if not quota_matches(rq, resource_key, obj):
                continue
            cost = object_usage(resource_key, obj, now)
            for name in names:
                if name in cost:
                    used[name] += cost[name]
    return used


def needed_resources(rq: Mapping[str, Any]) -> set[str]:
    """Resource keys whose objects a quota counts."""
    return {r for r in (resource_charged_by(n) for n in (_spec(rq).get("hard") or {})) if r is not None}


def format_amount(name: str, amount: Fraction, like: Any = None) -> str:
    """A quota value as Kubernetes prints it; binary suffixes when the hard limit used them."""
    if isinstance(like, str) and like.strip().endswith("i"):
        return format_quantity(amount, "memory")
    return format_quantity(amount, "plain")


def format_list(values: Mapping[str, Fraction], like: Mapping[str, Any]) -> dict[str, str]:
    return {name: format_amount(name, amount, like.get(name)) for name, amount in sorted(values.items())}


def pretty(values: Mapping[str, Fraction], like: Mapping[str, Any]) -> str:
    """Kubernetes' prettyPrint: 'a=1,b=2', sorted by name."""
    return ",".join(f"{k}={v}" for k, v in format_list(values, like).items())
