"""What the API server asks node agents for: pods/log (proxied to the pod's agent, as
kube-apiserver proxies to the kubelet), the read-only metrics.k8s.io/v1beta1 group
(NodeMetrics and PodMetrics built from each Ready node's /stats/summary, as metrics-server
does), so `kubectl logs` and `kubectl top` work against gpufleet, and the
``nodes/{name}/proxy/{path}`` subresource (GET), through which everyone else reads an
agent's /stats/*, /metrics and /healthz (RBAC resource ``nodes/proxy``), and the relay to a
pod behind pods/proxy and services/proxy (``pod_proxy``: every method, to the agent's
``/podProxy/...``, which nodes/proxy does not reach).

An agent is found through its Node: the InternalIP address and
status.daemonEndpoints.kubeletEndpoint.Port. Every call to an agent carries this server's
credentials for that node (``node_headers``: a fresh short-lived token); an agent of a
secured cluster answers nobody else. Once ``use_tls`` is given the node CA, agents are
dialled over HTTPS and their certificate must be the node CA's for that very node (the TLS
server name ``<node>.nodes.gpufleet.internal``), as kube-apiserver checks the kubelet's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

from gpufleet.api.selectors import LabelSelector, SelectorError, parse_label_selector
from gpufleet.apiserver.errors import ApiException, bad_request, method_not_allowed
from gpufleet.apiserver.requestinfo import RequestInfo
from gpufleet.store import base as store_base
from gpufleet.utils.clock import REAL_CLOCK, Clock, rfc3339
from gpufleet.utils.http import RawRequest, RawResponse, relay_body
from gpufleet.utils.nodeauth import serving_name

log = logging.getLogger(__name__)

METRICS_GROUP = "metrics.k8s.io"
METRICS_VERSION = "v1beta1"
METRICS_API_VERSION = f"{METRICS_GROUP}/{METRICS_VERSION}"
GPU_METRICS_ANNOTATION = "gpufleet.io/gpu-metrics"
# Response headers of an agent passed back through nodes/{name}/proxy.
_PROXY_HEADERS = ("content-type", "cache-control", "last-modified", "etag")
# Request headers not relayed to a pod: hop-by-hop ones and the caller's credentials (as
# kube-apiserver drops Authorization once it has authenticated a request).
_NOT_RELAYED = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", "authorization",
})
POD_PROXY_PREFIX = "/podProxy"
_LOG_PARAMS = ("follow", "tailLines", "previous", "timestamps", "sinceSeconds", "sinceTime", "limitBytes")

METRICS_DISCOVERY: dict[str, Any] = {
    "metadata": {"name": METRICS_GROUP, "creationTimestamp": None},
    "versions": [{
        "version": METRICS_VERSION,
        "freshness": "Current",
        "resources": [
            {"resource": "nodes", "responseKind": {"group": METRICS_GROUP, "version": METRICS_VERSION,
                                                   "kind": "NodeMetrics"},
             "scope": "Cluster", "singularResource": "", "verbs": ["get", "list"]},
            {"resource": "pods", "responseKind": {"group": METRICS_GROUP, "version": METRICS_VERSION,
                                                  "kind": "PodMetrics"},
             "scope": "Namespaced", "singularResource": "", "verbs": ["get", "list"]},
        ],
    }],
}


def _json(status: int, obj: Any) -> RawResponse:
    return RawResponse(status, {"content-type": "application/json"}, json.dumps(obj).encode())


def node_endpoint(node: dict[str, Any], scheme: str = "http") -> str | None:
    """scheme://address:port of a node's agent, or None when the node publishes none."""
    status = node.get("status") or {}
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    addresses = status.get("addresses") or []
    address = next((a.get("address") for a in addresses if a.get("type") == "InternalIP"), None)
    address = address or next((a.get("address") for a in addresses if a.get("type") == "Hostname"), None)
    if not port or not address:
        return None
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


def _node_ready(node: dict[str, Any]) -> bool:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


