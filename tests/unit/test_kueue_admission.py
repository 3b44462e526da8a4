"""Queue admission as a pure function: quota, borrowing and lending in a cohort, fair
sharing, preemption of whole workloads, and the shape check against the nodes."""

from __future__ import annotations

from gpufleet.api.gpu import GPU_RESOURCE as GPU
from gpufleet.queueing.admission import (
    IN_CLUSTER_QUEUE,
    IN_COHORT_RECLAMATION,
    WAIT_INADMISSIBLE,
    WAIT_PREEMPTING,
    WAIT_PRIORITY,
    WAIT_QUEUED,
    WAIT_QUOTA,
    WAIT_SHAPE,
    ClusterQueueInfo,
    FlavorInfo,
    NodeInfo,
    Placement,
    PodSetInfo,
    Quota,
    Quotas,
    ResourceGroupInfo,
    Wait,
    WorkloadInfo,
    schedule,
)

FLAVOR = "default"
FLAVORS = {FLAVOR: FlavorInfo(FLAVOR)}


def cq(name: str, nominal: int, *, cohort: str = "team", borrowing: int | None = None, lending: int | None = None,
       flavors: tuple[str, ...] = (FLAVOR,), **kw) -> ClusterQueueInfo:
    return ClusterQueueInfo(
        name=name,
        groups=[ResourceGroupInfo((GPU,), flavors)],
        quotas={(f, GPU): Quota(nominal, borrowing, lending) for f in flavors},
        cohort=cohort,
        **kw,
    )


def wl(key: str, queue: str, pods: int, gpus: int, *, priority: int = 0, ts: float = 0.0,
       admitted: str | None = None, same_group: bool = False, **kw) -> WorkloadInfo:
    ps = PodSetInfo("main", pods, {GPU: gpus}, same_gpu_group=same_group)
    w = WorkloadInfo(key, queue, [ps], priority=priority, timestamp=ts, **kw)
    if admitted:
        w.admission = {"main": {GPU: admitted}}
        w.unbound = w.unbound or {"main": pods}
    return w


def nodes(*gpus: int, labels: dict[str, str] | None = None, prefix: str = "n") -> list[NodeInfo]:
    return [NodeInfo(f"{prefix}{i}", dict(labels or {}), {"": g}) for i, g in enumerate(gpus)]


def test_a_queue_admits_up_to_its_nominal_quota_alone():
    queues = {"a": cq("a", 8, cohort="")}
    r = schedule(queues, FLAVORS, [wl("ns/w1", "a", 1, 4, ts=1), wl("ns/w2", "a", 1, 4, ts=2),
                                   wl("ns/w3", "a", 1, 4, ts=3)], nodes(4, 4, 4, 4))
    assert set(r.admitted) == {"ns/w1", "ns/w2"}
    assert r.admitted["ns/w1"] == {"main": {GPU: FLAVOR}}
    assert r.waiting["ns/w3"].kind == WAIT_QUOTA
    assert "insufficient unused quota for nvidia.com/gpu in flavor default, 4 more needed" in r.waiting["ns/w3"].message


def test_borrowing_from_an_idle_cohort_member():
    queues = {"a": cq("a", 8), "b": cq("b", 8)}
    work = [wl(f"a/w{i}", "a", 2, 2, ts=i) for i in range(4)]  # 16 GPUs asked, 8 nominal
    r = schedule(queues, FLAVORS, work, nodes(4, 4, 4, 4))
    assert len(r.admitted) == 4
    assert r.borrowing == {"a/w2", "a/w3"}


def test_borrowing_limit_caps_what_a_queue_takes_from_the_cohort():
    queues = {"a": cq("a", 8, borrowing=2), "b": cq("b", 8)}
    work = [wl(f"a/w{i}", "a", 1, 2, ts=i) for i in range(8)]
    r = schedule(queues, FLAVORS, work, nodes(4, 4, 4, 4))
    assert len(r.admitted) == 5  # 8 nominal + 2 borrowed
    assert all(w.kind == WAIT_QUOTA for w in r.waiting.values())


