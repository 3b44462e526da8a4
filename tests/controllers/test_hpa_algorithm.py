"""The HPA arithmetic against Kubernetes' documented algorithm
(https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details)
and the behavior semantics (stabilization windows, scaling policies, selectPolicy)."""

from __future__ import annotations

import pytest

from gpufleet.controllers.hpa_algorithm import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    History,
    PodInfo,
    Policy,
    ReplicaCalcError,
    Rules,
    Sample,
    Tolerance,
    limit_by_rate,
    normalize,
    plain_metric_replicas,
    record_scale,
    stabilize,
    utilization_replicas,
)

NOW = 1_000_000.0


def pods(n: int, **kw) -> list[PodInfo]:
    return [PodInfo(f"p{i}", start_time=NOW - 3600, ready_transition=NOW - 3500, **kw) for i in range(n)]


def samples(*values: float) -> dict[str, Sample]:
    return {f"p{i}": Sample(int(v * 1000), NOW, 15) for i, v in enumerate(values)}


# --- desiredReplicas = ceil(currentReplicas * currentMetricValue / desiredMetricValue) ---------


def test_documented_example_doubles_and_halves():
    # "if the current metric value is 200m, and the desired value is 100m, the number of
    # replicas will be doubled ... if the current value is instead 50m, you'll halve".
    assert plain_metric_replicas(4, 100, pods(4), {f"p{i}": Sample(200) for i in range(4)}, NOW)[0] == 8
    assert plain_metric_replicas(4, 100, pods(4), {f"p{i}": Sample(50) for i in range(4)}, NOW)[0] == 2


def test_ceil_of_ratio_times_ready_pods():
    replicas, average = plain_metric_replicas(3, 10_000, pods(3), samples(12, 15, 18), NOW)
    assert average == 15_000
    assert replicas == 5  # ceil(1.5 * 3) = 5


def test_within_tolerance_keeps_replicas():
    # ratio 1.09 and 0.91: within the default 0.1 tolerance, so no change.
    assert plain_metric_replicas(10, 1000, pods(10), samples(*[1.09] * 10), NOW)[0] == 10
    assert plain_metric_replicas(10, 1000, pods(10), samples(*[0.91] * 10), NOW)[0] == 10
    # Just outside it scales.
    assert plain_metric_replicas(10, 1000, pods(10), samples(*[1.11] * 10), NOW)[0] == 12


def test_tolerance_is_per_direction():
    tol = Tolerance(down=0.5, up=0.01)
    assert plain_metric_replicas(10, 1000, pods(10), samples(*[0.6] * 10), NOW, tolerance=tol)[0] == 10
    assert plain_metric_replicas(10, 1000, pods(10), samples(*[1.05] * 10), NOW, tolerance=tol)[0] == 11


def test_zero_usage_recommends_zero():
    assert plain_metric_replicas(3, 1000, pods(3), samples(0, 0, 0), NOW)[0] == 0


def test_no_metrics_is_an_error():
    with pytest.raises(ReplicaCalcError):
        plain_metric_replicas(2, 1000, pods(2), {}, NOW)


def test_deleting_and_failed_pods_are_ignored():
    ps = pods(2) + [PodInfo("gone", deleting=True), PodInfo("dead", phase="Failed")]
    metrics = {**samples(2, 2), "gone": Sample(100_000), "dead": Sample(100_000)}
    assert plain_metric_replicas(4, 1000, ps, metrics, NOW)[0] == 4  # ceil(2 * 2 ready pods)


# --- missing metrics and not-yet-ready pods: the conservative assumptions ----------------


def test_missing_pods_assumed_at_target_when_scaling_down():
    # Two pods at 0.5 of target, two without samples: counted as 100% of target,
    # the average becomes 0.75 -> ceil(0.75 * 4) = 3, not ceil(0.5 * 2) = 1.
    replicas, _ = plain_metric_replicas(4, 1000, pods(4), samples(0.5, 0.5), NOW)
    assert replicas == 3


def test_missing_pods_assumed_at_zero_when_scaling_up():
    # Two pods at 2x, two missing -> counted as 0: average 1.0 -> within tolerance, no change.
    assert plain_metric_replicas(4, 1000, pods(4), samples(2, 2), NOW)[0] == 4
    # Three at 3x, one missing: 9/4 = 2.25 -> ceil(2.25 * 4) = 9.
    assert plain_metric_replicas(4, 1000, pods(4), samples(3, 3, 3), NOW)[0] == 9


