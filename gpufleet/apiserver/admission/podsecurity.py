"""PodSecurity admission: the Pod Security Standards per namespace, as kube-apiserver's
PodSecurity plugin applies them (the checks are in gpufleet/api/podsecurity.py).

A namespace chooses its policy with labels; what a label leaves unset comes from the
cluster's defaults (an AdmissionConfiguration's ``defaults``):

    pod-security.kubernetes.io/enforce: baseline        # refuse violating pods (403)
    pod-security.kubernetes.io/enforce-version: v1.30   # or latest (the default)
    pod-security.kubernetes.io/warn: restricted          # answer a Warning header per violation
    pod-security.kubernetes.io/audit: restricted         # record violations

- Pods: checked on create, and on an update that changes what matters (the number of
  containers, an image). Enforce refuses with ``pods "x" is forbidden: violates PodSecurity
  "baseline:latest": host namespaces (hostPID=true), ...``; warn answers
  ``would violate PodSecurity "restricted:latest": ...`` as a warning (kubectl prints
  ``Warning: ...``). Subresources (status, binding, eviction, log, ...) are not checked.
- Kinds with a pod template (Deployment, ReplicaSet, Job, PyTorchJob, and StatefulSet,
  DaemonSet, CronJob, ReplicationController, PodTemplate where served) get warn and audit
  only, never a refusal: their pods are checked when they are created. A kind with several
  templates (a PyTorchJob's replica specs) gets one warning per template that violates,
  prefixed with the template's field path.
- Namespaces: invalid label values are refused (422, ``metadata.labels[...]: Invalid
  value: "x": must be one of privileged, baseline, restricted``); making enforce stricter
  answers warnings naming the existing pods that would now be refused.
- Exemptions (usernames, runtimeClassNames, namespaces) skip the checks.

Audit: there is no audit log here, so an audit violation (and a label that does not parse) is
a log line of the logger ``gpufleet.apiserver.podsecurity``, carrying what kube-apiserver puts
into the audit event's annotations, e.g. ``PodSecurity audit: create pods team-a/x by alice:
pod-security.kubernetes.io/audit-violations="would violate PodSecurity ..."``.

Out of the box (no configuration): enforce and warn ``baseline`` in every namespace (so a
workload whose pods would be refused says so when it is created), audit ``privileged``, and
the namespace kube-system exempt. Like Kubernetes, ``system:masters``
is not exempt: controllers acting for a user meet the user's namespace policy.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.api import podsecurity as ps
from gpufleet.apiserver.admission import AdmissionContext
from gpufleet.apiserver.errors import ApiException, forbidden, internal, invalid
from gpufleet.store import base as store_base

log = logging.getLogger("gpufleet.apiserver.podsecurity")

PLUGIN_NAME = "PodSecurity"
_CONFIG_API_VERSIONS = ("pod-security.admission.config.k8s.io/v1", "pod-security.admission.config.k8s.io/v1beta1",
                        "pod-security.admission.config.k8s.io/v1alpha1")
_ADMISSION_API_VERSIONS = ("apiserver.config.k8s.io/v1", "apiserver.k8s.io/v1alpha1")
_DEFAULT_KEYS = ("enforce", "enforce-version", "audit", "audit-version", "warn", "warn-version")
_EXEMPTION_KEYS = ("usernames", "namespaces", "runtimeClasses")
_NAMESPACE_NAME_MAX = 63
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

# Pod subresources the checks do not apply to, as in Kubernetes.
_IGNORED_POD_SUBRESOURCES = frozenset({"exec", "attach", "binding", "eviction", "log", "portforward", "proxy",
                                       "status"})
# When a namespace's enforce level tightens, at most this many existing pods are checked,
# for at most this long (Kubernetes' limits).
NAMESPACE_MAX_PODS_TO_CHECK = 3000
NAMESPACE_POD_CHECK_TIMEOUT = 1.0

Template = tuple[str, Mapping[str, Any]]  # (field path, the PodTemplateSpec)


def _d(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _single(path: str) -> Callable[[Mapping[str, Any]], Iterator[Template]]:
    def extract(obj: Mapping[str, Any]) -> Iterator[Template]:
        value: Any = obj
        for part in path.split("."):
            value = _d(value).get(part)
        if isinstance(value, Mapping):
            yield path, value

    return extract


def _pytorch_templates(obj: Mapping[str, Any]) -> Iterator[Template]:
    for rtype, replica in _d(_d(obj.get("spec")).get("pytorchReplicaSpecs")).items():
        template = _d(replica).get("template")
        if isinstance(template, Mapping):
            yield f"spec.pytorchReplicaSpecs[{rtype}].template", template


def _volcano_templates(obj: Mapping[str, Any]) -> Iterator[Template]:
    for i, task in enumerate(_d(obj.get("spec")).get("tasks") or []):
        template = _d(task).get("template")
        if isinstance(template, Mapping):
            yield f"spec.tasks[{i}].template", template


def _raycluster_templates(spec: Mapping[str, Any], path: str) -> Iterator[Template]:
    head = _d(_d(spec).get("headGroupSpec")).get("template")
    if isinstance(head, Mapping):
        yield f"{path}.headGroupSpec.template", head
    for i, group in enumerate(_d(spec).get("workerGroupSpecs") or []):
        template = _d(group).get("template")
        if isinstance(template, Mapping):
            yield f"{path}.workerGroupSpecs[{i}].template", template


def _raycluster_kind_templates(obj: Mapping[str, Any]) -> Iterator[Template]:
    yield from _raycluster_templates(_d(obj.get("spec")), "spec")


def _rayjob_templates(obj: Mapping[str, Any]) -> Iterator[Template]:
    spec = _d(obj.get("spec"))
    yield from _raycluster_templates(_d(spec.get("rayClusterSpec")), "spec.rayClusterSpec")
    submitter = spec.get("submitterPodTemplate")
    if isinstance(submitter, Mapping):
        yield "spec.submitterPodTemplate", submitter


def _rayservice_templates(obj: Mapping[str, Any]) -> Iterator[Template]:
    yield from _raycluster_templates(_d(_d(obj.get("spec")).get("rayClusterConfig")), "spec.rayClusterConfig")


# Resource key -> where its pod templates are. A kind not served here never matches.
# Kueue's Workloads are left out: their pod sets copy the templates of the job they stand
# for, which is checked itself, and no pod is ever made from a Workload.
TEMPLATE_KINDS: dict[str, Callable[[Mapping[str, Any]], Iterator[Template]]] = {
    "replicationcontrollers": _single("spec.template"),
    "podtemplates": _single("template"),
    "replicasets.apps": _single("spec.template"),
    "deployments.apps": _single("spec.template"),
    "statefulsets.apps": _single("spec.template"),
    "daemonsets.apps": _single("spec.template"),
    "jobs.batch": _single("spec.template"),
    "cronjobs.batch": _single("spec.jobTemplate.spec.template"),
    "pytorchjobs.kubeflow.org": _pytorch_templates,
    "jobs.batch.volcano.sh": _volcano_templates,
    "rayclusters.ray.io": _raycluster_kind_templates,
    "rayjobs.ray.io": _rayjob_templates,
    "rayservices.ray.io": _rayservice_templates,
}


class ConfigError(ValueError):
    """An AdmissionConfiguration / PodSecurityConfiguration that cannot be used; the message
    names the field (``defaults.enforce: Invalid value: "x": must be one of ...``)."""


@dataclass(frozen=True)
class PodSecurityConfig:
    """What kube-apiserver reads from the PodSecurity plugin's configuration."""

    defaults: ps.Policy = field(default_factory=ps.Policy)
    exempt_usernames: frozenset[str] = frozenset()
    exempt_namespaces: frozenset[str] = frozenset()
    exempt_runtime_classes: frozenset[str] = frozenset()

    @classmethod
    def default(cls) -> PodSecurityConfig:
        """gpufleet's out-of-the-box policy: enforce (and warn about workloads) baseline
        everywhere but kube-system."""
        return cls(exempt_namespaces=frozenset({"kube-system"})).with_enforce(ps.LevelVersion(ps.BASELINE))

    def with_enforce(self, lv: ps.LevelVersion) -> PodSecurityConfig:
        """Enforce ``lv`` by default, and warn at least at it, so that a Deployment whose pods
        it would refuse says so when it is created (a pod template is never refused)."""
        warn = self.defaults.warn
        if ps.compare_levels(lv.level, warn.level) > 0:
            warn = lv
        return PodSecurityConfig(ps.Policy(lv, self.defaults.audit, warn), self.exempt_usernames,
                                 self.exempt_namespaces, self.exempt_runtime_classes)


