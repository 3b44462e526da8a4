"""The framework: plugin wiring, the cycle, FitError messages, and how many nodes it reads."""

from __future__ import annotations

import asyncio
import random

import pytest
from sched_factories import make_node, make_pod, node_info, pod_info, taint

from gpufleet.scheduler.framework import (
    GPU_INDICES_KEY,
    OK,
    Code,
    CycleState,
    Diagnosis,
    FitError,
    Framework,
    SchedulingError,
    Status,
)
from gpufleet.scheduler.plugins import in_tree_registry
from gpufleet.scheduler.profile import LEAST_ALLOCATED, Profile, num_feasible_nodes_to_find
from gpufleet.scheduler.snapshot import Snapshot
from gpufleet.utils.clock import FakeClock


def framework(**profile) -> Framework:
    return Framework(Profile(**profile), rng=random.Random(0))


class TestFitErrorMessage:
    def test_reasons_are_counted_and_sorted_like_kubernetes(self):
        nodes = [
            node_info(
                make_node(f"busy-{i:02d}", gpus=8), make_pod(f"x{i}", gpus=6, node_name=f"busy-{i:02d}")
            )
            for i in range(8)
        ]
        nodes += [node_info(make_node(f"broken-{i}", taints=[taint("gpu", "broken")])) for i in range(4)]
        result = framework().schedule(pod_info("p", gpus=4), Snapshot(nodes))
        assert isinstance(result, FitError)
        # sort.Strings order, as kube-scheduler: "4 node(s)..." sorts before "8 Insufficient...";
        # then why preemption could not help either, as kube-scheduler adds it.
        assert result.message == (
            "0/12 nodes are available: 4 node(s) had untolerated taint {gpu: broken}, 8 Insufficient nvidia.com/gpu."
            " preemption: 0/12 nodes are available: 4 Preemption is not helpful for scheduling,"
            " 8 No preemption victims found for incoming pod."
        )
        assert str(result) == result.message

    def test_the_sixteen_gpu_pod(self):
        nodes = [node_info(make_node(n, gpus=8)) for n in ("a", "b", "c")]
        result = framework().schedule(pod_info("p", gpus=16), Snapshot(nodes))
        assert result.message == (
            "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
            " preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
        )
        assert result.diagnosis.unschedulable_plugins == {"NodeResourcesFit"}

    def test_every_reason_of_a_node_counts(self):
        nodes = [node_info(make_node("a", cpu="1", memory="1Gi", gpus=0))]
        result = framework().schedule(pod_info("p", cpu="2", memory="2Gi"), Snapshot(nodes))
        assert result.message == (
            "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory."
            " preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
        )

    def test_counts_sort_as_strings(self):
        statuses = {f"n{i}": Status.unschedulable("Insufficient cpu") for i in range(12)}
        statuses.update({f"m{i}": Status.unschedulable("Too many pods") for i in range(4)})
        error = FitError(pod_info("p"), 16, Diagnosis(statuses))
        assert error.message == "0/16 nodes are available: 12 Insufficient cpu, 4 Too many pods."

    def test_pre_filter_rejection_is_the_whole_message(self):
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "n", "operator": "Gt", "values": ["x"]}]}
                    ]
                }
            }
        }
        result = framework().schedule(pod_info("p", affinity=affinity), Snapshot([node_info(make_node("a"))]))
        assert isinstance(result, FitError)
        assert result.message.startswith("0/1 nodes are available: invalid node affinity: ")
        assert result.message.count("invalid") == 1
        assert result.diagnosis.unschedulable_plugins == {"NodeAffinity"}

    def test_post_filter_message_is_appended(self):
        class Preemption:
            name = "DefaultPreemption"

            def __init__(self, args, handle):
                pass

            def post_filter(self, state, pod_info, snapshot, node_statuses):
                n = len(node_statuses)
                return None, Status.unschedulable(
                    f"preemption: 0/{n} nodes are available: {n} Preemption is not helpful for scheduling"
                )

        registry = {**in_tree_registry(), "DefaultPreemption": Preemption}
        profile = Profile(plugins=[*Profile().plugins, "DefaultPreemption"])
        fw = Framework(profile, registry=registry)
        result = fw.schedule(pod_info("p", gpus=16), Snapshot([node_info(make_node("a"))]))
        assert result.message == (
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. "
            "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
        )

    def test_no_nodes(self):
        result = framework().schedule(pod_info("p"), Snapshot())
        assert result.message == "no nodes available to schedule pods"

    def test_per_node_breakdown(self):
        nodes = [
            node_info(make_node("node-a", gpus=8), make_pod("x", gpus=6, node_name="node-a")),
            node_info(make_node("node-b", taints=[taint("gpu", "broken")])),
        ]
        result = framework().schedule(pod_info("p", gpus=4), Snapshot(nodes))
        assert result.node_breakdown() == [
            "node-a: Insufficient nvidia.com/gpu (requested 4, free 2)",
            "node-b: node(s) had untolerated taint {gpu: broken}",
        ]
        assert result.node_breakdown(limit=1) == [
            "node-a: Insufficient nvidia.com/gpu (requested 4, free 2)",
            "... and 1 more node(s)",
        ]
        assert result.diagnosis.node_statuses["node-b"].plugin == "TaintToleration"


