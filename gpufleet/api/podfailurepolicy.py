"""A Job's ``podFailurePolicy``, as Kubernetes' job controller reads it (pod_failure_policy.go):
which rule a failed pod matches, what that rule does to the Job, and the message it leaves.

Rules are read in order; the first that matches decides: ``FailJob`` fails the Job (reason
PodFailurePolicy, the message naming the pod and the rule), ``Ignore`` does not count the
failure against ``backoffLimit`` (the pod is replaced), ``Count`` counts it as usual. A pod
no rule matches is counted. ``onExitCodes`` matches a container (of ``containerName`` when
given, else any; init containers after the others) that terminated with a non-zero code In
or NotIn the values; ``onPodConditions`` matches a pod condition of that type and status
(``True`` when not given). ``FailIndex`` needs backoffLimitPerIndex, which gpufleet does
not implement: such a rule counts the failure.

Rules only judge pods in phase Failed. The node agent marks a pod whose GPU failed with
condition DisruptionTarget (reason GPUUnhealthy), so
``{action: Ignore, onPodConditions: [{type: DisruptionTarget}]}`` lets a Job move off a
failed GPU without spending its backoffLimit, as it does for Kubernetes' own disruptions.
"""

from __future__ import annotations

from typing import Any

FAIL_JOB, FAIL_INDEX, IGNORE, COUNT = "FailJob", "FailIndex", "Ignore", "Count"
ACTIONS = (COUNT, FAIL_INDEX, FAIL_JOB, IGNORE)
OPERATORS = ("In", "NotIn")
POD_FAILURE_POLICY_REASON = "PodFailurePolicy"


def _statuses(pod: Any, attr: str) -> list[Any]:
    status = getattr(pod, "status", None)
    return list((getattr(status, attr, None) if status is not None else None) or [])


def _matching_container(statuses: list[Any], requirement: Any) -> Any:
    for cs in statuses:
        term = cs.state.terminated if cs.state is not None else None
        if term is None or not term.exit_code:
            continue
        if requirement.container_name is not None and requirement.container_name != cs.name:
            continue
        inside = term.exit_code in (requirement.values or [])
        if inside == (requirement.operator == "In"):
            return cs
    return None


def _matching_condition(pod: Any, patterns: list[Any]) -> Any:
    for cond in _statuses(pod, "conditions"):
        for pattern in patterns:
            if cond.type == pattern.type and cond.status == (pattern.status or "True"):
                return cond
    return None


def match(policy: Any, pod: Any) -> tuple[str | None, bool, str | None]:
    """For a Failed pod: (the FailJob message or None, whether the failure counts against
    backoffLimit, the action of the matching rule or None)."""
    ns = getattr(pod.metadata, "namespace", "") if pod.metadata is not None else ""
    name = getattr(pod.metadata, "name", "") if pod.metadata is not None else ""
    for index, rule in enumerate((policy.rules if policy is not None else None) or []):
        if rule.on_exit_codes is not None:
            cs = (_matching_container(_statuses(pod, "container_statuses"), rule.on_exit_codes)
                  or _matching_container(_statuses(pod, "init_container_statuses"), rule.on_exit_codes))
            if cs is None:
                continue
            what = (f"Container {cs.name} for pod {ns}/{name} failed with exit code {cs.state.terminated.exit_code} "
                    f"matching {rule.action} rule at index {index}")
        elif rule.on_pod_conditions:
            cond = _matching_condition(pod, rule.on_pod_conditions)
            if cond is None:
                continue
            what = f"Pod {ns}/{name} has condition {cond.type} matching {rule.action} rule at index {index}"
        else:
            continue
        if rule.action == FAIL_JOB:
            return what, True, FAIL_JOB
        if rule.action == IGNORE:
            return None, False, IGNORE
        if rule.action in (COUNT, FAIL_INDEX):
            return None, True, rule.action
    return None, True, None
