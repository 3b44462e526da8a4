"""NodeResourcesFit: the fit check and both scoring strategies."""

from __future__ import annotations

import pytest
from sched_factories import make_node, make_pod, node_info, pod_info

from gpufleet.scheduler.framework import Code, CycleState
from gpufleet.scheduler.plugins.noderesources import NodeResourcesFit
from gpufleet.scheduler.profile import LEAST_ALLOCATED, MOST_ALLOCATED


def fit(strategy: str = MOST_ALLOCATED, **args) -> NodeResourcesFit:
    return NodeResourcesFit({"scoringStrategy": {"type": strategy}, **args})


def test_fits_when_everything_is_left():
    n = node_info(
        make_node("a", cpu="8", memory="32Gi", gpus=8), make_pod("x", cpu="4", gpus=4, node_name="a")
    )
    assert fit().filter(CycleState(), pod_info("p", cpu="4", memory="8Gi", gpus=4), n).is_success


def test_insufficient_gpus_names_the_resource_and_the_numbers():
    n = node_info(make_node("a", gpus=8), make_pod("x", gpus=6, node_name="a"))
    status = fit().filter(CycleState(), pod_info("p", gpus=4), n)
    assert status.code is Code.UNSCHEDULABLE
    assert status.reasons == ["Insufficient nvidia.com/gpu"]
    assert status.detail == "Insufficient nvidia.com/gpu (requested 4, free 2)"


def test_every_short_resource_is_a_reason():
    n = node_info(make_node("a", cpu="2", memory="4Gi", gpus=1))
    status = fit().filter(CycleState(), pod_info("p", cpu="3", memory="8Gi", gpus=2), n)
    assert status.reasons == ["Insufficient cpu", "Insufficient memory", "Insufficient nvidia.com/gpu"]
    assert "Insufficient cpu (requested 3, free 2)" in status.detail
    assert "Insufficient memory (requested 8Gi, free 4Gi)" in status.detail
    # Bigger than the whole node: evicting pods would not help.
    assert status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE


def test_a_node_without_gpus_is_insufficient():
    status = fit().filter(CycleState(), pod_info("p", gpus=1), node_info(make_node("cpu-only", gpus=0)))
    assert status.reasons == ["Insufficient nvidia.com/gpu"]


def test_pod_count_limit():
    n = node_info(make_node("a", pods=1), make_pod("x", node_name="a"))
    status = fit().filter(CycleState(), pod_info("p", cpu=None, memory=None), n)
    assert status.reasons == ["Too many pods"]
    assert status.code is Code.UNSCHEDULABLE


def test_no_published_pod_limit_means_none():
    n = node_info(
        make_node("a", pods=None),
        *[make_pod(f"x{i}", cpu=None, memory=None, node_name="a") for i in range(200)],
    )
    assert fit().filter(CycleState(), pod_info("p", cpu=None, memory=None), n).is_success


def test_other_extended_resources_and_ignoring_them():
    c = {"name": "a", "image": "x", "resources": {"requests": {"example.com/fpga": "1"}}}
    pod = pod_info("p", containers=[c])
    n = node_info(make_node("a"))
    assert fit().filter(CycleState(), pod, n).reasons == ["Insufficient example.com/fpga"]
    assert fit(ignoredResources=["example.com/fpga"]).filter(CycleState(), pod, n).is_success
    assert fit(ignoredResourceGroups=["example.com"]).filter(CycleState(), pod, n).is_success
    with_fpga = node_info(make_node("b", extra={"example.com/fpga": "2"}))
    assert fit().filter(CycleState(), pod, with_fpga).is_success


def test_most_allocated_prefers_the_fuller_node():
    empty = node_info(make_node("empty", gpus=8))
    half = node_info(
        make_node("half", gpus=8), make_pod("x", cpu="4", memory="16Gi", gpus=4, node_name="half")
    )
    pod = pod_info("p", cpu="1", memory="1Gi", gpus=2)
    s_empty, s_half = fit(MOST_ALLOCATED).score_nodes(CycleState(), pod, [empty, half])
    assert s_half > s_empty
    # And the single-node entry point agrees with the batch one.
    assert fit(MOST_ALLOCATED).score(CycleState(), pod, half) == s_half


def test_least_allocated_prefers_the_emptier_node():
    empty = node_info(make_node("empty", gpus=8))
    half = node_info(
        make_node("half", gpus=8), make_pod("x", cpu="4", memory="16Gi", gpus=4, node_name="half")
    )
    s_empty, s_half = fit(LEAST_ALLOCATED).score_nodes(CycleState(), pod_info("p", gpus=2), [empty, half])
    assert s_empty > s_half


def test_score_values_follow_the_weighted_average():
    n = node_info(make_node("a", cpu="4", memory="4Gi", gpus=4))
    pod = pod_info("p", cpu="1", memory="1Gi", gpus=2)
    # cpu 25, memory 25 (weights 1), gpu 50 (weight 4): (25 + 25 + 200) / 6 = 41
    assert fit(MOST_ALLOCATED).score(CycleState(), pod, n) == 41
    # cpu 75, memory 75, gpu 50: (75 + 75 + 200) / 6 = 58
    assert fit(LEAST_ALLOCATED).score(CycleState(), pod, n) == 58


def test_gpus_do_not_rank_cpu_only_pods():
    busy_gpus = make_pod("x", cpu="0", memory="0", gpus=8, node_name="g")
    gpu_node = node_info(make_node("g", cpu="4", memory="4Gi", gpus=8), busy_gpus)
    plain = node_info(make_node("c", cpu="4", memory="4Gi", gpus=0))
    pod = pod_info("p", cpu="1", memory="1Gi")
    a, b = fit().score_nodes(CycleState(), pod, [gpu_node, plain])
    assert a == b


def test_custom_resource_weights():
    plugin = NodeResourcesFit(
        {"scoringStrategy": {"type": MOST_ALLOCATED, "resources": [{"name": "nvidia.com/gpu"}]}}
    )
    n = node_info(make_node("a", gpus=4))
    assert plugin.score(CycleState(), pod_info("p", gpus=1), n) == 25


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="scoringStrategy"):
        NodeResourcesFit({"scoringStrategy": {"type": "Random"}})
    with pytest.raises(ValueError, match="weights"):
        NodeResourcesFit({"scoringStrategy": {"resources": [{"name": "cpu", "weight": 0}]}})