def parse_pod_security_configuration(doc: Any, where: str = "") -> PodSecurityConfig:
    """A PodSecurityConfiguration (pod-security.admission.config.k8s.io/v1): ``defaults``
    (unset levels are privileged, unset versions latest) and ``exemptions``."""
    prefix = f"{where}." if where else ""
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{where or 'configuration'}: must be a PodSecurityConfiguration object")
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if doc and (api_version not in _CONFIG_API_VERSIONS or kind != "PodSecurityConfiguration"):
        raise ConfigError(f"{prefix}apiVersion/kind: must be {_CONFIG_API_VERSIONS[0]} PodSecurityConfiguration, "
                          f"got {api_version} {kind}")
    unknown = sorted(set(doc) - {"apiVersion", "kind", "defaults", "exemptions"})
    if unknown:
        raise ConfigError(f'{prefix}{unknown[0]}: unknown field "{unknown[0]}"')
    defaults = doc.get("defaults") or {}
    exemptions = doc.get("exemptions") or {}
    if not isinstance(defaults, Mapping):
        raise ConfigError(f"{prefix}defaults: must be an object")
    if not isinstance(exemptions, Mapping):
        raise ConfigError(f"{prefix}exemptions: must be an object")
    for section, allowed, got in (("defaults", _DEFAULT_KEYS, defaults), ("exemptions", _EXEMPTION_KEYS, exemptions)):
        extra = sorted(set(got) - set(allowed))
        if extra:
            raise ConfigError(f'{prefix}{section}.{extra[0]}: unknown field "{extra[0]}"')
    errors: list[str] = []

    def level_version(mode: str) -> ps.LevelVersion:
        level = defaults.get(mode) or ps.PRIVILEGED
        version = defaults.get(f"{mode}-version") or "latest"
        lv = ps.LevelVersion(ps.PRIVILEGED)
        try:
            lv = ps.LevelVersion(ps.parse_level(str(level)), lv.version)
        except ps.PolicyValueError as e:
            errors.append(f'{prefix}defaults.{mode}: Invalid value: "{level}": {e}')
        try:
            lv = ps.LevelVersion(lv.level, ps.parse_version(str(version)))
        except ps.PolicyValueError as e:
            errors.append(f'{prefix}defaults.{mode}-version: Invalid value: "{version}": {e}')
        return lv

    policy = ps.Policy(level_version("enforce"), level_version("audit"), level_version("warn"))

    def names(key: str, pattern: str | None, max_len: int | None, what: str) -> frozenset[str]:
        values = exemptions.get(key) or []
        if not isinstance(values, list):
            errors.append(f"{prefix}exemptions.{key}: must be a list of strings")
            return frozenset()
        seen: set[str] = set()
        for i, v in enumerate(values):
            p = f"{prefix}exemptions.{key}[{i}]"
            if not isinstance(v, str) or not v:
                errors.append(f'{p}: Invalid value: "{v if v is not None else ""}": {what} must not be empty')
                continue
            if pattern is not None and (not re.match(pattern, v) or (max_len is not None and len(v) > max_len)):
                errors.append(f'{p}: Invalid value: "{v}": must be a valid {what}')
                continue
            if v in seen:
                errors.append(f'{p}: Duplicate value: "{v}"')
                continue
            seen.add(v)
        return frozenset(seen)

    config = PodSecurityConfig(
        defaults=policy,
        exempt_usernames=names("usernames", None, None, "username"),
        exempt_namespaces=names("namespaces", _DNS_LABEL, _NAMESPACE_NAME_MAX, "namespace name"),
        exempt_runtime_classes=names("runtimeClasses", _DNS_SUBDOMAIN, 253, "runtime class name"),
    )
    if errors:
        raise ConfigError("; ".join(errors))
    return config


