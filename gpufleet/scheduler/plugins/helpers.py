"""Small pieces several plugins share: score normalization (and, re-exported, taint
toleration, whose rule lives in gpufleet.api.taints)."""

from __future__ import annotations

from gpufleet.api.taints import TolerationTuple as Toleration
from gpufleet.api.taints import tolerated
from gpufleet.api.taints import tolerates_taint as tolerates
from gpufleet.scheduler.framework import MAX_NODE_SCORE

__all__ = ["Toleration", "default_normalize_score", "tolerated", "tolerates"]


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
