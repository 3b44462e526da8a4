"""Taints and tolerations, as ``k8s.io/api/core/v1`` defines them, for the scheduler, the
node lifecycle controller and queue admission alike.

``Toleration.ToleratesTaint``: a toleration with an effect matches only taints of that
effect (no effect: every effect); with a key only taints of that key (no key, which
validation allows only with ``Exists``: every key); then ``Exists`` matches any value and
``Equal`` (or no operator) the same value; any other operator matches nothing.

The scheduler and the queue hold tolerations as plain ``(key, operator, value, effect)``
tuples and taints as ``(key, value, effect)`` for their hot paths; :func:`tolerates_taint` is
the rule on those, and :func:`tolerates` reads typed models or wire JSON into it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpufleet.api import k8s

NO_SCHEDULE = "NoSchedule"
PREFER_NO_SCHEDULE = "PreferNoSchedule"
NO_EXECUTE = "NoExecute"
EXISTS = "Exists"
EQUAL = "Equal"

TolerationTuple = tuple[str, str, str, str]  # (key, operator, value, effect)
TaintTuple = tuple[str, str, str]  # (key, value, effect)


def tolerates_taint(toleration: TolerationTuple, key: str, value: str, effect: str) -> bool:
    """``Toleration.ToleratesTaint`` on plain strings ("" for unset)."""
    t_key, operator, t_value, t_effect = toleration
    if t_effect and t_effect != effect:
        return False
    if t_key and t_key != key:
        return False
    if operator == EXISTS:
        return True
    if operator in ("", EQUAL):
        return t_value == value
    return False


def tolerated(tolerations: Iterable[TolerationTuple], key: str, value: str, effect: str) -> bool:
    """Whether any of ``tolerations`` tolerates the taint."""
    return any(tolerates_taint(t, key, value, effect) for t in tolerations)


def toleration_tuple(toleration: k8s.Toleration | Mapping[str, Any]) -> TolerationTuple:
    if isinstance(toleration, k8s.Toleration):
        t = toleration
        return (t.key or "", t.operator or "", t.value or "", t.effect or "")
    g = toleration.get
    return (g("key") or "", g("operator") or "", g("value") or "", g("effect") or "")


def taint_tuple(taint: k8s.Taint | Mapping[str, Any]) -> TaintTuple:
    if isinstance(taint, k8s.Taint):
        return (taint.key or "", taint.value or "", taint.effect or "")
    g = taint.get
    return (g("key") or "", g("value") or "", g("effect") or "")


def toleration_tuples(tolerations: Iterable[k8s.Toleration | Mapping[str, Any]] | None) -> tuple[TolerationTuple, ...]:
    return tuple(toleration_tuple(t) for t in tolerations or ())


def taint_tuples(taints: Iterable[k8s.Taint | Mapping[str, Any]] | None,
                 effects: Iterable[str] | None = None) -> tuple[TaintTuple, ...]:
    """The taints as tuples; only those with one of ``effects`` when given."""
    wanted = None if effects is None else frozenset(effects)
    out = (taint_tuple(t) for t in taints or ())
    return tuple(t for t in out if wanted is None or t[2] in wanted)


def tolerates(toleration: k8s.Toleration | Mapping[str, Any], taint: k8s.Taint | Mapping[str, Any]) -> bool:
    """``Toleration.ToleratesTaint`` for a typed (or wire JSON) toleration and taint."""
    return tolerates_taint(toleration_tuple(toleration), *taint_tuple(taint))


def find_untolerated_taint(
    taints: Iterable[k8s.Taint | Mapping[str, Any] | TaintTuple],
    tolerations: Iterable[k8s.Toleration | Mapping[str, Any] | TolerationTuple],
    effects: Iterable[str] | None = None,
) -> Any | None:
    """The first taint (with one of ``effects``, when given) that no toleration tolerates, or
    None (component-helpers' ``FindMatchingUntoleratedTaint``)."""
    tols = [t if isinstance(t, tuple) else toleration_tuple(t) for t in tolerations]
    wanted = None if effects is None else frozenset(effects)
    for taint in taints:
        key, value, effect = taint if isinstance(taint, tuple) else taint_tuple(taint)
        if wanted is not None and effect not in wanted:
            continue
        if not tolerated(tols, key, value, effect):
            return taint
    return None


def tolerates_all(
    taints: Iterable[k8s.Taint | Mapping[str, Any] | TaintTuple],
    tolerations: Iterable[k8s.Toleration | Mapping[str, Any] | TolerationTuple],
    effects: Iterable[str] | None = None,
) -> bool:
    """Whether every taint (with one of ``effects``, when given) is tolerated."""
    return find_untolerated_taint(taints, tolerations, effects) is None
