"""Gang placement on a snapshot: all members or none, and as few nodes and racks as it can."""

from __future__ import annotations

from sched_factories import make_node, make_pod

from gpufleet.api.gpu import RACK_LABEL
from gpufleet.scheduler.framework import Framework
from gpufleet.scheduler.gang import GangState, GangWait, capacity, place_gang, plan_nodes
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot

GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


def gang(name: str, count: int, gpus: int, **kwargs) -> list[PodInfo]:
    return [
        PodInfo(
            make_pod(f"{name}-{i}", cpu="1", memory="1Gi", gpus=gpus, labels={GROUP_LABEL: name}, **kwargs)
        )
        for i in range(count)
    ]


def cluster(*specs: tuple[str, int, str | None]) -> Snapshot:
    """(name, GPUs, rack) per node."""
    return Snapshot(
        [
            NodeInfo(
                make_node(
                    name, cpu="64", memory="512Gi", gpus=gpus, labels={RACK_LABEL: rack} if rack else None
                )
            )
            for name, gpus, rack in specs
        ]
    )


def used_gpus(snapshot: Snapshot) -> dict[str, int]:
    return {n.name: n.req_gpus for n in snapshot if n.req_gpus}


def test_a_gang_that_does_not_fit_whole_leaves_nothing_behind():
    snapshot = cluster(*[(f"n{i}", 8, None) for i in range(4)])
    placement = place_gang(Framework(), snapshot, "default/big", gang("big", 5, 8), min_member=5)
    assert not placement.ok
    assert (placement.fits, placement.total) == (4, 5)
    assert used_gpus(snapshot) == {}
    assert placement.message().startswith(
        "pod group default/big: 4 of 5 members fit, needs minMember 5; 0/4 nodes"
    )
    assert "Insufficient nvidia.com/gpu" in placement.message()


def test_min_member_is_enough():
    snapshot = cluster(*[(f"n{i}", 8, None) for i in range(4)])
    placement = place_gang(Framework(), snapshot, "default/big", gang("big", 5, 8), min_member=4)
    assert placement.ok
    assert len(placement.placed) == 4 and len(placement.failed) == 1
    assert used_gpus(snapshot) == {f"n{i}": 8 for i in range(4)}


def test_members_already_bound_count_toward_min_member():
    snapshot = cluster(("n0", 8, None), ("n1", 8, None))
    bound = gang("late", 3, 8)[:1]
    snapshot.add_pod(bound[0], "n0")
    placement = place_gang(
        Framework(),
        snapshot,
        "default/late",
        gang("late", 3, 8)[1:2],
        min_member=2,
        bound=[snapshot.get("n0").pods["default/late-0"]],
    )
    assert placement.ok and placement.fits == 2
    assert used_gpus(snapshot) == {"n0": 8, "n1": 8}


def test_two_gangs_of_three_quarters_never_split_the_cluster():
    snapshot = cluster(*[(f"n{i}", 8, None) for i in range(4)])
    framework = Framework()
    first = place_gang(framework, snapshot, "default/a", gang("a", 6, 4), min_member=6)
    assert first.ok
    second = place_gang(framework, snapshot, "default/b", gang("b", 6, 4), min_member=6)
    assert not second.ok
    assert (second.fits, second.total) == (2, 6)
    # Only gang a holds GPUs: none of b's members stayed on the snapshot.
    holders = {p.pod_group for n in snapshot for p in n.pods.values()}
    assert holders == {"default/a"}
    assert sum(used_gpus(snapshot).values()) == 24


def test_a_gang_fills_as_few_nodes_as_it_can():
    # Two half-used nodes and two empty ones: 8 one-GPU members fit on one empty node.
    snapshot = cluster(*[(f"n{i}", 8, None) for i in range(4)])
    for i in (0, 1):
        snapshot.add_pod(PodInfo(make_pod(f"x{i}", gpus=4)), f"n{i}", (0, 1, 2, 3))
    placement = place_gang(Framework(), snapshot, "default/g", gang("g", 8, 1), min_member=8)
    assert placement.ok
    assert len(placement.nodes_used()) == 1
    assert placement.nodes_used() <= {"n2", "n3"}
    # 12 one-GPU members: one whole node plus the best fitting rest (a half-used node).
    snapshot = cluster(("e0", 8, None), ("e1", 8, None), ("h0", 8, None))
    snapshot.add_pod(PodInfo(make_pod("x", gpus=4)), "h0", (0, 1, 2, 3))
    placement = place_gang(Framework(), snapshot, "default/g", gang("g", 12, 1), min_member=12)
    assert placement.ok
    assert len(placement.nodes_used()) == 2
    assert "h0" in placement.nodes_used()


