"""pods/proxy and services/proxy over the real TLS listener of an in-process control plane,
relayed by a real agent HTTP server (its authenticated port, the API server's node
credentials) to a real HTTP backend: every method, the path and query after /proxy, the
caller's credentials left behind; RBAC on pods/proxy and services/proxy; Kubernetes' errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpufleet.agent.bootstrap import node_token
from gpufleet.agent.httpserver import AgentHttpServer, LogAnswer
from gpufleet.agent.podproxy import PodTarget
from gpufleet.agent.servingcert import ensure_serving
from gpufleet.cli.commands.token import create_token
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import Client, HttpTransport
from gpufleet.utils.http import RawResponse

NS = "default"


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                         run_controllers=False)
    await plane.start()
    yield plane
    await plane.stop()


def connect(cp: ControlPlane, token: str | None) -> Client:
    return Client(HttpTransport(cp.url, token=token, ca_data=cp.ca_pem), read_retries=1)


async def send(c: Client, method: str, path: str, body: bytes | None = None, **kw: Any) -> RawResponse:
    return await c.raw_request(method, path, content=body, raise_for_status=False, **kw)


def message(resp: RawResponse) -> str:
    return json.loads(resp.body)["message"]


class Agent:
    """The agent's endpoints: pod "web-0" (and "web-1") of this node answer on the backend's
    port, as container port 8000 or its name "http"."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.asked: list[tuple[str, str, str]] = []

    async def pod_target(self, namespace: str, pod: str, port: str) -> PodTarget:
        self.asked.append((namespace, pod, port))
        if pod not in ("web-0", "web-1"):
            return PodTarget(code=503, reason="ServiceUnavailable", message=f'pod "{pod}" is not running here')
        if port not in ("8000", "http"):
            return PodTarget(code=400, reason="BadRequest", message=f'no port "{port}"')
        return PodTarget(host="127.0.0.1", port=self.port)

    async def container_logs(self, namespace: str, pod: str, container: str, params: Any) -> LogAnswer:
        return LogAnswer(body=b"")

    async def stats_summary(self) -> dict[str, Any]:
        return {}

    async def metrics_text(self) -> bytes:
        return b""

    async def workload_metrics(self, namespace: str | None = None) -> dict[str, Any]:
        return {}


async def echo(request: web.Request) -> web.Response:
    return web.json_response({"method": request.method, "path": request.path, "query": request.query_string,
                              "body": (await request.read()).decode(),
                              "authorization": request.headers.get("Authorization"),
                              "custom": request.headers.get("X-Custom")},
                             headers={"X-Backend": "yes"})


@pytest.fixture
async def backend() -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    await runner.cleanup()


def pod(name: str) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS,
                                                                           "labels": {"app": "web"}},
                            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x", "ports": [
                                {"name": "http", "containerPort": 8000}]}]}}
    return body


