"""`gpufleet describe`: one object in prose, ending with its Events, which is where the
scheduler and controllers explain themselves (why a pod is Pending, why a job restarted)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.api import podresources, storage
from gpufleet.api.gpu import GPU_LABEL_PREFIX, GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufleet.api.registry import REGISTRY, ResourceType
from gpufleet.cli.describe_text import (
    Doc,
    format_quantity,
    parse_quantity,
    percent,
    selector_text,
    smart_label,
    when,
)
from gpufleet.cli.output import (
    LAST_APPLIED,
    CliError,
    ContextOpt,
    KubeconfigOpt,
    NamespaceOpt,
    Session,
    age,
    api_error_message,
    cell_text,
    connect,
    err,
    human_duration,
    meta,
    out,
    parse_time,
    run,
)
from gpufleet.client.errors import ApiError, NotFound


def register(app: typer.Typer) -> None:
    @app.command()
    def describe(
        args: Annotated[list[str], typer.Argument(
            help="KIND [NAME...] or KIND/NAME; a NAME that matches no object is used as a name prefix.",
            show_default=False)],
        selector: Annotated[str | None, typer.Option("--selector", "-l", help="Label selector.")] = None,
        all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A")] = False,
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """Describe objects in detail, with their recent Events."""
        run(lambda: _describe(args, selector, all_namespaces, kubeconfig, context, namespace))


async def _describe(args: list[str], selector: str | None, all_namespaces: bool, kubeconfig: Path | None,
                    context: str | None, namespace: str | None) -> int:
    if not args:
        raise CliError("error: you must specify the type of resource to describe, e.g. `gpufleet describe pod web-0`")
    async with connect(kubeconfig, namespace, context) as session:
        if "/" in args[0]:
            kind, _, first = args[0].partition("/")
            names = [first] + [a.partition("/")[2] or a for a in args[1:]]
        else:
            kind, names = args[0], args[1:]
        rt = await session.kinds.resolve(kind)
        ns = None if (all_namespaces or not rt.namespaced) else session.namespace
        objs: list[dict] = []
        failed = False
        if names:
            # A name always means one namespace, even with -A.
            name_ns = session.namespace if rt.namespaced else None
            for name in names:
                found = await _find(session, rt, name_ns, name)
                if not found:
                    failed = True
                objs += found
        else:
            resp = await session.client.raw_request(
                "GET", rt.path(ns), params={"labelSelector": selector or None})
            objs = json.loads(resp.body).get("items") or []
            if not objs:
                where = f" in {ns} namespace." if ns else ""
                err(f"No resources found{where}")
        for i, obj in enumerate(objs):
            if i:
                out()
                out()
            out(await describe_object(session, rt, obj))
        return 1 if failed else 0


async def _find(session: Session, rt: ResourceType, ns: str | None, name: str) -> list[dict]:
    """The named object, or else every object whose name starts with it (kubectl's prefix
    match: `describe pod web` finds web-7d4b9-x2k); reports NotFound when neither."""
    try:
        resp = await session.client.raw_request("GET", rt.path(ns, name))
        return [json.loads(resp.body)]
    except NotFound as e:
        not_found = e
    resp = await session.client.raw_request("GET", rt.path(ns))
    items = [i for i in json.loads(resp.body).get("items") or [] if meta(i).get("name", "").startswith(name)]
    if not items:
        err(api_error_message(not_found))
    return items


async def describe_object(session: Session, rt: ResourceType, obj: dict[str, Any]) -> str:
    describer = _DESCRIBERS.get((rt.group, rt.kind), _describe_generic)
    doc = Doc()
    await describer(session, rt, obj, doc)
    await _events(session, rt, obj, doc)
    return doc.render()


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


# -- kinds ----------------------------------------------------------------------------


async def _describe_pod(session: Session, rt: ResourceType, pod: dict[str, Any], doc: Doc) -> None:
    m, spec, status = meta(pod), pod.get("spec") or {}, pod.get("status") or {}
    doc.kv(0, "Name", m.get("name", ""))
    doc.kv(0, "Namespace", m.get("namespace", ""))
    doc.kv(0, "Priority", spec.get("priority", 0))
    if spec.get("priorityClassName"):
        doc.kv(0, "Priority Class Name", spec["priorityClassName"])
    if spec.get("serviceAccountName"):
        doc.kv(0, "Service Account", spec["serviceAccountName"])
    node = spec.get("nodeName")
    doc.kv(0, "Node", f"{node}/{status['hostIP']}" if node and status.get("hostIP") else (node or "<none>"))
    if status.get("startTime"):
        doc.kv(0, "Start Time", when(status["startTime"]))
    doc.mapping(0, "Labels", m.get("labels"))
    _annotations(doc, 0, m.get("annotations"))
    phase = status.get("phase") or "Unknown"
    if m.get("deletionTimestamp"):
        doc.kv(0, "Status", f"Terminating (lasts {age(m['deletionTimestamp'])})")
        doc.kv(0, "Termination Grace Period", f"{m.get('deletionGracePeriodSeconds', 0)}s")
    else:
        doc.kv(0, "Status", phase)
    if status.get("reason"):
        doc.kv(0, "Reason", status["reason"])
    if status.get("message"):
        doc.kv(0, "Message", status["message"])
    doc.kv(0, "IP", status.get("podIP") or "")
    if status.get("nominatedNodeName"):
        doc.kv(0, "Nominated Node Name", status["nominatedNodeName"])
    _controlled_by(doc, pod)
    _containers(doc, 0, "Init Containers", spec.get("initContainers"), status.get("initContainerStatuses"))
    _containers(doc, 0, "Containers", spec.get("containers"), status.get("containerStatuses"))
    _conditions(doc, status.get("conditions"))
    volumes = spec.get("volumes") or []
    if volumes:
        doc.title(0, "Volumes:")
        for v in volumes:
            doc.title(1, f"{v.get('name', '')}:")
            _volume_source(doc, v)
    doc.kv(0, "QoS Class", status.get("qosClass") or qos_class(spec))
    doc.mapping(0, "Node-Selectors", spec.get("nodeSelector"))
    doc.lines(0, "Tolerations", _tolerations(spec.get("tolerations")))


def _volume_source(doc: Doc, v: Mapping[str, Any]) -> None:
    """A pod volume's source in kubectl's words (the claims and host paths storage uses)."""
    claim, host_path = v.get("persistentVolumeClaim"), v.get("hostPath")
    if isinstance(claim, Mapping):
        doc.kv(2, "Type", "PersistentVolumeClaim (a reference to a PersistentVolumeClaim in the same namespace)")
        doc.kv(2, "ClaimName", claim.get("claimName", ""))
        doc.kv(2, "ReadOnly", str(bool(claim.get("readOnly"))).lower())
    elif isinstance(v.get("ephemeral"), Mapping):
        doc.kv(2, "Type", "EphemeralVolume (an inline specification for a volume that gets created and deleted "
                          "with the pod)")
    elif isinstance(host_path, Mapping):
        _host_path(doc, 2, host_path)
    elif isinstance(v.get("emptyDir"), Mapping):
        empty = v["emptyDir"]
        doc.kv(2, "Type", "EmptyDir (a temporary directory that shares a pod's lifetime)")
        doc.kv(2, "Medium", empty.get("medium") or "")
        doc.kv(2, "SizeLimit", empty.get("sizeLimit") or "<unset>")
    else:
        doc.kv(2, "Type", ", ".join(k for k in v if k != "name") or "<unknown>")


def _host_path(doc: Doc, level: int, source: Mapping[str, Any]) -> None:
    doc.kv(level, "Type", "HostPath (bare host directory volume)")
    doc.kv(level, "Path", source.get("path", ""))
    doc.kv(level, "HostPathType", source.get("type") or "<none>")


def qos_class(spec: Mapping[str, Any]) -> str:
    """BestEffort (no requests or limits), Guaranteed (cpu and memory limits on every
    container, requests equal to them), else Burstable."""
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    any_set = False
    guaranteed = bool(containers)
    for c in containers:
        res = c.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        if requests or limits:
            any_set = True
        for r in ("cpu", "memory"):
            if r not in limits:
                guaranteed = False
            elif r in requests and parse_quantity(requests[r]) != parse_quantity(limits[r]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


async def _describe_deployment(session: Session, rt: ResourceType, d: dict[str, Any], doc: Doc) -> None:
    spec, status = d.get("spec") or {}, d.get("status") or {}
    _header(doc, rt, d)
    doc.kv(0, "Selector", selector_text(spec.get("selector")))
    desired = spec.get("replicas", 1)
    doc.kv(0, "Replicas", f"{desired} desired | {status.get('updatedReplicas', 0)} updated | "
                          f"{status.get('replicas', 0)} total | {status.get('availableReplicas', 0)} available | "
                          f"{status.get('unavailableReplicas', 0)} unavailable")
    strategy = spec.get("strategy") or {}
    doc.kv(0, "StrategyType", strategy.get("type") or "RollingUpdate")
    doc.kv(0, "MinReadySeconds", spec.get("minReadySeconds", 0))
    if (strategy.get("type") or "RollingUpdate") == "RollingUpdate":
        ru = strategy.get("rollingUpdate") or {}
        doc.kv(0, "RollingUpdateStrategy", f"{ru.get('maxUnavailable', '25%')} max unavailable, "
                                           f"{ru.get('maxSurge', '25%')} max surge")
    _pod_template(doc, spec.get("template"))
    _conditions(doc, status.get("conditions"), detailed=True)
    uid = meta(d).get("uid", "")
    sets = [rs for rs in await _list(session, "replicasets.apps", meta(d).get("namespace"),
                                     labelSelector=_match_labels_query(spec.get("selector")))
            if _owned_by(rs, uid)]

    def revision(rs: dict) -> int:
        try:
            return int((meta(rs).get("annotations") or {}).get("deployment.kubernetes.io/revision", 0))
        except ValueError:
            return 0

    sets.sort(key=revision, reverse=True)

    def line(rs: dict) -> str:
        st = rs.get("status") or {}
        return f"{meta(rs).get('name', '')} ({st.get('replicas', 0)}/{(rs.get('spec') or {}).get('replicas', 0)} " \
               "replicas created)"

    doc.lines(0, "OldReplicaSets", [line(rs) for rs in sets[1:]])
    doc.kv(0, "NewReplicaSet", line(sets[0]) if sets else "<none>")


async def _describe_replicaset(session: Session, rt: ResourceType, rs: dict[str, Any], doc: Doc) -> None:
    spec, status = rs.get("spec") or {}, rs.get("status") or {}
    doc.kv(0, "Name", meta(rs).get("name", ""))
    doc.kv(0, "Namespace", meta(rs).get("namespace", ""))
    doc.kv(0, "Selector", selector_text(spec.get("selector")))
    doc.mapping(0, "Labels", meta(rs).get("labels"))
    _annotations(doc, 0, meta(rs).get("annotations"))
    _controlled_by(doc, rs)
    doc.kv(0, "Replicas", f"{status.get('replicas', 0)} current / {spec.get('replicas', 1)} desired")
    await _pods_status(session, doc, rs, spec.get("selector"))
    _pod_template(doc, spec.get("template"))
    _conditions(doc, status.get("conditions"), detailed=True)


async def _pods_status(session: Session, doc: Doc, owner: dict[str, Any], selector: Any) -> None:
    pods = [p for p in await _list(session, "pods", meta(owner).get("namespace"),
                                   labelSelector=_match_labels_query(selector))
            if _owned_by(p, meta(owner).get("uid", ""))]
    counts = {"Running": 0, "Pending": 0, "Succeeded": 0, "Failed": 0}
    for p in pods:
        phase = (p.get("status") or {}).get("phase") or "Pending"
        counts[phase] = counts.get(phase, 0) + 1
    doc.kv(0, "Pods Status", f"{counts['Running']} Running / {counts['Pending']} Waiting / "
                             f"{counts['Succeeded']} Succeeded / {counts['Failed']} Failed")


async def _describe_job(session: Session, rt: ResourceType, job: dict[str, Any], doc: Doc) -> None:
    spec, status = job.get("spec") or {}, job.get("status") or {}
    _header(doc, rt, job, timestamp=False)
    _controlled_by(doc, job)
    doc.kv(0, "Parallelism", spec.get("parallelism", 1))
    doc.kv(0, "Completions", spec.get("completions", "<unset>"))
    doc.kv(0, "Completion Mode", spec.get("completionMode") or "NonIndexed")
    doc.kv(0, "Suspend", "true" if spec.get("suspend") else "false")
    doc.kv(0, "Backoff Limit", spec.get("backoffLimit", 6))
    if status.get("startTime"):
        doc.kv(0, "Start Time", when(status["startTime"]))
    if status.get("completionTime"):
        doc.kv(0, "Completed At", when(status["completionTime"]))
        start, end = parse_time(status.get("startTime")), parse_time(status["completionTime"])
        if start and end:
            doc.kv(0, "Duration", human_duration((end - start).total_seconds()))
    if spec.get("activeDeadlineSeconds") is not None:
        doc.kv(0, "Active Deadline Seconds", f"{spec['activeDeadlineSeconds']}s")
    ready = f" ({status['ready']} Ready)" if status.get("ready") is not None else ""
    doc.kv(0, "Pods Statuses", f"{status.get('active', 0)} Active{ready} / {status.get('succeeded', 0)} Succeeded"
                               f" / {status.get('failed', 0)} Failed")
    _pod_template(doc, spec.get("template"))
    _conditions(doc, status.get("conditions"), detailed=True)


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


# -- storage --------------------------------------------------------------------------


def _finalizers(obj: Mapping[str, Any]) -> str:
    return "[" + " ".join(meta(obj).get("finalizers") or []) + "]"


def _storage_status(obj: Mapping[str, Any]) -> str:
    deleted = meta(obj).get("deletionTimestamp")
    if deleted:
        return f"Terminating (lasts {age(deleted)})"
    return str((obj.get("status") or {}).get("phase") or "")


async def _describe_pvc(session: Session, rt: ResourceType, pvc: dict[str, Any], doc: Doc) -> None:
    """kubectl's layout, with the pods using the claim (Used By), then its Events: where the
    PV controller, the provisioner and the scheduler say why a claim is Pending."""
    m, spec, status = meta(pvc), pvc.get("spec") or {}, pvc.get("status") or {}
    doc.kv(0, "Name", m.get("name", ""))
    doc.kv(0, "Namespace", m.get("namespace", ""))
    doc.kv(0, "StorageClass", storage.claim_class(pvc))
    doc.kv(0, "Status", _storage_status(pvc))
    doc.kv(0, "Volume", spec.get("volumeName") or "")
    doc.mapping(0, "Labels", m.get("labels"))
    _annotations(doc, 0, m.get("annotations"))
    doc.kv(0, "Finalizers", _finalizers(pvc))
    capacity = modes = ""
    if spec.get("volumeName"):
        capacity = str((status.get("capacity") or {}).get("storage") or "")
        modes = storage.access_modes_text(status.get("accessModes"))
    doc.kv(0, "Capacity", capacity)
    doc.kv(0, "Access Modes", modes)
    if spec.get("volumeMode"):
        doc.kv(0, "VolumeMode", spec["volumeMode"])
    source = spec.get("dataSource")
    if isinstance(source, Mapping):
        doc.title(0, "DataSource:")
        if source.get("apiGroup"):
            doc.kv(1, "APIGroup", source["apiGroup"])
        doc.kv(1, "Kind", source.get("kind", ""))
        doc.kv(1, "Name", source.get("name", ""))
    pods = await _list(session, "pods", m.get("namespace"))
    users = sorted(meta(p).get("name", "") for p in pods if m.get("name") in storage.pod_claim_names(p))
    doc.lines(0, "Used By", users)
    conditions = status.get("conditions") or []
    if conditions:
        doc.title(0, "Conditions:")
        doc.table(1, ["Type", "Status", "LastProbeTime", "LastTransitionTime", "Reason", "Message"], [
            [c.get("type", ""), c.get("status", ""), when(c.get("lastProbeTime")) if c.get("lastProbeTime") else "",
             when(c.get("lastTransitionTime")) if c.get("lastTransitionTime") else "", c.get("reason") or "",
             c.get("message") or ""] for c in conditions])


def _node_affinity(doc: Doc, affinity: Any) -> None:
    required = affinity.get("required") if isinstance(affinity, Mapping) else None
    if not isinstance(required, Mapping):
        doc.kv(0, "Node Affinity", "<none>")
        return
    doc.title(0, "Node Affinity:")
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        doc.kv(1, "Required Terms", "<none>")
        return
    doc.title(1, "Required Terms:")
    for i, term in enumerate(terms):
        expressions = []
        for req in term.get("matchExpressions") or []:
            text = f"{req.get('key', '')} {str(req.get('operator', '')).lower()}"
            if req.get("values"):
                text += f" [{', '.join(req['values'])}]"
            expressions.append(text)
        doc.lines(2, f"Term {i}", expressions)


async def _describe_pv(session: Session, rt: ResourceType, pv: dict[str, Any], doc: Doc) -> None:
    m, spec, status = meta(pv), pv.get("spec") or {}, pv.get("status") or {}
    doc.kv(0, "Name", m.get("name", ""))
    doc.mapping(0, "Labels", m.get("labels"))
    _annotations(doc, 0, m.get("annotations"))
    doc.kv(0, "Finalizers", _finalizers(pv))
    doc.kv(0, "StorageClass", storage.volume_class(pv))
    doc.kv(0, "Status", _storage_status(pv))
    ref = spec.get("claimRef")
    doc.kv(0, "Claim", f"{ref.get('namespace') or ''}/{ref.get('name') or ''}" if isinstance(ref, Mapping) else "")
    doc.kv(0, "Reclaim Policy", spec.get("persistentVolumeReclaimPolicy") or "")
    doc.kv(0, "Access Modes", storage.access_modes_text(spec.get("accessModes")))
    if spec.get("volumeMode"):
        doc.kv(0, "VolumeMode", spec["volumeMode"])
    doc.kv(0, "Capacity", str((spec.get("capacity") or {}).get("storage") or ""))
    _node_affinity(doc, spec.get("nodeAffinity"))
    doc.kv(0, "Message", status.get("message") or "")
    doc.title(0, "Source:")
    if isinstance(spec.get("hostPath"), Mapping):
        _host_path(doc, 2, spec["hostPath"])
    elif isinstance(spec.get("local"), Mapping):
        doc.kv(2, "Type", "LocalVolume (a persistent volume backed by local storage on a node)")
        doc.kv(2, "Path", spec["local"].get("path", ""))
    else:
        kinds = [k for k, v in spec.items() if isinstance(v, Mapping) and k not in
                 ("capacity", "claimRef", "nodeAffinity")]
        doc.kv(2, "Type", ", ".join(kinds) or "<unknown>")


def _format_map(values: Any) -> str:
    """labels.FormatLabels: k=v pairs, sorted, comma-separated; <none> when empty."""
    items = sorted((values or {}).items())
    return ",".join(f"{k}={v}" for k, v in items) if items else "<none>"


async def _describe_storage_class(session: Session, rt: ResourceType, sc: dict[str, Any], doc: Doc) -> None:
    m = meta(sc)
    doc.kv(0, "Name", m.get("name", ""))
    doc.kv(0, "IsDefaultClass", "Yes" if storage.is_default_class(sc) else "No")
    annotations = {k: v for k, v in (m.get("annotations") or {}).items() if k != LAST_APPLIED}
    doc.kv(0, "Annotations", _format_map(annotations))
    doc.kv(0, "Provisioner", sc.get("provisioner", ""))
    doc.kv(0, "Parameters", _format_map(sc.get("parameters")))
    expansion = sc.get("allowVolumeExpansion")
    doc.kv(0, "AllowVolumeExpansion", "<unset>" if expansion is None else str(bool(expansion)))
    options = sc.get("mountOptions") or []
    if options:
        doc.title(0, "MountOptions:")
        for option in options:
            doc.title(1, str(option))
    else:
        doc.kv(0, "MountOptions", "<none>")
    doc.kv(0, "ReclaimPolicy", sc.get("reclaimPolicy") or "Delete")
    doc.kv(0, "VolumeBindingMode", sc.get("volumeBindingMode") or "Immediate")
    topologies = sc.get("allowedTopologies") or []
    if topologies:
        doc.title(0, "AllowedTopologies:")
        for i, term in enumerate(topologies):
            doc.lines(1, f"Term {i}", [f"{e.get('key', '')} in [{', '.join(e.get('values') or [])}]"
                                       for e in term.get("matchLabelExpressions") or []])


async def _describe_generic(session: Session, rt: ResourceType, obj: dict[str, Any], doc: Doc) -> None:
    """Any other kind (jobs of training frameworks, queues, ...): the metadata, then spec and
    status written out as nested fields."""
    _header(doc, rt, obj)
    _controlled_by(doc, obj)
    for key, value in obj.items():
        if key in ("apiVersion", "kind", "metadata"):
            continue
        _nested(doc, 0, smart_label(key), value, raw_key=key)


# -- gangs: PodGroup and the training jobs placed through one -----------------------------

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


def _waiting_reasons(pods: list[dict]) -> list[str]:
    """What the scheduler says of the members it holds back (their PodScheduled=False
    messages), each distinct message once, the most frequent first."""
    counts: dict[str, int] = {}
    for p in pods:
        if (p.get("spec") or {}).get("nodeName") or meta(p).get("deletionTimestamp"):
            continue
        for c in (p.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("message"):
                text = " ".join(str(c["message"]).split())
                counts[text] = counts.get(text, 0) + 1
    return sorted(counts, key=lambda m: -counts[m])


async def _gang_members(session: Session, group: dict[str, Any]) -> list[dict]:
    m = meta(group)
    return sorted(await _list(session, "pods", m.get("namespace"),
                              labelSelector=f"{POD_GROUP_LABEL}={m.get('name', '')}"),
                  key=lambda p: meta(p).get("name", ""))


_GANG_ENDED = ("Finished", "Succeeded", "Failed")


def _gang_status(doc: Doc, level: int, group: dict[str, Any], members: list[dict]) -> None:
    spec, status = group.get("spec") or {}, group.get("status") or {}
    doc.kv(level, "Phase", status.get("phase") or "Pending")
    doc.kv(level, "Min Member", spec.get("minMember", 1))
    doc.kv(level, "Members", len([p for p in members if not meta(p).get("deletionTimestamp")]))
    for key in ("scheduled", "running", "succeeded", "failed"):
        doc.kv(level, key.capitalize(), status.get(key, 0))
    # The workload whose pods make up the group (scheduler-plugins keeps it once set); said
    # only while the group is in use, not of a gang that has ended.
    if status.get("occupiedBy") and status.get("phase") not in _GANG_ENDED:
        doc.kv(level, "Occupied By", status["occupiedBy"])
    if status.get("scheduleStartTime"):
        doc.kv(level, "Schedule Start Time", when(status["scheduleStartTime"]))
    reasons = _waiting_reasons(members)
    if reasons:
        doc.lines(level, "Waiting", reasons)


async def _describe_podgroup(session: Session, rt: ResourceType, group: dict[str, Any], doc: Doc) -> None:
    """The gang as the scheduler sees it: phase, counts, why its members wait, and who they are."""
    spec = group.get("spec") or {}
    _header(doc, rt, group)
    _controlled_by(doc, group)
    if spec.get("scheduleTimeoutSeconds"):
        doc.kv(0, "Schedule Timeout", f"{spec['scheduleTimeoutSeconds']}s")
    if spec.get("minResources"):
        doc.mapping(0, "Min Resources", spec["minResources"])
    members = await _gang_members(session, group)
    _gang_status(doc, 0, group, members)
    if members:
        doc.title(0, "Member Pods:")
        doc.table(1, ["Name", "Phase", "Node"], [
            [meta(p).get("name", ""), (p.get("status") or {}).get("phase") or "Pending",
             (p.get("spec") or {}).get("nodeName") or "<none>"] for p in members])


async def _describe_training_job(session: Session, rt: ResourceType, job: dict[str, Any], doc: Doc) -> None:
    """A training job written out field by field, then its gang: the PodGroup of the job's
    name (what the scheduler holds its pods back for, and why)."""
    await _describe_generic(session, rt, job, doc)
    m = meta(job)
    pg_rt = REGISTRY.by_key("podgroups.scheduling.x-k8s.io")
    if pg_rt is None:
        return
    try:
        resp = await session.client.raw_request("GET", pg_rt.path(m.get("namespace"), m.get("name", "")))
    except ApiError:
        return
    group = json.loads(resp.body)
    doc.title(0, "Gang:")
    doc.kv(1, "Pod Group", meta(group).get("name", ""))
    _gang_status(doc, 1, group, await _gang_members(session, group))


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


_Describer = Callable[[Session, ResourceType, dict[str, Any], Doc], Awaitable[None]]
_DESCRIBERS: dict[tuple[str, str], _Describer] = {
    ("", "Pod"): _describe_pod,
    ("apps", "Deployment"): _describe_deployment,
    ("apps", "ReplicaSet"): _describe_replicaset,
    ("batch", "Job"): _describe_job,
    ("", "Service"): _describe_service,
    ("", "Node"): _describe_node,
    ("", "Namespace"): _describe_namespace,
    ("", "ConfigMap"): _describe_configmap,
    ("", "ResourceQuota"): _describe_quota,
    ("", "LimitRange"): _describe_limitrange,
    ("", "PersistentVolumeClaim"): _describe_pvc,
    ("", "PersistentVolume"): _describe_pv,
    ("storage.k8s.io", "StorageClass"): _describe_storage_class,
    ("scheduling.x-k8s.io", "PodGroup"): _describe_podgroup,
    ("kubeflow.org", "PyTorchJob"): _describe_training_job,
}
