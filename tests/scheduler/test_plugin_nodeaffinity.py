"""NodeAffinity (nodeSelector, required and preferred terms, the GPU product shorthand),
NodeName and GPUMemory."""

from __future__ import annotations

import pytest
from sched_factories import make_node, node_info, pod_info

from gpufleet.scheduler.framework import Code, CycleState
from gpufleet.scheduler.plugins.gpumemory import GPUMemory
from gpufleet.scheduler.plugins.nodeaffinity import REASON, NodeAffinity
from gpufleet.scheduler.plugins.nodename import NodeName
from gpufleet.scheduler.snapshot import Snapshot


def required(*terms: list[dict]) -> dict:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
            }
        }
    }


def expr(key: str, operator: str, *values: str) -> dict:
    out = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


def run(plugin, pod, node):
    state = CycleState()
    pre = plugin.pre_filter(state, pod, Snapshot())
    if pre.is_skip:
        return pre
    if not pre.is_success:
        return pre
    return plugin.filter(state, pod, node)


H100 = node_info(make_node("h100", labels={"zone": "a", "gpu.count": "8"}, product="H100-SXM-80GB"))
A100 = node_info(make_node("a100", labels={"zone": "b", "gpu.count": "4"}, product="A100-SXM-40GB"))


def test_no_constraint_skips_the_filter():
    assert NodeAffinity().pre_filter(CycleState(), pod_info("p"), Snapshot()).is_skip


def test_node_selector():
    pod = pod_info("p", node_selector={"nvidia.com/gpu.product": "A100-SXM-40GB"})
    assert run(NodeAffinity(), pod, A100).is_success
    status = run(NodeAffinity(), pod, H100)
    assert status.reasons == [REASON]
    assert status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE


def test_gpu_product_annotation_is_a_selector():
    pod = pod_info("p", annotations={"nvidia.com/gpu.product": "H100-SXM-80GB, H200"})
    assert run(NodeAffinity(), pod, H100).is_success
    assert not run(NodeAffinity(), pod, A100).is_success


@pytest.mark.parametrize(
    ("expression", "h100", "a100"),
    [
        (expr("zone", "In", "a", "c"), True, False),
        (expr("zone", "NotIn", "a"), False, True),
        (expr("zone", "Exists"), True, True),
        (expr("rack", "DoesNotExist"), True, True),
        (expr("gpu.count", "Gt", "4"), True, False),
        (expr("gpu.count", "Lt", "8"), False, True),
    ],
)
def test_match_expressions(expression, h100, a100):
    pod = pod_info("p", affinity=required([expression]))
    assert run(NodeAffinity(), pod, H100).is_success is h100
    assert run(NodeAffinity(), pod, A100).is_success is a100


def test_terms_are_ored_and_expressions_anded():
    pod = pod_info(
        "p",
        affinity=required([expr("zone", "In", "a"), expr("gpu.count", "Lt", "4")], [expr("zone", "In", "b")]),
    )
    assert not run(NodeAffinity(), pod, H100).is_success  # first term: zone ok, count not
    assert run(NodeAffinity(), pod, A100).is_success  # second term


def test_match_fields_on_the_node_name():
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a100"]}]}
                ]
            }
        }
    }
    pod = pod_info("p", affinity=affinity)
    assert run(NodeAffinity(), pod, A100).is_success
    assert not run(NodeAffinity(), pod, H100).is_success


def test_invalid_affinity_is_reported_not_raised():
    pod = pod_info("p", affinity=required([expr("gpu.count", "Gt", "lots")]))
    status = NodeAffinity().pre_filter(CycleState(), pod, Snapshot())
    assert status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert status.message.startswith("invalid node affinity")


def test_preferred_terms_rank_nodes():
    affinity = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [expr("zone", "In", "b")]}},
                {"weight": 30, "preference": {"matchExpressions": [expr("gpu.count", "Gt", "2")]}},
            ]
        }
    }
    plugin, state, pod = NodeAffinity(), CycleState(), pod_info("p", affinity=affinity)
    assert plugin.pre_score(state, pod, [H100, A100]).is_success
    scores = [plugin.score(state, pod, n) for n in (H100, A100)]
    assert scores == [30, 40]
    plugin.normalize_score(state, pod, scores)
    assert scores == [75, 100]


def test_preferred_score_skipped_without_preferences():
    assert NodeAffinity().pre_score(CycleState(), pod_info("p"), [H100]).is_skip


def test_node_name():
    plugin = NodeName()
    assert plugin.pre_filter(CycleState(), pod_info("p"), Snapshot()).is_skip
    pinned = pod_info("p", node_name="a100")
    assert plugin.filter(CycleState(), pinned, A100).is_success
    assert plugin.filter(CycleState(), pinned, H100).reasons == [
        "node(s) didn't match the requested node name"
    ]


class TestGpuMemory:
    big = node_info(make_node("big", gpus=8, gpu_groups=[8], gpu_memory_mib=81920))
    small = node_info(make_node("small", gpus=8, labels={"nvidia.com/gpu.memory": "24576"}))
    cpu_only = node_info(make_node("cpu", gpus=0))

    def test_without_annotation_it_is_skipped(self):
        assert GPUMemory().pre_filter(CycleState(), pod_info("p"), Snapshot()).is_skip

    def test_minimum_memory(self):
        pod = pod_info("p", gpus=1, annotations={"gpufleet.io/gpu-memory-min": "40000"})
        assert run(GPUMemory(), pod, self.big).is_success
        status = run(GPUMemory(), pod, self.small)
        assert status.reasons == ["node(s) had GPUs with less than 40000 MiB memory"]
        assert status.detail.endswith("(has 24576 MiB)")
        assert run(GPUMemory(), pod, self.cpu_only).reasons == ["node(s) had no GPUs"]

    def test_bad_annotation(self):
        pod = pod_info("p", annotations={"gpufleet.io/gpu-memory-min": "40Gi"})
        status = GPUMemory().pre_filter(CycleState(), pod, Snapshot())
        assert status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        assert "whole number of MiB" in status.message
