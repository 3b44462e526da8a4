"""Requests to a version served from another version's storage (autoscaling/v1 HPAs).

The request is converted to the storage version and served by the storage version's handler;
request bodies are converted in, and every object of the kind in the answer (the object, list
items, Table rows, watch events) is converted out. A patch is applied to the object as the
client's version shows it, then converted, so a v1 client patches v1 fields. Validation errors
of the stored form name the field the client wrote.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from gpufleet.api.conversion import ConversionError
from gpufleet.api.registry import ResourceType
from gpufleet.api.selectors import FieldRequirement, FieldSelector, SelectorError, parse_field_selector
from gpufleet.apiserver import decoding
from gpufleet.apiserver.errors import ApiException, bad_request, invalid, not_found
from gpufleet.apiserver.handlers.patch import named_revision, patch_failure, unsupported_patch
from gpufleet.apiserver.headers import warning_header
from gpufleet.apiserver.patch import PatchError, apply_patch, decode_yaml
from gpufleet.apiserver.requestinfo import RequestInfo
from gpufleet.apiserver.strategy import strategy_for
from gpufleet.store import base as store_base
from gpufleet.utils.http import RawRequest, RawResponse

if TYPE_CHECKING:
    from gpufleet.apiserver.admission import UserInfo
    from gpufleet.apiserver.server import ApiServer

_JSON = "application/json"
_APPLY = "application/apply-patch+yaml"


def _to_storage(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    try:
        return rt.conversion.to_storage(obj)
    except ConversionError as e:
        meta = obj.get("metadata")
        name = str(meta.get("name") or "") if isinstance(meta, dict) else ""
        raise invalid(rt, name, [{"reason": "FieldValueInvalid", "field": e.field, "message": e.message}]) from None


def _out(rt: ResourceType, value: Any) -> Any:
    """Every object of rt's kind inside an answer, in rt's version."""
    if not isinstance(value, dict):
        return value
    kind = value.get("kind")
    storage_api_version = rt.storage_api_version
    if kind == rt.kind and value.get("apiVersion") in (storage_api_version, None) and "metadata" in value:
        if set(value) <= {"apiVersion", "kind", "metadata"}:  # a BOOKMARK: only the version changes
            return {**value, "apiVersion": rt.api_version}
        return rt.conversion.from_storage(value)
    if kind == rt.list_kind:
        return {**value, "apiVersion": rt.api_version,
                "items": [rt.conversion.from_storage({"apiVersion": storage_api_version, "kind": rt.kind, **o})
                          for o in value.get("items") or []]}
    if kind == "Table":
        rows = []
        for row in value.get("rows") or []:
            if isinstance(row, dict) and isinstance(row.get("object"), dict) and row["object"].get("kind") == rt.kind:
                row = {**row, "object": _out(rt, row["object"])}
            rows.append(row)
        return {**value, "rows": rows}
    if "type" in value and isinstance(value.get("object"), dict):  # a watch event
        return {**value, "object": _out(rt, value["object"])}
    return value


def _convert_response(rt: ResourceType, resp: RawResponse) -> RawResponse:
    if resp.stream is not None:
        return RawResponse(resp.status, resp.headers, stream=_convert_stream(rt, resp.stream))
    if not resp.body or not resp.headers.get("content-type", _JSON).startswith(_JSON):
        return resp
    body = orjson.dumps(_out(rt, orjson.loads(resp.body)))
    return RawResponse(resp.status, resp.headers, body)


async def _convert_stream(rt: ResourceType, stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for chunk in stream:
            lines = [line for line in chunk.split(b"\n") if line.strip()]
            yield b"".join(orjson.dumps(_out(rt, orjson.loads(line))) + b"\n" for line in lines)
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


def _renamed(rt: ResourceType, e: ApiException, stored: dict[str, Any]) -> ApiException:
    """A 422 of the stored form, worded with the fields of rt's version."""
    if e.code != 422 or not e.details or not e.details.get("causes"):
        return e
    causes = [{**c, "field": rt.conversion.field_path(c["field"], stored)} if c.get("field") else c
              for c in e.details["causes"]]
    return invalid(rt, e.details.get("name", ""), causes)


def _decode_in(rt: ResourceType, body: Any, name: str, field_validation: str | None,
               ) -> tuple[dict[str, Any], list[str]]:
    """The typed check of a body in rt's version (unknown fields and wrong types named in its
    terms), then the body in the storage version."""
    obj = decoding.check_type(rt, body)
    model, warnings = decoding.decode(rt, obj, name, field_validation)
    return _to_storage(rt, model.to_dict()), warnings


