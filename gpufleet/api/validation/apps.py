"""apps: StatefulSet, DaemonSet and ControllerRevision (Kubernetes' pkg/apis/apps/validation)."""

from __future__ import annotations

from typing import Any

from gpufleet.api import k8s
from gpufleet.api.validation.core import (
    Errs,
    _immutable,
    _nonneg,
    _semantic_equal,
    selector_is_empty,
    validate_label_selector,
    validate_object_meta,
)
from gpufleet.api.validation.errors import Unquoted, forbidden, invalid, not_supported, required
from gpufleet.api.validation.names import is_dns1123_label
from gpufleet.api.validation.storage import _validate_pvc_spec
from gpufleet.api.validation.workloads import (
    _is_zero,
    _not_more_than_100_percent,
    _validate_int_or_percent,
    _validate_template_for_controller,
)

POD_MANAGEMENT_POLICIES = ["OrderedReady", "Parallel"]
UPDATE_STRATEGIES = ["OnDelete", "RollingUpdate"]
RETENTION_POLICIES = ["Delete", "Retain"]
# What an update may change in a StatefulSet's spec (the rest is fixed at creation).
STATEFULSET_MUTABLE = ("replicas", "ordinals", "template", "updateStrategy",
                       "persistentVolumeClaimRetentionPolicy", "minReadySeconds")


def _selector(selector: k8s.LabelSelector | None, kind: str, errs: Errs) -> bool:
    if selector is None:
        errs.append(required("spec.selector"))
        return False
    usable = validate_label_selector(selector, "spec.selector", errs)
    if selector_is_empty(selector):
        errs.append(invalid("spec.selector", selector, f"empty selector is invalid for {kind}"))
    return usable


def _template(spec: Any, usable: bool, kind: str, errs: Errs) -> None:
    _validate_template_for_controller(spec.template, spec.selector, usable, "spec.template", errs,
                                      restart_policies=["Always"])
    template = spec.template
    if template is not None and template.spec is not None and template.spec.active_deadline_seconds is not None:
        errs.append(forbidden("spec.template.spec.activeDeadlineSeconds", f"activeDeadlineSeconds in {kind} is not "
                                                                          "Supported"))


def _validate_stateful_set(sts: k8s.StatefulSet, errs: Errs) -> None:
    validate_object_meta(sts.metadata, errs)
    spec = sts.spec
    policy = spec.pod_management_policy
    if not policy:
        errs.append(required("spec.podManagementPolicy"))
    elif policy not in POD_MANAGEMENT_POLICIES:
        errs.append(not_supported("spec.podManagementPolicy", policy, POD_MANAGEMENT_POLICIES))
    strategy = spec.update_strategy or k8s.StatefulSetUpdateStrategy()
    if not strategy.type:
        errs.append(required("spec.updateStrategy"))
    elif strategy.type == "OnDelete":
        if strategy.rolling_update is not None:
            errs.append(invalid("spec.updateStrategy.rollingUpdate", Unquoted("{...}"),
                                "only allowed for updateStrategy 'RollingUpdate'"))
    elif strategy.type == "RollingUpdate":
        ru = strategy.rolling_update
        if ru is not None:
            _nonneg(ru.partition, "spec.updateStrategy.rollingUpdate.partition", errs)
            if ru.max_unavailable is not None:
                path = "spec.updateStrategy.rollingUpdate.maxUnavailable"
                _validate_int_or_percent(ru.max_unavailable, path, errs)
                if _is_zero(ru.max_unavailable):
                    errs.append(invalid(path, Unquoted(str(ru.max_unavailable)), "must be greater than 0"))
                _not_more_than_100_percent(ru.max_unavailable, path, errs)
    else:
        errs.append(not_supported("spec.updateStrategy.type", strategy.type, UPDATE_STRATEGIES))
    retention = spec.persistent_volume_claim_retention_policy
    if retention is not None:
        for value, name in ((retention.when_deleted, "whenDeleted"), (retention.when_scaled, "whenScaled")):
            if value and value not in RETENTION_POLICIES:
                errs.append(not_supported(f"spec.persistentVolumeClaimRetentionPolicy.{name}", value,
                                          RETENTION_POLICIES))
    _nonneg(spec.replicas, "spec.replicas", errs)
    _nonneg(spec.min_ready_seconds, "spec.minReadySeconds", errs)
    _nonneg(spec.revision_history_limit, "spec.revisionHistoryLimit", errs)
    if spec.ordinals is not None:
        _nonneg(spec.ordinals.start, "spec.ordinals.start", errs)
    if spec.service_name:
        errs.extend(invalid("spec.serviceName", spec.service_name, msg) for msg in is_dns1123_label(spec.service_name))
    names: set[str] = set()
    for i, claim in enumerate(spec.volume_claim_templates or []):
        path = f"spec.volumeClaimTemplates[{i}]"
        name = claim.metadata.name if claim.metadata is not None else None
        if not name:
            errs.append(required(f"{path}.metadata.name", "name or generateName is required"))
        else:
            errs.extend(invalid(f"{path}.metadata.name", name, msg) for msg in is_dns1123_label(name))
            if name in names:
                errs.append(invalid(f"{path}.metadata.name", name, "a volumeClaimTemplate of this name exists"))
            names.add(name)
        _validate_pvc_spec(claim.spec or k8s.PersistentVolumeClaimSpec(), f"{path}.spec", errs)
    usable = _selector(spec.selector, "statefulset", errs)
    # The pods mount their claims under the templates' names: validate the template as the
    # pods will be, with those volumes.
    checked = spec
    if spec.volume_claim_templates and spec.template is not None and spec.template.spec is not None:
        checked = spec.model_copy(deep=True)
        claims = [k8s.Volume(name=n, persistent_volume_claim=k8s.PersistentVolumeClaimVolumeSource(claim_name=n))
                  for n in names]
        checked.template.spec.volumes = [*(v for v in checked.template.spec.volumes or [] if v.name not in names),
                                         *claims]
    _template(checked, usable, "StatefulSet", errs)


