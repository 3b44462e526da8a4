"""The stored form of objects and events, and the SQL both backends read them with: the
JSON text (resourceVersion left to the revision column), history rows as WatchEvents, list
and history queries (the placeholder is the driver's), and the store's error wording."""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from gpufleet.store.base import AlreadyExists, Conflict, ListResult, NotFound, TransformError, WatchEvent
from gpufleet.utils.gcpause import gc_paused

Events = list[WatchEvent]


def encode(obj: dict[str, Any]) -> str:
    """The stored form of an object. resourceVersion is left out: the revision column is the
    truth, and every read stamps it back (see ``decode``)."""
    md = obj.get("metadata")
    if isinstance(md, dict) and "resourceVersion" in md:
        obj = {**obj, "metadata": {k: v for k, v in md.items() if k != "resourceVersion"}}
    return orjson.dumps(obj).decode()


def decode(text: str | bytes, revision: int) -> dict[str, Any]:
    obj = orjson.loads(text)
    md = obj.get("metadata")
    if not isinstance(md, dict):
        md = obj["metadata"] = {}
    md["resourceVersion"] = str(revision)
    return obj


class Codec(Protocol):
    """The stored text of an object and back (store/encryption.py's ValueCodec)."""

    def encode(self, resource: str, namespace: str, name: str, obj: dict[str, Any]) -> str: ...

    def decode(self, resource: str, namespace: str, name: str, text: str | bytes,
               revision: int) -> dict[str, Any]: ...

    def is_stale(self, resource: str, namespace: str, name: str, revision: int) -> bool: ...

    def may_encrypt(self, resource: str) -> bool: ...


def event_from_row(
    revision: int,
    type_: str,
    resource: str,
    namespace: str,
    name: str,
    value: str | bytes,
    prev_revision: int | None,
    prev_value: str | bytes | None,
    codec: Codec,
) -> WatchEvent:
    try:
        obj = codec.decode(resource, namespace, name, value, revision)
    except TransformError as exc:
        # One value this server cannot read must not stop the event pump (every watch of
        # every resource): the watches that meet it end with the error instead.
        stub = {"metadata": {"name": name, "resourceVersion": str(revision),
                             **({"namespace": namespace} if namespace else {})}}
        return WatchEvent(type=type_, resource=resource, namespace=namespace, name=name,  # type: ignore[arg-type]
                          revision=revision, object=stub, prev=None, error=exc)
    load_prev = None
    if prev_value is not None:
        def load_prev() -> dict[str, Any] | None:
            # Read only by a watch that filters (was the object a match before?). A value this
            # server cannot read counts as no previous state.
            try:
                return codec.decode(resource, namespace, name, prev_value, prev_revision or 0)
            except TransformError:
                return None
    return WatchEvent(
        type=type_,  # type: ignore[arg-type]
        resource=resource,
        namespace=namespace,
        name=name,
        revision=revision,
        object=obj,
        load_prev=load_prev,
    )


def key_str(resource: str, namespace: str, name: str) -> str:
    return f'{resource} "{namespace}/{name}"' if namespace else f'{resource} "{name}"'


def not_found(resource: str, namespace: str, name: str) -> NotFound:
    return NotFound(f"{key_str(resource, namespace, name)} not found")


def already_exists(resource: str, namespace: str, name: str) -> AlreadyExists:
    return AlreadyExists(f"{key_str(resource, namespace, name)} already exists")


def conflict(codec: Codec, resource: str, namespace: str, name: str, revision: int, expected: int | None,
             text: str | bytes) -> Conflict:
    """A compare-and-swap that found ``revision`` (stored as ``text``) instead of ``expected``."""
    return Conflict(
        f"{key_str(resource, namespace, name)} was modified: revision {revision}, expected {expected}",
        current=codec.decode(resource, namespace, name, text, revision),
    )


# Pods by spec.nodeName: an expression index of each backend (what an agent's list and watch
# of its own pods, and the Node authorizer's lookups, ask for), so such a list costs what it
# returns. Only pods are indexed (other values need not even be JSON: encrypted secrets).
NODE_INDEXED = "pods"


