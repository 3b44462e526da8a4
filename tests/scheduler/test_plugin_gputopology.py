"""GPUTopology: which GPU indices a pod gets, the same-group requirement, and the score."""

from __future__ import annotations

from sched_factories import make_node, make_pod, node_info, pod_info

from gpufleet.scheduler.framework import GPU_INDICES_KEY, SKIP, CycleState, FrameworkHandle
from gpufleet.scheduler.plugins.gputopology import (
    NO_SINGLE_GROUP,
    NOT_ENOUGH_HEALTHY,
    GPUTopology,
    choose_gpus,
    placement_score,
)
from gpufleet.scheduler.snapshot import Snapshot

SAME_GROUP = {"gpufleet.io/gpu-topology": "same-group"}


def used(node, name, *indices):
    return make_pod(name, gpus=len(indices), node_name=node, gpu_indices=indices)


class TestChooseGpus:
    def test_one_group_when_a_group_has_room(self):
        n = node_info(make_node("a", gpus=8, gpu_groups=[4, 4]), used("a", "x", 0))
        assert choose_gpus(n, 2) == (1, 2)
        assert choose_gpus(n, 4) == (4, 5, 6, 7)

    def test_tightest_group_first_keeps_big_groups_whole(self):
        n = node_info(make_node("a", gpus=8, gpu_groups=[4, 4]), used("a", "x", 0, 1))
        # Group 0 has 2 free, group 1 has 4: a 2-GPU pod fills group 0 exactly.
        assert choose_gpus(n, 2) == (2, 3)

    def test_across_groups_only_when_no_group_fits(self):
        n = node_info(make_node("a", gpus=8, gpu_groups=[4, 4]), used("a", "x", 0, 4), used("a", "y", 1))
        # Free: group 0 {2, 3}, group 1 {5, 6, 7}; 4 GPUs need both, largest first.
        assert choose_gpus(n, 4) == (2, 5, 6, 7)
        assert choose_gpus(n, 4, same_group=True) is None

    def test_unhealthy_and_used_gpus_are_never_chosen(self):
        n = node_info(make_node("a", gpus=4, unhealthy=(1,)), used("a", "x", 0))
        assert choose_gpus(n, 2) == (2, 3)
        assert choose_gpus(n, 3) is None

    def test_zero_gpus(self):
        assert choose_gpus(node_info(make_node("a")), 0) == ()


class TestFilter:
    def test_pods_without_gpus_are_skipped(self):
        assert GPUTopology().pre_filter(CycleState(), pod_info("p"), Snapshot()) is SKIP

    def test_unhealthy_gpus_do_not_count(self):
        plugin, state = GPUTopology(), CycleState()
        pod = pod_info("p", gpus=8)
        plugin.pre_filter(state, pod, Snapshot())
        status = plugin.filter(state, pod, node_info(make_node("a", gpus=8, unhealthy=(3,))))
        assert status.reasons == [NOT_ENOUGH_HEALTHY]
        assert status.detail.endswith("(requested 8, free healthy 7)")

    def test_same_group_requirement(self):
        n = node_info(make_node("a", gpus=8, gpu_groups=[4, 4]), used("a", "x", 0, 4))
        plugin = GPUTopology()
        pod = pod_info("p", gpus=4, annotations=SAME_GROUP)
        state = CycleState()
        plugin.pre_filter(state, pod, Snapshot())
        status = plugin.filter(state, pod, n)
        assert status.reasons == [NO_SINGLE_GROUP]
        # Without the annotation the node is fine (across groups).
        loose, loose_state = pod_info("q", gpus=4), CycleState()
        plugin.pre_filter(loose_state, loose, Snapshot())
        assert plugin.filter(loose_state, loose, n).is_success


class TestScore:
    def test_exact_fit_scores_highest(self):
        exact = node_info(make_node("a", gpus=8, gpu_groups=[4, 4]), used("a", "x", 0, 1))
        loose = node_info(make_node("b", gpus=8, gpu_groups=[4, 4]))
        assert placement_score(exact, 2) == 100
        assert placement_score(loose, 2) == 75

    def test_split_placement_scores_below_any_single_group(self):
        split = node_info(make_node("a", gpus=8, gpu_groups=[4, 4]), used("a", "x", 0, 4), used("a", "y", 1))
        whole = node_info(make_node("b", gpus=8))
        assert placement_score(split, 4) < 50 <= placement_score(whole, 4)

    def test_batch_and_single_agree(self):
        nodes = [node_info(make_node(f"n{i}", gpus=8, gpu_groups=[4, 4])) for i in range(3)]
        plugin = GPUTopology()
        pod = pod_info("p", gpus=3)
        assert plugin.score_nodes(CycleState(), pod, nodes) == [
            plugin.score(CycleState(), pod, n) for n in nodes
        ]


class TestReserve:
    def test_reserve_writes_indices_and_unreserve_is_idempotent(self):
        handle = FrameworkHandle()
        handle.snapshot = Snapshot([node_info(make_node("a", gpus=8, gpu_groups=[4, 4]), used("a", "x", 0))])
        plugin, state = GPUTopology(handle=handle), CycleState()
        pod = pod_info("p", gpus=3)
        assert plugin.reserve(state, pod, "a").is_success
        assert state.read(GPU_INDICES_KEY) == (1, 2, 3)
        plugin.unreserve(state, pod, "a")
        plugin.unreserve(state, pod, "a")
        assert GPU_INDICES_KEY not in state

    def test_reserve_for_an_unknown_node_fails(self):
        handle = FrameworkHandle()
        handle.snapshot = Snapshot()
        assert not GPUTopology(handle=handle).reserve(CycleState(), pod_info("p", gpus=1), "gone").is_success
