"""The HorizontalPodAutoscaler's arithmetic, as Kubernetes' podautoscaler package does it
(replica_calculator.go and horizontal.go), with no I/O: every input is an argument and
the time is passed in.

Replica count for one metric (``plain_metric_replicas``, ``utilization_replicas``):
``desired = ceil(currentMetric / target * readyPods)`` with the documented refinements:

- pods being deleted and failed pods are ignored; Pending pods are "unready"; for cpu a
  pod is also unready while it is not Ready or its sample predates its last readiness
  change, during the cpu initialization period (5 min), or when it never became Ready
  within the initial readiness delay (30 s);
- when the ratio is within the tolerance (0.1 by default, per direction) nothing changes;
- pods without a sample are "missing": when the ratio says scale down they are assumed
  to use 100% of the target, when it says scale up 0%; unready pods count as 0% when the
  ratio says scale up. If those assumptions reverse the direction or bring the ratio
  within the tolerance, the replica count stays.

Behavior (``normalize``): the recommendation is stabilized over
``stabilizationWindowSeconds`` (scale up: the lowest recommendation of the window, scale
down: the highest), then limited by the scaling policies: each policy allows, from the
replica count at the start of its period (current minus the changes made within the
period), ``+value`` pods or ``*(1+value/100)`` (rounded up) when scaling up, ``-value``
pods or ``*(1-value/100)`` (rounded down) when scaling down; ``selectPolicy`` Max takes
the policy that allows the biggest change, Min the smallest, Disabled none; and finally
min/maxReplicas.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

DEFAULT_TOLERANCE = 0.1
CPU_INITIALIZATION_PERIOD = 300.0
INITIAL_READINESS_DELAY = 30.0


class ReplicaCalcError(Exception):
    """No replica count could be computed from a metric (no samples, no requests)."""


@dataclass(frozen=True)
class PodInfo:
    """What the calculator needs to know of one pod of the scale target."""

    name: str
    phase: str = "Running"
    # The Ready condition: True, False, or None when the pod has none.
    ready: bool | None = True
    ready_transition: float | None = None
    start_time: float | None = None
    deleting: bool = False
    # resource name -> the sum of the containers' requests in milli-units; a resource
    # missing here means some container did not request it.
    requests: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Sample:
    """One pod's metric value (milli-units), when it was taken and over what window."""

    value: int
    timestamp: float = 0.0
    window: float = 0.0


@dataclass(frozen=True)
class Tolerance:
    down: float = DEFAULT_TOLERANCE
    up: float = DEFAULT_TOLERANCE

    def within(self, ratio: float) -> bool:
        return (1.0 - self.down) <= ratio <= (1.0 + self.up)


@dataclass
class _Groups:
    ready_count: int
    unready: set[str]
    missing: set[str]
    ignored: set[str]


def group_pods(
    pods: Iterable[PodInfo],
    metrics: Mapping[str, Sample],
    resource: str | None,
    now: float,
    cpu_initialization_period: float = CPU_INITIALIZATION_PERIOD,
    initial_readiness_delay: float = INITIAL_READINESS_DELAY,
) -> _Groups:
    g = _Groups(0, set(), set(), set())
    for pod in pods:
        if pod.deleting or pod.phase == "Failed":
            g.ignored.add(pod.name)
            continue
        if pod.phase == "Pending":
            g.unready.add(pod.name)
            continue
        sample = metrics.get(pod.name)
        if sample is None:
            g.missing.add(pod.name)
            continue
        if resource == "cpu":
            if pod.ready is None or pod.start_time is None:
                unready = True
            elif pod.start_time + cpu_initialization_period > now:
                transition = pod.ready_transition if pod.ready_transition is not None else pod.start_time
                unready = pod.ready is False or sample.timestamp < transition + sample.window
            else:
                transition = pod.ready_transition if pod.ready_transition is not None else pod.start_time
                unready = pod.ready is False and pod.start_time + initial_readiness_delay > transition
            if unready:
                g.unready.add(pod.name)
                continue
        g.ready_count += 1
    return g


def _average(values: Mapping[str, int]) -> int:
    return sum(values.values()) // len(values)


def _adjusted(
    current_replicas: int,
    usage_ratio: float,
    groups: _Groups,
    values: dict[str, int],
    fill_missing: Callable[[str], int],
    recompute: Callable[[Mapping[str, int]], float],
    tolerance: Tolerance,
) -> int:
    """The calculation once missing and unready pods are accounted for."""
    scale_up_with_unready = bool(groups.unready) and usage_ratio > 1.0
    if not scale_up_with_unready and not groups.missing:
        if tolerance.within(usage_ratio):
            return current_replicas
        return math.ceil(usage_ratio * groups.ready_count)
    if groups.missing and usage_ratio != 1.0:
        for name in groups.missing:
            values[name] = fill_missing(name) if usage_ratio < 1.0 else 0
    if scale_up_with_unready:
        for name in groups.unready:
            values[name] = 0
    new_ratio = recompute(values)
    if (
        tolerance.within(new_ratio)
        or (usage_ratio < 1.0 and new_ratio > 1.0)
        or (usage_ratio > 1.0 and new_ratio < 1.0)
    ):
        return current_replicas
    new_replicas = math.ceil(new_ratio * len(values))
    if (new_ratio < 1.0 and new_replicas > current_replicas) or (
        new_ratio > 1.0 and new_replicas < current_replicas
    ):
        return current_replicas
    return new_replicas


