"""The ownership schema and field sets: which paths an object holds, and their fieldsV1 form.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.apiserver.managedfields.common import (
    MAX_FIELD_PATH_DEPTH,
    FieldPath,
    FieldSet,
    ManagedFieldsError,
    _bounded,
)

# The strategic-merge schema: the same merge keys decide how lists are owned.
from gpufleet.apiserver.patch import _KIND_ROOTS, _STRUCTS, _Field

# --------------------------------------------------------------------------- schema


_AUTO, _STRUCT, _ASSOC_MODE, _SET_MODE, _ATOMIC_MODE = "auto", "struct", "assoc", "set", "atomic"


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a position in an object holds. ``always_present`` marks Go struct fields that
    are not pointers (and lists serialized without omitempty): Kubernetes' empty object of
    the kind already holds them, so creating them is not "adding" the object itself."""

    mode: str = _AUTO
    struct: str | None = None
    keys: tuple[str, ...] = ()
    always_present: bool = False


_ANY = _Shape()
_ATOMIC = _Shape(_ATOMIC_MODE)


def _from_patch_schema(f: _Field) -> _Shape:
    if f.merge_key is not None:
        return _Shape(_ASSOC_MODE, f.struct, (f.merge_key,))
    if f.merge_set:
        return _Shape(_SET_MODE)
    if f.struct is not None:
        return _Shape(_STRUCT, f.struct, always_present=True)
    return _ANY


_SCHEMA: dict[str, dict[str, _Shape]] = {
    name: {key: _from_patch_schema(f) for key, f in fields.items()} for name, fields in _STRUCTS.items()
}
_SCHEMA["PodSpec"]["containers"] = replace(_SCHEMA["PodSpec"]["containers"], always_present=True)
_SCHEMA["PodSpec"]["topologySpreadConstraints"] = _Shape(
    _ASSOC_MODE, None, ("topologyKey", "whenUnsatisfiable")
)
_SCHEMA["Container"]["ports"] = _Shape(_ASSOC_MODE, None, ("containerPort", "protocol"))
_SCHEMA["ServiceSpec"]["ports"] = _Shape(_ASSOC_MODE, None, ("port", "protocol"))
# Workload update strategies are plain structs, already in the kind's empty object.
for _strategy in ("strategy", "updateStrategy"):
    _SCHEMA["TemplatedSpec"][_strategy] = _Shape(_STRUCT, always_present=True)
# LabelSelector is +structType=atomic; a ReplicationController's selector is a plain map
# and its template a pointer, so it gets a spec of its own.
_SCHEMA["TemplatedSpec"]["selector"] = _ATOMIC
_SCHEMA["ReplicationControllerSpec"] = {"template": _Shape(_STRUCT, "PodTemplateSpec")}
_SCHEMA["ReplicationController"] = {
    **_SCHEMA["Workload"],
    "spec": _Shape(_STRUCT, "ReplicationControllerSpec", always_present=True),
}
_SCHEMA["PodDisruptionBudgetSpec"] = {"selector": _ATOMIC}
_SCHEMA["PodDisruptionBudget"] = {
    **_SCHEMA["WithConditions"],
    "spec": _Shape(_STRUCT, "PodDisruptionBudgetSpec", always_present=True),
}

_ROOTS: dict[str, str] = {
    **_KIND_ROOTS,
    "ReplicationController": "ReplicationController",
    "PodDisruptionBudget": "PodDisruptionBudget",
}
# Defaults the OpenAPI schema gives to merge keys, which take part in an item's key.
_KEY_DEFAULTS: dict[str, Any] = {"protocol": "TCP"}


def _root(kind: str) -> _Shape:
    # Custom resources still carry ObjectMeta (finalizers as a set, ownerReferences by uid).
    return _Shape(_STRUCT, _ROOTS.get(kind, "MetadataOnly"))


def _child(shape: _Shape, key: str) -> _Shape:
    if shape.mode == _STRUCT and shape.struct is not None:
        return _SCHEMA.get(shape.struct, {}).get(key, _ANY)
    return _ANY


def _item_shape(shape: _Shape) -> _Shape:
    return _Shape(_STRUCT, shape.struct)


