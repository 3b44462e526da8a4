"""Describers of Ingress and EndpointSlice, and of custom resources, in kubectl's words (its
describeIngressV1 with the backends' endpoints read from their EndpointSlices, as kubectl
1.32 does; describeEndpointSlice; the generic describer of kinds it has no describer for)."""

from __future__ import annotations

import json
from typing import Any

from gpufleet.api.registry import REGISTRY, ResourceType
from gpufleet.cli.commands.describe._blocks import _annotations, _list, _nested
from gpufleet.cli.describe_text import Doc, smart_label, when
from gpufleet.cli.output import Session, meta
from gpufleet.client.errors import ApiError

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def format_slice_endpoints(slices: list[dict[str, Any]], port_names: set[str] | None, limit: int = 3) -> str:
    """kubectl's formatEndpointSlices: "ip:port" of every endpoint for the named ports (all
    ports when None), the first three, then " + N more..."; "<none>" without slices."""
    if not slices:
        return "<none>"
    listed: list[str] = []
    count = 0
    for es in slices:
        endpoints = es.get("endpoints") or []
        ports = es.get("ports") or []
        if not ports:
            for ep in endpoints:
                if len(listed) < limit:
                    listed.append((ep.get("addresses") or [""])[0])
                count += 1
            continue
        for port in ports:
            if port_names is not None and (port.get("name") or "") not in port_names:
                continue
            for ep in endpoints:
                if len(listed) < limit:
                    address = (ep.get("addresses") or [""])[0]
                    host = f"[{address}]" if ":" in address else address
                    listed.append(f"{host}:{port.get('port')}")
                count += 1
    text = ",".join(listed)
    return f"{text} + {count - limit} more..." if count > limit else text


async def _backend(session: Session, ns: str, backend: dict[str, Any] | None) -> str:
    if not backend:
        return "<default>"
    service = backend.get("service")
    if not service:
        resource = backend.get("resource") or {}
        group = f"{resource['apiGroup']}/" if resource.get("apiGroup") else ""
        return f"APIGroup: {group}, Kind: {resource.get('kind', '')}, Name: {resource.get('name', '')}"
    port = service.get("port") or {}
    shown = f"{service.get('name', '')}:{port.get('name') or port.get('number', '')}"
    svc_rt = REGISTRY.by_key("services")
    assert svc_rt is not None
    try:
        resp = await session.client.raw_request("GET", svc_rt.path(ns, service.get("name", "")))
    except ApiError as e:
        return f"{shown} (<error: {e.message}>)"
    names = set()
    for sp in (json.loads(resp.body).get("spec") or {}).get("ports") or []:
        if (port.get("number") and sp.get("port") == port["number"]) or (port.get("name") and sp.get("name") == port["name"]):
            names.add(sp.get("name") or "")
    slices = await _list(session, "endpointslices.discovery.k8s.io", ns,
                         labelSelector=f"{SERVICE_NAME_LABEL}={service.get('name', '')}")
    return f"{shown} ({format_slice_endpoints(slices, names)})"


def _ingress_address(status: dict[str, Any]) -> str:
    found = []
    for ing in (status.get("loadBalancer") or {}).get("ingress") or []:
        value = ing.get("ip") or ing.get("hostname")
        if value and value not in found:
            found.append(value)
    return ",".join(found)


async def _describe_ingress(session: Session, rt: ResourceType, ing: dict[str, Any], doc: Doc) -> None:
    spec, m = ing.get("spec") or {}, meta(ing)
    ns = m.get("namespace", "")
    doc.kv(0, "Name", m.get("name", ""))
    doc.mapping(0, "Labels", m.get("labels"))
    doc.kv(0, "Namespace", ns)
    doc.kv(0, "Address", _ingress_address(ing.get("status") or {}))
    doc.kv(0, "Ingress Class", spec.get("ingressClassName") or "<none>")
    doc.kv(0, "Default backend", await _backend(session, ns, spec.get("defaultBackend")))
    tls = spec.get("tls") or []
    if tls:
        doc.title(0, "TLS:")
        for t in tls:
            hosts = ",".join(t.get("hosts") or [])
            if t.get("secretName"):
                doc.title(1, f"{t['secretName']} terminates {hosts}")
            else:
                doc.title(1, f"SNI routes {hosts}")
    rules = spec.get("rules") or []
    doc.title(0, "Rules:")
    rows: list[list[str]] = []
    if not rules and spec.get("defaultBackend"):
        rows.append(["*", "*", await _backend(session, ns, spec["defaultBackend"])])
    for rule in rules:
        rows.append([rule.get("host") or "*", "", ""])
        for path in (rule.get("http") or {}).get("paths") or []:
            rows.append(["", path.get("path") or "", await _backend(session, ns, path.get("backend"))])
    doc.table(1, ["Host", "Path", "Backends"], rows)
    _annotations(doc, 0, m.get("annotations"))


