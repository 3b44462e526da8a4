"""Node IPAM: every node gets a pod CIDR of its own, never changed, freed ones reused."""

from __future__ import annotations

from ctrl_helpers import eventually, node

from gpufleet.client.api import Client
from gpufleet.controllers.nodeipam import next_cidr


def test_next_cidr_takes_the_first_free_subnet():
    assert next_cidr("10.244.0.0/16", 24, set()) == "10.244.0.0/24"
    assert next_cidr("10.244.0.0/16", 24, {"10.244.0.0/24", "10.244.2.0/24"}) == "10.244.1.0/24"
    # A taken range that spans several node subnets blocks all of them.
    assert next_cidr("10.244.0.0/16", 24, {"10.244.0.0/23"}) == "10.244.2.0/24"
    assert next_cidr("10.244.0.0/30", 31, {"10.244.0.0/31", "10.244.0.2/31"}) is None


async def _cidr(client: Client, name: str) -> str | None:
    n = await client.get("nodes", name, raw=True)
    return (n.get("spec") or {}).get("podCIDR")


async def test_each_node_gets_its_own_cidr_and_keeps_it(client: Client, controllers) -> None:
    for name in ("n1", "n2", "n3"):
        await client.create(node(name), raw=True)
    await controllers(enabled=("nodeipam",), cluster_cidr="10.99.0.0/16", node_cidr_mask_size=24)
    cidrs = {}
    for name in ("n1", "n2", "n3"):
        cidrs[name] = await eventually(lambda name=name: _cidr(client, name), 10, what=f"{name}'s pod CIDR")
        n = await client.get("nodes", name, raw=True)
        assert n["spec"]["podCIDRs"] == [cidrs[name]]
    assert len(set(cidrs.values())) == 3
    assert all(c.startswith("10.99.") and c.endswith("/24") for c in cidrs.values())

    # A deleted node's CIDR goes to the next node; the others keep theirs.
    await client.delete("nodes", "n2")
    await client.create(node("n4"), raw=True)
    got = await eventually(lambda: _cidr(client, "n4"), 10, what="n4's pod CIDR")
    assert got == cidrs["n2"]
    assert await _cidr(client, "n1") == cidrs["n1"] and await _cidr(client, "n3") == cidrs["n3"]