def test_missing_pods_that_reverse_the_direction_keep_replicas():
    # One pod at 0.8, three missing: scale-down assumption makes the average 0.95 -> no change.
    assert plain_metric_replicas(4, 1000, pods(4), samples(0.8), NOW)[0] == 4


def test_pending_pods_count_as_zero_when_scaling_up():
    ps = pods(2) + [PodInfo("p2", phase="Pending"), PodInfo("p3", phase="Pending")]
    # Ready pods at 3x; the pending pods count as 0: 6/4 = 1.5 -> ceil(1.5 * 4) = 6.
    assert plain_metric_replicas(4, 1000, ps, samples(3, 3), NOW)[0] == 6


def test_pending_pods_are_left_out_when_scaling_down():
    ps = pods(2) + [PodInfo("p2", phase="Pending")]
    assert plain_metric_replicas(3, 1000, ps, samples(0.2, 0.2), NOW)[0] == 1  # ceil(0.2 * 2)


# --- Resource utilization ---------------------------------------------------------------


def test_cpu_utilization_of_requests():
    ps = pods(2, requests={"cpu": 500})
    metrics = {"p0": Sample(450, NOW, 15), "p1": Sample(450, NOW, 15)}  # 90% of 500m
    replicas, percent, average = utilization_replicas(2, 50, "cpu", ps, metrics, NOW)
    assert percent == 90 and average == 450
    assert replicas == 4  # ceil(1.8 * 2)


def test_cpu_of_a_not_ready_pod_within_initialization_is_ignored_for_scale_up():
    ps = [PodInfo("p0", start_time=NOW - 3600, ready_transition=NOW - 3500, requests={"cpu": 1000}),
          PodInfo("p1", ready=False, start_time=NOW - 20, ready_transition=NOW - 20, requests={"cpu": 1000})]
    metrics = {"p0": Sample(2000, NOW, 15), "p1": Sample(3000, NOW, 15)}
    # p1 is unready: left out, then counted as 0 because the ratio says scale up:
    # (2000 + 0) / 2000 = 100% of a 50% target -> ratio 2 -> ceil(2 * 2) = 4.
    replicas, percent, _ = utilization_replicas(2, 50, "cpu", ps, metrics, NOW)
    assert percent == 200
    assert replicas == 4


def test_missing_cpu_request_is_an_error():
    with pytest.raises(ReplicaCalcError, match="missing request for cpu"):
        utilization_replicas(1, 50, "cpu", pods(1), samples(1), NOW)


def test_memory_utilization_missing_pod_assumed_at_request_on_scale_down():
    ps = pods(2, requests={"memory": 1000_000})
    metrics = {"p0": Sample(200_000)}  # 20% of request, p1 missing -> counted at 100%
    replicas, _, _ = utilization_replicas(2, 80, "memory", ps, metrics, NOW)
    # (200000 + 1000000) / 2000000 = 60% of 80% -> 0.75 -> ceil(0.75 * 2) = 2: no change.
    assert replicas == 2


# --- stabilization ------------------------------------------------------------------------


def test_scale_down_uses_highest_recommendation_in_window():
    h = History()
    down = Rules(60, "Max", (Policy("Percent", 100, 15),))
    up = DEFAULT_SCALE_UP
    assert stabilize(h, NOW, 5, 8, up, down)[0] == 8
    # 30 s later the metric says 2, but 8 is still within the 60 s window.
    rec, reason, _ = stabilize(h, NOW + 30, 8, 2, up, down)
    assert (rec, reason) == (8, "ScaleDownStabilized")
    # After the window passed, the lower recommendation wins.
    assert stabilize(h, NOW + 61, 8, 2, up, down)[0] == 2


def test_scale_up_window_uses_lowest_recommendation():
    h = History()
    up = Rules(30, "Max", (Policy("Percent", 100, 15),))
    assert stabilize(h, NOW, 2, 2, up, DEFAULT_SCALE_DOWN)[0] == 2
    assert stabilize(h, NOW + 10, 2, 6, up, DEFAULT_SCALE_DOWN)[0] == 2  # 2 still in window
    assert stabilize(h, NOW + 31, 2, 6, up, DEFAULT_SCALE_DOWN)[0] == 6


