"""Describers of cluster and namespace objects: Service, Node, Namespace, ResourceQuota,
LimitRange, ConfigMap."""

from __future__ import annotations

import json
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from gpufleet.api import podresources
from gpufleet.api.gpu import GPU_LABEL_PREFIX, GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufleet.api.registry import REGISTRY, ResourceType
from gpufleet.cli.commands.describe._blocks import (
    _annotations,
    _header,
    _list,
    _resources_block,
)
from gpufleet.cli.describe_text import (
    Doc,
    format_quantity,
    parse_quantity,
    percent,
    smart_label,
    when,
)
from gpufleet.cli.output import (
    Session,
    age,
    cell_text,
    meta,
)
from gpufleet.client.errors import ApiError


async def _describe_service(session: Session, rt: ResourceType, svc: dict[str, Any], doc: Doc) -> None:
    spec = svc.get("spec") or {}
    doc.kv(0, "Name", meta(svc).get("name", ""))
    doc.kv(0, "Namespace", meta(svc).get("namespace", ""))
    doc.mapping(0, "Labels", meta(svc).get("labels"))
    _annotations(doc, 0, meta(svc).get("annotations"))
    doc.kv(0, "Selector", ",".join(f"{k}={v}" for k, v in sorted((spec.get("selector") or {}).items()))
           or "<none>")
    doc.kv(0, "Type", spec.get("type") or "ClusterIP")
    doc.kv(0, "IP", spec.get("clusterIP") or "<none>")
    endpoints = await _endpoints(session, svc)
    for p in spec.get("ports") or []:
        doc.kv(0, "Port", f"{p.get('name') or '<unset>'}  {p.get('port', '')}/{p.get('protocol') or 'TCP'}")
        target = p.get("targetPort", p.get("port", ""))
        doc.kv(0, "TargetPort", f"{target}/{p.get('protocol') or 'TCP'}")
        if p.get("nodePort"):
            doc.kv(0, "NodePort", f"{p.get('name') or '<unset>'}  {p['nodePort']}/{p.get('protocol') or 'TCP'}")
        doc.kv(0, "Endpoints", endpoints.get(p.get("name") or "", "") or "<none>")
    doc.kv(0, "Session Affinity", spec.get("sessionAffinity") or "None")


async def _endpoints(session: Session, svc: dict[str, Any]) -> dict[str, str]:
    """Port name -> 'ip:port,ip:port' from the service's Endpoints object."""
    rt = REGISTRY.by_key("endpoints")
    if rt is None:
        return {}
    try:
        resp = await session.client.raw_request("GET", rt.path(meta(svc).get("namespace"), meta(svc).get("name")))
    except ApiError:
        return {}
    out: dict[str, list[str]] = {}
    for subset in json.loads(resp.body).get("subsets") or []:
        ips = [a.get("ip", "") for a in subset.get("addresses") or []]
        for port in subset.get("ports") or []:
            out.setdefault(port.get("name") or "", []).extend(f"{ip}:{port.get('port', '')}" for ip in ips)
    return {k: ",".join(v) for k, v in out.items()}


_NODE_STATUS_FIELDS = {"addresses", "allocatable", "capacity", "conditions", "config", "daemonEndpoints",
                       "declaredFeatures", "features", "images", "nodeInfo", "phase", "runtimeHandlers",
                       "volumesAttached", "volumesInUse"}


