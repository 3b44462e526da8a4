from __future__ import annotations

import asyncio
from typing import Any

from ctrl_helpers import NS, events_for, eventually, job, owned_pods, set_pod_status, stays

from gpufleet.client.api import Client
from gpufleet.client.errors import NotFound
from gpufleet.controllers.job import TRACKING_FINALIZER, format_indexes, parse_indexes

JOB = ("job",)
FAST = {"enabled": JOB, "job_pod_failure_backoff": 0.0}


async def job_status(client: Client, name: str) -> dict[str, Any]:
    return (await client.get("jobs", name, NS, raw=True)).get("status") or {}


async def condition(client: Client, name: str, type_: str) -> dict[str, Any] | None:
    for c in (await job_status(client, name)).get("conditions") or []:
        if c["type"] == type_ and c["status"] == "True":
            return c
    return None


async def active(client: Client, uid: str, n: int) -> list[dict[str, Any]] | None:
    pods = await owned_pods(client, uid)
    return pods if len(pods) == n else None


async def test_completions_and_parallelism(client: Client, controllers) -> None:
    await controllers(**FAST)
    j = await client.create(job("work", completions=3, parallelism=2), raw=True)
    uid = j["metadata"]["uid"]
    pods = await eventually(lambda: active(client, uid, 2), what="2 running pods")
    for p in pods:
        meta = p["metadata"]
        assert meta["name"].startswith("work-")
        assert TRACKING_FINALIZER in meta["finalizers"]
        assert meta["labels"]["batch.kubernetes.io/controller-uid"] == uid
        assert meta["labels"]["batch.kubernetes.io/job-name"] == "work"
        assert meta["labels"]["job-name"] == "work"
    await stays(lambda: _at_most(client, uid, 2), 0.3)
    status = await job_status(client, "work")
    assert status["active"] == 2 and "startTime" in status

    done: set[str] = set()
    for _ in range(3):
        pods = await eventually(lambda: _unfinished(client, uid, done), what="a pod to finish")
        name = pods[0]["metadata"]["name"]
        await set_pod_status(client, name, phase="Succeeded")
        done.add(name)
        await stays(lambda: _at_most(client, uid, 2), 0.1)

    cond = await eventually(lambda: condition(client, "work", "Complete"))
    assert cond["reason"] == "CompletionsReached"
    status = await job_status(client, "work")
    assert status["succeeded"] == 3 and status.get("failed", 0) == 0 and status.get("active", 0) == 0
    assert "completionTime" in status and "uncountedTerminatedPods" not in status
    assert any(c["type"] == "SuccessCriteriaMet" for c in status["conditions"])
    all_pods = await owned_pods(client, uid, active_only=False)
    assert len(all_pods) == 3
    assert all(TRACKING_FINALIZER not in (p["metadata"].get("finalizers") or []) for p in all_pods)
    assert await events_for(client, "work", "Completed")


async def test_backoff_limit_fails_the_job_and_kills_its_pods(client: Client, controllers) -> None:
    await controllers(**FAST)
    j = await client.create(job("flaky", completions=5, parallelism=2, backoffLimit=1), raw=True)
    uid = j["metadata"]["uid"]
    failed: set[str] = set()
    for _ in range(2):
        pods = await eventually(lambda: _unfinished(client, uid, failed))
        name = pods[0]["metadata"]["name"]
        await set_pod_status(client, name, phase="Failed")
        failed.add(name)
    cond = await eventually(lambda: condition(client, "flaky", "Failed"))
    assert cond["reason"] == "BackoffLimitExceeded"
    assert cond["message"] == "Job has reached the specified backoff limit"
    # The two failures, plus the replacement pod when it was created before the second failure
    # (that depends on the job's back-off timing): every pod ends up counted as failed once, and
    # a killed one only after its deletion has been observed, which may follow the condition.
    async def settled():
        status = await job_status(client, "flaky")
        created = len(await owned_pods(client, uid, active_only=False))
        ok = status.get("failed") in (2, 3) and status.get("failed") >= created and status.get("active", 0) == 0
        return status if ok else None

    await eventually(settled, what="every pod counted as failed and none active")
    assert await owned_pods(client, uid) == []
    (event,) = await events_for(client, "flaky", "BackoffLimitExceeded")
    assert event["type"] == "Warning"