def _validate_stateful_set_update(new: k8s.StatefulSet, old: k8s.StatefulSet, errs: Errs) -> None:
    a = {k: v for k, v in new.spec.to_dict().items() if k not in STATEFULSET_MUTABLE}
    b = {k: v for k, v in old.spec.to_dict().items() if k not in STATEFULSET_MUTABLE}
    if not _semantic_equal(a, b):
        errs.append(forbidden("spec", "updates to statefulset spec for fields other than 'replicas', 'ordinals', "
                                      "'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and "
                                      "'minReadySeconds' are forbidden"))


def _validate_daemon_set(ds: k8s.DaemonSet, errs: Errs) -> None:
    validate_object_meta(ds.metadata, errs)
    spec = ds.spec
    usable = _selector(spec.selector, "daemonset", errs)
    _template(spec, usable, "DaemonSet", errs)
    _nonneg(spec.min_ready_seconds, "spec.minReadySeconds", errs)
    _nonneg(spec.revision_history_limit, "spec.revisionHistoryLimit", errs)
    strategy = spec.update_strategy or k8s.DaemonSetUpdateStrategy()
    if not strategy.type:
        errs.append(required("spec.updateStrategy.type"))
    elif strategy.type == "RollingUpdate":
        ru = strategy.rolling_update
        if ru is None:
            errs.append(required("spec.updateStrategy.rollingUpdate"))
            return
        unavailable = "spec.updateStrategy.rollingUpdate.maxUnavailable"
        surge = "spec.updateStrategy.rollingUpdate.maxSurge"
        _validate_int_or_percent(ru.max_unavailable, unavailable, errs)
        _validate_int_or_percent(ru.max_surge, surge, errs)
        if _is_zero(ru.max_unavailable or 0) and _is_zero(ru.max_surge or 0):
            errs.append(invalid(unavailable, Unquoted(str(ru.max_unavailable or 0)),
                                "may not be 0 when `maxSurge` is 0"))
        _not_more_than_100_percent(ru.max_unavailable, unavailable, errs)
        _not_more_than_100_percent(ru.max_surge, surge, errs)
    elif strategy.type == "OnDelete":
        if strategy.rolling_update is not None:
            errs.append(forbidden("spec.updateStrategy.rollingUpdate",
                                  "may not be specified when strategy `type` is 'OnDelete'"))
    else:
        errs.append(not_supported("spec.updateStrategy.type", strategy.type, UPDATE_STRATEGIES))


def _validate_daemon_set_update(new: k8s.DaemonSet, old: k8s.DaemonSet, errs: Errs) -> None:
    _immutable(new.spec.selector, old.spec.selector, "spec.selector", errs)


def _validate_controller_revision(rev: k8s.ControllerRevision, errs: Errs) -> None:
    validate_object_meta(rev.metadata, errs)
    if rev.data is None:
        errs.append(required("data"))
    _nonneg(rev.revision, "revision", errs)


def _validate_controller_revision_update(new: k8s.ControllerRevision, old: k8s.ControllerRevision,
                                         errs: Errs) -> None:
    _immutable(new.data, old.data, "data", errs)
