"""An HPA's sync as plain decisions: the target's scale, its pods and each metric's samples
in; the rescale, conditions, Events and status out."""

from __future__ import annotations

from typing import Any

from gpufleet.api.k8s import HorizontalPodAutoscaler
from gpufleet.controllers import hpa_algorithm as algo
from gpufleet.controllers.hpa_decide import HpaObserved, decide_hpa, finish_hpa, needs_metrics

NOW = 1_000_000.0
READINESS = {"cpu_initialization_period": 300.0, "initial_readiness_delay": 30.0}


def hpa(*, min_replicas: int = 1, max_replicas: int = 10, metrics: list | None = None,
        status: dict | None = None) -> HorizontalPodAutoscaler:
    body: dict[str, Any] = {
        "metadata": {"name": "web", "namespace": "default", "generation": 2},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                 "minReplicas": min_replicas, "maxReplicas": max_replicas,
                 "metrics": metrics if metrics is not None else [
                     {"type": "Pods", "pods": {"metric": {"name": "qps"},
                                               "target": {"type": "AverageValue", "averageValue": "10"}}}]}}
    if status is not None:
        body["status"] = status
    return HorizontalPodAutoscaler.from_dict(body)


def scale(spec: int, current: int | None = None, selector: str = "app=web") -> dict[str, Any]:
    return {"spec": {"replicas": spec}, "status": {"replicas": spec if current is None else current,
                                                   "selector": selector}}


def pods(n: int) -> list[algo.PodInfo]:
    return [algo.PodInfo(name=f"p{i}", start_time=NOW - 3600, ready_transition=NOW - 3600) for i in range(n)]


def observed(h: Any, sc: dict | None, samples: list, infos: list | None = None, error: str = "") -> HpaObserved:
    return HpaObserved(h, sc, NOW, "2026-01-01T00:00:00Z", scale_error=error,
                       infos=infos if infos is not None else pods(2), samples=samples)


def condition(actions: Any, type_: str) -> tuple[str, str]:
    c = next(c for c in actions.status["conditions"] if c["type"] == type_)
    return c["status"], c["reason"]


def test_a_metric_above_target_scales_up_and_the_rescale_is_remembered():
    h = hpa()
    obs = observed(h, scale(2), [{"p0": algo.Sample(30_000), "p1": algo.Sample(30_000)}])
    decision = decide_hpa(obs, algo.History(), READINESS)
    assert (decision.scale_to, decision.rescale_reason) == (6, "pods metric qps above target")
    actions = finish_hpa(obs, decision)
    assert [(e.reason, e.message) for e in actions.events] == [
        ("SuccessfulRescale", "New size: 6; reason: pods metric qps above target")]
    assert condition(actions, "AbleToScale") == ("True", "SucceededRescale")
    assert condition(actions, "ScalingActive") == ("True", "ValidMetricFound")
    assert actions.status["desiredReplicas"] == 6 and actions.status["currentReplicas"] == 2
    assert actions.status["lastScaleTime"] == "2026-01-01T00:00:00Z"
    assert actions.status["currentMetrics"][0]["pods"]["current"]["averageValue"] == "30"
    assert decision.history.up_events  # the rescale is counted by the policies from now on


def test_a_failed_scale_write_is_reported_and_not_remembered():
    obs = observed(hpa(), scale(2), [{"p0": algo.Sample(30_000), "p1": algo.Sample(30_000)}])
    decision = decide_hpa(obs, algo.History(), READINESS)
    actions = finish_hpa(obs, decision, "forbidden")
    assert condition(actions, "AbleToScale") == ("False", "FailedUpdateScale")
    assert [e.reason for e in actions.events] == ["FailedRescale"]
    assert "lastScaleTime" not in actions.status and not decision.history.up_events


def test_outside_the_bounds_the_count_is_brought_back_without_metrics():
    h = hpa(max_replicas=3)
    assert not needs_metrics(h, scale(5))
    decision = decide_hpa(observed(h, scale(5), []), algo.History(), READINESS)
    assert (decision.scale_to, decision.rescale_reason) == (3, "Current number of replicas above Spec.MaxReplicas")


def test_a_target_at_zero_is_left_alone():
    disabled = decide_hpa(observed(hpa(), scale(0), []), algo.History(), READINESS)
    assert disabled.scale_to is None
    assert condition(finish_hpa(observed(hpa(), scale(0), []), disabled), "ScalingActive") == (
        "False", "ScalingDisabled")
    zero = hpa(min_replicas=0)
    assert condition(finish_hpa(observed(zero, scale(0), []), decide_hpa(observed(zero, scale(0), []),
                                                                       algo.History(), READINESS)),
                     "ScalingActive") == ("False", "ScaledToZero")


def test_an_unreadable_scale_or_failed_metrics_change_nothing_and_say_why():
    obs = observed(hpa(status={"currentReplicas": 2, "desiredReplicas": 2}), None, [], error="not found")
    decision = decide_hpa(obs, algo.History(), READINESS)
    actions = finish_hpa(obs, decision)
    assert decision.scale_to is None and [e.reason for e in actions.events] == ["FailedGetScale"]
    assert condition(actions, "AbleToScale") == ("False", "FailedGetScale")
    failing = observed(hpa(), scale(2), ["the gateway is down"])
    decision = decide_hpa(failing, algo.History(), READINESS)
    actions = finish_hpa(failing, decision)
    assert decision.scale_to is None
    assert [e.reason for e in actions.events] == ["FailedGetPodsMetric", "FailedComputeMetricsReplicas"]
    assert condition(actions, "ScalingActive") == ("False", "FailedGetPodsMetric")
    assert actions.status["currentMetrics"] == [{"type": ""}]


def test_a_scale_without_a_selector_is_invalid():
    obs = observed(hpa(), scale(2, selector=""), [])
    actions = finish_hpa(obs, decide_hpa(obs, algo.History(), READINESS))
    assert condition(actions, "ScalingActive") == ("False", "InvalidSelector")


def test_the_status_already_held_is_not_written_again():
    obs = observed(hpa(), scale(2), [{"p0": algo.Sample(10_000), "p1": algo.Sample(10_000)}])
    first = finish_hpa(obs, decide_hpa(obs, algo.History(), READINESS))
    assert first.status is not None and first.events == []
    again = observed(hpa(status=first.status), scale(2), [{"p0": algo.Sample(10_000), "p1": algo.Sample(10_000)}])
    assert finish_hpa(again, decide_hpa(again, algo.History(), READINESS)).status is None
