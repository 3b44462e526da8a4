"""The CronJob printer (kube-apiserver's printCronJob)."""

from __future__ import annotations

from typing import Any

from gpufleet.apiserver.tables.core import (
    AGE_COLUMN,
    NAME_COLUMN,
    Column,
    Obj,
    _containers_cells,
    _name,
    _spec,
    _status,
    age_cell,
    format_label_selector,
    register_printer,
    since,
)


def _bool_cell(value: Any) -> str:
    return "<unset>" if value is None else ("True" if value else "False")


def _cron_job_row(obj: Obj, now: float) -> list[Any]:
    spec, status = _spec(obj), _status(obj)
    last = status.get("lastScheduleTime")
    job_spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    names, images = _containers_cells((job_spec.get("template") or {}).get("spec"))
    return [
        _name(obj),
        spec.get("schedule", ""),
        spec.get("timeZone") if spec.get("timeZone") is not None else "<none>",
        _bool_cell(spec.get("suspend")),
        len(status.get("active") or []),
        since(last, now) if last else "<none>",
        age_cell(obj, now),
        names,
        images,
        format_label_selector(job_spec.get("selector")),
    ]


_CRON_JOB_COLUMNS = (
    NAME_COLUMN,
    Column("Schedule", description="The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron."),
    Column("Timezone", description="The time zone name for the given schedule."),
    Column("Suspend", type="boolean", description="Whether subsequent executions are suspended."),
    Column("Active", type="integer", description="A list of pointers to currently running jobs."),
    Column("Last Schedule", description="Information when was the last time the job was successfully scheduled."),
    AGE_COLUMN,
    Column("Containers", priority=1, description="Names of each container in the template."),
    Column("Images", priority=1, description="Images referenced by each container in the template."),
    Column("Selector", priority=1, description="A label query over pods that should match the pod count."),
)

register_printer("CronJob", _CRON_JOB_COLUMNS, _cron_job_row, group="batch")