async def _describe_endpoint_slice(session: Session, rt: ResourceType, es: dict[str, Any], doc: Doc) -> None:
    m = meta(es)
    doc.kv(0, "Name", m.get("name", ""))
    doc.kv(0, "Namespace", m.get("namespace", ""))
    doc.mapping(0, "Labels", m.get("labels"))
    _annotations(doc, 0, m.get("annotations"))
    doc.kv(0, "AddressType", es.get("addressType", ""))
    ports = es.get("ports") or []
    doc.title(0, "Ports:")
    doc.table(1, ["Name", "Port", "Protocol"],
              [[p.get("name") or "<unset>", str(p.get("port", "<unset>")), p.get("protocol") or "TCP"] for p in ports])
    endpoints = es.get("endpoints") or []
    if not endpoints:
        doc.kv(0, "Endpoints", "<none>")
        return
    doc.title(0, "Endpoints:")
    for ep in endpoints:
        doc.kv(1, "- Addresses", ",".join(ep.get("addresses") or []))
        conditions = ep.get("conditions") or {}
        doc.title(2, "Conditions:")
        for key in ("ready", "serving", "terminating"):
            value = conditions.get(key)
            doc.kv(3, key.capitalize(), "<unset>" if value is None else str(value).lower())
        doc.kv(2, "Hostname", ep.get("hostname") or "<unset>")
        ref = ep.get("targetRef")
        if ref:
            doc.kv(2, "TargetRef", f"{ref.get('kind', '')}/{ref.get('name', '')}")
        doc.kv(2, "NodeName", ep.get("nodeName") or "<unset>")
        doc.kv(2, "Zone", ep.get("zone") or "<unset>")


_SHOWN_META = ("creationTimestamp", "deletionTimestamp", "finalizers", "generation", "ownerReferences",
               "resourceVersion", "uid")


def _sorted(value: Any) -> Any:
    """Maps with their keys in order, all the way down (kubectl's generic describer sorts them)."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


async def _describe_custom(session: Session, rt: ResourceType, obj: dict[str, Any], doc: Doc) -> None:
    """kubectl's generic describer: names and labels, the API version and kind, the rest of
    the metadata, then every other field (spec, status, ...) written out as nested fields,
    keys in order."""
    m = meta(obj)
    doc.kv(0, "Name", m.get("name", ""))
    if rt.namespaced:
        doc.kv(0, "Namespace", m.get("namespace", ""))
    doc.mapping(0, "Labels", m.get("labels"))
    _annotations(doc, 0, m.get("annotations"))
    doc.kv(0, "API Version", obj.get("apiVersion") or rt.api_version)
    doc.kv(0, "Kind", obj.get("kind") or rt.kind)
    shown = [k for k in _SHOWN_META if m.get(k) is not None]
    if shown:
        doc.title(0, "Metadata:")
    for key in shown:
        label = "UID" if key == "uid" else smart_label(key)
        value = when(m[key]) if key.endswith("Timestamp") else _sorted(m[key])
        _nested(doc, 1, label, value, raw_key=key)
    for key in sorted(obj):
        if key in ("apiVersion", "kind", "metadata"):
            continue
        _nested(doc, 0, smart_label(key), _sorted(obj[key]), raw_key=key)


def is_custom(rt: ResourceType) -> bool:
    """A kind the server was taught at run time (a CRD), not one of gpufleet's own."""
    return REGISTRY.by_api_version_kind(rt.api_version, rt.kind) is None
