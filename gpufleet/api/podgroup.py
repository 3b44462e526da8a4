"""PodGroup (scheduling.x-k8s.io/v1alpha1), the gang of kubernetes-sigs/scheduler-plugins'
coscheduling plugin: pods labelled ``scheduling.x-k8s.io/pod-group: <name>`` are placed
all together (at least ``spec.minMember`` of them) or not at all.

The shape is upstream's (apis/scheduling/v1alpha1/types.go), so a manifest written for a
cluster running the coscheduling plugin applies here unchanged. Importing this module
registers the kind's validation; the API server's table printer reads ``PRINTER_COLUMNS``
and ``printer_cells``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from gpufleet.api import validation as v
from gpufleet.api.intorstring import IntOrStringQuantity
from gpufleet.api.k8s import K8sModel, ListMeta, ObjectMeta, Time
from gpufleet.api.quantity import parse_quantity

GROUP = "scheduling.x-k8s.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# The label that makes a pod a member of the PodGroup of that name (same namespace).
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"

# Upstream's PodGroupPhase values.
PENDING = "Pending"
PRE_SCHEDULING = "PreScheduling"
SCHEDULING = "Scheduling"
SCHEDULED = "Scheduled"
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
FINISHED = "Finished"
UNKNOWN = "Unknown"
PHASES = (PENDING, PRE_SCHEDULING, SCHEDULING, SCHEDULED, RUNNING, SUCCEEDED, FAILED, FINISHED, UNKNOWN)

# What the scheduler waits for missing members when spec.scheduleTimeoutSeconds is unset
# (the coscheduling plugin's default permitWaitingTimeSeconds).
DEFAULT_SCHEDULE_TIMEOUT_SECONDS = 60


class PodGroupSpec(K8sModel):
    """How many members must be placed together, and how long to wait for them."""

    min_member: int | None = Field(
        default=None, alias="minMember",
        description="The fewest members that must fit at once; none is bound until that many are placed.")
    min_resources: dict[str, IntOrStringQuantity] | None = Field(
        default=None, alias="minResources",
        description="The resources the group needs in all before any member is placed.")
    schedule_timeout_seconds: int | None = Field(
        default=None, alias="scheduleTimeoutSeconds",
        description="How long placed members wait for the rest before their reservations are released "
                    "(60 when unset).")


class PodGroupStatus(K8sModel):
    """What the scheduler saw of the group's members."""

    phase: str | None = None
    occupied_by: str | None = Field(default=None, alias="occupiedBy")
    scheduled: int | None = None
    running: int | None = None
    succeeded: int | None = None
    failed: int | None = None
    schedule_start_time: Time | None = Field(default=None, alias="scheduleStartTime")


class PodGroup(K8sModel):
    """A collection of pods scheduled all together (gang scheduling)."""

    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "PodGroup"

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: PodGroupSpec | None = None
    status: PodGroupStatus | None = None


class PodGroupList(K8sModel):
    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "PodGroupList"

    api_version: str | None = Field(default=None, alias="apiVersion")
    items: list[PodGroup]
    kind: str | None = None
    metadata: ListMeta | None = None


def min_member(pg: PodGroup) -> int:
    """spec.minMember, at least 1 (validation refuses less; a stored object predates it)."""
    value = pg.spec.min_member if pg.spec is not None else None
    return max(1, value or 1)


def schedule_timeout(pg: PodGroup) -> int:
    value = pg.spec.schedule_timeout_seconds if pg.spec is not None else None
    return value if value and value > 0 else DEFAULT_SCHEDULE_TIMEOUT_SECONDS


# Volcano's: the annotation that makes a pod a member of a scheduling.volcano.sh PodGroup
# (api/volcano.py), placed by the same gang cycle.
VOLCANO_GROUP_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")


def group_name(labels: dict[str, str] | None, annotations: dict[str, str] | None) -> str | None:
    """The name of the gang a pod's labels or annotations make it a member of: the
    ``scheduling.x-k8s.io/pod-group`` label, else Volcano's ``scheduling.k8s.io/group-name``
    annotation; None for neither."""
    name = (labels or {}).get(POD_GROUP_LABEL)
    if name:
        return name
    for key in VOLCANO_GROUP_ANNOTATIONS:
        if (annotations or {}).get(key):
            return (annotations or {})[key]
    return None


def group_of(pod: Any) -> str | None:
    """The gang a pod (a typed model) is a member of, as 'namespace/name' (``group_name``);
    None when it is a member of none."""
    meta = pod.metadata if pod.metadata is not None else ObjectMeta()
    name = group_name(meta.labels, meta.annotations)
    return f"{meta.namespace or ''}/{name}" if name else None


# -- validation ---------------------------------------------------------------------------


def _validate(pg: PodGroup, errs: list[v.FieldError]) -> None:
    v.validate_object_meta(pg.metadata, errs)
    spec = pg.spec
    if spec is None or spec.min_member is None:
        errs.append(v.required("spec.minMember", "the number of members to place together, at least 1"))
    elif spec.min_member < 1:
        errs.append(v.invalid("spec.minMember", spec.min_member, "must be greater than or equal to 1"))
    if spec is not None:
        if spec.schedule_timeout_seconds is not None and spec.schedule_timeout_seconds < 0:
            errs.append(
                v.invalid(
                    "spec.scheduleTimeoutSeconds",
                    spec.schedule_timeout_seconds,
                    "must be greater than or equal to 0 (0 means the default of "
                    f"{DEFAULT_SCHEDULE_TIMEOUT_SECONDS}s)",
                )
            )
        for name, quantity in (spec.min_resources or {}).items():
            path = f"spec.minResources[{name}]"
            try:
                amount = parse_quantity(quantity)
            except ValueError:
                errs.append(v.invalid(path, quantity, "must be a quantity such as 8, 500m or 16Gi"))
                continue
            if amount < 0:
                errs.append(v.invalid(path, v.Unquoted(str(quantity)), "must be non-negative"))
    status = pg.status
    if status is not None:
        if status.phase is not None and status.phase not in PHASES:
            errs.append(v.not_supported("status.phase", status.phase, PHASES))
        for attr in ("scheduled", "running", "succeeded", "failed"):
            value = getattr(status, attr)
            if value is not None and value < 0:
                errs.append(v.invalid(f"status.{attr}", value, "must be greater than or equal to 0"))


v.register_validator(PodGroup, _validate)


# -- printing ------------------------------------------------------------------------------

# Between NAME and AGE, as `kubectl get podgroups` shows them.
PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Phase", "description": "Current phase of the PodGroup."},
    {"name": "MinMember", "type": "integer", "description": "Members that must be placed together."},
    {"name": "Scheduled", "type": "integer", "description": "Members bound to a node."},
    {"name": "Running", "type": "integer", "description": "Members running."},
)


def printer_cells(obj: dict[str, Any]) -> list[Any]:
    """The cells of PRINTER_COLUMNS for a PodGroup as a plain dict."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return [
        status.get("phase") or PENDING,
        int(spec.get("minMember") or 0),
        int(status.get("scheduled") or 0),
        int(status.get("running") or 0),
    ]
