"""The CronJob controller against a real API server, on a clock of its own: the controller's
clock is the real one shifted, so a minute boundary comes when the test says, and moving it on
by a minute makes the next run due (no test waits a real minute)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ctrl_helpers import NS, eventually, stays

from gpufleet.client.api import Client
from gpufleet.client.errors import Conflict, NotFound
from gpufleet.utils.clock import parse_rfc3339, rfc3339


class ShiftedClock:
    """Real time plus ``offset`` seconds (monotonic time is the real one)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def cronjob(name: str, schedule: str = "* * * * *", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "namespace": NS},
        "spec": {"schedule": schedule, "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}]}}}}, **spec},
    }


async def jobs_of(client: Client, uid: str) -> dict[str, dict[str, Any]]:
    items = await client.list("jobs", NS, raw=True)
    return {j["metadata"]["name"]: j for j in items
            if any(r.get("uid") == uid for r in j["metadata"].get("ownerReferences") or [])}


async def complete(client: Client, job: dict[str, Any], at: float) -> None:
    job = await client.get("jobs", job["metadata"]["name"], NS, raw=True)
    job["status"] = {"startTime": rfc3339(at), "completionTime": rfc3339(at + 1), "succeeded": 1,
                     "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": rfc3339(at + 1)}]}
    await client.update_status(job, raw=True)


async def test_every_minute_a_job_runs_and_the_history_limit_holds(client: Client, controllers) -> None:
    clock = ShiftedClock()
    await controllers(enabled=("cronjob",), clock=clock)
    real = time.time()
    boundary = (int(real) // 60 + 1) * 60
    clock.offset = boundary - 0.5 - real  # the controller's minute ends in half a second
    cj = await client.create(cronjob("tick", successfulJobsHistoryLimit=2), raw=True)
    uid, minute = cj["metadata"]["uid"], boundary // 60

    names = []
    for i in range(5):
        name = f"tick-{minute + i}"
        jobs = await eventually(lambda n=name: _has(jobs_of(client, uid), n), what=f"Job {name}")
        job = jobs[name]
        assert job["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"] == \
            rfc3339((minute + i) * 60)
        # The API server gave it the selector of its own uid.
        assert job["spec"]["selector"]["matchLabels"] == {"batch.kubernetes.io/controller-uid": job["metadata"]["uid"]}
        status = (await client.get("cronjobs", "tick", NS, raw=True)).get("status") or {}
        if [r["name"] for r in status.get("active") or []] != [name]:
            status = await eventually(lambda n=name: _active_is(client, n), what=f"{name} active")
        assert status["lastScheduleTime"] == rfc3339((minute + i) * 60)
        names.append(name)
        if i < 4:
            clock.offset += 60  # the next minute begins; finishing this run wakes the controller
            await complete(client, job, (minute + i) * 60)

    async def trimmed() -> dict[str, Any] | None:
        jobs = await jobs_of(client, uid)
        return jobs if set(jobs) == set(names[2:]) else None

    # Four runs finished, two are kept (the newest), the fifth runs.
    await eventually(trimmed, what="the oldest finished Jobs deleted")
    status = (await client.get("cronjobs", "tick", NS, raw=True))["status"]
    assert status["lastSuccessfulTime"] == rfc3339((minute + 3) * 60 + 1)
    assert [r["name"] for r in status["active"]] == [names[4]]


async def _has(jobs_coro, name: str) -> dict[str, Any] | None:
    jobs = await jobs_coro
    return jobs if name in jobs else None


async def _active_is(client: Client, name: str) -> dict[str, Any] | None:
    status = (await client.get("cronjobs", "tick", NS, raw=True)).get("status") or {}
    return status if [r["name"] for r in status.get("active") or []] == [name] else None


async def test_forbid_waits_for_the_running_job_and_suspend_stops_runs(client: Client, controllers) -> None:
    clock = ShiftedClock()
    await controllers(enabled=("cronjob",), clock=clock)
    cj = await client.create(cronjob("solo", concurrencyPolicy="Forbid"), raw=True)
    uid = cj["metadata"]["uid"]
    created = parse_rfc3339(cj["metadata"]["creationTimestamp"])
    first = (int(created) // 60 + 1) * 60
    clock.offset = first + 1 - time.time()  # the first run is due
    # Nothing wakes the controller but its own requeue (in real time): poke it with a label.
    await _touch(client, "solo")
    jobs = await eventually(lambda: _count(jobs_of(client, uid), 1), what="the first run")
    clock.offset += 60
    await _touch(client, "solo")

    async def forbidden() -> bool:
        events = await client.list("events", NS, raw=True)
        return any(e.get("reason") == "JobAlreadyActive" for e in events)

    await eventually(forbidden, what="the JobAlreadyActive event")
    await stays(lambda: _count(jobs_of(client, uid), 1), 0.3)  # the first one still runs: Forbid skips

    cj = await client.get("cronjobs", "solo", NS, raw=True)
    cj["spec"]["suspend"] = True
    await client.update(cj, raw=True)
    (job,) = jobs.values()
    clock.offset += 60  # a run is due, and finishing the Job wakes the controller: suspended, none starts
    await complete(client, job, first)
    await stays(lambda: _count(jobs_of(client, uid), 1), 0.3)  # suspended: no new run
    try:
        await client.delete("cronjobs", "solo", NS)
    except NotFound:
        pass


async def _touch(client: Client, name: str) -> None:
    """A label write that wakes the controller; read again and retried when the controller's
    own status write came in between (client-go's RetryOnConflict)."""
    for _ in range(10):
        cj = await client.get("cronjobs", name, NS, raw=True)
        cj["metadata"].setdefault("labels", {})["touched"] = str(time.monotonic_ns())
        try:
            await client.update(cj, raw=True)
            return
        except Conflict:
            continue
    raise AssertionError(f"cronjob {name}: 10 conflicts in a row")


async def _count(jobs_coro, n: int) -> dict[str, Any] | None:
    jobs = await jobs_coro
    return jobs if len(jobs) == n else None
