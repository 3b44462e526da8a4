"""The gateway against a real control plane (API server, store, in-process client) and real
HTTP backends on loopback. Endpoints are written by hand (Services without a selector), so
each test decides exactly which addresses are Ready."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client.api import Client
from gpufleet.gateway import Gateway

NS = "default"


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    plane = ControlPlane(store_url="sqlite:///" + str(tmp_path / "db"), port=0, state_dir=tmp_path,
                         run_controllers=False, secure=False)
    await plane.start()
    yield plane
    await plane.stop()


@pytest.fixture
def client(cp: ControlPlane) -> Client:
    assert cp.client is not None
    return cp.client


@pytest.fixture
async def gateway(client: Client) -> AsyncIterator[Gateway]:
    gw = Gateway(client, port=0, hold_timeout=10.0, failure_cooldown=0.5)
    await gw.start()
    yield gw
    await gw.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


class Backend:
    """A pod stand-in: answers with its name; /slow waits until released; /stream sends two
    chunks with a release in between."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.hits: list[str] = []
        self.release = asyncio.Event()
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> Backend:
        app = web.Application()
        app.router.add_route("*", "/slow", self._slow)
        app.router.add_route("*", "/stream", self._stream)
        app.router.add_route("*", "/{tail:.*}", self._echo)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _echo(self, request: web.Request) -> web.Response:
        self.hits.append(request.path_qs)
        body = await request.read()
        return web.json_response({"pod": self.name, "method": request.method, "path": request.path_qs,
                                  "body": body.decode()})

    async def _slow(self, request: web.Request) -> web.Response:
        self.hits.append(request.path)
        await self.release.wait()
        return web.json_response({"pod": self.name})

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        self.hits.append(request.path)
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"first\n")
        await self.release.wait()
        await resp.write(b"second\n")
        await resp.write_eof()
        return resp


@pytest.fixture
async def backends() -> AsyncIterator[list[Backend]]:
    made = [await Backend(f"pod-{i}").start() for i in range(3)]
    yield made
    for b in made:
        b.release.set()
        await b.stop()


