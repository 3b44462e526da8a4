"""DefaultPreemption and gang preemption on a snapshot: who is evicted, and who never is."""

from __future__ import annotations

from sched_factories import make_node, make_pod

from gpufleet.api import k8s
from gpufleet.scheduler.framework import CycleState, FitError, Framework
from gpufleet.scheduler.gang import plan_gang_preemption
from gpufleet.scheduler.preemption import VICTIMS_KEY, Candidate, disruption_budget
from gpufleet.scheduler.scheduler import Scheduler
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot

GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


def running(name: str, node: str, gpus: int, priority: int, **kwargs) -> PodInfo:
    return PodInfo(
        make_pod(
            name,
            cpu="1",
            memory="1Gi",
            gpus=gpus,
            priority=priority,
            node_name=node,
            phase="Running",
            **kwargs,
        )
    )


def cluster(nodes: dict[str, list[PodInfo]], gpus: int = 8) -> Snapshot:
    snapshot = Snapshot([NodeInfo(make_node(name, cpu="64", memory="512Gi", gpus=gpus)) for name in nodes])
    for pods in nodes.values():
        for p in pods:
            # Give each pod real GPU indices, as the scheduler would have.
            node_info = snapshot.get(p.node_name)
            free = sorted(set().union(*node_info.free_gpus.values()))[: p.gpus]
            snapshot.add_pod(p, p.node_name, free)
    return snapshot


def preempt(snapshot: Snapshot, pod: PodInfo) -> tuple[FitError, Candidate | None]:
    state = CycleState()
    result = Framework().schedule(pod, snapshot, state)
    assert isinstance(result, FitError)
    candidate = state.read(VICTIMS_KEY) if result.diagnosis.nominated_node else None
    if candidate is not None:
        assert result.diagnosis.nominated_node == candidate.node
    return result, candidate


def names(pods) -> list[str]:
    return sorted(p.name for p in pods)


def high(gpus: int = 8, priority: int = 100, **kwargs) -> PodInfo:
    return PodInfo(make_pod("urgent", cpu="1", memory="1Gi", gpus=gpus, priority=priority, **kwargs))


def test_the_node_with_the_fewest_victims_is_chosen():
    snapshot = cluster(
        {
            "a": [running("a1", "a", 4, 1), running("a2", "a", 4, 1)],
            "b": [running("b1", "b", 8, 1)],
            "c": [running("c1", "c", 8, 500)],
        }
    )
    _, candidate = preempt(snapshot, high())
    assert candidate is not None
    assert (candidate.node, names(candidate.victims)) == ("b", ["b1"])


def test_lower_priority_victims_beat_fewer_ones():
    snapshot = cluster(
        {"a": [running("a1", "a", 8, 50)], "b": [running("b1", "b", 4, 1), running("b2", "b", 4, 1)]}
    )
    _, candidate = preempt(snapshot, high())
    assert (candidate.node, names(candidate.victims)) == ("b", ["b1", "b2"])


def test_only_the_pods_the_preemptor_needs_gone_are_victims():
    snapshot = cluster(
        {"a": [running("low", "a", 2, 1), running("mid", "a", 4, 2), running("top", "a", 2, 3)]}
    )
    _, candidate = preempt(snapshot, high(gpus=4))
    assert names(candidate.victims) == ["mid"]


def test_equal_or_higher_priority_is_never_preempted():
    snapshot = cluster({"a": [running("peer", "a", 8, 100)], "b": [running("boss", "b", 8, 1000)]})
    error, candidate = preempt(snapshot, high())
    assert candidate is None
    assert (
        "preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod" in error.message
    )


def test_preemption_policy_never_does_not_preempt():
    snapshot = cluster({"a": [running("low", "a", 8, 1)]})
    pod = PodInfo(
        k8s.Pod.model_validate(
            {
                **make_pod("polite", gpus=8, priority=100).to_dict(),
                "spec": {
                    **make_pod("polite", gpus=8, priority=100).to_dict()["spec"],
                    "preemptionPolicy": "Never",
                },
            }
        )
    )
    error, candidate = preempt(snapshot, pod)
    assert candidate is None
    assert "preemptionPolicy=Never" in error.message


def test_a_gang_victim_takes_its_whole_gang_and_counts_whole():
    gang = {"labels": {GROUP_LABEL: "train"}}
    snapshot = cluster(
        {
            "a": [running("g0", "a", 8, 1, **gang)],
            "b": [running("g1", "b", 8, 1, **gang)],
            "c": [running("g2", "c", 8, 1, **gang)],
            "d": [running("d1", "d", 4, 1), running("d2", "d", 4, 1)],
        }
    )
    # Two single pods on d cost less than the three members of the gang.
    _, candidate = preempt(snapshot, high())
    assert (candidate.node, names(candidate.victims)) == ("d", ["d1", "d2"])
    # Without d, the gang goes whole, members on other nodes included.
    snapshot = cluster(
        {
            "a": [running("g0", "a", 8, 1, **gang)],
            "b": [running("g1", "b", 8, 1, **gang)],
            "c": [running("g2", "c", 8, 1, **gang)],
        }
    )
    _, candidate = preempt(snapshot, high())
    assert names(candidate.victims) == ["g0", "g1", "g2"]


