"""Where the HPA's numbers come from (``ClusterMetrics``), with the real pieces in between:
- cpu and gpu_utilization: metrics.k8s.io of the real API server, which reads a node agent's
  /stats/summary (the agent's real HTTP endpoint, which answers only the API server's
  token, serving the agent's own summary rendering);
- workload metrics: the agent's /stats/workload, built by the agent's real scraper from a
  pod's Prometheus endpoint, read through the API server's nodes/{name}/proxy;
- requests_per_second: the real gateway's custom.metrics.k8s.io endpoint."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from ctrl_helpers import NS, eventually, pod

from gpufleet.agent import stats as stats_mod
from gpufleet.agent.bootstrap import node_token
from gpufleet.agent.httpserver import AgentHttpServer, LogAnswer
from gpufleet.agent.servingcert import ensure_serving
from gpufleet.agent.workloadmetrics import parse_metrics, scrape, scrape_port
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import HttpTransport
from gpufleet.client.api import Client
from gpufleet.client.errors import Unauthorized
from gpufleet.controllers.hpa import ClusterMetrics, MetricsError
from gpufleet.gateway import Gateway
from gpufleet.utils.clock import FakeClock, rfc3339

POD_METRICS = """# TYPE model_requests_in_flight gauge
model_requests_in_flight 3
# TYPE model_queue_length gauge
model_queue_length{queue="a"} 2
model_queue_length{queue="b"} 5
"""


async def serve(routes: dict[str, Any]) -> tuple[web.AppRunner, int]:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def test_scrape_port_and_parse() -> None:
    p = pod("m", {"app": "m"})
    p["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8000}]
    assert scrape_port(p, {"http": 31000}) is None  # not asked for
    p["metadata"]["annotations"] = {"prometheus.io/scrape": "true"}
    assert scrape_port(p, {"http": 31000}) == 31000
    p["metadata"]["annotations"]["prometheus.io/port"] = "8000"
    assert scrape_port(p, None) == 8000
    assert parse_metrics(POD_METRICS) == {"model_requests_in_flight": 3.0, "model_queue_length": 7.0}


class AgentStub:
    """The agent's endpoints: a summary and the scraped workload metrics of pod ``created``."""

    def __init__(self, created: dict[str, Any], pod_port: int) -> None:
        self.created = created
        self.pod_port = pod_port

    async def stats_summary(self) -> dict[str, Any]:
        now = time.time()
        uid = self.created["metadata"]["uid"]
        sample = stats_mod.NodeSample(
            node_name="n1", time=now, start_time=now - 100, cpu_millis=1000, memory_used_bytes=1 << 30,
            memory_total_bytes=4 << 30, memory_available_bytes=3 << 30,
            pods=[stats_mod.PodSample("m-0", NS, uid, rfc3339(now - 50), [stats_mod.ContainerSample(
                "main", rfc3339(now - 50), 250.0, 100 << 20, 0, gpus=[0])])],
            gpus=[stats_mod.GPUSample(0, "GPU-0", "H100", "Healthy", "", 70.0, 1000, 80000, pod=f"{NS}/m-0",
                                      container="main")])
        return stats_mod.summary(sample)

    async def workload_metrics(self, namespace: str | None = None) -> dict[str, Any]:
        pods = [(self.created, {"http": self.pod_port})] if namespace in (None, NS) else []
        return {"pods": await scrape("127.0.0.1", pods, rfc3339(time.time()))}

    async def container_logs(self, namespace: str, pod: str, container: str, params: Any) -> LogAnswer:
        return LogAnswer(code=404, reason="NotFound", message="no logs here")

    async def metrics_text(self) -> bytes:
        return b""


@pytest.fixture
async def agent(cp: ControlPlane, client: Client, tmp_path: Any) -> AsyncIterator[dict[str, Any]]:
    """A node 'n1' whose agent endpoint (answering only the API server's token for n1) serves
    a summary and the scraped workload metrics of pod 'm-0' (1 GPU at 70%, 250m cpu), whose
    own /metrics serves POD_METRICS."""

    async def pod_metrics(request: web.Request) -> web.Response:
        return web.Response(text=POD_METRICS)

    pod_runner, pod_port = await serve({"/metrics": pod_metrics})
    body = pod("m-0", {"app": "m"}, node="n1")
    body["metadata"]["annotations"] = {"prometheus.io/scrape": "true", "prometheus.io/port": "http"}
    body["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8000}]
    created = await client.create(body, NS, raw=True)
    # n1 joins (its serving certificate and the API server's token key), as an agent does.
    def connect(token: str | None) -> Client:
        return Client(HttpTransport(cp.url, token=token, ca_data=cp.ca_pem))
    node_client = connect(await node_token(connect, cp.join_token, "n1", tmp_path / "n1"))
    serving = await ensure_serving(node_client, "n1", tmp_path / "n1")
    await node_client.close()
    server = AgentHttpServer(AgentStub(created, pod_port), "127.0.0.1", 0, serving=serving)
    await server.start()
    agent_port = server.port
    await client.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}, raw=True)
    node = await client.get("nodes", "n1", raw=True)
    node["status"] = {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                      "daemonEndpoints": {"kubeletEndpoint": {"Port": agent_port}},
                      "conditions": [{"type": "Ready", "status": "True"}]}
    await client.update_status(node, raw=True)
    yield {"pod": await client.get("pods", "m-0", NS), "port": agent_port}
    await server.stop()
    await pod_runner.cleanup()