async def test_services_and_pods_proxy_through_the_nodes_agent(cp: ControlPlane, tmp_path: Path,
                                                               backend: int) -> None:
    state = tmp_path / "n1"
    async with connect(cp, await node_token(lambda t: connect(cp, t), cp.join_token, "n1", state)) as node:
        serving = await ensure_serving(node, "n1", state)
    stub = Agent(backend)
    server = AgentHttpServer(stub, "127.0.0.1", 0, serving=serving)
    await server.start()
    async with connect(cp, cp.admin_token) as admin:
        try:
            await admin.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}, raw=True)
            node_obj = await admin.get("nodes", "n1", raw=True)
            node_obj["status"] = {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                                  "daemonEndpoints": {"kubeletEndpoint": {"Port": server.port}}}
            await admin.update_status(node_obj, raw=True)
            for name in ("web-0", "pending"):
                created = await admin.create(pod(name), raw=True)
                if name == "web-0":
                    created["status"] = {"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]}
                    await admin.update_status(created, raw=True)
            await admin.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": NS},
                                "spec": {"selector": {"app": "web"},
                                         "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}, raw=True)
            svc_path = f"/api/v1/namespaces/{NS}/services"

            # No Endpoints yet: Kubernetes' 503.
            resp = await send(admin, "GET", f"{svc_path}/web:80/proxy/")
            assert (resp.status, message(resp)) == (503, 'no endpoints available for service "web"')
            await admin.create({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web", "namespace": NS},
                                "subsets": [{"addresses": [{"ip": "10.0.0.5", "nodeName": "n1", "targetRef": {
                                    "kind": "Pod", "name": "web-0", "namespace": NS}}],
                                    "ports": [{"name": "http", "port": 8000}]}]}, raw=True)

            # The Service port by number, by name, with a scheme; every method; path and query.
            for sid in ("web:80", "web:http", "http:web:80"):
                resp = await send(admin, "GET", f"{svc_path}/{sid}/proxy/a/b", params={"x": "1", "watch": "true"})
                assert resp.status == 200, resp.body
                got = json.loads(resp.body)
                assert (got["method"], got["path"], got["query"]) == ("GET", "/a/b", "x=1&watch=true")
                assert got["authorization"] is None  # neither the admin's token nor the API server's
                assert resp.headers.get("x-backend") == "yes"
            assert stub.asked[-1] == (NS, "web-0", "http")  # the Service's targetPort
            for method in ("POST", "PUT", "PATCH", "DELETE"):
                resp = await send(admin, method, f"{svc_path}/web:80/proxy/submit", b"payload",
                                  headers={"X-Custom": "kept", "Content-Type": "text/plain"})
                got = json.loads(resp.body)
                assert (resp.status, got["method"], got["body"], got["custom"]) == (200, method, "payload", "kept")

            # Errors as kube-apiserver words them.
            resp = await send(admin, "GET", f"{svc_path}/web:81/proxy/")
            assert (resp.status, message(resp)) == (503, 'no service port 81 found for service "web"')
            resp = await send(admin, "GET", f"{svc_path}/web/proxy/")  # no unnamed port
            assert (resp.status, message(resp)) == (503, 'no endpoints available for service "web"')
            resp = await send(admin, "GET", f"{svc_path}/ftp:web:80/proxy/")
            assert (resp.status, message(resp)) == (400, 'invalid service request "ftp:web:80"')
            resp = await send(admin, "GET", f"{svc_path}/nothere:80/proxy/")
            assert (resp.status, message(resp)) == (404, 'services "nothere" not found')

            # pods/proxy: the port given, or the pod's first container port.
            pod_path = f"/api/v1/namespaces/{NS}/pods"
            for pid in ("web-0", "web-0:8000", "web-0:http"):
                resp = await send(admin, "GET", f"{pod_path}/{pid}/proxy/index.html")
                assert (resp.status, json.loads(resp.body)["path"]) == (200, "/index.html"), resp.body
            resp = await send(admin, "GET", f"{pod_path}/pending/proxy/")
            assert (resp.status, message(resp)) == (
                400, 'address not allowed: pod "pending" has no IP yet (it is not running)')
            resp = await send(admin, "GET", f"{pod_path}/web-0:9/proxy/")
            assert (resp.status, message(resp)) == (400, 'no port "9"')

            # The relay is not reachable through nodes/proxy.
            resp = await send(admin, "GET", f"/api/v1/nodes/n1/proxy/podProxy/{NS}/web-0/http:8000/")
            assert resp.status == 404

            # RBAC: view may not proxy, edit may.
            viewer = (await create_token(admin, user="vic", namespace=NS, role="view"))["token"]
            editor = (await create_token(admin, user="eve", namespace=NS, role="edit"))["token"]
            async with connect(cp, viewer) as vic, connect(cp, editor) as eve:
                resp = await send(vic, "GET", f"{svc_path}/web:80/proxy/")
                assert (resp.status, message(resp)) == (
                    403, 'services "web:80" is forbidden: User "vic" cannot get resource "services/proxy" in API '
                         'group "" in the namespace "default"')
                resp = await send(vic, "POST", f"{pod_path}/web-0/proxy/", b"")
                assert resp.status == 403 and 'cannot create resource "pods/proxy"' in message(resp)
                assert (await send(eve, "GET", f"{svc_path}/web:80/proxy/")).status == 200
                assert (await send(eve, "POST", f"{pod_path}/web-0/proxy/", b"x")).status == 200
        finally:
            await server.stop()