async def _describe_node(session: Session, rt: ResourceType, node: dict[str, Any], doc: Doc) -> None:
    m, spec, status = meta(node), node.get("spec") or {}, node.get("status") or {}
    labels = m.get("labels") or {}
    doc.kv(0, "Name", m.get("name", ""))
    roles = sorted(k.partition("/")[2] for k in labels if k.startswith("node-role.kubernetes.io/"))
    doc.kv(0, "Roles", ",".join(r for r in roles if r) or "<none>")
    doc.mapping(0, "Labels", labels)
    _annotations(doc, 0, m.get("annotations"))
    doc.kv(0, "CreationTimestamp", when(m.get("creationTimestamp")))
    taints = [f"{t.get('key', '')}{'=' + t['value'] if t.get('value') else ''}:{t.get('effect', '')}"
              for t in spec.get("taints") or []]
    doc.lines(0, "Taints", taints)
    doc.kv(0, "Unschedulable", "true" if spec.get("unschedulable") else "false")
    conditions = status.get("conditions") or []
    if conditions:
        doc.title(0, "Conditions:")
        doc.table(1, ["Type", "Status", "LastHeartbeatTime", "LastTransitionTime", "Reason", "Message"], [
            [c.get("type", ""), c.get("status", ""), when(c.get("lastHeartbeatTime")),
             when(c.get("lastTransitionTime")), c.get("reason") or "", c.get("message") or ""]
            for c in conditions])
    addresses = status.get("addresses") or []
    if addresses:
        doc.title(0, "Addresses:")
        for a in addresses:
            doc.kv(1, a.get("type", ""), a.get("address", ""))
    _resources_block(doc, 0, "Capacity", status.get("capacity"))
    _resources_block(doc, 0, "Allocatable", status.get("allocatable"))
    _gpus(doc, node)
    _gpu_health(doc, node)
    info = status.get("nodeInfo") or {}
    if info:
        doc.title(0, "System Info:")
        for k, v in info.items():
            if isinstance(v, str | int | float):
                doc.kv(1, smart_label(k), v)
    await _node_pods(session, doc, node)


def _gpus(doc: Doc, node: dict[str, Any]) -> None:
    """What the node reports about its GPUs: the product labels, the counts, and any device
    list it publishes in its status (one row per device)."""
    labels = meta(node).get("labels") or {}
    status = node.get("status") or {}
    capacity = (status.get("capacity") or {}).get(GPU_RESOURCE)
    gpu_labels = {k: v for k, v in labels.items() if k.startswith(GPU_LABEL_PREFIX)}
    devices = {k: v for k, v in status.items()
               if k not in _NODE_STATUS_FIELDS and isinstance(v, list) and v and all(isinstance(d, dict) for d in v)}
    if capacity is None and not gpu_labels and not devices:
        return
    doc.title(0, "GPUs:")
    if capacity is not None:
        doc.kv(1, "Count", capacity)
        doc.kv(1, "Allocatable", (status.get("allocatable") or {}).get(GPU_RESOURCE, "0"))
    if GPU_PRODUCT_LABEL in gpu_labels:
        doc.kv(1, "Product", gpu_labels[GPU_PRODUCT_LABEL])
    if GPU_MEMORY_LABEL in gpu_labels:
        memory = gpu_labels[GPU_MEMORY_LABEL]
        # GPU feature discovery publishes the per-device memory in MiB.
        doc.kv(1, "Memory", f"{memory} MiB" if memory.isdigit() else memory)
    for key, items in devices.items():
        columns: list[str] = []
        for d in items:
            columns += [k for k in d if k not in columns]
        doc.title(1, f"{smart_label(key)}:")
        doc.table(2, [smart_label(c) for c in columns],
                  [[cell_text(d.get(c)) if c in d else "" for c in columns] for d in items])