async def test_resource_gpu_and_workload_metrics(client: Client, agent: dict[str, Any]) -> None:
    metrics = ClusterMetrics(client)
    try:
        cpu = await metrics.resource(NS, "app=m", "cpu")
        assert cpu["m-0"].value == 250
        gpu = await metrics.pods(NS, [agent["pod"]], "gpu_utilization")
        assert gpu["m-0"].value == 70_000  # 70 (percent), in milli-units
        inflight = await metrics.pods(NS, [agent["pod"]], "model_requests_in_flight")
        assert inflight["m-0"].value == 3_000
        queue = await metrics.pods(NS, [agent["pod"]], "model_queue_length")
        assert queue["m-0"].value == 7_000
        assert await metrics.pods(NS, [agent["pod"]], "not_exposed") == {}
    finally:
        await metrics.close()


async def test_workload_metrics_need_the_api_servers_token(cp: ControlPlane, client: Client,
                                                          agent: dict[str, Any]) -> None:
    """The agent answers its workload metrics to the API server only: straight from the
    agent (no token, or a wrong one) they are refused; through nodes/n1/proxy they come back."""
    async with httpx.AsyncClient(verify=False) as http:
        base = f"https://127.0.0.1:{agent['port']}"
        assert (await http.get(f"{base}/stats/workload")).status_code == 401
        assert (await http.get(f"{base}/stats/workload",
                               headers={"authorization": "Bearer not-the-token"})).status_code == 401
        assert (await http.get(f"{base}/healthz")).text == "ok"
    via_api = await client.raw_request("GET", "/api/v1/nodes/n1/proxy/stats/workload", params={"namespace": NS})
    assert [p["name"] for p in json.loads(via_api.body)["pods"]] == ["m-0"]

    # Were the API server to show another node's token, the agent would refuse it, and the
    # HPA reports the metric as failed rather than as missing.
    assert cp.node_proxy is not None
    real = cp.node_proxy.node_headers
    cp.node_proxy.node_headers = lambda node: real("n2")
    metrics = ClusterMetrics(client)
    try:
        with pytest.raises(Unauthorized):
            await client.raw_request("GET", "/api/v1/nodes/n1/proxy/stats/workload")
        with pytest.raises(MetricsError, match="unable to get model_requests_in_flight from node n1"):
            await metrics.pods(NS, [agent["pod"]], "model_requests_in_flight")
    finally:
        cp.node_proxy.node_headers = real
        await metrics.close()


async def test_request_rate_from_the_gateway(client: Client) -> None:
    gw = Gateway(client, port=0, clock=FakeClock())  # a still clock: the rate is exact
    await gw.start()
    metrics = ClusterMetrics(client, gateway_url=gw.url)
    try:
        await client.create({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web", "namespace": NS},
                             "subsets": [{"addresses": [{"ip": "127.0.0.1", "targetRef": {
                                 "kind": "Pod", "namespace": NS, "name": n}} for n in ("web-0", "web-1")],
                                 "ports": [{"port": 1}]}]}, NS, raw=True)
        await eventually(lambda: f"{NS}/web" in gw.routes and len(gw.routes[f"{NS}/web"].endpoints(None)) == 2)
        for _ in range(3):
            gw.stats.finished(f"{NS}/web", f"{NS}/web-0", gw.stats.started(f"{NS}/web", f"{NS}/web-0"), False)
        values = await metrics.pods(NS, [], "requests_per_second")
        assert values["web-0"].value == 3_000  # 3 requests in the first second of its life
        assert values["web-1"].value == 0
    finally:
        await metrics.close()
        await gw.stop()
    no_gateway = ClusterMetrics(client)
    with pytest.raises(Exception, match="gateway"):
        await no_gateway.pods(NS, [], "requests_per_second")
    await no_gateway.close()
