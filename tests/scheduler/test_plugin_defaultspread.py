"""DefaultSpread: replicas of a controller spread over nodes (and zones); other pods still
bin-pack, and spreading never brings back a node a filter excluded."""

from __future__ import annotations

import random

from sched_factories import make_node, make_pod, node_info

from gpufleet.api import k8s
from gpufleet.api.gpu import ZONE_LABEL
from gpufleet.scheduler.framework import Code, CycleState, Framework
from gpufleet.scheduler.plugins.defaultspread import DefaultSpread
from gpufleet.scheduler.profile import Profile
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot


def owned(name: str, owner_uid: str = "rs-1", kind: str = "ReplicaSet", **kwargs) -> PodInfo:
    pod = make_pod(name, **kwargs)
    pod.metadata.owner_references = [
        k8s.OwnerReference.model_validate(
            {"apiVersion": "apps/v1", "kind": kind, "name": "web", "uid": owner_uid, "controller": True}
        )
    ]
    return PodInfo(pod)


def place_all(pods: list[PodInfo], snapshot: Snapshot) -> list[str]:
    fw = Framework(Profile(), rng=random.Random(0))
    placed = []
    for p in pods:
        result = fw.schedule(p, snapshot)
        assert hasattr(result, "node"), result
        snapshot.add_pod(p, result.node, result.gpu_indices)
        placed.append(result.node)
    return placed


def test_owner_uid_only_for_replica_controllers():
    assert owned("a").spread_owner == "rs-1"
    assert owned("b", kind="StatefulSet").spread_owner == "rs-1"
    assert owned("c", kind="ReplicationController").spread_owner == "rs-1"
    assert owned("d", kind="Job").spread_owner == ""
    assert PodInfo(make_pod("e")).spread_owner == ""


def test_node_info_counts_pods_per_owner_through_add_remove_and_clone():
    n = NodeInfo(make_node("a"))
    first, second = owned("r1"), owned("r2")
    n.add_pod(first)
    n.add_pod(second)
    n.add_pod(PodInfo(make_pod("bare")))
    assert n.owner_pods == {"rs-1": 2}
    copy = n.clone()
    n.remove_pod(first)
    assert n.owner_pods == {"rs-1": 1}
    assert copy.owner_pods == {"rs-1": 2}
    n.remove_pod(second)
    assert n.owner_pods == {}


def test_three_replicas_land_on_three_nodes():
    snapshot = Snapshot([node_info(make_node(f"n{i}", gpus=8)) for i in range(3)])
    nodes = place_all([owned(f"r{i}", gpus=1) for i in range(3)], snapshot)
    assert len(set(nodes)) == 3


def test_replicas_spread_without_gpus_too():
    snapshot = Snapshot([node_info(make_node(f"n{i}")) for i in range(3)])
    nodes = place_all([owned(f"r{i}") for i in range(3)], snapshot)
    assert len(set(nodes)) == 3


def test_bare_pods_still_bin_pack():
    snapshot = Snapshot([node_info(make_node(f"n{i}", gpus=8)) for i in range(3)])
    nodes = place_all([PodInfo(make_pod(f"p{i}", gpus=1)) for i in range(3)], snapshot)
    assert len(set(nodes)) == 1


def test_jobs_are_not_spread():
    snapshot = Snapshot([node_info(make_node(f"n{i}", gpus=8)) for i in range(3)])
    nodes = place_all([owned(f"j{i}", owner_uid="job-1", kind="Job", gpus=1) for i in range(3)], snapshot)
    assert len(set(nodes)) == 1


def test_different_owners_do_not_repel_each_other():
    n = node_info(make_node("a"), owned("other", owner_uid="rs-2"))
    empty = node_info(make_node("b"))
    assert DefaultSpread().pre_score(CycleState(), owned("r"), [n, empty]).code is Code.SKIP


def test_spreading_does_not_override_a_filter():
    # Only "busy" has a replica, and only "busy" fits the 4-GPU pod: it must go there.
    busy = node_info(make_node("busy", gpus=8), owned("r0", gpus=2, node_name="busy", gpu_indices=(0, 1)))
    small = [node_info(make_node(f"small{i}", gpus=2)) for i in range(2)]
    nodes = place_all([owned("r1", gpus=4)], Snapshot([busy, *small]))
    assert nodes == ["busy"]


def test_spreading_is_limited_by_capacity():
    snapshot = Snapshot([node_info(make_node(f"n{i}", gpus=2)) for i in range(2)])
    nodes = place_all([owned(f"r{i}", gpus=1) for i in range(4)], snapshot)
    assert sorted(nodes) == ["n0", "n0", "n1", "n1"]


def test_zones_count_for_more_than_nodes():
    a1 = node_info(make_node("a1", labels={ZONE_LABEL: "a"}), owned("r0", node_name="a1"))
    a2 = node_info(make_node("a2", labels={ZONE_LABEL: "a"}))
    b1 = node_info(make_node("b1", labels={ZONE_LABEL: "b"}))
    plugin = DefaultSpread()
    state = CycleState()
    pod = owned("r1")
    assert plugin.pre_score(state, pod, [a1, a2, b1]).is_success
    scores = plugin.score_nodes(state, pod, [a1, a2, b1])
    assert scores[2] > scores[1] > scores[0]
    assert scores == [0, 33, 100]