def test_a_gang_stays_in_one_rack_when_one_can_hold_it():
    # r-big has 4 free nodes, r-small 2: a 4-node gang goes to r-big, a 2-node gang to the
    # smallest rack that holds it (r-small), keeping the big rack whole.
    specs = [(f"big-{i}", 8, "r-big") for i in range(4)] + [(f"small-{i}", 8, "r-small") for i in range(2)]
    specs += [(f"odd-{i}", 8, f"r-odd-{i}") for i in range(3)]
    snapshot = cluster(*specs)
    framework = Framework()
    four = place_gang(framework, snapshot, "default/four", gang("four", 4, 8), min_member=4)
    assert four.ok and {n.split("-")[0] for n in four.nodes_used()} == {"big"}
    two = place_gang(framework, snapshot, "default/two", gang("two", 2, 8), min_member=2)
    assert two.ok and {n.split("-")[0] for n in two.nodes_used()} == {"small"}


def test_a_gang_larger_than_any_rack_uses_the_fewest_racks():
    specs = [(f"a-{i}", 8, "r-a") for i in range(3)]
    specs += [(f"b-{i}", 8, "r-b") for i in range(1)]
    specs += [(f"c-{i}", 8, "r-c") for i in range(2)]
    snapshot = cluster(*specs)
    placement = place_gang(Framework(), snapshot, "default/g", gang("g", 5, 8), min_member=5)
    assert placement.ok
    racks = {snapshot.get(n).labels[RACK_LABEL] for n in placement.nodes_used()}
    assert racks == {"r-a", "r-c"}


def test_members_that_need_other_nodes_fall_back_to_a_normal_cycle():
    snapshot = cluster(("gpu", 8, None), ("cpu", 0, None))
    members = gang("mixed", 2, 4) + [
        PodInfo(make_pod("mixed-x", cpu="1", memory="1Gi", labels={GROUP_LABEL: "mixed"}))
    ]
    placement = place_gang(Framework(), snapshot, "default/mixed", members, min_member=3)
    assert placement.ok and placement.fits == 3
    assert used_gpus(snapshot) == {"gpu": 8}


def test_plan_prefers_nodes_the_gang_already_runs_on():
    nodes = [NodeInfo(make_node(f"n{i}", gpus=8)) for i in range(3)]
    shape = gang("g", 1, 2)[0]
    assert capacity(nodes[0], shape) == 4
    assert plan_nodes(nodes, shape, 2, anchors=["n2"])[0] == "n2"


# -- GangState: members and waits between cycles ---------------------------------------------


def test_gang_state_tracks_members_by_group_until_the_last_one_goes() -> None:
    state = GangState()
    a, b = make_pod("a", labels={GROUP_LABEL: "mlp"}), make_pod("b", labels={GROUP_LABEL: "mlp"})
    assert state.track("uid-a", a) == "default/mlp"
    assert state.track("uid-b", b) == "default/mlp"
    assert state.track("uid-c", make_pod("c")) is None
    assert sorted(state.members("default/mlp")) == ["uid-a", "uid-b"]
    state.unsuccessful("default/mlp", 60, monotonic=1.0, wall=1000.0)
    state.untrack("uid-a", a)
    assert state.waiting and list(state.members("default/mlp")) == ["uid-b"]
    # The last member gone: the group stops waiting.
    state.untrack("uid-b", b)
    assert state.members("default/mlp") == {} and not state.waiting


def test_gang_state_starts_a_wait_and_starts_it_over_past_the_timeout() -> None:
    state = GangState()
    assert state.unsuccessful("ns/g", 10, monotonic=5.0, wall=1000.0) == GangWait(started=1000.0)
    assert state.unsuccessful("ns/g", 10, monotonic=14.0, wall=1009.0) == GangWait()
    assert state.overdue(14.0, lambda group: 10) == []
    assert state.overdue(15.0, lambda group: 10) == ["ns/g"]
    assert state.overdue(15.0, lambda group: None) == []  # no such PodGroup
    assert state.unsuccessful("ns/g", 10, monotonic=15.0, wall=1010.0) == GangWait(started=1010.0, timed_out=True)
    state.placed("ns/g")
    assert not state.waiting
    assert state.unsuccessful("ns/g", 10, monotonic=30.0, wall=1025.0) == GangWait(started=1025.0)