def _usable(pods: Sequence[PodInfo], metrics: Mapping[str, Sample], groups: _Groups) -> dict[str, int]:
    names = {p.name for p in pods}
    return {
        n: s.value for n, s in metrics.items()
        if n in names and n not in groups.ignored and n not in groups.unready
    }


def plain_metric_replicas(
    current_replicas: int,
    target: int,
    pods: Sequence[PodInfo],
    metrics: Mapping[str, Sample],
    now: float,
    *,
    resource: str | None = None,
    tolerance: Tolerance = Tolerance(),
    cpu_initialization_period: float = CPU_INITIALIZATION_PERIOD,
    initial_readiness_delay: float = INITIAL_READINESS_DELAY,
) -> tuple[int, int]:
    """Replicas for an AverageValue target (Pods metrics, or a Resource's raw value), and
    the current average (milli-units) over the pods that reported."""
    groups = group_pods(pods, metrics, resource, now, cpu_initialization_period, initial_readiness_delay)
    values = _usable(pods, metrics, groups)
    if not values:
        raise ReplicaCalcError("did not receive metrics for targeted pods (pods might be unready)")
    average = _average(values)

    def recompute(vals: Mapping[str, int]) -> float:
        return _average(vals) / target

    replicas = _adjusted(current_replicas, average / target, groups, dict(values),
                         lambda _: target, recompute, tolerance)
    return replicas, average


