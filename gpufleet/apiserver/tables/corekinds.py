"""Printers for the remaining core kinds: Namespace, Service, Endpoints, Event, quotas, limit
ranges, ConfigMap, Secret and ServiceAccount.
"""

from __future__ import annotations

from typing import Any

from gpufleet.apiserver.tables.core import (
    AGE_COLUMN,
    NAME_COLUMN,
    Column,
    Obj,
    _format_labels,
    _int,
    _meta,
    _name,
    _quantity,
    _spec,
    _status,
    _ts,
    age_cell,
    since,
)
from gpufleet.utils.clock import rfc3339

# --- core kinds ----------------------------------------------------------------------------


def _namespace_row(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), _status(obj).get("phase", ""), age_cell(obj, now)]


_NAMESPACE_COLUMNS = (NAME_COLUMN, Column("Status", description="The status of the namespace"), AGE_COLUMN)


def _service_external_ip(spec: dict[str, Any], status: dict[str, Any]) -> str:
    svc_type = spec.get("type") or "ClusterIP"
    external = spec.get("externalIPs") or []
    if svc_type in ("ClusterIP", "NodePort"):
        return ",".join(external) if external else "<none>"
    if svc_type == "LoadBalancer":
        ingress = set()
        for ing in (status.get("loadBalancer") or {}).get("ingress") or []:
            if ing.get("ip"):
                ingress.add(ing["ip"])
            elif ing.get("hostname"):
                ingress.add(ing["hostname"])
        lb = sorted(ingress)
        if external:
            return ",".join([*lb, *external])
        return ",".join(lb) if lb else "<pending>"
    if svc_type == "ExternalName":
        return spec.get("externalName", "")
    return "<unknown>"


def service_ports(ports: list[dict[str, Any]] | None) -> str:
    pieces = []
    for p in ports or []:
        proto = p.get("protocol") or "TCP"
        if _int(p.get("nodePort")) > 0:
            pieces.append(f"{p.get('port')}:{p.get('nodePort')}/{proto}")
        else:
            pieces.append(f"{p.get('port')}/{proto}")
    return ",".join(pieces) or "<none>"


def _service_row(obj: Obj, now: float) -> list[Any]:
    spec = _spec(obj)
    cluster_ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    return [
        _name(obj),
        spec.get("type") or "ClusterIP",
        cluster_ips[0] if cluster_ips else "<none>",
        _service_external_ip(spec, _status(obj)),
        service_ports(spec.get("ports")),
        age_cell(obj, now),
        _format_labels(spec.get("selector")),
    ]


_SERVICE_COLUMNS = (
    NAME_COLUMN,
    Column("Type", description="How the Service is exposed."),
    Column("Cluster-IP", description="The IP address of the service inside the cluster."),
    Column("External-IP", description="Addresses the service is reachable on from outside the cluster."),
    Column("Port(s)", description="The list of ports that are exposed by this service."),
    AGE_COLUMN,
    Column(
        "Selector",
        priority=1,
        description="Route service traffic to pods with label keys and values matching this selector.",
    ),
)


def format_endpoints(subsets: list[dict[str, Any]] | None) -> str:
    """kube-apiserver's formatEndpoints: the first three host:port pairs, then " + N more..."."""
    if not subsets:
        return "<none>"
    listed: list[str] = []
    limit = 3
    more = False
    count = 0
    for ss in subsets:
        addresses = ss.get("addresses") or []
        ports = ss.get("ports") or []
        if not ports:
            count += len(addresses)
            for a in addresses:
                if len(listed) == limit:
                    more = True
                    break
                listed.append(a.get("ip", ""))
            continue
        for port in ports:
            count += len(addresses)
            for a in addresses:
                if len(listed) == limit:
                    more = True
                    break
                ip = a.get("ip", "")
                host = f"[{ip}]" if ":" in ip else ip
                listed.append(f"{host}:{port.get('port')}")
    text = ",".join(listed)
    return f"{text} + {count - limit} more..." if more else text


def _endpoints_row(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), format_endpoints(obj.get("subsets")), age_cell(obj, now)]


_ENDPOINTS_COLUMNS = (
    NAME_COLUMN,
    Column("Endpoints", description="The set of all endpoints is the union of all subsets."),
    AGE_COLUMN,
)