def _gpu_health(doc: Doc, node: dict[str, Any]) -> None:
    """Each GPU's state and its recent history, from the agent's gpufleet.io/gpu-health
    annotation (docs/gpu-health.md)."""
    from gpufleet.api.gpuhealth import GPU_CORDON_ANNOTATION, GPU_HEALTH_ANNOTATION, parse_health_annotation

    annotations = meta(node).get("annotations") or {}
    record = parse_health_annotation(annotations.get(GPU_HEALTH_ANNOTATION))
    if not record:
        return
    doc.title(0, "GPU Health:")
    rows = []
    for index in sorted(record, key=lambda k: int(k) if k.isdigit() else 1 << 30):
        entry = record[index] if isinstance(record[index], dict) else {}
        xids = ",".join(f"{k}x{v}" for k, v in (entry.get("xids") or {}).items())
        rows.append([index, entry.get("uuid", ""), entry.get("state", ""), entry.get("reason") or "",
                     xids or "<none>"])
    doc.table(1, ["GPU", "UUID", "State", "Reason", "XIDs"], rows)
    if annotations.get(GPU_CORDON_ANNOTATION):
        doc.kv(1, "Cordoned", annotations[GPU_CORDON_ANNOTATION])
    history = [(h.get("time", ""), index, h.get("event", ""), h.get("message", ""))
               for index, entry in record.items() if isinstance(entry, dict)
               for h in entry.get("history") or [] if isinstance(h, dict)]
    if history:
        doc.title(1, "History:")
        doc.table(2, ["Time", "GPU", "Event", "Message"], [list(h) for h in sorted(history)])


