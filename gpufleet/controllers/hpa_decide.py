"""An HPA's sync as decisions: what was observed (the target's scale, its pods, each metric's
samples or why they could not be read) and the time in; the replica count to set, the
conditions, Events and status out.

``decide_hpa`` decides the rescale (the arithmetic is ``hpa_algorithm``); ``finish_hpa``,
given how setting the scale went, gives the Actions (Events and the status) to apply.
Neither touches the API; the controller remembers ``History`` between syncs, and a
decision hands back the new one.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api.quantity import parse_quantity
from gpufleet.api.selectors import SelectorError, parse_label_selector
from gpufleet.client import objects
from gpufleet.client.events import NORMAL, WARNING
from gpufleet.controllers import hpa_algorithm as algo
from gpufleet.controllers._common import set_condition, status_dict
from gpufleet.controllers.actions import Actions, Event


class MetricsError(Exception):
    """A metric could not be read."""


def _milli(q: Any) -> int:
    return int(parse_quantity(q) * 1000)


def _quantity_text(milli: int) -> str:
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"


def _rules(r: Any, default: algo.Rules) -> algo.Rules:
    if r is None:
        return default
    policies = tuple(algo.Policy(p.type, p.value, p.period_seconds) for p in (r.policies or [])) \
        if r.policies is not None else default.policies
    tolerance = float(parse_quantity(r.tolerance)) if r.tolerance is not None else default.tolerance
    return algo.Rules(
        r.stabilization_window_seconds if r.stabilization_window_seconds is not None
        else default.stabilization_window_seconds,
        r.select_policy or default.select_policy, policies, tolerance)


def behavior_rules(hpa: Any) -> tuple[algo.Rules, algo.Rules]:
    behavior = hpa.spec.behavior
    return (_rules(behavior.scale_up if behavior is not None else None, algo.DEFAULT_SCALE_UP),
            _rules(behavior.scale_down if behavior is not None else None, algo.DEFAULT_SCALE_DOWN))


def min_replicas(hpa: Any) -> int:
    return hpa.spec.min_replicas if hpa.spec.min_replicas is not None else 1


def scale_replicas(scale: Mapping[str, Any]) -> tuple[int, int, str]:
    """The target's scale: spec replicas, current replicas and the pods' selector."""
    return ((scale.get("spec") or {}).get("replicas") or 0, (scale.get("status") or {}).get("replicas") or 0,
            (scale.get("status") or {}).get("selector") or "")


def needs_metrics(hpa: Any, scale: Mapping[str, Any]) -> bool:
    """Whether the metrics decide (the target has replicas and is within the bounds)."""
    spec_replicas, current, _ = scale_replicas(scale)
    if spec_replicas == 0 and (min_replicas(hpa) != 0 or current == 0):
        return False
    return min_replicas(hpa) <= current <= hpa.spec.max_replicas


def selector_of(scale: Mapping[str, Any]) -> tuple[Any, str]:
    """The scale's pod selector, or None and why it is not one."""
    text = scale_replicas(scale)[2]
    if not text:
        return None, ""
    try:
        return parse_label_selector(text), ""
    except SelectorError as exc:
        return None, str(exc)


@dataclass
class HpaObserved:
    """One look at an HPA: its target's scale (None and ``scale_error`` when unreadable), and
    when the metrics decide, the target's pods (``infos``: as the calculator sees them) and
    per metric its samples or the error text reading them."""

    hpa: Any
    scale: dict[str, Any] | None
    now: float
    now_text: str
    scale_error: str = ""
    infos: Sequence[algo.PodInfo] = ()
    samples: Sequence[dict[str, algo.Sample] | str] = ()


@dataclass
class Proposal:
    replicas: int
    name: str
    status: dict[str, Any]


@dataclass
class HpaDecision:
    """The rescale decided (``scale_to``, None to leave the target) and what the status will
    say; ``history``: what to remember for the next sync."""

    conditions: list[dict[str, Any]]
    current: int
    desired: int
    metric_statuses: list[dict[str, Any]] | None
    history: algo.History
    events: list[Event] = field(default_factory=list)
    scale_to: int | None = None
    rescale_reason: str = ""
    reason: str = ""


