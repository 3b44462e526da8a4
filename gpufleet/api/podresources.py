"""A pod's resource requests and limits, computed once, the way Kubernetes does, for every
component that needs them: the scheduler, quota, the queue, the node agent, the table
printer, `describe node` and the PyTorchJob controller.

Kubernetes' rule (``k8s.io/component-helpers/resource`` PodRequests / PodLimits, the
sidecar KEP 753), for each resource:

- regular containers run together, so their requests add up;
- init containers run one at a time before them, but a restartable init container
  (``restartPolicy: Always``, a "sidecar") keeps running: it adds to the regular
  containers, and each later init container runs alongside the sidecars started before it;
- the pod needs the larger of the two: ``max(sum(containers) + sum(sidecars),
  max over init containers i of (init_i + sum(sidecars before i)))``;
- pod-level ``spec.resources`` (cpu, memory) replace that aggregate for what they name;
- ``spec.overhead`` (what the runtime itself costs) is added to every request, and to the
  limits that are set and non-zero.

A container's requests are read as the API server stores them: a resource with a limit and
no request requests its limit (Kubernetes' SetDefaults_Pod), so a pod template or a pod that
skipped admission counts the same as the stored pod.

Amounts are exact ``Fraction``s in base units (cores, bytes, devices); callers round once, on
the pod's total, as Kubernetes does (``MilliValue()`` for cpu, ``Value()`` otherwise).

Typed models (``k8s.Pod``, ``k8s.PodSpec``, ``k8s.PodTemplateSpec``) are read directly; a
pod, template or spec as wire JSON goes through a small adapter to the same rule. Values that
do not parse as quantities are skipped (validation rejects them before they are stored).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from gpufleet.api.gpu import GPU_RESOURCE
from gpufleet.api.quantity import parse_quantity

if TYPE_CHECKING:
    from gpufleet.api import k8s

    PodLike = k8s.Pod | k8s.PodSpec | k8s.PodTemplateSpec | Mapping[str, Any]

Amounts = dict[str, Fraction]

CPU = "cpu"
MEMORY = "memory"
# Resources that pod-level spec.resources may set (IsSupportedPodLevelResource).
POD_LEVEL_RESOURCES = frozenset({CPU, MEMORY})
RESTART_ALWAYS = "Always"


@functools.lru_cache(maxsize=16384, typed=True)
def _parse(value: Any) -> Fraction | None:
    try:
        return parse_quantity(value)
    except (ValueError, TypeError):
        return None


def _amounts(values: Mapping[str, Any] | None) -> Amounts:
    out: Amounts = {}
    for name, raw in (values or {}).items():
        try:
            q = _parse(raw)
        except TypeError:  # unhashable junk from the wire
            q = None
        if q is not None:
            out[name] = q
    return out


# -- one container --------------------------------------------------------------------------


class _Container:
    """What the rule reads of a container: its requests (defaulted from limits), its limits,
    and whether it is a sidecar."""

    __slots__ = ("limits", "requests", "sidecar")

    def __init__(self, requests: Mapping[str, Any] | None, limits: Mapping[str, Any] | None,
                 restart_policy: Any) -> None:
        self.limits = _amounts(limits)
        self.requests = {**self.limits, **_amounts(requests)} if self.limits else _amounts(requests)
        self.sidecar = restart_policy == RESTART_ALWAYS


def _models() -> Any:
    """The typed models' module when it is loaded, else None: this module reads both typed
    models and JSON dicts, and a process that never loaded the models (a node agent) cannot
    hold one, so it need not load them (about 20 MiB) to tell them apart."""
    return sys.modules.get("gpufleet.api.k8s")


def _of_model(c: k8s.Container) -> _Container:
    r = c.resources
    return _Container(r.requests if r else None, r.limits if r else None, c.restart_policy)


def _of_wire(c: Any) -> _Container:
    if not isinstance(c, Mapping):
        return _Container(None, None, None)
    r = c.get("resources") or {}
    if not isinstance(r, Mapping):
        r = {}
    return _Container(r.get("requests"), r.get("limits"), c.get("restartPolicy"))


def container_requests(container: k8s.Container | Mapping[str, Any]) -> Amounts:
    """One container's requests, a limit standing in for a missing request."""
    k8s = _models()
    typed = k8s is not None and isinstance(container, k8s.Container)
    return (_of_model(container) if typed else _of_wire(container)).requests


def container_gpu_request(container: k8s.Container | Mapping[str, Any]) -> int:
    """The GPUs one container asks for (``nvidia.com/gpu``, its request or else its limit)."""
    return max(math.ceil(container_requests(container).get(GPU_RESOURCE, Fraction(0))), 0)


# -- the pod --------------------------------------------------------------------------------


class _Pod:
    __slots__ = ("containers", "init_containers", "overhead", "pod_limits", "pod_requests")

    def __init__(self, containers: Iterable[_Container], init_containers: Iterable[_Container],
                 pod_requests: Mapping[str, Any] | None, pod_limits: Mapping[str, Any] | None,
                 overhead: Mapping[str, Any] | None) -> None:
        self.containers = list(containers)
        self.init_containers = list(init_containers)
        self.pod_requests = {k: v for k, v in _amounts(pod_requests).items() if k in POD_LEVEL_RESOURCES}
        self.pod_limits = {k: v for k, v in _amounts(pod_limits).items() if k in POD_LEVEL_RESOURCES}
        self.overhead = _amounts(overhead)


