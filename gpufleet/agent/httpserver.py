"""The agent's own HTTP endpoint, as the kubelet's port 10250: container logs (proxied to
users by the API server's pods/log), exec, attach and port-forward streams (streamserver.py,
for pods/exec, pods/attach and pods/portforward), a stats summary (read by metrics.k8s.io),
the scraped workload metrics (read by the HPA), Prometheus metrics, a health check, and the
relay to its pods behind pods/proxy and services/proxy (``/podProxy/...``, podproxy.py).

It serves TLS with the node's serving certificate and answers only the API server: every
request but /healthz must bear a proxy token of the API server for this node, fresh (60 s)
and never seen before (see ``build_app`` and gpufleet/utils/nodeauth.py); everyone else reads
these through the API: ``pods/log``, ``metrics.k8s.io`` and ``nodes/{name}/proxy/{path}``
(RBAC ``nodes/proxy``), as with the kubelet behind kube-apiserver."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.websockets import WebSocket

from gpufleet.agent.podproxy import PREFIX as POD_PROXY_PREFIX
from gpufleet.agent.podproxy import PodRelay, PodTarget
from gpufleet.agent.streamserver import stream_routes
from gpufleet.utils.uvicornserver import ServerTask

log = logging.getLogger(__name__)

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class LogAnswer:
    """Either an error (code, reason, message) or the log body / stream."""

    code: int = 200
    reason: str = ""
    message: str = ""
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None


class AgentEndpoints(Protocol):
    async def container_logs(self, namespace: str, pod: str, container: str,
                             params: Mapping[str, str]) -> LogAnswer: ...

    async def stats_summary(self) -> dict[str, Any]: ...

    async def metrics_text(self) -> bytes: ...

    async def workload_metrics(self, namespace: str | None = None) -> dict[str, Any]: ...

    async def pod_target(self, namespace: str, pod: str, port: str) -> PodTarget: ...


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


OPEN_PATHS = frozenset({"/healthz"})


class RequireToken:
    """ASGI wrapper: every HTTP request but those of ``OPEN_PATHS`` must bear a bearer token
    that ``verify`` accepts (it answers None, or why not), whatever its path or method; else
    401 in Status shape."""

    def __init__(self, app: Starlette, verify: Callable[[str], str | None]) -> None:
        self.app = app
        self._verify = verify

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and scope["path"] not in OPEN_PATHS:
            why = self._refusal(scope)
            if why is not None:
                log.info("agent port: refused %s %s: %s", scope.get("method", "websocket"), scope["path"], why)
                response = JSONResponse(status_body(401, "Unauthorized", "Unauthorized"), status_code=401)
                if scope["type"] == "websocket":
                    await WebSocket(scope, receive, send).send_denial_response(response)
                else:
                    await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Any) -> str | None:
        header = next((v for k, v in scope.get("headers") or [] if k == b"authorization"), b"")
        scheme, _, given = header.partition(b" ")
        if scheme.lower() != b"bearer" or not given.strip():
            return "no bearer token"
        try:
            return self._verify(given.strip().decode("ascii"))
        except UnicodeDecodeError:
            return "not a token"


_PROXY_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def build_app(endpoints: AgentEndpoints,
              verify: Callable[[str], str | None] | None = None,
              relay: PodRelay | None = None) -> Starlette | RequireToken:
    """``verify``: the check of the API server's proxy tokens (ProxyTokenVerifier.verify).
    With it, container logs, /stats/*, /metrics and any other path answer only a request
    bearing a token it accepts (401 otherwise); /healthz answers anyone. Without it (an agent
    of an --insecure server) everything answers everyone."""

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def container_logs(request: Request) -> Response:
        p = request.path_params
        answer = await endpoints.container_logs(p["namespace"], p["pod"], p.get("container", ""),
                                                dict(request.query_params))
        if answer.code >= 400:
            return JSONResponse(status_body(answer.code, answer.reason, answer.message), status_code=answer.code)
        if answer.stream is not None:
            return StreamingResponse(answer.stream, media_type="text/plain")
        return Response(answer.body, media_type="text/plain")

    async def summary(request: Request) -> Response:
        return Response(orjson.dumps(await endpoints.stats_summary()), media_type="application/json")

    async def metrics(request: Request) -> Response:
        return Response(await endpoints.metrics_text(), media_type=PROMETHEUS_CONTENT_TYPE)

    async def workload(request: Request) -> Response:
        return Response(orjson.dumps(await endpoints.workload_metrics(request.query_params.get("namespace"))),
                        media_type="application/json")

    app = Starlette(routes=[
        Route("/healthz", healthz),
        Route("/containerLogs/{namespace}/{pod}/{container}", container_logs),
        Route("/containerLogs/{namespace}/{pod}", container_logs),
        Route("/stats/summary", summary),
        Route("/stats/workload", workload),
        Route("/metrics", metrics),
        Route("/metrics/resource", metrics),
        *(stream_routes(endpoints) if hasattr(endpoints, "open_exec") else ()),  # type: ignore[arg-type]
        *([Route(POD_PROXY_PREFIX + "/{rest:path}", relay.handle, methods=_PROXY_METHODS)] if relay is not None else []),
    ])
    return app if verify is None else RequireToken(app, verify)


class AgentHttpServer(ServerTask):
    """uvicorn as a task of the agent's event loop; with ``serving`` (the node's serving
    certificate and the API server's token key) it speaks TLS and checks proxy tokens."""

    def __init__(self, endpoints: AgentEndpoints, host: str, port: int, serving: Any = None) -> None:
        tls = dict(ssl_certfile=str(serving.cert_file), ssl_keyfile=str(serving.key_file)) if serving else {}
        target = getattr(endpoints, "pod_target", None)
        self.relay = PodRelay(target) if target is not None else None
        app = build_app(endpoints, serving.verifier().verify if serving else None, self.relay)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=1, ws="websockets-sansio",
                                ws_ping_interval=None, **tls)
        super().__init__(config, what="the agent's HTTP server", task_name="agent-http", stop_timeout=3)

    async def stop(self) -> None:
        await super().stop()
        if self.relay is not None:
            await self.relay.close()
