"""The cheap path of a non-apply write that moves no field between managers.

Most writes of a running fleet are heartbeats: a node agent renews its Lease
(``spec.renewTime``) every few seconds and rewrites its status' heartbeat times. Such a write
changes only values its manager already owns, alone. Ownership then stays as it is, and the
manager's entry gets the write's time (Kubernetes moves an entry's ``time`` whenever its
manager changes the value of a field it owns), so there is no need to decode every entry's
``fieldsV1`` into field sets and encode them back: the stored entries are copied with that
one ``time`` changed, in kube-apiserver's order.

This relies on stored managedFields being in the form :func:`entries._encode` writes (every
write stores them through it): field paths can then be looked up in ``fieldsV1`` as written.
Anything else — a removed field, a field new to the manager or owned by another one, entries
sent by the client, more entries than are kept — goes the general way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpufleet.apiserver.managedfields.common import MAX_UPDATE_MANAGERS, UPDATE, FieldPath
from gpufleet.apiserver.managedfields.entries import _STRIPPED, _strip
from gpufleet.apiserver.managedfields.merge import _compare_objects, _Comparison

# Metadata no manager owns (entries._STRIPPED): left out of the comparison, so that the
# metadata of a write that moves only its resourceVersion compares equal at once.
_UNOWNED_META = frozenset(p[1][2:] for p in _STRIPPED if len(p) == 2 and p[0] == "f:metadata")


def _bare(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` without managedFields and the metadata no manager owns, sharing everything
    else (compared, never changed)."""
    out = dict(obj)
    meta = out.get("metadata")
    if isinstance(meta, Mapping) and not _UNOWNED_META.isdisjoint(meta):
        out["metadata"] = {k: v for k, v in meta.items() if k not in _UNOWNED_META}
    return out


def _owns(fields_v1: Mapping[str, Any], path: FieldPath) -> bool:
    node: Any = fields_v1
    for pe in path:
        if not isinstance(node, Mapping):
            return False
        node = node.get(pe)
        if node is None:
            return False
    # A leaf is ``{}``; an object with fields of its own is owned only with its ``.`` entry.
    return isinstance(node, Mapping) and (not node or "." in node)


def _identity(raw: Mapping[str, Any]) -> tuple[Any, ...]:
    version = raw.get("apiVersion") if raw.get("operation") == UPDATE else ""
    return (raw.get("manager"), raw.get("operation"), version, raw.get("subresource") or "")


def _sort_key(raw: Mapping[str, Any]) -> tuple[str, ...]:
    # entries._encode's order.
    return (raw.get("operation") or "", raw.get("time") or "", raw.get("manager") or "",
            raw.get("apiVersion") or "", raw.get("subresource") or "")


def compare(old: Mapping[str, Any], new: Mapping[str, Any], kind: str) -> _Comparison:
    """What the write ``old`` -> ``new`` adds, removes and changes, managedFields and the
    metadata nobody owns left out (the general path strips them from what it records),
    without copying either object."""
    return _compare_objects(_bare(old), _bare(new), kind)


def unchanged_ownership(
    live: Any,
    diff: _Comparison,
    *,
    identity: tuple[str, str, str, str],
    now: str,
    in_scope: Callable[[FieldPath], bool],
) -> list[dict[str, Any]] | None:
    """The managedFields of a write by ``identity`` that changes ``diff`` when ``live`` (the
    stored entries, which the write starts from) keep every field where it is; else None."""
    if not isinstance(live, list) or not live:
        return None
    updates = 0
    own: Mapping[str, Any] | None = None
    for raw in live:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("fieldsV1"), Mapping) or not raw["fieldsV1"]:
            return None
        updates += raw.get("operation") == UPDATE
        if _identity(raw) == identity:
            own = raw
    if updates > MAX_UPDATE_MANAGERS:
        return None
    if any(in_scope(p) for p in _strip(diff.removed)):
        return None
    changed = _strip(p for p in diff.added | diff.modified if in_scope(p))
    if not changed:
        return [dict(raw) for raw in live]
    if own is None or not all(_owns(own["fieldsV1"], p) for p in changed):
        return None
    if any(raw is not own and _owns(raw["fieldsV1"], p) for raw in live for p in changed):
        return None
    out = [dict(raw) for raw in live]
    for raw in out:
        if _identity(raw) == identity:
            raw["time"] = now
    out.sort(key=_sort_key)
    return out