async def test_active_deadline(client: Client, controllers) -> None:
    await controllers(**FAST)
    # A generous deadline first, so a loaded machine cannot end the Job before its pod is
    # seen; then the deadline is shortened (the field is mutable, as in Kubernetes).
    j = await client.create(job("slow", activeDeadlineSeconds=3600), raw=True)
    uid = j["metadata"]["uid"]
    (p,) = await eventually(lambda: active(client, uid, 1))
    await set_pod_status(client, p["metadata"]["name"], phase="Running")
    await client.patch("jobs", "slow", {"spec": {"activeDeadlineSeconds": 1}}, NS)
    cond = await eventually(lambda: condition(client, "slow", "Failed"), timeout=5)
    assert cond["reason"] == "DeadlineExceeded"
    assert cond["message"] == "Job was active longer than specified deadline"
    # The running pod was killed (no node agent here, so it went at once).
    await eventually(lambda: _gone(client, p["metadata"]["name"]))
    assert (await job_status(client, "slow"))["failed"] == 1


async def test_indexed_job(client: Client, controllers) -> None:
    await controllers(**FAST)
    j = await client.create(job("idx", completions=3, parallelism=3, completionMode="Indexed"), raw=True)
    uid = j["metadata"]["uid"]
    pods = await eventually(lambda: active(client, uid, 3))
    by_index = {}
    for p in pods:
        ix = p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        assert p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == ix
        assert p["metadata"]["name"].startswith(f"idx-{ix}-")
        assert p["spec"]["hostname"] == f"idx-{ix}"
        assert {"name": "JOB_COMPLETION_INDEX", "value": ix} in p["spec"]["containers"][0]["env"]
        by_index[int(ix)] = p["metadata"]["name"]
    assert sorted(by_index) == [0, 1, 2]

    # Index 1 fails and is retried under the same index; 0 and 2 succeed.
    await set_pod_status(client, by_index[1], phase="Failed")
    await set_pod_status(client, by_index[0], phase="Succeeded")
    retry = await eventually(lambda: _with_index(client, uid, 1, exclude=by_index[1]))
    # The failure is counted once its pod's finalizer is off, which may be a write after
    # the one that records index 0 as completed.
    await eventually(lambda: _status_has(client, "idx", completedIndexes="0", failed=1))
    await set_pod_status(client, by_index[2], phase="Succeeded")
    await set_pod_status(client, retry["metadata"]["name"], phase="Succeeded")
    await eventually(lambda: condition(client, "idx", "Complete"))
    status = await job_status(client, "idx")
    assert status["completedIndexes"] == "0-2" and status["succeeded"] == 3 and status["failed"] == 1


async def test_suspend_and_ttl(client: Client, controllers) -> None:
    await controllers(enabled=("job", "garbagecollector"), job_pod_failure_backoff=0.0)
    j = await client.create(job("later", suspend=True, ttlSecondsAfterFinished=0), raw=True)
    uid = j["metadata"]["uid"]
    await eventually(lambda: condition(client, "later", "Suspended"))
    assert await owned_pods(client, uid) == []
    await client.patch("jobs", "later", {"spec": {"suspend": False}}, NS)
    (p,) = await eventually(lambda: active(client, uid, 1))
    status = await job_status(client, "later")
    assert any(c["type"] == "Suspended" and c["status"] == "False" and c["reason"] == "JobResumed"
               for c in status["conditions"])
    await set_pod_status(client, p["metadata"]["name"], phase="Succeeded")
    # Finished with ttlSecondsAfterFinished=0: the job and its pods go.
    await eventually(lambda: _gone(client, "later", kind="jobs"), timeout=10)
    await eventually(lambda: _gone(client, p["metadata"]["name"]), timeout=10)


def test_index_sets_round_trip() -> None:
    assert parse_indexes("1,3-5,7") == {1, 3, 4, 5, 7}
    assert format_indexes({0, 1, 2, 4, 6, 7}) == "0-2,4,6-7"
    assert format_indexes(set()) == ""


# -- helpers -----------------------------------------------------------------------------------


