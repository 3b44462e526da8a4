"""The Table machinery: columns, the printer registry, duration and cell helpers, and the
`meta.k8s.io/v1` Table itself (see the package docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.api.quantity import to_int_bytes
from gpufleet.api.registry import ResourceType
from gpufleet.utils.clock import parse_rfc3339

Obj = dict[str, Any]
RowFn = Callable[[Obj, float], list[Any]]


@dataclass(frozen=True)
class Column:
    name: str
    type: str = "string"
    format: str = ""
    description: str = ""
    priority: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


NAME_COLUMN = Column(
    "Name",
    format="name",
    description="Name must be unique within a namespace. Is required when creating resources, although "
    "some resources may allow a client to request the generation of an appropriate name automatically.",
)
AGE_COLUMN = Column(
    "Age",
    description="CreationTimestamp is a timestamp representing the server time when this object was created.",
)


@dataclass(frozen=True)
class Printer:
    columns: tuple[Column, ...]
    row: RowFn


# (group, kind) -> Printer. group None matches a kind of any group.
_PRINTERS: dict[tuple[str | None, str], Printer] = {}


def register_printer(
    kind: str,
    columns: Sequence[Column | dict[str, Any]],
    row_fn: RowFn,
    *,
    group: str | None = None,
) -> None:
    """Give `kind` its own `kubectl get` columns.

    row_fn(obj, now) returns one cell per column, in order (Name and Age included; use
    `age_cell` for the latter). Pass `group` when another group has a kind of the same name.
    """
    cols = tuple(c if isinstance(c, Column) else Column(**c) for c in columns)
    _PRINTERS[(group, kind)] = Printer(cols, row_fn)


def printer_for(rt: ResourceType) -> Printer:
    return _PRINTERS.get((rt.group, rt.kind)) or _PRINTERS.get((None, rt.kind)) or _DEFAULT_PRINTER


# --- durations and times -------------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration: about two significant figures ("3m20s", "2d3h", "3y12d")."""
    whole = int(seconds)  # truncates toward zero, like Go's int(d.Seconds())
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 60 * 2:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        s = whole % 60
        return f"{minutes}m" if s == 0 else f"{minutes}m{s}s"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


def _ts(value: Any) -> float | None:
    if not value:
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return parse_rfc3339(str(value))
    except ValueError:
        return None


def since(value: Any, now: float) -> str:
    """Time elapsed since an RFC 3339 timestamp, or "<unknown>" when there is none."""
    t = _ts(value)
    return "<unknown>" if t is None else human_duration(now - t)


def age_cell(obj: Obj, now: float) -> str:
    return since(_meta(obj).get("creationTimestamp"), now)


# --- small helpers -------------------------------------------------------------------------


