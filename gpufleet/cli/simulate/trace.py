"""Job traces for `gpufleet simulate`: Muri's Philly CSV and a generic CSV or JSON.

Muri's format (the traces published with the Muri simulator, from Microsoft's Philly
cluster) has a header naming at least ``job_id, num_gpu, submit_time, iterations,
iteration_time``; times are in milliseconds. A job runs ``iterations x iteration_time``.

The generic format is a CSV with a header, or JSON (a list of objects, or ``{"jobs": [...]}``),
one job per row, times in seconds:

    name          optional; default job-<row>
    submit_time   seconds from the start of the trace
    gpus          GPUs the job needs (more than 8 become several pods of 8)
    duration      seconds of work, or:
    steps + step_time   the number of steps and the seconds one step takes
    team          optional: the LocalQueue (and ClusterQueue) the job is submitted to
    priority      optional integer, higher first under the priority policy
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file, row and field."""


@dataclass(frozen=True)
class TraceJob:
    name: str
    submit: float  # seconds from the start of the trace
    gpus: int
    duration: float  # seconds of work, on the job's GPUs
    steps: int | None = None
    team: str = ""
    priority: int = 0

    @property
    def step_time(self) -> float | None:
        return self.duration / self.steps if self.steps else None


MURI_COLUMNS = ("job_id", "num_gpu", "submit_time", "iterations", "iteration_time")


def read_trace(path: str | Path, limit: int | None = None) -> list[TraceJob]:
    """The jobs of a trace file, in submit order (at most ``limit``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TraceError(f"{p}: cannot read the trace: {exc.strerror or exc}") from None
    if p.suffix.lower() == ".json" or text.lstrip().startswith(("[", "{")):
        rows = _json_rows(p, text)
    else:
        rows = list(csv.DictReader(text.splitlines()))
        if not rows:
            raise TraceError(f"{p}: no jobs (a CSV with a header row and one row per job is expected)")
    muri = all(c in rows[0] for c in MURI_COLUMNS)
    jobs = [(_muri_job if muri else _generic_job)(p, i, row) for i, row in enumerate(rows)]
    jobs.sort(key=lambda j: (j.submit, j.name))
    names = set()
    for j in jobs:
        if j.name in names:
            raise TraceError(f"{p}: two jobs are named {j.name!r}: names must be unique")
        names.add(j.name)
    return jobs[:limit] if limit is not None else jobs


def _json_rows(p: Path, text: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{p}: not valid JSON: {exc}") from None
    if isinstance(data, dict):
        data = data.get("jobs")
    if not isinstance(data, list) or not data or not all(isinstance(r, dict) for r in data):
        raise TraceError(f"{p}: JSON traces are a non-empty list of job objects, or {{\"jobs\": [...]}}")
    return data


def _number(p: Path, i: int, row: dict[str, Any], key: str, *, integer: bool = False,
            required: bool = True, positive: bool = False) -> Any:
    raw = row.get(key)
    if raw is None or raw == "":
        if required:
            raise TraceError(f"{p}: row {i + 1}: field {key!r} is missing")
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise TraceError(f"{p}: row {i + 1}: field {key!r}={raw!r} is not a number") from None
    if value < 0 or (positive and value == 0):
        raise TraceError(f"{p}: row {i + 1}: field {key!r}={raw!r} must be {'positive' if positive else '0 or more'}")
    if integer:
        if value != int(value):
            raise TraceError(f"{p}: row {i + 1}: field {key!r}={raw!r} must be a whole number")
        return int(value)
    return value


def _muri_job(p: Path, i: int, row: dict[str, Any]) -> TraceJob:
    steps = _number(p, i, row, "iterations", integer=True, positive=True)
    step_ms = _number(p, i, row, "iteration_time", positive=True)
    priority = _number(p, i, row, "priority", required=False)
    return TraceJob(
        name=f"job-{int(_number(p, i, row, 'job_id', integer=True))}",
        submit=_number(p, i, row, "submit_time") / 1000.0,
        gpus=_number(p, i, row, "num_gpu", integer=True, positive=True),
        duration=steps * step_ms / 1000.0,
        steps=steps,
        priority=int(priority or 0),
    )


def _generic_job(p: Path, i: int, row: dict[str, Any]) -> TraceJob:
    steps = _number(p, i, row, "steps", integer=True, required=False, positive=True)
    duration = _number(p, i, row, "duration", required=False, positive=True)
    if duration is None:
        if steps is None:
            raise TraceError(f"{p}: row {i + 1}: give 'duration' (seconds), or 'steps' and 'step_time'")
        duration = steps * _number(p, i, row, "step_time", positive=True)
    gpus = row.get("gpus", row.get("num_gpu"))
    if gpus is None:
        raise TraceError(f"{p}: row {i + 1}: field 'gpus' is missing")
    name = str(row.get("name") or f"job-{i}")
    return TraceJob(
        name=name,
        submit=_number(p, i, row, "submit_time"),
        gpus=_number(p, i, {"gpus": gpus}, "gpus", integer=True, positive=True),
        duration=duration,
        steps=steps,
        team=str(row.get("team") or ""),
        priority=int(_number(p, i, row, "priority", integer=True, required=False) or 0),
    )
