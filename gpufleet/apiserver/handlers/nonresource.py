"""Non-resource paths: the discovery documents (/api, /apis, their groups and versions),
/metrics (Prometheus text, telemetry.py) and OpenAPI (/openapi/v3, /openapi/v2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.apiserver import discovery, openapi
from gpufleet.apiserver.errors import ApiException
from gpufleet.apiserver.handlers.scope import JSON, json_response
from gpufleet.utils.http import RawRequest, RawResponse

if TYPE_CHECKING:
    from gpufleet.apiserver.server import ApiServer

_NOT_FOUND = "the server could not find the requested resource"


def _extra_group(api: ApiServer, group: str) -> RawResponse | None:
    for d in api.extra_discovery:
        if d["metadata"]["name"] == group:
            v = d["versions"][0]["version"]
            gv = {"groupVersion": f"{group}/{v}", "version": v}
            return json_response(200, {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": [gv],
                                       "preferredVersion": gv})
    return None


def _extra_resources(api: ApiServer, group: str, version: str) -> RawResponse | None:
    for d in api.extra_discovery:
        if d["metadata"]["name"] != group:
            continue
        for v in d["versions"]:
            if v["version"] == version:
                resources = [
                    {"name": r["resource"], "singularName": r.get("singularResource", ""),
                     "namespaced": r.get("scope") == "Namespaced", "kind": r["responseKind"]["kind"],
                     "verbs": r.get("verbs", [])}
                    for r in v.get("resources", [])
                ]
                return json_response(200, {"kind": "APIResourceList", "apiVersion": "v1",
                                           "groupVersion": f"{group}/{version}", "resources": resources})
    return None


async def get(api: ApiServer, req: RawRequest, path: str) -> RawResponse:
    """The document at ``path``; an unknown path is a 404."""
    registry = api.registry
    accept = req.headers.get("accept", "")
    if path in ("/api", "/apis"):
        core = path == "/api"
        agg = discovery.negotiate_aggregated(accept)
        if agg:
            body = discovery.aggregated(registry, agg, core=core,
                                        **({} if core else {"extra_groups": api.extra_discovery}))
            return json_response(200, body, {"content-type": discovery.aggregated_content_type(agg)})
        if core:
            return json_response(200, discovery.api_versions())
        extra = [(d["metadata"]["name"], [v["version"] for v in d["versions"]]) for d in api.extra_discovery]
        return json_response(200, discovery.api_group_list(registry, extra))
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) == 2:
        doc = discovery.api_resource_list(registry, "", parts[1])
        if doc:
            return json_response(200, doc)
    if parts[:1] == ["apis"] and len(parts) == 2:
        doc = discovery.api_group(registry, parts[1])
        found = json_response(200, doc) if doc else _extra_group(api, parts[1])
        if found is not None:
            return found
    if parts[:1] == ["apis"] and len(parts) == 3:
        doc = discovery.api_resource_list(registry, parts[1], parts[2])
        found = json_response(200, doc) if doc else _extra_resources(api, parts[1], parts[2])
        if found is not None:
            return found
    if path == "/metrics" and req.method.upper() in ("GET", "HEAD"):
        body, content_type = api.telemetry.metrics.render()
        return RawResponse(200, {"content-type": content_type}, body)
    if path == "/openapi/v3":
        return json_response(200, openapi.openapi_v3_index(registry))
    if parts[:2] == ["openapi", "v3"] and len(parts) >= 4:
        gv = parts[2:]
        if gv[0] == "api":
            v3 = openapi.openapi_v3_document_bytes(registry, "", gv[1])
        else:
            v3 = openapi.openapi_v3_document_bytes(registry, gv[1], gv[2]) if len(gv) >= 3 else None
        if v3 is not None:
            return RawResponse(200, {"content-type": JSON}, v3[0])
    if path in ("/openapi/v2", "/swagger-2.0.0.pb-v1"):
        if "protobuf" in accept:
            return RawResponse(200, {"content-type": openapi.OPENAPI_V2_CONTENT_TYPE},
                               openapi.openapi_v2_protobuf(registry))
        raise ApiException(406, "NotAcceptable", "only the protobuf form of /openapi/v2 is served")
    raise ApiException(404, "NotFound", _NOT_FOUND)
