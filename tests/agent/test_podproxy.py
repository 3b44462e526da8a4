"""The agent's pod relay: which port a pod's port is reached at (a pod with its own IP on
the container port; a pod on the node's network on the host port it was given), and the
relay itself over real HTTP: method, path, query, body and headers through, the API
server's credentials left behind, a pod that is not there a 503."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from gpufleet.agent.httpserver import AgentHttpServer, LogAnswer
from gpufleet.agent.podproxy import PodTarget, resolve_port

POD = {"spec": {"containers": [
    {"name": "a", "ports": [{"name": "http", "containerPort": 8000}, {"containerPort": 9090}]},
    {"name": "b", "ports": [{"name": "grpc", "containerPort": 50051}]}]}}


def test_a_pods_port_by_number_or_name_with_and_without_host_ports() -> None:
    assert resolve_port(POD, "8000", None) == 8000
    assert resolve_port(POD, "http", None) == 8000
    assert resolve_port(POD, "grpc", None) == 50051
    assert resolve_port(POD, "7000", None) == 7000  # undeclared numbers go as they are
    assert resolve_port(POD, "nope", None) is None
    host = {"http": 31080, "9090": 31090, "grpc": 31051}
    assert resolve_port(POD, "8000", host) == 31080
    assert resolve_port(POD, "http", host) == 31080
    assert resolve_port(POD, "9090", host) == 31090
    assert resolve_port(POD, "grpc", host) == 31051


class Endpoints:
    def __init__(self, port: int) -> None:
        self.port = port

    async def pod_target(self, namespace: str, pod: str, port: str) -> PodTarget:
        if pod != "web":
            return PodTarget(code=503, reason="ServiceUnavailable", message=f'pod "{pod}" is not running here')
        return PodTarget(host="127.0.0.1", port=self.port)

    async def container_logs(self, *args: object) -> LogAnswer:
        return LogAnswer()

    async def stats_summary(self) -> dict:
        return {}

    async def metrics_text(self) -> bytes:
        return b""

    async def workload_metrics(self, namespace: str | None = None) -> dict:
        return {}


@pytest.fixture
async def backend() -> AsyncIterator[int]:
    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"method": request.method, "path": request.path_qs,
                                  "body": (await request.read()).decode(),
                                  "authorization": request.headers.get("Authorization"),
                                  "x": request.headers.get("X-Thing")}, headers={"Set-Cookie": "a=b"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    await runner.cleanup()


async def test_the_relay_passes_the_request_and_answer_through(backend: int) -> None:
    server = AgentHttpServer(Endpoints(backend), "127.0.0.1", 0)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
            r = await http.put("/podProxy/default/web/http:8000/a/b?c=d&c=e", content=b"body",
                               headers={"Authorization": "Bearer the-api-servers", "X-Thing": "kept"})
            assert r.status_code == 200 and r.headers["set-cookie"] == "a=b"
            assert json.loads(r.content) == {"method": "PUT", "path": "/a/b?c=d&c=e", "body": "body",
                                             "authorization": None, "x": "kept"}
            r = await http.get("/podProxy/default/gone/http:8000/")
            assert (r.status_code, r.json()["message"]) == (503, 'pod "gone" is not running here')
            r = await http.get("/podProxy/default/web/ftp:8000/")
            assert r.status_code == 400
    finally:
        await server.stop()
