"""Field ownership: ``metadata.managedFields`` for server-side apply and for ordinary writes.

Kubernetes records, for every object, which *field manager* set which fields
(``sigs.k8s.io/structured-merge-diff`` on the server). The functions here compute the same
records over objects held as JSON dicts; they do no I/O and never mutate their inputs.

Field sets
----------
A field is named by a path of elements written as in ``fieldsV1``:

- ``f:<name>``    a key of an object (``f:spec``, ``f:app`` inside ``f:labels``);
- ``k:<json>``    an item of an associative list, by its merge keys (``k:{"name":"web"}``);
- ``v:<json>``    a value of a list of scalars treated as a set (``v:"kubernetes"``);
- ``i:<n>``       a list index (only read from clients; never produced here).

A :data:`FieldSet` holds the paths a manager owns. Scalars, atomic values, list items and
empty objects are members; objects that hold other fields are not (their ``.`` entry in
``fieldsV1`` only appears when the object itself is owned).

Which lists merge by key comes from the strategic-merge schema in :mod:`patch`, plus what
the OpenAPI of Kubernetes adds on top of the patch tags: container and service ports are
keyed by port *and* protocol (protocol defaults to ``TCP`` in the key), a workload's
``spec.selector`` (a ``LabelSelector``) is atomic, and a list with no merge tag is atomic
(so ``args`` or ``tolerations`` are owned as a whole). Objects without a schema are granular.

Apply and update
----------------
:func:`apply` is the ``application/apply-patch+yaml`` PATCH: the configuration is merged
into the live object, the manager's previous configuration is compared with the new one
and fields it no longer applies are removed unless another manager owns them, and fields
that another manager owns and that the configuration changes are conflicts (409) unless
``force`` moves them. :func:`record_update` is everything else (create, PUT, the other
PATCH types): the fields a write adds or changes become the writer's.

What is reproduced from kube-apiserver's field manager, beyond the core algorithm:

- entries are keyed by (manager, operation, apiVersion for updates, subresource), sorted
  Apply first, then by time, manager, apiVersion and subresource;
- ``apiVersion``, ``kind`` and the system metadata (name, namespace, uid, resourceVersion,
  generation, creationTimestamp, selfLink, managedFields) are never owned;
- a manager's ``time`` only moves when the write changed something; an apply that changes
  nothing returns the live object as it was;
- at most ten update entries are kept: older ones fold into ``ancient-changes``;
- an existing object without managedFields is not tracked by updates; the first apply to
  it attributes its current fields to ``before-first-apply``;
- a client resets managedFields with ``[]`` or ``[{}]`` (not with apply); other
  client-sent managedFields on an update are used when they decode, else the live ones;
- ``kubectl``'s server-side apply may take over fields listed in the client-side
  ``last-applied-configuration`` annotation without a conflict, and keeps that annotation
  in step with what it applies.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ParamSpec, TypeVar

# The strategic-merge schema: the same merge keys decide how lists are owned.
from gpufleet.apiserver.patch import _KIND_ROOTS, _STRUCTS, _Field

__all__ = [
    "ANCIENT_CHANGES_MANAGER",
    "BEFORE_FIRST_APPLY_MANAGER",
    "LAST_APPLIED_ANNOTATION",
    "MAX_FIELD_PATH_DEPTH",
    "MAX_UPDATE_MANAGERS",
    "ApplyConflict",
    "FieldPath",
    "FieldSet",
    "ManagedFieldsError",
    "accepted_managed_fields",
    "apply",
    "field_manager_errors",
    "field_set",
    "from_fields_v1",
    "is_reset",
    "manager_from_user_agent",
    "path_string",
    "record_update",
    "to_fields_v1",
]

FieldPath = tuple[str, ...]
FieldSet = frozenset[FieldPath]

LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"
BEFORE_FIRST_APPLY_MANAGER = "before-first-apply"
ANCIENT_CHANGES_MANAGER = "ancient-changes"
MAX_UPDATE_MANAGERS = 10
# Deeper than any real object; keeps client-sent fieldsV1 within what the models serialize.
MAX_FIELD_PATH_DEPTH = 100
FIELD_MANAGER_MAX_BYTES = 128

APPLY = "Apply"
UPDATE = "Update"
FIELDS_V1 = "FieldsV1"
# kubectl's own server-side apply manager: the only one allowed to take over fields that
# its client-side apply recorded (how users migrate from client-side to server-side apply).
_KUBECTL = "kubectl"


class ManagedFieldsError(ValueError):
    """A request the field manager refuses (the API server answers 400 BadRequest)."""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _bounded(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Turn the recursion limit, which a deeply nested body can reach, into a 400."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except RecursionError:
            raise ManagedFieldsError("the object or its managedFields are nested too deeply") from None

    return wrapper


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


def _copy_json(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_json(v) for v in value]
    return value


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true is neither 1 nor "true"."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, Mapping | list) or isinstance(b, Mapping | list):
        return False
    return type(a) is type(b) and a == b


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


# --------------------------------------------------------------------------- compare


@dataclass(slots=True)
class _Comparison:
    added: set[FieldPath] = field(default_factory=set)
    removed: set[FieldPath] = field(default_factory=set)
    modified: set[FieldPath] = field(default_factory=set)


def _empty_container(value: Any, form: str | None) -> bool:
    return form is None or (form in (_MAP, _ASSOC, _SET) and not value)


def _compare(lhs: Any, rhs: Any, shape: _Shape, path: FieldPath, out: _Comparison) -> None:
    lform, rform = _form(lhs, shape), _form(rhs, shape)
    if lform is None and rform is None:
        return
    if _empty_container(lhs, lform) and _empty_container(rhs, rform):
        # Empty on both sides: compared as values, keeping {} / [] / absent apart.
        if lform is None:
            out.added.add(path)
        elif rform is None:
            out.removed.add(path)
        elif lform != rform:
            out.modified.add(path)
        return
    if lform == rform and lform != _LEAF:
        _compare_children(lhs, rhs, lform, shape, path, out)
        return
    if lform is None:
        out.added.add(path)
    elif rform is None:
        out.removed.add(path)
    elif lform == _LEAF and rform == _LEAF:
        if not _json_equal(lhs, rhs):
            out.modified.add(path)
        return
    else:
        out.modified.add(path)
    if lform not in (None, _LEAF):
        _compare_children(lhs, _ABSENT, lform, shape, path, out)
    if rform not in (None, _LEAF):
        _compare_children(_ABSENT, rhs, rform, shape, path, out)


def _present_child(parent: Any, key: str, shape: _Shape) -> Any:
    if parent is _ABSENT:
        return _ABSENT
    value = parent.get(key, _ABSENT)
    if value is _ABSENT and shape.always_present:
        return [] if shape.mode in (_ASSOC_MODE, _SET_MODE) else {}
    return value


def _compare_children(
    lhs: Any, rhs: Any, form: str, shape: _Shape, path: FieldPath, out: _Comparison
) -> None:
    if form == _MAP:
        keys = list(lhs) if lhs is not _ABSENT else []
        if rhs is not _ABSENT:
            keys += [k for k in rhs if lhs is _ABSENT or k not in lhs]
        for key in keys:
            child = _child(shape, key)
            _compare(
                _present_child(lhs, key, child),
                _present_child(rhs, key, child),
                child,
                (*path, "f:" + key),
                out,
            )
        return
    left = dict(_elements(lhs, form, shape))
    right = dict(_elements(rhs, form, shape))
    order = list(left) + [pe for pe in right if pe not in left]
    if form == _ASSOC:
        item_shape = _item_shape(shape)
        for pe in order:
            _compare(left.get(pe, _ABSENT), right.get(pe, _ABSENT), item_shape, (*path, pe), out)
        return
    for pe in order:
        if pe not in right:
            out.removed.add((*path, pe))
        elif pe not in left:
            out.added.add((*path, pe))


def _compare_objects(old: Mapping[str, Any] | None, new: Mapping[str, Any], kind: str) -> _Comparison:
    out = _Comparison()
    # A create compares with the kind's empty object, whose struct fields already exist.
    _compare_children(dict(old or {}), dict(new), _MAP, _root(kind), (), out)
    return out


# --------------------------------------------------------------------------- merge and prune


def _merge(lhs: Any, rhs: Any, shape: _Shape) -> Any:
    rform = _form(rhs, shape)
    if rform == _MAP:
        base = lhs if _form(lhs, shape) == _MAP else {}
        out = dict(base)
        for key, value in rhs.items():
            if value is None:
                # Kubernetes decodes a null into the field's zero value, which the object
                # then omits.
                out.pop(key, None)
            else:
                out[key] = _merge(base.get(key, _ABSENT), value, _child(shape, key))
        return out
    if rform in (_ASSOC, _SET):
        left = _elements(lhs, rform, shape) if _form(lhs, shape) == rform else []
        item_shape = _item_shape(shape)

        def merge_item(old: Any, new: Any) -> Any:
            return _merge(old, new, item_shape) if rform == _ASSOC else _copy_json(new)

        return _merge_items(left, _elements(rhs, rform, shape), merge_item)
    return _copy_json(rhs)


def _merge_items(
    left: list[tuple[str, Any]], right: list[tuple[str, Any]], merge_item: Callable[[Any, Any], Any]
) -> list[Any]:
    """Structured-merge-diff's list order: the applied items in their order, live-only
    items kept where they were relative to the items both lists share."""
    lmap, rmap = dict(left), dict(right)
    shared = [pe for pe, _ in right if pe in lmap]
    next_shared = 0
    out: list[Any] = []
    merged: set[str] = set()
    li = ri = 0
    while li < len(left) or ri < len(right):
        if li < len(left) and ri < len(right):
            pe = left[li][0]
            if pe == right[ri][0]:
                out.append(merge_item(lmap[pe], rmap[pe]))
                merged.add(pe)
                li += 1
                ri += 1
                next_shared += 1
                continue
            if pe in rmap and next_shared < len(shared) and shared[next_shared] != pe:
                li += 1
                continue
        if li < len(left):
            pe = left[li][0]
            if pe not in rmap:
                out.append(left[li][1])
                li += 1
                continue
            if pe in merged:
                li += 1
                continue
        if ri < len(right):
            pe = right[ri][0]
            merged.add(pe)
            out.append(merge_item(lmap.get(pe, _ABSENT), rmap[pe]))
            ri += 1
            if next_shared < len(shared) and shared[next_shared] == pe:
                next_shared += 1
    return out


def _locate(container: Any, shape: _Shape, pe: str) -> tuple[Any, Any, _Shape] | None:
    """Where ``pe`` sits in ``container``: (key or index, value, shape of the value)."""
    form = _form(container, shape)
    kind = pe[0]
    if kind == "f" and form == _MAP:
        name = pe[2:]
        if name in container:
            return name, container[name], _child(shape, name)
    elif kind in ("k", "v") and form in (_ASSOC, _SET):
        for index, (element, value) in enumerate(_elements(container, form, shape)):
            if element == pe:
                return index, value, (_item_shape(shape) if form == _ASSOC else _ATOMIC)
    elif kind == "i" and isinstance(container, list):
        index = int(pe[2:])
        if 0 <= index < len(container):
            return index, container[index], _ANY
    return None


def _remove(obj: dict[str, Any], path: FieldPath, root: _Shape, keep: set[FieldPath]) -> None:
    """Remove what ``path`` names, then any object or list that this left empty and that
    nobody keeps (Kubernetes omits empty maps and lists)."""
    chain: list[tuple[Any, Any, _Shape]] = []
    current: Any = obj
    shape = root
    for pe in path:
        found = _locate(current, shape, pe)
        if found is None:
            return
        where, value, child_shape = found
        chain.append((current, where, shape))
        current, shape = value, child_shape
    for depth in range(len(chain) - 1, -1, -1):
        container, where, container_shape = chain[depth]
        del container[where]
        # A struct that is not a pointer in Go stays, even empty.
        if depth == 0 or container or path[:depth] in keep or container_shape.always_present:
            return


def _prune(obj: dict[str, Any], doomed: set[FieldPath], kind: str, keep: set[FieldPath]) -> None:
    root = _root(kind)
    for path in sorted(doomed, key=len):
        _remove(obj, path, root, keep)


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


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


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
    out = _copy_json(obj)
    meta = out.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return out


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
) -> dict[_Identity, _Entry]:
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
    result = _copy_json(new)
    meta = result.get("metadata")
    if not isinstance(meta, dict):
        return result
    entries = _starting_entries(meta.pop("managedFields", None), old, subresource)
    if old is not None and not entries:
        return result
    tracked = _track_update(
        entries,
        _without_managed_fields(old) if old is not None else None,
        _without_managed_fields(result),
        identity=(manager, UPDATE, api_version, subresource),
        kind=kind,
        api_version=api_version,
        now=now,
        in_scope=_scope(subresource, ignore_status),
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
    config = _copy_json(applied)
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
    if before is not None and _json_equal(result, before) and _same_ownership(updated, original):
        return _copy_json(live)
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
    body = _copy_json(config)
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


# --------------------------------------------------------------------------- field manager names


def manager_from_user_agent(user_agent: str | None) -> str:
    """The manager Kubernetes records when a write names no ``fieldManager``: the user
    agent up to its first ``/`` (``kubectl/v1.32.0 (linux/amd64)`` -> ``kubectl``,
    ``OpenAPI-Generator/31.0.0/python`` -> ``OpenAPI-Generator``), printable characters
    only, at most 128 bytes."""
    prefix = (user_agent or "").split("/", 1)[0]
    out: list[str] = []
    size = 0
    for ch in prefix:
        if not ch.isprintable():
            continue
        width = len(ch.encode("utf-8", "surrogatepass"))
        if size + width > FIELD_MANAGER_MAX_BYTES:
            break
        out.append(ch)
        size += width
    return "".join(out)


def field_manager_errors(manager: str, *, apply: bool) -> list[dict[str, str]]:
    """Status causes for an invalid ``fieldManager`` query parameter (422 Invalid, kind
    ``PatchOptions``/``CreateOptions``/``UpdateOptions`` of group ``meta.k8s.io``, name "")."""
    causes: list[dict[str, str]] = []
    if apply and not manager:
        causes.append(
            {
                "reason": "FieldValueRequired",
                "message": "Required value: is required for apply patch",
                "field": "fieldManager",
            }
        )
    if len(manager.encode("utf-8", "surrogatepass")) > FIELD_MANAGER_MAX_BYTES:
        causes.append(
            {
                "reason": "FieldValueTooLong",
                "message": f"Too long: may not be more than {FIELD_MANAGER_MAX_BYTES} bytes",
                "field": "fieldManager",
            }
        )
    offset = 0
    for ch in manager:
        if not ch.isprintable():
            causes.append(
                {
                    "reason": "FieldValueInvalid",
                    "message": f"Invalid value: {_quote(manager)}: invalid character U+{ord(ch):04X} (at position {offset})",
                    "field": "fieldManager",
                }
            )
        offset += len(ch.encode("utf-8", "surrogatepass"))
    return causes
