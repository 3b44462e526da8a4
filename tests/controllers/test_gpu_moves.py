"""Work moves off a failed GPU: the test writes what the node agent writes when a GPU fails
(the pod Failed, reason GPUUnhealthy, condition DisruptionTarget, through pods/status), and
the controllers on a real control plane move the work to healthy GPUs."""

from __future__ import annotations

from typing import Any

from ctrl_helpers import (
    NS,
    FakeAgent,
    events_for,
    eventually,
    fail_by_gpu,
    job,
    owned_pods,
    replicaset,
    set_pod_status,
)
from test_job import condition as job_condition
from test_job import job_status
from test_pytorchjob import _count, _new_gang, condition, pods_of, pytorchjob
from test_statefulset import statefulset

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
    body = pytorchjob("elastic", workers=3, master=False, elasticPolicy={"minReplicas": 2, "maxReplicas": 3, "maxRestarts": 5},
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


# -- Jobs, ReplicaSets, StatefulSets ---------------------------------------------------------


async def test_a_job_ignoring_disruptions_replaces_a_pod_on_a_failed_gpu(client: Client, controllers) -> None:
    await controllers(enabled=("job",), job_pod_failure_backoff=0.0)
    policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    j = await client.create(job("eval", backoffLimit=0, podFailurePolicy=policy), raw=True)
    plain = await client.create(job("plain", backoffLimit=0), raw=True)
    (first,) = await eventually(lambda: _active(client, j["metadata"]["uid"], 1))
    (other,) = await eventually(lambda: _active(client, plain["metadata"]["uid"], 1))
    await fail_by_gpu(client, first["metadata"]["name"])
    await fail_by_gpu(client, other["metadata"]["name"])
    (second,) = await eventually(lambda: _active(client, j["metadata"]["uid"], 1, exclude=first))
    # Kubernetes' own rule, unchanged: without the policy the disruption spends the limit.
    cond = await eventually(lambda: job_condition(client, "plain", "Failed"))
    assert cond["reason"] == "BackoffLimitExceeded"
    await set_pod_status(client, second["metadata"]["name"], phase="Succeeded")
    await eventually(lambda: job_condition(client, "eval", "Complete"))
    status = await job_status(client, "eval")
    assert status.get("failed", 0) == 0 and status["succeeded"] == 1


async def test_a_replicaset_and_a_statefulset_replace_a_pod_the_agent_failed(client: Client, controllers) -> None:
    await controllers(enabled=("replicaset", "statefulset"))
    async with FakeAgent(client, delay=0.0):
        rs = await client.create(replicaset("web", 2), raw=True)
        await client.create(statefulset("db", 1), raw=True)
        pods = await eventually(lambda: _active(client, rs["metadata"]["uid"], 2, running=True))
        db0 = await eventually(lambda: _running(client, "db-0"))
        # restartPolicy Always: only the agent's GPU fault makes these pods Failed.
        await fail_by_gpu(client, pods[0]["metadata"]["name"])
        await fail_by_gpu(client, "db-0")
        again = await eventually(lambda: _active(client, rs["metadata"]["uid"], 2, exclude=pods[0], running=True))
        assert pods[1]["metadata"]["uid"] in {p["metadata"]["uid"] for p in again}
        new_db0 = await eventually(lambda: _running(client, "db-0", not_uid=db0["metadata"]["uid"]))
        assert new_db0["metadata"]["name"] == "db-0"


async def _active(client: Client, uid: str, n: int, *, exclude: dict[str, Any] | None = None,
                  running: bool = False) -> list[dict[str, Any]] | None:
    pods = [p for p in await owned_pods(client, uid)
            if (exclude is None or p["metadata"]["uid"] != exclude["metadata"]["uid"])
            and (not running or (p.get("status") or {}).get("phase") == "Running")]
    return pods if len(pods) == n else None


async def _running(client: Client, name: str, not_uid: str | None = None) -> dict[str, Any] | None:
    try:
        p = await client.get("pods", name, NS, raw=True)
    except Exception:
        return None
    ok = (p.get("status") or {}).get("phase") == "Running" and p["metadata"]["uid"] != not_uid
    return p if ok and not p["metadata"].get("deletionTimestamp") else None