def free_port(low: int | None = None) -> int:
    """A port nothing listens on; with ``low``, one from the nodePort range upwards."""
    for port in range(low, 32768) if low else [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")


def address(pod: str) -> dict[str, Any]:
    return {"ip": "127.0.0.1", "targetRef": {"kind": "Pod", "namespace": NS, "name": pod}}


async def publish(client: Client, name: str, ready: list[tuple[str, int]], not_ready: list[tuple[str, int]] = (),
                  *, service: dict[str, Any] | None = None) -> None:
    """A selector-less Service ``name`` and its Endpoints: ready and not-ready (pod, port)s."""
    if service is not False:
        svc = service or {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
                          "spec": {"ports": [{"name": "http", "port": 80}]}}
        with contextlib.suppress(Exception):
            await client.create(svc, NS, raw=True)
    subsets = []
    for pod, port in ready:
        subsets.append({"addresses": [address(pod)], "ports": [{"name": "http", "port": port}]})
    for pod, port in not_ready:
        subsets.append({"notReadyAddresses": [address(pod)], "ports": [{"name": "http", "port": port}]})
    body = {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": name, "namespace": NS}}
    if subsets:
        body["subsets"] = subsets
    try:
        current = await client.get("endpoints", name, NS, raw=True)
    except Exception:
        await client.create(body, NS, raw=True)
        return
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    await client.update(body, raw=True)


async def until(fn, timeout: float = 5.0) -> Any:  # noqa: ASYNC109
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = fn()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, f"timed out: {fn}"
        await asyncio.sleep(0.02)


def routed(gw: Gateway, name: str, count: int) -> bool:
    route = gw.routes.get(f"{NS}/{name}")
    return route is not None and len(route.endpoints(None)) == count


async def test_routes_to_ready_endpoints_and_balances_least_outstanding(
        client: Client, gateway: Gateway, backends: list[Backend], http: aiohttp.ClientSession) -> None:
    a, b = backends[0], backends[1]
    await publish(client, "web", [(a.name, a.port), (b.name, b.port)])
    await until(lambda: routed(gateway, "web", 2))
    base = f"{gateway.url}/services/{NS}/web"
    async with http.get(f"{gateway.url}/services/{NS}/web:http/by-name") as resp:
        assert resp.status == 200
    async with http.get(f"{gateway.url}/services/{NS}/web:80/by-number") as resp:
        assert resp.status == 200
    async with http.post(f"{base}/predict?x=1", data=b"payload") as resp:
        assert resp.status == 200
        echoed = await resp.json()
    assert echoed["method"] == "POST" and echoed["path"] == "/predict?x=1" and echoed["body"] == "payload"
    # One request is stuck on a pod: every following one goes to the other pod.
    slow = asyncio.ensure_future(http.get(f"{base}/slow"))
    busy = await until(lambda: next((x for x in (a, b) if "/slow" in x.hits), None))
    idle = b if busy is a else a
    before = len(idle.hits)
    for _ in range(6):
        async with http.get(f"{base}/q") as resp:
            assert (await resp.json())["pod"] == idle.name
    assert len(idle.hits) == before + 6
    busy.release.set()
    async with await slow as resp:
        assert resp.status == 200
    # With nothing outstanding, both share the traffic.
    pods = Counter()
    for _ in range(20):
        async with http.get(f"{base}/q") as resp:
            pods[(await resp.json())["pod"]] += 1
    assert set(pods) == {a.name, b.name}


async def test_not_ready_addresses_get_no_traffic(
        client: Client, gateway: Gateway, backends: list[Backend], http: aiohttp.ClientSession) -> None:
    a, b = backends[0], backends[1]
    await publish(client, "web", [(a.name, a.port)], not_ready=[(b.name, b.port)])
    await until(lambda: routed(gateway, "web", 1))
    for _ in range(10):
        async with http.get(f"{gateway.url}/services/{NS}/web/") as resp:
            assert resp.status == 200
    assert len(a.hits) == 10 and b.hits == []
    # The pod leaves the endpoints (being deleted): no new request reaches it.
    await publish(client, "web", [(b.name, b.port)])
    await until(lambda: routed(gateway, "web", 1) and gateway.routes[f"{NS}/web"].endpoints(None)[0].pod.endswith(b.name))
    for _ in range(5):
        async with http.get(f"{gateway.url}/services/{NS}/web/") as resp:
            assert (await resp.json())["pod"] == b.name
    assert len(a.hits) == 10


async def test_refused_connection_goes_to_another_endpoint_even_for_post(
        client: Client, gateway: Gateway, backends: list[Backend], http: aiohttp.ClientSession) -> None:
    a = backends[0]
    await publish(client, "web", [("dead", free_port()), (a.name, a.port)])
    await until(lambda: routed(gateway, "web", 2))
    for i in range(10):
        async with http.post(f"{gateway.url}/services/{NS}/web/predict", data=str(i)) as resp:
            assert resp.status == 200
    assert len(a.hits) == 10


async def test_failure_after_sending_is_retried_only_for_idempotent_methods(
        client: Client, gateway: Gateway, backends: list[Backend], http: aiohttp.ClientSession) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the request arrived; no answer
        writer.close()

    rude = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    rude_port = rude.sockets[0].getsockname()[1]
    try:
        await publish(client, "web", [("rude", rude_port)])
        await until(lambda: routed(gateway, "web", 1))
        async with http.post(f"{gateway.url}/services/{NS}/web/predict") as resp:
            assert resp.status == 502
        a = backends[0]
        await publish(client, "web", [("rude", rude_port), (a.name, a.port)])
        await until(lambda: routed(gateway, "web", 2))
        for _ in range(6):
            async with http.get(f"{gateway.url}/services/{NS}/web/q") as resp:
                assert resp.status == 200
                assert (await resp.json())["pod"] == a.name
    finally:
        rude.close()


async def test_streams_the_response_as_it_comes(
        client: Client, gateway: Gateway, backends: list[Backend], http: aiohttp.ClientSession) -> None:
    a = backends[0]
    await publish(client, "web", [(a.name, a.port)])
    await until(lambda: routed(gateway, "web", 1))
    async with http.get(f"{gateway.url}/services/{NS}/web/stream") as resp:
        # The first chunk arrives while the pod is still holding back the second one.
        first = await asyncio.wait_for(resp.content.readline(), 5)
        assert first == b"first\n"
        assert not a.release.is_set()
        a.release.set()
        assert await resp.content.read() == b"second\n"


async def test_holds_requests_until_an_endpoint_is_ready(
        client: Client, gateway: Gateway, backends: list[Backend], http: aiohttp.ClientSession) -> None:
    await publish(client, "web", [])
    await until(lambda: f"{NS}/web" in gateway.routes)
    pending = [asyncio.ensure_future(http.get(f"{gateway.url}/services/{NS}/web/q")) for _ in range(3)]
    await until(lambda: gateway.stats.held.get(f"{NS}/web") == 3)
    a = backends[0]
    await publish(client, "web", [(a.name, a.port)])
    for fut in pending:
        async with await fut as resp:
            assert resp.status == 200
    assert gateway.stats.held[f"{NS}/web"] == 0


async def test_holding_is_bounded_in_time_and_number(client: Client, backends: list[Backend],
                                                      http: aiohttp.ClientSession) -> None:
    gw = Gateway(client, port=0, hold_timeout=0.5, max_held=1)
    await gw.start()
    try:
        await publish(client, "web", [])
        await until(lambda: f"{NS}/web" in gw.routes)
        first = asyncio.ensure_future(http.get(f"{gw.url}/services/{NS}/web/q"))
        await until(lambda: gw.stats.held.get(f"{NS}/web") == 1)
        async with http.get(f"{gw.url}/services/{NS}/web/q") as resp:
            assert resp.status == 503
            assert "already waiting" in (await resp.json())["message"]
        async with await first as resp:
            assert resp.status == 503
            assert "no ready endpoint" in (await resp.json())["message"]
        async with http.get(f"{gw.url}/services/{NS}/missing/q") as resp:
            assert resp.status == 404
            assert 'services "missing" not found' in (await resp.json())["message"]
        async with http.get(f"{gw.url}/services/{NS}/web:grpc/q") as resp:
            assert resp.status == 404
            assert "has no port 'grpc'" in (await resp.json())["message"]
    finally:
        await gw.stop()


async def test_scale_from_zero_brings_one_replica_and_answers(
        client: Client, gateway: Gateway, backends: list[Backend], http: aiohttp.ClientSession) -> None:
    labels = {"app": "model"}
    await client.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "model", "namespace": NS},
                         "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                                  "template": {"metadata": {"labels": labels},
                                               "spec": {"containers": [{"name": "m", "image": "m"}]}}}}, NS, raw=True)
    await client.create({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                         "metadata": {"name": "model", "namespace": NS},
                         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "model"},
                                  "minReplicas": 0, "maxReplicas": 3}}, NS, raw=True)
    await publish(client, "model", [], service={
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "model", "namespace": NS},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 80}]}})
    await until(lambda: f"{NS}/model" in gateway.routes and gateway.hpa_informer.get(f"{NS}/model"))
    request = asyncio.ensure_future(http.get(f"{gateway.url}/services/{NS}/model/q"))

    async def scaled() -> bool:
        dep = await client.get("deployments", "model", NS, raw=True)
        return dep["spec"]["replicas"] == 1

    await until(scaled)
    a = backends[0]
    await publish(client, "model", [(a.name, a.port)], service=False)
    async with await request as resp:
        assert resp.status == 200