async def serve(server: ApiServer, req: RawRequest, info: RequestInfo, rt: ResourceType,
                user: UserInfo) -> RawResponse:
    storage = server.registry.storage_of(rt)
    verb, sub = info.verb, info.subresource
    if rt.conversion.field_label is not None and info.field_selector:
        req, info = _stored_field_selector(rt, req, info)
    if (verb in ("create", "update") and not sub) or (verb == "update" and sub == "status"):
        body = await decoding.parse_body(req)
        name = info.name or ((body.get("metadata") or {}).get("name", "") if isinstance(body, dict) else "")
        stored, warnings = _decode_in(rt, body, name, req.param("fieldValidation"))
        inner = RawRequest(req.method, req.path, [(k, v) for k, v in req.query if k != "fieldValidation"] +
                           [("fieldValidation", "Strict")], {**req.headers, "content-type": _JSON},
                           orjson.dumps(stored))
        try:
            resp = await server.serve_resource(inner, info, storage, user)
        except ApiException as e:
            raise _renamed(rt, e, stored) from None
        if warnings:
            # The inner request's own warnings (admission's) come after the decoding ones.
            ours = warning_header(warnings)["warning"]
            theirs = resp.headers.get("warning")
            resp.headers["warning"] = f"{ours}, {theirs}" if theirs else ours
        return _convert_response(rt, resp)
    if verb == "patch":
        ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == _APPLY:
            return _convert_response(rt, await server.serve_resource(_apply_in_storage(rt, req), info, storage, user))
        return _convert_response(rt, await _patch(server, req, info, rt, storage, user))
    return _convert_response(rt, await server.serve_resource(req, info, storage, user))


def _stored_field_selector(rt: ResourceType, req: RawRequest, info: RequestInfo) -> tuple[RawRequest, RequestInfo]:
    """The request with its field selector in the stored version's labels."""
    try:
        parsed = parse_field_selector(info.field_selector)
    except SelectorError as e:
        raise bad_request(str(e)) from None
    terms = []
    for term in parsed.requirements:
        label = rt.conversion.field_label(term.field)
        if label is None:
            raise bad_request(f"field label not supported: {term.field}")
        terms.append(FieldRequirement(label, term.operator, term.value))
    selector = str(FieldSelector(terms))
    query = [(k, selector if k == "fieldSelector" else v) for k, v in req.query]
    return replace(req, query=query), replace(info, field_selector=selector)


def _apply_in_storage(rt: ResourceType, req: RawRequest) -> RawRequest:
    """A server-side apply configuration of rt's version, as one of the storage version."""
    try:
        applied = decode_yaml(req.body)
    except PatchError as e:
        raise bad_request(f"the apply patch could not be decoded: {e}") from None
    if not isinstance(applied, dict):
        raise bad_request("the apply patch must be an object")
    if applied.get("apiVersion") not in (None, rt.api_version):
        raise bad_request(f"the API version in the data ({applied.get('apiVersion')}) does not match the expected "
                          f"API version ({rt.api_version})")
    return RawRequest(req.method, req.path, req.query, req.headers, orjson.dumps(_to_storage(rt, applied)))


async def _patch(server: ApiServer, req: RawRequest, info: RequestInfo, rt: ResourceType, storage: ResourceType,
                 user: UserInfo) -> RawResponse:
    """JSON, merge and strategic merge patches, applied to the object in rt's version."""
    ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype not in ("application/json-patch+json", "application/merge-patch+json",
                     "application/strategic-merge-patch+json") or info.subresource not in ("", "status"):
        return await server.serve_resource(req, info, storage, user)  # answers the 415/404 as for any kind
    if ctype == "application/strategic-merge-patch+json" and not strategy_for(rt).strategic_merge:
        raise unsupported_patch()  # a custom resource's other version
    if not req.body:
        raise bad_request("the patch body is empty")
    ns = info.namespace
    name = info.name
    for attempt in range(10):
        try:
            current = await server.store.get(storage.key, ns, name)
        except store_base.NotFound:
            raise not_found(rt, name) from None
        try:
            patched = apply_patch(rt.conversion.from_storage(current), req.body, ctype, rt.kind)
        except PatchError as e:
            raise patch_failure(rt, name, e) from None
        named_rv = named_revision(patched)
        stored, warnings = _decode_in(rt, patched, name, req.param("fieldValidation"))
        try:
            obj, more = await server.update_object(
                storage, ns, name, stored, subresource=info.subresource, field_validation="Strict", user=user,
                dry_run=req.param("dryRun") == "All", current=current,
                manager=req.param("fieldManager") or _manager(req))
        except ApiException as e:
            if e.code == 409 and e.reason == "Conflict" and named_rv == current["metadata"].get("resourceVersion") \
                    and attempt < 9:
                continue
            raise _renamed(rt, e, stored) from None
        return RawResponse(200, {"content-type": _JSON, **warning_header(warnings + more)},
                           orjson.dumps(obj))
    raise ApiException(409, "Conflict", f'Operation cannot be fulfilled on {rt.key} "{name}": the object has been '
                                        "modified; please apply your changes to the latest version and try again")


def _manager(req: RawRequest) -> str | None:
    from gpufleet.apiserver import managedfields

    return managedfields.manager_from_user_agent(req.headers.get("user-agent"))
