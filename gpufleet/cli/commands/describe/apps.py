"""Describers of StatefulSet, DaemonSet and CronJob, in kubectl's words (its
describeStatefulSet, describeDaemonSet and describeCronJob)."""

from __future__ import annotations

from typing import Any

from gpufleet.api.registry import ResourceType
from gpufleet.cli.commands.describe._blocks import (
    _annotations,
    _conditions,
    _header,
    _list,
    _owned_by,
    _pod_template,
)
from gpufleet.cli.commands.describe.workloads import _pods_status
from gpufleet.cli.describe_text import Doc, selector_text, when
from gpufleet.cli.output import Session, meta


async def _describe_stateful_set(session: Session, rt: ResourceType, sts: dict[str, Any], doc: Doc) -> None:
    spec, status = sts.get("spec") or {}, sts.get("status") or {}
    m = meta(sts)
    doc.kv(0, "Name", m.get("name", ""))
    doc.kv(0, "Namespace", m.get("namespace", ""))
    doc.kv(0, "CreationTimestamp", when(m.get("creationTimestamp")))
    doc.kv(0, "Selector", selector_text(spec.get("selector")))
    doc.mapping(0, "Labels", m.get("labels"))
    _annotations(doc, 0, m.get("annotations"))
    doc.kv(0, "Replicas", f"{spec.get('replicas', 1)} desired | {status.get('replicas', 0)} total")
    strategy = spec.get("updateStrategy") or {}
    doc.kv(0, "Update Strategy", strategy.get("type") or "RollingUpdate")
    rolling = strategy.get("rollingUpdate") or {}
    if (strategy.get("type") or "RollingUpdate") == "RollingUpdate":
        if rolling.get("partition") is not None:
            doc.kv(1, "Partition", rolling["partition"])
        if rolling.get("maxUnavailable") is not None:
            doc.kv(1, "Max Unavailable", rolling["maxUnavailable"])
    await _pods_status(session, doc, sts, spec.get("selector"))
    _pod_template(doc, spec.get("template"))
    claims = spec.get("volumeClaimTemplates") or []
    if not claims:
        doc.kv(0, "Volume Claims", "<none>")
    else:
        doc.title(0, "Volume Claims:")
        for claim in claims:
            cm, cs = meta(claim), claim.get("spec") or {}
            doc.kv(1, "Name", cm.get("name", ""))
            doc.kv(1, "StorageClass", cs.get("storageClassName") or "")
            doc.mapping(1, "Labels", cm.get("labels"))
            _annotations(doc, 1, cm.get("annotations"))
            doc.kv(1, "Capacity", ((cs.get("resources") or {}).get("requests") or {}).get("storage") or "")
            doc.kv(1, "Access Modes", "[" + " ".join(cs.get("accessModes") or []) + "]")
    _conditions(doc, status.get("conditions"), detailed=True)


async def _describe_daemon_set(session: Session, rt: ResourceType, ds: dict[str, Any], doc: Doc) -> None:
    spec, status = ds.get("spec") or {}, ds.get("status") or {}
    m = meta(ds)
    doc.kv(0, "Name", m.get("name", ""))
    doc.kv(0, "Namespace", m.get("namespace", ""))
    doc.kv(0, "Selector", selector_text(spec.get("selector")))
    node_selector = ((spec.get("template") or {}).get("spec") or {}).get("nodeSelector")
    doc.kv(0, "Node-Selector", ",".join(f"{k}={v}" for k, v in (node_selector or {}).items()) or "<none>")
    doc.mapping(0, "Labels", m.get("labels"))
    _annotations(doc, 0, m.get("annotations"))
    doc.kv(0, "Desired Number of Nodes Scheduled", status.get("desiredNumberScheduled", 0))
    doc.kv(0, "Current Number of Nodes Scheduled", status.get("currentNumberScheduled", 0))
    doc.kv(0, "Number of Nodes Scheduled with Up-to-date Pods", status.get("updatedNumberScheduled", 0))
    doc.kv(0, "Number of Nodes Scheduled with Available Pods", status.get("numberAvailable", 0))
    doc.kv(0, "Number of Nodes Misscheduled", status.get("numberMisscheduled", 0))
    await _pods_status(session, doc, ds, spec.get("selector"))
    _pod_template(doc, spec.get("template"))
    _conditions(doc, status.get("conditions"), detailed=True)


def _unset(value: Any) -> Any:
    return "<unset>" if value is None else value


async def _describe_cron_job(session: Session, rt: ResourceType, cj: dict[str, Any], doc: Doc) -> None:
    spec, status = cj.get("spec") or {}, cj.get("status") or {}
    _header(doc, rt, cj, timestamp=False)
    doc.kv(0, "Schedule", spec.get("schedule", ""))
    if spec.get("timeZone"):
        doc.kv(0, "Time Zone", spec["timeZone"])
    doc.kv(0, "Concurrency Policy", spec.get("concurrencyPolicy") or "Allow")
    doc.kv(0, "Suspend", "True" if spec.get("suspend") else "False")
    doc.kv(0, "Successful Job History Limit", spec.get("successfulJobsHistoryLimit", 3))
    doc.kv(0, "Failed Job History Limit", spec.get("failedJobsHistoryLimit", 1))
    doc.kv(0, "Starting Deadline Seconds", _unset(spec.get("startingDeadlineSeconds")))
    job_spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    doc.kv(0, "Selector", selector_text(job_spec["selector"]) if job_spec.get("selector") else "<unset>")
    doc.kv(0, "Parallelism", _unset(job_spec.get("parallelism")))
    doc.kv(0, "Completions", _unset(job_spec.get("completions")))
    if job_spec.get("activeDeadlineSeconds") is not None:
        doc.kv(0, "Active Deadline Seconds", f"{job_spec['activeDeadlineSeconds']}s")
    _pod_template(doc, job_spec.get("template"))
    doc.kv(0, "Last Schedule Time", when(status["lastScheduleTime"]) if status.get("lastScheduleTime") else "<unset>")
    active = [ref.get("name", "") for ref in status.get("active") or []]
    if not active:
        # The Jobs it owns that are still running, as the status may lag.
        uid = meta(cj).get("uid", "")
        active = [meta(j).get("name", "") for j in await _list(session, "jobs.batch", meta(cj).get("namespace"))
                  if _owned_by(j, uid) and not _job_finished(j)]
    doc.kv(0, "Active Jobs", ", ".join(active) or "<none>")


def _job_finished(job: dict[str, Any]) -> bool:
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])