def test_lending_limit_keeps_the_rest_of_the_quota_for_its_owner():
    # b lends only 2 of its 8: a can reach 10, never 16.
    queues = {"a": cq("a", 8), "b": cq("b", 8, lending=2)}
    work = [wl(f"a/w{i}", "a", 1, 2, ts=i) for i in range(8)]
    r = schedule(queues, FLAVORS, work, nodes(4, 4, 4, 4))
    assert len(r.admitted) == 5
    # ...and b gets its 6 guaranteed GPUs at once, no preemption needed.
    admitted = [w for w in work if w.key in r.admitted]
    for w in admitted:
        w.admission = r.admitted[w.key]
        w.unbound = {"main": 1}
    b_work = [wl(f"b/w{i}", "b", 1, 2, ts=10 + i) for i in range(3)]
    r2 = schedule(queues, FLAVORS, admitted + b_work, nodes(4, 4, 4, 4))
    assert set(r2.admitted) == {"b/w0", "b/w1", "b/w2"}
    assert not r2.preempted


def test_lending_limit_in_the_quota_arithmetic():
    a, b = cq("a", 8, lending=4), cq("b", 8, lending=0)
    q = Quotas({"a": a, "b": b})
    fr = (FLAVOR, GPU)
    assert q.available(a, fr, {}) == 8  # 4 guaranteed + 4 of its own lent to the pool
    assert q.available(b, fr, {}) == 12  # b keeps all 8 and may borrow a's 4
    assert q.available(b, fr, {"a": {fr: 6}}) == 8 + 2


def test_fragmentation_does_not_admit_a_pod_that_needs_one_whole_node():
    # 8 free GPUs, 2 on each of four nodes: quota says yes, the shape says no.
    queues = {"a": cq("a", 16, cohort="")}
    r = schedule(queues, FLAVORS, [wl("ns/big", "a", 1, 8)], nodes(2, 2, 2, 2))
    assert not r.admitted
    wait = r.waiting["ns/big"]
    assert wait.kind == WAIT_SHAPE
    assert "2+2+2+2" in wait.message and "at most 2 together" in wait.message


def test_a_gang_is_admitted_only_when_all_its_pods_fit_at_once():
    queues = {"a": cq("a", 16, cohort="")}
    # Four pods of 3 GPUs need four nodes with 3 free; there are only three.
    r = schedule(queues, FLAVORS, [wl("ns/gang", "a", 4, 3)], nodes(4, 4, 4, 2))
    assert r.waiting["ns/gang"].kind == WAIT_SHAPE
    r = schedule(queues, FLAVORS, [wl("ns/gang", "a", 4, 3)], nodes(4, 4, 4, 4))
    assert "ns/gang" in r.admitted


def test_pods_already_bound_and_admitted_pods_not_yet_bound_take_their_gpus():
    queues = {"a": cq("a", 32, cohort="")}
    fleet = nodes(4, 4)
    fleet[0].used = {"": 4}  # a pod of someone else runs there
    earlier = wl("ns/earlier", "a", 1, 4, admitted=FLAVOR)  # admitted, its pod not bound yet
    r = schedule(queues, FLAVORS, [earlier, wl("ns/next", "a", 1, 4)], fleet)
    assert r.waiting["ns/next"].kind == WAIT_SHAPE


def test_interconnect_group_is_honoured_for_pods_that_ask_for_it():
    queues = {"a": cq("a", 16, cohort="")}
    split = [NodeInfo("n0", {}, {"nvl0": 2, "nvl1": 2})]
    r = schedule(queues, FLAVORS, [wl("ns/one-group", "a", 1, 4, same_group=True)], split)
    assert r.waiting["ns/one-group"].kind == WAIT_SHAPE
    r = schedule(queues, FLAVORS, [wl("ns/any", "a", 1, 4)], split)
    assert "ns/any" in r.admitted