class TestNodesToScore:
    @pytest.mark.parametrize(
        ("nodes", "expected"),
        [(10, 10), (99, 99), (100, 100), (200, 100), (1000, 420), (5000, 500), (6000, 300), (20000, 1000)],
    )
    def test_adaptive(self, nodes, expected):
        assert num_feasible_nodes_to_find(nodes) == expected

    def test_configured(self):
        assert num_feasible_nodes_to_find(1000, 30) == 300
        assert num_feasible_nodes_to_find(1000, 5) == 100  # never under the minimum
        assert num_feasible_nodes_to_find(1000, 5, minimum=10) == 50
        assert num_feasible_nodes_to_find(1000, 100) == 1000

    def test_filtering_stops_early_and_resumes_where_it_stopped(self):
        nodes = [node_info(make_node(f"n{i:04d}", gpus=8)) for i in range(1000)]
        fw = framework()
        snapshot = Snapshot(nodes)
        first = fw.schedule(pod_info("p", gpus=1), snapshot)
        assert (first.evaluated_nodes, first.feasible_nodes) == (420, 420)
        assert set(first.scores) == {f"n{i:04d}" for i in range(420)}
        second = fw.schedule(pod_info("q", gpus=1), snapshot)
        assert min(second.scores) == "n0420"

    def test_all_nodes_are_read_when_none_fits(self):
        nodes = [node_info(make_node(f"n{i:04d}", gpus=8)) for i in range(500)]
        result = framework().schedule(pod_info("p", gpus=9), Snapshot(nodes))
        assert isinstance(result, FitError)
        assert len(result.diagnosis.node_statuses) == 500


class TestPlacement:
    def nodes(self):
        return [
            node_info(make_node("empty", gpus=8)),
            node_info(
                make_node("half", gpus=8), make_pod("x", gpus=4, node_name="half", gpu_indices=(0, 1, 2, 3))
            ),
        ]

    def test_bin_packing_is_the_default(self):
        result = framework().schedule(pod_info("p", gpus=2), Snapshot(self.nodes()))
        assert result.node == "half"
        assert result.gpu_indices == (4, 5)
        assert result.scores["half"] > result.scores["empty"]

    def test_spreading(self):
        result = framework(scoring_strategy=LEAST_ALLOCATED).schedule(
            pod_info("p", gpus=2), Snapshot(self.nodes())
        )
        assert result.node == "empty"

    def test_gpu_topology_outranks_a_split(self):
        split = node_info(
            make_node("split", gpus=8, gpu_groups=[4, 4]),
            make_pod("x", gpus=4, node_name="split", gpu_indices=(0, 1, 4, 5)),
        )
        whole = node_info(
            make_node("whole", gpus=8, gpu_groups=[4, 4]),
            make_pod("y", gpus=4, node_name="whole", gpu_indices=(0, 1, 2, 3)),
        )
        result = framework().schedule(pod_info("p", gpus=4), Snapshot([split, whole]))
        assert (result.node, result.gpu_indices) == ("whole", (4, 5, 6, 7))

    def test_one_feasible_node_is_not_scored(self):
        result = framework().schedule(pod_info("p", gpus=8), Snapshot(self.nodes()))
        assert (result.node, result.scores, result.feasible_nodes) == ("empty", {}, 1)

    def test_ties_are_broken_at_random(self):
        nodes = [node_info(make_node(f"n{i}", gpus=8)) for i in range(4)]
        chosen = {
            Framework(rng=random.Random(seed)).schedule(pod_info("p", gpus=1), Snapshot(nodes)).node
            for seed in range(20)
        }
        assert len(chosen) > 1


