"""Printers for StatefulSet, DaemonSet and ControllerRevision, as kube-apiserver prints them."""

from __future__ import annotations

from typing import Any

from gpufleet.apiserver.tables.core import (
    AGE_COLUMN,
    NAME_COLUMN,
    Column,
    Obj,
    _containers_cells,
    _format_labels,
    _int,
    _meta,
    _name,
    _spec,
    _status,
    _template_spec,
    age_cell,
    format_label_selector,
    register_printer,
)

_CONTAINERS = Column("Containers", priority=1, description="Names of each container in the template.")
_IMAGES = Column("Images", priority=1, description="Images referenced by each container in the template.")


def _statefulset_row(obj: Obj, now: float) -> list[Any]:
    names, images = _containers_cells(_template_spec(obj))
    ready = _int(_status(obj).get("readyReplicas"))
    return [_name(obj), f"{ready}/{_int(_spec(obj).get('replicas'), 1)}", age_cell(obj, now), names, images]


_STATEFULSET_COLUMNS = (
    NAME_COLUMN,
    Column("Ready", description="Number of the pod with ready state"),
    AGE_COLUMN,
    _CONTAINERS,
    _IMAGES,
)


def _daemonset_row(obj: Obj, now: float) -> list[Any]:
    status = _status(obj)
    names, images = _containers_cells(_template_spec(obj))
    return [
        _name(obj),
        _int(status.get("desiredNumberScheduled")),
        _int(status.get("currentNumberScheduled")),
        _int(status.get("numberReady")),
        _int(status.get("updatedNumberScheduled")),
        _int(status.get("numberAvailable")),
        _format_labels(_template_spec(obj).get("nodeSelector")),
        age_cell(obj, now),
        names,
        images,
        format_label_selector(_spec(obj).get("selector")),
    ]


_DAEMONSET_COLUMNS = (
    NAME_COLUMN,
    Column("Desired", type="integer", description="The total number of nodes that should be running the daemon "
                                                  "pod (including nodes correctly running the daemon pod)."),
    Column("Current", type="integer", description="The number of nodes that are running at least 1 daemon pod "
                                                  "and are supposed to run the daemon pod."),
    Column("Ready", type="integer", description="The number of nodes that should be running the daemon pod and "
                                                "have one or more of the daemon pod running with a Ready Condition."),
    Column("Up-to-date", type="integer", description="The total number of nodes that are running updated daemon "
                                                     "pod"),
    Column("Available", type="integer", description="The number of nodes that should be running the daemon pod "
                                                    "and have one or more of the daemon pod running and available "
                                                    "(ready for at least spec.minReadySeconds)"),
    Column("Node Selector", description="NodeSelector is a selector which must be true for the pod to fit on a "
                                        "node."),
    AGE_COLUMN,
    _CONTAINERS,
    _IMAGES,
    Column("Selector", priority=1, description="A label query over pods that are managed by the daemon set."),
)


def _controllerrevision_row(obj: Obj, now: float) -> list[Any]:
    controller = "<none>"
    for ref in _meta(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            group = (ref.get("apiVersion") or "").rpartition("/")[0]
            kind = f"{ref.get('kind', '')}.{group}" if group else ref.get("kind", "")
            controller = f"{kind.lower()}/{ref.get('name', '')}"
    return [_name(obj), controller, _int(obj.get("revision")), age_cell(obj, now)]


_CONTROLLERREVISION_COLUMNS = (
    NAME_COLUMN,
    Column("Controller", description="Controller of the object."),
    Column("Revision", type="integer", description="Revision indicates the revision of the state represented by "
                                                   "Data."),
    AGE_COLUMN,
)

for _kind, _columns, _row in (
    ("StatefulSet", _STATEFULSET_COLUMNS, _statefulset_row),
    ("DaemonSet", _DAEMONSET_COLUMNS, _daemonset_row),
    ("ControllerRevision", _CONTROLLERREVISION_COLUMNS, _controllerrevision_row),
):
    register_printer(_kind, _columns, _row, group="apps")