def test_flavors_in_order_and_their_node_labels():
    flavors = {"h100": FlavorInfo("h100", {"gpu": "h100"}), "a100": FlavorInfo("a100", {"gpu": "a100"})}
    queue = ClusterQueueInfo("a", [ResourceGroupInfo((GPU,), ("h100", "a100"))],
                             {("h100", GPU): Quota(4), ("a100", GPU): Quota(8)})
    fleet = nodes(4, labels={"gpu": "h100"}, prefix="h") + nodes(8, labels={"gpu": "a100"}, prefix="a")
    r = schedule({"a": queue}, flavors, [wl("ns/w1", "a", 1, 4, ts=1), wl("ns/w2", "a", 1, 4, ts=2)], fleet)
    assert r.admitted["ns/w1"] == {"main": {GPU: "h100"}}
    assert r.admitted["ns/w2"] == {"main": {GPU: "a100"}}


def test_quota_in_a_flavor_without_nodes_big_enough_falls_to_the_next_flavor():
    flavors = {"small": FlavorInfo("small", {"size": "s"}), "big": FlavorInfo("big", {"size": "b"})}
    queue = ClusterQueueInfo("a", [ResourceGroupInfo((GPU,), ("small", "big"))],
                             {("small", GPU): Quota(8), ("big", GPU): Quota(8)})
    fleet = nodes(2, 2, 2, 2, labels={"size": "s"}, prefix="s") + nodes(8, labels={"size": "b"}, prefix="b")
    r = schedule({"a": queue}, flavors, [wl("ns/w", "a", 1, 8)], fleet)
    assert r.admitted["ns/w"] == {"main": {GPU: "big"}}


def test_reclaim_preempts_the_borrowers_whole_workloads_newest_first():
    queues = {"a": cq("a", 8, reclaim_within_cohort="Any"), "b": cq("b", 8, reclaim_within_cohort="Any")}
    a_work = [wl(f"a/w{i}", "a", 2, 2, admitted=FLAVOR, admitted_at=i) for i in range(3)]  # 12 GPUs
    fleet = nodes(4, 4, 4, 4)
    b_work = [wl("b/w0", "b", 2, 2, ts=10), wl("b/w1", "b", 2, 2, ts=11)]
    r = schedule(queues, FLAVORS, a_work + b_work, fleet)
    assert "b/w0" in r.admitted  # the 4 GPUs nobody uses
    assert set(r.preempted) == {"a/w2"}  # only the last-admitted borrower, as a whole
    assert r.preempted["a/w2"].reason == IN_COHORT_RECLAMATION
    assert r.preempted["a/w2"].preemptor == "b/w1"
    assert r.waiting["b/w1"].kind == WAIT_PREEMPTING


def test_no_second_preemption_while_victims_are_still_stopping():
    queues = {"a": cq("a", 8, reclaim_within_cohort="Any"), "b": cq("b", 8, reclaim_within_cohort="Any")}
    a_work = [wl(f"a/w{i}", "a", 2, 2, admitted=FLAVOR, admitted_at=i) for i in range(3)]
    a_work[2].evicting = True
    b_first = wl("b/w0", "b", 2, 2, admitted=FLAVOR, admitted_at=5)
    r = schedule(queues, FLAVORS, [*a_work, b_first, wl("b/w1", "b", 2, 2, ts=11)], nodes(4, 4, 4, 4))
    assert not r.preempted
    assert r.waiting["b/w1"].kind == WAIT_PREEMPTING


def test_two_owners_waiting_each_get_their_own_victim():
    queues = {"a": cq("a", 8, reclaim_within_cohort="Any"), "b": cq("b", 8, reclaim_within_cohort="Any")}
    a_work = [wl(f"a/w{i}", "a", 2, 2, admitted=FLAVOR, admitted_at=i) for i in range(4)]  # all 16 GPUs
    a_work[3].evicting, a_work[3].preempted_by = True, "b/w0"
    b_work = [wl("b/w0", "b", 2, 2, ts=1), wl("b/w1", "b", 2, 2, ts=2)]
    r = schedule(queues, FLAVORS, a_work + b_work, nodes(4, 4, 4, 4))
    # b/w0 waits for the room made for it; b/w1 does not count on that room and preempts its own.
    assert r.waiting["b/w0"].kind == WAIT_PREEMPTING and "to stop" in r.waiting["b/w0"].message
    assert set(r.preempted) == {"a/w2"} and r.preempted["a/w2"].preemptor == "b/w1"


