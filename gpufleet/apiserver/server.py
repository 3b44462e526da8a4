"""The API server core: Kubernetes REST semantics over the versioned store.

`ApiServer.handle` takes a RawRequest and gives a RawResponse. The HTTP adapter (app.py)
and the client's in-process transport both call it, so every component sees the same
behaviour whether it runs inside `gpufleet up` or across the network.

The shape is kube-apiserver's: this module authenticates, authorizes and finds the kind;
handlers/ holds a handler per verb, subresources/ a small object per subresource, and both
work through the generic registry (genericregistry.py), which asks each kind's Strategy
(strategy.py) for what the kind adds. versions.py serves a version from another version's
storage through the same entry (``serve_resource``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from gpufleet.api.registry import REGISTRY, Registry, ResourceType
from gpufleet.api.selectors import FieldSelector, LabelSelector
from gpufleet.apiserver import dashboard, dashboardwatch, discovery, handlers, versions
from gpufleet.apiserver.admission import (
    MutatingPlugin,
    UserInfo,
    ValidatingPlugin,
    standard_plugins,
)
from gpufleet.apiserver.admission.podsecurity import PodSecurityConfig
from gpufleet.apiserver.apimetrics import InstrumentedStore
from gpufleet.apiserver.customresources import CustomResources
from gpufleet.apiserver.decoding import parse_body
from gpufleet.apiserver.errors import (
    ApiException,
    internal,
    method_not_allowed,
)
from gpufleet.apiserver.flowcontrol import FlowControl
from gpufleet.apiserver.genericregistry import GenericRegistry
from gpufleet.apiserver.handlers import nonresource
from gpufleet.apiserver.handlers.delete import check_delete_options
from gpufleet.apiserver.handlers.scope import json_response as _json_response
from gpufleet.apiserver.handlers.scope import truthy as _truthy
from gpufleet.apiserver.headers import safe_headers
from gpufleet.apiserver.limits import RequestLimits, body_too_large, read_body, serving
from gpufleet.apiserver.requestinfo import RequestInfo, parse_request
from gpufleet.apiserver.subresources import binding as binding_subresource
from gpufleet.apiserver.subresources import eviction as eviction_subresource
from gpufleet.apiserver.telemetry import RequestRecord, Telemetry
from gpufleet.store import base as store_base
from gpufleet.utils.clock import REAL_CLOCK, Clock
from gpufleet.utils.http import RawRequest, RawResponse

log = logging.getLogger("gpufleet.apiserver")

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
CRDS = "customresourcedefinitions.apiextensions.k8s.io"
# The pod subresources that open a stream to the pod's node (exec, attach, port-forward).
STREAMING = frozenset({"exec", "attach", "portforward"})

LogProvider = Callable[[dict[str, Any], RawRequest], Awaitable[RawResponse]]
# Serves nodes/{name}/proxy/...: (node name, the path after /proxy, the request).
NodeProxyProvider = Callable[[str, str, RawRequest], Awaitable[RawResponse]]
# Serves pods/proxy and services/proxy: (the pod, scheme, its port's number or name, the path
# after /proxy, the request), relayed through the pod's node agent.
PodProxyProvider = Callable[[dict[str, Any], str, str, str, RawRequest], Awaitable[RawResponse]]
Authenticator = Callable[[RawRequest], Awaitable[UserInfo | None]]
Authorizer = Callable[[UserInfo, RequestInfo], Awaitable[bool]]

__all__ = ["DEFAULT_NAMESPACES", "ApiServer", "check_delete_options"]


async def _decided(rec: RequestRecord, verdict: Awaitable[bool]) -> bool:
    """The authorizer's verdict, noted for the audit log (a refusal it raises is one too)."""
    rec.decision = "forbid"
    allowed = await verdict
    rec.decision = "allow" if allowed else "forbid"
    return allowed