def test_default_behavior_scales_up_at_once():
    h = History()
    replicas, _ = normalize(h, NOW, 2, 4, 1, 10, DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN)
    assert replicas == 4


# --- policies -------------------------------------------------------------------------------


def test_default_scale_up_is_max_of_100_percent_and_4_pods():
    h = History()
    # From 1: +100% = 2, +4 pods = 5 -> Max -> 5.
    assert limit_by_rate(h, NOW, 1, 20, 1, 100, DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN)[:2] == (5, "ScaleUpLimit")
    # From 10: +100% = 20, +4 = 14 -> 20.
    assert limit_by_rate(h, NOW, 10, 50, 1, 100, DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN)[0] == 20


def test_select_policy_min_and_disabled():
    h = History()
    up = Rules(0, "Min", DEFAULT_SCALE_UP.policies)
    assert limit_by_rate(h, NOW, 10, 50, 1, 100, up, DEFAULT_SCALE_DOWN)[0] == 14
    disabled = Rules(0, "Disabled", DEFAULT_SCALE_UP.policies)
    assert limit_by_rate(h, NOW, 10, 50, 1, 100, disabled, DEFAULT_SCALE_DOWN)[0] == 10


def test_policy_period_counts_recent_changes():
    h = History()
    up = Rules(0, "Max", (Policy("Pods", 2, 60),))
    replicas, _ = normalize(h, NOW, 2, 10, 1, 100, up, DEFAULT_SCALE_DOWN)
    assert replicas == 4
    record_scale(h, NOW, 2, 4, up, DEFAULT_SCALE_DOWN)
    # 20 s later: the period started at 2 replicas, so 4 is already the limit.
    assert normalize(h, NOW + 20, 4, 10, 1, 100, up, DEFAULT_SCALE_DOWN)[0] == 4
    # After the period, another +2.
    assert normalize(h, NOW + 61, 4, 10, 1, 100, up, DEFAULT_SCALE_DOWN)[0] == 6


def test_scale_down_percent_rounds_down_and_pods_policy():
    h = History()
    down = Rules(0, "Max", (Policy("Percent", 50, 60),))
    assert limit_by_rate(h, NOW, 5, 0, 0, 10, DEFAULT_SCALE_UP, down)[0] == 2  # int(5 * 0.5) = 2
    down_pods = Rules(0, "Max", (Policy("Pods", 1, 60), Policy("Percent", 10, 60)))
    # Max picks the biggest change: -1 pod (9) vs -10% (9) -> 9 from 10.
    assert limit_by_rate(h, NOW, 10, 0, 0, 10, DEFAULT_SCALE_UP, down_pods)[0] == 9
    down_min = Rules(0, "Min", (Policy("Pods", 4, 60), Policy("Percent", 10, 60)))
    assert limit_by_rate(h, NOW, 10, 0, 0, 10, DEFAULT_SCALE_UP, down_min)[0] == 9


def test_min_and_max_bounds_with_conditions():
    h = History()
    replicas, conds = normalize(h, NOW, 5, 50, 1, 8, DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN)
    assert replicas == 8
    limited = next(c for c in conds if c.type == "ScalingLimited")
    assert (limited.status, limited.reason) == ("True", "TooManyReplicas")
    h = History()
    down = Rules(0, "Max", (Policy("Percent", 100, 15),))
    replicas, conds = normalize(h, NOW, 5, 0, 2, 8, DEFAULT_SCALE_UP, down)
    assert replicas == 2
    limited = next(c for c in conds if c.type == "ScalingLimited")
    assert (limited.status, limited.reason) == ("True", "TooFewReplicas")


def test_scale_to_zero_allowed_when_min_is_zero():
    h = History()
    down = Rules(0, "Max", (Policy("Percent", 100, 15),))
    assert normalize(h, NOW, 3, 0, 0, 8, DEFAULT_SCALE_UP, down)[0] == 0


def test_default_scale_down_window_is_300_seconds():
    h = History()
    assert normalize(h, NOW, 4, 4, 1, 10, DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN)[0] == 4
    assert normalize(h, NOW + 299, 4, 1, 1, 10, DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN)[0] == 4
    assert normalize(h, NOW + 301, 4, 1, 1, 10, DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN)[0] == 1