def test_a_victim_given_back_its_quota_does_not_take_it_before_its_preemptor():
    # big preempted both; v1 is still stopping, v2 is gone and pending again. Were v2 let
    # back into the room it left, big would preempt it again, round after round.
    queues = {"a": cq("a", 8, cohort="", within_cluster_queue="LowerPriority")}
    v1 = wl("a/v1", "a", 1, 4, admitted=FLAVOR, admitted_at=1, priority=1)
    v1.evicting, v1.preempted_by, v1.placed = True, "a/big", [Placement("n0", {"": 4})]
    v2 = wl("a/v2", "a", 1, 4, priority=1, ts=5)
    big = wl("a/big", "a", 1, 8, priority=10, ts=2)
    node = NodeInfo("n0", {}, {"": 8}, used={"": 4})
    r = schedule(queues, FLAVORS, [v1, v2, big], [node])
    assert r.waiting["a/big"].kind == WAIT_PREEMPTING and "to stop" in r.waiting["a/big"].message
    assert "a/v2" not in r.admitted and r.waiting["a/v2"].kind == WAIT_QUOTA
    assert not r.preempted
    # Once v1 is gone too, big is admitted.
    r = schedule(queues, FLAVORS, [v2, big], [NodeInfo("n0", {}, {"": 8})])
    assert set(r.admitted) == {"a/big"}


def test_a_smaller_workload_does_not_fill_the_node_room_a_preemptor_waits_for():
    # big needs all of n0: its 4 free GPUs and v's 4. Quota is ample, so only the node's room
    # can be taken twice: were small let into n0's free half, big would preempt small next,
    # and v would come back, round after round at one instant.
    queues = {"a": cq("a", 64, cohort="", within_cluster_queue="LowerPriority")}
    v = wl("a/v", "a", 1, 4, admitted=FLAVOR, admitted_at=1, priority=1)
    v.placed, v.unbound = [Placement("n0", {"": 4})], {"main": 0}
    keep = wl("a/keep", "a", 1, 8, admitted=FLAVOR, admitted_at=1, priority=100)
    keep.placed, keep.unbound = [Placement("n1", {"": 8})], {"main": 0}
    big = wl("a/big", "a", 1, 8, priority=10, ts=2)
    small = wl("a/small", "a", 1, 4, priority=5, ts=3)
    fleet = [NodeInfo("n0", {}, {"": 8}, used={"": 4}), NodeInfo("n1", {}, {"": 8}, used={"": 8})]
    r = schedule(queues, FLAVORS, [v, keep, big, small], fleet)
    assert set(r.preempted) == {"a/v"} and r.preempted["a/v"].preemptor == "a/big"
    assert "a/small" not in r.admitted and "a/small" in r.waiting
    # With a node of its own free, small is admitted beside the preemption.
    fleet.append(NodeInfo("n2", {}, {"": 4}))
    r = schedule(queues, FLAVORS, [v, keep, big, small], fleet)
    assert set(r.preempted) == {"a/v"} and set(r.admitted) == {"a/small"}


def test_reclaim_never_leaves_the_owner_waiting():
    queues = {"a": cq("a", 8), "b": cq("b", 8)}
    a_work = [wl(f"a/w{i}", "a", 2, 2, admitted=FLAVOR, admitted_at=i) for i in range(4)]
    r = schedule(queues, FLAVORS, [*a_work, wl("b/w0", "b", 2, 2)], nodes(4, 4, 4, 4))
    assert not r.preempted
    assert r.waiting["b/w0"].kind == WAIT_QUOTA


