"""The EndpointSlice controller against a real API server (HTTP): a Service with ready pods
gets its slice, which follows a pod going unready, terminating and deleted, and is deleted by
the garbage collector with its Service."""

from __future__ import annotations

from typing import Any

from ctrl_helpers import NS, eventually, set_pod_status
from test_endpoints import service, web_pod

from gpufleet.api.k8s import EndpointSlice, Pod, Service
from gpufleet.client.api import Client
from gpufleet.controllers.endpointslice import (
    CONTROLLER_NAME,
    MANAGED_BY_LABEL,
    SERVICE_NAME_LABEL,
    decide_endpoint_slices,
)

ENABLED = {"enabled": ("endpointslice", "garbagecollector")}


async def slices(client: Client, name: str) -> list[dict[str, Any]]:
    listed = await client.list("endpointslices", NS, label_selector=f"{SERVICE_NAME_LABEL}={name}", raw=True)
    return listed.items


def summary(items: list[dict[str, Any]]) -> dict[str, tuple[bool, bool, bool]]:
    return {ep["targetRef"]["name"]: (ep["conditions"]["ready"], ep["conditions"]["serving"],
                                      ep["conditions"]["terminating"])
            for s in items for ep in s.get("endpoints") or []}


async def _summary_is(client: Client, name: str, want: dict) -> list[dict[str, Any]] | None:
    items = await slices(client, name)
    return items if len(items) == 1 and summary(items) == want else None


async def test_a_service_s_slice_follows_its_pods_and_goes_with_it(client: Client, controllers) -> None:
    await controllers(**ENABLED)
    for name in ("a", "b"):
        await client.create(web_pod(name))
        await set_pod_status(client, name, phase="Running", ready=True, ip=f"10.0.0.{ord(name) - 96}")
    await client.create(service("web", ports=[{"name": "http", "port": 80, "targetPort": "http"}]))

    items = await eventually(lambda: _summary_is(client, "web", {"a": (True, True, False), "b": (True, True, False)}),
                             what="the slice")
    (es,) = items
    svc = await client.get("services", "web", NS, raw=True)
    assert es["addressType"] == "IPv4" and es["metadata"]["name"].startswith("web-")
    assert es["metadata"]["labels"][MANAGED_BY_LABEL] == CONTROLLER_NAME
    assert es["metadata"]["ownerReferences"][0]["uid"] == svc["metadata"]["uid"]
    assert es["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    a = next(ep for ep in es["endpoints"] if ep["targetRef"]["name"] == "a")
    assert a["addresses"] == ["10.0.0.1"] and a["nodeName"] == "n1"
    # The slice as stored (defaults and all) is what the controller decides on: nothing to write.
    stored = [EndpointSlice.from_dict(s) for s in await slices(client, "web")]
    pods = [await client.get(Pod, n, NS) for n in ("a", "b")]
    assert decide_endpoint_slices(f"{NS}/web", await client.get(Service, "web", NS), pods, stored).reason == "InSync"

    await set_pod_status(client, "b", phase="Running", ready=False)
    await eventually(lambda: _summary_is(client, "web", {"a": (True, True, False), "b": (False, False, False)}),
                     what="b unready")
    # Deleted with a grace period, a pod stays as terminating (serving while still Ready)
    # until its node confirms; then it leaves.
    await client.delete("pods", "a", NS)
    await eventually(lambda: _summary_is(client, "web", {"a": (False, True, True), "b": (False, False, False)}),
                     what="a terminating")
    await client.delete("pods", "a", NS, grace_period_seconds=0)
    await client.delete("pods", "b", NS, grace_period_seconds=0)
    (es,) = await eventually(lambda: _summary_is(client, "web", {}), what="the slice emptied")
    assert es["metadata"]["name"] == items[0]["metadata"]["name"]  # the same slice, kept as a placeholder

    await client.delete("services", "web", NS)
    await eventually(lambda: _none_left(client, "web"), what="the slice garbage-collected")


async def _none_left(client: Client, name: str) -> bool:
    return not await slices(client, name)
