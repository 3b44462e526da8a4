"""The default/kubernetes Service and its Endpoints, kept by every API server of a store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from apiserver_helpers import Api

from gpufleet.apiserver.kubernetesservice import (
    ADDRESS_ANNOTATION,
    PORT_ANNOTATION,
    KubernetesService,
    live_endpoints,
)
from gpufleet.apiserver.server import ApiServer
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.store.base import open_store
from gpufleet.utils.clock import FakeClock, rfc3339

SERVICE = "/api/v1/namespaces/default/services/kubernetes"
ENDPOINTS = "/api/v1/namespaces/default/endpoints/kubernetes"


def lease(address: str, port: int, renewed: float, duration: int = 15) -> dict[str, Any]:
    return {"metadata": {"annotations": {ADDRESS_ANNOTATION: address, PORT_ANNOTATION: str(port)}},
            "spec": {"renewTime": rfc3339(renewed, micro=True), "leaseDurationSeconds": duration}}


def test_endpoints_list_the_servers_whose_lease_is_live() -> None:
    now = 1_800_000_000.0
    leases = [lease("10.0.0.2", 6443, now - 5), lease("10.0.0.1", 6443, now), lease("10.0.0.3", 6443, now - 16),
              lease("10.0.0.4", 7443, now - 1)]
    assert live_endpoints(leases, now) == [
        {"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}], "ports": [{"name": "https", "port": 6443,
                                                                        "protocol": "TCP"}]},
        {"addresses": [{"ip": "10.0.0.4"}], "ports": [{"name": "https", "port": 7443, "protocol": "TCP"}]},
    ]
    assert live_endpoints([], now) == []


async def test_a_control_plane_publishes_itself(tmp_path: Path) -> None:
    cp = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                      run_controllers=False)
    await cp.start()
    try:
        assert cp.http is not None and cp.client is not None
        svc = await cp.client.get("services", "kubernetes", "default", raw=True)
        assert svc["metadata"]["labels"] == {"component": "apiserver", "provider": "kubernetes"}
        assert svc["spec"]["clusterIP"] == "10.96.0.1" and svc["spec"]["type"] == "ClusterIP"
        assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "protocol": "TCP",
                                         "targetPort": cp.http.port}]
        ep = await cp.client.get("endpoints", "kubernetes", "default", raw=True)
        assert ep["subsets"] == [{"addresses": [{"ip": "127.0.0.1"}],
                                  "ports": [{"name": "https", "port": cp.http.port, "protocol": "TCP"}]}]
    finally:
        await cp.stop()


@pytest.fixture
async def shared() -> AsyncIterator[tuple[Api, FakeClock]]:
    """One store and API server standing in for two servers of one control plane."""
    clock = FakeClock(1_800_000_000.0)
    store = open_store("sqlite:///:memory:", clock=clock)
    await store.start()
    server = ApiServer(store, clock=clock)
    await server.start()
    yield Api(server), clock
    await store.close()


async def addresses(api: Api) -> list[str]:
    ep = await api.must_get(ENDPOINTS)
    return [a["ip"] for s in ep.get("subsets") or [] for a in s["addresses"]]


async def test_servers_come_and_go_from_the_endpoints(shared: tuple[Api, FakeClock]) -> None:
    api, clock = shared
    a = KubernetesService(api.server, "10.0.0.1", 6443, clock=clock)
    b = KubernetesService(api.server, "10.0.0.2", 6443, clock=clock)
    c = KubernetesService(api.server, "10.0.0.3", 6443, clock=clock)
    for s in (a, b, c):
        await s.reconcile()
    assert await addresses(api) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    # b stops cleanly: out at once.
    await b.stop()
    assert await addresses(api) == ["10.0.0.1", "10.0.0.3"]
    # c dies: out once its lease has run out and another server looks, its lease removed.
    clock.advance(10)
    await a.reconcile()
    assert await addresses(api) == ["10.0.0.1", "10.0.0.3"]
    clock.advance(10)
    await a.reconcile()
    assert await addresses(api) == ["10.0.0.1"]
    leases = (await api.must_get("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"))["items"]
    assert [x["metadata"]["name"] for x in leases] == ["gpufleet-apiserver-10-0-0-1-6443"]


async def test_the_service_ports_are_put_back(shared: tuple[Api, FakeClock]) -> None:
    api, clock = shared
    s = KubernetesService(api.server, "10.0.0.1", 6443, clock=clock)
    await s.reconcile()
    svc = await api.must_get(SERVICE)
    svc["spec"]["ports"] = [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
    svc["metadata"]["labels"]["mine"] = "kept"
    r = await api.put(SERVICE, svc)
    assert r.status == 200, r
    await s.reconcile()
    svc = await api.must_get(SERVICE)
    assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]
    assert svc["metadata"]["labels"]["mine"] == "kept"