async def test_metrics_per_service_and_pod(
        client: Client, gateway: Gateway, backends: list[Backend], http: aiohttp.ClientSession) -> None:
    a, b = backends[0], backends[1]
    await publish(client, "web", [(a.name, a.port), (b.name, b.port)])
    await until(lambda: routed(gateway, "web", 2))
    for _ in range(8):
        async with http.get(f"{gateway.url}/services/{NS}/web/q") as resp:
            assert resp.status == 200
    async with http.get(f"{gateway.url}/metrics") as resp:
        text = await resp.text()
    assert 'gpufleet_gateway_service_requests_total{namespace="default",service="web"} 8' in text
    assert 'gpufleet_gateway_service_request_duration_seconds_count{namespace="default",service="web"} 8' in text
    assert 'gpufleet_gateway_pod_requests_in_flight{namespace="default",service="web",pod="pod-0"} 0' in text
    url = f"{gateway.url}/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/*/requests_per_second"
    async with http.get(url) as resp:
        body = await resp.json()
    assert body["kind"] == "MetricValueList"
    values = {i["describedObject"]["name"]: i["value"] for i in body["items"]}
    assert set(values) == {a.name, b.name}
    # 8 requests in the first second(s): a positive rate for each pod that served some.
    served = {x.name for x in (a, b) if x.hits}
    assert all(values[n] not in ("0", "0m") for n in served)
    async with http.get(url.replace("requests_per_second", "nope")) as resp:
        assert resp.status == 404


async def test_node_port_serves_its_service(
        client: Client, gateway: Gateway, backends: list[Backend], http: aiohttp.ClientSession) -> None:
    a = backends[0]
    port = free_port(30000 + random.randrange(2000))
    await publish(client, "web", [(a.name, a.port)], service={
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": NS},
        "spec": {"type": "NodePort", "ports": [{"name": "http", "port": 80, "nodePort": port}]}})
    await until(lambda: port in gateway._node_sites and routed(gateway, "web", 1))
    async with http.get(f"http://127.0.0.1:{port}/hello?q=1") as resp:
        assert resp.status == 200
        assert (await resp.json())["path"] == "/hello?q=1"
