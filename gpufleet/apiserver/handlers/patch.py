"""PATCH: JSON, merge and strategic merge patches, and server-side apply.

A patch is applied to the object as read and written back as an update; a conflict against
that read is retried (a patch is a compare-and-swap only where it names a resourceVersion).
A subresource with a view of its own (scale) passes ``view`` and ``write``: the patch applies
to the view and ``write`` stores the result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gpufleet.apiserver import managedfields
from gpufleet.apiserver.errors import ApiException, bad_request, conflict, invalid, not_found
from gpufleet.apiserver.genericregistry import rv
from gpufleet.apiserver.handlers.scope import Scope, json_response, truthy, written
from gpufleet.apiserver.limits import off_loop
from gpufleet.apiserver.patch import PatchError, apply_patch, decode_yaml
from gpufleet.store import base as store_base
from gpufleet.utils.clock import rfc3339
from gpufleet.utils.http import RawResponse

APPLY = "application/apply-patch+yaml"
STRATEGIC = "application/strategic-merge-patch+json"
PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json",
               "application/strategic-merge-patch+json", APPLY)

View = Callable[[dict[str, Any]], dict[str, Any]]
Write = Callable[[Scope, dict[str, Any], dict[str, Any]], Awaitable[dict[str, Any]]]


async def patch(scope: Scope, view: View | None = None, write: Write | None = None) -> RawResponse:
    req, rt, ns, name, sub = scope.req, scope.rt, scope.ns, scope.name, scope.subresource
    ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype not in PATCH_TYPES:
        raise ApiException(
            415, "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include: "
            f"application/json-patch+json, application/merge-patch+json, "
            f"application/strategic-merge-patch+json, application/apply-patch+yaml (got {ctype or 'none'})",
        )
    if ctype == STRATEGIC and not scope.strategy.strategic_merge and view is None:  # /scale is a Scale
        raise unsupported_patch()
    if not req.body:
        raise bad_request("the patch body is empty")
    for attempt in range(10):
        try:
            current = await scope.api.store.get(rt.key, ns, name)
        except store_base.NotFound:
            current = None
        if current is None and (ctype != APPLY or sub):
            raise not_found(rt, name)
        if ctype == APPLY and view is None:
            response = await server_side_apply(scope, current)
            if response is not None:
                return response
            continue
        assert current is not None
        base = view(current) if view is not None else current
        try:
            patched = await off_loop(apply_patch, base, req.body, ctype, rt.kind)
        except PatchError as e:
            raise patch_failure(rt, name, e) from None
        # A patch pins a revision only when it names one itself; otherwise the revision it
        # carries is the one we read, and a conflict just means "read again and re-apply".
        named_rv = named_revision(patched)
        try:
            if write is not None:
                return json_response(200, await write(scope, patched, current))
            obj, warnings = await scope.generic.update(
                rt, ns, name, patched, subresource=sub, field_validation=req.param("fieldValidation"),
                user=scope.user, dry_run=scope.dry_run, current=current, manager=scope.manager,
            )
            return written(200, obj, warnings)
        except ApiException as e:
            # Conflicts against our own read are retried: a patch is not a compare-and-swap
            # unless it names a resourceVersion that is stale.
            if e.code == 409 and e.reason == "Conflict" and named_rv == str(rv(current)) and attempt < 9:
                continue
            raise
    raise conflict(rt, name)


async def server_side_apply(scope: Scope, current: dict[str, Any] | None) -> RawResponse | None:
    """One attempt of server-side apply; None means the object changed under us: retry."""
    req, rt, ns, name, sub = scope.req, scope.rt, scope.ns, scope.name, scope.subresource
    manager = req.param("fieldManager")
    if not manager:
        raise bad_request("PATCH: fieldManager is required for apply requests (e.g. ?fieldManager=my-tool)")
    try:
        applied = await off_loop(decode_yaml, req.body)
    except PatchError as e:
        raise bad_request(f"the apply patch could not be decoded: {e}") from None
    if not isinstance(applied, dict):
        raise bad_request("the apply patch must be an object")
    ameta = applied.get("metadata")
    if isinstance(ameta, dict) and ameta.get("name") not in (None, name):
        raise bad_request(f"the name of the object ({ameta.get('name')}) does not match the name on the URL "
                          f"({name})")
    if current is None:
        applied.setdefault("metadata", {}).setdefault("name", name)
    try:
        new = await off_loop(
            managedfields.apply, current, applied, manager=manager, kind=rt.kind, api_version=rt.api_version,
            force=truthy(req.param("force")), now=rfc3339(scope.api.clock.now()), subresource=sub,
            ignore_status="status" in rt.subresources and sub != "status",
        )
    except managedfields.ApplyConflict as e:
        raise ApiException(409, "Conflict", e.message,
                           {"name": name, "kind": rt.plural, "group": rt.group, "causes": e.causes}) from None
    except managedfields.ManagedFieldsError as e:
        raise bad_request(str(e)) from None
    if current is None:
        obj, warnings = await scope.generic.create(
            rt, ns, new, field_validation=req.param("fieldValidation"), user=scope.user, dry_run=scope.dry_run,
            managed=True)
        return written(201, obj, warnings)
    new.setdefault("metadata", {})["resourceVersion"] = current["metadata"].get("resourceVersion")
    try:
        obj, warnings = await scope.generic.update(
            rt, ns, name, new, subresource=sub, field_validation=req.param("fieldValidation"), user=scope.user,
            dry_run=scope.dry_run, current=current, managed=True)
    except ApiException as e:
        if e.code == 409 and e.reason == "Conflict":
            return None
        raise
    return written(200, obj, warnings)


def unsupported_patch() -> ApiException:
    """A strategic merge patch of a kind without Go types (a custom resource), refused as
    Kubernetes refuses it."""
    return ApiException(
        415, "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml")


def patch_failure(rt: Any, name: str, e: PatchError) -> ApiException:
    """A patch that cannot be applied, as Kubernetes answers it: 400 for a body that is no
    patch, 415 for a patch type it does not know, 422 naming the patch otherwise."""
    if e.status_code == 400:
        return bad_request(str(e))
    if e.status_code == 415:
        return ApiException(415, "UnsupportedMediaType", str(e))
    return invalid(rt, name, [{"reason": "FieldValueInvalid", "field": "patch", "message": str(e)}])


def named_revision(patched: Any) -> str | None:
    """The resourceVersion a patched object names (None: none), once it is checked to be
    an object at all."""
    if not isinstance(patched, dict):
        raise bad_request("the patched object is not a JSON object")
    meta = patched.get("metadata")
    return meta.get("resourceVersion") if isinstance(meta, dict) else None
