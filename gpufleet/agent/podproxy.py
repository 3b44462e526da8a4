"""The agent's relay to its own pods, behind the API server's pods/proxy and services/proxy.

The API server cannot always reach a pod's address (a podman pod's IP lives in its node's
podCIDR, reachable from that node only), so it sends the request to the pod's node agent at
``/podProxy/{namespace}/{pod}/{scheme}:{port}/{path}`` over the agent's authenticated port,
as it does for pods/log; the agent answers nobody but the API server there. The agent looks
the pod up among its own (a pod of another node, or one not running, is a 503), finds the
address the pod is reached at (its IP on the container port, or for a pod on the node's
network the node's address on the host port it was given), and relays the request with
every method, header (but hop-by-hop ones and the API server's credentials) and body, the
answer streamed back as it comes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gpufleet.agent.resources import port_requests
from gpufleet.utils.http import relay_body

log = logging.getLogger(__name__)

PREFIX = "/podProxy"
# Hop-by-hop headers (RFC 9110 7.6.1) and the API server's credentials are not relayed.
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", "authorization",
})
# An answer up to this size with a Content-Length is read whole and sent in one piece.
_SMALL_BODY = 1 << 20


@dataclass
class PodTarget:
    """Where a pod's port is reached, or why it cannot be (``code`` >= 400)."""

    host: str = ""
    port: int = 0
    code: int = 200
    reason: str = ""
    message: str = ""


def resolve_port(pod: Mapping[str, Any], port: str, host_ports: Mapping[str, int] | None) -> int | None:
    """The port a pod's ``port`` (a container port's number or name) is reached at: the
    container port itself, or with ``host_ports`` (a pod on the node's network) the host port
    it was given. None for a name no container port has."""
    ports = host_ports or {}
    for req in port_requests(pod):
        if port == req.name or (port.isdigit() and int(port) == req.container_port):
            return ports.get(req.key, req.container_port)
    return int(port) if port.isdigit() else None


def _status(code: int, reason: str, message: str) -> JSONResponse:
    return JSONResponse({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                         "message": message, "reason": reason, "code": code}, status_code=code)


class PodRelay:
    """The ``/podProxy/...`` endpoint: ``target(namespace, pod, port)`` says where to go."""

    def __init__(self, target: Any, timeout: float = 300.0) -> None:
        self._target = target
        self._timeout = timeout
        self._http: httpx.AsyncClient | None = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            # Pods' certificates are nobody's to verify here, as kube-apiserver's proxy to pods.
            self._http = httpx.AsyncClient(trust_env=False, follow_redirects=False, verify=False,
                                           timeout=httpx.Timeout(self._timeout, connect=5.0))
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def handle(self, request: Request) -> Response:
        parts = request.scope["path"][len(PREFIX) + 1:].split("/", 3)
        if len(parts) < 3:
            return _status(404, "NotFound", "the path must be /podProxy/{namespace}/{pod}/{scheme}:{port}/...")
        namespace, pod, target = parts[0], parts[1], parts[2]
        rest = "/" + (parts[3] if len(parts) > 3 else "")
        scheme, _, port = target.partition(":")
        if scheme not in ("http", "https") or not port:
            return _status(400, "BadRequest", f"invalid proxy target {target!r}: want {{http|https}}:{{port}}")
        where: PodTarget = await self._target(namespace, pod, port)
        if where.code >= 400:
            return _status(where.code, where.reason, where.message)
        host = f"[{where.host}]" if ":" in where.host else where.host
        url = f"{scheme}://{host}:{where.port}{rest}"
        if request.url.query:
            url += "?" + request.url.query
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        body = await request.body()
        client = self._client()
        try:
            upstream = await client.send(client.build_request(request.method, url, headers=headers, content=body),
                                         stream=True)
        except httpx.HTTPError as exc:
            log.info("pod proxy: %s %s: %s", request.method, url, exc)
            return _status(503, "ServiceUnavailable",
                           f"error trying to reach pod {namespace}/{pod} at {where.host}:{where.port}: "
                           f"{exc or type(exc).__name__}")
        answer = [(k, v) for k, v in upstream.headers.multi_items() if k.lower() not in _HOP_BY_HOP]
        length = upstream.headers.get("content-length", "")
        if length.isdigit() and int(length) <= _SMALL_BODY:
            try:
                content = b"".join([chunk async for chunk in upstream.aiter_raw()])
            except httpx.HTTPError as exc:
                return _status(503, "ServiceUnavailable", f"error reading from pod {namespace}/{pod}: {exc}")
            finally:
                await upstream.aclose()
            response = Response(content, status_code=upstream.status_code)
        else:
            response = StreamingResponse(relay_body(upstream, log, "pod proxy: the answer stopped"), status_code=upstream.status_code)
        response.raw_headers = [*(h for h in response.raw_headers if h[0] == b"content-length"),
                                *((k.encode("latin-1"), v.encode("latin-1")) for k, v in answer)]
        return response
