"""The service gateway: an asyncio HTTP proxy (aiohttp on both sides) in front of Services.

Routes:
  /services/{namespace}/{name}[:{port}]/{path}  -> a Ready endpoint of that Service (the port
                                                   by name or number; the first port if none)
  any path on a Service's own nodePort            -> that Service (type NodePort, nodePort set)
  a host and path of an Ingress it serves         -> that rule's Service (ingress.py: host rules
                                                   before the paths below, host-less rules and
                                                   defaultBackend after them)
  /metrics                                        -> Prometheus text of the request statistics
                                                   (with ``authorize_metrics``: to a bearer token
                                                   allowed ``get`` on the non-resource URL
                                                   /metrics, as the API server's own; 401/403
                                                   otherwise)
  /apis/custom.metrics.k8s.io/v1beta2/...         -> per-pod `requests_per_second` and
                                                   `concurrency` as MetricValueLists
  /healthz

Endpoints come from an informer on Endpoints: only ``addresses`` (Ready pods) take traffic,
so a pod that is not Ready, or is being deleted (the endpoints controller drops it at once),
gets no new request; requests it is serving finish. The pod with the fewest outstanding
requests is picked (ties at random). A request whose connection could not be made is sent to
another endpoint (nothing reached the pod); one that failed after being sent is retried
only when its method is idempotent. Responses stream through as they come.

With no Ready endpoint the request is held (at most ``max_held`` per Service, for at most
``hold_timeout`` seconds) and, when a HorizontalPodAutoscaler with ``minReplicas: 0``
targets the pods, their workload is scaled to one replica (scale from zero); held requests
go out as soon as an endpoint is Ready.

Endpoints that point back at the cluster's own machinery are never dialled (defence in depth
behind the API's EndpointsAddresses admission, for objects stored before it or written by an
administrator): unspecified, link-local and multicast addresses; a node's agent port (on
its addresses, or any of this host's); the API server's and the gateway's own ports on this
host; and a loopback address that is not a pod's (no ``targetRef`` to a Pod). A request
whose every endpoint is refused gets 502 saying which and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from gpufleet.api.k8s import Endpoints, HorizontalPodAutoscaler, Ingress, IngressClass, Node, Service
from gpufleet.api.nodeheartbeat import heartbeat_only
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.gateway.custommetrics import CustomMetrics
from gpufleet.gateway.ingress import IngressRouting
from gpufleet.gateway.routes import (
    CUSTOM_METRICS_PREFIX,
    HOP_BY_HOP,
    IDEMPOTENT,
    SMALL_BODY,
    Endpoint,
    Route,
    _canonical,
    _FailedInTransit,
    _host_addresses,
    _NotSent,
    _status,
)
from gpufleet.gateway.scaling import ScaleFromZero
from gpufleet.gateway.stats import RequestStats
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)


class Gateway(ScaleFromZero, CustomMetrics, IngressRouting):
    def __init__(
        self,
        client: Client,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Clock = REAL_CLOCK,
        rate_window: float = 10.0,
        hold_timeout: float = 60.0,
        max_held: int = 1000,
        upstream_timeout: float = 300.0,
        max_attempts: int = 5,
        failure_cooldown: float = 1.0,
        protected_ports: tuple[int, ...] = (),
        authorize_metrics: Callable[[str | None], Awaitable[int]] | None = None,
    ) -> None:
        """``protected_ports``: ports of this host never dialled (the API server's);
        ``authorize_metrics(token)``: 200, 401 or 403 for a bearer token (None: none given)
        asking for /metrics; without it /metrics answers everyone."""
        self.client = client
        self.host = host
        self.requested_port = port
        self.clock = clock
        self.hold_timeout = hold_timeout
        self.max_held = max_held
        self.upstream_timeout = upstream_timeout
        self.max_attempts = max_attempts
        self.failure_cooldown = failure_cooldown
        self.stats = RequestStats(clock, rate_window)
        self.informers = SharedInformerFactory(client, strip_managed_fields=True)
        self.ep_informer = self.informers.informer(Endpoints)
        self.svc_informer = self.informers.informer(Service)
        self.hpa_informer = self.informers.informer(HorizontalPodAutoscaler)
        self.node_informer = self.informers.informer(Node)
        self.ingress_informer = self.informers.informer(Ingress)
        self.ingress_class_informer = self.informers.informer(IngressClass)
        self._status_task: asyncio.Future | None = None
        for informer in (self.ingress_informer, self.ingress_class_informer):
            informer.add_event_handler(self._ingress_changed, lambda _o, n: self._ingress_changed(n))
        self.protected_ports = set(protected_ports)
        self.authorize_metrics = authorize_metrics
        self._local_addresses: set[str] = set()
        self._agents: tuple[set[tuple[str, int]], set[int]] | None = None
        self.node_informer.add_event_handler(
            self._nodes_changed, lambda o, n: None if heartbeat_only(o, n) else self._nodes_changed(n),
            self._nodes_changed)
        self.routes: dict[str, Route] = {}
        self._node_ports: dict[int, str] = {}  # port -> service key
        self._node_sites: dict[int, web.TCPSite] = {}
        self._activating: dict[str, asyncio.Task] = {}
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port = 0
        self.ep_informer.add_event_handler(self._ep_changed, lambda _o, n: self._ep_changed(n), self._ep_deleted)
        self.svc_informer.add_event_handler(self._svc_changed, lambda _o, n: self._svc_changed(n),
                                            self._svc_deleted)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        # Idle connections are dropped before the model servers' own keep-alive timeouts
        # (uvicorn: 5 s) so a pooled connection is never one the server is closing.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=self.upstream_timeout),
        )
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.host, self.requested_port, reuse_address=True)
        try:
            await self._site.start()
        except OSError:
            await self._runner.cleanup()
            await self._session.close()
            raise
        server = self._site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._local_addresses = _host_addresses()
        await self.informers.start()
        await self.informers.wait_for_sync(30.0)
        self._ingress_changed()
        log.info("gateway listening on %s", self.url)

    async def stop(self) -> None:
        for task in [*self._activating.values(), *([self._status_task] if self._status_task else [])]:
            task.cancel()
        await self.informers.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # -- endpoints -----------------------------------------------------------------------

    def _ep_changed(self, ep: Any) -> None:
        key = objects.object_key(ep)
        route = self.routes.get(key) or Route()
        old = {(e.pod, name): e for name, eps in route.ports.items() for e in eps}
        ports: dict[str, list[Endpoint]] = {}
        for subset in objects.field(ep, "subsets") or []:
            for p in subset.ports or []:
                name = p.name or ""
                for addr in subset.addresses or []:
                    ref = addr.target_ref
                    pod = f"{ref.namespace or objects.namespace_of(ep)}/{ref.name}" if ref is not None else addr.ip
                    e = old.get((pod, name))
                    if e is None or (e.host, e.port) != (addr.ip, p.port):
                        e = Endpoint(pod, addr.ip, p.port,
                                     pod_backed=ref is not None and (ref.kind or "Pod") == "Pod")
                    ports.setdefault(name, []).append(e)
        route.ports = ports
        svc = self.svc_informer.get(key)
        if svc is not None:
            route.order = [p.name or "" for p in (svc.spec.ports or [])]
        self.routes[key] = route
        live = {e.pod for eps in ports.values() for e in eps}
        for pod in {p for p, _ in old} - live:
            self.stats.forget_pod(pod)
        self._wake(route)

    def _ep_deleted(self, ep: Any) -> None:
        route = self.routes.pop(objects.object_key(ep), None)
        if route is not None:
            route.ports = {}
            self._wake(route)

    @staticmethod
    def _wake(route: Route) -> None:
        route.changed.set()
        route.changed = asyncio.Event()

    def _svc_changed(self, svc: Any) -> None:
        key = objects.object_key(svc)
        route = self.routes.get(key)
        if route is not None:
            route.order = [p.name or "" for p in (svc.spec.ports or [])]
        wanted = {p.node_port for p in (svc.spec.ports or []) if p.node_port} if svc.spec.type == "NodePort" else set()
        for port, owner in list(self._node_ports.items()):
            if owner == key and port not in wanted:
                self._close_node_port(port)
        for port in wanted:
            if self._node_ports.get(port) not in (None, key):
                log.warning("gateway: nodePort %d of %s is taken by %s", port, key, self._node_ports[port])
                continue
            if port not in self._node_sites:
                self._node_ports[port] = key
                asyncio.ensure_future(self._open_node_port(port, key))

    def _svc_deleted(self, svc: Any) -> None:
        key = objects.object_key(svc)
        for port, owner in list(self._node_ports.items()):
            if owner == key:
                self._close_node_port(port)

    async def _open_node_port(self, port: int, key: str) -> None:
        if self._runner is None:
            return
        site = web.TCPSite(self._runner, self.host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            log.warning("gateway: cannot listen on nodePort %d for %s: %s", port, key, exc)
            self._node_ports.pop(port, None)
            return
        self._node_sites[port] = site
        log.info("gateway: service %s on %s:%d", key, self.host, port)

    def _close_node_port(self, port: int) -> None:
        self._node_ports.pop(port, None)
        site = self._node_sites.pop(port, None)
        if site is not None:
            asyncio.ensure_future(site.stop())

    def _pick(self, route: Route | None, port: str | None, tried: set[Endpoint]) -> Endpoint | None:
        if route is None:
            return None
        now = self.clock.monotonic()
        candidates = [e for e in route.endpoints(port) if e not in tried and e.failed_until <= now]
        if not candidates:
            return None
        least = min(e.in_flight for e in candidates)
        return random.choice([e for e in candidates if e.in_flight == least])

    # -- requests ------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        local_port = sockname[1] if sockname else self.port
        if local_port != self.port and local_port in self._node_ports:
            return await self._proxy(request, self._node_ports[local_port], None, request.raw_path)
        ingress = self.ingress_match(request)
        if ingress is not None and ingress.host_specific:
            return await self.ingress_proxy(request, ingress)
        if path.startswith("/services/"):
            parts = path.split("/", 4)
            if len(parts) < 4 or not parts[2] or not parts[3]:
                return _status(404, "NotFound", "use /services/{namespace}/{name}/{path}")
            ns, name = parts[2], parts[3]
            name, _, port = name.partition(":")
            raw_tail = request.raw_path.split("/", 4)[4] if len(parts) > 4 else ""
            return await self._proxy(request, f"{ns}/{name}", port or None, "/" + raw_tail)
        if path == "/metrics":
            refused = await self._metrics_refused(request)
            if refused is not None:
                return refused
            return web.Response(text=self.stats.prometheus(), content_type="text/plain", charset="utf-8")
        if path == "/healthz":
            return web.Response(text="ok")
        if path.startswith(CUSTOM_METRICS_PREFIX):
            return self._custom_metrics(request)
        if ingress is not None:
            return await self.ingress_proxy(request, ingress)
        return _status(404, "NotFound", f"no route for {path}; services are under /services/{{namespace}}/{{name}}/")

    async def _metrics_refused(self, request: web.Request) -> web.Response | None:
        if self.authorize_metrics is None:
            return None
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        given = token.strip() if scheme.lower() == "bearer" and token.strip() else None
        code = await self.authorize_metrics(given)
        if code == 200:
            return None
        if code == 401:
            return _status(401, "Unauthorized", "Unauthorized: /metrics needs a bearer token")
        return _status(403, "Forbidden", 'forbidden: the token may not get path "/metrics" (RBAC: '
                       'nonResourceURLs ["/metrics"], verb get)')

    # -- endpoints the gateway never dials -------------------------------------------------

    def _nodes_changed(self, _node: Any) -> None:
        self._agents = None

    def _agent_endpoints(self) -> tuple[set[tuple[str, int]], set[int]]:
        """(address, port) of every node's agent, and the agent ports (kept until a Node changes)."""
        if self._agents is not None:
            return self._agents
        pairs: set[tuple[str, int]] = set()
        ports: set[int] = set()
        for n in self.node_informer.list():
            status = n.status
            de = status.daemon_endpoints if status is not None else None
            port = de.kubelet_endpoint.port if de is not None and de.kubelet_endpoint is not None else None
            if not port:
                continue
            ports.add(port)
            for a in (status.addresses or []) if status is not None else []:
                pairs.add((_canonical(a.address), port))
        self._agents = (pairs, ports)
        return self._agents

    def refusal(self, ep: Endpoint) -> str | None:
        """Why the gateway will not dial ``ep``, or None."""
        try:
            ip = ipaddress.ip_address(ep.host)
        except ValueError:
            return f"{ep.host} is not an IP address"
        if ip.is_unspecified or ip.is_link_local or ip.is_multicast:
            return f"{ep.host} is an unspecified, link-local or multicast address (the node's own)"
        host = _canonical(ep.host)
        local = ip.is_loopback or host in self._local_addresses
        agents, agent_ports = self._agent_endpoints()
        if (host, ep.port) in agents or (local and ep.port in agent_ports):
            return f"{ep.host}:{ep.port} is a node agent's port"
        if local and (ep.port in self.protected_ports or ep.port == self.port or ep.port in self._node_ports):
            return f"{ep.host}:{ep.port} is a port of the control plane itself (the API server or this gateway)"
        if ip.is_loopback and not ep.pod_backed:
            return f"{ep.host} is a loopback address and the Endpoints name no pod behind it"
        return None

    def _port_name(self, key: str, port: str | None) -> str | None:
        """A Service port given by number is turned into its name (endpoints list names)."""
        if port is None or not port.isdigit():
            return port
        svc = self.svc_informer.get(key)
        for p in (svc.spec.ports or []) if svc is not None else []:
            if str(p.port) == port:
                return p.name or ""
        return port

    async def _proxy(self, request: web.Request, key: str, port: str | None, target: str) -> web.StreamResponse:
        if self.svc_informer.get(key) is None and key not in self.routes:
            ns, _, name = key.partition("/")
            return _status(404, "NotFound", f'services "{name}" not found in namespace "{ns}"')
        port = self._port_name(key, port)
        svc = self.svc_informer.get(key)
        if port is not None and svc is not None and port not in [p.name or "" for p in svc.spec.ports or []]:
            return _status(404, "NotFound", f"service {key} has no port {port!r}")
        body = await request.read()
        deadline = self.clock.monotonic() + self.hold_timeout
        tried: set[Endpoint] = set()
        attempts = 0
        while True:
            route = self.routes.get(key)
            if route is not None:
                listed = route.endpoints(port)
                refused = {e: why for e in listed if (why := self.refusal(e)) is not None}
                if listed and len(refused) == len(listed):
                    e, why = next(iter(refused.items()))
                    log.warning("gateway: %s: refusing endpoint %s:%d: %s", key, e.host, e.port, why)
                    return _status(502, "BadGateway", f"service {key} has no endpoint the gateway may dial: "
                                   f"endpoint {e.host}:{e.port} is refused ({why})")
                tried.update(refused)
            ep = self._pick(route, port, tried)
            if ep is None:
                waited = await self._hold(key, route, deadline)
                if waited is not None:
                    self.stats.failed_without_pod(key)
                    return waited
                tried.clear()
                continue
            attempts += 1
            try:
                return await self._forward(request, key, ep, target, body)
            except _NotSent as exc:
                log.info("gateway: %s via %s: %s; trying another endpoint", key, ep.pod, exc)
                ep.failed_until = self.clock.monotonic() + self.failure_cooldown
                tried.add(ep)
            except _FailedInTransit as exc:
                if request.method not in IDEMPOTENT or attempts >= self.max_attempts:
                    return _status(502, "BadGateway", f"{ep.pod}: {exc}")
                tried.add(ep)
            if attempts >= self.max_attempts:
                return _status(502, "BadGateway", f"no endpoint of service {key} answered after {attempts} attempts")

    async def _hold(self, key: str, route: Route | None, deadline: float) -> web.StreamResponse | None:
        """Wait for the Service's endpoints to change; an error response when that is not possible."""
        held = self.stats.held.get(key, 0)
        if held >= self.max_held:
            return _status(503, "ServiceUnavailable", f"service {key} has no ready endpoint and "
                           f"{held} requests are already waiting for one")
        if route is None:
            route = self.routes[key] = Route()
        if not route.endpoints(None):
            self._activate(key)
        remaining = deadline - self.clock.monotonic()
        if remaining <= 0:
            return _status(503, "ServiceUnavailable", f"service {key} has no ready endpoint "
                           f"(waited {self.hold_timeout:g}s)")
        self.stats.held[key] = held + 1
        changed = route.changed
        try:
            # Wake on an endpoints change, or shortly, when endpoints in cool-down come back.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(remaining, self.failure_cooldown))
        finally:
            self.stats.held[key] -= 1
        return None

    async def _forward(self, request: web.Request, key: str, ep: Endpoint, target: str,
                       body: bytes) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["X-Forwarded-For"] = request.remote or ""
        headers["X-Forwarded-Host"] = request.host
        ep.in_flight += 1
        start = self.stats.started(key, ep.pod)
        error = True
        try:
            try:
                upstream = await self._session.request(
                    request.method, ep.base + target, headers=headers, data=body or None,
                    allow_redirects=False,
                )
            except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
                raise _NotSent(str(exc)) from exc
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise _FailedInTransit(f"{type(exc).__name__}: {exc}") from exc
            async with upstream:
                length = upstream.content_length
                if length is not None and length <= SMALL_BODY:
                    # A small answer of known size goes out in one write.
                    try:
                        data = await upstream.read()
                    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                        raise _FailedInTransit(f"{type(exc).__name__}: {exc}") from exc
                    whole = web.Response(status=upstream.status, reason=upstream.reason, body=data)
                    for k, v in upstream.headers.items():
                        if k.lower() not in HOP_BY_HOP and k.lower() != "content-type":
                            whole.headers.add(k, v)
                    if "Content-Type" in upstream.headers:
                        whole.headers["Content-Type"] = upstream.headers["Content-Type"]
                    error = upstream.status >= 500
                    return whole
                resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for k, v in upstream.headers.items():
                    if k.lower() not in HOP_BY_HOP:
                        resp.headers.add(k, v)
                if length is not None:
                    resp.content_length = length
                await resp.prepare(request)
                try:
                    async for chunk in upstream.content.iter_any():
                        await resp.write(chunk)
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    # Headers went out already: all that is left is to cut the stream.
                    log.info("gateway: %s via %s: stream broken: %s", key, ep.pod, exc)
                    if request.transport is not None:
                        request.transport.close()
                    return resp
                await resp.write_eof()
                error = upstream.status >= 500
                return resp
        finally:
            ep.in_flight -= 1
            self.stats.finished(key, ep.pod, start, error)


