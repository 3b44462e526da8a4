"""Event as events.k8s.io/v1 serves it: the same objects as core v1 Events, another shape.

Events are stored as core v1 (gpufleet.api.k8s.Event); this version is a view of them,
converted both ways as Kubernetes does (pkg/apis/events/v1/conversion.go):
``regarding`` <-> ``involvedObject``, ``note`` <-> ``message``, ``reportingController`` <->
``reportingComponent``, and the core fields that events.k8s.io/v1 keeps only for old
readers: ``deprecatedSource`` <-> ``source``, ``deprecatedFirstTimestamp`` <->
``firstTimestamp``, ``deprecatedLastTimestamp`` <-> ``lastTimestamp``, ``deprecatedCount``
<-> ``count``. eventTime, series, action, reason, related, type and reportingInstance are the
same in both. A field selector of this version names the fields of its own shape
(``regarding.name``, ``reportingController``), mapped to the stored ones.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

from pydantic import Field

from gpufleet.api.conversion import Conversion
from gpufleet.api.k8s import EventSeries, EventSource, K8sModel, ListMeta, ObjectMeta, ObjectReference, Time

GROUP = "events.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"

# events.k8s.io/v1 field -> core v1 field; the others are the same in both.
_RENAMED = {
    "regarding": "involvedObject",
    "note": "message",
    "reportingController": "reportingComponent",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
}
_TO_V1 = {core: v1 for v1, core in _RENAMED.items()}
# Field labels of this version, as the stored Events' (AddFieldLabelConversionsForEvent).
_FIELD_LABELS = {
    "reason": "reason", "reportingController": "reportingComponent", "source": "source", "type": "type",
    "metadata.namespace": "metadata.namespace", "metadata.name": "metadata.name",
    **{f"regarding.{f}": f"involvedObject.{f}"
       for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")},
}


class EventV1(K8sModel):
    """Event is a report of an event somewhere in the cluster (events.k8s.io/v1): it
    describes what happened (reason, note), to what (regarding), and who saw it
    (reportingController, reportingInstance)."""

    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "Event"

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    event_time: Time | None = Field(default=None, alias="eventTime",
                                    description="The time when this Event was first observed.")
    series: EventSeries | None = None
    reporting_controller: str | None = Field(default=None, alias="reportingController",
                                             description="The controller that emitted this Event, e.g. "
                                                         "`kubernetes.io/kubelet`.")
    reporting_instance: str | None = Field(default=None, alias="reportingInstance",
                                           description="The ID of the controller instance, e.g. `kubelet-xyzf`.")
    action: str | None = Field(default=None, description="What action was taken/failed regarding the object.")
    reason: str | None = Field(default=None, description="Why the action was taken, in a short machine form.")
    regarding: ObjectReference | None = Field(default=None, description="The object this Event is about.")
    related: ObjectReference | None = None
    note: str | None = Field(default=None, description="A human-readable description of the status of this "
                                                       "operation.")
    type: str | None = Field(default=None, description="Normal or Warning.")
    deprecated_source: EventSource | None = Field(default=None, alias="deprecatedSource")
    deprecated_first_timestamp: Time | None = Field(default=None, alias="deprecatedFirstTimestamp")
    deprecated_last_timestamp: Time | None = Field(default=None, alias="deprecatedLastTimestamp")
    deprecated_count: int | None = Field(default=None, alias="deprecatedCount")


class EventListV1(K8sModel):
    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "EventList"

    api_version: str | None = Field(default=None, alias="apiVersion")
    items: list[EventV1]
    kind: str | None = None
    metadata: ListMeta | None = None


def to_core(obj: dict[str, Any]) -> dict[str, Any]:
    """An events.k8s.io/v1 Event as the stored core v1 Event."""
    out = {_RENAMED.get(k, k): copy.deepcopy(v) for k, v in obj.items() if k not in _TO_V1}
    out["apiVersion"] = "v1"
    out.setdefault("kind", "Event")
    return out


def from_core(obj: dict[str, Any]) -> dict[str, Any]:
    """A stored core v1 Event as events.k8s.io/v1 shows it."""
    out = {_TO_V1.get(k, k): copy.deepcopy(v) for k, v in obj.items() if k not in _RENAMED}
    out["apiVersion"] = API_VERSION
    return out


def core_field_path(field: str, _core: dict[str, Any]) -> str:
    head, dot, rest = (field or "").partition(".")
    return _TO_V1.get(head, head) + dot + rest


def core_field_label(label: str) -> str | None:
    """The stored Events' field label for one of this version's (None: not supported)."""
    return _FIELD_LABELS.get(label)


EVENT_V1 = Conversion(to_storage=to_core, from_storage=from_core, field_path=core_field_path,
                      field_label=core_field_label)
