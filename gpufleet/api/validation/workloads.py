"""apps and batch: Deployment, ReplicaSet and Job."""

from __future__ import annotations

from typing import Any

from gpufleet.api import k8s, podfailurepolicy
from gpufleet.api.batch import CONTROLLER_UID_LABEL, LEGACY_CONTROLLER_UID_LABEL
from gpufleet.api.validation.containers import RESTART_POLICIES
from gpufleet.api.validation.core import (
    Errs,
    _immutable,
    _int_or_string,
    _nonneg,
    selector_is_empty,
    selector_matches,
    validate_label_selector,
    validate_object_meta,
)
from gpufleet.api.validation.errors import Unquoted, forbidden, go_quote, invalid, not_supported, required
from gpufleet.api.validation.names import _PERCENT_RE, is_valid_percent
from gpufleet.api.validation.pods import validate_pod_template


def _validate_int_or_percent(value: Any, path: str, errs: Errs) -> None:
    value = _int_or_string(value, path, errs)
    if isinstance(value, str):
        errs.extend(invalid(path, Unquoted(value), msg) for msg in is_valid_percent(value))
    elif isinstance(value, int):
        _nonneg(value, path, errs)


def _percent_value(value: Any) -> int | None:
    if isinstance(value, str) and _PERCENT_RE.fullmatch(value):
        return int(value[:-1])
    return None


def _not_more_than_100_percent(value: Any, path: str, errs: Errs) -> None:
    percent = _percent_value(value)
    if percent is not None and percent > 100:
        errs.append(invalid(path, Unquoted(value), "must not be greater than 100%"))


def _is_zero(value: Any) -> bool:
    return value == 0 or _percent_value(value) == 0


def _validate_template_for_controller(
    template: k8s.PodTemplateSpec | None,
    selector: k8s.LabelSelector | None,
    selector_usable: bool,
    path: str,
    errs: Errs,
    *,
    restart_policies: list[str],
) -> None:
    if template is None:
        errs.append(required(path))
        return
    labels = template.metadata.labels if template.metadata is not None else None
    if selector_usable and not selector_is_empty(selector) and not selector_matches(selector, labels):
        errs.append(
            invalid(
                f"{path}.metadata.labels", dict(labels or {}), "`selector` does not match template `labels`"
            )
        )
    validate_pod_template(template, path, errs)
    if template.spec is None:
        return
    restart = template.spec.restart_policy
    if restart is None and "Always" not in restart_policies:
        errs.append(
            required(
                f"{path}.spec.restartPolicy",
                "valid values: " + ", ".join(go_quote(p) for p in restart_policies),
            )
        )
    elif restart not in (None, "") and restart not in restart_policies:
        if restart in RESTART_POLICIES:  # otherwise the PodSpec check already said so
            errs.append(not_supported(f"{path}.spec.restartPolicy", restart, restart_policies))


def _validate_replicated_selector(selector: k8s.LabelSelector | None, path: str, errs: Errs) -> bool:
    if selector is None:
        errs.append(required(path))
        return False
    usable = validate_label_selector(selector, path, errs)
    if selector_is_empty(selector):
        errs.append(invalid(path, selector, "empty selector is invalid for deployment"))
    return usable


def _no_active_deadline(template: Any, errs: Errs) -> None:
    """A ReplicaSet's (and so a Deployment's) pods run for good: Kubernetes refuses a
    template activeDeadlineSeconds, with this wording for both kinds."""
    if template is not None and template.spec is not None and template.spec.active_deadline_seconds is not None:
        errs.append(invalid("spec.template.spec.activeDeadlineSeconds", template.spec.active_deadline_seconds,
                            "activeDeadlineSeconds in ReplicaSet is not Supported"))


def _validate_deployment(d: k8s.Deployment, errs: Errs) -> None:
    validate_object_meta(d.metadata, errs)
    spec = d.spec
    _nonneg(spec.replicas, "spec.replicas", errs)
    usable = _validate_replicated_selector(spec.selector, "spec.selector", errs)
    _validate_template_for_controller(
        spec.template, spec.selector, usable, "spec.template", errs, restart_policies=["Always"]
    )
    _no_active_deadline(spec.template, errs)
    strategy = spec.strategy
    if strategy is not None:
        if strategy.type == "Recreate":
            if strategy.rolling_update is not None:
                errs.append(
                    forbidden(
                        "spec.strategy.rollingUpdate",
                        "may not be specified when strategy `type` is 'Recreate'",
                    )
                )
        elif strategy.type in (None, "RollingUpdate"):
            ru = strategy.rolling_update
            if ru is not None:
                _validate_int_or_percent(
                    ru.max_unavailable, "spec.strategy.rollingUpdate.maxUnavailable", errs
                )
                _validate_int_or_percent(ru.max_surge, "spec.strategy.rollingUpdate.maxSurge", errs)
                # Unset means the 25% default, which is not zero.
                if (
                    ru.max_unavailable is not None
                    and ru.max_surge is not None
                    and _is_zero(ru.max_unavailable)
                    and _is_zero(ru.max_surge)
                ):
                    errs.append(
                        invalid(
                            "spec.strategy.rollingUpdate.maxUnavailable",
                            Unquoted(str(ru.max_unavailable)),
                            "may not be 0 when `maxSurge` is 0",
                        )
                    )
                _not_more_than_100_percent(
                    ru.max_unavailable, "spec.strategy.rollingUpdate.maxUnavailable", errs
                )
        else:
            errs.append(not_supported("spec.strategy.type", strategy.type, ["Recreate", "RollingUpdate"]))
    _nonneg(spec.min_ready_seconds, "spec.minReadySeconds", errs)
    _nonneg(spec.revision_history_limit, "spec.revisionHistoryLimit", errs)
    if spec.progress_deadline_seconds is not None:
        _nonneg(spec.progress_deadline_seconds, "spec.progressDeadlineSeconds", errs)
        if spec.progress_deadline_seconds <= (spec.min_ready_seconds or 0):
            errs.append(
                invalid(
                    "spec.progressDeadlineSeconds",
                    spec.progress_deadline_seconds,
                    "must be greater than minReadySeconds",
                )
            )