def test_reclaim_lower_priority_spares_higher_priority_borrowers():
    queues = {"a": cq("a", 8), "b": cq("b", 8, reclaim_within_cohort="LowerPriority")}
    a_work = [wl(f"a/w{i}", "a", 2, 2, admitted=FLAVOR, admitted_at=i, priority=100) for i in range(4)]
    r = schedule(queues, FLAVORS, [*a_work, wl("b/w0", "b", 2, 2, priority=10)], nodes(4, 4, 4, 4))
    assert not r.preempted
    assert r.waiting["b/w0"].kind == WAIT_PRIORITY


def test_within_cluster_queue_preempts_lower_priority():
    queues = {"a": cq("a", 8, cohort="", within_cluster_queue="LowerPriority")}
    low = [wl(f"a/low{i}", "a", 1, 4, admitted=FLAVOR, admitted_at=i, priority=1) for i in range(2)]
    r = schedule(queues, FLAVORS, [*low, wl("a/high", "a", 1, 4, priority=10)], nodes(4, 4))
    assert set(r.preempted) == {"a/low1"}
    assert r.preempted["a/low1"].reason == IN_CLUSTER_QUEUE
    r = schedule(queues, FLAVORS, [*low, wl("a/same", "a", 1, 4, priority=1)], nodes(4, 4))
    assert not r.preempted and r.waiting["a/same"].kind == WAIT_QUOTA
    r = schedule(queues, FLAVORS, [*low, wl("a/lower", "a", 1, 4, priority=0)], nodes(4, 4))
    assert not r.preempted and r.waiting["a/lower"].kind == WAIT_PRIORITY


def test_fair_sharing_gives_spare_capacity_to_the_lowest_weighted_share():
    queues = {
        "a": cq("a", 4, reclaim_within_cohort="Never"),
        "b": cq("b", 4, reclaim_within_cohort="Never", weight=2.0),
        "c": cq("c", 8),  # idle: its 8 GPUs are what a and b compete for
    }
    # a already borrows 2; both now ask for 2 more each, over and over.
    a_run = wl("a/run", "a", 1, 6, admitted=FLAVOR)
    b_run = wl("b/run", "b", 1, 6, admitted=FLAVOR)
    pending = [wl(f"a/p{i}", "a", 1, 2, ts=i) for i in range(3)] + [wl(f"b/p{i}", "b", 1, 2, ts=i) for i in range(3)]
    r = schedule(queues, FLAVORS, [a_run, b_run, *pending], nodes(8, 8, 8, 8), fair_sharing=True)
    a_got = sum(1 for k in r.admitted if k.startswith("a/"))
    b_got = sum(1 for k in r.admitted if k.startswith("b/"))
    # 4 spare GPUs (16 - 12): b, with twice the weight, gets them first.
    assert (a_got, b_got) == (0, 2)
    # Without fair sharing the older, equal-priority entries go in order of age.
    r = schedule(queues, FLAVORS, [a_run, b_run, *pending], nodes(8, 8, 8, 8))
    assert len(r.admitted) == 2 and {k.split("/")[0] for k in r.admitted} == {"a", "b"}


def test_fair_share_value_is_borrowed_part_over_weight():
    a, b = cq("a", 8, weight=2.0), cq("b", 8)
    q = Quotas({"a": a, "b": b})
    usage = {"a": {(FLAVOR, GPU): 12}}
    assert q.share(a, usage) == 4 * 1000 / 16 / 2
    assert q.share(b, usage) == 0


def test_strict_fifo_blocks_behind_the_head():
    queues = {"a": cq("a", 4, cohort="", strategy="StrictFIFO")}
    r = schedule(queues, FLAVORS, [wl("a/big", "a", 1, 8, ts=1), wl("a/small", "a", 1, 2, ts=2)], nodes(8))
    assert not r.admitted
    assert r.waiting["a/small"].kind == WAIT_QUEUED
    queues = {"a": cq("a", 4, cohort="")}
    r = schedule(queues, FLAVORS, [wl("a/big", "a", 1, 8, ts=1), wl("a/small", "a", 1, 2, ts=2)], nodes(8))
    assert set(r.admitted) == {"a/small"}