def load_admission_config(path: Path) -> PodSecurityConfig | None:
    """The PodSecurity configuration of an AdmissionConfiguration file (kube-apiserver's
    ``--admission-control-config-file``): the ``PodSecurity`` plugin's inline
    ``configuration``, or the file its ``path`` names (relative to this file). None when the
    file configures no PodSecurity plugin."""
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not YAML: {e}") from None
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{path}: must hold an AdmissionConfiguration (apiserver.config.k8s.io/v1)")
    if doc.get("kind") == "PodSecurityConfiguration":
        raise ConfigError(f"{path}: holds a PodSecurityConfiguration; wrap it in an AdmissionConfiguration "
                          f"(apiVersion: apiserver.config.k8s.io/v1, kind: AdmissionConfiguration, plugins: "
                          f"[{{name: PodSecurity, configuration: ...}}])")
    if doc.get("apiVersion") not in _ADMISSION_API_VERSIONS or doc.get("kind") != "AdmissionConfiguration":
        raise ConfigError(f"{path}: apiVersion/kind: must be apiserver.config.k8s.io/v1 AdmissionConfiguration, got "
                          f"{doc.get('apiVersion')} {doc.get('kind')}")
    plugins = doc.get("plugins") or []
    if not isinstance(plugins, list):
        raise ConfigError(f"{path}: plugins: must be a list of {{name, configuration | path}}")
    for i, plugin in enumerate(plugins):
        if not isinstance(plugin, Mapping) or plugin.get("name") != PLUGIN_NAME:
            continue
        where = f"plugins[{i}]"
        if plugin.get("configuration") is not None and plugin.get("path"):
            raise ConfigError(f"{path}: {where}: give configuration or path, not both")
        if plugin.get("path"):
            target = Path(str(plugin["path"]))
            target = target if target.is_absolute() else path.parent / target
            try:
                inner = yaml.safe_load(target.read_text())
            except OSError as e:
                raise ConfigError(f"{path}: {where}.path: {target}: {e.strerror or e}") from None
            except yaml.YAMLError as e:
                raise ConfigError(f"{target}: not YAML: {e}") from None
            try:
                return parse_pod_security_configuration(inner)
            except ConfigError as e:
                raise ConfigError(f"{target}: {e}") from None
        try:
            return parse_pod_security_configuration(plugin.get("configuration"), f"{where}.configuration")
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    return None


