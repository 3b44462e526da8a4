"""managedFields entries: decoding, encoding, capping and tracking updates.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpufleet.apiserver.managedfields.common import (
    ANCIENT_CHANGES_MANAGER,
    APPLY,
    FIELDS_V1,
    MAX_UPDATE_MANAGERS,
    UPDATE,
    FieldPath,
    FieldSet,
    ManagedFieldsError,
    _quote,
)
from gpufleet.apiserver.managedfields.fieldsets import (
    from_fields_v1,
    to_fields_v1,
)
from gpufleet.apiserver.managedfields.merge import _compare_objects, _Comparison
from gpufleet.apiserver.patch.common import copy_json

# The strategic-merge schema: the same merge keys decide how lists are owned.

# --------------------------------------------------------------------------- entries

# Never owned: set by the server, or naming the object rather than its content.
_STRIPPED: frozenset[FieldPath] = frozenset(
    {("f:apiVersion",), ("f:kind",), ("f:metadata",)}
    | {
        ("f:metadata", "f:" + name)
        for name in (
            "name",
            "namespace",
            "creationTimestamp",
            "selfLink",
            "uid",
            "clusterName",
            "generation",
            "managedFields",
            "resourceVersion",
        )
    }
)


def _strip(fields: Iterable[FieldPath]) -> FieldSet:
    return frozenset(p for p in fields if p not in _STRIPPED and p[:2] != ("f:metadata", "f:managedFields"))


def _scope(subresource: str, ignore_status: bool) -> Callable[[FieldPath], bool]:
    """Which fields a write through this endpoint can own: /status owns status only; the
    main resource of a kind whose status is a subresource owns everything but status."""
    if subresource == "status":
        return lambda p: p[:1] == ("f:status",)
    if ignore_status:
        return lambda p: p[:1] != ("f:status",)
    return lambda p: True


_Identity = tuple[str, str, str, str]  # manager, operation, apiVersion (updates only), subresource


@dataclass(frozen=True, slots=True)
class _Entry:
    manager: str
    operation: str
    api_version: str
    time: str | None
    fields: FieldSet
    subresource: str = ""

    @property
    def identity(self) -> _Identity:
        version = self.api_version if self.operation == UPDATE else ""
        return (self.manager, self.operation, version, self.subresource)


def _identity_json(identity: _Identity) -> str:
    # kube-apiserver's manager identifier: the entry's JSON without fields and time.
    manager, operation, version, subresource = identity
    out: dict[str, str] = {"manager": manager, "operation": operation}
    if version:
        out["apiVersion"] = version
    if subresource:
        out["subresource"] = subresource
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


def _label(identity: _Identity) -> str:
    manager, operation, version, subresource = identity
    label = _quote(manager)
    if subresource:
        label += f" with subresource {_quote(subresource)}"
    if operation == UPDATE:
        label += f" using {version}"
    return label


def is_reset(managed_fields: Any) -> bool:
    """Whether client-sent managedFields ask for a reset: an empty list, or one empty entry."""
    if not isinstance(managed_fields, list):
        return False
    if not managed_fields:
        return True
    only = managed_fields[0]
    return (
        len(managed_fields) == 1 and isinstance(only, Mapping) and all(v in (None, "") for v in only.values())
    )


def _decode(managed_fields: Any) -> dict[_Identity, _Entry]:
    if managed_fields is None:
        return {}
    if not isinstance(managed_fields, list):
        raise ManagedFieldsError("metadata.managedFields must be a list")
    entries: dict[_Identity, _Entry] = {}
    for index, raw in enumerate(managed_fields):
        if not isinstance(raw, Mapping):
            raise ManagedFieldsError(f"managed fields entry {index} must be an object")
        operation = raw.get("operation")
        if operation not in (APPLY, UPDATE):
            raise ManagedFieldsError("operation must be `Apply` or `Update`")
        version = raw.get("apiVersion")
        if not isinstance(version, str) or not version:
            raise ManagedFieldsError("apiVersion must not be empty")
        fields_type = raw.get("fieldsType")
        if not fields_type:
            raise ManagedFieldsError(f"missing fieldsType in managed fields entry {index}")
        if fields_type != FIELDS_V1:
            raise ManagedFieldsError(f"invalid fieldsType {fields_type!r} in managed fields entry {index}")
        manager, subresource, time = raw.get("manager") or "", raw.get("subresource") or "", raw.get("time")
        if not all(isinstance(v, str) for v in (manager, subresource)) or not isinstance(time, str | None):
            raise ManagedFieldsError(f"managed fields entry {index} has a field of the wrong type")
        fields_v1 = raw.get("fieldsV1")
        fields = from_fields_v1(fields_v1) if fields_v1 is not None else frozenset()
        entry = _Entry(manager, operation, version, time, fields, subresource)
        entries[entry.identity] = entry
    return entries


def _decode_or_empty(managed_fields: Any) -> dict[_Identity, _Entry]:
    try:
        return _decode(managed_fields)
    except ManagedFieldsError:
        return {}


def _cap_updates(entries: dict[_Identity, _Entry]) -> None:
    """Fold the oldest update entries into one ``ancient-changes`` entry per apiVersion
    until at most :data:`MAX_UPDATE_MANAGERS` remain."""
    updaters = [i for i, e in entries.items() if e.operation == UPDATE]
    if len(updaters) <= MAX_UPDATE_MANAGERS:
        return
    updaters.sort(key=lambda i: (entries[i].time or "", _identity_json(i)))
    remaining = len(updaters)
    first_of_version: dict[str, _Identity] = {}
    for identity in updaters:
        if remaining <= MAX_UPDATE_MANAGERS:
            break
        entry = entries[identity]
        version = entry.api_version
        if version not in first_of_version:
            first_of_version[version] = identity
            continue
        bucket = (ANCIENT_CHANGES_MANAGER, UPDATE, version, "")
        if identity == bucket:
            continue
        if bucket not in entries:
            first = entries.pop(first_of_version[version])
            entries[bucket] = replace(first, manager=ANCIENT_CHANGES_MANAGER, subresource="")
        merged = entries[bucket]
        entries[bucket] = replace(merged, fields=merged.fields | entry.fields, time=entry.time)
        del entries[identity]
        remaining -= 1


def _encode(entries: Mapping[_Identity, _Entry]) -> list[dict[str, Any]]:
    ordered = sorted(
        entries.values(),
        key=lambda e: (e.operation, e.time or "", e.manager, e.api_version, e.subresource),
    )
    out: list[dict[str, Any]] = []
    for e in ordered:
        raw: dict[str, Any] = {"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version}
        if e.time:
            raw["time"] = e.time
        raw["fieldsType"] = FIELDS_V1
        raw["fieldsV1"] = to_fields_v1(e.fields)
        if e.subresource:
            raw["subresource"] = e.subresource
        out.append(raw)
    return out


def _same_ownership(a: Mapping[_Identity, _Entry], b: Mapping[_Identity, _Entry]) -> bool:
    return a.keys() == b.keys() and all(
        a[i].fields == b[i].fields and a[i].api_version == b[i].api_version for i in a
    )


def _without_managed_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` without metadata.managedFields, which are not copied at all (most of
    a Node)."""
    meta = obj.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return copy_json(obj)