def metric_proposal(m: Any, samples: dict[str, algo.Sample], current: int, infos: Sequence[algo.PodInfo],
                    now: float, tolerance: algo.Tolerance, readiness: Mapping[str, float]) -> Proposal:
    """The replica count one metric proposes from its samples (raises ReplicaCalcError)."""
    if m.type == "Resource" and m.resource is not None:
        res = m.resource.name
        target = m.resource.target
        if target.type == "Utilization" and target.average_utilization is not None:
            replicas, percent, average = algo.utilization_replicas(
                current, target.average_utilization, res, infos, samples, now, tolerance=tolerance, **readiness)
            st = {"type": "Resource", "resource": {"name": res, "current": {
                "averageUtilization": percent, "averageValue": _quantity_text(average)}}}
            return Proposal(replicas, f"{res} resource utilization (percentage of request)", st)
        replicas, average = algo.plain_metric_replicas(
            current, _milli(target.average_value), infos, samples, now, resource=res, tolerance=tolerance,
            **readiness)
        st = {"type": "Resource", "resource": {"name": res, "current": {"averageValue": _quantity_text(average)}}}
        return Proposal(replicas, f"{res} resource", st)
    name = m.pods.metric.name
    replicas, average = algo.plain_metric_replicas(
        current, _milli(m.pods.target.average_value), infos, samples, now, tolerance=tolerance)
    st = {"type": "Pods", "pods": {"metric": {"name": name}, "current": {"averageValue": _quantity_text(average)}}}
    return Proposal(replicas, f"pods metric {name}", st)


def _best_proposal(obs: HpaObserved, current: int, spec_replicas: int, conditions: list[dict[str, Any]],
                   events: list[Event], readiness: Mapping[str, float],
                   up: algo.Rules, down: algo.Rules) -> tuple[Proposal | None, list[dict[str, Any]], str, str]:
    """The largest proposal of the metrics; or None, the metric statuses, and what failed."""
    now_str = obs.now_text
    selector, invalid = selector_of(obs.scale or {})
    if selector is None and not invalid:
        set_condition(conditions, "ScalingActive", "False", "InvalidSelector",
                      "the HPA target's scale is missing a selector", now_str)
        return None, [], "invalid selector", "the target's scale has no selector"
    if selector is None:
        set_condition(conditions, "ScalingActive", "False", "InvalidSelector",
                      f"couldn't convert selector into a corresponding internal selector object: {invalid}", now_str)
        return None, [], "invalid selector", invalid
    metrics = obs.hpa.spec.metrics or []
    tolerance = algo.Tolerance(down=down.tolerance, up=up.tolerance)
    best: Proposal | None = None
    statuses: list[dict[str, Any]] = []
    errors: list[str] = []
    first_failure: tuple[str, str] | None = None
    for m, samples in zip(metrics, obs.samples, strict=True):
        try:
            if isinstance(samples, str):
                raise MetricsError(samples)
            proposal = metric_proposal(m, samples, current, obs.infos, obs.now, tolerance, readiness)
        except (MetricsError, algo.ReplicaCalcError) as exc:
            reason = f"FailedGet{m.type}Metric"
            errors.append(str(exc))
            first_failure = first_failure or (reason, f"the HPA was unable to compute the replica count: {exc}")
            events.append(Event(WARNING, reason, str(exc)))
            # Kept in place (empty, as Kubernetes leaves it) so statuses line up with metrics.
            statuses.append({"type": ""})
            continue
        statuses.append(proposal.status)
        if best is None or proposal.replicas > best.replicas:
            best = proposal
    # As Kubernetes: all metrics failed, or some failed and the others say scale down
    # (below the target's spec): nothing is changed.
    if best is None or (errors and best.replicas < spec_replicas):
        assert first_failure is not None
        set_condition(conditions, "ScalingActive", "False", first_failure[0], first_failure[1], now_str)
        return None, statuses, f"{len(errors)} invalid out of {len(metrics)}", errors[0]
    set_condition(conditions, "ScalingActive", "True", "ValidMetricFound",
                  f"the HPA was able to successfully calculate a replica count from {best.name}", now_str)
    return best, statuses, "", ""