def test_higher_priority_is_admitted_first():
    queues = {"a": cq("a", 4, cohort="")}
    r = schedule(queues, FLAVORS, [wl("a/old", "a", 1, 4, ts=1), wl("a/urgent", "a", 1, 4, ts=2, priority=5)],
                 nodes(8))
    assert set(r.admitted) == {"a/urgent"}


def test_missing_queue_or_flavor_is_reported():
    r = schedule({}, FLAVORS, [wl("a/x", "nope", 1, 1)], nodes(1))
    assert r.waiting["a/x"].kind == WAIT_INADMISSIBLE
    queues = {"a": cq("a", 4, cohort="", inactive="flavor default not found")}
    r = schedule(queues, FLAVORS, [wl("a/y", "a", 1, 1)], nodes(1))
    assert "inactive" in r.waiting["a/y"].message


def test_tainted_nodes_count_only_for_pods_that_tolerate_them():
    queues = {"a": cq("a", 16, cohort="")}
    fleet = nodes(4, 4)
    for n in fleet:
        n.taints = (("dedicated", "infer", "NoSchedule"),)
    r = schedule(queues, FLAVORS, [wl("ns/plain", "a", 1, 4)], fleet)
    assert r.waiting["ns/plain"].kind == WAIT_SHAPE
    tolerant = WorkloadInfo("ns/tol", "a", [PodSetInfo("main", 1, {GPU: 4}, tolerations=(
        ("dedicated", "Equal", "infer", "NoSchedule"),))])
    assert "ns/tol" in schedule(queues, FLAVORS, [tolerant], fleet).admitted
    # A flavor's tolerations are the pods' too.
    flavors = {FLAVOR: FlavorInfo(FLAVOR, {}, (("dedicated", "Exists", "", ""),))}
    assert "ns/plain" in schedule(queues, flavors, [wl("ns/plain", "a", 1, 4)], fleet).admitted


def test_a_resource_the_queue_does_not_cover_makes_the_workload_inadmissible():
    """As Kueue: GPUs asked of a queue that covers only cpu are not silently left uncounted;
    the workload waits, whatever quota is free, with Kueue's own message."""
    cpu_only = ClusterQueueInfo("cpu", [ResourceGroupInfo(("cpu",), (FLAVOR,))], {(FLAVOR, "cpu"): Quota(64_000)})
    queues = {"cpu": cpu_only, "a": cq("a", 8, cohort="")}
    work = [
        WorkloadInfo("ns/gpus", "cpu", [PodSetInfo("main", 1, {"cpu": 1000, GPU: 1})]),
        WorkloadInfo("ns/two", "cpu", [PodSetInfo("launcher", 1, {"cpu": 500}),
                                       PodSetInfo("workers", 2, {"cpu": 1000, "memory": 1 << 30, GPU: 2})]),
        WorkloadInfo("ns/cpu", "cpu", [PodSetInfo("main", 1, {"cpu": 2000, GPU: 0})], timestamp=1),
        WorkloadInfo("ns/gpu-and-cpu", "a", [PodSetInfo("main", 1, {GPU: 1, "cpu": 1000})]),
    ]
    r = schedule(queues, FLAVORS, work, nodes(4, 4))
    assert r.waiting["ns/gpus"] == Wait(
        WAIT_INADMISSIBLE, "couldn't assign flavors to pod set main: resource nvidia.com/gpu unavailable in ClusterQueue")
    # One reason per pod set that asks for something uncovered, the first such resource by name.
    assert r.waiting["ns/two"] == Wait(
        WAIT_INADMISSIBLE, "couldn't assign flavors to pod set workers: resource memory unavailable in ClusterQueue")
    # Asking for none of a resource is no request for it; and the other way round, a GPU
    # queue that does not cover cpu does not admit cpu requests either.
    assert set(r.admitted) == {"ns/cpu"}
    assert r.waiting["ns/gpu-and-cpu"] == Wait(
        WAIT_INADMISSIBLE, "couldn't assign flavors to pod set main: resource cpu unavailable in ClusterQueue")