def _validate_replica_set(rs: k8s.ReplicaSet, errs: Errs) -> None:
    validate_object_meta(rs.metadata, errs)
    spec = rs.spec
    _nonneg(spec.replicas, "spec.replicas", errs)
    _nonneg(spec.min_ready_seconds, "spec.minReadySeconds", errs)
    usable = _validate_replicated_selector(spec.selector, "spec.selector", errs)
    _validate_template_for_controller(
        spec.template, spec.selector, usable, "spec.template", errs, restart_policies=["Always"]
    )
    _no_active_deadline(spec.template, errs)


def _validate_selector_immutable(new: Any, old: Any, errs: Errs) -> None:
    _immutable(new.spec.selector, old.spec.selector, "spec.selector", errs)


def _validate_job(job: k8s.Job, errs: Errs) -> None:
    validate_object_meta(job.metadata, errs)
    spec = job.spec
    if spec is None:
        errs.append(required("spec.template"))
        return
    _validate_generated_selector(job, errs)
    if spec.manual_selector and spec.selector is None:
        errs.append(required("spec.selector", "a Job with manualSelector: true must set its selector"))
    validate_job_spec(spec, "spec", errs)


def validate_job_spec(spec: k8s.JobSpec, path: str, errs: Errs) -> None:
    """What a Job's spec and a CronJob's jobTemplate.spec share (``path``: where it is)."""
    for attr, alias in (
        ("parallelism", "parallelism"),
        ("completions", "completions"),
        ("backoff_limit", "backoffLimit"),
        ("backoff_limit_per_index", "backoffLimitPerIndex"),
        ("max_failed_indexes", "maxFailedIndexes"),
        ("ttl_seconds_after_finished", "ttlSecondsAfterFinished"),
    ):
        _nonneg(getattr(spec, attr), f"{path}.{alias}", errs)
    if spec.active_deadline_seconds is not None and spec.active_deadline_seconds <= 0:
        # Kubernetes accepts 0, which fails the job the moment it starts; we reject it.
        errs.append(
            invalid(f"{path}.activeDeadlineSeconds", spec.active_deadline_seconds, "must be greater than zero")
        )
    if spec.completion_mode is not None:
        if spec.completion_mode not in ("NonIndexed", "Indexed"):
            errs.append(not_supported(f"{path}.completionMode", spec.completion_mode, ["NonIndexed", "Indexed"]))
        elif spec.completion_mode == "Indexed" and spec.completions is None:
            errs.append(required(f"{path}.completions", "when completion mode is Indexed"))
    if spec.backoff_limit_per_index is not None and spec.completion_mode != "Indexed":
        errs.append(
            required(f"{path}.completionMode", "when backoffLimitPerIndex is specified, must be Indexed")
        )
    usable = True
    if spec.selector is not None:
        usable = validate_label_selector(spec.selector, f"{path}.selector", errs)
    _validate_template_for_controller(
        spec.template, spec.selector, usable, f"{path}.template", errs, restart_policies=["OnFailure", "Never"]
    )
    if spec.pod_failure_policy is not None:
        _validate_pod_failure_policy(spec, path, errs)