class TestWiring:
    def test_plugins_by_extension_point(self):
        fw = framework()
        assert fw.queue_sort.name == "PrioritySort"
        assert [p.name for p in fw.filters] == [
            "NodeUnschedulable",
            "NodeName",
            "TaintToleration",
            "NodeAffinity",
            "GPUMemory",
            "NodeResourcesFit",
            "GPUTopology",
            "VolumeBinding",
        ]
        assert [p.name for p in fw.pre_bind] == ["VolumeBinding"]
        assert {p.name: w for p, w in fw.scorers} == {
            "TaintToleration": 3,
            "NodeAffinity": 2,
            "NodeResourcesFit": 1,
            "GPUTopology": 2,
            "DefaultSpread": 4,
        }
        assert [p.name for p in fw.binders] == ["DefaultBinder"]

    def test_zero_weight_disables_a_score_plugin(self):
        fw = Framework(Profile(weights={"GPUTopology": 0}))
        assert "GPUTopology" not in {p.name for p, _ in fw.scorers}

    def test_unknown_plugin(self):
        with pytest.raises(ValueError, match="unknown scheduler plugin 'Nope'"):
            Framework(Profile(plugins=["PrioritySort", "Nope"]))

    def test_exactly_one_queue_sort(self):
        with pytest.raises(ValueError, match="exactly one queue sort"):
            Framework(Profile(plugins=["NodeResourcesFit"]))

    def test_profile_from_config(self):
        profile = Profile.from_dict(
            {
                "schedulerName": "gpu-scheduler",
                "percentageOfNodesToScore": 20,
                "scoringStrategy": "LeastAllocated",
                "plugins": {
                    "disabled": [{"name": "GPUMemory"}],
                    "enabled": [{"name": "GPUTopology", "weight": 5}],
                },
                "pluginConfig": [
                    {"name": "NodeResourcesFit", "args": {"ignoredResources": ["example.com/x"]}}
                ],
            }
        )
        assert profile.scheduler_name == "gpu-scheduler"
        assert "GPUMemory" not in profile.plugins
        assert profile.weight_of("GPUTopology") == 5
        assert profile.args_for("NodeResourcesFit") == {
            "ignoredResources": ["example.com/x"],
            "scoringStrategy": {"type": "LeastAllocated"},
        }
        fw = Framework(profile)
        assert fw.plugins["NodeResourcesFit"].strategy == "LeastAllocated"

    def test_bad_profiles(self):
        with pytest.raises(ValueError):
            Profile(scoring_strategy="Random")
        with pytest.raises(ValueError):
            Profile(percentage_of_nodes_to_score=101)

    def test_plugin_error_aborts_the_cycle(self):
        class Broken:
            name = "Broken"

            def __init__(self, args, handle):
                pass

            def filter(self, state, pod_info, node_info):
                return Status.from_error(RuntimeError("boom"))

        fw = Framework(
            Profile(plugins=["PrioritySort", "Broken"]), registry={**in_tree_registry(), "Broken": Broken}
        )
        with pytest.raises(SchedulingError, match="Broken: boom"):
            fw.schedule(pod_info("p"), Snapshot([node_info(make_node("a"))]))

    def test_failed_reserve_unreserves_and_reports(self):
        calls = []

        class Refuse:
            name = "Refuse"

            def __init__(self, args, handle):
                pass

            def reserve(self, state, pod_info, node_name):
                return Status.unschedulable("no room at the inn")

            def unreserve(self, state, pod_info, node_name):
                calls.append(node_name)

        profile = Profile(plugins=[*Profile().plugins, "Refuse"])
        fw = Framework(profile, registry={**in_tree_registry(), "Refuse": Refuse})
        result = fw.schedule(pod_info("p", gpus=1), Snapshot([node_info(make_node("a"))]))
        assert isinstance(result, FitError)
        assert result.message == "0/1 nodes are available: 1 no room at the inn."
        assert calls == ["a"]
        assert result.diagnosis.unschedulable_plugins == {"Refuse"}