def test_a_gang_with_a_more_important_member_is_not_a_victim():
    gang = {"labels": {GROUP_LABEL: "train"}}
    snapshot = cluster({"a": [running("g0", "a", 8, 1, **gang)], "b": [running("g1", "b", 8, 200, **gang)]})
    _, candidate = preempt(snapshot, high())
    assert candidate is None


def pdb(min_available: int | str, app: str, **status) -> k8s.PodDisruptionBudget:
    body = {
        "metadata": {"name": f"pdb-{app}", "namespace": "default", "generation": 1},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
    }
    if status:
        body["status"] = status
    return k8s.PodDisruptionBudget.model_validate(body)


def test_victims_covered_by_a_disruption_budget_are_avoided_when_possible():
    snapshot = cluster(
        {
            "a": [running("db", "a", 8, 1, labels={"app": "db"})],
            "b": [running("batch", "b", 8, 5, labels={"app": "batch"})],
        }
    )
    snapshot.pdbs = [pdb(1, "db")]
    _, candidate = preempt(snapshot, high())
    # "db" has the lower priority, but evicting it would break its budget.
    assert (candidate.node, names(candidate.victims), candidate.pdb_violations) == ("b", ["batch"], 0)


def test_a_budget_is_violated_when_there_is_no_other_way():
    snapshot = cluster({"a": [running("db", "a", 8, 1, labels={"app": "db"})]})
    snapshot.pdbs = [pdb(1, "db")]
    _, candidate = preempt(snapshot, high())
    assert (names(candidate.victims), candidate.pdb_violations) == (["db"], 1)


def test_budget_allowance_from_status_or_computed():
    pods = [running(f"db{i}", "a", 1, 1, labels={"app": "db"}) for i in range(3)]
    assert disruption_budget(pdb(2, "db"), pods).allowed == 1
    assert disruption_budget(pdb("50%", "db"), pods).allowed == 1  # ceil(1.5) = 2 must stay
    maintained = pdb(2, "db", disruptionsAllowed=0, observedGeneration=1, currentHealthy=3, desiredHealthy=3)
    assert disruption_budget(maintained, pods).allowed == 0


def test_a_gang_preempts_for_all_its_members_or_not_at_all():
    snapshot = cluster(
        {"a": [running("a1", "a", 8, 1)], "b": [running("b1", "b", 8, 1)], "c": [running("c1", "c", 8, 500)]}
    )
    members = [
        PodInfo(make_pod(f"hp-{i}", cpu="1", memory="1Gi", gpus=8, priority=100, labels={GROUP_LABEL: "hp"}))
        for i in range(2)
    ]
    plan = plan_gang_preemption(Framework(), snapshot, members, min_member=2)
    assert plan is not None
    assert names(plan.victims) == ["a1", "b1"]
    assert sorted(plan.nodes.values()) == ["a", "b"]
    # The snapshot is as it was.
    assert {n.name: sorted(n.pods) for n in snapshot} == {
        "a": ["default/a1"],
        "b": ["default/b1"],
        "c": ["default/c1"],
    }
    # Three members need three nodes, and c's pod outranks them: nobody is evicted.
    members.append(
        PodInfo(make_pod("hp-2", cpu="1", memory="1Gi", gpus=8, priority=100, labels={GROUP_LABEL: "hp"}))
    )
    assert plan_gang_preemption(Framework(), snapshot, members, min_member=3) is None


def test_the_room_freed_for_a_nominated_pod_is_held_against_less_important_pods():
    scheduler = Scheduler(client=None)
    scheduler.cache.add_node(make_node("a", gpus=8))
    nominee = PodInfo(make_pod("urgent", gpus=8, priority=100))
    scheduler._nominate(nominee, "a")
    low = PodInfo(make_pod("low", gpus=2, priority=1))
    scheduler._refresh_snapshot(low)
    assert isinstance(scheduler.framework.schedule(low, scheduler._snapshot, post_filter=False), FitError)
    # A pod at least as important as the nominee is not held back by it...
    higher = PodInfo(make_pod("higher", gpus=2, priority=1000))
    scheduler._refresh_snapshot(higher)
    assert scheduler.framework.schedule(higher, scheduler._snapshot).node == "a"
    # ...and the nominee itself sees its room free.
    scheduler._refresh_snapshot(nominee)
    assert scheduler.framework.schedule(nominee, scheduler._snapshot).node == "a"
