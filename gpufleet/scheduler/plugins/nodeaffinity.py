"""NodeAffinity: spec.nodeSelector and requiredDuringSchedulingIgnoredDuringExecution
filter nodes by label; preferredDuringSchedulingIgnoredDuringExecution ranks them.

As a convenience a pod may also carry the annotation ``nvidia.com/gpu.product`` (one
product, or several separated by commas): it then only fits nodes whose label of that name
is one of them, exactly as a nodeSelector on the label would. Selectors are compiled once
per pod object and reused on every retry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.api import k8s
from gpufleet.api.gpu import GPU_PRODUCT_LABEL
from gpufleet.api.selectors import Operator, Requirement, SelectorError
from gpufleet.scheduler.framework import NODE_ADD, NODE_LABEL, OK, SKIP, CycleState, Status
from gpufleet.scheduler.plugins.helpers import default_normalize_score
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot

REASON = "node(s) didn't match Pod's node affinity/selector"

_OPERATORS = {
    "In": Operator.IN,
    "NotIn": Operator.NOT_IN,
    "Exists": Operator.EXISTS,
    "DoesNotExist": Operator.DOES_NOT_EXIST,
    "Gt": Operator.GREATER_THAN,
    "Lt": Operator.LESS_THAN,
}
_NAME_FIELD = "metadata.name"


@dataclass(frozen=True)
class Term:
    """One NodeSelectorTerm: every expression must hold. ``fields`` are (operator, names)
    on metadata.name, the only field Kubernetes allows in matchFields."""

    labels: tuple[Requirement, ...]
    fields: tuple[tuple[str, frozenset[str]], ...]

    def matches(self, labels: Mapping[str, str], node_name: str) -> bool:
        for requirement in self.labels:
            if not requirement.matches(labels):
                return False
        for operator, names in self.fields:
            if (node_name in names) != (operator == "In"):
                return False
        return True


@dataclass(frozen=True)
class CompiledAffinity:
    # Equality (nodeSelector) and the product annotation: all must hold.
    selector: tuple[Requirement, ...]
    # Required terms, any of which must hold; None when the pod has none.
    required: tuple[Term, ...] | None
    preferred: tuple[tuple[int, Term], ...]

    @property
    def has_required(self) -> bool:
        return bool(self.selector) or self.required is not None

    def matches(self, node_info: NodeInfo) -> bool:
        labels = node_info.labels
        for requirement in self.selector:
            if not requirement.matches(labels):
                return False
        if self.required is not None:
            return any(term.matches(labels, node_info.name) for term in self.required)
        return True


def _compile_term(term: k8s.NodeSelectorTerm, path: str) -> Term | None:
    """None for a term that matches nothing (no expressions at all, as in Kubernetes)."""
    expressions = term.match_expressions or []
    fields = term.match_fields or []
    if not expressions and not fields:
        return None
    labels = []
    for i, expr in enumerate(expressions):
        operator = _OPERATORS.get(expr.operator)
        if operator is None:
            raise SelectorError(
                f"{path}.matchExpressions[{i}].operator: unsupported operator {expr.operator!r}"
            )
        labels.append(
            Requirement.new(
                expr.key,
                operator,
                expr.values or [],
                key_path=f"{path}.matchExpressions[{i}].key",
                values_path=f"{path}.matchExpressions[{i}].values",
            )
        )
    compiled_fields = []
    for i, expr in enumerate(fields):
        if expr.key != _NAME_FIELD:
            raise SelectorError(
                f"{path}.matchFields[{i}].key: only {_NAME_FIELD!r} is supported, not {expr.key!r}"
            )
        if expr.operator not in ("In", "NotIn") or len(expr.values or []) != 1:
            raise SelectorError(
                f"{path}.matchFields[{i}]: {_NAME_FIELD} takes In or NotIn with exactly one value"
            )
        compiled_fields.append((expr.operator, frozenset(expr.values or [])))
    return Term(tuple(labels), tuple(compiled_fields))


def _compile_terms(terms: Sequence[k8s.NodeSelectorTerm], path: str) -> tuple[Term, ...]:
    compiled = (_compile_term(t, f"{path}[{i}]") for i, t in enumerate(terms))
    return tuple(t for t in compiled if t is not None)


def compile_affinity(pod_info: PodInfo) -> CompiledAffinity:
    """Raises SelectorError for a selector the API should have refused."""
    spec = pod_info.pod.spec
    selector: list[Requirement] = []
    for key, value in ((spec.node_selector if spec else None) or {}).items():
        selector.append(Requirement(key, Operator.EQUALS, (value,)))
    products = pod_info.annotations.get(GPU_PRODUCT_LABEL)
    if products:
        values = sorted({p.strip() for p in products.split(",") if p.strip()})
        selector.append(Requirement(GPU_PRODUCT_LABEL, Operator.IN, tuple(values)))
    affinity = spec.affinity.node_affinity if spec is not None and spec.affinity is not None else None
    required = None
    preferred: list[tuple[int, Term]] = []
    if affinity is not None:
        node_selector = affinity.required_during_scheduling_ignored_during_execution
        if node_selector is not None:
            required = _compile_terms(
                node_selector.node_selector_terms,
                "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
            )
        for i, pref in enumerate(affinity.preferred_during_scheduling_ignored_during_execution or ()):
            term = _compile_term(
                pref.preference, f"preferredDuringSchedulingIgnoredDuringExecution[{i}].preference"
            )
            if term is not None and pref.weight:
                preferred.append((pref.weight, term))
    return CompiledAffinity(tuple(selector), required, tuple(preferred))


_STATE_KEY = "NodeAffinity/compiled"


class NodeAffinity:
    name = "NodeAffinity"

    def __init__(self, args: Mapping[str, Any] | None = None, handle: Any = None) -> None:
        pass

    def _compiled(self, pod_info: PodInfo) -> CompiledAffinity | SelectorError:
        compiled = pod_info.cache.get(self.name)
        if compiled is None:
            try:
                compiled = compile_affinity(pod_info)
            except SelectorError as exc:
                compiled = exc
            pod_info.cache[self.name] = compiled
        return compiled

    def pre_filter(self, state: CycleState, pod_info: PodInfo, snapshot: Snapshot) -> Status:
        compiled = self._compiled(pod_info)
        if isinstance(compiled, SelectorError):
            # The API validates affinity, so this is a pod that bypassed validation; telling
            # its owner why beats retrying it forever as an internal error.
            return Status.unresolvable(f"invalid node affinity: {compiled}")
        state.write(_STATE_KEY, compiled)
        return OK if compiled.has_required else SKIP

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status:
        compiled: CompiledAffinity | None = state.read(_STATE_KEY)
        if compiled is None or compiled.matches(node_info):
            return OK
        return Status.unresolvable(REASON)

    def pre_score(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Status:
        compiled = self._compiled(pod_info)
        if isinstance(compiled, SelectorError) or not compiled.preferred:
            return SKIP
        state.write(_STATE_KEY, compiled)
        return OK

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> int:
        compiled: CompiledAffinity | None = state.read(_STATE_KEY)
        if compiled is None:
            return 0
        labels, name = node_info.labels, node_info.name
        return sum(weight for weight, term in compiled.preferred if term.matches(labels, name))

    def normalize_score(self, state: CycleState, pod_info: PodInfo, scores: list[int]) -> None:
        default_normalize_score(scores)

    def events_to_register(self) -> set[str]:
        return {NODE_ADD, NODE_LABEL}
