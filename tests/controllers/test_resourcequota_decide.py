"""A ResourceQuota's status as a plain decision: the quota and the usage computed in; the
status and when to look again out."""

from __future__ import annotations

from typing import Any

from gpufleet.controllers.resourcequota import decide_quota


def quota(used: dict[str, str] | None = None) -> dict[str, Any]:
    rq: dict[str, Any] = {"metadata": {"name": "q", "namespace": "team", "resourceVersion": "4"},
                          "spec": {"hard": {"pods": "10", "requests.nvidia.com/gpu": "4"}}}
    if used is not None:
        rq["status"] = {"hard": dict(rq["spec"]["hard"]), "used": used}
    return rq


def test_usage_is_written_for_every_hard_limit():
    actions = decide_quota(quota(), {"pods": 3, "requests.nvidia.com/gpu": 2}, 60.0, 5.0)
    assert actions.status == {"hard": {"pods": "10", "requests.nvidia.com/gpu": "4"},
                              "used": {"pods": "3", "requests.nvidia.com/gpu": "2"}}
    assert actions.requeue_after is None
    same = decide_quota(quota(actions.status["used"]), {"pods": 3, "requests.nvidia.com/gpu": 2}, 60.0, 5.0)
    assert same.status is None and same.reason == "Synced"


def test_a_release_right_after_a_change_is_held_back_and_looked_at_again():
    rq = quota({"pods": "3", "requests.nvidia.com/gpu": "2"})
    actions = decide_quota(rq, {"pods": 2, "requests.nvidia.com/gpu": 2}, 1.0, 5.0)
    assert actions.reason == "HoldingRelease" and actions.status is None
    assert abs(actions.requeue_after - 4.05) < 1e-9
    released = decide_quota(rq, {"pods": 2, "requests.nvidia.com/gpu": 2}, 6.0, 5.0)
    assert released.status["used"]["pods"] == "2"
