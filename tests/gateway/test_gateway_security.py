"""The gateway and Endpoints that point back at the cluster: over the real TLS listener of a
secured control plane (tokens, RBAC, admission) with its gateway, real HTTP backends on
loopback and a stand-in node agent that records every request it gets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gpufleet.cli.commands.token import create_token
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import Client, HttpTransport

NS = "default"


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                         run_controllers=False, gateway_port=0)
    await plane.start()
    yield plane
    await plane.stop()


def connect(cp: ControlPlane, token: str | None) -> Client:
    return Client(HttpTransport(cp.url, token=token, ca_data=cp.ca_pem), read_retries=1)


class Recorder:
    """An HTTP server on loopback that answers 200 and records the paths it was asked for."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> Recorder:
        async def any_path(request: web.Request) -> web.Response:
            self.hits.append(request.path)
            return web.Response(text="reached")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", any_path)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def agent_port(cp: ControlPlane) -> AsyncIterator[Recorder]:
    """A node n1 whose agent (a recorder) listens on 127.0.0.1."""
    agent = await Recorder().start()
    async with connect(cp, cp.admin_token) as admin:
        await admin.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}, raw=True)
        node = await admin.get("nodes", "n1", raw=True)
        node["status"] = {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                          "daemonEndpoints": {"kubeletEndpoint": {"Port": agent.port}}}
        await admin.update_status(node, raw=True)
    yield agent
    await agent.stop()


def service(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"ports": [{"name": "http", "port": 80}]}}


def endpoints(name: str, ip: str, port: int, *, pod: str | None = "p", ready: bool = True) -> dict[str, Any]:
    addr: dict[str, Any] = {"ip": ip}
    if pod:
        addr["targetRef"] = {"kind": "Pod", "namespace": NS, "name": pod}
    return {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": name, "namespace": NS},
            "subsets": [{"addresses" if ready else "notReadyAddresses": [addr],
                         "ports": [{"name": "http", "port": port}]}]}


async def edit_token(admin: Client) -> str:
    return (await create_token(admin, user="eve", namespace=NS, role="edit"))["token"]


@pytest.mark.parametrize(("ip", "why"), [
    ("127.0.0.1", "may not be in the loopback range (127.0.0.0/8, ::1/128)"),
    ("127.3.2.1", "may not be in the loopback range (127.0.0.0/8, ::1/128)"),
    ("::1", "may not be in the loopback range (127.0.0.0/8, ::1/128)"),
    ("169.254.169.254", "may not be in the link-local range (169.254.0.0/16, fe80::/10)"),
    ("fe80::1", "may not be in the link-local range (169.254.0.0/16, fe80::/10)"),
    ("224.0.0.251", "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"),
    ("ff02::1", "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"),
    ("0.0.0.0", "may not be unspecified (0.0.0.0)"),
    ("::", "may not be unspecified (::)"),
])
async def test_an_edit_token_cannot_write_node_centric_endpoints(cp: ControlPlane, ip: str, why: str) -> None:
    async with connect(cp, cp.admin_token) as admin:
        token = await edit_token(admin)
    async with connect(cp, token) as eve:
        await eve.create(service("sneaky"), NS, raw=True)
        for ready in (True, False):
            resp = await eve.raw_request("POST", f"/api/v1/namespaces/{NS}/endpoints",
                                         json=endpoints("sneaky", ip, 10250, ready=ready), raise_for_status=False)
            status = json.loads(resp.body)
            field = f"subsets[0].{'addresses' if ready else 'notReadyAddresses'}[0].ip"
            assert (resp.status, status["reason"]) == (422, "Invalid"), status
            assert status["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": field,
                                                    "message": f'Invalid value: "{ip}": {why}'}]
            assert status["message"] == f'Endpoints "sneaky" is invalid: {field}: Invalid value: "{ip}": {why}'
        # Nothing was stored; an update to such an address is refused the same way.
        assert (await eve.raw_request("GET", f"/api/v1/namespaces/{NS}/endpoints/sneaky",
                                      raise_for_status=False)).status == 404
        stored = await eve.create(endpoints("sneaky", "10.1.2.3", 8080), NS, raw=True)
        stored["subsets"][0]["addresses"][0]["ip"] = ip
        resp = await eve.raw_request("PUT", f"/api/v1/namespaces/{NS}/endpoints/sneaky", json=stored,
                                     raise_for_status=False)
        assert resp.status == 422, resp.body