# ---------------------------------------------------------------------------- pure decisions


def _violation(lv: ps.LevelVersion, results: list[ps.CheckResult]) -> str:
    return f'would violate PodSecurity "{lv}": {ps.forbidden_detail(results)}'


def _significant_pod_update(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Only a change of the containers' number or images can change the verdict (the rest of
    a pod's spec cannot be updated), as Kubernetes decides."""
    spec, old_spec = _d(new.get("spec")), _d(old.get("spec"))
    for key in ("containers", "initContainers"):
        a, b = spec.get(key) or [], old_spec.get(key) or []
        if len(a) != len(b):
            return True
        if any(_d(x).get("image") != _d(y).get("image") for x, y in zip(a, b, strict=True)):
            return True
    old_ephemeral = {_d(c).get("name"): _d(c) for c in old_spec.get("ephemeralContainers") or []}
    for c in spec.get("ephemeralContainers") or []:
        before = old_ephemeral.get(_d(c).get("name"))
        if before is None or before.get("image") != _d(c).get("image"):
            return True
    return False


def _prioritized(pods: list[Mapping[str, Any]], exempt_runtime_classes: frozenset[str]) -> list[Mapping[str, Any]]:
    """Pods to check when a namespace tightens: one per controller first, then the other
    replicas; pods of exempt runtime classes not at all."""
    first: list[Mapping[str, Any]] = []
    replicas: list[Mapping[str, Any]] = []
    seen: set[str] = set()
    for pod in pods:
        if _d(pod.get("spec")).get("runtimeClassName") in exempt_runtime_classes:
            continue
        owner = next((o for o in _d(pod.get("metadata")).get("ownerReferences") or []
                      if _d(o).get("controller") is True), None)
        if owner is None:
            first.append(pod)
        elif owner.get("uid") in seen:
            replicas.append(pod)
        else:
            seen.add(owner.get("uid"))
            first.append(pod)
    return first + replicas


def namespace_pod_warnings(namespace: str, lv: ps.LevelVersion, pods: list[Mapping[str, Any]], *,
                           exempt_runtime_classes: frozenset[str] = frozenset(),
                           max_pods: int = NAMESPACE_MAX_PODS_TO_CHECK,
                           out_of_time: Callable[[], bool] = lambda: False) -> list[str]:
    """Kubernetes' warnings when a namespace's enforce level changes: which existing pods it
    would refuse, grouped by reason (``web-1 (and 2 other pods): host namespaces, privileged``)."""
    ordered = _prioritized(pods, exempt_runtime_classes)
    total = len(ordered)
    ordered = ordered[:max_pods]
    checked = len(ordered)
    counts: dict[str, list[Any]] = {}  # reason -> [first pod name (least), count]
    order: list[str] = []
    for i, pod in enumerate(ordered):
        results = ps.evaluate_pod(lv, _d(pod.get("metadata")), _d(pod.get("spec")))
        if results:
            reason = ps.forbidden_reason(results)
            name = str(_d(pod.get("metadata")).get("name") or "")
            if reason not in counts:
                counts[reason] = [name, 0]
                order.append(reason)
            elif name < counts[reason][0]:
                counts[reason][0] = name
            counts[reason][1] += 1
        if out_of_time():
            checked = i + 1
            break
    warnings: list[str] = []
    if checked < total:
        warnings.append(f"new PodSecurity enforce level only checked against the first {checked} of {total} "
                        "existing pods")
    if order:
        warnings.append(f'existing pods in namespace "{namespace}" violate the new PodSecurity enforce level "{lv}"')
    decorated = []
    for reason in order:
        name, count = counts[reason]
        if count == 1:
            decorated.append(f"{name}: {reason}")
        elif count == 2:
            decorated.append(f"{name} (and 1 other pod): {reason}")
        else:
            decorated.append(f"{name} (and {count - 1} other pods): {reason}")
    return warnings + sorted(decorated)


def exempt_namespace_warning(namespace: str, policy: ps.Policy, defaults: ps.Policy,
                             labels: Mapping[str, str]) -> str | None:
    """What labeling an exempt namespace answers: its policy will be ignored."""
    if policy.fully_privileged() or policy.equivalent(defaults):
        return None
    parts = []
    for mode, lv, level_label, version_label in (
            ("enforce", policy.enforce, ps.ENFORCE_LABEL, ps.ENFORCE_VERSION_LABEL),
            ("audit", policy.audit, ps.AUDIT_LABEL, ps.AUDIT_VERSION_LABEL),
            ("warn", policy.warn, ps.WARN_LABEL, ps.WARN_VERSION_LABEL)):
        if lv.level != ps.PRIVILEGED and (level_label in labels or version_label in labels):
            parts.append(f"{mode}={lv}")
    return f'namespace "{namespace}" is exempt from Pod Security, and the policy ({", ".join(parts)}) will be ignored'


# ---------------------------------------------------------------------------- the plugin


class PodSecurityAdmission:
    name = PLUGIN_NAME

    def __init__(self, config: PodSecurityConfig | None = None) -> None:
        self.config = config if config is not None else PodSecurityConfig.default()

    def policy(self, labels: Mapping[str, str] | None) -> tuple[ps.Policy, list[ps.LabelError]]:
        return ps.policy_to_evaluate(labels, self.config.defaults)

    async def validate(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if ctx.operation not in ("CREATE", "UPDATE"):
            return
        key = ctx.rt.key
        if key == "namespaces":
            if not ctx.subresource:
                await self._namespace(ctx, obj, old)
        elif key == "pods":
            if ctx.subresource not in _IGNORED_POD_SUBRESOURCES:
                await self._pod(ctx, obj, old)
        elif key in TEMPLATE_KINDS and not ctx.subresource:
            await self._templates(ctx, obj)

    # -- namespaces

    async def _namespace(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        labels = _d(_d(obj.get("metadata")).get("labels"))
        policy, errors = self.policy(labels)
        name = ctx.name or str(_d(obj.get("metadata")).get("name") or "")
        exempt = name in self.config.exempt_namespaces
        if ctx.operation == "CREATE" or old is None:
            if errors:
                raise self._invalid_labels(ctx, name, errors)
            if exempt and (w := exempt_namespace_warning(name, policy, self.config.defaults, labels)):
                ctx.warnings.append(w)
            return
        old_policy, old_errors = self.policy(_d(_d(old.get("metadata")).get("labels")))
        if errors and (not old_errors or errors != old_errors):
            raise self._invalid_labels(ctx, name, errors)
        if policy.enforce == old_policy.enforce or policy.enforce.level == ps.PRIVILEGED:
            return
        if (policy.enforce.version == old_policy.enforce.version
                and ps.compare_levels(policy.enforce.level, old_policy.enforce.level) < 1):
            return
        if exempt:
            if w := exempt_namespace_warning(name, policy, self.config.defaults, labels):
                ctx.warnings.append(w)
            return
        clock = ctx.server.clock
        deadline = clock.monotonic() + NAMESPACE_POD_CHECK_TIMEOUT
        try:
            pods = (await ctx.server.store.list("pods", name)).items
        except Exception:  # the namespace update itself must not fail over this
            log.exception("PodSecurity: listing the pods of namespace %s", name)
            ctx.warnings.append("failed to list pods while checking new PodSecurity enforce level")
            return
        ctx.warnings.extend(namespace_pod_warnings(
            name, policy.enforce, pods, exempt_runtime_classes=self.config.exempt_runtime_classes,
            out_of_time=lambda: clock.monotonic() > deadline))

    @staticmethod
    def _invalid_labels(ctx: AdmissionContext, name: str, errors: list[ps.LabelError]) -> ApiException:
        return invalid(ctx.rt, name, [{"reason": "FieldValueInvalid", "field": e.field,
                                       "message": f'Invalid value: "{e.value}": {e.message}'} for e in errors])

    # -- pods and templates

    async def _namespace_policy(self, ctx: AdmissionContext) -> tuple[ps.Policy, list[ps.LabelError]] | None:
        """The policy of the request's namespace; None when the request is exempt."""
        if ctx.namespace in self.config.exempt_namespaces or ctx.user.name in self.config.exempt_usernames:
            return None
        try:
            ns = await ctx.server.store.get("namespaces", "", ctx.namespace)
        except store_base.NotFound:
            raise internal(f'failed to lookup namespace "{ctx.namespace}"') from None
        return self.policy(_d(_d(ns.get("metadata")).get("labels")))

    async def _pod(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        found = await self._namespace_policy(ctx)
        if found is None:
            return
        policy, errors = found
        if not errors and policy.fully_privileged():
            return
        if ctx.operation == "UPDATE" and old is not None and not _significant_pod_update(obj, old):
            return
        meta, spec = _d(obj.get("metadata")), _d(obj.get("spec"))
        if spec.get("runtimeClassName") in self.config.exempt_runtime_classes:
            return
        # Each level-version is evaluated once: gpufleet's default enforces and warns at baseline
        # and audits at privileged, so comparing warn with audit alone evaluated baseline twice.
        evaluated: dict[ps.LevelVersion, list] = {}

        def evaluate(lv: ps.LevelVersion) -> list:
            if lv not in evaluated:
                evaluated[lv] = ps.evaluate_pod(lv, meta, spec)
            return evaluated[lv]

        enforce = evaluate(policy.enforce)
        audit = evaluate(policy.audit)
        self._audit(ctx, policy, errors, [(policy.audit, audit)], enforced=True)
        if enforce:
            raise forbidden(f'{ctx.rt.key} "{ctx.name}" is forbidden: violates PodSecurity "{policy.enforce}": '
                            f"{ps.forbidden_detail(enforce)}", ctx.rt, ctx.name)
        warn = evaluate(policy.warn)
        if warn:
            ctx.warnings.append(_violation(policy.warn, warn))

    async def _templates(self, ctx: AdmissionContext, obj: dict[str, Any]) -> None:
        templates = list(TEMPLATE_KINDS[ctx.rt.key](obj))
        if not templates:
            return
        found = await self._namespace_policy(ctx)
        if found is None:
            return
        policy, errors = found
        if not errors and policy.warn.level == ps.PRIVILEGED and policy.audit.level == ps.PRIVILEGED:
            return
        audits: list[tuple[ps.LevelVersion, list[ps.CheckResult], str]] = []
        for path, template in templates:
            meta, spec = _d(template.get("metadata")), _d(template.get("spec"))
            if spec.get("runtimeClassName") in self.config.exempt_runtime_classes:
                continue
            prefix = f"{path}: " if len(templates) > 1 else ""
            audit = ps.evaluate_pod(policy.audit, meta, spec)
            audits.append((policy.audit, audit, prefix))
            warn = audit if policy.warn == policy.audit else ps.evaluate_pod(policy.warn, meta, spec)
            if warn:
                ctx.warnings.append(prefix + _violation(policy.warn, warn))
        self._audit(ctx, policy, errors, [(lv, r) for lv, r, _ in audits], enforced=False,
                    prefixes=[p for _, _, p in audits])

    def _audit(self, ctx: AdmissionContext, policy: ps.Policy, errors: list[ps.LabelError],
               results: list[tuple[ps.LevelVersion, list[ps.CheckResult]]], *, enforced: bool,
               prefixes: list[str] | None = None) -> None:
        """The audit annotations kube-apiserver would record, as one log line when there is
        something to say (a violation of the audit level, or labels that do not parse)."""
        notes: list[str] = []
        if errors:
            notes.append(f'{ps.LABEL_PREFIX}error="Failed to parse policy: '
                         f'{"; ".join(str(e) for e in errors)}"')
        for i, (lv, found) in enumerate(results):
            if found:
                prefix = prefixes[i] if prefixes else ""
                notes.append(f'{ps.LABEL_PREFIX}{ps.AUDIT_VIOLATIONS}="{prefix}{_violation(lv, found)}"')
        if not notes:
            return
        if enforced:
            notes.append(f'{ps.LABEL_PREFIX}{ps.ENFORCE_POLICY}="{policy.enforce}"')
        verb = "create" if ctx.operation == "CREATE" else "update"
        log.info("PodSecurity audit: %s %s %s/%s by %s%s: %s", verb, ctx.rt.key, ctx.namespace, ctx.name,
                 ctx.user.name, " (dry run)" if ctx.dry_run else "", ", ".join(notes))
