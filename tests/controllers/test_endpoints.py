from __future__ import annotations

import json
from typing import Any

from ctrl_helpers import NS, eventually, set_pod_status

from gpufleet.client.api import Client
from gpufleet.client.errors import NotFound

EP = {"enabled": ("endpoints",)}


def web_pod(name: str, port_name: str | None = "http", port: int = 8080, **meta: Any) -> dict[str, Any]:
    ports = [{"containerPort": port, **({"name": port_name} if port_name else {})},
             {"containerPort": 9090, "name": "metrics"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {"app": "web"}, **meta},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "web:v1", "ports": ports}]}}


def service(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS, "labels": {"tier": "fe"}},
            "spec": {"selector": {"app": "web"}, **spec}}


async def endpoints(client: Client, name: str) -> dict[str, Any] | None:
    try:
        return await client.get("endpoints", name, NS, raw=True)
    except NotFound:
        return None


def summary(ep: dict[str, Any]) -> list[tuple]:
    out = []
    for s in ep.get("subsets") or []:
        out.append((
            sorted(a["targetRef"]["name"] for a in s.get("addresses") or []),
            sorted(a["targetRef"]["name"] for a in s.get("notReadyAddresses") or []),
            sorted((p.get("name"), p["port"]) for p in s.get("ports") or []),
        ))
    return sorted(out)


async def test_ready_and_not_ready_pods_with_named_ports(client: Client, controllers) -> None:
    await controllers(**EP)
    await client.create(web_pod("a"))
    await client.create(web_pod("b", port=8081))
    await client.create(web_pod("c"))  # never gets an IP
    await client.create(web_pod("no-http", port_name=None))
    await client.create(web_pod("hostnet", annotations={"gpufleet.io/host-ports": json.dumps({"http": 31080})}))
    await client.create(web_pod("leaving", finalizers=["test/hold"]))
    await set_pod_status(client, "a", phase="Running", ready=True, ip="10.0.0.1")
    await set_pod_status(client, "b", phase="Running", ready=False, ip="10.0.0.2")
    await set_pod_status(client, "no-http", phase="Running", ready=True, ip="10.0.0.3")
    await set_pod_status(client, "hostnet", phase="Running", ready=True, ip="192.168.1.7")
    await set_pod_status(client, "leaving", phase="Running", ready=True, ip="10.0.0.5")
    await client.delete("pods", "leaving", NS)
    await client.create(service("web", ports=[
        {"name": "http", "port": 80, "targetPort": "http"},
        {"name": "metrics", "port": 9100, "targetPort": 9090, "appProtocol": "http"}]))

    want = sorted([
        (["a"], [], [("http", 8080), ("metrics", 9090)]),
        ([], ["b"], [("http", 8081), ("metrics", 9090)]),
        (["hostnet"], [], [("http", 31080), ("metrics", 9090)]),
        (["no-http"], [], [("metrics", 9090)]),
    ])
    ep = await eventually(lambda: _summary_is(client, "web", want), what="endpoints")
    assert ep["metadata"]["labels"] == {"tier": "fe"}
    address = next(a for s in ep["subsets"] for a in s.get("addresses") or [] if a["targetRef"]["name"] == "a")
    pod_a = await client.get("pods", "a", NS, raw=True)
    assert address == {"ip": "10.0.0.1", "nodeName": "n1", "targetRef": {
        "kind": "Pod", "namespace": NS, "name": "a", "uid": pod_a["metadata"]["uid"]}}
    metrics = next(p for s in ep["subsets"] for p in s["ports"] if p["name"] == "metrics")
    assert metrics == {"name": "metrics", "port": 9090, "protocol": "TCP", "appProtocol": "http"}

    # Readiness moves addresses; a pod that stops matching leaves.
    await set_pod_status(client, "b", phase="Running", ready=True)
    await client.patch("pods", "no-http", {"metadata": {"labels": {"app": "other"}}}, NS)
    want = sorted([
        (["a"], [], [("http", 8080), ("metrics", 9090)]),
        (["b"], [], [("http", 8081), ("metrics", 9090)]),
        (["hostnet"], [], [("http", 31080), ("metrics", 9090)]),
    ])
    await eventually(lambda: _summary_is(client, "web", want))

    await client.delete("services", "web", NS)
    await eventually(lambda: _gone(client, "web"))
    await client.patch("pods", "leaving", {"metadata": {"finalizers": None}}, NS)


async def test_headless_service_without_ports(client: Client, controllers) -> None:
    await controllers(**EP)
    await client.create(web_pod("a"))
    await set_pod_status(client, "a", phase="Running", ready=True, ip="10.0.0.1")
    await client.create(service("db", clusterIP="None"))
    ep = await eventually(lambda: _summary_is(client, "db", [(["a"], [], [])]))
    assert ep["metadata"]["labels"] == {"tier": "fe", "service.kubernetes.io/headless": ""}


async def test_services_without_selector_are_left_alone(client: Client, controllers) -> None:
    await controllers(**EP)
    await client.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext", "namespace": NS},
                         "spec": {"ports": [{"port": 5432}]}})
    manual = {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "ext", "namespace": NS},
              "subsets": [{"addresses": [{"ip": "10.9.9.9"}], "ports": [{"port": 5432}]}]}
    await client.create(manual)
    await client.create(service("web", ports=[{"port": 80}]))
    await eventually(lambda: endpoints(client, "web"))
    ep = await endpoints(client, "ext")
    assert ep["subsets"][0]["addresses"] == [{"ip": "10.9.9.9"}]


async def _summary_is(client: Client, name: str, want: list[tuple]) -> dict[str, Any] | None:
    ep = await endpoints(client, name)
    return ep if ep is not None and summary(ep) == want else None


async def _gone(client: Client, name: str) -> bool:
    return await endpoints(client, name) is None
