"""PodInfo requests, NodeInfo accounting and GPU bookkeeping, Snapshot."""

from __future__ import annotations

import pytest
from sched_factories import make_node, make_pod, node_info, pod_info

from gpufleet.api.gpu import GPU_RESOURCE, parse_gpu_indices, parse_gpus_annotation
from gpufleet.scheduler.snapshot import (
    DEFAULT_MEMORY_REQUEST,
    DEFAULT_MILLI_CPU_REQUEST,
    NodeInfo,
    PodInfo,
    Snapshot,
)

GI = 1024**3


def container(name: str, restart_policy: str | None = None, **requests: str) -> dict:
    c = {"name": name, "image": "x", "resources": {"requests": dict(requests)}}
    if restart_policy:
        c["restartPolicy"] = restart_policy
    return c


class TestPodRequests:
    def test_containers_add_up_in_base_units(self):
        p = PodInfo(
            make_pod(
                "p",
                containers=[
                    container("a", cpu="500m", memory="1Gi"),
                    container("b", cpu="1.5", memory="512Mi"),
                ],
            )
        )
        assert (p.cpu, p.memory, p.gpus) == (2000, GI + GI // 2, 0)

    def test_the_pods_total_is_rounded_up_once_not_each_container(self):
        # Kubernetes takes MilliValue() of PodRequests' total: 0.5m + 0.5m is 1 millicore
        # (rounding each container first made it 2); the same for bytes.
        p = PodInfo(make_pod("p", containers=[container("a", cpu="0.5m", memory="0.5"),
                                              container("b", cpu="0.5m", memory="0.5")]))
        assert (p.cpu, p.memory) == (1, 1)

    def test_limits_are_the_requests_when_none_are_given(self):
        c = {"name": "a", "image": "x", "resources": {"limits": {"cpu": "2", "nvidia.com/gpu": "4"}}}
        p = PodInfo(make_pod("p", containers=[c]))
        assert (p.cpu, p.gpus) == (2000, 4)

    def test_init_containers_count_at_their_peak(self):
        p = PodInfo(
            make_pod(
                "p",
                containers=[container("main", cpu="1", memory="1Gi")],
                init_containers=[container("big-init", cpu="3", memory="512Mi")],
            )
        )
        # cpu: the init container's 3 beats the app's 1; memory: the app's 1Gi wins.
        assert (p.cpu, p.memory) == (3000, GI)

    def test_sidecars_run_alongside_later_containers(self):
        p = PodInfo(
            make_pod(
                "p",
                containers=[container("main", cpu="1")],
                init_containers=[
                    container("proxy", restart_policy="Always", cpu="500m"),
                    container("setup", cpu="2"),
                ],
            )
        )
        # setup runs next to the proxy: 2.5 at peak; afterwards main + proxy = 1.5.
        assert p.cpu == 2500

    def test_overhead_is_added(self):
        p = PodInfo(make_pod("p", cpu="1", memory="1Gi", overhead={"cpu": "250m", "memory": "64Mi"}))
        assert (p.cpu, p.memory) == (1250, GI + 64 * 1024**2)

    def test_extended_resources_are_kept_apart(self):
        c = {"name": "a", "image": "x", "resources": {"requests": {"example.com/fpga": "2", "cpu": "1"}}}
        p = PodInfo(make_pod("p", containers=[c]))
        assert p.scalar == {"example.com/fpga": 2}
        assert p.requests == {"cpu": 1000, "example.com/fpga": 2}

    def test_request_less_containers_score_with_defaults(self):
        p = PodInfo(make_pod("p", cpu=None, memory=None))
        assert (p.cpu, p.memory) == (0, 0)
        assert (p.nonzero_cpu, p.nonzero_memory) == (DEFAULT_MILLI_CPU_REQUEST, DEFAULT_MEMORY_REQUEST)

    def test_scheduling_fields(self):
        p = PodInfo(
            make_pod(
                "p",
                priority=7,
                created=1_700_000_000,
                gpu_indices=(3, 1),
                tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            )
        )
        assert p.priority == 7
        assert p.creation_timestamp == 1_700_000_000
        assert p.gpu_indices == (1, 3)
        assert p.tolerations == (("gpu", "Exists", "", "NoSchedule"),)

    def test_assigned_copy_leaves_the_original(self):
        p = pod_info("p", gpus=2)
        placed = p.assigned("node-a", (5, 4))
        assert (placed.node_name, placed.gpu_indices) == ("node-a", (4, 5))
        assert (p.node_name, p.gpu_indices) == ("", ())
        assert placed.pod is p.pod


class TestNodeInfo:
    def test_allocatable_and_requests(self):
        n = node_info(
            make_node("a", cpu="8", memory="32Gi", gpus=8),
            make_pod("x", cpu="2", memory="4Gi", gpus=2, node_name="a", gpu_indices=(0, 1)),
            make_pod("y", cpu="500m", memory="1Gi", node_name="a"),
        )
        assert (n.alloc_cpu, n.alloc_memory, n.alloc_gpus, n.alloc_pods) == (8000, 32 * GI, 8, 110)
        assert (n.req_cpu, n.req_memory, n.req_gpus, n.num_pods) == (2500, 5 * GI, 2, 2)
        assert n.requested == {"cpu": 2500, "memory": 5 * GI, GPU_RESOURCE: 2, "pods": 2}

    def test_capacity_stands_in_for_missing_allocatable(self):
        node = make_node("a")
        node.status.allocatable = None
        n = NodeInfo(node)
        assert n.alloc_gpus == 8

    def test_no_annotation_means_one_group_of_all_gpus(self):
        n = node_info(make_node("a", gpus=4))
        assert n.free_gpus == {"": {0, 1, 2, 3}}
        assert n.free_gpu_count == 4

    def test_groups_health_and_used_indices(self):
        n = node_info(
            make_node("a", gpus=8, gpu_groups=[4, 4], unhealthy=(7,)),
            make_pod("x", gpus=2, node_name="a", gpu_indices=(0, 4)),
        )
        assert n.free_gpus == {"nvlink-0": {1, 2, 3}, "nvlink-1": {5, 6}}
        assert n.free_gpu_count == 5  # 8 - 2 used - 1 unhealthy

    def test_removing_a_pod_frees_its_indices(self):
        p = PodInfo(make_pod("x", gpus=2, node_name="a", gpu_indices=(2, 3)))
        n = node_info(make_node("a", gpus=4), p)
        assert n.remove_pod(p)
        assert n.free_gpus == {"": {0, 1, 2, 3}}
        assert (n.req_gpus, n.num_pods) == (0, 0)
        assert not n.remove_pod(p)

    def test_pods_without_indices_hold_gpus_somewhere(self):
        n = node_info(make_node("a", gpus=8), make_pod("legacy", gpus=3, node_name="a"))
        assert n.unindexed_gpus == 3
        assert n.free_gpu_total == 8
        assert n.free_gpu_count == 5

    def test_double_booked_index_stays_used_until_both_go(self):
        a = PodInfo(make_pod("a", gpus=1, node_name="n", gpu_indices=(0,)))
        b = PodInfo(make_pod("b", gpus=1, node_name="n", gpu_indices=(0,)))
        n = node_info(make_node("n", gpus=2), a, b)
        n.remove_pod(a)
        assert 0 not in n.free_gpus[""]
        n.remove_pod(b)
        assert 0 in n.free_gpus[""]

    def test_new_inventory_keeps_used_indices_used(self):
        n = node_info(make_node("a", gpus=4), make_pod("x", gpus=1, node_name="a", gpu_indices=(1,)))
        n.set_node(make_node("a", gpus=4, gpu_groups=[2, 2]))
        assert n.free_gpus == {"nvlink-0": {0}, "nvlink-1": {2, 3}}

    def test_gpu_memory_from_label_or_inventory(self):
        labelled = make_node("a", gpus=1, labels={"nvidia.com/gpu.memory": "40960"})
        assert NodeInfo(labelled).gpu_memory_mib == 40960
        assert NodeInfo(make_node("b", gpus=2, gpu_groups=[2], gpu_memory_mib=24576)).gpu_memory_mib == 24576
        assert NodeInfo(make_node("c", gpus=2)).gpu_memory_mib is None

    def test_clone_is_independent(self):
        n = node_info(make_node("a", gpus=4))
        c = n.clone()
        c.add_pod(PodInfo(make_pod("x", gpus=2, node_name="a", gpu_indices=(0, 1))))
        assert n.free_gpus == {"": {0, 1, 2, 3}} and n.num_pods == 0 and n.req_gpus == 0
        assert c.free_gpus == {"": {2, 3}} and c.num_pods == 1


class TestSnapshot:
    def test_lookup_and_what_if(self):
        snap = Snapshot([node_info(make_node("a")), node_info(make_node("b"))])
        assert [n.name for n in snap] == ["a", "b"]
        placed = snap.add_pod(pod_info("x", gpus=2), "b", (6, 7))
        assert snap.get("b").req_gpus == 2 and snap.get("b").free_gpus[""] == set(range(6))
        assert snap.remove_pod(placed)
        assert snap.get("b").req_gpus == 0
        with pytest.raises(KeyError):
            snap.add_pod(pod_info("y"), "nope")

    def test_nodes_without_a_node_object_are_left_out(self):
        assert len(Snapshot([NodeInfo(), node_info(make_node("a"))])) == 1


class TestGpuAnnotations:
    def test_parse_inventory(self):
        devices = parse_gpus_annotation(
            '[{"index": 1, "uuid": "u1", "memoryMiB": 100, "health": "Unhealthy", "group": "g"},'
            ' {"index": 0}, {"index": 0, "group": "dup"}, {"index": -1}, "junk"]'
        )
        assert [(d.index, d.healthy, d.group, d.memory_mib) for d in devices] == [
            (0, True, "", None),
            (1, False, "g", 100),
        ]
        assert parse_gpus_annotation("not json") is None
        assert parse_gpus_annotation("{}") is None

    def test_parse_indices(self):
        assert parse_gpu_indices("0, 2,2,x,-1,3") == (0, 2, 3)
        assert parse_gpu_indices("") == ()
