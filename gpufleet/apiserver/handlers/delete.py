"""DELETE of one object or a collection, with DeleteOptions as Kubernetes types them."""

from __future__ import annotations

from typing import Any

import orjson

from gpufleet.apiserver.errors import ApiException, bad_request
from gpufleet.apiserver.genericregistry import matches
from gpufleet.apiserver.handlers.list import selectors
from gpufleet.apiserver.handlers.scope import Scope, json_response
from gpufleet.utils.http import RawRequest, RawResponse


def check_delete_options(opts: Any) -> dict[str, Any]:
    """DeleteOptions as Kubernetes types them; anything else is a 400 naming the field."""
    if opts is None:
        return {}
    if not isinstance(opts, dict):
        raise bad_request("DeleteOptions must be a JSON object")
    gp = opts.get("gracePeriodSeconds")
    if gp is not None and (not isinstance(gp, int) or isinstance(gp, bool)):
        raise bad_request(f"gracePeriodSeconds: Invalid value: {gp!r}: must be an integer number of seconds")
    if gp is not None and gp < 0:
        opts["gracePeriodSeconds"] = 1  # Kubernetes treats a negative grace period as 1 second
    if opts.get("propagationPolicy") not in (None, "Foreground", "Background", "Orphan"):
        raise bad_request(
            f'propagationPolicy: Unsupported value: "{opts["propagationPolicy"]}": '
            'supported values: "Foreground", "Background", "Orphan"'
        )
    pre = opts.get("preconditions")
    if pre is not None:
        if not isinstance(pre, dict):
            raise bad_request("preconditions: must be an object with uid and/or resourceVersion")
        for key in ("uid", "resourceVersion"):
            if pre.get(key) is not None and not isinstance(pre[key], str):
                raise bad_request(f"preconditions.{key}: Invalid value: {pre[key]!r}: must be a string")
    if "orphanDependents" in opts and opts["orphanDependents"] is not None:
        if not isinstance(opts["orphanDependents"], bool):
            raise bad_request("orphanDependents: must be true or false")
        if "propagationPolicy" not in opts:
            opts["propagationPolicy"] = "Orphan" if opts["orphanDependents"] else "Background"
    return opts


def delete_options(req: RawRequest) -> dict[str, Any]:
    """The DeleteOptions of the body, with the query's gracePeriodSeconds and propagationPolicy."""
    opts: dict[str, Any] = {}
    if req.body:
        try:
            parsed = orjson.loads(req.body)
        except orjson.JSONDecodeError as e:
            raise bad_request(f"DeleteOptions could not be decoded as JSON: {e}") from None
        if isinstance(parsed, dict):
            opts.update(parsed)
    gp = req.param("gracePeriodSeconds")
    if gp is not None:
        try:
            opts["gracePeriodSeconds"] = int(gp)
        except ValueError:
            raise bad_request(f"gracePeriodSeconds: invalid value {gp!r}: must be an integer") from None
    pp = req.param("propagationPolicy")
    if pp is not None:
        opts["propagationPolicy"] = pp
    return check_delete_options(opts)


async def delete(scope: Scope) -> RawResponse:
    rt, name = scope.rt, scope.name
    options = delete_options(scope.req)
    obj, done = await scope.generic.delete(rt, scope.ns, name, options, user=scope.user, dry_run=scope.dry_run)
    if done and not scope.strategy.returns_object_on_delete:
        # Like kube-apiserver: an immediate delete answers a Success Status, except for
        # pods, whose clients expect the deleted object back.
        details = {"name": name, "kind": rt.plural, "uid": obj.get("metadata", {}).get("uid", "")}
        if rt.group:
            details["group"] = rt.group
        return json_response(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                   "status": "Success", "details": details})
    return json_response(200 if done else 202, obj)


async def delete_collection(scope: Scope) -> RawResponse:
    rt, req = scope.rt, scope.req
    label_sel, field_sel = selectors(req, rt)
    result = await scope.api.store.list(rt.key, scope.ns or None)
    options = delete_options(req)
    deleted = []
    for obj in result.items:
        if not matches(obj, label_sel, field_sel):
            continue
        meta = obj["metadata"]
        try:
            done, _ = await scope.generic.delete(rt, meta.get("namespace", ""), meta["name"], options,
                                                 user=scope.user, dry_run=scope.dry_run)
            deleted.append(done)
        except ApiException as e:
            if e.code != 404:
                raise
    return json_response(200, {"kind": rt.list_kind, "apiVersion": rt.api_version,
                               "metadata": {"resourceVersion": str(await scope.api.store.revision())},
                               "items": deleted})