# --------------------------------------------------------------------------- path elements


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _dump(value: Any) -> str:
    return json.dumps(_canonical(value), separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _key_element(item: Any, keys: tuple[str, ...]) -> str | None:
    """``k:{...}`` for a list item: the merge keys it sets, plus defaulted ones it omits, so
    a port written without ``protocol`` is the same item as one with ``protocol: TCP``."""
    if not isinstance(item, dict):
        return None
    fields = {key: item[key] for key in keys if item.get(key) is not None}
    if not fields:
        return None
    for key in keys:
        if key not in fields and key in _KEY_DEFAULTS:
            fields[key] = _KEY_DEFAULTS[key]
    return "k:" + _dump(fields)


def _value_element(value: Any) -> str:
    return "v:" + _dump(value)


_ABSENT: Any = type("_Absent", (), {"__repr__": lambda self: "<absent>"})()
_LEAF, _MAP, _ASSOC, _SET = "leaf", "map", "assoc-list", "set-list"


def _keyed_items(items: list[Any], keys: tuple[str, ...]) -> list[tuple[str, Any]] | None:
    """The items of an associative list with their key elements, or None when the list
    cannot be keyed (an item without its keys, or two items with the same key): such a
    list is then owned as a whole."""
    out: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for item in items:
        pe = _key_element(item, keys)
        if pe is None or pe in seen:
            return None
        seen.add(pe)
        out.append((pe, item))
    return out


def _set_items(items: list[Any]) -> list[tuple[str, Any]] | None:
    out: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for item in items:
        if isinstance(item, dict | list):
            return None
        pe = _value_element(item)
        if pe in seen:
            return None
        seen.add(pe)
        out.append((pe, item))
    return out


def _form(value: Any, shape: _Shape) -> str | None:
    if value is _ABSENT:
        return None
    if shape.mode == _ATOMIC_MODE:
        return _LEAF
    if isinstance(value, dict):
        return _MAP if shape.mode in (_AUTO, _STRUCT) else _LEAF
    if isinstance(value, list):
        if shape.mode == _ASSOC_MODE and _keyed_items(value, shape.keys) is not None:
            return _ASSOC
        if shape.mode == _SET_MODE and _set_items(value) is not None:
            return _SET
    return _LEAF


def _elements(value: Any, form: str, shape: _Shape) -> list[tuple[str, Any]]:
    if value is _ABSENT:
        return []
    if form == _ASSOC:
        return _keyed_items(value, shape.keys) or []
    return _set_items(value) or []


# --------------------------------------------------------------------------- field sets


def _collect(value: Any, shape: _Shape, path: FieldPath, out: set[FieldPath]) -> None:
    form = _form(value, shape)
    if form == _LEAF:
        out.add(path)
    elif form == _MAP:
        if not value:
            out.add(path)
        for key, child in value.items():
            _collect(child, _child(shape, key), (*path, "f:" + key), out)
    elif form == _ASSOC:
        item_shape = _item_shape(shape)
        for pe, item in _elements(value, form, shape):
            out.add((*path, pe))
            for key, child in item.items():
                _collect(child, _child(item_shape, key), (*path, pe, "f:" + key), out)
    elif form == _SET:
        out.update((*path, pe) for pe, _ in _elements(value, form, shape))


@_bounded
def field_set(obj: Mapping[str, Any], kind: str) -> FieldSet:
    """The fields an object (or an apply configuration) of ``kind`` sets, as Kubernetes'
    ``ToFieldSet``: scalars, atomic values, list items and empty objects. An empty list
    that merges by key sets nothing."""
    if not isinstance(obj, Mapping):
        raise ManagedFieldsError("an object must be a JSON object")
    out: set[FieldPath] = set()
    root = _root(kind)
    for key, child in obj.items():
        _collect(child, _child(root, key), ("f:" + key,), out)
    return frozenset(out)


def _value_order(value: Any) -> tuple[int, Any]:
    # Structured-merge-diff's total order on values: numbers, strings, booleans, lists,
    # maps, null.
    if isinstance(value, bool):
        return (2, value)
    if isinstance(value, int | float):
        return (0, value)
    if isinstance(value, str):
        return (1, value)
    if isinstance(value, list):
        return (3, _dump(value))
    if isinstance(value, dict):
        return (4, _dump(value))
    return (5, 0)


def _element_order(pe: str) -> tuple[int, Any]:
    kind, text = pe[0], pe[2:]
    if kind == "f":
        return (0, text)
    if kind == "k":
        fields = json.loads(text)
        return (1, tuple((name, _value_order(fields[name])) for name in sorted(fields)))
    if kind == "v":
        return (2, _value_order(json.loads(text)))
    return (3, int(text))


@dataclass(slots=True)
class _Node:
    member: bool = False
    children: dict[str, _Node] = field(default_factory=dict)


def _tree(paths: Iterable[FieldPath]) -> _Node:
    root = _Node()
    for path in paths:
        node = root
        for pe in path:
            node = node.children.setdefault(pe, _Node())
        if path:
            node.member = True
    return root


@_bounded
def to_fields_v1(fields: Iterable[FieldPath]) -> dict[str, Any]:
    """The ``fieldsV1`` JSON of a field set, ordered as Kubernetes writes it (``.`` first,
    then fields, keys, values and indexes, each sorted)."""

    def emit(node: _Node) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if node.member and node.children:
            out["."] = {}
        for pe in sorted(node.children, key=_element_order):
            out[pe] = emit(node.children[pe])
        return out

    return emit(_tree(fields))


def _parse_element(pe: Any) -> str:
    if not isinstance(pe, str) or len(pe) < 2 or pe[1] != ":":
        raise ManagedFieldsError(
            f"invalid fieldsV1 key {pe!r}: expected f:, k:, v: or i: followed by a value"
        )
    kind, text = pe[0], pe[2:]
    if kind == "f":
        return pe
    if kind == "i":
        try:
            return f"i:{int(text)}"
        except ValueError:
            raise ManagedFieldsError(f"invalid fieldsV1 key {pe!r}: the index is not an integer") from None
    if kind in ("k", "v"):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ManagedFieldsError(f"invalid fieldsV1 key {pe!r}: {exc}") from None
        if kind == "k":
            if not isinstance(value, dict) or not value:
                raise ManagedFieldsError(
                    f"invalid fieldsV1 key {pe!r}: a key must be a non-empty JSON object"
                )
            return "k:" + _dump(value)
        return _value_element(value)
    raise ManagedFieldsError(f"invalid fieldsV1 key {pe!r}: unknown element type {kind!r}")


@_bounded
def from_fields_v1(fields_v1: Any) -> FieldSet:
    """Parse ``fieldsV1`` JSON into a field set (keys and values are normalized, so
    ``k:{"b":1,"a":2}`` and ``k:{"a":2,"b":1}`` name the same item)."""
    if not isinstance(fields_v1, Mapping):
        raise ManagedFieldsError("fieldsV1 must be a JSON object")
    out: set[FieldPath] = set()
    stack: list[tuple[FieldPath, Mapping[str, Any]]] = [((), fields_v1)]
    while stack:
        path, node = stack.pop()
        for key, child in node.items():
            if not isinstance(child, Mapping):
                raise ManagedFieldsError(
                    f"invalid fieldsV1 at {path_string(path) or '.'}: {key!r} must map to an object"
                )
            if key == ".":
                if path:
                    out.add(path)
                continue
            child_path = (*path, _parse_element(key))
            if len(child_path) > MAX_FIELD_PATH_DEPTH:
                raise ManagedFieldsError(f"fieldsV1 is nested more than {MAX_FIELD_PATH_DEPTH} levels deep")
            if not child:
                out.add(child_path)
            else:
                stack.append((child_path, child))
    return frozenset(out)


def _go_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float):
        return str(value)
    return _dump(value)