def _validate_pod_failure_policy(spec: k8s.JobSpec, path: str, errs: Errs) -> None:
    """Kubernetes' validatePodFailurePolicy (the rules podfailurepolicy.match reads)."""
    policy, base = spec.pod_failure_policy, f"{path}.podFailurePolicy"
    tspec = spec.template.spec if spec.template is not None else None
    restart = tspec.restart_policy if tspec is not None else None
    if restart is not None and restart != "Never":
        errs.append(invalid(f"{path}.template.spec.restartPolicy", restart,
                            'only "Never" is supported when podFailurePolicy is specified'))
    if len(policy.rules) > 20:
        errs.append(invalid(f"{base}.rules", len(policy.rules), "must have at most 20 items"))
    names = {c.name for c in (tspec.containers if tspec is not None else None) or []}
    names |= {c.name for c in (tspec.init_containers if tspec is not None else None) or []}
    for i, rule in enumerate(policy.rules):
        rpath = f"{base}.rules[{i}]"
        if rule.action not in podfailurepolicy.ACTIONS:
            errs.append(not_supported(f"{rpath}.action", rule.action, list(podfailurepolicy.ACTIONS)))
        elif rule.action == podfailurepolicy.FAIL_INDEX and spec.backoff_limit_per_index is None:
            errs.append(invalid(f"{rpath}.action", rule.action, "valid only when backoffLimitPerIndex is set"))
        if rule.on_exit_codes is None and not rule.on_pod_conditions:
            errs.append(required(rpath, "specifying one of OnExitCodes and OnPodConditions is required"))
        elif rule.on_exit_codes is not None and rule.on_pod_conditions:
            errs.append(invalid(rpath, Unquoted("{...}"),
                                "specifying both OnExitCodes and OnPodConditions is not supported"))
        req = rule.on_exit_codes
        if req is not None:
            epath = f"{rpath}.onExitCodes"
            if req.operator not in podfailurepolicy.OPERATORS:
                errs.append(not_supported(f"{epath}.operator", req.operator, list(podfailurepolicy.OPERATORS)))
            if not req.values:
                errs.append(required(f"{epath}.values", "at least one value is required"))
            elif len(req.values) > 255:
                errs.append(invalid(f"{epath}.values", len(req.values), "must have at most 255 items"))
            for j, v in enumerate(req.values or []):
                if j and v <= req.values[j - 1]:
                    errs.append(invalid(f"{epath}.values[{j}]", v, "must be ordered and without duplicates"))
                if v == 0 and req.operator == "In":
                    errs.append(invalid(f"{epath}.values[{j}]", v, "must not be 0 for the In operator"))
            if req.container_name is not None and req.container_name not in names:
                errs.append(invalid(f"{epath}.containerName", req.container_name,
                                    "must be one of the container or initContainer names in the pod template"))
        for j, pattern in enumerate(rule.on_pod_conditions or []):
            cpath = f"{rpath}.onPodConditions[{j}]"
            if not pattern.type:
                errs.append(required(f"{cpath}.type"))
            if pattern.status not in (None, "True", "False", "Unknown"):
                errs.append(not_supported(f"{cpath}.status", pattern.status, ["False", "True", "Unknown"]))


def _validate_generated_selector(job: k8s.Job, errs: Errs) -> None:
    """Kubernetes' validateGeneratedSelector: without manualSelector the pod template carries
    this Job's uid under both controller-uid labels. Checked once the API server generated
    the selector (a Job stored without one, from before, keeps the selector it had: none)."""
    spec, uid = job.spec, (job.metadata.uid if job.metadata is not None else None)
    if spec is None or spec.manual_selector or spec.selector is None or not uid:
        return
    labels = (spec.template.metadata.labels if spec.template.metadata is not None else None) or {}
    for key in (LEGACY_CONTROLLER_UID_LABEL, CONTROLLER_UID_LABEL):
        path = f"spec.template.metadata.labels[{key}]"
        if key not in labels:
            errs.append(required(path, "the API server sets it unless manualSelector is true"))
        elif labels[key] != uid:
            errs.append(invalid(path, labels[key], f"must be '{uid}' (this Job's uid); set manualSelector: "
                                                   "true to choose the selector and labels yourself"))


def _without_scheduling_directives(template: k8s.PodTemplateSpec) -> k8s.PodTemplateSpec:
    meta = template.metadata.model_copy(update={"labels": None, "annotations": None}) if template.metadata else None
    spec = (template.spec.model_copy(update={"node_selector": None, "tolerations": None, "scheduling_gates": None})
            if template.spec else None)
    return template.model_copy(update={"metadata": meta, "spec": spec})


def _validate_job_update(new: k8s.Job, old: k8s.Job, errs: Errs) -> None:
    if new.spec is None or old.spec is None:
        return
    _immutable(new.spec.selector, old.spec.selector, "spec.selector", errs)
    if old.spec.suspend and new.spec.template is not None and old.spec.template is not None:
        # Kubernetes lets a queue steer a suspended Job before it starts (KEP-2926): the
        # template's node selector, tolerations, labels, annotations and scheduling gates.
        _immutable(_without_scheduling_directives(new.spec.template),
                   _without_scheduling_directives(old.spec.template), "spec.template", errs)
    else:
        _immutable(new.spec.template, old.spec.template, "spec.template", errs)
    _immutable(new.spec.completion_mode, old.spec.completion_mode, "spec.completionMode", errs)
    # An Indexed job may be resized when completions moves together with parallelism.
    elastic = new.spec.completion_mode == "Indexed" and new.spec.completions == new.spec.parallelism
    if not elastic:
        _immutable(new.spec.completions, old.spec.completions, "spec.completions", errs)