def _store(obj: dict[str, Any], entries: Mapping[_Identity, _Entry]) -> None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        if not entries:
            return
        meta = obj["metadata"] = {}
    if entries:
        meta["managedFields"] = _encode(entries)
    else:
        meta.pop("managedFields", None)


def _track_update(
    entries: Mapping[_Identity, _Entry],
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    *,
    identity: _Identity,
    kind: str,
    api_version: str,
    now: str,
    in_scope: Callable[[FieldPath], bool],
    diff: _Comparison | None = None,
) -> dict[_Identity, _Entry]:
    """``diff``: ``_compare_objects(old, new, kind)`` when the caller already has it."""
    if diff is None:
        diff = _compare_objects(old, new, kind)
    removed = frozenset(filter(in_scope, diff.removed))
    changed = frozenset(filter(in_scope, diff.added | diff.modified)) - removed
    out: dict[_Identity, _Entry] = {}
    for key, entry in entries.items():
        kept = entry.fields - changed - removed
        if kept:
            out[key] = replace(entry, fields=kept)
    taken = _strip(changed)
    if taken:
        manager, operation, _, subresource = identity
        previous = out.get(identity)
        fields = taken | previous.fields if previous else taken
        out[identity] = _Entry(manager, operation, api_version, now, fields, subresource)
    _cap_updates(out)
    return out
