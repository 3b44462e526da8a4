"""Describers of workloads: Pod, Deployment, ReplicaSet, Job, and the gangs (PodGroup and the
training jobs placed through one)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpufleet.api.registry import REGISTRY, ResourceType
from gpufleet.cli.commands.describe._blocks import (
    _annotations,
    _conditions,
    _containers,
    _controlled_by,
    _describe_generic,
    _header,
    _host_path,
    _list,
    _match_labels_query,
    _owned_by,
    _pod_template,
    _tolerations,
)
from gpufleet.cli.describe_text import (
    Doc,
    parse_quantity,
    selector_text,
    when,
)
from gpufleet.cli.output import (
    Session,
    age,
    human_duration,
    meta,
    parse_time,
)
from gpufleet.client.errors import ApiError

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
    _member_pods(doc, members)


def _member_pods(doc: Doc, members: list[dict]) -> None:
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


# -- Volcano: the Job and its PodGroup --------------------------------------------------------

VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"


async def _volcano_members(session: Session, group: dict[str, Any]) -> list[dict]:
    m = meta(group)
    pods = await _list(session, "pods", m.get("namespace"))
    return sorted((p for p in pods if (meta(p).get("annotations") or {}).get(VOLCANO_GROUP_ANNOTATION)
                   == m.get("name")), key=lambda p: meta(p).get("name", ""))


def _volcano_gang(doc: Doc, level: int, group: dict[str, Any], members: list[dict]) -> None:
    spec, status = group.get("spec") or {}, group.get("status") or {}
    doc.kv(level, "Phase", status.get("phase") or "Pending")
    doc.kv(level, "Queue", spec.get("queue") or "default")
    doc.kv(level, "Min Member", spec.get("minMember", 0))
    if spec.get("minTaskMember"):
        doc.mapping(level, "Min Task Member", spec["minTaskMember"])
    if spec.get("minResources"):
        doc.mapping(level, "Min Resources", spec["minResources"])
    doc.kv(level, "Members", len([p for p in members if not meta(p).get("deletionTimestamp")]))
    for key in ("running", "succeeded", "failed"):
        doc.kv(level, key.capitalize(), status.get(key, 0))
    unschedulable = [c.get("message") for c in status.get("conditions") or []
                     if c.get("type") == "Unschedulable" and c.get("status") == "True" and c.get("message")]
    reasons = unschedulable or _waiting_reasons(members)
    if reasons:
        doc.lines(level, "Waiting", reasons)


async def _describe_volcano_podgroup(session: Session, rt: ResourceType, group: dict[str, Any], doc: Doc) -> None:
    """The gang as Volcano's scheduler and its Queue see it: phase, queue, counts, why it waits."""
    _header(doc, rt, group)
    _controlled_by(doc, group)
    members = await _volcano_members(session, group)
    _volcano_gang(doc, 0, group, members)
    _member_pods(doc, members)


async def _describe_volcano_job(session: Session, rt: ResourceType, job: dict[str, Any], doc: Doc) -> None:
    """A Volcano Job field by field, then its gang: the PodGroup ``<job>-<uid>`` (whether its
    Queue admitted it, and what the scheduler says of its pods)."""
    await _describe_generic(session, rt, job, doc)
    m = meta(job)
    pg_rt = REGISTRY.by_key("podgroups.scheduling.volcano.sh")
    if pg_rt is None:
        return
    try:
        resp = await session.client.raw_request(
            "GET", pg_rt.path(m.get("namespace"), f"{m.get('name', '')}-{m.get('uid', '')}"))
    except ApiError:
        return
    group = json.loads(resp.body)
    doc.title(0, "Gang:")
    doc.kv(1, "Pod Group", meta(group).get("name", ""))
    _volcano_gang(doc, 1, group, await _volcano_members(session, group))
