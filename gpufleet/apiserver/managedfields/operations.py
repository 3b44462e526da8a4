"""The field manager's public operations: accepting client managedFields, recording updates,
and server-side apply with its conflicts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpufleet.apiserver.managedfields.common import (
    _KUBECTL,
    APPLY,
    BEFORE_FIRST_APPLY_MANAGER,
    LAST_APPLIED_ANNOTATION,
    UPDATE,
    FieldSet,
    ManagedFieldsError,
    _bounded,
)
from gpufleet.apiserver.managedfields.entries import (
    _cap_updates,
    _decode_or_empty,
    _encode,
    _Entry,
    _Identity,
    _identity_json,
    _label,
    _quote,
    _same_ownership,
    _scope,
    _store,
    _strip,
    _track_update,
    _without_managed_fields,
    is_reset,
)
from gpufleet.apiserver.managedfields.fieldsets import (
    _named_closure,
    _ordered,
    _root,
    field_set,
    path_string,
)
from gpufleet.apiserver.managedfields.merge import _compare_objects, _merge, _prune
from gpufleet.apiserver.managedfields.quick import compare, unchanged_ownership
from gpufleet.apiserver.patch.common import copy_json, json_equal

# The strategic-merge schema: the same merge keys decide how lists are owned.


class ApplyConflict(Exception):
    """Server-side apply would change fields other managers own (the API server answers
    409 Conflict, with :attr:`causes` as ``details.causes``).

    ``conflicts`` lists (manager, field path) pairs such as ``("alice", ".data.a")``.
    """

    def __init__(
        self,
        conflicts: list[tuple[str, str]],
        *,
        message: str | None = None,
        causes: list[dict[str, str]] | None = None,
    ) -> None:
        self.conflicts = list(conflicts)
        if causes is None:
            causes = [_cause(_quote(manager), path) for manager, path in self.conflicts]
        if message is None:
            message = _conflict_message([(_quote(m), _quote(m), p) for m, p in self.conflicts])
        self.causes = causes
        self.message = message
        super().__init__(message)


# --------------------------------------------------------------------------- public operations


def _starting_entries(sent: Any, old: Mapping[str, Any] | None, subresource: str) -> dict[_Identity, _Entry]:
    live = ((old or {}).get("metadata") or {}).get("managedFields")
    if subresource:
        return _decode_or_empty(live)
    if is_reset(sent):
        return {}
    # Clients unaware of managedFields must not erase them: anything that does not decode
    # (or is absent) means the stored ones.
    return _decode_or_empty(sent) or _decode_or_empty(live)


@_bounded
def accepted_managed_fields(
    sent: Any, old: Mapping[str, Any] | None, *, subresource: str = ""
) -> list[dict[str, Any]] | None:
    """What to leave in ``metadata.managedFields`` of a written object before it is decoded
    and validated: ``[]`` for a reset, the client's entries when they decode (normalized),
    else ``old``'s; None when there are none. Clients can put anything in ``fieldsV1``,
    which the models accept as free JSON; this keeps such garbage away from them.
    :func:`record_update` makes the same choice, so it may be given either form."""
    if not subresource and is_reset(sent):
        return []
    entries = _starting_entries(sent, old, subresource)
    return _encode(entries) if entries else None


@_bounded
def record_update(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    *,
    manager: str,
    kind: str,
    api_version: str,
    now: str,
    subresource: str = "",
    ignore_status: bool = False,
) -> dict[str, Any]:
    """``new`` (a copy) with the managedFields of a non-apply write by ``manager``.

    ``old`` is the stored object (None on create) and ``new`` what will be stored, with
    the managedFields the client sent still in its metadata: ``[]`` or ``[{}]`` resets them
    (the object then has none), entries that decode are taken as the starting point (that is
    how Kubernetes lets a client edit them), anything else falls back to ``old``'s. Through
    a subresource the client's are always ignored.

    Fields the write adds or changes move to ``manager``'s Update entry, fields it removes
    leave every entry; the entry's ``time`` becomes ``now`` only if it took fields. An
    existing object without managedFields stays untracked (until an apply).
    ``ignore_status``: status is not this endpoint's to write (the main resource of a kind
    with a status subresource).
    """
    # The client's managedFields are only compared with the stored ones, and copied below
    # where they are the starting point.
    new_meta = new.get("metadata")
    sent = new_meta.get("managedFields") if isinstance(new_meta, Mapping) else None
    result = _without_managed_fields(new)
    meta = result.get("metadata")
    if not isinstance(meta, dict):
        return result
    identity = (manager, UPDATE, api_version, subresource)
    in_scope = _scope(subresource, ignore_status)
    diff = None
    if old is not None:
        live = (old.get("metadata") or {}).get("managedFields")
        if live and (subresource or sent is None or sent == live):
            # The write starts from the stored entries: a heartbeat keeps them as they are
            # (unchanged_ownership copies each entry it returns and changes no fieldsV1).
            start = live
            diff = compare(old, new, kind)
            quick = unchanged_ownership(start, diff, identity=identity, now=now, in_scope=in_scope)
            if quick is not None:
                meta["managedFields"] = quick
                return result
    entries = _starting_entries(copy_json(sent), old, subresource)
    if old is not None and not entries:
        return result
    # The objects are only compared: with the comparison at hand, no copies are needed.
    tracked = _track_update(
        entries,
        _without_managed_fields(old) if old is not None and diff is None else old,
        _without_managed_fields(result) if diff is None else result,
        identity=identity,
        kind=kind,
        api_version=api_version,
        now=now,
        in_scope=in_scope,
        diff=diff,
    )
    _store(result, tracked)
    return result


@_bounded
def apply(
    live: Mapping[str, Any] | None,
    applied: Mapping[str, Any],
    *,
    manager: str,
    kind: str,
    api_version: str,
    force: bool,
    now: str,
    subresource: str = "",
    ignore_status: bool = False,
) -> dict[str, Any]:
    """Server-side apply of the configuration ``applied`` by ``manager`` to ``live`` (None
    to create). Returns the new object with its managedFields, or ``live`` unchanged (a
    copy) when the apply changes nothing.

    Raises :class:`ApplyConflict` when the configuration changes fields another manager
    owns and ``force`` is false, and :class:`ManagedFieldsError` for a configuration the
    server refuses (managedFields set, another apiVersion).
    """
    if not isinstance(applied, Mapping):
        raise ManagedFieldsError("an apply configuration must be a JSON object")
    applied_meta = applied.get("metadata")
    if applied_meta is not None and not isinstance(applied_meta, Mapping):
        raise ManagedFieldsError("metadata of an apply configuration must be an object")
    if isinstance(applied_meta, Mapping) and applied_meta.get("managedFields") is not None:
        raise ManagedFieldsError("metadata.managedFields must be nil")
    version = applied.get("apiVersion")
    if version != api_version:
        shown = version if isinstance(version, str) else ""
        raise ManagedFieldsError(
            f"Incorrect version specified in apply patch. Specified patch version: {shown}, expected: {api_version}"
        )
    in_scope = _scope(subresource, ignore_status)
    config = copy_json(applied)
    before = _without_managed_fields(live) if live is not None else None
    original: dict[_Identity, _Entry] = {}
    entries: dict[_Identity, _Entry] = {}
    if live is not None:
        original = _decode_or_empty((live.get("metadata") or {}).get("managedFields"))
        entries = dict(original)
        if not entries:
            # An object no one tracked yet: what it holds belongs to a placeholder manager,
            # so the first apply cannot silently take fields someone else wrote.
            entries = _track_update(
                {},
                None,
                before or {},
                identity=(BEFORE_FIRST_APPLY_MANAGER, UPDATE, api_version, ""),
                kind=kind,
                api_version=api_version,
                now=now,
                in_scope=in_scope,
            )

    identity: _Identity = (manager, APPLY, "", subresource)
    applying = frozenset(filter(in_scope, field_set(config, kind)))
    previous = entries.pop(identity, None)
    others = entries

    result = _merge(before if before is not None else {}, config, _root(kind))
    if previous is not None:
        owned = set(applying) | {("f:apiVersion",), ("f:kind",), ("f:metadata", "f:name")}
        for entry in others.values():
            owned |= entry.fields
        keep = _named_closure(owned)
        _prune(result, _named_closure(previous.fields) - keep, kind, keep)

    diff = _compare_objects(before, result, kind)
    # A null in the configuration removes the field, which changes it as much as a value.
    changed = diff.added | diff.modified | (diff.removed & applying)
    clashes = {i: e.fields & changed for i, e in others.items() if e.fields & changed}
    if clashes and not force and not _last_applied_allows(manager, live, clashes, kind):
        raise _conflict(clashes)

    updated: dict[_Identity, _Entry] = {}
    for key, entry in others.items():
        kept = entry.fields - changed - diff.removed
        if kept:
            updated[key] = replace(entry, fields=kept)
    mine = _strip(applying)
    if mine:
        updated[identity] = _Entry(manager, APPLY, api_version, now, mine, subresource)
    _cap_updates(updated)

    if manager == _KUBECTL and _last_applied(live) is not None:
        result.setdefault("metadata", {}).setdefault("annotations", {})[LAST_APPLIED_ANNOTATION] = (
            _last_applied_value(config)
        )
    if before is not None and json_equal(result, before) and _same_ownership(updated, original):
        return copy_json(live)
    _store(result, updated)
    return result


def _conflict(clashes: Mapping[_Identity, FieldSet]) -> ApplyConflict:
    rows: list[tuple[str, str, str]] = []
    pairs: list[tuple[str, str]] = []
    for identity in sorted(clashes, key=_identity_json):
        for path in _ordered(clashes[identity]):
            rows.append((_identity_json(identity), _label(identity), path_string(path)))
            pairs.append((identity[0], path_string(path)))
    causes = [_cause(label, path) for _, label, path in rows]
    return ApplyConflict(pairs, message=_conflict_message(rows), causes=causes)


def _cause(label: str, path: str) -> dict[str, str]:
    return {"reason": "FieldManagerConflict", "message": f"conflict with {label}", "field": path}


def _conflict_message(rows: list[tuple[str, str, str]]) -> str:
    """Kubernetes' text: one conflict on a line, several grouped by manager."""
    if len(rows) == 1:
        _, label, path = rows[0]
        return f"Apply failed with 1 conflict: conflict with {label}: {path}"
    groups: dict[str, tuple[str, list[str]]] = {}
    for key, label, path in rows:
        groups.setdefault(key, (label, []))[1].append(path)
    lines: list[str] = []
    for key in sorted(groups):
        label, paths = groups[key]
        lines.append(f"conflicts with {label}:")
        lines.extend(f"- {path}" for path in paths)
    return f"Apply failed with {len(rows)} conflicts: " + "\n".join(lines)


def _last_applied(obj: Mapping[str, Any] | None) -> str | None:
    if obj is None:
        return None
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(LAST_APPLIED_ANNOTATION) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) else None


def _last_applied_allows(
    manager: str, live: Mapping[str, Any] | None, clashes: Mapping[_Identity, FieldSet], kind: str
) -> bool:
    """kubectl's server-side apply may take, without ``force``, the fields its client-side
    apply configured (they are listed in the last-applied-configuration annotation)."""
    if manager != _KUBECTL:
        return False
    text = _last_applied(live)
    if text is None:
        return False
    try:
        last = json.loads(text)
    except ValueError:
        return False
    if not isinstance(last, dict):
        return False
    allowed = field_set(last, kind)
    return all(fields <= allowed for fields in clashes.values())


def _last_applied_value(config: Mapping[str, Any]) -> str:
    body = copy_json(config)
    annotations = (body.get("metadata") or {}).get("annotations")
    if isinstance(annotations, dict):
        annotations.pop(LAST_APPLIED_ANNOTATION, None)
        if not annotations:
            del body["metadata"]["annotations"]
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    # Go's encoder escapes these; kubectl compares the annotation as text.
    for ch, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(ch, escaped)
    return text + "\n"
