"""Node IPAM as a plain decision: the node, every node and the CIDRs handed out but not yet
seen back in; the compare-and-swap patch, its Event and what to hold as pending out."""

from __future__ import annotations

from typing import Any

from gpufleet.api.k8s import Node
from gpufleet.controllers.nodeipam import decide_cidr

CLUSTER = "10.244.0.0/16"


def node(name: str, cidr: str | None = None, *, rv: str = "7") -> Node:
    body: dict[str, Any] = {"metadata": {"name": name, "resourceVersion": rv}, "spec": {}}
    if cidr:
        body["spec"] = {"podCIDR": cidr, "podCIDRs": [cidr]}
    return Node.from_dict(body)


def test_a_node_gets_the_first_free_cidr_on_its_resource_version():
    n3 = node("n3", rv="42")
    nodes = [node("n1", "10.244.0.0/24"), node("n2", "10.244.2.0/24"), n3]
    actions = decide_cidr("n3", n3, nodes, {}, CLUSTER, 24)
    assert actions.reason == "Assign"
    [patch] = actions.patches
    assert (patch.kind, patch.name, patch.namespace) == (Node, "n3", None)
    assert patch.patch == {"metadata": {"resourceVersion": "42"},
                           "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]}}
    assert [(e.type, e.reason, e.message) for e in actions.events] == [
        ("Normal", "CIDRAssignmentSucceeded", "Node n3 was assigned pod CIDR 10.244.1.0/24")]
    assert actions.memo == {"cidr": "10.244.1.0/24"}


def test_cidrs_handed_out_but_not_seen_back_are_not_handed_out_twice():
    n1, n2 = node("n1"), node("n2")
    # n1 was given 10.244.0.0/24; the informer has not shown it yet.
    pending = {"n1": "10.244.0.0/24"}
    other = decide_cidr("n2", n2, [n1, n2], pending, CLUSTER, 24)
    assert other.memo == {"cidr": "10.244.1.0/24"}
    # n1's own retry (after a Conflict) asks for the same CIDR again.
    again = decide_cidr("n1", n1, [n1, n2], pending, CLUSTER, 24)
    assert again.memo == {"cidr": "10.244.0.0/24"}
    assert again.patches[0].patch["spec"]["podCIDR"] == "10.244.0.0/24"


def test_a_node_with_a_cidr_keeps_it_and_is_no_longer_pending():
    n1 = node("n1", "10.244.5.0/24")
    actions = decide_cidr("n1", n1, [n1], {"n1": "10.244.0.0/24"}, CLUSTER, 24)
    assert actions.empty and actions.reason == "Assigned"
    assert actions.memo == {"cidr": None} and actions.requeue_after is None


def test_a_full_cluster_cidr_says_so_and_looks_again_later():
    nodes = [node("a", "10.244.0.0/31"), node("b", "10.244.0.2/31"), node("c")]
    actions = decide_cidr("c", nodes[2], nodes, {}, "10.244.0.0/30", 31)
    assert actions.reason == "Full" and actions.patches == []
    assert [(e.type, e.reason, e.message) for e in actions.events] == [
        ("Warning", "CIDRNotAvailable", "Node c status is now: CIDRNotAvailable")]
    assert actions.requeue_after == 30.0 and actions.memo == {"cidr": None}
