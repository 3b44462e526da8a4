"""The API server core: Kubernetes REST semantics over the versioned store.

`ApiServer.handle` takes a RawRequest and gives a RawResponse. The HTTP adapter (app.py)
and the client's in-process transport both call it, so every component sees the same
behaviour whether it runs inside `gpufleet up` or across the network.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import json
import logging
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from pydantic import ValidationError

from gpufleet.api import defaults as api_defaults
from gpufleet.api import validation as api_validation
from gpufleet.api.registry import REGISTRY, Registry, ResourceType
from gpufleet.api.selectors import (
    FieldSelector,
    LabelSelector,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)
from gpufleet.apiserver import discovery, managedfields, openapi, params, tables, versions
from gpufleet.apiserver.admission import (
    AdmissionContext,
    MutatingPlugin,
    UserInfo,
    ValidatingPlugin,
    standard_plugins,
)
from gpufleet.apiserver.admission.podsecurity import PodSecurityConfig
from gpufleet.apiserver.apimetrics import InstrumentedStore
from gpufleet.apiserver.errors import (
    ApiException,
    already_exists,
    bad_request,
    conflict,
    internal,
    invalid,
    method_not_allowed,
    not_found,
)
from gpufleet.apiserver.eviction import evict
from gpufleet.apiserver.flowcontrol import FlowControl
from gpufleet.apiserver.headers import safe_headers, warning_header
from gpufleet.apiserver.limits import RequestLimits, body_too_large, check_object_size, off_loop, serving
from gpufleet.apiserver.patch import PatchError, apply_patch, decode_json, decode_yaml
from gpufleet.apiserver.requestinfo import RequestInfo, parse_request
from gpufleet.apiserver.telemetry import RequestRecord, Telemetry
from gpufleet.store import base as store_base
from gpufleet.utils.clock import REAL_CLOCK, Clock, parse_rfc3339, rfc3339
from gpufleet.utils.http import BodyIncomplete, BodyTooLarge, RawRequest, RawResponse

log = logging.getLogger("gpufleet.apiserver")

JSON = "application/json"
_PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json",
                "application/strategic-merge-patch+json", "application/apply-patch+yaml")
_MAX_PAGE = 5000
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# Kinds whose status a create may set (the agent registers its Node with what it found).
_STATUS_ON_CREATE = {"Node", "Event", "Lease"}
# Kinds whose spec changes are not tracked by metadata.generation on a real cluster.
_NO_GENERATION = {"Pod", "Namespace", "Node", "Service", "ResourceQuota", "PersistentVolume",
                  "PersistentVolumeClaim"}
_WATCH_DEFAULT_TIMEOUT = 1800.0
# Lists longer than this are encoded off the event loop.
_OFF_LOOP_ITEMS = 500

LogProvider = Callable[[dict[str, Any], RawRequest], Awaitable[RawResponse]]
# Serves nodes/{name}/proxy/...: (node name, the path after /proxy, the request).
NodeProxyProvider = Callable[[str, str, RawRequest], Awaitable[RawResponse]]
Authenticator = Callable[[RawRequest], Awaitable[UserInfo | None]]
Authorizer = Callable[[UserInfo, RequestInfo], Awaitable[bool]]


def _truthy(v: str | None) -> bool:
    return v is not None and v.lower() in ("true", "1", "yes")


def _is_read(method: str) -> bool:
    return method.upper() in ("GET", "HEAD")


async def _decided(rec: RequestRecord, verdict: Awaitable[bool]) -> bool:
    """The authorizer's verdict, noted for the audit log (a refusal it raises is one too)."""
    rec.decision = "forbid"
    allowed = await verdict
    rec.decision = "allow" if allowed else "forbid"
    return allowed


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:
        # orjson refuses lone surrogates; an error about such input must still be rendered.
        return json.dumps(obj, ensure_ascii=True, default=str).encode()


def _json_response(status: int, obj: Any, headers: dict[str, str] | None = None) -> RawResponse:
    h = {"content-type": JSON}
    if headers:
        h.update(headers)
    return RawResponse(status=status, headers=h, body=_dumps(obj))


def _field_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _delete_path(obj: Any, loc: tuple) -> None:
    cur = obj
    for part in loc[:-1]:
        try:
            cur = cur[part]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(cur, dict):
        cur.pop(loc[-1], None)


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    m = obj.get("metadata")
    if not isinstance(m, dict):
        m = {}
        obj["metadata"] = m
    return m


def _rv(obj: dict[str, Any]) -> int:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def _key_of(obj: dict[str, Any]) -> tuple[str, str]:
    m = obj.get("metadata", {})
    return (m.get("namespace", "") or "", m.get("name", ""))


def _strip_for_compare(obj: dict[str, Any]) -> dict[str, Any]:
    out = dict(obj)
    m = dict(out.get("metadata") or {})
    m.pop("resourceVersion", None)
    m.pop("managedFields", None)
    out["metadata"] = m
    return out


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