async def _at_most(client: Client, uid: str, n: int) -> bool:
    return len(await owned_pods(client, uid)) <= n


async def _unfinished(client: Client, uid: str, exclude: set[str]) -> list[dict[str, Any]] | None:
    pods = [p for p in await owned_pods(client, uid) if p["metadata"]["name"] not in exclude]
    return pods or None


async def _gone(client: Client, name: str, kind: str = "pods") -> bool:
    try:
        await client.get(kind, name, NS, raw=True)
    except NotFound:
        return True
    return False


async def _with_index(client: Client, uid: str, ix: int, exclude: str) -> dict[str, Any] | None:
    for p in await owned_pods(client, uid):
        if p["metadata"]["name"] != exclude and p["metadata"]["annotations"].get(
                "batch.kubernetes.io/job-completion-index") == str(ix):
            return p
    return None


async def _status_has(client: Client, name: str, **want: Any) -> dict[str, Any] | None:
    status = await job_status(client, name)
    return status if all(status.get(k) == v for k, v in want.items()) else None


async def test_deleting_a_running_job_releases_its_pods(client: Client, controllers) -> None:
    await controllers(enabled=("job", "garbagecollector"), job_pod_failure_backoff=0.0)
    j = await client.create(job("doomed", parallelism=2, completions=4), raw=True)
    pods = await eventually(lambda: active(client, j["metadata"]["uid"], 2))
    await client.delete("jobs", "doomed", NS, propagation_policy="Background")
    # The pods hold the tracking finalizer; the job controller lets go of it once the job is gone.
    for p in pods:
        await eventually(lambda p=p: _gone(client, p["metadata"]["name"]), timeout=10)


async def test_a_failed_pod_is_replaced_when_the_back_off_ends_with_nothing_else_happening(
        client: Client, controllers) -> None:
    # The sync that finds the back-off still running asks to come back when it ends: no
    # other event is needed to make the replacement (a quiet cluster, or a trace replay).
    await controllers(enabled=JOB, job_pod_failure_backoff=1.0)
    j = await client.create(job("retry", backoffLimit=3), raw=True)
    uid = j["metadata"]["uid"]
    first = (await eventually(lambda: active(client, uid, 1), what="the first pod"))[0]
    await set_pod_status(client, first["metadata"]["name"], phase="Failed")
    replacement = await eventually(lambda: active(client, uid, 1), timeout=10, what="a replacement after 1 s")
    assert replacement[0]["metadata"]["name"] != first["metadata"]["name"]
    assert (await job_status(client, "retry")).get("failed") == 1


async def _record_succeeded(client: Client, name: str, since: str, seen: list[int]) -> None:
    async for ev in client.watch("jobs", NS, resource_version=since, raw=True):
        if ev.type == "MODIFIED" and ev.object["metadata"]["name"] == name:
            seen.append((ev.object.get("status") or {}).get("succeeded", 0))


async def test_a_burst_of_pod_completions_is_counted_in_one_sync(client: Client, controllers) -> None:
    # Upstream's SyncJobBatchPeriod: pod events bring the Job back a second later, together.
    await controllers(**FAST)
    j = await client.create(job("burst", completions=3, parallelism=3), raw=True)
    uid = j["metadata"]["uid"]
    pods = await eventually(lambda: active(client, uid, 3), what="3 pods")
    await eventually(lambda: _has_active(client, "burst", 3), what="3 active counted")
    seen: list[int] = []
    since = (await client.get("jobs", "burst", NS, raw=True))["metadata"]["resourceVersion"]
    watcher = asyncio.ensure_future(_record_succeeded(client, "burst", since, seen))
    try:
        for p in pods:
            await set_pod_status(client, p["metadata"]["name"], phase="Succeeded")
        await eventually(lambda: condition(client, "burst", "Complete"), what="the Job complete")
        await eventually(lambda: 3 in seen or None, what="the count seen by the watch")
    finally:
        watcher.cancel()
    assert [n for n in seen if n] == [3] * len([n for n in seen if n]), seen  # never 1 or 2


async def _has_active(client: Client, name: str, n: int) -> bool:
    return (await job_status(client, name)).get("active") == n