def _pod(obj: PodLike) -> _Pod:
    k8s = _models()  # None: no typed model can exist here, so obj is a dict (or no pod)
    if k8s is not None and isinstance(obj, k8s.Pod | k8s.PodTemplateSpec):
        spec: Any = obj.spec
        if spec is None:
            return _Pod((), (), None, None, None)
        obj = spec
    if k8s is not None and isinstance(obj, k8s.PodSpec):
        r = obj.resources
        return _Pod(map(_of_model, obj.containers or ()), map(_of_model, obj.init_containers or ()),
                    r.requests if r else None, r.limits if r else None, obj.overhead)
    if not isinstance(obj, Mapping):
        raise TypeError(f"not a pod, pod template or pod spec: {type(obj).__name__}")
    # A pod or template ({"spec": ...}) or a bare spec ({"containers": ...}).
    wire = obj if "containers" in obj or "spec" not in obj else (obj.get("spec") or {})
    if not isinstance(wire, Mapping):
        return _Pod((), (), None, None, None)
    r = wire.get("resources") or {}
    if not isinstance(r, Mapping):
        r = {}
    overhead = wire.get("overhead")
    return _Pod(map(_of_wire, wire.get("containers") or ()), map(_of_wire, wire.get("initContainers") or ()),
                r.get("requests"), r.get("limits"), overhead if isinstance(overhead, Mapping) else None)


def _add_into(total: Amounts, more: Mapping[str, Fraction]) -> None:
    for name, amount in more.items():
        have = total.get(name)
        total[name] = amount if have is None else have + amount


def _max_into(total: Amounts, other: Mapping[str, Fraction]) -> None:
    for name, amount in other.items():
        if name not in total or amount > total[name]:
            total[name] = amount


def _aggregate(pod: _Pod, which: str, non_missing: Mapping[str, Fraction] | None) -> Amounts:
    """AggregateContainerRequests / AggregateContainerLimits."""

    def of(c: _Container) -> Mapping[str, Fraction]:
        values: Mapping[str, Fraction] = c.requests if which == "requests" else c.limits
        if non_missing:
            values = {**{k: v for k, v in non_missing.items() if k not in values}, **values}
        return values

    total: Amounts = {}
    for c in pod.containers:
        _add_into(total, of(c))
    sidecars: Amounts = {}
    init_peak: Amounts = {}
    for c in pod.init_containers:
        values = of(c)
        if c.sidecar:
            _add_into(total, values)
            _add_into(sidecars, values)
            running = sidecars
        else:
            running = dict(values)
            _add_into(running, sidecars)
        _max_into(init_peak, running)
    _max_into(total, init_peak)
    return total


def _requests(p: _Pod, non_missing: Mapping[str, Fraction] | None, overhead: bool = True) -> Amounts:
    total = _aggregate(p, "requests", non_missing)
    total.update(p.pod_requests)
    if overhead:
        _add_into(total, p.overhead)
    return total


def pod_requests(pod: PodLike, *, non_missing: Mapping[str, Fraction] | None = None,
                 exclude_overhead: bool = False) -> Amounts:
    """Kubernetes' ``resource.PodRequests``: the pod's effective request of each resource.

    ``non_missing`` counts, for each container that requests none of a resource, that much of
    it (the scheduler scores request-less pods as 100m cpu and 200Mi memory this way);
    ``exclude_overhead`` leaves ``spec.overhead`` out (the LimitRanger's view)."""
    return _requests(_pod(pod), non_missing, not exclude_overhead)


def pod_requests_and_non_missing(pod: PodLike, non_missing: Mapping[str, Fraction]) -> tuple[Amounts, Amounts]:
    """``pod_requests(pod)`` and ``pod_requests(pod, non_missing=...)`` from one reading of
    the pod, as the scheduler needs both for every pod it caches."""
    p = _pod(pod)
    exact = _requests(p, None)
    if all(name in c.requests for c in (*p.containers, *p.init_containers) for name in non_missing):
        return exact, exact
    return exact, _requests(p, non_missing)


def pod_limits(pod: PodLike, *, exclude_overhead: bool = False) -> Amounts:
    """Kubernetes' ``resource.PodLimits``: the pod's effective limit of each resource that
    has one; overhead is added only to limits that are set and non-zero."""
    p = _pod(pod)
    total = _aggregate(p, "limits", None)
    total.update(p.pod_limits)
    for name, amount in () if exclude_overhead else p.overhead.items():
        if total.get(name):
            total[name] += amount
    return total


def pod_gpu_request(pod: PodLike) -> int:
    """The GPUs (``nvidia.com/gpu``) the pod holds while it runs: its effective request of
    them, by the same rule (sidecars add up, init containers run alongside the sidecars
    started before them)."""
    return max(math.ceil(pod_requests(pod).get(GPU_RESOURCE, Fraction(0))), 0)