def decide_hpa(obs: HpaObserved, history: algo.History, readiness: Mapping[str, float]) -> HpaDecision:
    """The rescale of the HPA's target, as Kubernetes' horizontal.go decides it."""
    hpa, now_str = obs.hpa, obs.now_text
    spec = hpa.spec
    status = status_dict(hpa)
    conditions = [dict(c) for c in status.get("conditions") or []]
    history = copy.deepcopy(history)
    up, down = behavior_rules(hpa)
    if obs.scale is None:
        msg = f"the HPA controller was unable to get the target's current scale: {obs.scale_error}"
        set_condition(conditions, "AbleToScale", "False", "FailedGetScale", msg, now_str)
        return HpaDecision(conditions, status.get("currentReplicas") or 0, status.get("desiredReplicas") or 0,
                           status.get("currentMetrics"), history,
                           [Event(WARNING, "FailedGetScale", obs.scale_error)], reason="FailedGetScale")
    set_condition(conditions, "AbleToScale", "True", "SucceededGetScale",
                  "the HPA controller was able to get the target's current scale", now_str)
    spec_replicas, current, _ = scale_replicas(obs.scale)
    metric_statuses: list[dict[str, Any]] | None = status.get("currentMetrics")
    if spec_replicas == 0 and min_replicas(hpa) != 0:
        set_condition(conditions, "ScalingActive", "False", "ScalingDisabled",
                      "scaling is disabled since the replica count of the target is zero", now_str)
        return HpaDecision(conditions, current, 0, metric_statuses, history, reason="ScalingDisabled")
    if spec_replicas == 0 and current == 0:
        # Scaled to zero (minReplicas 0): no pod to measure. The gateway brings the first
        # replica back when a request comes (Kubernetes would need an Object or External
        # metric here).
        set_condition(conditions, "ScalingActive", "False", "ScaledToZero",
                      "the target has no replicas; a request through the gateway scales it up", now_str)
        return HpaDecision(conditions, 0, 0, None, history, reason="ScaledToZero")
    events: list[Event] = []
    rescale_reason = ""
    if current > spec.max_replicas:
        desired, rescale_reason = spec.max_replicas, "Current number of replicas above Spec.MaxReplicas"
    elif current < min_replicas(hpa):
        desired, rescale_reason = min_replicas(hpa), "Current number of replicas below Spec.MinReplicas"
    else:
        proposal, metric_statuses, invalid, error = _best_proposal(
            obs, current, spec_replicas, conditions, events, readiness, up, down)
        if proposal is None:
            events.append(Event(WARNING, "FailedComputeMetricsReplicas",
                                f"invalid metrics ({invalid}), first error is: {error}"))
            return HpaDecision(conditions, current, status.get("desiredReplicas") or current, metric_statuses,
                               history, events, reason="FailedComputeMetricsReplicas")
        desired = proposal.replicas
        if desired > current:
            rescale_reason = f"{proposal.name} above target"
        elif desired < current:
            rescale_reason = "All metrics below target"
        desired, conds = algo.normalize(history, obs.now, current, desired, min_replicas(hpa), spec.max_replicas,
                                        up, down)
        for c in conds:
            set_condition(conditions, c.type, c.status, c.reason, c.message, now_str)
    scale_to = desired if desired != current and desired != spec_replicas else None
    return HpaDecision(conditions, current, desired, metric_statuses, history, events, scale_to, rescale_reason,
                       reason="Rescale" if scale_to is not None else "Hold")


def finish_hpa(obs: HpaObserved, decision: HpaDecision, scale_error: str | None = None) -> Actions:
    """The Events and status once the scale was set (``scale_error``: why it could not be);
    a rescale done is remembered in ``decision.history``."""
    hpa, now_str = obs.hpa, obs.now_text
    conditions = decision.conditions
    events = list(decision.events)
    last_scale = None
    if decision.scale_to is not None:
        desired = decision.scale_to
        if scale_error is not None:
            set_condition(conditions, "AbleToScale", "False", "FailedUpdateScale",
                          f"the HPA controller was unable to update the target scale: {scale_error}", now_str)
            events.append(Event(WARNING, "FailedRescale",
                                f"New size: {desired}; reason: {decision.rescale_reason}; error: {scale_error}"))
        else:
            set_condition(conditions, "AbleToScale", "True", "SucceededRescale",
                          f"the HPA controller was able to update the target scale to {desired}", now_str)
            events.append(Event(NORMAL, "SuccessfulRescale",
                                f"New size: {desired}; reason: {decision.rescale_reason}"))
            up, down = behavior_rules(hpa)
            algo.record_scale(decision.history, obs.now, decision.current, desired, up, down)
            last_scale = now_str
    status = status_dict(hpa)
    new: dict[str, Any] = {}
    if conditions:
        order = {"AbleToScale": 0, "ScalingActive": 1, "ScalingLimited": 2}
        new["conditions"] = sorted(conditions, key=lambda c: order.get(c.get("type", ""), 9))
    if decision.metric_statuses:
        new["currentMetrics"] = decision.metric_statuses
    new["currentReplicas"] = decision.current
    new["desiredReplicas"] = decision.desired
    last = last_scale or status.get("lastScaleTime")
    if last:
        new["lastScaleTime"] = last
    new["observedGeneration"] = objects.meta(hpa, "generation") or 1
    return Actions(events=events, status=new if new != status else None, reason=decision.reason)