def _bindings_collection(info: RequestInfo) -> bool:
    """A create in a namespace's core ``bindings`` collection (Kubernetes' POST
    /api/v1/namespaces/{ns}/bindings): served by ``bind_pods``, not by a stored kind."""
    return (info.is_resource_request and info.group == "" and info.resource == "bindings" and info.verb == "create"
            and bool(info.namespace) and not info.name and not info.subresource)


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
        rng: random.Random | None = None,
    ) -> None:
        """``pod_security``: the PodSecurity plugin's configuration in the standard chain
        (default: enforce baseline in every namespace but kube-system). ``rng``: where
        generated names and uids come from (default: the system's random source; a replay
        gives a seeded one, so that it is repeatable: each resource then draws from a stream
        of its own, so that objects of one kind, Events say, change no other kind's names)."""
        # Metrics (/metrics) and, once enabled, audit logging of every request; store calls
        # are timed through the wrapper.
        self.telemetry = Telemetry(self)
        self.store = InstrumentedStore(store, self.telemetry.metrics)
        # A copy: the kinds this server's CRDs declare are added to it (customresources/).
        self.registry = registry.copy()
        self.clock = clock
        self.set_rng(rng)
        self.event_ttl = event_ttl
        if mutating is None and validating is None:
            mutating, validating = standard_plugins(pod_security)
        self.mutating = list(mutating or [])
        self.validating = list(validating or [])
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.log_provider = log_provider
        self.node_proxy_provider: NodeProxyProvider | None = None
        # Serves pods/exec, pods/attach and pods/portforward (podstreams.PodStreams).
        self.stream_provider: Any = None
        self.pod_proxy_provider: PodProxyProvider | None = None
        # Serves serviceaccounts/{name}/token (auth/serviceaccounts.py's TokenIssuer); without
        # one, no service account tokens are issued and the subresource answers 404.
        self.token_issuer: Any = None
        # Read-only groups served by other parts (e.g. metrics.k8s.io): name -> handler
        self.extra_groups: dict[tuple[str, str], Callable[[RawRequest, RequestInfo], Awaitable[RawResponse]]] = {}
        self.extra_discovery: list[dict] = []
        # Body and object sizes (limits.py) and the seats requests take (flowcontrol.py).
        self.limits = RequestLimits()
        self.flow = FlowControl()
        # The store-facing verbs every kind shares (genericregistry.py).
        self.generic = GenericRegistry(self)
        # The kinds CustomResourceDefinitions declare, kept in self.registry.
        self.custom_resources = CustomResources(self)

    def set_rng(self, rng: random.Random | None) -> None:
        """Where generated names and uids come from from now on (None: the system's source)."""
        self.rng = rng if rng is not None else random.SystemRandom()
        self._rng_seed = None if isinstance(self.rng, random.SystemRandom) else self.rng.getrandbits(64)
        self._rngs: dict[str, random.Random] = {}

    def rng_for(self, resource: str) -> random.Random:
        """The random source of ``resource``'s generated names and uids."""
        if self._rng_seed is None:
            return self.rng
        rng = self._rngs.get(resource)
        if rng is None:
            rng = self._rngs[resource] = random.Random(f"{self._rng_seed}/{resource}")
        return rng

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
        await self.custom_resources.sync()
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
        if path == dashboardwatch.PATH:  # the page's watches on one stream, each one a request of its own
            return await dashboardwatch.serve(self.handle, req)
        if dashboard.is_dashboard(path):  # the page's files; its data calls carry the user's token
            return dashboard.serve(method, req.path)
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
            body = await read_body(req, limit)
            with serving(len(body), self.limits.off_loop_bytes):
                return await self._serve(req, rec, info, user, path, method)

    async def _serve(self, req: RawRequest, rec: RequestRecord, info: RequestInfo, user: UserInfo, path: str,
                     method: str) -> RawResponse:
        bindings = _bindings_collection(info)
        if bindings:
            # Binding pods is one right however many are bound at once: pods/binding.
            info = dataclasses.replace(info, resource="pods", subresource="binding")
        if self.authorizer is not None and path not in ("/healthz", "/readyz", "/livez", "/version"):
            allowed = await _decided(rec, self.authorizer(user, info))
            if allowed and info.verb == "get" and info.resource == "pods" and info.subresource in STREAMING:
                # A WebSocket handshake is a GET, yet it opens a stream as SPDY's POST does: it
                # needs create too (kube-apiserver's AuthorizePodWebsocketUpgradeCreatePermission).
                info = dataclasses.replace(info, verb="create")
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
        if bindings:
            return _json_response(201, await self.bind_pods(info.namespace, await parse_body(req), user))
        ext = self.extra_groups.get((info.group, info.version))
        if ext is not None:
            return await ext(req, info)
        rt = self.registry.by_resource(info.group, info.version, info.resource)
        if rt is None:  # perhaps a CRD another server stored
            await self.custom_resources.sync()
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
        if rt.key == CRDS and info.verb not in ("get", "list", "watch"):
            try:
                return await self._resource(req, info, rt, user)
            finally:  # what the CRD declares is served (or no longer) once the write answers
                await self.custom_resources.sync()
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
        if path.startswith(("/api", "/openapi")):  # discovery and OpenAPI show the current CRDs
            await self.custom_resources.sync()
        return await nonresource.get(self, req, path)

    async def _resource(self, req: RawRequest, info: RequestInfo, rt: ResourceType, user: UserInfo) -> RawResponse:
        return await handlers.serve(self, req, info, rt, user)

    async def serve_resource(self, req: RawRequest, info: RequestInfo, rt: ResourceType,
                             user: UserInfo) -> RawResponse:
        """A resource request for ``rt`` by an already authorized ``user`` (versions.py serves
        a version from its storage version's this way)."""
        return await handlers.serve(self, req, info, rt, user)

    # ------------------------------------------------------------------ verbs (also used in-process)

    async def admit(self, op: str, rt: ResourceType, ns: str, name: str, sub: str, obj: dict, old: dict | None,
                    user: UserInfo, dry_run: bool, mutate: bool) -> list[str]:
        """Runs the mutating or the validating admission chain; returns the plugins' warnings."""
        return await self.generic.admit(op, rt, ns, name, sub, obj, old, user, dry_run, mutate)

    async def get_object(self, rt: ResourceType, ns: str, name: str) -> dict[str, Any]:
        return await self.generic.get(rt, ns, name)

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
        return await self.generic.create(rt, ns, body, field_validation=field_validation, user=user,
                                         dry_run=dry_run, manager=manager, managed=managed)

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
        return await self.generic.update(
            rt, ns, name, body, subresource=subresource, field_validation=field_validation, user=user,
            dry_run=dry_run, current=current, create_missing=create_missing, manager=manager, managed=managed)

    async def delete_object(
        self, rt: ResourceType, ns: str, name: str, options: dict[str, Any] | None = None, *,
        user: UserInfo | None = None, dry_run: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """Returns (object, deleted_now). Graceful and finalizer-held deletions return the
        object with deletionTimestamp set and deleted_now False."""
        return await self.generic.delete(rt, ns, name, options, user=user, dry_run=dry_run)

    async def list_objects(
        self, rt: ResourceType, ns: str, label_sel: LabelSelector | None = None,
        field_sel: FieldSelector | None = None, limit: int | None = None, continue_token: str | None = None,
    ) -> tuple[list[dict[str, Any]], int, str | None]:
        return await self.generic.list(rt, ns, label_sel, field_sel, limit, continue_token)

    async def bind_pod(self, rt: ResourceType, ns: str, name: str, binding: Any, user: UserInfo) -> dict[str, Any]:
        return await binding_subresource.bind(self.generic, rt, ns, name, binding, user)

    async def bind_pods(self, ns: str, body: Any, user: UserInfo) -> dict[str, Any]:
        """POST /api/v1/namespaces/{ns}/bindings: a Binding, or a List of them bound together."""
        rt = self.registry.by_resource("", "v1", "pods")
        assert rt is not None
        return await binding_subresource.bind_all(self.generic, rt, ns, body, user)

    async def evict_pod(self, rt: ResourceType, ns: str, name: str, eviction: Any, user: UserInfo) -> dict[str, Any]:
        options = check_delete_options(eviction.get("deleteOptions") if isinstance(eviction, dict) else None)
        return await eviction_subresource.evict(self, rt, ns, name, eviction, user, options)
