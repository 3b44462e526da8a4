"""Small pieces several plugins share: score normalization and taint toleration."""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.scheduler.framework import MAX_NODE_SCORE

# (key, operator, value, effect), as PodInfo.tolerations holds them.
Toleration = tuple[str, str, str, str]


def default_normalize_score(
    scores: list[int], *, reverse: bool = False, max_score: int = MAX_NODE_SCORE
) -> None:
    """Scale scores in place so the highest becomes ``max_score`` (or, reversed, the lowest
    does): raw scores that are counts or weight sums become comparable with other plugins'."""
    highest = max(scores, default=0)
    if highest == 0:
        if reverse:
            scores[:] = [max_score] * len(scores)
        return
    if reverse:
        scores[:] = [max_score - max_score * s // highest for s in scores]
    else:
        scores[:] = [max_score * s // highest for s in scores]


def tolerates(toleration: Toleration, key: str, value: str, effect: str) -> bool:
    """Kubernetes' ``Toleration.ToleratesTaint``: an empty toleration key (with Exists)
    matches every key, an empty effect every effect; an unknown operator matches nothing."""
    t_key, operator, t_value, t_effect = toleration
    if t_effect and t_effect != effect:
        return False
    if t_key and t_key != key:
        return False
    if operator == "Exists":
        return True
    if operator in ("", "Equal"):
        return t_value == value
    return False


def tolerated(tolerations: Iterable[Toleration], key: str, value: str, effect: str) -> bool:
    return any(tolerates(t, key, value, effect) for t in tolerations)