def utilization_replicas(
    current_replicas: int,
    target_utilization: int,
    resource: str,
    pods: Sequence[PodInfo],
    metrics: Mapping[str, Sample],
    now: float,
    *,
    tolerance: Tolerance = Tolerance(),
    cpu_initialization_period: float = CPU_INITIALIZATION_PERIOD,
    initial_readiness_delay: float = INITIAL_READINESS_DELAY,
) -> tuple[int, int, int]:
    """Replicas for a Utilization target (percent of the pods' requests); returns the
    replicas, the current utilization (percent) and the current average usage (milli)."""
    groups = group_pods(pods, metrics, resource, now, cpu_initialization_period, initial_readiness_delay)
    values = _usable(pods, metrics, groups)
    if not values:
        raise ReplicaCalcError("did not receive metrics for targeted pods (pods might be unready)")
    requests: dict[str, int] = {}
    for pod in pods:
        if pod.name in groups.ignored:
            continue
        req = pod.requests.get(resource)
        if req is None or req <= 0:
            raise ReplicaCalcError(f"missing request for {resource} in pod {pod.name}")
        requests[pod.name] = req

    def utilization(vals: Mapping[str, int]) -> int:
        return sum(vals.values()) * 100 // sum(requests[n] for n in vals)

    def recompute(vals: Mapping[str, int]) -> float:
        return utilization(vals) / target_utilization

    percent = utilization(values)
    # A missing pod is assumed at its request (or the target, if higher) when scaling down.
    fallback = max(100, target_utilization)
    replicas = _adjusted(current_replicas, percent / target_utilization, groups, dict(values),
                         lambda n: fallback * requests[n] // 100, recompute, tolerance)
    return replicas, percent, _average(values)


# --- behavior ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    type: str  # "Pods" or "Percent"
    value: int
    period_seconds: int


@dataclass(frozen=True)
class Rules:
    stabilization_window_seconds: int
    select_policy: str = "Max"
    policies: tuple[Policy, ...] = ()
    tolerance: float = DEFAULT_TOLERANCE


DEFAULT_SCALE_UP = Rules(0, "Max", (Policy("Percent", 100, 15), Policy("Pods", 4, 15)))
DEFAULT_SCALE_DOWN = Rules(300, "Max", (Policy("Percent", 100, 15),))


@dataclass
class ScaleEvent:
    change: int
    time: float
    outdated: bool = False


@dataclass
class Recommendation:
    replicas: int
    time: float


@dataclass
class History:
    """What the controller remembers of one HPA between syncs (Kubernetes keeps the same in
    memory): recent recommendations and recent scale events in each direction."""

    recommendations: list[Recommendation] = field(default_factory=list)
    up_events: list[ScaleEvent] = field(default_factory=list)
    down_events: list[ScaleEvent] = field(default_factory=list)


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str


def stabilize(history: History, now: float, current: int, desired: int, up: Rules, down: Rules) -> tuple[int, str, str]:
    """The stabilized recommendation; records ``desired`` in the history."""
    up_cutoff = now - up.stabilization_window_seconds
    down_cutoff = now - down.stabilization_window_seconds
    up_rec = down_rec = desired
    old_index: int | None = None
    for i, rec in enumerate(history.recommendations):
        if rec.time > up_cutoff:
            up_rec = min(rec.replicas, up_rec)
        if rec.time > down_cutoff:
            down_rec = max(rec.replicas, down_rec)
        if rec.time < up_cutoff and rec.time < down_cutoff:
            old_index = i
    recommendation = current
    if recommendation < up_rec:
        recommendation = up_rec
    if recommendation > down_rec:
        recommendation = down_rec
    if old_index is not None:
        history.recommendations[old_index] = Recommendation(desired, now)
    else:
        history.recommendations.append(Recommendation(desired, now))
    if desired >= current:
        return (recommendation, "ScaleUpStabilized",
                "recent recommendations were lower than current one, applying the lowest recent recommendation")
    return (recommendation, "ScaleDownStabilized",
            "recent recommendations were higher than current one, applying the highest recent recommendation")


def _change_in_period(period: int, events: Iterable[ScaleEvent], now: float) -> int:
    cutoff = now - period
    return sum(e.change for e in events if e.time > cutoff)


def _policy_limit(current: int, history: History, rules: Rules, now: float, up: bool) -> int:
    """The replica count the rules' policies allow (Kubernetes' calculateScaleUpLimitWithScalingRules
    and calculateScaleDownLimitWithBehaviors): each policy's change from the count at the start
    of its period, the biggest change (``Max``) or the smallest (``Min``) of them."""
    if rules.select_policy == "Disabled":
        return current
    # For scaling down the biggest change is the lowest count.
    biggest = max if up else min
    pick = (min if biggest is max else max) if rules.select_policy == "Min" else biggest
    result: int | None = None
    for p in rules.policies:
        start = (current - _change_in_period(p.period_seconds, history.up_events, now)
                 + _change_in_period(p.period_seconds, history.down_events, now))
        if p.type == "Pods":
            proposed = start + p.value if up else start - p.value
        elif up:
            proposed = math.ceil(start * (1 + p.value / 100))
        else:
            proposed = int(start * (1 - p.value / 100))
        result = proposed if result is None else pick(result, proposed)
    return current if result is None else result


def scale_up_limit(current: int, history: History, rules: Rules, now: float) -> int:
    return _policy_limit(current, history, rules, now, up=True)


def scale_down_limit(current: int, history: History, rules: Rules, now: float) -> int:
    return _policy_limit(current, history, rules, now, up=False)


def limit_by_rate(
    history: History, now: float, current: int, desired: int, min_replicas: int, max_replicas: int,
    up: Rules, down: Rules,
) -> tuple[int, str, str]:
    if desired > current:
        limit = max(scale_up_limit(current, history, up, now), current)
        if max_replicas > limit:
            allowed, reason, message = (limit, "ScaleUpLimit",
                                        "the desired replica count is increasing faster than the maximum scale rate")
        else:
            allowed, reason, message = (max_replicas, "TooManyReplicas",
                                        "the desired replica count is more than the maximum replica count")
        if desired > allowed:
            return allowed, reason, message
    elif desired < current:
        limit = min(scale_down_limit(current, history, down, now), current)
        if min_replicas < limit:
            allowed, reason, message = (limit, "ScaleDownLimit",
                                        "the desired replica count is decreasing faster than the maximum scale rate")
        else:
            allowed, reason, message = (min_replicas, "TooFewReplicas",
                                        "the desired replica count is less than the minimum replica count")
        if desired < allowed:
            return allowed, reason, message
    return desired, "DesiredWithinRange", "the desired count is within the acceptable range"


def normalize(
    history: History, now: float, current: int, desired: int, min_replicas: int, max_replicas: int,
    up: Rules, down: Rules,
) -> tuple[int, list[Condition]]:
    """Stabilize, then rate-limit and bound ``desired``; returns the replica count and the
    AbleToScale and ScalingLimited conditions that explain it."""
    stabilized, reason, message = stabilize(history, now, current, desired, up, down)
    conditions = []
    if stabilized != desired:
        conditions.append(Condition("AbleToScale", "True", reason, message))
    else:
        conditions.append(Condition("AbleToScale", "True", "ReadyForNewScale",
                                    "recommended size matches current size"))
    final, reason, message = limit_by_rate(history, now, current, stabilized, min_replicas, max_replicas, up, down)
    conditions.append(Condition("ScalingLimited", "True" if final != stabilized else "False", reason, message))
    return final, conditions


def record_scale(history: History, now: float, previous: int, new: int, up: Rules, down: Rules) -> None:
    """Remember a rescale so that the policies' periods can count it."""
    if new == previous:
        return
    if new > previous:
        events, rules, change = history.up_events, up, new - previous
    else:
        events, rules, change = history.down_events, down, previous - new
    longest = max((p.period_seconds for p in rules.policies), default=0)
    for e in events:
        if e.time <= now - longest:
            e.outdated = True
    for i, e in enumerate(events):
        if e.outdated:
            events[i] = ScaleEvent(change, now)
            break
    else:
        events.append(ScaleEvent(change, now))
