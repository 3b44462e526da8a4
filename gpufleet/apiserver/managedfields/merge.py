"""Comparing, merging and pruning objects along the ownership schema.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpufleet.apiserver.managedfields.common import FieldPath
from gpufleet.apiserver.managedfields.fieldsets import (
    _ABSENT,
    _ANY,
    _ASSOC,
    _ASSOC_MODE,
    _ATOMIC,
    _LEAF,
    _MAP,
    _SET,
    _SET_MODE,
    _child,
    _elements,
    _form,
    _item_shape,
    _root,
    _Shape,
)
from gpufleet.apiserver.patch.common import copy_json, json_equal

# The strategic-merge schema: the same merge keys decide how lists are owned.

# --------------------------------------------------------------------------- compare


@dataclass(slots=True)
class _Comparison:
    added: set[FieldPath] = field(default_factory=set)
    removed: set[FieldPath] = field(default_factory=set)
    modified: set[FieldPath] = field(default_factory=set)


def _empty_container(value: Any, form: str | None) -> bool:
    return form is None or (form in (_MAP, _ASSOC, _SET) and not value)


def _same_json(lhs: Any, rhs: Any) -> bool:
    """Whether two containers are written alike (then JSON-equal: orjson tells true from 1).
    False says nothing: 1 and 1.0, or keys in another order, are compared field by field."""
    try:
        return orjson.dumps(lhs) == orjson.dumps(rhs)
    except TypeError:  # orjson.JSONEncodeError: not plain JSON
        return False


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
        # Most of a heartbeat's object is as it was: such a subtree is skipped whole.
        if not _same_json(lhs, rhs):
            _compare_children(lhs, rhs, lform, shape, path, out)
        return
    if lform is None:
        out.added.add(path)
    elif rform is None:
        out.removed.add(path)
    elif lform == _LEAF and rform == _LEAF:
        if not json_equal(lhs, rhs):
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
            return _merge(old, new, item_shape) if rform == _ASSOC else copy_json(new)

        return _merge_items(left, _elements(rhs, rform, shape), merge_item)
    return copy_json(rhs)


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