def objects_query(ph: str, resource: str, namespace: str | None, after: tuple[str, str] | None,
                  limit: int | None, node: str | None = None, node_expr: str = "",
                  node_table: str = "objects") -> tuple[str, list[Any]]:
    """The SELECT of a list page (``ph`` is the driver's placeholder): (namespace, name,
    revision, value) in key order after ``after``, one row more than ``limit`` to tell
    whether more remain. ``node``: only pods bound to that node (``node_expr`` is how the
    backend's index reads spec.nodeName, ``node_table`` the FROM that reaches it)."""
    sql = f"SELECT namespace, name, revision, value FROM objects WHERE resource = {ph}"
    args: list[Any] = [resource]
    if node is not None and resource == NODE_INDEXED:
        # The resource as a literal: a partial index is only used where the query's own text
        # implies its condition (SQLite decides that before parameters are bound).
        sql = f"SELECT namespace, name, revision, value FROM {node_table} WHERE resource = '{NODE_INDEXED}'" \
              f" AND {node_expr} = {ph}"
        args = [node]
    if namespace is not None:
        sql += f" AND namespace = {ph}"
        args.append(namespace)
    if after is not None:
        sql += f" AND (namespace, name) > ({ph}, {ph})"
        args.extend(after)
    sql += " ORDER BY namespace, name"
    if limit:
        sql += f" LIMIT {ph}"
        args.append(limit + 1)
    return sql, args


def events_query(ph: str, columns: str, resource: str | None, namespace: str | None, after: int, upto: int,
                 limit: int) -> tuple[str, list[Any]]:
    """The SELECT of a page of history after < revision <= upto, of one resource and namespace
    where given."""
    sql = f"SELECT {columns} FROM events WHERE revision > {ph} AND revision <= {ph}"
    args: list[Any] = [after, upto]
    if resource is not None:
        sql += f" AND resource = {ph}"
        args.append(resource)
    if namespace is not None:
        sql += f" AND namespace = {ph}"
        args.append(namespace)
    sql += f" ORDER BY revision LIMIT {ph}"
    args.append(limit)
    return sql, args


_METADATA = '"metadata":{'


def stamped_json(text: str, revision: int) -> str:
    """The stored text of an object as a read returns it (``decode``, then encoded again),
    without decoding: resourceVersion spliced into its metadata. The stored text comes from
    ``encode`` (orjson: no whitespace, no resourceVersion); a quote inside a string is always
    escaped, so the first ``"metadata":{`` is a key, and it is the object's own when nothing
    before it opens another object or an array. Otherwise it is decoded and encoded again."""
    i = text.find(_METADATA)
    if i > 0 and text.count("{", 0, i) == 1 and "[" not in text[:i]:
        j = i + len(_METADATA)
        sep = "" if text.startswith("}", j) else ","
        return f'{text[:j]}"resourceVersion":"{revision}"{sep}{text[j:]}'
    return orjson.dumps(decode(text, revision)).decode()


def all_objects(rows: list[Any]) -> bool:
    """Whether every row's value (namespace, name, revision, value) is a JSON object as
    ``encode`` writes it. Another value (one stored encrypted, read by a server without the
    key) is left to the codec, whose decode says why it cannot be read."""
    for r in rows:
        value = r[3]
        if not (value.startswith("{") if isinstance(value, str) else value[:1] == b"{"):
            return False
    return True


def list_page(codec: Codec, resource: str, rows: list[Any], revision: int, limit: int | None) -> ListResult:
    """A ListResult from rows of (namespace, name, revision, value), as objects_query reads
    them: ``limit`` items and the key to continue after when there were more."""
    next_key = None
    if limit and len(rows) > limit:
        rows = rows[:limit]
        next_key = (rows[-1][0], rows[-1][1])
    with gc_paused():
        items = [codec.decode(resource, r[0], r[1], r[3], r[2]) for r in rows]
    return ListResult(items=items, revision=revision, next_key=next_key)