class NodeProxy:
    """Owns the HTTP client to the agents and a short cache of their summaries."""

    def __init__(self, store: store_base.Store, *, clock: Clock = REAL_CLOCK, timeout: float = 5.0,
                 summary_timeout: float = 2.0, summary_ttl: float = 5.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.store = store
        self.clock = clock
        self.summary_timeout = summary_timeout
        self.summary_ttl = summary_ttl
        self._timeout = timeout
        self._transport = transport
        self._tls = False
        self._tls_context: ssl.SSLContext | None = None
        self._node_clients: dict[str, httpx.AsyncClient] = {}
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout), trust_env=False, transport=transport)
        self._summaries: dict[str, tuple[float, dict[str, Any]]] = {}
        # Headers that authenticate this server to a node's agent (set by the auth setup).
        self.node_headers: Callable[[str], dict[str, str]] = lambda node: {}

    async def use_tls(self, context: ssl.SSLContext) -> None:
        """Dial agents over HTTPS, trusting ``context`` (the node CA)."""
        self._tls_context = context
        self._tls = True

    def _client(self, node_name: str) -> httpx.AsyncClient:
        """Over TLS, one client (connection pool) per node: a connection verified as one
        node's is never reused for another's at the same address."""
        if not self._tls:
            return self._http
        client = self._node_clients.get(node_name)
        if client is None:
            client = self._node_clients[node_name] = httpx.AsyncClient(
                timeout=httpx.Timeout(self._timeout), trust_env=False, verify=self._tls_context,
                transport=self._transport)
        return client

    def _base(self, node: dict[str, Any]) -> str | None:
        return node_endpoint(node, "https" if self._tls else "http")

    def _extensions(self, node_name: str) -> dict[str, Any]:
        return {"sni_hostname": serving_name(node_name)} if self._tls else {}

    async def agent_dial(self, node_name: str) -> tuple[str | None, dict[str, str], ssl.SSLContext | None, str | None]:
        """How to open a stream to the agent of ``node_name`` (pods/exec, attach,
        portforward): its base URL (None when it publishes none), this server's headers for
        it, and over TLS the context and the server name its certificate must bear."""
        base = self._base(await self._node(node_name))
        sni = serving_name(node_name) if self._tls else None
        return base, self.node_headers(node_name), self._tls_context if self._tls else None, sni

    def install(self, api: Any) -> None:
        """Serve pods/log, pods/exec|attach|portforward and metrics.k8s.io through ``api``
        (an ApiServer)."""
        from gpufleet.apiserver.podstreams import PodStreams

        api.stream_provider = PodStreams(self)
        api.log_provider = self.log_provider
        api.node_proxy_provider = self.proxy
        api.pod_proxy_provider = self.pod_proxy
        api.extra_groups[(METRICS_GROUP, METRICS_VERSION)] = self.metrics
        if not any(d["metadata"]["name"] == METRICS_GROUP for d in api.extra_discovery):
            api.extra_discovery.append(METRICS_DISCOVERY)

    async def close(self) -> None:
        await self._http.aclose()
        for client in self._node_clients.values():
            await client.aclose()

    async def _node(self, name: str) -> dict[str, Any]:
        try:
            return await self.store.get("nodes", "", name)
        except store_base.NotFound:
            raise ApiException(404, "NotFound", f'nodes "{name}" not found',
                               {"name": name, "kind": "nodes"}) from None

    # -- logs -----------------------------------------------------------------------------

    async def log_provider(self, pod: dict[str, Any], req: RawRequest) -> RawResponse:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        name, ns = meta.get("name", ""), meta.get("namespace", "default")
        container = req.param("container")
        if not container:
            names = [c.get("name", "") for c in spec.get("containers") or []]
            if len(names) != 1:
                inits = [c.get("name", "") for c in spec.get("initContainers") or []]
                more = f" or one of the init containers: [{' '.join(inits)}]" if inits else ""
                raise bad_request(f"a container name must be specified for pod {name}, "
                                  f"choose one of: [{' '.join(names)}]{more}")
            container = names[0]
        else:
            known = [c.get("name") for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]]
            if container not in known:
                raise bad_request(f"container {container} is not valid for pod {name}")
        node_name = spec.get("nodeName", "")
        base = self._base(await self._node(node_name))
        if base is None:
            raise ApiException(503, "ServiceUnavailable",
                               f"node {node_name} publishes no agent endpoint to read the logs of pod {name} from")
        url = f"{base}/containerLogs/{quote(ns)}/{quote(name)}/{quote(container)}"
        params = [(k, v) for k, v in req.query if k in _LOG_PARAMS]
        follow = (req.param("follow") or "").lower() in ("true", "1")
        try:
            if not follow:
                resp = await self._client(node_name).get(url, params=params, headers=self.node_headers(node_name),
                                            extensions=self._extensions(node_name))
                if resp.status_code >= 400:
                    return self._agent_error(resp.status_code, resp.content)
                return RawResponse(200, {"content-type": "text/plain"}, resp.content)
            request = self._client(node_name).build_request("GET", url, params=params, headers=self.node_headers(node_name),
                                               timeout=httpx.Timeout(self.summary_timeout * 5, read=None),
                                               extensions=self._extensions(node_name))
            resp = await self._client(node_name).send(request, stream=True)
        except httpx.HTTPError as exc:
            raise ApiException(500, "InternalError", f"Get \"{url}\": {exc or type(exc).__name__}") from None
        if resp.status_code >= 400:
            body = await resp.aread()
            await resp.aclose()
            return self._agent_error(resp.status_code, body)
        return RawResponse(200, {"content-type": "text/plain", "transfer-encoding": "chunked"},
                           stream=relay_body(resp, log, "a stream from the agent ended"))

    @staticmethod
    def _agent_error(code: int, body: bytes) -> RawResponse:
        try:
            status = json.loads(body)
            if isinstance(status, dict) and status.get("kind") == "Status":
                return _json(code, status)
        except ValueError:
            pass
        text = body.decode("utf-8", "replace").strip() or f"the node agent answered {code}"
        return _json(code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": text, "reason": "BadRequest" if code == 400 else "InternalError",
                            "code": code})

    # -- nodes/{name}/proxy ---------------------------------------------------------------

    async def proxy(self, node_name: str, path: str, req: RawRequest) -> RawResponse:
        """GET ``path`` (with the request's query) from the agent of ``node_name``, as
        kube-apiserver's node proxy does with its kubelet client credentials."""
        if path == POD_PROXY_PREFIX or path.startswith(POD_PROXY_PREFIX + "/"):
            # The pod relay is reached through pods/proxy and services/proxy, with their RBAC.
            raise ApiException(404, "NotFound", "the server could not find the requested resource")
        base = self._base(await self._node(node_name))
        if base is None:
            raise ApiException(503, "ServiceUnavailable", f"node {node_name} publishes no agent endpoint to proxy to")
        url = base + quote(path, safe="/:@!$&'()*+,;=-._~%")
        try:
            resp = await self._client(node_name).get(url, params=list(req.query), headers=self.node_headers(node_name),
                                        extensions=self._extensions(node_name))
        except httpx.HTTPError as exc:
            raise ApiException(503, "ServiceUnavailable",
                               f"error trying to reach node {node_name}: {exc or type(exc).__name__}") from None
        headers = {k: v for k, v in resp.headers.items() if k.lower() in _PROXY_HEADERS}
        return RawResponse(resp.status_code, headers, resp.content)

    # -- pods/proxy, services/proxy -------------------------------------------------------

    async def pod_proxy(self, pod: dict[str, Any], scheme: str, port: str, path: str,
                        req: RawRequest) -> RawResponse:
        """``req`` relayed to ``port`` (a container port's number or name) of ``pod`` through
        its node's agent, with this server's credentials for that node; the answer streams."""
        meta = pod.get("metadata") or {}
        name, ns = meta.get("name", ""), meta.get("namespace", "default")
        node_name = (pod.get("spec") or {}).get("nodeName", "")
        base = self._base(await self._node(node_name))
        if base is None:
            raise ApiException(503, "ServiceUnavailable",
                               f"node {node_name} publishes no agent endpoint to reach pod {name} through")
        url = (f"{base}{POD_PROXY_PREFIX}/{quote(ns)}/{quote(name)}/{scheme}:{quote(port)}"
               f"{quote(path, safe='/:@!$&()*+,;=-._~%')}")
        headers = {k: v for k, v in req.headers.items()
                   if k not in _NOT_RELAYED and not k.startswith("impersonate-")}
        headers.update(self.node_headers(node_name))
        client = self._client(node_name)
        request = client.build_request(req.method, url, params=list(req.query), headers=headers, content=req.body,
                                       timeout=httpx.Timeout(self._timeout, read=300.0, write=300.0),
                                       extensions=self._extensions(node_name))
        try:
            resp = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise ApiException(503, "ServiceUnavailable",
                               f"error trying to reach node {node_name} for pod {name}: "
                               f"{exc or type(exc).__name__}") from None
        out = {k: v for k, v in resp.headers.items() if k not in _NOT_RELAYED}
        length = resp.headers.get("content-length", "")
        if length.isdigit() and int(length) <= 1 << 20:
            try:
                body = b"".join([chunk async for chunk in resp.aiter_raw()])
            except httpx.HTTPError as exc:
                raise ApiException(503, "ServiceUnavailable", f"error reading from pod {name}: {exc}") from None
            finally:
                await resp.aclose()
            return RawResponse(resp.status_code, out, body)
        return RawResponse(resp.status_code, {**out, "transfer-encoding": "chunked"}, stream=relay_body(resp, log, "a stream from the agent ended"))

    # -- metrics.k8s.io -----------------------------------------------------------------

    async def _summary(self, node: dict[str, Any]) -> dict[str, Any] | None:
        name = node["metadata"]["name"]
        base = self._base(node)
        if base is None:
            return None
        now = self.clock.monotonic()
        cached = self._summaries.get(name)
        if cached is not None and now - cached[0] < self.summary_ttl:
            return cached[1]
        try:
            resp = await self._client(name).get(f"{base}/stats/summary", headers=self.node_headers(name),
                                        timeout=self.summary_timeout, extensions=self._extensions(name))
            resp.raise_for_status()
            summary = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            log.info("metrics: no summary from node %s: %s", name, exc)
            return None
        self._summaries[name] = (now, summary)
        return summary

    async def _ready_nodes(self) -> list[dict[str, Any]]:
        result = await self.store.list("nodes", None)
        nodes = list(result.items)
        after = result.next_key
        while after is not None:
            more = await self.store.list("nodes", None, after=after)
            nodes += more.items
            after = more.next_key
        return [n for n in nodes if _node_ready(n)]

    async def metrics(self, req: RawRequest, info: RequestInfo) -> RawResponse:
        if info.verb not in ("get", "list"):
            raise method_not_allowed()
        if info.subresource:
            raise ApiException(404, "NotFound", "the server could not find the requested resource")
        try:
            selector = parse_label_selector(req.param("labelSelector") or "")
        except SelectorError as exc:
            raise bad_request(f"invalid label selector: {exc}") from None
        if info.resource == "nodes":
            return await self._node_metrics(info, selector)
        if info.resource == "pods":
            return await self._pod_metrics(info, selector)
        raise ApiException(404, "NotFound", "the server could not find the requested resource")

    async def _node_metrics(self, info: RequestInfo, selector: LabelSelector | None) -> RawResponse:
        nodes = await self._ready_nodes()
        if info.name:
            nodes = [n for n in nodes if n["metadata"]["name"] == info.name]
        if selector is not None:
            nodes = [n for n in nodes if selector.matches(n["metadata"].get("labels") or {})]
        summaries = await asyncio.gather(*(self._summary(n) for n in nodes))
        items = []
        for n, summary in zip(nodes, summaries, strict=True):
            if summary is None:
                continue
            items.append(self._node_item(n, summary))
        if info.name:
            if not items:
                raise ApiException(404, "NotFound", f'nodemetrics.metrics.k8s.io "{info.name}" not found',
                                   {"name": info.name, "group": METRICS_GROUP, "kind": "nodes"})
            return _json(200, {"kind": "NodeMetrics", "apiVersion": METRICS_API_VERSION, **items[0]})
        return _json(200, {"kind": "NodeMetricsList", "apiVersion": METRICS_API_VERSION, "metadata": {},
                           "items": items})

    def _node_item(self, node: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
        s = summary.get("node") or {}
        cpu = s.get("cpu") or {}
        mem = s.get("memory") or {}
        meta: dict[str, Any] = {"name": node["metadata"]["name"], "creationTimestamp": rfc3339(self.clock.now()),
                                "labels": dict(node["metadata"].get("labels") or {})}
        gpus = s.get("gpus") or []
        if gpus:
            meta["annotations"] = {GPU_METRICS_ANNOTATION: json.dumps([
                {"index": g.get("index"), "utilization": g.get("utilizationPercent", 0),
                 "memoryUsedMiB": g.get("memoryUsedMiB", 0), "memoryTotalMiB": g.get("memoryTotalMiB", 0),
                 **({"pod": g["pod"]} if g.get("pod") else {})} for g in gpus], separators=(",", ":"))}
        return {
            "metadata": meta,
            "timestamp": cpu.get("time") or rfc3339(self.clock.now()),
            "window": "10s",
            "usage": {"cpu": f"{int(cpu.get('usageNanoCores') or 0)}n",
                      "memory": f"{int(mem.get('workingSetBytes') or 0) // 1024}Ki"},
        }

    async def _pod_metrics(self, info: RequestInfo, selector: LabelSelector | None) -> RawResponse:
        ns = info.namespace or None
        pods_by_uid: dict[str, dict[str, Any]] = {}
        result = await self.store.list("pods", ns)
        after = result.next_key
        items_src = list(result.items)
        while after is not None:
            more = await self.store.list("pods", ns, after=after)
            items_src += more.items
            after = more.next_key
        for p in items_src:
            if info.name and p["metadata"]["name"] != info.name:
                continue
            if selector is not None and not selector.matches(p["metadata"].get("labels") or {}):
                continue
            pods_by_uid[p["metadata"].get("uid", "")] = p
        wanted_nodes = {(p.get("spec") or {}).get("nodeName") for p in pods_by_uid.values()}
        nodes = [n for n in await self._ready_nodes() if n["metadata"]["name"] in wanted_nodes]
        summaries = await asyncio.gather(*(self._summary(n) for n in nodes))
        items = []
        for summary in summaries:
            if summary is None:
                continue
            gpus = {g.get("index"): g for g in (summary.get("node") or {}).get("gpus") or []}
            for ps in summary.get("pods") or []:
                ref = ps.get("podRef") or {}
                pod = pods_by_uid.get(ref.get("uid", ""))
                if pod is None:
                    continue
                items.append(self._pod_item(pod, ps, gpus))
        items.sort(key=lambda i: (i["metadata"]["namespace"], i["metadata"]["name"]))
        if info.name:
            if not items:
                raise ApiException(404, "NotFound", f'podmetrics.metrics.k8s.io "{info.namespace}/{info.name}" '
                                   f'not found', {"name": info.name, "group": METRICS_GROUP, "kind": "pods"})
            return _json(200, {"kind": "PodMetrics", "apiVersion": METRICS_API_VERSION, **items[0]})
        return _json(200, {"kind": "PodMetricsList", "apiVersion": METRICS_API_VERSION, "metadata": {},
                           "items": items})

    def _pod_item(self, pod: dict[str, Any], ps: dict[str, Any], gpus: dict[Any, dict[str, Any]]) -> dict[str, Any]:
        meta = pod["metadata"]
        containers = []
        stamp = None
        pod_gpus = []
        for c in ps.get("containers") or []:
            cpu = c.get("cpu") or {}
            mem = c.get("memory") or {}
            stamp = stamp or cpu.get("time")
            containers.append({"name": c.get("name", ""),
                               "usage": {"cpu": f"{int(cpu.get('usageNanoCores') or 0)}n",
                                         "memory": f"{int(mem.get('workingSetBytes') or 0) // 1024}Ki"}})
        for g in gpus.values():
            if g.get("pod") == f"{meta.get('namespace')}/{meta.get('name')}":
                pod_gpus.append({"index": g.get("index"), "utilization": g.get("utilizationPercent", 0),
                                 "memoryUsedMiB": g.get("memoryUsedMiB", 0),
                                 "memoryTotalMiB": g.get("memoryTotalMiB", 0)})
        out_meta: dict[str, Any] = {"name": meta["name"], "namespace": meta.get("namespace", ""),
                                    "creationTimestamp": rfc3339(self.clock.now()),
                                    "labels": dict(meta.get("labels") or {})}
        if pod_gpus:
            out_meta["annotations"] = {GPU_METRICS_ANNOTATION: json.dumps(pod_gpus, separators=(",", ":"))}
        return {"metadata": out_meta, "timestamp": stamp or rfc3339(self.clock.now()), "window": "10s",
                "containers": containers}
