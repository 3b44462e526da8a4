"""Pieces every describer uses: the header, conditions, containers and pod templates, nested
fields written out, and the Events that end each description."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gpufleet.api.registry import REGISTRY, ResourceType
from gpufleet.cli.describe_text import (
    Doc,
    selector_text,
    smart_label,
    when,
)
from gpufleet.cli.output import (
    LAST_APPLIED,
    Session,
    age,
    cell_text,
    meta,
    parse_time,
)
from gpufleet.client.errors import ApiError

# -- common pieces --------------------------------------------------------------------


def _header(doc: Doc, rt: ResourceType, obj: dict[str, Any], *, timestamp: bool = True) -> None:
    m = meta(obj)
    doc.kv(0, "Name", m.get("name", ""))
    if rt.namespaced:
        doc.kv(0, "Namespace", m.get("namespace", ""))
    if timestamp:
        doc.kv(0, "CreationTimestamp", when(m.get("creationTimestamp")))
    doc.mapping(0, "Labels", m.get("labels"))
    _annotations(doc, 0, m.get("annotations"))
    if m.get("deletionTimestamp"):
        doc.kv(0, "Deletion Requested", when(m["deletionTimestamp"]))
    if m.get("finalizers"):
        doc.kv(0, "Finalizers", "[" + " ".join(m["finalizers"]) + "]")


def _annotations(doc: Doc, level: int, annotations: Any) -> None:
    # The applied manifest is noise here (and can be huge); `get -o yaml` shows it.
    shown = {k: v for k, v in (annotations or {}).items() if k != LAST_APPLIED}
    doc.mapping(level, "Annotations", shown, sep=": ")


def _controlled_by(doc: Doc, obj: dict[str, Any]) -> None:
    for ref in meta(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            doc.kv(0, "Controlled By", f"{ref.get('kind', '')}/{ref.get('name', '')}")
            return


def _conditions(doc: Doc, conditions: Any, *, detailed: bool = False) -> None:
    if not conditions:
        return
    doc.title(0, "Conditions:")
    if detailed:
        doc.table(1, ["Type", "Status", "Reason", "Message"], [
            [c.get("type", ""), c.get("status", ""), c.get("reason") or "", c.get("message") or ""]
            for c in conditions])
    else:
        doc.table(1, ["Type", "Status"], [[c.get("type", ""), c.get("status", "")] for c in conditions])


def _resources_block(doc: Doc, level: int, title: str, values: Any) -> None:
    if not values:
        return
    doc.title(level, f"{title}:")
    for k, v in sorted(values.items()):
        doc.kv(level + 1, k, v)


def _ports(container: Mapping[str, Any]) -> list[str]:
    out = []
    for p in container.get("ports") or []:
        text = f"{p.get('containerPort', '')}/{p.get('protocol') or 'TCP'}"
        if p.get("name"):
            text += f" ({p['name']})"
        out.append(text)
    return out


def _state(doc: Doc, level: int, key: str, state: Any) -> None:
    if not state:
        doc.kv(level, key, "Waiting" if key == "State" else "")
        return
    if "running" in state:
        doc.kv(level, key, "Running")
        doc.kv(level + 1, "Started", when((state["running"] or {}).get("startedAt")))
    elif "waiting" in state:
        doc.kv(level, key, "Waiting")
        w = state["waiting"] or {}
        if w.get("reason"):
            doc.kv(level + 1, "Reason", w["reason"])
        if w.get("message"):
            doc.kv(level + 1, "Message", w["message"])
    elif "terminated" in state:
        t = state["terminated"] or {}
        doc.kv(level, key, "Terminated")
        doc.kv(level + 1, "Reason", t.get("reason") or "")
        if t.get("message"):
            doc.kv(level + 1, "Message", t["message"])
        doc.kv(level + 1, "Exit Code", t.get("exitCode", ""))
        if t.get("signal"):
            doc.kv(level + 1, "Signal", t["signal"])
        doc.kv(level + 1, "Started", when(t.get("startedAt")))
        doc.kv(level + 1, "Finished", when(t.get("finishedAt")))
    else:
        doc.kv(level, key, "")


def _containers(doc: Doc, level: int, title: str, containers: Any, statuses: Any = None,
                *, with_status: bool = True) -> None:
    if not containers:
        return
    by_name = {s.get("name"): s for s in statuses or []}
    doc.title(level, f"{title}:")
    for c in containers:
        doc.title(level + 1, f"{c.get('name', '')}:")
        lv = level + 2
        st = by_name.get(c.get("name")) or {}
        if with_status and st.get("containerID"):
            doc.kv(lv, "Container ID", st["containerID"])
        doc.kv(lv, "Image", c.get("image", ""))
        ports = _ports(c)
        doc.lines(lv, "Port" if len(ports) <= 1 else "Ports", ports if len(ports) <= 1 else [", ".join(ports)])
        for key in ("command", "args"):
            if c.get(key):
                doc.title(lv, f"{key.capitalize()}:")
                for part in c[key]:
                    doc.title(lv + 1, str(part))
        if with_status:
            _state(doc, lv, "State", st.get("state"))
            if st.get("lastState"):
                _state(doc, lv, "Last State", st["lastState"])
            doc.kv(lv, "Ready", "True" if st.get("ready") else "False")
            doc.kv(lv, "Restart Count", st.get("restartCount", 0))
        res = c.get("resources") or {}
        _resources_block(doc, lv, "Limits", res.get("limits"))
        _resources_block(doc, lv, "Requests", res.get("requests"))
        env = c.get("env") or []
        if env:
            doc.title(lv, "Environment:")
            for e in env:
                value = e.get("value")
                if value is None and e.get("valueFrom"):
                    src = e["valueFrom"]
                    value = "<set from " + ", ".join(sorted(src)) + ">"
                doc.kv(lv + 1, e.get("name", ""), value if value is not None else "")
        else:
            doc.kv(lv, "Environment", "<none>")
        mounts = [f"{m.get('mountPath', '')} from {m.get('name', '')}" + (" (ro)" if m.get("readOnly") else "")
                  for m in c.get("volumeMounts") or []]
        doc.lines(lv, "Mounts", mounts)


def _pod_template(doc: Doc, template: Any) -> None:
    template = template or {}
    doc.title(0, "Pod Template:")
    doc.mapping(1, "Labels", meta(template).get("labels"))
    anns = meta(template).get("annotations")
    if anns:
        _annotations(doc, 1, anns)
    spec = template.get("spec") or {}
    if spec.get("priorityClassName"):
        doc.kv(1, "Priority Class Name", spec["priorityClassName"])
    _containers(doc, 1, "Init Containers", spec.get("initContainers"), with_status=False)
    if spec.get("containers"):
        _containers(doc, 1, "Containers", spec["containers"], with_status=False)
    else:
        doc.kv(1, "Containers", "<none>")
    doc.mapping(1, "Node-Selectors", spec.get("nodeSelector"))
    doc.lines(1, "Tolerations", _tolerations(spec.get("tolerations")))


def _tolerations(tolerations: Any) -> list[str]:
    out = []
    for t in tolerations or []:
        text = t.get("key", "") or ""
        if t.get("operator") == "Exists" and not text:
            text = "op=Exists"
        elif t.get("value"):
            text += f"={t['value']}"
        if t.get("effect"):
            text += f":{t['effect']}"
        elif t.get("operator") == "Exists" and t.get("key"):
            text += " op=Exists"
        if t.get("tolerationSeconds") is not None:
            text += f" for {t['tolerationSeconds']}s"
        out.append(text)
    return out


async def _list(session: Session, rt_key: str, ns: str | None, **params: Any) -> list[dict]:
    rt = REGISTRY.by_key(rt_key)
    if rt is None:
        return []
    try:
        resp = await session.client.raw_request("GET", rt.path(ns), params=params)
    except ApiError:
        return []
    return json.loads(resp.body).get("items") or []


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(r.get("uid") == uid and r.get("controller") for r in meta(obj).get("ownerReferences") or [])


def _match_labels_query(selector: Any) -> str | None:
    text = selector_text(selector)
    return None if text == "<none>" else text


def _host_path(doc: Doc, level: int, source: Mapping[str, Any]) -> None:
    doc.kv(level, "Type", "HostPath (bare host directory volume)")
    doc.kv(level, "Path", source.get("path", ""))
    doc.kv(level, "HostPathType", source.get("type") or "<none>")


async def _describe_generic(session: Session, rt: ResourceType, obj: dict[str, Any], doc: Doc) -> None:
    """Any other kind (jobs of training frameworks, queues, ...): the metadata, then spec and
    status written out as nested fields."""
    _header(doc, rt, obj)
    _controlled_by(doc, obj)
    for key, value in obj.items():
        if key in ("apiVersion", "kind", "metadata"):
            continue
        _nested(doc, 0, smart_label(key), value, raw_key=key)


# Maps whose keys are data (label keys, resource names, config keys), written as they are
# instead of as field labels.
_VERBATIM_MAPS = {"labels", "annotations", "matchLabels", "nodeSelector", "selector", "data", "binaryData",
                  "stringData", "limits", "requests", "capacity", "allocatable", "hard", "used", "env"}


def _nested(doc: Doc, level: int, key: str, value: Any, *, raw_key: str = "", verbatim: bool = False,
            child_extra: int = 0) -> None:
    """One field and everything under it. A list of objects is written as `- ` items; the
    fields of an item line up after the dash."""
    child = level + 1 + child_extra
    keep = raw_key in _VERBATIM_MAPS

    def label(k: Any) -> str:
        return str(k) if keep or verbatim else smart_label(str(k))

    if isinstance(value, Mapping):
        if not value:
            doc.kv(level, key, "<none>")
            return
        doc.title(level, f"{key}:")
        for k, v in value.items():
            _nested(doc, child, label(k), v, raw_key=str(k), verbatim=keep)
    elif isinstance(value, list):
        if not value:
            doc.kv(level, key, "<none>")
        elif all(not isinstance(v, Mapping | list) for v in value):
            doc.kv(level, key, ", ".join(cell_text(v) for v in value))
        else:
            doc.title(level, f"{key}:")
            for item in value:
                if isinstance(item, Mapping) and item:
                    for n, (k, v) in enumerate(item.items()):
                        dash = "- " if n == 0 else "  "
                        _nested(doc, child, dash + smart_label(str(k)), v, raw_key=str(k), child_extra=1)
                else:
                    doc.kv(child, "-", cell_text(item))
    else:
        doc.kv(level, key, cell_text(value) if value is not None else "<none>")


# -- events ---------------------------------------------------------------------------


async def _events(session: Session, rt: ResourceType, obj: dict[str, Any], doc: Doc) -> None:
    """The object's Events, oldest first; cluster-scoped objects (nodes) have theirs in any
    namespace, so those are searched across all of them."""
    m = meta(obj)
    fields = [f"involvedObject.name={m.get('name', '')}"]
    if rt.namespaced:
        fields.append(f"involvedObject.namespace={m.get('namespace', '')}")
    else:
        fields.append(f"involvedObject.kind={rt.kind}")
    if m.get("uid"):
        fields.append(f"involvedObject.uid={m['uid']}")
    events_rt = REGISTRY.by_key("events")
    assert events_rt is not None
    try:
        resp = await session.client.raw_request(
            "GET", events_rt.path(m.get("namespace") if rt.namespaced else None),
            params={"fieldSelector": ",".join(fields)})
    except ApiError as e:
        doc.kv(0, "Events", f"<unavailable: {e.message}>")
        return
    events = json.loads(resp.body).get("items") or []
    if not events:
        doc.kv(0, "Events", "<none>")
        return
    events.sort(key=_event_time)
    now = datetime.now(UTC)
    doc.title(0, "Events:")
    doc.table(1, ["Type", "Reason", "Age", "From", "Message"], [
        [e.get("type") or "", e.get("reason") or "", _event_age(e, now), _event_source(e),
         " ".join(str(e.get("message") or "").split())]
        for e in events])


def _event_time(e: Mapping[str, Any]) -> float:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        dt = parse_time(e.get(key))
        if dt:
            return dt.timestamp()
    dt = parse_time(meta(e).get("creationTimestamp"))
    return dt.timestamp() if dt else 0.0


def _event_age(e: Mapping[str, Any], now: datetime) -> str:
    series = e.get("series") or {}
    count = series.get("count") or e.get("count") or 1
    last = e.get("lastTimestamp") or series.get("lastObservedTime") or e.get("eventTime") \
        or meta(e).get("creationTimestamp")
    first = e.get("firstTimestamp") or e.get("eventTime") or meta(e).get("creationTimestamp")
    text = age(last, now)
    if count > 1:
        text += f" (x{count} over {age(first, now)})"
    return text


def _event_source(e: Mapping[str, Any]) -> str:
    source = e.get("source") or {}
    component = source.get("component") or e.get("reportingComponent") or ""
    host = source.get("host")
    return f"{component}, {host}" if component and host else component or host or ""
