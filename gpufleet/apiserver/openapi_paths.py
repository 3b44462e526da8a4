"""The v3 paths of a kind: its operations and their parameters, as kubectl looks for them.
"""

from __future__ import annotations

from typing import Any

from gpufleet.api.registry import ResourceType
from gpufleet.apiserver.openapi_common import (
    _DELETE_PARAMS,
    _LIST_PARAMS,
    _QUERY_DESCRIPTIONS,
    _QUERY_TYPES,
    _WRITE_PARAMS,
    _gvk,
    _operation_prefix,
)

# --- v3 paths ------------------------------------------------------------------------------


def _query(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "description": _QUERY_DESCRIPTIONS.get(name, ""),
        "schema": {"type": _QUERY_TYPES.get(name, "string")},
    }


def _path_param(name: str) -> dict[str, Any]:
    what = (
        "name of the object"
        if name == "name"
        else "object name and auth scope, such as for teams and projects"
    )
    return {"name": name, "in": "path", "description": what, "required": True, "schema": {"type": "string"}}


def _operation(
    rt: ResourceType,
    action: str,
    op_id: str,
    params: tuple[str, ...],
    ref: dict[str, Any] | None,
    *,
    with_body: bool = False,
    status_codes: tuple[str, ...] = ("200",),
) -> dict[str, Any]:
    response: dict[str, Any] = {"description": "OK"}
    if ref is not None and action not in ("list", "deletecollection"):
        response["content"] = {"application/json": {"schema": ref}}
    prefix = _operation_prefix(rt)
    op: dict[str, Any] = {
        "tags": [prefix[:1].lower() + prefix[1:]],
        "operationId": op_id,
        "parameters": [_query(p) for p in params],
        "responses": {code: response for code in status_codes},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(rt),
    }
    if with_body and ref is not None:
        op["requestBody"] = {"content": {"*/*": {"schema": ref}}, "required": True}
    return op


def _paths_for(rt: ResourceType, ref: dict[str, Any] | None) -> dict[str, Any]:
    prefix = _operation_prefix(rt)
    scoped = "Namespaced" if rt.namespaced else ""
    verbs = set(rt.verbs)
    collection_path = rt.path(namespace="{namespace}")
    item_path = rt.path(namespace="{namespace}", name="{name}")
    scope_params = [_path_param("namespace")] if rt.namespaced else []

    collection: dict[str, Any] = {"parameters": scope_params} if scope_params else {}
    if "list" in verbs:
        collection["get"] = _operation(rt, "list", f"list{prefix}{scoped}{rt.kind}", _LIST_PARAMS, ref)
    if "create" in verbs:
        collection["post"] = _operation(
            rt,
            "post",
            f"create{prefix}{scoped}{rt.kind}",
            _WRITE_PARAMS,
            ref,
            with_body=True,
            status_codes=("200", "201", "202"),
        )
    if "deletecollection" in verbs:
        collection["delete"] = _operation(
            rt,
            "deletecollection",
            f"deletecollection{prefix}{scoped}{rt.kind}",
            _DELETE_PARAMS + _LIST_PARAMS,
            ref,
        )

    item: dict[str, Any] = {"parameters": [_path_param("name"), *scope_params]}
    if "get" in verbs:
        item["get"] = _operation(rt, "get", f"read{prefix}{scoped}{rt.kind}", (), ref)
    if "update" in verbs:
        item["put"] = _operation(
            rt,
            "put",
            f"replace{prefix}{scoped}{rt.kind}",
            _WRITE_PARAMS,
            ref,
            with_body=True,
            status_codes=("200", "201"),
        )
    if "patch" in verbs:
        item["patch"] = _operation(
            rt,
            "patch",
            f"patch{prefix}{scoped}{rt.kind}",
            (*_WRITE_PARAMS, "force"),
            ref,
            status_codes=("200", "201"),
        )
    if "delete" in verbs:
        item["delete"] = _operation(
            rt, "delete", f"delete{prefix}{scoped}{rt.kind}", _DELETE_PARAMS, ref, status_codes=("200", "202")
        )

    paths: dict[str, Any] = {}
    if len(collection) > (1 if scope_params else 0):
        paths[collection_path] = collection
    if len(item) > 1:
        paths[item_path] = item
    if rt.namespaced and "list" in verbs:
        paths[rt.path()] = {
            "get": _operation(rt, "list", f"list{prefix}{rt.kind}ForAllNamespaces", _LIST_PARAMS, ref)
        }
    return paths