def path_string(path: FieldPath) -> str:
    """A path as Kubernetes prints it in conflicts: ``.spec.containers[name="web"].image``."""
    parts: list[str] = []
    for pe in path:
        kind, text = pe[0], pe[2:]
        if kind == "f":
            parts.append("." + text)
        elif kind == "k":
            fields = json.loads(text)
            parts.append("[" + ",".join(f"{name}={_go_value(fields[name])}" for name in sorted(fields)) + "]")
        elif kind == "v":
            parts.append(f"[={_go_value(json.loads(text))}]")
        else:
            parts.append(f"[{text}]")
    return "".join(parts)


def _ordered(paths: Iterable[FieldPath]) -> list[FieldPath]:
    """Paths in the order Kubernetes iterates a set: at each level the members, sorted,
    then what lies below, sorted."""
    out: list[FieldPath] = []

    def walk(node: _Node, prefix: FieldPath) -> None:
        names = sorted(node.children, key=_element_order)
        out.extend((*prefix, pe) for pe in names if node.children[pe].member)
        for pe in names:
            if node.children[pe].children:
                walk(node.children[pe], (*prefix, pe))

    walk(_tree(paths), ())
    return out


def _named_closure(paths: Iterable[FieldPath]) -> set[FieldPath]:
    """The paths plus every ancestor that is a named field: owning ``.data.a`` also keeps
    ``.data`` in use (structured-merge-diff's EnsureNamedFieldsAreMembers)."""
    out: set[FieldPath] = set()
    for path in paths:
        out.add(path)
        for end in range(1, len(path)):
            if path[end - 1].startswith("f:"):
                out.add(path[:end])
    return out
