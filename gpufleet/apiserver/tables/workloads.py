"""Printers for workload kinds: Deployment, ReplicaSet and Job.
"""

from __future__ import annotations

from typing import Any

from gpufleet.apiserver.tables.core import (
    AGE_COLUMN,
    NAME_COLUMN,
    Column,
    Obj,
    _containers_cells,
    _int,
    _meta,
    _name,
    _spec,
    _status,
    _template_spec,
    _true_condition,
    _ts,
    age_cell,
    format_label_selector,
    human_duration,
)

# --- workloads -----------------------------------------------------------------------------

_CONTAINERS_COLUMN = Column("Containers", priority=1, description="Names of each container in the template.")
_IMAGES_COLUMN = Column(
    "Images", priority=1, description="Images referenced by each container in the template."
)
_SELECTOR_COLUMN = Column("Selector", priority=1, description="Label selector of the pods it manages.")


def _desired_replicas(obj: Obj) -> int:
    # An unset spec.replicas is defaulted to 1 on create; stay right for objects that skipped it.
    return _int(_spec(obj).get("replicas"), 1)


def _template_cells(obj: Obj, now: float) -> list[Any]:
    """The Age cell and the wide cells every workload row ends with: containers, images, selector."""
    names, images = _containers_cells(_template_spec(obj))
    return [age_cell(obj, now), names, images, format_label_selector(_spec(obj).get("selector"))]


def _deployment_row(obj: Obj, now: float) -> list[Any]:
    status = _status(obj)
    return [
        _name(obj),
        f"{_int(status.get('readyReplicas'))}/{_desired_replicas(obj)}",
        _int(status.get("updatedReplicas")),
        _int(status.get("availableReplicas")),
        *_template_cells(obj, now),
    ]


_DEPLOYMENT_COLUMNS = (
    NAME_COLUMN,
    Column("Ready", description="Number of the pod with ready state"),
    Column("Up-to-date", type="integer", description="Total number of pods running the latest template."),
    Column(
        "Available", type="integer", description="Total number of available pods (ready for minReadySeconds)."
    ),
    AGE_COLUMN,
    _CONTAINERS_COLUMN,
    _IMAGES_COLUMN,
    _SELECTOR_COLUMN,
)


def _replicaset_row(obj: Obj, now: float) -> list[Any]:
    status = _status(obj)
    return [
        _name(obj),
        _desired_replicas(obj),
        _int(status.get("replicas")),
        _int(status.get("readyReplicas")),
        *_template_cells(obj, now),
    ]


_REPLICASET_COLUMNS = (
    NAME_COLUMN,
    Column("Desired", type="integer", description="Number of desired pods."),
    Column("Current", type="integer", description="The most recently observed number of replicas."),
    Column(
        "Ready",
        type="integer",
        description="The number of pods targeted by this ReplicaSet with a Ready Condition.",
    ),
    AGE_COLUMN,
    _CONTAINERS_COLUMN,
    _IMAGES_COLUMN,
    _SELECTOR_COLUMN,
)


def job_status(obj: Obj) -> str:
    conds = _status(obj).get("conditions")
    if _true_condition(conds, "Complete"):
        return "Complete"
    if _true_condition(conds, "Failed"):
        return "Failed"
    if _meta(obj).get("deletionTimestamp"):
        return "Terminating"
    if _true_condition(conds, "Suspended"):
        return "Suspended"
    if _true_condition(conds, "FailureTarget"):
        return "FailureTarget"
    return "Running"


def _job_row(obj: Obj, now: float) -> list[Any]:
    spec, status = _spec(obj), _status(obj)
    succeeded = _int(status.get("succeeded"))
    if spec.get("completions") is not None:
        completions = f"{succeeded}/{_int(spec.get('completions'))}"
    elif _int(spec.get("parallelism")) > 1:
        completions = f"{succeeded}/1 of {_int(spec.get('parallelism'))}"
    else:
        completions = f"{succeeded}/1"
    start, end = _ts(status.get("startTime")), _ts(status.get("completionTime"))
    if start is None:
        duration = ""
    elif end is None:
        duration = human_duration(now - start)
    else:
        duration = human_duration(end - start)
    return [
        _name(obj),
        job_status(obj),
        completions,
        duration,
        *_template_cells(obj, now),
    ]


_JOB_COLUMNS = (
    NAME_COLUMN,
    Column("Status", description="Status of the job."),
    Column("Completions", description="The number of pods which reached phase Succeeded, of those wanted."),
    Column("Duration", description="Time required to complete the job."),
    AGE_COLUMN,
    _CONTAINERS_COLUMN,
    _IMAGES_COLUMN,
    _SELECTOR_COLUMN,
)
