"""A Job's podFailurePolicy: its defaults and validation, as Kubernetes'."""

from __future__ import annotations

from test_validation import build, job, messages, template

from gpufleet.api import k8s


def with_rules(*rules: dict, restart: str = "Never") -> dict:
    return job(template=template(restartPolicy=restart), podFailurePolicy={"rules": list(rules)})


def test_an_ignore_rule_for_disruptions_is_valid_and_its_status_defaults_to_true() -> None:
    manifest = with_rules({"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                          {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}})
    assert messages(k8s.Job, manifest) == []
    policy = build(k8s.Job, manifest).spec.pod_failure_policy
    assert policy.rules[0].on_pod_conditions[0].status == "True"


def test_bad_rules_name_the_field() -> None:
    manifest = with_rules(
        {"action": "Retry", "onPodConditions": [{"type": "DisruptionTarget", "status": "Maybe"}]},
        {"action": "Ignore"},
        {"action": "Count", "onExitCodes": {"operator": "In", "values": [0, 3, 3], "containerName": "nope"}},
        restart="OnFailure")
    assert messages(k8s.Job, manifest) == [
        'spec.template.spec.restartPolicy: Invalid value: "OnFailure": only "Never" is supported when '
        'podFailurePolicy is specified',
        'spec.podFailurePolicy.rules[0].action: Unsupported value: "Retry": supported values: "Count", '
        '"FailIndex", "FailJob", "Ignore"',
        'spec.podFailurePolicy.rules[0].onPodConditions[0].status: Unsupported value: "Maybe": supported values: '
        '"False", "True", "Unknown"',
        "spec.podFailurePolicy.rules[1]: Required value: specifying one of OnExitCodes and OnPodConditions is "
        "required",
        "spec.podFailurePolicy.rules[2].onExitCodes.values[0]: Invalid value: 0: must not be 0 for the In operator",
        "spec.podFailurePolicy.rules[2].onExitCodes.values[2]: Invalid value: 3: must be ordered and without "
        "duplicates",
        'spec.podFailurePolicy.rules[2].onExitCodes.containerName: Invalid value: "nope": must be one of the '
        "container or initContainer names in the pod template",
    ]
