"""Pod rules: tolerations, affinity, topology spread, the pod spec and template, pod updates."""

from __future__ import annotations

from typing import Any

from gpufleet.api import k8s
from gpufleet.api.validation.containers import (
    DNS_POLICIES,
    PREEMPTION_POLICIES,
    RESTART_POLICIES,
    TAINT_EFFECTS,
    TOLERATION_OPERATORS,
    UNSATISFIABLE_CONSTRAINT_ACTIONS,
    _validate_container,
    _validate_host_port_conflicts,
    _validate_probes_and_lifecycle,
    _validate_volumes,
)
from gpufleet.api.validation.core import (
    Errs,
    _diff,
    _enum,
    _names,
    _normalized,
    validate_annotations,
    validate_label_selector,
    validate_labels,
    validate_object_meta,
)
from gpufleet.api.validation.errors import duplicate, forbidden, invalid, not_supported, required
from gpufleet.api.validation.names import (
    MAX_INT32,
    inclusive_range_error,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_label_value,
    is_qualified_name,
)


def validate_tolerations(tolerations: list[k8s.Toleration] | None, path: str, errs: Errs) -> None:
    for i, t in enumerate(tolerations or []):
        p = f"{path}[{i}]"
        if t.key:
            _names(t.key, f"{p}.key", is_qualified_name, errs)
        if not t.key and t.operator != "Exists":
            errs.append(
                invalid(
                    f"{p}.operator",
                    t.operator or "",
                    'operator must be Exists when `key` is empty, which means "match all values and all keys"',
                )
            )
        if t.toleration_seconds is not None and t.effect != "NoExecute":
            errs.append(
                invalid(
                    f"{p}.effect",
                    t.effect or "",
                    "effect must be 'NoExecute' when `tolerationSeconds` is set",
                )
            )
        if t.operator in (None, "", "Equal"):
            msgs = is_label_value(t.value or "")
            if msgs:
                errs.append(invalid(f"{p}.operator", t.value, ";".join(msgs)))
        elif t.operator == "Exists":
            if t.value:
                errs.append(
                    invalid(f"{p}.operator", t.value, "value must be empty when `operator` is 'Exists'")
                )
        else:
            errs.append(not_supported(f"{p}.operator", t.operator, TOLERATION_OPERATORS))
        if t.effect:
            _validate_taint_effect(t.effect, f"{p}.effect", errs)


def _validate_taint_effect(effect: str | None, path: str, errs: Errs) -> None:
    if not effect:
        errs.append(required(path))
    elif effect not in TAINT_EFFECTS:
        errs.append(not_supported(path, effect, TAINT_EFFECTS))


