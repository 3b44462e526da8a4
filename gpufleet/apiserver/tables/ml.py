"""Printers for the ML kinds (PodGroup, PyTorchJob, Volcano's Job, PodGroup and Queue,
RayCluster, RayJob, RayService): their columns come from the kind's own module in gpufleet.api.
"""

from __future__ import annotations

from typing import Any

from gpufleet.apiserver.tables.core import (
    AGE_COLUMN,
    NAME_COLUMN,
    Column,
    Obj,
    _name,
    age_cell,
    register_printer,
)


def _podgroup_row(obj: Obj, now: float) -> list[Any]:
    from gpufleet.api import podgroup

    return [_name(obj), *podgroup.printer_cells(obj), age_cell(obj, now)]


def _register_podgroup_printer() -> None:
    from gpufleet.api import podgroup

    columns = (NAME_COLUMN, *(Column(**c) for c in podgroup.PRINTER_COLUMNS), AGE_COLUMN)
    register_printer("PodGroup", columns, _podgroup_row, group=podgroup.GROUP)


_register_podgroup_printer()


def _pytorchjob_row(obj: Obj, now: float) -> list[Any]:
    from gpufleet.api import kubeflow

    return [_name(obj), *kubeflow.printer_cells(obj), age_cell(obj, now)]


def _register_pytorchjob_printer() -> None:
    from gpufleet.api import kubeflow

    columns = (NAME_COLUMN, *(Column(**c) for c in kubeflow.PRINTER_COLUMNS), AGE_COLUMN)
    register_printer(kubeflow.KIND, columns, _pytorchjob_row, group=kubeflow.GROUP)


_register_pytorchjob_printer()


def _register_volcano_printers() -> None:
    from gpufleet.api import volcano as vc

    def columns(cols: tuple[dict[str, Any], ...], wide: tuple[dict[str, Any], ...] = ()) -> tuple[Column, ...]:
        return (NAME_COLUMN, *(Column(**c) for c in cols), AGE_COLUMN, *(Column(**c) for c in wide))

    def row(cells: Any, wide: Any = None) -> Any:
        return lambda obj, now: [_name(obj), *cells(obj), age_cell(obj, now), *(wide(obj) if wide else ())]

    register_printer("Job", columns(vc.JOB_PRINTER_COLUMNS, vc.JOB_WIDE_COLUMNS),
                     row(vc.job_printer_cells, vc.job_wide_cells), group=vc.BATCH_GROUP)
    register_printer("PodGroup", columns(vc.PODGROUP_PRINTER_COLUMNS, vc.PODGROUP_WIDE_COLUMNS),
                     row(vc.podgroup_printer_cells, vc.podgroup_wide_cells), group=vc.SCHEDULING_GROUP)
    register_printer("Queue", columns(vc.QUEUE_PRINTER_COLUMNS), row(vc.queue_printer_cells),
                     group=vc.SCHEDULING_GROUP)


_register_volcano_printers()
def _raycluster_row(obj: Obj, now: float) -> list[Any]:
    from gpufleet.api import ray

    return [_name(obj), *ray.cluster_printer_cells(obj), age_cell(obj, now), *ray.cluster_wide_cells(obj)]


def _rayjob_row(obj: Obj, now: float) -> list[Any]:
    from gpufleet.api import ray

    return [_name(obj), *ray.job_printer_cells(obj), age_cell(obj, now)]


def _register_ray_printers() -> None:
    from gpufleet.api import ray

    columns = (NAME_COLUMN, *(Column(**c) for c in ray.CLUSTER_PRINTER_COLUMNS), AGE_COLUMN,
               *(Column(**c) for c in ray.CLUSTER_WIDE_COLUMNS))
    register_printer(ray.CLUSTER_KIND, columns, _raycluster_row, group=ray.GROUP)
    columns = (NAME_COLUMN, *(Column(**c) for c in ray.JOB_PRINTER_COLUMNS), AGE_COLUMN)
    register_printer(ray.JOB_KIND, columns, _rayjob_row, group=ray.GROUP)


_register_ray_printers()


def _rayservice_row(obj: Obj, now: float) -> list[Any]:
    from gpufleet.api import rayservice

    return [_name(obj), *rayservice.printer_cells(obj)]


def _register_rayservice_printer() -> None:
    from gpufleet.api import ray, rayservice

    # KubeRay's CRD names its columns and no Age (kubectl shows what the CRD names).
    columns = (NAME_COLUMN, *(Column(**c) for c in rayservice.PRINTER_COLUMNS))
    register_printer(rayservice.KIND, columns, _rayservice_row, group=ray.GROUP)


_register_rayservice_printer()
