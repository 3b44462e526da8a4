"""A PodDisruptionBudget's status as a plain decision: the budget, its pods and the expected
count in; status, Events and when to look again out."""

from __future__ import annotations

from typing import Any

from gpufleet.api.k8s import Pod, PodDisruptionBudget
from gpufleet.controllers.disruption import DELETION_TIMEOUT, decide_budget, needs_scale
from gpufleet.utils.clock import rfc3339

T0 = 1_700_000_000.0


def pdb(*, min_available: Any = None, max_unavailable: Any = None, status: dict | None = None) -> PodDisruptionBudget:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "web"}}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    body: dict[str, Any] = {"metadata": {"name": "b", "namespace": "default", "generation": 1}, "spec": spec}
    if status is not None:
        body["status"] = status
    return PodDisruptionBudget.from_dict(body)


def pod(name: str, ready: bool = True) -> Pod:
    return Pod.from_dict({"metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
                          "spec": {"containers": []},
                          "status": {"phase": "Running",
                                     "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})


def test_healthy_pods_above_min_available_allow_disruptions():
    actions = decide_budget(pdb(min_available=2), [pod("a"), pod("b"), pod("c", ready=False)], None, None, T0)
    s = actions.status
    assert (s["currentHealthy"], s["desiredHealthy"], s["expectedPods"], s["disruptionsAllowed"]) == (2, 2, 3, 0)
    assert s["conditions"][0]["reason"] == "InsufficientPods" and actions.events == []
    assert decide_budget(pdb(min_available=2, status=s), [pod("a"), pod("b"), pod("c", False)], None, None,
                         T0).status is None


def test_max_unavailable_reads_the_controllers_scale():
    assert needs_scale(pdb(max_unavailable=1)) and needs_scale(pdb(min_available="50%"))
    assert not needs_scale(pdb(min_available=1))
    s = decide_budget(pdb(max_unavailable=1), [pod("a"), pod("b"), pod("c")], 3, None, T0).status
    assert (s["desiredHealthy"], s["disruptionsAllowed"]) == (2, 1)


def test_an_unknown_expected_count_fails_safe_with_a_warning():
    actions = decide_budget(pdb(max_unavailable=1), [pod("a")], None, "found no controller ref", T0)
    assert actions.status["disruptionsAllowed"] == 0
    assert actions.status["conditions"][0]["reason"] == "SyncFailed"
    assert [e.reason for e in actions.events] == ["CalculateExpectedPodCountFailed"]


def test_a_budget_without_pods_says_so_and_an_eviction_entry_expires():
    assert [e.reason for e in decide_budget(pdb(min_available=1), [], None, None, T0).events] == ["NoPods"]
    status = {"disruptedPods": {"a": rfc3339(T0 - 20)}}
    actions = decide_budget(pdb(min_available=1, status=status), [pod("a"), pod("b")], None, None, T0)
    assert actions.status["currentHealthy"] == 1
    assert abs(actions.requeue_after - (DELETION_TIMEOUT - 20 + 0.05)) < 1e-6
