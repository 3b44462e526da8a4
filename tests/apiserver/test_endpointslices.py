"""discovery.k8s.io/v1 EndpointSlice through the API server: listed in discovery, stored,
validated with Kubernetes' messages (the field and what it must be), addressType immutable,
and kubectl's table columns."""

from __future__ import annotations

from typing import Any

import pytest
from apiserver_helpers import TABLE_ACCEPT, Api, assert_status

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

SLICES = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"


def slice_(name: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": name},
            "addressType": "IPv4", **fields}


def causes(reply: Any) -> dict[str, str]:
    return {c["field"]: c["message"] for c in reply.json["details"]["causes"]}


async def test_endpoint_slices_are_served_and_print_as_kubectl_shows(api: Api) -> None:
    resources = (await api.get("/apis/discovery.k8s.io/v1")).json["resources"]
    assert [(r["name"], r["kind"], r["namespaced"]) for r in resources] == [
        ("endpointslices", "EndpointSlice", True)]
    endpoints = [{"addresses": [f"10.0.0.{i}"], "conditions": {"ready": True}} for i in range(1, 5)]
    await api.post(SLICES, slice_("web-abc", endpoints=endpoints, ports=[
        {"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "metrics", "port": 9090, "protocol": "TCP"}]))
    await api.post(SLICES, slice_("empty"))
    table = (await api.get(SLICES, accept=TABLE_ACCEPT)).json
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "AddressType", "Ports", "Endpoints", "Age"]
    rows = {r["cells"][0]: r["cells"][1:4] for r in table["rows"]}
    assert rows == {"web-abc": ["IPv4", "8080,9090", "10.0.0.1,10.0.0.2,10.0.0.3 + 1 more..."],
                    "empty": ["IPv4", "<unset>", "<unset>"]}
    stored = (await api.get(f"{SLICES}/web-abc")).json
    r = await api.put(f"{SLICES}/web-abc", {**stored, "addressType": "IPv6"})
    assert_status(r, 422, "Invalid", fields=["addressType"])
    assert "field is immutable" in causes(r)["addressType"]


async def test_endpoint_slice_validation_names_the_field(api: Api) -> None:
    r = await api.post(SLICES, slice_("bad", addressType="IPv5"))
    assert_status(r, 422, "Invalid")
    assert causes(r) == {"addressType": 'Unsupported value: "IPv5": supported values: "FQDN", "IPv4", "IPv6"'}
    r = await api.post(SLICES, slice_("bad", endpoints=[
        {"addresses": ["10.0.0.300"], "hostname": "Not_A_Label"}, {"addresses": []}],
        ports=[{"name": "http", "port": 70000, "protocol": "TCP"}, {"name": "http", "protocol": "ICMP"}]))
    assert_status(r, 422, "Invalid")
    got = causes(r)
    assert got["endpoints[0].addresses[0]"] == 'Invalid value: "10.0.0.300": must be a valid IPv4 address'
    assert got["endpoints[0].hostname"].startswith('Invalid value: "Not_A_Label": a lowercase RFC 1123 label')
    assert got["endpoints[1].addresses"] == "Required value: must contain at least 1 address"
    assert got["ports[0].port"].startswith("Invalid value: 70000: must be between 1 and 65535")
    assert got["ports[1].name"] == 'Duplicate value: "http"'
    assert got["ports[1].protocol"] == 'Unsupported value: "ICMP": supported values: "SCTP", "TCP", "UDP"'