class ApiServer:
    def __init__(
        self,
        store: store_base.Store,
        *,
        registry: Registry = REGISTRY,
        clock: Clock = REAL_CLOCK,
        event_ttl: float = 3600.0,
        mutating: list[MutatingPlugin] | None = None,
        validating: list[ValidatingPlugin] | None = None,
        authenticator: Authenticator | None = None,
        authorizer: Authorizer | None = None,
        log_provider: LogProvider | None = None,
        pod_security: PodSecurityConfig | None = None,
    ) -> None:
        """``pod_security``: the PodSecurity plugin's configuration in the standard chain
        (default: enforce baseline in every namespace but kube-system)."""
        # Metrics (/metrics) and, once enabled, audit logging of every request; store calls
        # are timed through the wrapper.
        self.telemetry = Telemetry(self)
        self.store = InstrumentedStore(store, self.telemetry.metrics)
        self.registry = registry
        self.clock = clock
        self.event_ttl = event_ttl
        if mutating is None and validating is None:
            mutating, validating = standard_plugins(pod_security)
        self.mutating = list(mutating or [])
        self.validating = list(validating or [])
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.log_provider = log_provider
        self.node_proxy_provider: NodeProxyProvider | None = None
        # Serves serviceaccounts/{name}/token (auth/serviceaccounts.py's TokenIssuer); without
        # one, no service account tokens are issued and the subresource answers 404.
        self.token_issuer: Any = None
        # Read-only groups served by other parts (e.g. metrics.k8s.io): name -> handler
        self.extra_groups: dict[tuple[str, str], Callable[[RawRequest, RequestInfo], Awaitable[RawResponse]]] = {}
        self.extra_discovery: list[dict] = []
        # Body and object sizes (limits.py) and the seats requests take (flowcontrol.py).
        self.limits = RequestLimits()
        self.flow = FlowControl()

    @property
    def handler(self) -> ApiServer:
        return self

    async def start(self) -> None:
        for ns in DEFAULT_NAMESPACES:
            try:
                await self.create_object(self.registry.by_key("namespaces"), "", {"metadata": {"name": ns}})
            except ApiException as e:
                if e.code != 409:
                    raise
        for plugin in dict.fromkeys([*self.mutating, *self.validating]):
            start = getattr(plugin, "start", None)
            if start is not None:
                await start(self)  # e.g. the built-in PriorityClasses

    # ------------------------------------------------------------------ dispatch

    async def handle(self, req: RawRequest) -> RawResponse:
        """Every request passes here once: its metrics and audit events are recorded around
        the dispatch (telemetry.py), nowhere else."""
        rec = self.telemetry.begin(req)
        try:
            resp = await self._handle(req, rec)
        except ApiException as e:
            resp = _json_response(e.code, e.status(), e.headers)
        except store_base.TransformError as e:  # a stored value this server has no key for
            log.error("%s %s: %s", req.method, req.path, e)
            resp = _json_response(500, internal(str(e)).status())
        except Exception as e:  # a bug: answer 500 in Status shape, keep serving
            log.exception("internal error serving %s %s", req.method, req.path)
            err = internal(f"{type(e).__name__}: {e}")
            resp = _json_response(500, err.status())
        except BaseException:  # cancelled: the client went away
            self.telemetry.abandoned(rec)
            raise
        # After a write is stored its answer must reach the client: no header may fail to encode.
        resp.headers = safe_headers(resp.headers)
        return self.telemetry.finish(rec, resp)

    async def _handle(self, req: RawRequest, rec: RequestRecord) -> RawResponse:
        path = req.path.rstrip("/") or "/"
        method = req.method.upper()
        if path in ("/healthz", "/readyz", "/livez"):
            return RawResponse(200, {"content-type": "text/plain"}, b"ok")
        if path == "/version":
            return _json_response(200, discovery.VERSION_INFO)
        is_watch = _truthy(req.param("watch"))
        info = parse_request(method, path, is_watch, req.param("fieldSelector") or "",
                             req.param("labelSelector") or "")
        limit = self.limits.max_request_body_bytes
        declared = req.declared_length()
        if limit and declared is not None and declared > limit:
            # Refused from the headers alone, nothing of it read, whoever sends it; who that is
            # decides only whether the rest is drained or the connection cut (app.py).
            with contextlib.suppress(ApiException):
                await self._authenticate(req)
                req.authenticated = True
            raise body_too_large(limit)
        user = await self._authenticate(req)
        self.telemetry.authenticated(rec, info, user)
        req.authenticated = True
        async with self.flow.seat(user, info):
            try:
                body = await req.read_body(limit)
            except BodyTooLarge as e:
                raise body_too_large(e.limit) from None
            except BodyIncomplete:
                raise bad_request("the request body ended before its end: the client went away") from None
            with serving(len(body), self.limits.off_loop_bytes):
                return await self._serve(req, rec, info, user, path, method)

    async def _serve(self, req: RawRequest, rec: RequestRecord, info: RequestInfo, user: UserInfo, path: str,
                     method: str) -> RawResponse:
        if self.authorizer is not None and path not in ("/healthz", "/readyz", "/livez", "/version"):
            allowed = await _decided(rec, self.authorizer(user, info))
            if not allowed:
                what = f'{info.resource}{"/" + info.subresource if info.subresource else ""}'
                scope = f' in the namespace "{info.namespace}"' if info.namespace else " at the cluster scope"
                group = f' in API group "{info.group}"' if info.is_resource_request else ""
                # Kubernetes' wording: the group-qualified resource, then what was refused.
                qualified_resource = f"{info.resource}.{info.group}" if info.group else info.resource
                msg = (
                    f'{qualified_resource}{f" {chr(34)}{info.name}{chr(34)}" if info.name else ""} is forbidden: '
                    f'User "{user.name}" cannot {info.verb} resource "{what}"{group}{scope}'
                    if info.is_resource_request
                    else f'forbidden: User "{user.name}" cannot {method.lower()} path "{path}"'
                )
                details = ({"name": info.name, "group": info.group, "kind": info.resource}
                           if info.is_resource_request else None)
                raise ApiException(403, "Forbidden", msg, details)
        if not info.is_resource_request:
            return await self._non_resource(req, path)
        ext = self.extra_groups.get((info.group, info.version))
        if ext is not None:
            return await ext(req, info)
        rt = self.registry.by_resource(info.group, info.version, info.resource)
        if rt is None:
            raise ApiException(404, "NotFound", "the server could not find the requested resource")
        if rt.namespaced and not info.namespace and info.verb not in ("list", "watch", "deletecollection"):
            raise ApiException(404, "NotFound", "the server could not find the requested resource")
        if not rt.namespaced and info.namespace:
            raise ApiException(404, "NotFound", "the server could not find the requested resource")
        if info.subresource and info.subresource not in rt.subresources:
            raise ApiException(404, "NotFound", "the server could not find the requested resource")
        if info.verb not in rt.verbs and not info.subresource:
            raise method_not_allowed()
        if not rt.is_storage:
            return await versions.serve(self, req, info, rt, user)
        return await self._resource(req, info, rt, user)

    async def _authenticate(self, req: RawRequest) -> UserInfo:
        if self.authenticator is None:
            return UserInfo(name="system:admin", groups=["system:masters", "system:authenticated"])
        user = await self.authenticator(req)
        if user is None:
            raise ApiException(401, "Unauthorized", "Unauthorized")
        return user

    async def _non_resource(self, req: RawRequest, path: str) -> RawResponse:
        """Discovery and OpenAPI documents: read only, so another method on a path that names
        one is a 405 (an unknown path stays a 404)."""
        resp = await self._non_resource_get(req, path)
        if req.method.upper() not in ("GET", "HEAD"):
            raise method_not_allowed()
        return resp

    async def _non_resource_get(self, req: RawRequest, path: str) -> RawResponse:
        accept = req.headers.get("accept", "")
        if path == "/api":
            agg = discovery.negotiate_aggregated(accept)
            if agg:
                body = discovery.aggregated(self.registry, agg, core=True)
                return _json_response(200, body, {"content-type": discovery.aggregated_content_type(agg)})
            return _json_response(200, discovery.api_versions())
        if path == "/apis":
            agg = discovery.negotiate_aggregated(accept)
            if agg:
                body = discovery.aggregated(self.registry, agg, core=False, extra_groups=self.extra_discovery)
                return _json_response(200, body, {"content-type": discovery.aggregated_content_type(agg)})
            extra = [(d["metadata"]["name"], [v["version"] for v in d["versions"]]) for d in self.extra_discovery]
            return _json_response(200, discovery.api_group_list(self.registry, extra))
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["api"] and len(parts) == 2:
            doc = discovery.api_resource_list(self.registry, "", parts[1])
            if doc:
                return _json_response(200, doc)
        if parts[:1] == ["apis"] and len(parts) == 2:
            doc = discovery.api_group(self.registry, parts[1])
            if doc:
                return _json_response(200, doc)
            for d in self.extra_discovery:
                if d["metadata"]["name"] == parts[1]:
                    v = d["versions"][0]["version"]
                    gv = {"groupVersion": f"{parts[1]}/{v}", "version": v}
                    return _json_response(
                        200, {"kind": "APIGroup", "apiVersion": "v1", "name": parts[1], "versions": [gv],
                              "preferredVersion": gv})
        if parts[:1] == ["apis"] and len(parts) == 3:
            doc = discovery.api_resource_list(self.registry, parts[1], parts[2])
            if doc:
                return _json_response(200, doc)
            for d in self.extra_discovery:
                if d["metadata"]["name"] != parts[1]:
                    continue
                for v in d["versions"]:
                    if v["version"] == parts[2]:
                        resources = [
                            {"name": r["resource"], "singularName": r.get("singularResource", ""),
                             "namespaced": r.get("scope") == "Namespaced", "kind": r["responseKind"]["kind"],
                             "verbs": r.get("verbs", [])}
                            for r in v.get("resources", [])
                        ]
                        return _json_response(200, {"kind": "APIResourceList", "apiVersion": "v1",
                                                    "groupVersion": f"{parts[1]}/{parts[2]}",
                                                    "resources": resources})
        if path == "/metrics" and _is_read(req.method):
            body, content_type = self.telemetry.metrics.render()
            return RawResponse(200, {"content-type": content_type}, body)
        if path == "/openapi/v3":
            return _json_response(200, openapi.openapi_v3_index(self.registry))
        if parts[:2] == ["openapi", "v3"] and len(parts) >= 4:
            gv = parts[2:]
            if gv[0] == "api":
                doc = openapi.openapi_v3_document_bytes(self.registry, "", gv[1])
            else:
                doc = openapi.openapi_v3_document_bytes(self.registry, gv[1], gv[2]) if len(gv) >= 3 else None
            if doc is not None:
                return RawResponse(200, {"content-type": JSON}, doc[0])
        if path in ("/openapi/v2", "/swagger-2.0.0.pb-v1"):
            if "protobuf" in accept:
                return RawResponse(
                    200,
                    {"content-type": openapi.OPENAPI_V2_CONTENT_TYPE},
                    openapi.openapi_v2_protobuf(self.registry),
                )
            raise ApiException(406, "NotAcceptable", "only the protobuf form of /openapi/v2 is served")
        raise ApiException(404, "NotFound", "the server could not find the requested resource")

    async def _resource(self, req: RawRequest, info: RequestInfo, rt: ResourceType, user: UserInfo) -> RawResponse:
        verb, sub = info.verb, info.subresource
        ns = info.namespace if rt.namespaced else ""
        dry_run = False
        if verb in ("create", "update", "patch", "delete", "deletecollection") and sub not in ("log", "proxy"):
            dry_run = params.write_options(req, verb)["dry_run"]
        manager = req.param("fieldManager") or managedfields.manager_from_user_agent(req.headers.get("user-agent"))
        if sub == "log":
            return await self._pod_log(req, rt, ns, info.name)
        if sub == "proxy":
            return await self._node_proxy(req, info)
        if sub in ("binding", "eviction"):
            if verb != "create":
                raise method_not_allowed()
            body = await self._parse_body(req)
            if sub == "binding":
                return _json_response(201, await self.bind_pod(rt, ns, info.name, body, user))
            return _json_response(201, await self.evict_pod(rt, ns, info.name, body, user))
        if sub == "scale":
            return await self._scale(req, info, rt, ns, user)
        if sub == "token":
            if self.token_issuer is None:
                raise ApiException(404, "NotFound", "the server could not find the requested resource")
            if verb != "create":
                raise method_not_allowed()
            obj, warnings = await self.token_issuer.create(self, rt, ns, info.name, await self._parse_body(req), user,
                                                           dry_run)
            return _json_response(201, obj, self._warning_headers(warnings))
        if verb == "get":
            obj = await self.get_object(rt, ns, info.name)
            return self._render_object(req, rt, obj)
        if verb == "list":
            return await self._list(req, rt, info.namespace if rt.namespaced else "")
        if verb == "watch":
            return await self._watch(req, rt, info.namespace if rt.namespaced else "", info.name)
        if verb == "create":
            if sub:
                raise method_not_allowed()
            body = await self._parse_body(req)
            obj, warnings = await self.create_object(
                rt, ns, body, field_validation=req.param("fieldValidation"), user=user, dry_run=dry_run,
                manager=manager,
            )
            return _json_response(201, obj, self._warning_headers(warnings))
        if verb == "update":
            body = await self._parse_body(req)
            obj, warnings = await self.update_object(
                rt, ns, info.name, body, subresource=sub, field_validation=req.param("fieldValidation"),
                user=user, dry_run=dry_run, manager=manager,
            )
            return _json_response(200, obj, self._warning_headers(warnings))
        if verb == "patch":
            return await self._patch(req, rt, ns, info.name, sub, user, dry_run, manager)
        if verb == "delete":
            options = self._delete_options(req)
            obj, done = await self.delete_object(rt, ns, info.name, options, user=user, dry_run=dry_run)
            if done and rt.kind != "Pod":
                # Like kube-apiserver: an immediate delete answers a Success Status, except for
                # pods, whose clients expect the deleted object back.
                details = {"name": info.name, "kind": rt.plural, "uid": obj.get("metadata", {}).get("uid", "")}
                if rt.group:
                    details["group"] = rt.group
                return _json_response(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                            "status": "Success", "details": details})
            return _json_response(200 if done else 202, obj)
        if verb == "deletecollection":
            return await self._delete_collection(req, rt, info.namespace if rt.namespaced else "", user, dry_run)
        raise method_not_allowed()

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _warning_headers(warnings: list[str]) -> dict[str, str]:
        return warning_header(warnings)

    @staticmethod
    async def _parse_body(req: RawRequest) -> Any:
        ctype = req.headers.get("content-type", JSON).split(";")[0].strip().lower()
        if not req.body:
            raise bad_request("the request body is empty: send the object as JSON")
        if ctype == "application/vnd.kubernetes.protobuf":
            from gpufleet.apiserver.protobuf import decode_k8s_protobuf

            return await off_loop(decode_k8s_protobuf, req.body, REGISTRY)
        if "protobuf" in ctype or ctype in _PATCH_TYPES:
            raise ApiException(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {ctype}")
        try:
            return await off_loop(decode_yaml if "yaml" in ctype else decode_json, req.body)
        except PatchError as e:
            raise bad_request(f"the body of the request could not be decoded as {ctype or 'JSON'}: {e}") from None

    def _delete_options(self, req: RawRequest) -> dict[str, Any]:
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

    def _render_object(self, req: RawRequest, rt: ResourceType, obj: dict[str, Any]) -> RawResponse:
        if self._wants_table(req):
            table = tables.to_table(
                rt, [obj], resource_version=str(_rv(obj)), now=self.clock.now(),
                include_object=self._include_object(req),
            )
            return _json_response(200, table)
        return _json_response(200, obj)

    @staticmethod
    def _include_object(req: RawRequest) -> str:
        value = req.param("includeObject") or "Metadata"
        if value not in ("None", "Metadata", "Object"):
            raise bad_request(f'includeObject: Unsupported value: "{value}": supported values: '
                              '"None", "Metadata", "Object"')
        return value

    @staticmethod
    def _wants_table(req: RawRequest) -> bool:
        accept = req.headers.get("accept", "").replace(" ", "")
        first = accept.split(",")[0] if accept else ""
        return "as=Table" in first

    def _namespace_rt(self) -> ResourceType:
        rt = self.registry.by_key("namespaces")
        assert rt is not None
        return rt

    async def _check_namespace(self, ns: str, rt: ResourceType) -> None:
        if not rt.namespaced:
            return
        try:
            nso = await self.store.get("namespaces", "", ns)
        except store_base.NotFound:
            raise not_found(self._namespace_rt(), ns) from None
        if nso.get("metadata", {}).get("deletionTimestamp"):
            raise ApiException(
                403, "Forbidden",
                f'{rt.key} is forbidden: unable to create new content in namespace {ns} because it is being terminated',
                {"name": ns, "kind": rt.plural, "causes": [{"reason": "NamespaceTerminating",
                                                            "message": f"namespace {ns} is being terminated",
                                                            "field": "metadata.namespace"}]},
            )

    def _decode(self, rt: ResourceType, obj: dict[str, Any], name: str, field_validation: str | None):
        """Typed check of the wire object. Returns (model, warnings). Unknown fields follow
        fieldValidation like Kubernetes: Strict rejects, Warn (the default) and Ignore drop them."""
        mode = (field_validation or "Warn").capitalize()
        model_cls = rt.model
        warnings: list[str] = []
        for _ in range(3):
            try:
                return model_cls.model_validate(obj), warnings
            except ValidationError as e:
                errors = e.errors(include_url=False)
            unknown = [err for err in errors if err["type"] == "extra_forbidden"]
            missing = [err for err in errors if err["type"] == "missing"]
            other = [err for err in errors if err["type"] not in ("extra_forbidden", "missing")]
            if other:
                causes = [
                    {"reason": "FieldValueInvalid", "message": f"Invalid value: {err['msg']}",
                     "field": _field_path(err["loc"])} for err in other
                ]
                listed = "; ".join(f"{c['field']}: {c['message']}" for c in causes)
                raise bad_request(
                    f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {listed}', causes
                )
            if unknown and mode == "Strict":
                names = ", ".join(f'unknown field "{_field_path(err["loc"])}"' for err in unknown)
                raise bad_request(
                    f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                    f"strict decoding error: {names}",
                    [{"reason": "FieldValueInvalid", "message": f'unknown field "{_field_path(err["loc"])}"',
                      "field": _field_path(err["loc"])} for err in unknown],
                )
            if unknown:
                if mode == "Warn":
                    warnings += [f'unknown field "{_field_path(err["loc"])}"' for err in unknown]
                for err in sorted(unknown, key=lambda x: len(x["loc"]), reverse=True):
                    _delete_path(obj, err["loc"])
                if not missing:
                    continue
            if missing:
                raise invalid(rt, name, [
                    {"reason": "FieldValueRequired", "message": "Required value", "field": _field_path(err["loc"])}
                    for err in missing
                ])
        raise bad_request(f"{rt.kind} could not be decoded")

    def _finish(self, rt: ResourceType, model: Any, name: str, old_model: Any | None) -> dict[str, Any]:
        api_defaults.apply_defaults(model)
        if old_model is None:
            errors = api_validation.validate_create(model)
        else:
            errors = api_validation.validate_update(model, old_model)
        if errors:
            raise invalid(rt, name, [
                {"reason": e.type, "message": e.message().split(": ", 1)[1] if e.field else e.message(),
                 "field": e.field} for e in errors
            ])
        try:
            out = model.to_dict()
        except ValueError as e:  # pydantic refuses to serialize nesting past its depth limit
            raise bad_request(f"{rt.kind} in version \"{rt.version}\" cannot be handled as a {rt.kind}: "
                              f"{e}: the object nests too deeply") from None
        meta = out.get("metadata")
        if meta:
            # Kubernetes omits empty metadata maps and lists (a removed last label leaves no `labels: {}`).
            for key in ("labels", "annotations", "finalizers", "ownerReferences"):
                if key in meta and not meta[key]:
                    del meta[key]
        return out

    def _check_type(self, rt: ResourceType, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad_request(f"the request body must be a {rt.kind} object, got {type(body).__name__}")
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if kind not in (None, "", rt.kind) or api_version not in (None, "", rt.api_version):
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({rt.api_version})" if api_version not in (None, "", rt.api_version)
                else f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
            )
        body["apiVersion"], body["kind"] = rt.api_version, rt.kind
        meta = body.get("metadata")
        if meta is not None:
            if not isinstance(meta, dict):
                raise bad_request("metadata: Invalid value: must be an object (ObjectMeta)",
                                  [{"reason": "FieldValueTypeInvalid", "field": "metadata",
                                    "message": "must be an object"}])
            for key in ("name", "generateName", "namespace", "uid", "resourceVersion"):
                if meta.get(key) is not None and not isinstance(meta[key], str):
                    raise bad_request(f"metadata.{key}: Invalid value: {meta[key]!r}: must be a string",
                                      [{"reason": "FieldValueTypeInvalid", "field": f"metadata.{key}",
                                        "message": "must be a string"}])
        return body

    def _reset_status(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        if "status" not in rt.subresources or rt.kind in _STATUS_ON_CREATE:
            return
        if rt.kind == "Pod":
            obj["status"] = {"phase": "Pending"}
        else:
            obj.pop("status", None)

    def _track_fields(self, rt: ResourceType, old: dict[str, Any] | None, new: dict[str, Any],
                      manager: str | None, managed: bool, subresource: str) -> dict[str, Any]:
        """Field ownership of a non-apply write (Kubernetes' managedFields, operation Update)."""
        meta = new.get("metadata")
        if managed or manager is None:
            if isinstance(meta, dict) and not managed:
                # Internal writes keep what is stored; clients do not get to rewrite history.
                kept = managedfields.accepted_managed_fields(meta.get("managedFields"), old,
                                                             subresource=subresource)
                if kept is None:
                    meta.pop("managedFields", None)
                else:
                    meta["managedFields"] = kept
            return new
        try:
            return managedfields.record_update(
                old, new, manager=manager, kind=rt.kind, api_version=rt.api_version,
                now=rfc3339(self.clock.now()), subresource=subresource,
                ignore_status="status" in rt.subresources and subresource != "status",
            )
        except managedfields.ManagedFieldsError as e:
            raise bad_request(f"metadata.managedFields: {e}") from None

    async def _allocate_cluster_ip(self, obj: dict[str, Any]) -> None:
        """A virtual IP per Service from 10.96.0.0/12, as kube-apiserver's default range; the
        gateway routes by Service name, the address keeps `get svc` and clients honest."""
        spec = obj.get("spec")
        if not isinstance(spec, dict) or spec.get("type") == "ExternalName" or spec.get("clusterIP"):
            if isinstance(spec, dict) and spec.get("clusterIP") and not spec.get("clusterIPs"):
                spec["clusterIPs"] = [spec["clusterIP"]]
            return
        used = set()
        result = await self.store.list("services", None)
        for svc in result.items:
            used.add((svc.get("spec") or {}).get("clusterIP"))
        base = int(ipaddress.IPv4Address("10.96.0.0"))
        for _ in range(1000):
            # 10.96.0.1 is the default/kubernetes Service's, as Kubernetes reserves it.
            candidate = str(ipaddress.IPv4Address(base + secrets.randbelow(2**20 - 3) + 2))
            if candidate not in used:
                spec["clusterIP"] = candidate
                spec["clusterIPs"] = [candidate]
                return
        raise ApiException(500, "InternalError", "Internal error occurred: failed to allocate a serviceIP: "
                           "range is full")

    async def _admit(self, op: str, rt: ResourceType, ns: str, name: str, sub: str, obj: dict, old: dict | None,
                     user: UserInfo, dry_run: bool, mutate: bool) -> list[str]:
        """Runs the mutating or the validating chain; returns the warnings the plugins gave."""
        ctx = AdmissionContext(op, rt, ns, name, sub, user, dry_run, self)
        plugins = self.mutating if mutate else self.validating
        for p in plugins:
            if mutate:
                await p.admit(ctx, obj, old)  # type: ignore[union-attr]
            else:
                await p.validate(ctx, obj, old)  # type: ignore[union-attr]
        return ctx.warnings

    # ------------------------------------------------------------------ verbs (also used in-process)

    async def get_object(self, rt: ResourceType, ns: str, name: str) -> dict[str, Any]:
        try:
            return await self.store.get(rt.key, ns, name)
        except store_base.NotFound:
            raise not_found(rt, name) from None

    async def create_object(
        self,
        rt: ResourceType | None,
        ns: str,
        body: Any,
        *,
        field_validation: str | None = None,
        user: UserInfo | None = None,
        dry_run: bool = False,
        manager: str | None = None,
        managed: bool = False,
    ) -> tuple[dict[str, Any], list[str]]:
        """``manager`` records field ownership (metadata.managedFields) as an Update;
        ``managed``: the caller (server-side apply) already did."""
        assert rt is not None
        user = user or UserInfo(name="system:apiserver")
        obj = self._check_type(rt, body)
        meta = _meta(obj)
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and ns and body_ns != ns:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            ns = ns or body_ns or "default"
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
            ns = ""
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise invalid(rt, "", [{"reason": "FieldValueRequired", "field": "metadata.name",
                                        "message": "Required value: name or generateName is required"}])
            alphabet = "bcdfghjklmnpqrstvwxz2456789"
            meta["name"] = prefix[:58] + "".join(secrets.choice(alphabet) for _ in range(5))
        name = meta["name"]
        await self._check_namespace(ns, rt)
        for system in ("uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(system, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(self.clock.now())
        if rt.kind not in _NO_GENERATION and "status" in rt.subresources:
            meta["generation"] = 1
        self._reset_status(rt, obj)
        if rt.kind == "Service" and not rt.group:
            await self._allocate_cluster_ip(obj)
        obj = self._track_fields(rt, None, obj, manager, managed, "")
        model, warnings = await off_loop(self._decode, rt, obj, name, field_validation)
        obj = await off_loop(self._finish, rt, model, name, None)
        warnings += await self._admit("CREATE", rt, ns, name, "", obj, None, user, dry_run, mutate=True)
        if self.mutating:
            obj = await off_loop(lambda: self._finish(rt, self._decode(rt, obj, name, "Ignore")[0], name, None))
        warnings += await self._admit("CREATE", rt, ns, name, "", obj, None, user, dry_run, mutate=False)
        if dry_run:
            return obj, warnings
        ttl = self.event_ttl if rt.kind == "Event" and not rt.group else None
        await off_loop(check_object_size, rt.kind, name, obj, self.limits.max_object_bytes)
        try:
            stored = await self.store.create(rt.key, ns, name, obj, ttl=ttl)
        except store_base.AlreadyExists:
            raise already_exists(rt, name) from None
        return stored, warnings

    async def update_object(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        body: Any,
        *,
        subresource: str = "",
        field_validation: str | None = None,
        user: UserInfo | None = None,
        dry_run: bool = False,
        current: dict[str, Any] | None = None,
        create_missing: bool = False,
        manager: str | None = None,
        managed: bool = False,
    ) -> tuple[dict[str, Any], list[str]]:
        user = user or UserInfo(name="system:apiserver")
        obj = self._check_type(rt, body)
        meta = _meta(obj)
        if meta.get("name") and meta["name"] != name:
            raise bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        if rt.namespaced and meta.get("namespace") and meta["namespace"] != ns:
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        meta["name"] = name
        if current is None:
            try:
                current = await self.store.get(rt.key, ns, name)
            except store_base.NotFound:
                if create_missing and not subresource:
                    meta.pop("resourceVersion", None)
                    return await self.create_object(rt, ns, obj, field_validation=field_validation, user=user,
                                                    dry_run=dry_run, manager=manager, managed=managed)
                raise not_found(rt, name) from None
        expected = meta.get("resourceVersion")
        if expected is not None and not isinstance(expected, str):
            raise bad_request(f"metadata.resourceVersion: Invalid value: {expected!r}: must be a string "
                              "holding the resourceVersion you read")
        body_uid = meta.get("uid")
        if body_uid and body_uid != current.get("metadata", {}).get("uid"):
            raise conflict(rt, name, f"Precondition failed: UID in precondition: {body_uid}, UID in object meta: "
                                     f"{current.get('metadata', {}).get('uid')}")
        if expected:
            try:
                expected_rev = int(expected)
            except ValueError:
                raise bad_request(f'metadata.resourceVersion: Invalid value: "{expected}": must be an integer') from None
            if expected_rev != _rv(current):
                raise conflict(rt, name)
        else:
            expected_rev = _rv(current)
        new = self._merge_update(rt, obj, current, subresource)
        new = self._track_fields(rt, current, new, manager, managed, subresource)
        if rt.kind == "Service" and not rt.group and isinstance(new.get("spec"), dict):
            # Allocated values survive a PUT that leaves them out, as in Kubernetes.
            old_spec = current.get("spec") or {}
            for key in ("clusterIP", "clusterIPs"):
                if not new["spec"].get(key) and old_spec.get(key):
                    new["spec"][key] = old_spec[key]
        model, warnings = await off_loop(self._decode, rt, new, name, field_validation)
        old_model = await off_loop(rt.model.model_validate, current)
        new = await off_loop(self._finish, rt, model, name, old_model)
        op = "UPDATE"
        warnings += await self._admit(op, rt, ns, name, subresource, new, current, user, dry_run, mutate=True)
        warnings += await self._admit(op, rt, ns, name, subresource, new, current, user, dry_run, mutate=False)
        if "status" in rt.subresources and subresource != "status" and rt.kind not in _NO_GENERATION:
            before = {k: v for k, v in current.items() if k not in ("metadata", "status")}
            after = {k: v for k, v in new.items() if k not in ("metadata", "status")}
            if before != after:
                new["metadata"]["generation"] = int(current["metadata"].get("generation") or 1) + 1
        stale = getattr(self.store, "is_stale", None)  # a store wrapper may not pass it on
        if _strip_for_compare(new) == _strip_for_compare(current) and not (
                stale is not None and stale(rt.key, ns, name, _rv(current))):
            # No-op updates do not bump the revision, as in Kubernetes; one stored with an
            # older encryption key is rewritten with the current one.
            return current, warnings
        if dry_run:
            new["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion", "")
            return new, warnings
        if self._ready_to_delete(rt, new):
            try:
                return await self.store.delete(rt.key, ns, name, expected_revision=expected_rev), warnings
            except store_base.Conflict:
                raise conflict(rt, name) from None
            except store_base.NotFound:
                raise not_found(rt, name) from None
        await off_loop(check_object_size, rt.kind, name, new, self.limits.max_object_bytes)
        try:
            return await self.store.update(rt.key, ns, name, new, expected_revision=expected_rev), warnings
        except store_base.Conflict:
            raise conflict(rt, name) from None
        except store_base.NotFound:
            raise not_found(rt, name) from None

    def _merge_update(self, rt: ResourceType, obj: dict, current: dict, subresource: str) -> dict[str, Any]:
        """What a PUT may change: the main resource keeps status, /status keeps everything else,
        and system metadata is never the client's to set."""
        cur_meta = current.get("metadata", {})
        if subresource in ("status",):
            new = {k: v for k, v in current.items() if k != "status"}
            if "status" in obj:
                new["status"] = obj["status"]
            new["metadata"] = dict(cur_meta)
            return new
        if subresource == "finalize":  # namespaces/{name}/finalize may change spec.finalizers only
            new = dict(current)
            spec = dict(current.get("spec") or {})
            spec["finalizers"] = (obj.get("spec") or {}).get("finalizers") or []
            new["spec"] = spec
            new["metadata"] = dict(cur_meta)
            return new
        new = dict(obj)
        meta = dict(obj.get("metadata") or {})
        for system in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
                       "namespace"):
            if system in cur_meta:
                meta[system] = cur_meta[system]
            else:
                meta.pop(system, None)
        meta.pop("resourceVersion", None)
        if cur_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(cur_meta.get("finalizers") or [])
            if added:
                raise invalid(rt, cur_meta.get("name", ""), [{
                    "reason": "FieldValueForbidden", "field": "metadata.finalizers",
                    "message": f"Forbidden: no new finalizers can be added if the object is being deleted, "
                               f"found new finalizers {sorted(added)}"}])
        new["metadata"] = meta
        if "status" in rt.subresources and rt.kind not in ("Node",):
            if "status" in current:
                new["status"] = current["status"]
            else:
                new.pop("status", None)
        return new

    @staticmethod
    def _ready_to_delete(rt: ResourceType, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata", {})
        if not meta.get("deletionTimestamp") or meta.get("finalizers"):
            return False
        if rt.kind == "Namespace" and (obj.get("spec") or {}).get("finalizers"):
            return False
        return True

    async def _patch(self, req: RawRequest, rt: ResourceType, ns: str, name: str, sub: str, user: UserInfo,
                     dry_run: bool, manager: str | None = None) -> RawResponse:
        ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/json-patch+json", "application/merge-patch+json",
                         "application/strategic-merge-patch+json", "application/apply-patch+yaml"):
            raise ApiException(
                415, "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: "
                f"application/json-patch+json, application/merge-patch+json, "
                f"application/strategic-merge-patch+json, application/apply-patch+yaml (got {ctype or 'none'})",
            )
        if not req.body:
            raise bad_request("the patch body is empty")
        for attempt in range(10):
            try:
                current = await self.store.get(rt.key, ns, name)
            except store_base.NotFound:
                current = None
            if current is None and (ctype != "application/apply-patch+yaml" or sub):
                raise not_found(rt, name)
            if ctype == "application/apply-patch+yaml" and sub != "scale":
                response = await self._server_side_apply(req, rt, ns, name, sub, user, dry_run, current)
                if response is not None:
                    return response
                continue
            base = self._scale_view(rt, current) if sub == "scale" else current
            try:
                patched = await off_loop(apply_patch, base, req.body, ctype, rt.kind)
            except PatchError as e:
                if e.status_code == 400:
                    raise bad_request(str(e)) from None
                if e.status_code == 415:
                    raise ApiException(415, "UnsupportedMediaType", str(e)) from None
                raise invalid(rt, name, [{"reason": "FieldValueInvalid", "field": "patch", "message": str(e)}]) from None
            if not isinstance(patched, dict):
                raise bad_request("the patched object is not a JSON object")
            # A patch pins a revision only when it names one itself; otherwise the revision it
            # carries is the one we read, and a conflict just means "read again and re-apply".
            pmeta = patched.get("metadata")
            named_rv = pmeta.get("resourceVersion") if isinstance(pmeta, dict) else None
            try:
                if sub == "scale":
                    obj = await self._apply_scale(rt, ns, name, patched, current, user, dry_run)
                    return _json_response(200, obj)
                obj, warnings = await self.update_object(
                    rt, ns, name, patched, subresource=sub, field_validation=req.param("fieldValidation"),
                    user=user, dry_run=dry_run, current=current, manager=manager,
                )
                return _json_response(200, obj, self._warning_headers(warnings))
            except ApiException as e:
                # Conflicts against our own read are retried: a patch is not a compare-and-swap
                # unless it names a resourceVersion that is stale.
                if e.code == 409 and e.reason == "Conflict" and named_rv == str(_rv(current)) and attempt < 9:
                    continue
                raise
        raise conflict(rt, name)

    async def _server_side_apply(self, req: RawRequest, rt: ResourceType, ns: str, name: str, sub: str,
                                 user: UserInfo, dry_run: bool, current: dict[str, Any] | None) -> RawResponse | None:
        """One attempt of server-side apply; None means the object changed under us: retry."""
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
                force=_truthy(req.param("force")), now=rfc3339(self.clock.now()), subresource=sub,
                ignore_status="status" in rt.subresources and sub != "status",
            )
        except managedfields.ApplyConflict as e:
            raise ApiException(409, "Conflict", e.message,
                               {"name": name, "kind": rt.plural, "group": rt.group, "causes": e.causes}) from None
        except managedfields.ManagedFieldsError as e:
            raise bad_request(str(e)) from None
        if current is None:
            obj, warnings = await self.create_object(
                rt, ns, new, field_validation=req.param("fieldValidation"), user=user, dry_run=dry_run,
                managed=True)
            return _json_response(201, obj, self._warning_headers(warnings))
        new.setdefault("metadata", {})["resourceVersion"] = current["metadata"].get("resourceVersion")
        try:
            obj, warnings = await self.update_object(
                rt, ns, name, new, subresource=sub, field_validation=req.param("fieldValidation"), user=user,
                dry_run=dry_run, current=current, managed=True)
        except ApiException as e:
            if e.code == 409 and e.reason == "Conflict":
                return None
            raise
        return _json_response(200, obj, self._warning_headers(warnings))

    async def delete_object(
        self, rt: ResourceType, ns: str, name: str, options: dict[str, Any] | None = None, *,
        user: UserInfo | None = None, dry_run: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """Returns (object, deleted_now). Graceful and finalizer-held deletions return the
        object with deletionTimestamp set and deleted_now False."""
        options = options or {}
        user = user or UserInfo(name="system:apiserver")
        for _ in range(10):
            current = await self.get_object(rt, ns, name)
            meta = current.get("metadata", {})
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != meta.get("uid"):
                raise conflict(rt, name, f"Precondition failed: UID in precondition: {pre['uid']}, "
                                         f"UID in object meta: {meta.get('uid')}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
                raise conflict(rt, name, f"Precondition failed: ResourceVersion in precondition: "
                                         f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                         f"{meta.get('resourceVersion')}")
            await self._admit("DELETE", rt, ns, name, "", current, current, user, dry_run, mutate=False)
            grace = options.get("gracePeriodSeconds")
            policy = options.get("propagationPolicy")
            finalizers = list(meta.get("finalizers") or [])
            if policy is not None:
                # The latest propagation policy wins, as in Kubernetes' deletion finalizers.
                finalizers = [f for f in finalizers if f not in ("orphan", "foregroundDeletion")]
                if policy == "Foreground":
                    finalizers.append("foregroundDeletion")
                elif policy == "Orphan":
                    finalizers.append("orphan")
            graceful = False
            if rt.kind == "Pod" and (current.get("spec") or {}).get("nodeName"):
                phase = (current.get("status") or {}).get("phase")
                if grace is None:
                    grace = (current.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
                graceful = grace > 0 and phase not in ("Succeeded", "Failed")
            ns_pending = rt.kind == "Namespace"
            if not finalizers and not graceful and not ns_pending:
                if dry_run:
                    return current, True
                try:
                    return await self.store.delete(rt.key, ns, name, expected_revision=_rv(current)), True
                except store_base.Conflict:
                    continue
                except store_base.NotFound:
                    raise not_found(rt, name) from None
            # Deletion in progress: stamp it and let the owner of each finalizer (or the node
            # agent, for a graceful pod) finish the job.
            new = dict(current)
            new_meta = dict(meta)
            now = self.clock.now()
            if graceful:
                prior = new_meta.get("deletionTimestamp")
                deadline = now + grace
                if prior and parse_rfc3339(prior) <= deadline:
                    deadline = parse_rfc3339(prior)
                new_meta["deletionTimestamp"] = rfc3339(deadline)
                new_meta["deletionGracePeriodSeconds"] = min(grace, new_meta.get("deletionGracePeriodSeconds", grace))
            elif not new_meta.get("deletionTimestamp"):
                new_meta["deletionTimestamp"] = rfc3339(now)
                new_meta["deletionGracePeriodSeconds"] = 0
            new_meta["finalizers"] = finalizers
            if not finalizers:
                new_meta.pop("finalizers")
            new["metadata"] = new_meta
            if ns_pending:
                new["status"] = {**(current.get("status") or {}), "phase": "Terminating"}
                if not finalizers and not (current.get("spec") or {}).get("finalizers"):
                    try:
                        return await self.store.delete(rt.key, ns, name, expected_revision=_rv(current)), True
                    except store_base.Conflict:
                        continue
            if _strip_for_compare(new) == _strip_for_compare(current):
                return current, False
            if dry_run:
                return new, False
            try:
                return await self.store.update(rt.key, ns, name, new, expected_revision=_rv(current)), False
            except store_base.Conflict:
                continue
            except store_base.NotFound:
                raise not_found(rt, name) from None
        raise conflict(rt, name)

    async def _delete_collection(self, req: RawRequest, rt: ResourceType, ns: str, user: UserInfo,
                                 dry_run: bool) -> RawResponse:
        label_sel, field_sel = self._selectors(req, rt)
        result = await self.store.list(rt.key, ns or None)
        options = self._delete_options(req)
        deleted = []
        for obj in result.items:
            if not self._matches(obj, label_sel, field_sel):
                continue
            meta = obj["metadata"]
            try:
                done, _ = await self.delete_object(rt, meta.get("namespace", ""), meta["name"], options, user=user,
                                                   dry_run=dry_run)
                deleted.append(done)
            except ApiException as e:
                if e.code != 404:
                    raise
        return _json_response(200, {"kind": rt.list_kind, "apiVersion": rt.api_version,
                                     "metadata": {"resourceVersion": str(await self.store.revision())},
                                     "items": deleted})

    # ------------------------------------------------------------------ list & watch

    def _selectors(self, req: RawRequest, rt: ResourceType) -> tuple[LabelSelector | None, FieldSelector | None]:
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

    @staticmethod
    def _matches(obj: dict[str, Any], label_sel: LabelSelector | None, field_sel: FieldSelector | None) -> bool:
        if label_sel is not None and not label_sel.matches(obj.get("metadata", {}).get("labels") or {}):
            return False
        if field_sel is not None and not field_sel.matches(obj):
            return False
        return True

    async def list_objects(
        self, rt: ResourceType, ns: str, label_sel: LabelSelector | None = None,
        field_sel: FieldSelector | None = None, limit: int | None = None, continue_token: str | None = None,
    ) -> tuple[list[dict[str, Any]], int, str | None]:
        after = None
        list_rev = None
        if continue_token:
            try:
                tok = orjson.loads(base64.urlsafe_b64decode(continue_token.encode()))
                if not (isinstance(tok["ns"], str) and isinstance(tok["name"], str) and isinstance(tok["rv"], int)):
                    raise ValueError("continue token fields have the wrong types")
                after, list_rev = (tok["ns"], tok["name"]), int(tok["rv"])
            except Exception:
                raise bad_request("continue: Invalid value: the continue token is malformed; start the list "
                                  "again without it") from None
        only_name = field_sel.only_name() if field_sel is not None else None
        if only_name is not None and not after:
            try:
                obj = await self.store.get(rt.key, ns, only_name) if ns or not rt.namespaced else None
            except store_base.NotFound:
                obj = None
            if obj is not None or ns or not rt.namespaced:
                items = [obj] if obj is not None and self._matches(obj, label_sel, field_sel) else []
                return items, await self.store.revision(), None
        items: list[dict[str, Any]] = []
        if continue_token and list_rev is not None and list_rev < await self.store.revision():
            # Later pages show the world as of the first page, as Kubernetes' do.
            snapshot = await self._list_at(rt, ns, list_rev)
            pages = [store_base.ListResult([o for o in snapshot if _key_of(o) > after], list_rev)]
        else:
            pages = None
        page = min(max(limit or 0, 500), _MAX_PAGE)
        while True:
            if pages is not None:
                result = pages.pop()
            else:
                result = await self.store.list(rt.key, ns or None, limit=page, after=after)
            if list_rev is None:
                list_rev = result.revision
            for obj in result.items:
                if self._matches(obj, label_sel, field_sel):
                    items.append(obj)
                    if limit and len(items) >= limit:
                        m = obj["metadata"]
                        key = (m.get("namespace", ""), m["name"])
                        more = result.next_key is not None or obj is not result.items[-1]
                        token = None
                        if more:
                            token = base64.urlsafe_b64encode(orjson.dumps(
                                {"rv": list_rev, "ns": key[0], "name": key[1]})).decode()
                        return items, list_rev, token
            if result.next_key is None:
                return items, list_rev, None
            after = result.next_key

    async def _list_at(self, rt: ResourceType, ns: str, revision: int) -> list[dict[str, Any]]:
        """The objects as they were at ``revision``: today's list with later history undone."""
        current = await self.store.list(rt.key, ns or None)
        try:
            events = await self.store.history(rt.key, ns or None, revision, current.revision)
        except store_base.Expired:
            raise ApiException(
                410, "Expired",
                "The provided continue parameter is too old to display a consistent list result. "
                "You can start a new list without the continue parameter.",
            ) from None
        state = {_key_of(o): o for o in current.items}
        for ev in reversed(events):
            key = (ev.namespace, ev.name)
            if ev.type == "ADDED":
                state.pop(key, None)
            else:
                state[key] = ev.prev if ev.prev is not None else ev.object
        return [state[k] for k in sorted(state)]

    async def _list(self, req: RawRequest, rt: ResourceType, ns: str) -> RawResponse:
        label_sel, field_sel = self._selectors(req, rt)
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
        items, rev, token = await self.list_objects(rt, ns, label_sel, field_sel, limit, req.param("continue"))
        # A long list is rendered in a worker thread: the loop keeps answering others meanwhile.
        large = len(items) > _OFF_LOOP_ITEMS
        if self._wants_table(req):
            include = self._include_object(req)

            def table() -> bytes:
                return _dumps(tables.to_table(rt, items, resource_version=str(rev), continue_token=token,
                                              now=self.clock.now(), include_object=include))
            body = await asyncio.to_thread(table) if large else table()
            return RawResponse(200, {"content-type": JSON}, body)
        meta: dict[str, Any] = {"resourceVersion": str(rev)}
        if token:
            meta["continue"] = token
        doc = {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta, "items": items}
        return RawResponse(200, {"content-type": JSON}, await asyncio.to_thread(_dumps, doc) if large else _dumps(doc))

    async def _watch(self, req: RawRequest, rt: ResourceType, ns: str, name: str) -> RawResponse:
        label_sel, field_sel = self._selectors(req, rt)
        if name:
            extra = parse_field_selector(f"metadata.name={name}")
            field_sel = extra if field_sel is None else parse_field_selector(
                f"{req.param('fieldSelector')},metadata.name={name}")
        rv_param = req.param("resourceVersion")
        timeout = params.watch_timeout(req, _WATCH_DEFAULT_TIMEOUT)
        bookmarks = _truthy(req.param("allowWatchBookmarks"))
        as_table = self._wants_table(req)
        initial: list[dict[str, Any]] = []
        send_initial = _truthy(req.param("sendInitialEvents"))
        requested_rev = 0
        if rv_param:
            try:
                requested_rev = int(rv_param)
            except ValueError:
                raise bad_request(f'resourceVersion: Invalid value: "{rv_param}": must be an integer') from None
        if not requested_rev or send_initial:
            initial, start_rev, _ = await self.list_objects(rt, ns, label_sel, field_sel)
            start_rev = max(start_rev, requested_rev)
        else:
            start_rev = requested_rev
        try:
            watch = await self.store.watch(rt.key, ns or None, start_rev)
        except store_base.Expired as e:
            err = {"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": str(e), "reason": "Expired", "code": 410}}

            async def expired() -> AsyncIterator[bytes]:
                yield _dumps(err) + b"\n"

            return RawResponse(200, {"content-type": JSON, "transfer-encoding": "chunked"}, stream=expired())

        def encode(ev_type: str, obj: dict[str, Any]) -> bytes:
            if as_table and ev_type != "BOOKMARK":
                obj = tables.to_table(rt, [obj], resource_version=str(_rv(obj)), now=self.clock.now())
            return _dumps({"type": ev_type, "object": obj}) + b"\n"

        clock = self.clock

        async def stream() -> AsyncIterator[bytes]:
            import asyncio

            last_rev = start_rev
            try:
                for obj in initial:
                    yield encode("ADDED", obj)
                if send_initial and bookmarks:
                    yield encode("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": {
                        "resourceVersion": str(start_rev),
                        "annotations": {"k8s.io/initial-events-end": "true"}}})
                deadline = clock.monotonic() + timeout
                it = watch.__aiter__()
                while True:
                    remaining = deadline - clock.monotonic()
                    if remaining <= 0:
                        return
                    try:
                        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
                        # races with an event, and the stream would never end.
                        async with asyncio.timeout(min(remaining, 30.0)):
                            ev = await it.__anext__()
                    except TimeoutError:
                        if bookmarks:
                            yield encode("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version,
                                                      "metadata": {"resourceVersion": str(last_rev)}})
                        continue
                    except StopAsyncIteration:
                        return
                    except store_base.Expired as e:
                        yield _dumps({"type": "ERROR", "object": {
                            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": str(e), "reason": "Expired", "code": 410}}) + b"\n"
                        return
                    except store_base.TransformError as e:
                        yield _dumps({"type": "ERROR", "object": internal(str(e)).status()}) + b"\n"
                        return
                    last_rev = ev.revision
                    now_match = self._matches(ev.object, label_sel, field_sel)
                    was_match = ev.prev is not None and self._matches(ev.prev, label_sel, field_sel)
                    if ev.type == "DELETED":
                        if was_match or now_match:
                            yield encode("DELETED", ev.object)
                    elif now_match and (was_match or ev.type == "ADDED"):
                        yield encode(ev.type if ev.type == "ADDED" or was_match else "ADDED", ev.object)
                    elif now_match:
                        yield encode("ADDED", ev.object)
                    elif was_match:
                        yield encode("DELETED", ev.object)
            except Exception as e:  # a bug: end the stream with an ERROR event, not a cut connection
                log.exception("internal error in a watch of %s", rt.key)
                yield _dumps({"type": "ERROR", "object": internal(f"{type(e).__name__}: {e}").status()}) + b"\n"
            finally:
                await watch.close()

        return RawResponse(200, {"content-type": JSON, "transfer-encoding": "chunked"}, stream=stream())

    # ------------------------------------------------------------------ subresources

    @staticmethod
    def _selector_string(obj: dict[str, Any]) -> str:
        sel = (obj.get("spec") or {}).get("selector")
        if isinstance(sel, dict):
            try:
                return str(LabelSelector.from_dict(sel))
            except (SelectorError, TypeError, ValueError):
                return ""
        return ""

    def _scale_view(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata", {})
        # A kind may keep its replicas elsewhere, as a CRD's scale subresource declares
        # (specReplicasPath, statusReplicasPath, labelSelectorPath).
        paths = rt.extra.get("scale") or {}
        spec_path = paths.get("specReplicasPath", "spec.replicas")
        status_path = paths.get("statusReplicasPath", "status.replicas")
        selector_path = paths.get("labelSelectorPath")
        selector = _dotted(obj, selector_path) if selector_path else self._selector_string(obj)
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in meta},
            "spec": {"replicas": _dotted(obj, spec_path) or 0},
            "status": {"replicas": _dotted(obj, status_path) or 0, "selector": selector or ""},
        }

    async def _apply_scale(self, rt: ResourceType, ns: str, name: str, scale: dict[str, Any],
                           current: dict[str, Any], user: UserInfo, dry_run: bool) -> dict[str, Any]:
        if not isinstance(scale.get("spec"), dict) or not isinstance(scale.get("metadata") or {}, dict):
            raise bad_request("a Scale needs spec.replicas and, if given, an object for metadata")
        replicas = scale["spec"].get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise invalid(rt, name, [{"reason": "FieldValueInvalid", "field": "spec.replicas",
                                      "message": f"Invalid value: {replicas!r}: must be greater than or equal to 0"}])
        want_rv = (scale.get("metadata") or {}).get("resourceVersion")
        if want_rv and want_rv != current["metadata"].get("resourceVersion"):
            raise conflict(rt, name)
        new = orjson.loads(orjson.dumps(current))
        *parents, leaf = ((rt.extra.get("scale") or {}).get("specReplicasPath") or "spec.replicas").split(".")
        target = new
        for part in parents:
            if not isinstance(target.get(part), dict):
                raise invalid(rt, name, [{"reason": "FieldValueRequired", "field": ".".join(parents),
                                          "message": "Required value: the object has nothing to scale there"}])
            target = target[part]
        target[leaf] = replicas
        updated, _ = await self.update_object(rt, ns, name, new, user=user, dry_run=dry_run, current=current)
        return self._scale_view(rt, updated)

    async def _scale(self, req: RawRequest, info: RequestInfo, rt: ResourceType, ns: str,
                     user: UserInfo) -> RawResponse:
        current = await self.get_object(rt, ns, info.name)
        if info.verb == "get":
            return _json_response(200, self._scale_view(rt, current))
        if info.verb == "update":
            body = await self._parse_body(req)
            if not isinstance(body, dict):
                raise bad_request("the request body must be a Scale object")
            return _json_response(200, await self._apply_scale(rt, ns, info.name, body, current, user,
                                                               req.param("dryRun") == "All"))
        if info.verb == "patch":
            return await self._patch(req, rt, ns, info.name, "scale", user, req.param("dryRun") == "All")
        raise method_not_allowed()

    async def bind_pod(self, rt: ResourceType, ns: str, name: str, binding: Any, user: UserInfo) -> dict[str, Any]:
        if not isinstance(binding, dict) or not isinstance(binding.get("target"), dict):
            raise bad_request("a Binding needs target.name: the node to bind the pod to")
        node = binding["target"].get("name")
        if node is not None and not isinstance(node, str):
            raise bad_request(f"target.name: Invalid value: {node!r}: must be a node name")
        if not node:
            raise invalid(rt, name, [{"reason": "FieldValueRequired", "field": "target.name",
                                      "message": "Required value"}])
        kind = binding["target"].get("kind")
        if kind not in (None, "", "Node"):
            raise invalid(rt, name, [{"reason": "FieldValueNotSupported", "field": "target.kind",
                                      "message": f'Unsupported value: {json.dumps(kind)}: supported values: "Node"'}])
        bmeta = binding.get("metadata")
        if bmeta is not None and not isinstance(bmeta, dict):
            raise bad_request("metadata: must be an object")
        for _ in range(10):
            pod = await self.get_object(rt, ns, name)
            meta = pod["metadata"]
            uid = (binding.get("metadata") or {}).get("uid")
            if uid is not None and not isinstance(uid, str):
                raise bad_request(f"metadata.uid: Invalid value: {uid!r}: must be a string")
            if uid and uid != meta.get("uid"):
                raise conflict(rt, name, "the pod was replaced since the binding was made")
            if meta.get("deletionTimestamp"):
                raise conflict(rt, name, "pod is being deleted, cannot be assigned to a host")
            if (pod.get("spec") or {}).get("nodeName"):
                raise conflict(rt, name, f"pod {name} is already assigned to node "
                                         f"\"{pod['spec']['nodeName']}\"")
            new = orjson.loads(orjson.dumps(pod))
            new["spec"]["nodeName"] = node
            # As kube-apiserver's binding REST: the Binding's annotations land on the pod
            # (the scheduler hands the GPU indices over this way, in the same write).
            annotations = (bmeta or {}).get("annotations")
            if annotations:
                if not isinstance(annotations, dict) or not all(
                        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
                    raise bad_request("metadata.annotations: must be a map of strings to strings")
                new["metadata"].setdefault("annotations", {}).update(annotations)
            status = new.setdefault("status", {})
            conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                          "lastTransitionTime": rfc3339(self.clock.now())})
            status["conditions"] = conds
            try:
                await self.store.update(rt.key, ns, name, new, expected_revision=_rv(pod))
            except store_base.Conflict:
                continue
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        raise conflict(rt, name)

    async def evict_pod(self, rt: ResourceType, ns: str, name: str, eviction: Any, user: UserInfo) -> dict[str, Any]:
        options = check_delete_options(eviction.get("deleteOptions") if isinstance(eviction, dict) else None)
        return await evict(self, rt, ns, name, eviction, user, options)

    async def _node_proxy(self, req: RawRequest, info: RequestInfo) -> RawResponse:
        if info.verb != "get":
            raise method_not_allowed()
        if self.node_proxy_provider is None:
            raise ApiException(503, "ServiceUnavailable", f"no node proxy is configured to reach node {info.name}")
        prefix = f"/nodes/{info.name}/proxy"
        rest = req.path[req.path.index(prefix) + len(prefix):] if prefix in req.path else ""
        return await self.node_proxy_provider(info.name, rest or "/", req)

    async def _pod_log(self, req: RawRequest, rt: ResourceType, ns: str, name: str) -> RawResponse:
        pod = await self.get_object(rt, ns, name)
        if not (pod.get("spec") or {}).get("nodeName"):
            containers = (pod.get("spec") or {}).get("containers") or [{}]
            c = req.param("container") or containers[0].get("name", "")
            raise bad_request(f'container "{c}" in pod "{name}" is waiting to start: pod is not scheduled yet')
        if self.log_provider is None:
            raise ApiException(503, "ServiceUnavailable",
                               f"no node agent is reachable to serve logs of pod {name}")
        return await self.log_provider(pod, req)


def _dotted(obj: dict[str, Any], path: str) -> Any:
    """The value at a dotted path ('spec.replicas'), or None where the path runs out."""
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value
