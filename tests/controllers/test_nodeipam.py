"""Node IPAM: every node gets a pod CIDR of its own, never changed, freed ones reused."""

from __future__ import annotations

import ipaddress

from ctrl_helpers import eventually, node
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.client.api import Client
from gpufleet.controllers.nodeipam import next_cidr


def test_next_cidr_takes_the_first_free_subnet():
    assert next_cidr("10.244.0.0/16", 24, set()) == "10.244.0.0/24"
    assert next_cidr("10.244.0.0/16", 24, {"10.244.0.0/24", "10.244.2.0/24"}) == "10.244.1.0/24"
    # A taken range that spans several node subnets blocks all of them.
    assert next_cidr("10.244.0.0/16", 24, {"10.244.0.0/23"}) == "10.244.2.0/24"
    assert next_cidr("10.244.0.0/30", 31, {"10.244.0.0/31", "10.244.0.2/31"}) is None
    # Ranges around the cluster CIDR, of the other IP version, or not CIDRs at all.
    assert next_cidr("10.244.0.0/16", 24, {"10.0.0.0/8"}) is None
    assert next_cidr("10.244.0.0/16", 24, {"10.243.255.0/24", "fd00::/64", "junk"}) == "10.244.0.0/24"
    assert next_cidr("10.244.0.0/16", 24, {f"10.244.{i}.0/24" for i in range(255)}) == "10.244.255.0/24"


_TAKEN = st.sets(st.tuples(st.integers(0, 255), st.integers(22, 32)).map(
    lambda t: str(ipaddress.ip_network((0x0AF40000 + (t[0] << 4), t[1]), strict=False))), max_size=12)


@settings(max_examples=100, deadline=None)
@given(taken=_TAKEN)
def test_next_cidr_is_the_first_subnet_overlapping_none(taken: set[str]) -> None:
    used = [ipaddress.ip_network(t) for t in taken]
    free = [s for s in ipaddress.ip_network("10.244.0.0/22").subnets(new_prefix=28)
            if not any(s.overlaps(u) for u in used)]
    assert next_cidr("10.244.0.0/22", 28, taken) == (str(free[0]) if free else None)


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


def test_only_updates_of_a_node_without_a_cidr_wake_the_allocator():
    from gpufleet.api.k8s import Node
    from gpufleet.controllers.nodeipam import NodeIpamController

    bare = Node.model_validate({"metadata": {"name": "n1"}, "spec": {}})
    assigned = Node.model_validate({"metadata": {"name": "n1"},
                                    "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]}})
    allocator = NodeIpamController.__new__(NodeIpamController)
    allocator._waiting_full = set()
    assert allocator.update_matters(bare, bare)
    assert not allocator.update_matters(bare, assigned)
    assert not allocator.update_matters(assigned, assigned)
    # A node that found the cluster CIDR full is looked at again on its retry, not at each
    # of its heartbeats (each look reads every node).
    allocator._waiting_full.add("n1")
    assert not allocator.update_matters(bare, bare)


async def test_a_node_waiting_for_a_full_cluster_cidr_gets_the_cidr_a_deleted_node_frees(
        client: Client, controllers) -> None:
    for name in ("n1", "n2"):
        await client.create(node(name), raw=True)
    await controllers(enabled=("nodeipam",), cluster_cidr="10.99.0.0/24", node_cidr_mask_size=25)
    for name in ("n1", "n2"):
        await eventually(lambda name=name: _cidr(client, name), 10, what=f"{name}'s pod CIDR")
    await client.create(node("n3"), raw=True)

    async def full_event():
        return [e for e in await client.list("events", "default")
                if e.reason == "CIDRNotAvailable" and e.involved_object.name == "n3"]
    await eventually(full_event, 10, what="n3's CIDRNotAvailable Event")
    assert await _cidr(client, "n3") is None
    freed = await _cidr(client, "n1")
    await client.delete("nodes", "n1")
    # At once, not at the next retry of a full range (30 s).
    assert await eventually(lambda: _cidr(client, "n3"), 5, what="n3's pod CIDR") == freed