async def test_endpoints_must_be_ip_addresses(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin:
        resp = await admin.raw_request("POST", f"/api/v1/namespaces/{NS}/endpoints",
                                       json=endpoints("named", "localhost", 70000), raise_for_status=False)
        causes = json.loads(resp.body)["details"]["causes"]
        assert resp.status == 422
        assert {c["field"] for c in causes} == {"subsets[0].addresses[0].ip", "subsets[0].ports[0].port"}


async def test_unauthenticated_get_through_the_gateway_never_reaches_the_agent(
        cp: ControlPlane, agent_port: Recorder) -> None:
    """Endpoints at the node agent's port, at the API server's, at the metadata service's or
    on loopback with no pod behind them (written by an administrator, or stored before the
    admission plugin) are refused when the gateway would dial them: 502 saying why; the
    agent never sees the request. A loopback pod behind a Service still takes traffic."""
    assert cp.gateway is not None and cp.http is not None
    pod = await Recorder().start()
    cases = {
        "agent": (endpoints("agent", "127.0.0.1", agent_port.port), "is a node agent's port"),
        "agent-v4": (endpoints("agent-v4", "127.1.1.1", agent_port.port), "is a node agent's port"),
        "api": (endpoints("api", "127.0.0.1", cp.http.port), "is a port of the control plane itself"),
        "gw": (endpoints("gw", "127.0.0.1", cp.gateway.port), "is a port of the control plane itself"),
        "metadata": (endpoints("metadata", "169.254.169.254", 80), "link-local"),
        "nopod": (endpoints("nopod", "127.0.0.1", pod.port, pod=None), "the Endpoints name no pod behind it"),
    }
    try:
        async with connect(cp, cp.admin_token) as admin:
            for name, (ep, _) in cases.items():
                await admin.create(service(name), NS, raw=True)
                await admin.create(ep, NS, raw=True)
            await admin.create(service("model"), NS, raw=True)
            await admin.create(endpoints("model", "127.0.0.1", pod.port), NS, raw=True)
        async with aiohttp.ClientSession() as http:
            for name, (_, why) in cases.items():
                for _ in range(50):  # until the gateway's informer has the Endpoints
                    if f"{NS}/{name}" in cp.gateway.routes:
                        break
                    await asyncio.sleep(0.05)
                async with http.get(f"{cp.gateway.url}/services/{NS}/{name}/stats/summary") as resp:
                    body = await resp.json()
                    assert resp.status == 502, (name, body)
                    assert body["reason"] == "BadGateway" and why in body["message"], (name, body)
            for _ in range(50):
                if f"{NS}/model" in cp.gateway.routes:
                    break
                await asyncio.sleep(0.05)
            async with http.get(f"{cp.gateway.url}/services/{NS}/model/predict") as resp:
                assert (resp.status, await resp.text()) == (200, "reached")
        assert agent_port.hits == []
        assert pod.hits == ["/predict"]
    finally:
        await pod.stop()


async def test_gateway_metrics_need_a_token_allowed_to_read_metrics(cp: ControlPlane) -> None:
    assert cp.gateway is not None
    async with connect(cp, cp.admin_token) as admin:
        token = await edit_token(admin)
    url = f"{cp.gateway.url}/metrics"
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as resp:
            assert (resp.status, (await resp.json())["reason"]) == (401, "Unauthorized")
        async with http.get(url, headers={"Authorization": "Bearer not-a-token"}) as resp:
            assert resp.status == 401
        async with http.get(url, headers={"Authorization": f"Bearer {token}"}) as resp:
            assert (resp.status, (await resp.json())["reason"]) == (403, "Forbidden")
        async with http.get(url, headers={"Authorization": f"Bearer {cp.admin_token}"}) as resp:
            assert resp.status == 200
            assert "gpufleet_gateway" in await resp.text()
        async with http.get(f"{cp.gateway.url}/healthz") as resp:
            assert resp.status == 200