async def _node_pods(session: Session, doc: Doc, node: dict[str, Any]) -> None:
    name = meta(node).get("name", "")
    pods = [p for p in await _list(session, "pods", None, fieldSelector=f"spec.nodeName={name}")
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    allocatable = {k: parse_quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
    doc.kv(0, "Non-terminated Pods", f"({len(pods)} in total)")
    totals_req: dict[str, Fraction] = {}
    totals_lim: dict[str, Fraction] = {}
    rows = []
    for p in pods:
        req, lim = pod_resources(p)
        for k, v in req.items():
            totals_req[k] = totals_req.get(k, Fraction(0)) + v
        for k, v in lim.items():
            totals_lim[k] = totals_lim.get(k, Fraction(0)) + v

        def show(values: dict[str, Fraction], r: str) -> str:
            v = values.get(r, Fraction(0))
            return f"{format_quantity(r, v)} ({percent(v, allocatable.get(r))})"

        rows.append([meta(p).get("namespace", ""), meta(p).get("name", ""), show(req, "cpu"), show(lim, "cpu"),
                     show(req, "memory"), show(lim, "memory"), format_quantity(GPU_RESOURCE, req.get(GPU_RESOURCE, Fraction(0))),
                     age(meta(p).get("creationTimestamp"))])
    if rows:
        doc.table(1, ["Namespace", "Name", "CPU Requests", "CPU Limits", "Memory Requests", "Memory Limits",
                      "GPUs", "Age"], rows)
    doc.title(0, "Allocated resources:")
    doc.title(1, "(Total limits may be over 100 percent, i.e., overcommitted.)")
    resources = ["cpu", "memory"] + sorted((set(totals_req) | set(totals_lim) | {GPU_RESOURCE if GPU_RESOURCE in allocatable else ""})
                                           - {"cpu", "memory", ""})
    doc.table(1, ["Resource", "Requests", "Limits"], [
        [r, f"{format_quantity(r, totals_req.get(r, Fraction(0)))} "
            f"({percent(totals_req.get(r, Fraction(0)), allocatable.get(r))})",
         f"{format_quantity(r, totals_lim.get(r, Fraction(0)))} "
         f"({percent(totals_lim.get(r, Fraction(0)), allocatable.get(r))})"]
        for r in resources])


def pod_resources(pod: Mapping[str, Any]) -> tuple[dict[str, Fraction], dict[str, Fraction]]:
    """A pod's effective requests and limits, as `kubectl describe node` counts them
    (Kubernetes' PodRequests and PodLimits: sidecars, init containers and overhead)."""
    return podresources.pod_requests(pod), podresources.pod_limits(pod)


async def _describe_namespace(session: Session, rt: ResourceType, ns: dict[str, Any], doc: Doc) -> None:
    doc.kv(0, "Name", meta(ns).get("name", ""))
    doc.mapping(0, "Labels", meta(ns).get("labels"))
    _annotations(doc, 0, meta(ns).get("annotations"))
    doc.kv(0, "Status", (ns.get("status") or {}).get("phase") or "Active")
    quotas = await _list(session, "resourcequotas", meta(ns).get("name"))
    if not quotas:
        doc.blank()
        doc.title(0, "No resource quota.")
    for q in quotas:
        doc.blank()
        doc.kv(0, "Resource Quota", meta(q).get("name", ""))
        hard, used = (q.get("status") or {}).get("hard") or (q.get("spec") or {}).get("hard") or {}, \
            (q.get("status") or {}).get("used") or {}
        doc.table(1, ["Resource", "Used", "Hard"], [[k, str(used.get(k, "0")), str(v)] for k, v in sorted(hard.items())])


_SCOPE_HELP = {
    "Terminating": "Matches all pods that have an active deadline. These pods have a limited lifespan on a node "
                   "before being actively terminated by the system.",
    "NotTerminating": "Matches all pods that do not have an active deadline. These pods usually include long "
                      "running pods whose container command is not expected to terminate.",
    "BestEffort": "Matches all pods that do not have resource requirements set. These pods have a best effort "
                  "quality of service.",
    "NotBestEffort": "Matches all pods that have at least one resource requirement set. These pods have a "
                     "burstable or guaranteed quality of service.",
}


async def _describe_quota(session: Session, rt: ResourceType, rq: dict[str, Any], doc: Doc) -> None:
    """kubectl's layout: name, namespace, scopes with what they match, then Used/Hard per resource."""
    doc.kv(0, "Name", meta(rq).get("name", ""))
    doc.kv(0, "Namespace", meta(rq).get("namespace", ""))
    spec, status = rq.get("spec") or {}, rq.get("status") or {}
    scopes = sorted(spec.get("scopes") or [])
    if scopes:
        doc.kv(0, "Scopes", ", ".join(scopes))
        for scope in scopes:
            if scope in _SCOPE_HELP:
                doc.title(0, f" * {_SCOPE_HELP[scope]}")
    for expr in (spec.get("scopeSelector") or {}).get("matchExpressions") or []:
        values = expr.get("values") or []
        doc.kv(0, "Scope Selector", f"{expr.get('scopeName')} {expr.get('operator')}"
                                    + (f" [{', '.join(values)}]" if values else ""))
    hard = status.get("hard") or spec.get("hard") or {}
    used = status.get("used") or {}
    doc.table(0, ["Resource", "Used", "Hard"], [[k, str(used.get(k, "0")), str(v)] for k, v in sorted(hard.items())])


async def _describe_limitrange(session: Session, rt: ResourceType, lr: dict[str, Any], doc: Doc) -> None:
    """kubectl's layout: one row per limited resource of each item, '-' where unset."""
    doc.kv(0, "Name", meta(lr).get("name", ""))
    doc.kv(0, "Namespace", meta(lr).get("namespace", ""))
    rows = []
    for item in (lr.get("spec") or {}).get("limits") or []:
        columns = [item.get(k) or {} for k in ("min", "max", "defaultRequest", "default", "maxLimitRequestRatio")]
        for name in sorted(set().union(*(c.keys() for c in columns))):
            rows.append([item.get("type", ""), name, *(str(c[name]) if name in c else "-" for c in columns)])
    doc.table(0, ["Type", "Resource", "Min", "Max", "Default Request", "Default Limit", "Max Limit/Request Ratio"],
              rows)


async def _describe_configmap(session: Session, rt: ResourceType, cm: dict[str, Any], doc: Doc) -> None:
    """Keys and values as kubectl shows them: each value under its key, verbatim."""
    _header(doc, rt, cm, timestamp=False)
    for title, values in (("Data", cm.get("data") or {}), ("BinaryData", cm.get("binaryData") or {})):
        doc.blank()
        doc.title(0, title)
        doc.title(0, "====")
        for k, v in sorted(values.items()):
            doc.title(0, f"{k}:")
            doc.title(0, "----")
            doc.title(0, f"{len(str(v))} bytes (base64)" if title == "BinaryData" else str(v))
            doc.blank()
    doc.blank()
