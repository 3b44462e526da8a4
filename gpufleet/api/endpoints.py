"""Where a Service's traffic goes: the rules the Endpoints and the EndpointSlice controllers
share (Kubernetes' ``pkg/controller/util/endpoint`` and ``podutil``), on the typed models.

- A Service with a selector (and not of type ExternalName) has endpoints; one without is
  left to whoever writes them by hand.
- A pod is an endpoint when it has an IP and has not finished (Succeeded or Failed); one
  being deleted only where the caller includes terminating pods (the EndpointSlice
  controller always does, marking it ``terminating``; Endpoints only with
  ``publishNotReadyAddresses``).
- Each Service port is resolved per pod (``resolve_port``): a number targetPort as is, a
  named one through the pod's containerPort of that name and protocol (a pod without such
  a port is not an endpoint of that port).
- Host ports (gpufleet-specific): with the process runtime, pods share the host's network,
  so a container's port may be bound on another port of the host. The node agent records
  the real one in the pod annotation ``gpufleet.io/host-ports`` (JSON: the container port's
  name or number, as a string, to the host port, e.g. ``{"http": 31080, "9090": 31090}``);
  the endpoint then carries the host port.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from gpufleet.api.selectors import LabelSelector

log = logging.getLogger(__name__)

HOST_PORTS_ANNOTATION = "gpufleet.io/host-ports"
HEADLESS_LABEL = "service.kubernetes.io/headless"
ZONE_LABEL = "topology.kubernetes.io/zone"


def service_selector(svc: Any) -> LabelSelector | None:
    """The pods a Service sends traffic to; None when its endpoints are not managed."""
    spec = svc.spec
    if spec is None or not spec.selector or spec.type == "ExternalName":
        return None
    return LabelSelector.from_set(spec.selector)


def _meta(obj: Any, attr: str) -> Any:
    return getattr(obj.metadata, attr, None) if obj.metadata is not None else None


def host_ports(pod: Any) -> dict[str, int]:
    raw = (_meta(pod, "annotations") or {}).get(HOST_PORTS_ANNOTATION)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        log.warning("pod %s/%s: %s is not JSON: %r", _meta(pod, "namespace"), _meta(pod, "name"),
                    HOST_PORTS_ANNOTATION, raw)
        return {}
    out = {}
    for k, v in (data.items() if isinstance(data, dict) else ()):
        try:
            out[str(k)] = int(v)
        except (TypeError, ValueError):
            continue
    return out


def resolve_port(pod: Any, service_port: Any) -> int | None:
    """The port of ``pod`` a Service port leads to (Kubernetes' FindPort), host-port
    translated; None when the pod has no port of that name."""
    target = service_port.target_port if service_port.target_port not in (None, "", 0) else service_port.port
    protocol = service_port.protocol or "TCP"
    containers = (pod.spec.containers if pod.spec is not None else None) or []
    name: str | None = None
    number: int | None = None
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        number = int(target)
        for c in containers:
            for p in c.ports or []:
                if p.container_port == number and (p.protocol or "TCP") == protocol and p.name:
                    name = p.name
    else:
        for c in containers:
            for p in c.ports or []:
                if p.name == target and (p.protocol or "TCP") == protocol:
                    name, number = p.name, p.container_port
                    break
            if number is not None:
                break
        if number is None:
            return None
    host = host_ports(pod)
    if name and name in host:
        return host[name]
    return host.get(str(number), number)


def pod_ready(pod: Any) -> bool:
    """The pod's Ready condition is True."""
    for cond in (pod.status.conditions if pod.status is not None else None) or []:
        if cond.type == "Ready":
            return cond.status == "True"
    return False


def pod_terminating(pod: Any) -> bool:
    return _meta(pod, "deletion_timestamp") is not None


def is_endpoint(pod: Any, include_terminating: bool) -> bool:
    """Kubernetes' ShouldPodBeInEndpoints: the pod has an IP, has not finished, and is not
    being deleted unless ``include_terminating``."""
    status = pod.status
    if status is None or not status.pod_ip:
        return False
    if status.phase in ("Succeeded", "Failed"):
        return False
    return include_terminating or not pod_terminating(pod)


def endpoint_ports(svc: Any, pod: Any, always_name: bool = False) -> list[dict[str, Any]]:
    """The Service's ports as they reach ``pod`` (those the pod has), sorted by name, port
    and protocol. ``always_name``: write ``name`` even when empty (EndpointSlices do)."""
    ports: list[dict[str, Any]] = []
    for sp in svc.spec.ports or []:
        number = resolve_port(pod, sp)
        if number is None:
            continue
        port: dict[str, Any] = {"port": number, "protocol": sp.protocol or "TCP"}
        if sp.name or always_name:
            port["name"] = sp.name or ""
        if sp.app_protocol:
            port["appProtocol"] = sp.app_protocol
        ports.append(port)
    ports.sort(key=lambda p: (p.get("name", ""), p["port"], p["protocol"]))
    return ports


def is_headless(svc: Any) -> bool:
    return svc.spec.cluster_ip == "None"


def hostname_for(pod: Any, svc: Any) -> str | None:
    """The pod's spec.hostname when its subdomain is the Service (Kubernetes' ShouldSetHostname)."""
    spec = pod.spec
    if spec is not None and spec.hostname and spec.subdomain == _meta(svc, "name"):
        return spec.hostname
    return None


def target_ref(pod: Any) -> dict[str, Any]:
    return {"kind": "Pod", "namespace": _meta(pod, "namespace"), "name": _meta(pod, "name"),
            "uid": _meta(pod, "uid")}
