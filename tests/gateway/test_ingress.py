"""Ingress through the gateway: the matching rules (host exact/wildcard, Prefix by path
element, Exact, precedence, defaultBackend) as pure functions, then real HTTP through a
gateway on a real control plane: host and path rules to two Services, Ingresses of another
class ignored, status.loadBalancer set to the gateway's address."""

from __future__ import annotations

from typing import Any

import aiohttp
from test_gateway import Backend, backends, client, cp, gateway, http, publish, until  # noqa: F401

from gpufleet.api.k8s import Ingress
from gpufleet.client.api import Client
from gpufleet.gateway import Gateway
from gpufleet.gateway.ingress import host_rank, match, path_rank

NS = "default"


def path(p: str, ptype: str, svc: str, port: Any = 80) -> dict[str, Any]:
    key = "number" if isinstance(port, int) else "name"
    return {"path": p, "pathType": ptype, "backend": {"service": {"name": svc, "port": {key: port}}}}


def ing(name: str, rules: list[dict[str, Any]], default: str | None = None, klass: str | None = "gpufleet",
        created: str = "2024-01-01T00:00:00Z") -> dict[str, Any]:
    spec: dict[str, Any] = {"rules": rules}
    if klass:
        spec["ingressClassName"] = klass
    if default:
        spec["defaultBackend"] = {"service": {"name": default, "port": {"number": 80}}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": NS, "creationTimestamp": created}, "spec": spec}


def test_host_and_path_rules_as_the_ingress_api_defines_them() -> None:
    assert host_rank("a.example.com", "a.example.com") == 2
    assert host_rank("*.example.com", "a.example.com") == 1
    assert host_rank("*.example.com", "a.b.example.com") == -1
    assert host_rank("*.example.com", "example.com") == -1
    assert host_rank(None, "anything") == 0
    assert path_rank("Prefix", "/foo", "/foo/bar") == 4
    assert path_rank("Prefix", "/foo/", "/foo") == 4
    assert path_rank("Prefix", "/foo", "/foobar") == -1
    assert path_rank("Prefix", "/", "/x") == 0
    assert path_rank("ImplementationSpecific", "/foo", "/foo/x") == 4
    assert path_rank("Exact", "/foo", "/foo/") == -1
    assert path_rank("Exact", "/foo", "/foo") == 4

    served = [Ingress.model_validate(i) for i in (
        ing("a", [{"host": "shop.example.com", "http": {"paths": [path("/", "Prefix", "front"),
                                                                  path("/api", "Prefix", "api", "http"),
                                                                  path("/api/v1", "Exact", "v1")]}},
                  {"host": "*.example.com", "http": {"paths": [path("/", "Prefix", "wild")]}}]),
        ing("b", [{"http": {"paths": [path("/", "Prefix", "anyhost")]}}], default="fallback",
            created="2024-01-02T00:00:00Z"),
        ing("c", [{"host": "only.example.org", "http": {"paths": [path("/x", "Exact", "x")]}}],
            default="late-fallback", created="2024-01-03T00:00:00Z"),
    )]

    def to(host: str, p: str) -> tuple[str, str | None, bool] | None:
        m = match(served, host, p)
        return (m.backend.service, m.backend.port, m.host_specific) if m else None

    assert to("shop.example.com", "/cart") == ("front", "80", True)
    assert to("shop.example.com", "/api/items") == ("api", "http", True)
    assert to("shop.example.com", "/api/v1") == ("v1", "80", True)
    assert to("shop.example.com", "/api/v1/x") == ("api", "http", True)
    assert to("SHOP.example.com", "/") == ("front", "80", True)
    assert to("blog.example.com", "/") == ("wild", "80", True)
    assert to("other.org", "/z") == ("anyhost", "80", False)
    # only.example.org's one rule does not match /y: the host-less rule does.
    assert to("only.example.org", "/y") == ("anyhost", "80", False)
    without_hostless = [i for i in served if i.metadata.name != "b"]
    m = match(without_hostless, "nowhere.org", "/")
    assert m is not None and m.backend.service == "late-fallback"
    assert match([served[0]], "nowhere.org", "/") is None


async def get(http_: aiohttp.ClientSession, gw: Gateway, host: str, p: str) -> tuple[int, Any]:
    async with http_.get(f"{gw.url}{p}", headers={"Host": host}) as r:
        return r.status, (await r.json(content_type=None))


async def test_ingress_routes_host_and_path_to_two_services_and_reports_its_address(
        client: Client, gateway: Gateway, http: aiohttp.ClientSession,  # noqa: F811 (test_gateway's fixtures)
        backends: list[Backend]) -> None:  # noqa: F811
    await publish(client, "front", [("pod-0", backends[0].port)])
    await publish(client, "api", [("pod-1", backends[1].port)])
    await client.create(ing("site", [
        {"host": "shop.example.com", "http": {"paths": [path("/", "Prefix", "front", "http"),
                                                        path("/api", "Prefix", "api")]}}], klass=None), NS, raw=True)
    await client.create(ing("theirs", [{"host": "x.example.com", "http": {"paths": [path("/", "Prefix", "front")]}}],
                            klass="nginx"), NS, raw=True)

    async def routed() -> bool:
        return (await get(http, gateway, "shop.example.com", "/api/items?q=1"))[0] == 200

    await until(routed)
    status, body = await get(http, gateway, "shop.example.com:8080", "/api/items?q=1")
    assert (status, body["pod"], body["path"]) == (200, "pod-1", "/api/items?q=1")
    status, body = await get(http, gateway, "shop.example.com", "/cart")
    assert (status, body["pod"], body["path"]) == (200, "pod-0", "/cart")
    # The gateway's own paths stay its own for other hosts; another class's Ingress is ignored.
    assert (await get(http, gateway, "x.example.com", "/"))[0] == 404
    status, body = await get(http, gateway, "127.0.0.1", "/services/default/api/hello")
    assert (status, body["pod"]) == (200, "pod-1")

    async def address() -> Any:
        got = await client.get("Ingress", "site", NS, raw=True)
        return (got.get("status") or {}).get("loadBalancer")

    assert await until(address) == {"ingress": [{"ip": "127.0.0.1", "ports": [{"port": gateway.port,
                                                                                 "protocol": "TCP"}]}]}
    theirs = await client.get("Ingress", "theirs", NS, raw=True)
    assert not (theirs.get("status") or {}).get("loadBalancer")
