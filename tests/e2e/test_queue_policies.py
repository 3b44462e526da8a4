"""A queueing policy live: on a real `gpufleet up` (process runtime, 2 declared GPUs), two
ClusterQueues of 1 GPU each, one with the attained-service policy (its own levels: 6
GPU-seconds, so a 20-second job crosses one in a test's time), one with Kueue's FIFO.

In each queue a long job (40 steps of 0.5 s, its step checkpointed in a local-path claim)
runs past the level, then a short job (4 steps) is submitted. Under attained-service the
long job is preempted through the ordinary eviction (its pod stopped), the short job runs
at once, and the long job is admitted again and resumes from its checkpoint (not from step
0) to finish all 40 steps. Under FIFO the short job waits for the long one. The short
jobs' completion times are printed side by side.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import pytest
from test_pod_contract import BUSYBOX, Plane, running_plane, wait_until

from gpufleet.client.api import Client
from gpufleet.client.errors import BadRequest, NotFound

pytestmark = pytest.mark.e2e

NS = "default"
GPU = "nvidia.com/gpu"
KUEUE = "kueue.x-k8s.io/v1beta1"
STEPS = 40
LEVEL_GPU_SECONDS = 6

LONG = (f"s=$(cat /ckpt/step 2>/dev/null || echo 0); echo resumed at $s; "
        f"while [ $s -lt {STEPS} ]; do sleep 0.5; s=$((s+1)); echo $s > /ckpt/step; echo step $s; done; "
        f"echo done at $s")
SHORT = "for i in 1 2 3 4; do sleep 0.5; done; echo short done"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with running_plane(tmp_path_factory.mktemp("policies"), "--runtime", "process", "--gpus", "2") as p:
        yield p


def queues() -> list[dict]:
    objs: list[dict] = [{"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": "gpu"}}]
    for name, notes in (
        ("las", {"gpufleet.io/queueing-policy": "attained-service",
                 "gpufleet.io/attained-service-levels": str(LEVEL_GPU_SECONDS)}),
        ("fifo", {}),
    ):
        objs.append({"apiVersion": KUEUE, "kind": "ClusterQueue",
                     "metadata": {"name": name, "annotations": notes},
                     "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": [GPU], "flavors": [
                         {"name": "gpu", "resources": [{"name": GPU, "nominalQuota": 1}]}]}]}})
        objs.append({"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": name, "namespace": NS},
                     "spec": {"clusterQueue": name}})
    return objs


def job(name: str, queue: str, script: str, claim: str | None = None) -> dict:
    container: dict = {"name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                       "command": ["sh", "-c", script], "resources": {"limits": {GPU: "1"}}}
    spec: dict = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                  "securityContext": {"runAsUser": 1234, "runAsGroup": 1234, "fsGroup": 2000},
                  "containers": [container]}
    if claim:
        container["volumeMounts"] = [{"name": "ckpt", "mountPath": "/ckpt"}]
        spec["volumes"] = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": claim}}]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "labels": {"kueue.x-k8s.io/queue-name": queue}},
            # A pod stopped by a preemption counts against backoffLimit, as on Kubernetes.
            "spec": {"backoffLimit": 6, "template": {"spec": spec}}}


def claim(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": NS},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}}


async def complete(client: Client, name: str) -> bool:
    try:
        j = await client.get("jobs", name, NS, raw=True)
    except NotFound:
        return False
    return any(c.get("type") == "Complete" and c.get("status") == "True"
               for c in (j.get("status") or {}).get("conditions") or [])


async def logs_of(client: Client, job_name: str) -> list[str]:
    """Every log of the job's pods that are still there, oldest pod first."""
    pods = (await client.list("pods", NS, label_selector=f"batch.kubernetes.io/job-name={job_name}", raw=True)).items
    pods.sort(key=lambda p: p["metadata"]["creationTimestamp"])
    out = []
    for p in pods:
        try:
            out.append(await client.log(p["metadata"]["name"], NS))
        except (NotFound, BadRequest):  # gone, or not started yet
            continue
    return out


