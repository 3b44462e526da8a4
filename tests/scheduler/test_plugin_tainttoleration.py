"""TaintToleration and NodeUnschedulable."""

from __future__ import annotations

import pytest
from sched_factories import make_node, node_info, pod_info, taint, toleration

from gpufleet.scheduler.framework import Code, CycleState
from gpufleet.scheduler.plugins.helpers import tolerates
from gpufleet.scheduler.plugins.nodeunschedulable import NodeUnschedulable
from gpufleet.scheduler.plugins.tainttoleration import TaintToleration


@pytest.mark.parametrize(
    ("tol", "taint_", "expected"),
    [
        (("gpu", "Equal", "broken", "NoSchedule"), ("gpu", "broken", "NoSchedule"), True),
        (("gpu", "Equal", "ok", "NoSchedule"), ("gpu", "broken", "NoSchedule"), False),
        (("gpu", "Exists", "", ""), ("gpu", "broken", "NoExecute"), True),
        (("", "Exists", "", ""), ("anything", "x", "NoSchedule"), True),
        (("gpu", "Exists", "", "NoExecute"), ("gpu", "", "NoSchedule"), False),
        (("other", "Exists", "", ""), ("gpu", "", "NoSchedule"), False),
        (("gpu", "", "", ""), ("gpu", "", "NoSchedule"), True),
        (("gpu", "Gt", "1", ""), ("gpu", "2", "NoSchedule"), False),
    ],
)
def test_toleration_matching(tol, taint_, expected):
    assert tolerates(tol, *taint_) is expected


def test_untolerated_taint_is_named_in_the_reason():
    n = node_info(make_node("a", taints=[taint("gpu", "broken")]))
    status = TaintToleration().filter(CycleState(), pod_info("p"), n)
    assert status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert status.reasons == ["node(s) had untolerated taint {gpu: broken}"]


def test_taint_without_value_reads_like_kubernetes():
    n = node_info(make_node("a", taints=[taint("node-role.kubernetes.io/control-plane")]))
    status = TaintToleration().filter(CycleState(), pod_info("p"), n)
    assert status.reasons == ["node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }"]


def test_tolerated_and_prefer_no_schedule_taints_pass_the_filter():
    n = node_info(make_node("a", taints=[taint("gpu", "broken"), taint("soft", effect="PreferNoSchedule")]))
    pod = pod_info("p", tolerations=[toleration("gpu", "broken", "NoSchedule")])
    assert TaintToleration().filter(CycleState(), pod, n).is_success


def test_no_execute_taints_filter_too():
    n = node_info(make_node("a", taints=[taint("node.kubernetes.io/not-ready", effect="NoExecute")]))
    assert not TaintToleration().filter(CycleState(), pod_info("p"), n).is_success


def test_prefer_no_schedule_lowers_the_score():
    clean = node_info(make_node("clean"))
    soft = node_info(make_node("soft", taints=[taint("a", effect="PreferNoSchedule")]))
    softer = node_info(
        make_node(
            "softer", taints=[taint("a", effect="PreferNoSchedule"), taint("b", effect="PreferNoSchedule")]
        )
    )
    plugin, state, pod = TaintToleration(), CycleState(), pod_info("p")
    nodes = [clean, soft, softer]
    assert plugin.pre_score(state, pod, nodes).is_success
    scores = [plugin.score(state, pod, n) for n in nodes]
    plugin.normalize_score(state, pod, scores)
    assert scores == [100, 50, 0]


def test_tolerated_soft_taints_do_not_count():
    soft = node_info(make_node("soft", taints=[taint("a", effect="PreferNoSchedule")]))
    plugin, state = TaintToleration(), CycleState()
    pod = pod_info("p", tolerations=[toleration("a", operator="Exists", effect="PreferNoSchedule")])
    plugin.pre_score(state, pod, [soft])
    assert plugin.score(state, pod, soft) == 0


def test_score_is_skipped_when_no_node_has_soft_taints():
    assert TaintToleration().pre_score(CycleState(), pod_info("p"), [node_info(make_node("a"))]).is_skip


def test_cordoned_node():
    cordoned = node_info(make_node("a", unschedulable=True))
    status = NodeUnschedulable().filter(CycleState(), pod_info("p"), cordoned)
    assert status.reasons == ["node(s) were unschedulable"]
    assert status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    tolerant = pod_info("d", tolerations=[toleration("node.kubernetes.io/unschedulable", operator="Exists")])
    assert NodeUnschedulable().filter(CycleState(), tolerant, cordoned).is_success
    assert NodeUnschedulable().filter(CycleState(), pod_info("p"), node_info(make_node("b"))).is_success