def _validate_node_selector_requirement(req: Any, path: str, errs: Errs) -> None:
    if req.operator in ("In", "NotIn"):
        if not req.values:
            errs.append(required(f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
    elif req.operator in ("Exists", "DoesNotExist"):
        if req.values:
            errs.append(
                forbidden(
                    f"{path}.values", "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                )
            )
    elif req.operator in ("Gt", "Lt"):
        if len(req.values or []) != 1:
            errs.append(
                required(f"{path}.values", "must be specified single value when `operator` is 'Lt' or 'Gt'")
            )
    else:
        errs.append(invalid(f"{path}.operator", req.operator, "not a valid selector operator"))
    _names(req.key, f"{path}.key", is_qualified_name, errs)


def _validate_affinity(affinity: k8s.Affinity | None, path: str, errs: Errs) -> None:
    if affinity is None:
        return
    node = affinity.node_affinity
    if node is not None:
        np = f"{path}.nodeAffinity"
        req = node.required_during_scheduling_ignored_during_execution
        if req is not None:
            tp = f"{np}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
            if not req.node_selector_terms:
                errs.append(required(tp, "must have at least one node selector term"))
            for i, term in enumerate(req.node_selector_terms):
                for j, r in enumerate(term.match_expressions or []):
                    _validate_node_selector_requirement(r, f"{tp}[{i}].matchExpressions[{j}]", errs)
        for i, pref in enumerate(node.preferred_during_scheduling_ignored_during_execution or []):
            pp = f"{np}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
            if not 1 <= pref.weight <= 100:
                errs.append(invalid(f"{pp}.weight", pref.weight, "must be in the range 1-100"))
            for j, r in enumerate(pref.preference.match_expressions or []):
                _validate_node_selector_requirement(r, f"{pp}.preference.matchExpressions[{j}]", errs)
    for attr, alias in (("pod_affinity", "podAffinity"), ("pod_anti_affinity", "podAntiAffinity")):
        pa = getattr(affinity, attr)
        if pa is None:
            continue
        ap = f"{path}.{alias}"
        for i, term in enumerate(pa.required_during_scheduling_ignored_during_execution or []):
            _validate_pod_affinity_term(
                term, f"{ap}.requiredDuringSchedulingIgnoredDuringExecution[{i}]", errs
            )
        for i, weighted in enumerate(pa.preferred_during_scheduling_ignored_during_execution or []):
            wp = f"{ap}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
            if not 1 <= weighted.weight <= 100:
                errs.append(invalid(f"{wp}.weight", weighted.weight, "must be in the range 1-100"))
            _validate_pod_affinity_term(weighted.pod_affinity_term, f"{wp}.podAffinityTerm", errs)


def _validate_pod_affinity_term(term: k8s.PodAffinityTerm, path: str, errs: Errs) -> None:
    validate_label_selector(term.label_selector, f"{path}.labelSelector", errs)
    validate_label_selector(term.namespace_selector, f"{path}.namespaceSelector", errs)
    for name in term.namespaces or []:
        _names(name, f"{path}.namespace", is_dns1123_label, errs)
    if not term.topology_key:
        errs.append(required(f"{path}.topologyKey", "can not be empty"))
    _names(term.topology_key, f"{path}.topologyKey", is_qualified_name, errs)


def _validate_topology_spread(
    constraints: list[k8s.TopologySpreadConstraint] | None, path: str, errs: Errs
) -> None:
    for i, c in enumerate(constraints or []):
        p = f"{path}[{i}]"
        if c.max_skew <= 0:
            errs.append(invalid(f"{p}.maxSkew", c.max_skew, "must be greater than zero"))
        if not c.topology_key:
            errs.append(required(f"{p}.topologyKey", "can not be empty"))
        else:
            _names(c.topology_key, f"{p}.topologyKey", is_qualified_name, errs)
        if c.when_unsatisfiable not in UNSATISFIABLE_CONSTRAINT_ACTIONS:
            errs.append(
                not_supported(
                    f"{p}.whenUnsatisfiable", c.when_unsatisfiable, UNSATISFIABLE_CONSTRAINT_ACTIONS
                )
            )
        validate_label_selector(c.label_selector, f"{p}.labelSelector", errs)


def validate_pod_spec(spec: k8s.PodSpec, path: str, errs: Errs, *, is_pod: bool) -> None:
    grace = spec.termination_grace_period_seconds
    volumes = _validate_volumes(spec.volumes, f"{path}.volumes", errs)
    containers = spec.containers or []
    init_containers = spec.init_containers or []

    if not containers:
        errs.append(required(f"{path}.containers"))
    names: set[str] = set()
    for i, c in enumerate(containers):
        p = f"{path}.containers[{i}]"
        _validate_container(c, p, volumes, errs)
        if c.name in names:
            errs.append(duplicate(f"{p}.name", c.name))
        names.add(c.name)
        _validate_probes_and_lifecycle(c, p, grace, errs)
        if c.restart_policy is not None:
            errs.append(forbidden(f"{p}.restartPolicy", "may not be set for non-init containers"))
    _validate_host_port_conflicts(containers, f"{path}.containers", errs)

    for i, c in enumerate(init_containers):
        p = f"{path}.initContainers[{i}]"
        _validate_container(c, p, volumes, errs)
        # Names are unique across init and regular containers: both appear in one status.
        if c.name in names:
            errs.append(duplicate(f"{p}.name", c.name))
        elif c.name:
            names.add(c.name)
        sidecar = c.restart_policy == "Always"
        if c.restart_policy is not None and not sidecar:
            errs.append(not_supported(f"{p}.restartPolicy", c.restart_policy, ["Always"]))
        if sidecar:
            _validate_probes_and_lifecycle(c, p, grace, errs)
        else:
            for attr, alias in (
                ("lifecycle", "lifecycle"),
                ("liveness_probe", "livenessProbe"),
                ("readiness_probe", "readinessProbe"),
                ("startup_probe", "startupProbe"),
            ):
                if getattr(c, attr) is not None:
                    errs.append(
                        forbidden(
                            f"{p}.{alias}", "may not be set for init containers without restartPolicy=Always"
                        )
                    )
        # Init containers run one at a time, so each only has to agree with itself.
        _validate_host_port_conflicts([c], f"{path}.initContainers", errs, first_index=i)

    if spec.host_network:
        for i, c in enumerate(containers):
            for j, port in enumerate(c.ports or []):
                host_port = port.host_port or 0
                if (is_pod or host_port != 0) and host_port != port.container_port:
                    errs.append(
                        invalid(
                            f"{path}.containers[{i}].ports[{j}].hostPort",
                            host_port,
                            "must match `containerPort` when `hostNetwork` is true",
                        )
                    )

    _enum(spec.restart_policy, f"{path}.restartPolicy", RESTART_POLICIES, errs)
    _enum(spec.dns_policy, f"{path}.dnsPolicy", DNS_POLICIES, errs)
    if spec.dns_policy == "None" and spec.dns_config is None:
        errs.append(required(f"{path}.dnsConfig", "must provide `dnsConfig` when `dnsPolicy` is None"))
    validate_labels(spec.node_selector, f"{path}.nodeSelector", errs)
    _validate_affinity(spec.affinity, f"{path}.affinity", errs)
    _validate_topology_spread(spec.topology_spread_constraints, f"{path}.topologySpreadConstraints", errs)

    seen_gates: set[str] = set()
    for i, gate in enumerate(spec.scheduling_gates or []):
        _names(gate.name, f"{path}.schedulingGates[{i}]", is_qualified_name, errs)
        if gate.name in seen_gates:
            errs.append(duplicate(f"{path}.schedulingGates[{i}]", gate.name))
        seen_gates.add(gate.name)

    for attr, alias in (
        ("service_account_name", "serviceAccountName"),
        ("node_name", "nodeName"),
        ("priority_class_name", "priorityClassName"),
        ("scheduler_name", "schedulerName"),
    ):
        value = getattr(spec, attr)
        if value:
            _names(value, f"{path}.{alias}", is_dns1123_subdomain, errs)
    for attr in ("hostname", "subdomain"):
        value = getattr(spec, attr)
        if value:
            _names(value, f"{path}.{attr}", is_dns1123_label, errs)
    if spec.active_deadline_seconds is not None and not 1 <= spec.active_deadline_seconds <= MAX_INT32:
        errs.append(
            invalid(
                f"{path}.activeDeadlineSeconds",
                spec.active_deadline_seconds,
                inclusive_range_error(1, MAX_INT32),
            )
        )
    if spec.preemption_policy is not None:
        _enum(spec.preemption_policy, f"{path}.preemptionPolicy", PREEMPTION_POLICIES, errs)
    validate_tolerations(spec.tolerations, f"{path}.tolerations", errs)


def _validate_pod(pod: k8s.Pod, errs: Errs) -> None:
    validate_object_meta(pod.metadata, errs)
    if pod.spec is None:
        errs.append(required("spec.containers"))
        return
    validate_pod_spec(pod.spec, "spec", errs, is_pod=True)
    for attr, alias in (("containers", "containers"), ("init_containers", "initContainers")):
        for i, c in enumerate(getattr(pod.spec, attr) or []):
            if c.image and c.image != c.image.strip():
                errs.append(
                    invalid(
                        f"spec.{alias}[{i}].image", c.image, "must not have leading or trailing whitespace"
                    )
                )


def validate_pod_template(template: k8s.PodTemplateSpec | None, path: str, errs: Errs) -> None:
    if template is None:
        errs.append(required(path))
        return
    if template.metadata is not None:
        validate_labels(template.metadata.labels, f"{path}.metadata.labels", errs)
        validate_annotations(template.metadata.annotations, f"{path}.metadata.annotations", errs)
    if template.spec is None:
        errs.append(required(f"{path}.spec.containers"))
    else:
        validate_pod_spec(template.spec, f"{path}.spec", errs, is_pod=False)


UPDATABLE_POD_SPEC_FIELDS = [
    "`spec.containers[*].image`",
    "`spec.initContainers[*].image`",
    "`spec.activeDeadlineSeconds`",
    "`spec.tolerations` (only additions to existing tolerations)",
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
]


def _terminated(cs: k8s.ContainerStatus) -> bool:
    return cs.state is not None and cs.state.terminated is not None


def validate_container_state_transition(new: list[k8s.ContainerStatus] | None,
                                        old: list[k8s.ContainerStatus] | None, path: str,
                                        restart_policy: str | None, errs: Errs,
                                        restartable: frozenset[str] = frozenset()) -> None:
    """A container that finished for good stays finished: a status update may not take a
    terminated container back to waiting or running unless the pod would restart it
    (ValidateContainerStateTransition / ValidateInitContainerStateTransition: restartPolicy
    Always; OnFailure after a non-zero exit; an init container with restartPolicy Always)."""
    if restart_policy == "Always":
        return
    for i, before in enumerate(old or []):
        if not _terminated(before) or before.name in restartable:
            continue
        assert before.state is not None and before.state.terminated is not None
        if before.state.terminated.exit_code != 0 and restart_policy == "OnFailure":
            continue
        if any(after.name == before.name and not _terminated(after) for after in new or []):
            errs.append(forbidden(f"{path}[{i}].state", "may not be transitioned to non-terminated state"))


def _validate_pod_status_update(new: k8s.Pod, old: k8s.Pod, errs: Errs) -> None:
    """What ValidatePodStatusUpdate checks of the containers' states. (A main-resource update
    keeps the stored status, so there these find nothing.)"""
    if new.status is None or old.status is None or old.spec is None:
        return
    policy = old.spec.restart_policy or "Always"
    validate_container_state_transition(new.status.container_statuses, old.status.container_statuses,
                                        "status.containerStatuses", policy, errs)
    sidecars = frozenset(c.name for c in old.spec.init_containers or [] if c.restart_policy == "Always")
    validate_container_state_transition(new.status.init_container_statuses, old.status.init_container_statuses,
                                        "status.initContainerStatuses", policy, errs, sidecars)
    # Ephemeral containers are never restarted.
    validate_container_state_transition(new.status.ephemeral_container_statuses,
                                        old.status.ephemeral_container_statuses,
                                        "status.ephemeralContainerStatuses", "Never", errs)


def _validate_pod_update(new: k8s.Pod, old: k8s.Pod, errs: Errs) -> None:
    _validate_pod_status_update(new, old, errs)
    if new.spec is None or old.spec is None:
        return
    for attr, alias in (("containers", "containers"), ("init_containers", "initContainers")):
        if len(getattr(new.spec, attr) or []) != len(getattr(old.spec, attr) or []):
            errs.append(forbidden(f"spec.{alias}", "pod updates may not add or remove containers"))
            return

    new_ads, old_ads = new.spec.active_deadline_seconds, old.spec.active_deadline_seconds
    if new_ads is not None:
        if old_ads is not None and new_ads > old_ads:
            errs.append(
                invalid("spec.activeDeadlineSeconds", new_ads, "must be less than or equal to previous value")
            )
    elif old_ads is not None:
        errs.append(
            invalid(
                "spec.activeDeadlineSeconds", None, "must not update from a positive integer to nil value"
            )
        )

    new_tols = [_normalized(t) for t in new.spec.tolerations or []]
    for old_tol in old.spec.tolerations or []:
        wanted = _normalized(old_tol)
        wanted.pop("tolerationSeconds", None)
        if not any({k: v for k, v in t.items() if k != "tolerationSeconds"} == wanted for t in new_tols):
            errs.append(
                forbidden(
                    "spec.tolerations", "existing toleration can not be modified except its tolerationSeconds"
                )
            )
            break

    old_gates = {g.name for g in old.spec.scheduling_gates or []}
    for i, gate in enumerate(new.spec.scheduling_gates or []):
        if gate.name not in old_gates:
            errs.append(
                forbidden(
                    f"spec.schedulingGates[{i}].name",
                    f"only deletion is allowed, but found new scheduling gate '{gate.name}'",
                )
            )

    munged = new.spec.model_copy(deep=True)
    for mine, theirs in zip(munged.containers, old.spec.containers, strict=True):
        mine.image = theirs.image
    for mine, theirs in zip(munged.init_containers or [], old.spec.init_containers or [], strict=True):
        mine.image = theirs.image
    munged.active_deadline_seconds = old_ads
    munged.scheduling_gates = old.spec.scheduling_gates
    munged.tolerations = old.spec.tolerations
    old_grace = old.spec.termination_grace_period_seconds
    if old_grace is not None and old_grace < 0 and munged.termination_grace_period_seconds == 1:
        munged.termination_grace_period_seconds = old_grace
    if old.spec.scheduling_gates:
        # A gated pod has not been scheduled, so its node selector may still grow.
        old_selector = old.spec.node_selector or {}
        new_selector = munged.node_selector or {}
        if all(new_selector.get(k) == v for k, v in old_selector.items()):
            munged.node_selector = old.spec.node_selector
        else:
            errs.append(
                invalid("spec.nodeSelector", new_selector, "only additions to spec.nodeSelector are allowed")
            )
            munged.node_selector = old.spec.node_selector

    before, after = _normalized(old.spec), _normalized(munged)
    if before != after:
        changes: list[str] = []
        _diff(before, after, "spec", changes)
        detail = "pod updates may not change fields other than " + ",".join(UPDATABLE_POD_SPEC_FIELDS)
        errs.append(forbidden("spec", detail + "\n" + "\n".join("  " + c for c in changes)))
