"""LIST of a collection: selectors, pages and continue tokens, Tables."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.api.registry import ResourceType
from gpufleet.api.selectors import (
    FieldSelector,
    LabelSelector,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)
from gpufleet.apiserver import params
from gpufleet.apiserver.errors import bad_request
from gpufleet.apiserver.handlers.scope import JSON, Scope, dumps, include_object, wants_table
from gpufleet.utils.http import RawRequest, RawResponse

# Lists longer than this are encoded off the event loop.
OFF_LOOP_ITEMS = 500


def selectors(req: RawRequest, rt: ResourceType) -> tuple[LabelSelector | None, FieldSelector | None]:
    """The request's labelSelector and fieldSelector; a field the kind has no label for is a 400."""
    label_sel = field_sel = None
    try:
        if req.param("labelSelector"):
            label_sel = parse_label_selector(req.param("labelSelector") or "")
    except SelectorError as e:
        raise bad_request(f"unable to parse requirement: {e}") from None
    try:
        if req.param("fieldSelector"):
            field_sel = parse_field_selector(req.param("fieldSelector") or "")
    except SelectorError as e:
        raise bad_request(f"invalid field selector: {e}") from None
    if field_sel is not None:
        allowed = {"metadata.name", "metadata.namespace", *rt.field_labels}
        for f in field_sel.fields():
            if f not in allowed:
                raise bad_request(
                    f'field label not supported: {f} (for {rt.key}: {", ".join(sorted(allowed))})'
                )
    return label_sel, field_sel


async def list_(scope: Scope) -> RawResponse:
    req, rt = scope.req, scope.rt
    label_sel, field_sel = selectors(req, rt)
    params.int64_param(req, "timeoutSeconds")
    params.int64_param(req, "resourceVersion")
    limit_s = req.param("limit")
    try:
        limit = int(limit_s) if limit_s else None
    except ValueError:
        raise bad_request(f"limit: Invalid value: {limit_s!r}: must be an integer") from None
    if limit is not None and limit > 2**63 - 1:
        raise bad_request(f"limit: Invalid value: {limit_s!r}: must fit in a 64-bit integer")
    if limit is not None and limit <= 0:
        limit = None  # Kubernetes: a non-positive limit means no limit
    if label_sel is None and field_sel is None and not req.param("continue") and not wants_table(req):
        raw = await scope.generic.list_json(rt, scope.ns, limit)
        if raw is not None:
            return await _json_list(rt, *raw)
    items, rev, token = await scope.generic.list(rt, scope.ns, label_sel, field_sel, limit, req.param("continue"))
    # A long list is rendered in a worker thread: the loop keeps answering others meanwhile.
    large = len(items) > OFF_LOOP_ITEMS
    if wants_table(req):
        include = include_object(req)

        def table() -> bytes:
            return dumps(scope.strategy.table(items, resource_version=str(rev), continue_token=token,
                                              now=scope.api.clock.now(), include_object=include))
        body = await asyncio.to_thread(table) if large else table()
        return RawResponse(200, {"content-type": JSON}, body)
    meta: dict[str, Any] = {"resourceVersion": str(rev)}
    if token:
        meta["continue"] = token
    doc = {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta, "items": items}
    return RawResponse(200, {"content-type": JSON}, await asyncio.to_thread(dumps, doc) if large else dumps(doc))


async def _json_list(rt: ResourceType, texts: list[str] | list[bytes], rev: int, token: str | None) -> RawResponse:
    """The list document around the stored texts, as ``dumps`` would render the decoded list."""
    meta: dict[str, Any] = {"resourceVersion": str(rev)}
    if token:
        meta["continue"] = token
    head = dumps({"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta})[:-1] + b',"items":['

    def body() -> bytes:
        if not texts:
            return head + b"]}"
        if isinstance(texts[0], str):
            return head + ",".join(texts).encode() + b"]}"  # type: ignore[arg-type]
        # One join, one copy of the whole body: a list of 50,000 pods is 76 MiB, and each
        # further copy of it costs its page faults too.
        items: list[bytes] = texts  # type: ignore[assignment]
        if len(items) == 1:
            return head + items[0] + b"]}"
        return b",".join([head + items[0], *items[1:-1], items[-1] + b"]}"])
    return RawResponse(200, {"content-type": JSON}, await asyncio.to_thread(body) if len(texts) > OFF_LOOP_ITEMS
                       else body())