class _Gang:
    name = "Gang"

    def __init__(self, args, handle):
        self.timeout = args.get("timeout", 10.0)

    def permit(self, state, pod_info, node_name):
        return Status.wait(self.timeout)


class TestPermit:
    def fw(self, clock):
        from gpufleet.scheduler.framework import FrameworkHandle

        profile = Profile(plugins=[*Profile().plugins, "Gang"], plugin_args={"Gang": {"timeout": 5.0}})
        return Framework(
            profile, registry={**in_tree_registry(), "Gang": _Gang}, handle=FrameworkHandle(clock=clock)
        )

    async def test_allowed_pod_proceeds(self):
        fw = self.fw(FakeClock())
        pod = pod_info("p")
        assert fw.run_permit(CycleState(), pod, "a").code is Code.WAIT
        waiter = asyncio.ensure_future(fw.wait_on_permit(pod))
        await asyncio.sleep(0)
        fw.get_waiting_pod(pod.uid).allow("Gang")
        assert (await waiter).is_success
        assert fw.get_waiting_pod(pod.uid) is None

    async def test_rejected_pod(self):
        fw = self.fw(FakeClock())
        pod = pod_info("p")
        fw.run_permit(CycleState(), pod, "a")
        fw.get_waiting_pod(pod.uid).reject("Gang", "gang member failed")
        status = await fw.wait_on_permit(pod)
        assert status.code is Code.UNSCHEDULABLE and status.reasons == ["gang member failed"]

    async def test_timeout_rejects(self):
        clock = FakeClock()
        fw = self.fw(clock)
        pod = pod_info("p")
        fw.run_permit(CycleState(), pod, "a")
        status = await fw.wait_on_permit(pod)
        assert status.plugin == "Gang"
        assert "timeout after waiting 5s" in status.message

    async def test_no_permit_plugins(self):
        fw = framework()
        assert fw.run_permit(CycleState(), pod_info("p"), "a") is OK
        assert (await fw.wait_on_permit(pod_info("p"))).is_success


def test_reserved_indices_come_back_in_the_result():
    fw = framework()
    result = fw.schedule(
        pod_info("p", gpus=3), Snapshot([node_info(make_node("a", gpus=8, gpu_groups=[4, 4]))])
    )
    assert result.gpu_indices == (0, 1, 2)
    assert result.state.read(GPU_INDICES_KEY) == (0, 1, 2)


def test_remembered_scores_follow_node_changes():
    a, b = node_info(make_node("a", gpus=8)), node_info(make_node("b", gpus=8))
    snapshot = Snapshot([a, b])
    fw = framework()
    snapshot.add_pod(pod_info("x", gpus=2), "a", (0, 1))
    first = fw.schedule(pod_info("p", gpus=2), snapshot)
    assert first.node == "a" and a.memo
    snapshot.add_pod(pod_info("y", gpus=4), "a", (2, 3, 4, 5))
    assert not a.memo  # a change forgets what was remembered about the node
    second = fw.schedule(pod_info("q", gpus=2), snapshot)
    fresh = framework().schedule(pod_info("q", gpus=2), Snapshot([a.clone(), b.clone()]))
    assert second.node == fresh.node == "a"
    assert second.scores == fresh.scores
