"""Heartbeat writes: updates that move nothing but a kind's heartbeat times.

Most writes of a running fleet are heartbeats: every node renews its Lease
(``spec.renewTime``) every few seconds and rewrites its status' condition
``lastHeartbeatTime``\\ s every status period; leader election renews its Leases the same way.
Such a write leaves the rest of the object exactly as stored, and what is stored was decoded,
defaulted and validated when it was written. So the generic update need not decode the new
and the stored object into typed models, validate them and encode the result again: it
checks the changed times as the models would read them, writes them in the form the models
write, and goes on (field ownership, admission and the store are unchanged).

A kind lists its heartbeat fields in its Strategy (``heartbeat_fields``): paths of
metav1.Time or MicroTime leaves, ``None`` standing for any list index. Anything else that
differs — a value of another type (``40`` and ``40.0``, ``1`` and ``true`` compare equal in
Python, not in JSON), a key added or removed, a list that grew, a time that does not parse —
sends the write the general way, which gives its usual answer.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError

from gpufleet.api.k8s import Time, _format_time

FieldPattern = tuple[str | None, ...]

_LEAF = object()
_TIME = TypeAdapter(Time)
# metadata.resourceVersion is the one field every write moves (the store sets it).
_MOVED = "resourceVersion"
_KEPT = "managedFields"


@lru_cache(maxsize=64)
def _trie(fields: tuple[FieldPattern, ...]) -> dict[Any, Any]:
    root: dict[Any, Any] = {}
    for path in fields:
        node = root
        for step in path[:-1]:
            node = node.setdefault(step, {})
        node[path[-1]] = _LEAF
    return root


def _same(a: Any, b: Any) -> bool:
    """JSON equality: Python's ``==`` with the types that JSON tells apart kept apart."""
    if a is b:
        return True
    if a != b or type(a) is not type(b):
        return False
    if isinstance(a, (dict, list)):
        return orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(b, option=orjson.OPT_SORT_KEYS)
    return True


def _walk(old: dict[str, Any], new: dict[str, Any], trie: dict[Any, Any],
          changed: list[tuple[dict[str, Any], str]], skip: str | None = None) -> bool:
    if old.keys() != new.keys():
        return False
    for key, value in new.items():
        if key == skip:
            continue
        before = old[key]
        if _same(before, value):
            continue
        sub = trie.get(key)
        if sub is None:
            return False
        if sub is _LEAF:
            if not isinstance(value, str):
                return False
            changed.append((new, key))
        elif isinstance(before, dict) and isinstance(value, dict):
            if not _walk(before, value, sub, changed):
                return False
        elif isinstance(before, list) and isinstance(value, list) and None in sub:
            if len(before) != len(value):
                return False
            item = sub[None]
            for x, y in zip(before, value, strict=True):
                if _same(x, y):
                    continue
                if not (isinstance(x, dict) and isinstance(y, dict) and _walk(x, y, item, changed)):
                    return False
        else:
            return False
    return True


def canonical_time(value: str) -> str | None:
    """``value`` as the models write a metav1.Time / MicroTime, or None when they would
    refuse it."""
    try:
        return _format_time(_TIME.validate_python(value))
    except ValidationError:
        return None


def heartbeat_only(fields: tuple[FieldPattern, ...], current: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether the update ``current`` (as stored) -> ``new`` (as it will be written) changes
    only the heartbeat ``fields``, and at least one of them; if so, their new values in ``new``
    are put in the models' form."""
    if not fields:
        return False
    meta, cur_meta = new.get("metadata"), current.get("metadata")
    if not isinstance(meta, dict) or not isinstance(cur_meta, dict):
        return False
    # A write without managedFields keeps the stored ones (field tracking starts from them).
    kept = _KEPT in cur_meta and _KEPT not in meta
    if len(meta) - (_MOVED in meta) != len(cur_meta) - (_MOVED in cur_meta) - kept:
        return False
    for key, value in meta.items():
        if key != _MOVED and (key not in cur_meta or not _same(cur_meta[key], value)):
            return False
    changed: list[tuple[dict[str, Any], str]] = []
    if not _walk(current, new, _trie(fields), changed, skip="metadata") or not changed:
        return False
    texts = [canonical_time(container[key]) for container, key in changed]
    if None in texts:
        return False  # left as sent: the general path gives the error
    for (container, key), text in zip(changed, texts, strict=True):
        container[key] = text
    return True
