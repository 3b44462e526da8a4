"""Work moves off a failed GPU: the test writes what the node agent writes when a GPU fails
(the pod Failed, reason GPUUnhealthy, condition DisruptionTarget, through pods/status), and
the controllers on a real control plane move the work to healthy GPUs."""

from __future__ import annotations

from typing import Any

from ctrl_helpers import NS, events_for, eventually, fail_by_gpu, set_pod_status
from test_pytorchjob import _count, _new_gang, condition, pods_of, pytorchjob

from gpufleet.client.api import Client
from gpufleet.controllers.pytorchjob import (
    ATTEMPT_ANNOTATION,
    HARDWARE_RESTARTS_ANNOTATION,
    RESTARTS_ANNOTATION,
)

FAST = {"enabled": ("pytorchjob",), "pytorchjob_restart_backoff": 30.0, "pytorchjob_resize_interval": 0.0}


async def _annotations(client: Client, name: str) -> dict[str, str]:
    job = await client.get("pytorchjobs", name, NS, raw=True)
    return job["metadata"].get("annotations") or {}


async def test_a_gang_moves_off_a_failed_gpu_without_spending_its_backoff_limit(client: Client, controllers) -> None:
    # backoffLimit 0 and a long back-off: an ordinary failure would end the job at once.
    await controllers(**FAST)
    await client.create(pytorchjob("fixed", runPolicy={"backoffLimit": 0}), raw=True)
    first = await eventually(lambda: _count(client, "fixed", 3))
    for name in first:
        await set_pod_status(client, name, phase="Running")
    await eventually(lambda: condition(client, "fixed", "Running"))

    await fail_by_gpu(client, "fixed-worker-1")
    cond = await eventually(lambda: condition(client, "fixed", "Restarting"))
    assert cond["reason"] == "GPUUnhealthy"
    assert "fixed-worker-1" in cond["message"] and "GPU 1 (GPU-0001)" in cond["message"]
    assert "XID 79" in cond["message"]
    second = await eventually(lambda: _new_gang(client, "fixed", first))
    assert {p["metadata"]["annotations"][ATTEMPT_ANNOTATION] for p in second.values()} == {"1"}
    annotations = await _annotations(client, "fixed")
    assert annotations[HARDWARE_RESTARTS_ANNOTATION] == "1"
    assert annotations.get(RESTARTS_ANNOTATION, "0") == "0"
    assert not await condition(client, "fixed", "Failed")
    (event,) = await events_for(client, "fixed", "GPUUnhealthy")
    assert event["type"] == "Warning" and "XID 79" in event["message"]

    # The job's own failure still counts, against the limit it did not spend.
    await set_pod_status(client, "fixed-master-0", phase="Failed")
    cond = await eventually(lambda: condition(client, "fixed", "Failed"))
    assert cond["reason"] == "BackoffLimitExceeded"


async def test_an_elastic_job_replaces_only_the_member_on_the_failed_gpu(client: Client, controllers) -> None:
    await controllers(**FAST)
    body = pytorchjob("elastic", workers=3, master=False, elasticPolicy={"minReplicas": 2, "maxReplicas": 3},
                      runPolicy={"backoffLimit": 0}, meta={"annotations": {"gpufleet.io/elastic-autoscale": "false"}})
    await client.create(body, raw=True)
    first = await eventually(lambda: _count(client, "elastic", 3))
    for name in first:
        await set_pod_status(client, name, phase="Running")
    await eventually(lambda: condition(client, "elastic", "Running"))

    await fail_by_gpu(client, "elastic-worker-2")
    cond = await eventually(lambda: condition(client, "elastic", "Restarting"))
    assert cond["reason"] == "GPUUnhealthy" and "re-form the group" in cond["message"]
    replaced = await eventually(lambda: _replaced(client, "elastic", first, "elastic-worker-2"))
    # The others were never touched: same pods, still running; the same attempt.
    for name in ("elastic-worker-0", "elastic-worker-1"):
        assert replaced[name]["metadata"]["uid"] == first[name]["metadata"]["uid"]
        assert replaced[name]["status"]["phase"] == "Running"
    assert {p["metadata"]["annotations"][ATTEMPT_ANNOTATION] for p in replaced.values()} == {"0"}
    annotations = await _annotations(client, "elastic")
    assert annotations[HARDWARE_RESTARTS_ANNOTATION] == "1" and annotations.get(ATTEMPT_ANNOTATION, "0") == "0"

    await set_pod_status(client, "elastic-worker-2", phase="Running")
    await eventually(lambda: condition(client, "elastic", "Running"))
    assert not await condition(client, "elastic", "Failed")


async def _replaced(client: Client, job: str, old: dict[str, Any], name: str) -> dict[str, Any] | None:
    pods = await pods_of(client, job)
    if len(pods) == len(old) and name in pods and pods[name]["metadata"]["uid"] != old[name]["metadata"]["uid"]:
        return pods
    return None