async def last_step(client: Client, job_name: str) -> int:
    steps = [int(s) for log in await logs_of(client, job_name) for s in re.findall(r"^step (\d+)$", log, re.M)]
    return max(steps, default=0)


async def test_attained_service_preempts_a_long_job_for_a_short_one_through_checkpoint_restart(plane: Plane):
    client = plane.client()
    try:
        for obj in [*queues(), claim("ckpt-las"), claim("ckpt-fifo")]:
            await client.create(obj)
        for q in ("las", "fifo"):
            await client.create(job(f"long-{q}", q, LONG, claim=f"ckpt-{q}"))

        # Both long jobs run past the level (6 GPU-s: 12 steps of 0.5 s), a few steps more.
        async def past_level() -> bool:
            return all([await last_step(client, f"long-{q}") >= 16 for q in ("las", "fifo")])

        await wait_until(past_level, 120, "both long jobs past 16 steps", plane)
        submitted: dict[str, float] = {}
        for q in ("las", "fifo"):
            await client.create(job(f"short-{q}", q, SHORT))
            submitted[q] = time.monotonic()

        jct: dict[str, float] = {}

        async def shorts_done() -> bool:
            for q in ("las", "fifo"):
                if q not in jct and await complete(client, f"short-{q}"):
                    jct[q] = time.monotonic() - submitted[q]
            return len(jct) == 2

        await wait_until(shorts_done, 120, "both short jobs to complete", plane)

        async def longs_done() -> bool:
            return all([await complete(client, f"long-{q}") for q in ("las", "fifo")])

        try:
            await wait_until(longs_done, 120, "both long jobs to complete", plane)
        except BaseException:
            for q in ("las", "fifo"):
                j = await client.get("jobs", f"long-{q}", NS, raw=True)
                print("JOB", q, j["spec"].get("suspend"), j.get("status"))
                print("LOGS", q, await logs_of(client, f"long-{q}"))
            for w in (await client.list("workloads", NS, raw=True)).items:
                print("WL", w["metadata"]["name"], w.get("status"))
            raise

        # attained-service: the long job was preempted (its Workload evicted for the short
        # one), restarted from its checkpoint and finished every step.
        workloads = (await client.list("workloads", NS, raw=True)).items
        by_job = {w["metadata"]["ownerReferences"][0]["name"]: w for w in workloads}
        long_wl = by_job["long-las"]
        conditions = {c["type"]: c for c in long_wl["status"]["conditions"]}
        assert conditions["Preempted"]["message"] == "Previously: preempted, now admitted again", conditions
        events = (await client.list("events", NS, field_selector={
            "involvedObject.name": long_wl["metadata"]["name"]}, raw=True)).items
        preempted = [e["message"] for e in events if e["reason"] == "Preempted"]
        assert len(preempted) == 1 and "short-las" in preempted[0], [(e["reason"], e["message"]) for e in events]
        assert by_job["long-las"]["metadata"]["annotations"]["gpufleet.io/attained-gpu-seconds"]
        las_log = (await logs_of(client, "long-las"))[-1]
        resumed = int(re.search(r"resumed at (\d+)", las_log).group(1))  # type: ignore[union-attr]
        assert resumed >= 16 and f"done at {STEPS}" in las_log, las_log
        assert f"step {resumed + 1}\n" in las_log and "step 1\n" not in las_log, las_log
        # FIFO: nothing preempted, the long job ran once from step 0.
        assert "Evicted" not in {c["type"] for c in by_job["long-fifo"]["status"]["conditions"]}
        fifo_logs = await logs_of(client, "long-fifo")
        assert len(fifo_logs) == 1 and "resumed at 0" in fifo_logs[0] and f"done at {STEPS}" in fifo_logs[0]

        print(f"\nshort job (4 steps of 0.5 s) submitted while a {STEPS}-step job held the queue's GPU, "
              f"submit -> Complete: attained-service {jct['las']:.1f} s (the long job preempted, resumed from "
              f"step {resumed}), FIFO {jct['fifo']:.1f} s (waited for the long job)")
        assert jct["las"] < jct["fifo"], jct
    finally:
        await client.close()
        await asyncio.sleep(0)