def _meta(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _name(obj: Obj) -> str:
    return _meta(obj).get("name", "")


def _spec(obj: Obj) -> dict[str, Any]:
    return obj.get("spec") or {}


def _status(obj: Obj) -> dict[str, Any]:
    return obj.get("status") or {}


def _int(value: Any, default: int = 0) -> int:
    if value is None or isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _count(value: Any) -> int:
    """A count-like quantity (GPUs) as Kubernetes' Quantity.Value() gives it; 0 when absent or invalid."""
    if value is None or isinstance(value, bool):
        return 0
    try:
        return to_int_bytes(value)
    except (TypeError, ValueError):
        return 0


def _format_labels(labels: dict[str, str] | None) -> str:
    if not labels:
        return "<none>"
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


def format_label_selector(selector: dict[str, Any] | None) -> str:
    """metav1.FormatLabelSelector: requirements sorted by key, "<none>" when empty."""
    if not selector:
        return "<none>"
    reqs: list[tuple[str, str]] = []
    for k, v in (selector.get("matchLabels") or {}).items():
        reqs.append((k, f"{k}={v}"))
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key", ""), expr.get("operator", "")
        values = ",".join(sorted(expr.get("values") or []))
        if op == "In":
            reqs.append((key, f"{key} in ({values})"))
        elif op == "NotIn":
            reqs.append((key, f"{key} notin ({values})"))
        elif op == "Exists":
            reqs.append((key, key))
        elif op == "DoesNotExist":
            reqs.append((key, f"!{key}"))
        else:
            return "<error>"
    text = ",".join(r for _, r in sorted(reqs, key=lambda kv: kv[0]))
    return text or "<none>"


def _containers_cells(pod_spec: dict[str, Any] | None) -> tuple[str, str]:
    containers = (pod_spec or {}).get("containers") or []
    return (
        ",".join(c.get("name", "") for c in containers),
        ",".join(c.get("image", "") for c in containers),
    )


def _template_spec(obj: Obj) -> dict[str, Any]:
    return (_spec(obj).get("template") or {}).get("spec") or {}


def _true_condition(conditions: Iterable[dict[str, Any]] | None, ctype: str) -> bool:
    # Like kube-apiserver's hasJobCondition: the first condition of the type decides.
    for c in conditions or []:
        if c.get("type") == ctype:
            return c.get("status") == "True"
    return False


def _int_or_string(value: Any) -> str:
    return "N/A" if value is None else str(value)


def _quantity(value: Any) -> str:
    return "0" if value is None or value == "" else str(value)


_POD_SUCCEEDED_CONDITIONS = [
    {
        "type": "Completed",
        "status": "True",
        "reason": "Succeeded",
        "message": "The pod has completed successfully.",
    }
]
_POD_FAILED_CONDITIONS = [
    {"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."}
]


def _default_row(obj: Obj, now: float) -> list[Any]:
    return [_name(obj), age_cell(obj, now)]


_DEFAULT_PRINTER = Printer((NAME_COLUMN, AGE_COLUMN), _default_row)


# --- the Table -----------------------------------------------------------------------------

INCLUDE_OBJECT = ("None", "Metadata", "Object")


def _row_object(rt: ResourceType, obj: Obj, include_object: str) -> dict[str, Any] | None:
    if include_object == "None":
        return None
    if include_object == "Object":
        return {"apiVersion": rt.api_version, "kind": rt.kind, **obj}
    # managedFields can dwarf the rest of the row and no Table reader uses them.
    meta = {k: v for k, v in _meta(obj).items() if k != "managedFields"}
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}


def _row(rt: ResourceType, printer: Printer, obj: Obj, now: float, include_object: str) -> dict[str, Any]:
    row: dict[str, Any] = {"cells": printer.row(obj, now)}
    if rt.group == "" and rt.kind == "Pod":
        phase = _status(obj).get("phase")
        if phase == "Succeeded":
            row["conditions"] = _POD_SUCCEEDED_CONDITIONS
        elif phase == "Failed":
            row["conditions"] = _POD_FAILED_CONDITIONS
    ro = _row_object(rt, obj, include_object)
    if ro is not None:
        row["object"] = ro
    return row


def to_table(
    rt: ResourceType,
    objects: Iterable[Obj],
    *,
    resource_version: str,
    continue_token: str | None = None,
    now: float,
    include_object: str = "Metadata",
    include_columns: bool = True,
    printer: Printer | None = None,
) -> dict[str, Any]:
    """The `meta.k8s.io/v1` Table of `objects` (all of kind `rt`), as kubectl's `get` wants it.

    include_object is the `includeObject` query parameter: "Metadata" (kubectl's default:
    PartialObjectMetadata, which carries the namespace and labels kubectl prints for -A and
    --show-labels), "Object" (the whole object) or "None".
    """
    if include_object not in INCLUDE_OBJECT:
        raise ValueError(f"includeObject must be one of {', '.join(INCLUDE_OBJECT)}, not {include_object!r}")
    printer = printer or printer_for(rt)  # a custom resource brings its CRD's columns
    metadata: dict[str, Any] = {"resourceVersion": resource_version}
    if continue_token:
        metadata["continue"] = continue_token
    table: dict[str, Any] = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata}
    if include_columns:
        table["columnDefinitions"] = [c.to_dict() for c in printer.columns]
    table["rows"] = [_row(rt, printer, o, now, include_object) for o in objects]
    return table


def watch_event_table(
    rt: ResourceType,
    obj: Obj,
    *,
    now: float,
    include_object: str = "Metadata",
    include_columns: bool = True,
) -> dict[str, Any]:
    """The one-row Table that is the `object` of a watch event for `kubectl get -w`.

    kubectl takes its header from the list that preceded the watch and accepts the column
    definitions in every event or in none; they are sent by default.
    """
    return to_table(
        rt,
        [obj],
        resource_version=str(_meta(obj).get("resourceVersion", "")),
        now=now,
        include_object=include_object,
        include_columns=include_columns,
    )