def _event_source(obj: Obj) -> str:
    source = obj.get("source") or {}
    component = (
        source.get("component") or obj.get("reportingComponent") or obj.get("reportingController") or ""
    )
    instance = source.get("host") or obj.get("reportingInstance") or ""
    return f"{component}, {instance}" if instance else component


def _event_row(obj: Obj, now: float) -> list[Any]:
    first = since(obj.get("firstTimestamp"), now)
    if not obj.get("firstTimestamp"):
        first = since(obj.get("eventTime"), now)
    last = since(obj.get("lastTimestamp"), now) if obj.get("lastTimestamp") else first
    count = _int(obj.get("count"))
    series = obj.get("series")
    if series:
        last = since(series.get("lastObservedTime"), now)
        count = _int(series.get("count"))
    elif count == 0:
        count = 1
    involved = obj.get("involvedObject") or obj.get("regarding") or {}
    kind = (involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    return [
        last,
        obj.get("type", ""),
        obj.get("reason", ""),
        target,
        involved.get("fieldPath", ""),
        _event_source(obj),
        (obj.get("message") or obj.get("note") or "").strip(),
        first,
        count,
        _name(obj),
    ]


_EVENT_COLUMNS = (
    Column(
        "Last Seen", description="The time at which the most recent occurrence of this event was recorded."
    ),
    Column("Type", description="Type of this event (Normal, Warning)."),
    Column(
        "Reason",
        description="A short, machine understandable string that gives the reason for the transition.",
    ),
    Column("Object", description="The object that this event is about."),
    Column("Subobject", priority=1, description="The field of the object this event is about, if any."),
    Column("Source", priority=1, description="The component reporting this event."),
    Column("Message", description="A human-readable description of the status of this operation."),
    Column("First Seen", priority=1, description="The time at which the event was first recorded."),
    Column("Count", type="integer", priority=1, description="The number of times this event has occurred."),
    Column("Name", format="name", priority=1, description=NAME_COLUMN.description),
)


def _resource_quota_row(obj: Obj, now: float) -> list[Any]:
    status = _status(obj)
    hard = status.get("hard") or _spec(obj).get("hard") or {}
    used = status.get("used") or {}
    requests, limits = [], []
    for resource in sorted(hard):
        piece = f"{resource}: {_quantity(used.get(resource))}/{_quantity(hard[resource])}"
        parts = resource.split(".")
        (limits if len(parts) > 1 and parts[0] == "limits" else requests).append(piece)
    return [_name(obj), ", ".join(requests), ", ".join(limits), age_cell(obj, now)]


_RESOURCE_QUOTA_COLUMNS = (
    NAME_COLUMN,
    Column(
        "Request",
        description="Request represents a minimum amount of cpu/memory that a container may consume.",
    ),
    Column(
        "Limit",
        description="Limits control the maximum amount of cpu/memory that a container may use independent of "
        "contention on the node.",
    ),
    AGE_COLUMN,
)


def _limit_range_row(obj: Obj, now: float) -> list[Any]:
    t = _ts(_meta(obj).get("creationTimestamp"))
    return [_name(obj), rfc3339(t) if t is not None else ""]


_LIMIT_RANGE_COLUMNS = (
    NAME_COLUMN,
    Column("Created At", type="date", description=AGE_COLUMN.description),
)


def _config_map_row(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), len(obj.get("data") or {}) + len(obj.get("binaryData") or {}), age_cell(obj, now)]


_CONFIG_MAP_COLUMNS = (
    NAME_COLUMN,
    Column("Data", type="integer", description="Number of data keys."),
    AGE_COLUMN,
)


def _secret_row(obj: Obj, now: float) -> list[Any]:
    # stringData is merged into data on write; count it here too in case a writer kept it.
    keys = set(obj.get("data") or {}) | set(obj.get("stringData") or {})
    return [_name(obj), obj.get("type") or "Opaque", len(keys), age_cell(obj, now)]


_SECRET_COLUMNS = (
    NAME_COLUMN,
    Column("Type", description="Used to facilitate programmatic handling of secret data."),
    Column("Data", type="integer", description="Number of data keys."),
    AGE_COLUMN,
)


def _service_account_row(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), len(obj.get("secrets") or []), age_cell(obj, now)]


_SERVICE_ACCOUNT_COLUMNS = (
    NAME_COLUMN,
    Column("Secrets", type="integer", description="Number of secrets this service account may use."),
    AGE_COLUMN,
)
