"""The queue controller against a real API server: queued Jobs start suspended, get a
Workload, are admitted with their flavor's node labels, wait with a reason, and are preempted
as a whole when the cohort's owner reclaims its quota."""

from __future__ import annotations

from typing import Any

import pytest
from ctrl_helpers import NS, FakeAgent, events_for, eventually, set_pod_status

from gpufleet.api.kueue import QUEUE_NAME_LABEL
from gpufleet.client.api import Client

GPU = "nvidia.com/gpu"
KUEUE = "kueue.x-k8s.io/v1beta1"


async def gpu_node(client: Client, name: str, gpus: int, labels: dict[str, str] | None = None,
                   taints: list[dict[str, str]] | None = None) -> None:
    await client.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
                         "spec": {"taints": taints} if taints else {}})
    node = await client.get("nodes", name, raw=True)
    node["status"] = {
        "capacity": {GPU: str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"},
        "allocatable": {GPU: str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": "KubeletReady",
                        "message": "ready"}],
    }
    await client.update_status(node)


def flavor(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": {**({"nodeLabels": labels} if labels else {}), **spec}}


def cluster_queue(name: str, gpus: int, *, flavor_name: str = "default", cohort: str | None = None,
                  **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name},
        "spec": {"resourceGroups": [{"coveredResources": [GPU], "flavors": [
            {"name": flavor_name, "resources": [{"name": GPU, "nominalQuota": gpus}]}]}], **spec},
    }
    if cohort:
        body["spec"]["cohort"] = cohort
    return body


def local_queue(name: str, cq: str) -> dict[str, Any]:
    return {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": name, "namespace": NS},
            "spec": {"clusterQueue": cq}}


def gpu_job(name: str, queue: str, pods: int, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "labels": {QUEUE_NAME_LABEL: queue}},
        "spec": {
            "parallelism": pods, "completions": pods,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "trainer:v1", "resources": {"limits": {GPU: str(gpus)}}}]}},
        },
    }


async def workload_of(client: Client, job_name: str) -> dict[str, Any] | None:
    job = await client.get("jobs", job_name, NS, raw=True)
    for wl in await client.list("workloads", NS, raw=True):
        refs = wl["metadata"].get("ownerReferences") or []
        if any(r.get("uid") == job["metadata"]["uid"] for r in refs):
            return wl
    return None


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return {}


async def job_pods(client: Client, job_name: str) -> list[dict[str, Any]]:
    return [p for p in await client.list("pods", NS, raw=True)
            if p["metadata"].get("labels", {}).get("batch.kubernetes.io/job-name") == job_name
            and not p["metadata"].get("deletionTimestamp")]


@pytest.fixture
async def kueue(client: Client, controllers):
    return await controllers(enabled=("job", "kueue", "garbagecollector"))


async def test_queued_job_starts_suspended_and_runs_once_admitted_on_its_flavor(client: Client, kueue):
    taint = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
    for i in range(2):
        await gpu_node(client, f"h{i}", 4, {"gpu": "h100"}, [taint])
    await client.create(flavor("h100", {"gpu": "h100"}, tolerations=[{**taint, "operator": "Equal"}]))
    await client.create(cluster_queue("team-a", 8, flavor_name="h100"))
    await client.create(local_queue("a", "team-a"))

    created = await client.create(gpu_job("train", "a", 2, 2), raw=True)
    assert created["spec"]["suspend"] is True  # before any controller saw it

    async def admitted() -> dict | None:
        wl = await workload_of(client, "train")
        return wl if condition(wl, "Admitted").get("status") == "True" else None

    wl = await eventually(admitted, what="workload admitted")
    assert wl["spec"]["podSets"][0]["count"] == 2
    assert wl["status"]["admission"]["clusterQueue"] == "team-a"
    assert wl["status"]["admission"]["podSetAssignments"][0]["flavors"] == {GPU: "h100"}
    pods = await eventually(lambda: _two(job_pods(client, "train")), what="pods of the admitted job")
    assert all(p["spec"].get("nodeSelector") == {"gpu": "h100"} for p in pods)
    assert all({**taint, "operator": "Equal"} in p["spec"]["tolerations"] for p in pods)
    job = await client.get("jobs", "train", NS, raw=True)
    assert job["spec"]["suspend"] is False

    async def counted() -> bool:
        lq = await client.get("localqueues", "a", NS, raw=True)
        cq = await client.get("clusterqueues", "team-a", raw=True)
        return (lq.get("status") or {}).get("admittedWorkloads") == 1 and \
            (cq.get("status") or {}).get("flavorsUsage", [{}])[0].get("resources", [{}])[0].get("total") == "4"

    await eventually(counted, what="queue status")


async def _two(coro) -> list | None:
    pods = await coro
    return pods if len(pods) == 2 else None


async def test_a_waiting_job_says_why_quota_or_shape(client: Client, kueue):
    for i in range(4):
        await gpu_node(client, f"n{i}", 2)
    await client.create(flavor("default"))
    await client.create(cluster_queue("team-a", 8))
    await client.create(local_queue("a", "team-a"))
    await client.create(gpu_job("wide", "a", 1, 8))  # 8 GPUs on one node: no node has them
    await client.create(gpu_job("greedy", "a", 5, 2))  # 10 GPUs: over the quota

    async def reason(job: str) -> str:
        wl = await workload_of(client, job)
        c = condition(wl, "QuotaReserved")
        return c.get("reason", "") if c.get("status") == "False" else ""

    assert await eventually(lambda: _eq(reason("wide"), "Shape"), what="shape reason")
    assert await eventually(lambda: _eq(reason("greedy"), "Quota"), what="quota reason")
    wl = await workload_of(client, "wide")
    assert "2+2+2+2" in condition(wl, "QuotaReserved")["message"]
    assert not await job_pods(client, "wide")
    pending = await eventually(lambda: events_for(client, "greedy", "Pending"), what="Pending event on the job")
    assert "insufficient unused quota for nvidia.com/gpu" in pending[0]["message"]

    async def reasons() -> dict | None:
        lq = await client.get("localqueues", "a", NS, raw=True)
        got = (lq.get("status") or {}).get("pendingReasons")
        return got if got == {"Quota": 1, "Shape": 1} else None

    await eventually(reasons, what="reasons counted on the LocalQueue")


async def _eq(coro, want: str) -> bool:
    return (await coro) == want


async def test_the_owner_reclaims_borrowed_quota_by_preempting_whole_jobs(client: Client, kueue):
    for i in range(4):
        await gpu_node(client, f"n{i}", 4)
    await client.create(flavor("default"))
    for team in ("a", "b"):
        await client.create(cluster_queue(f"team-{team}", 8, cohort="lab",
                                          preemption={"reclaimWithinCohort": "Any"}))
        await client.create(local_queue(team, f"team-{team}"))
    async with FakeAgent(client, delay=0.0):
        for i in range(3):
            await client.create(gpu_job(f"a{i}", "a", 2, 2))
        for i in range(3):
            await eventually(lambda i=i: _two(job_pods(client, f"a{i}")), what=f"a{i} running")
        for i in range(2):
            await client.create(gpu_job(f"b{i}", "b", 2, 2))
        for i in range(2):
            await eventually(lambda i=i: _two(job_pods(client, f"b{i}")), timeout=15, what=f"b{i} running")

        async def preempted() -> list[str]:
            out = []
            for i in range(3):
                wl = await workload_of(client, f"a{i}")
                if condition(wl, "Preempted").get("status") == "True":
                    out.append(f"a{i}")
            return out

        victims = await eventually(preempted, what="a preempted job")
        assert victims == ["a2"]  # one whole job of the borrower, the latest admitted
        wl = await workload_of(client, "a2")
        assert condition(wl, "Preempted")["reason"] == "InCohortReclamation"
        assert condition(wl, "Evicted")["reason"] == "Preempted"
        job = await client.get("jobs", "a2", NS, raw=True)
        assert job["spec"]["suspend"] is True
        assert await job_pods(client, "a2") == []
        assert "admission" not in wl["status"]
        assert condition(wl, "QuotaReserved")["status"] == "False"
        # The others of team a keep running.
        for i in range(2):
            assert len(await job_pods(client, f"a{i}")) == 2


async def test_pytorchjob_waits_in_its_queue_and_runs_as_one_gang(client: Client, controllers):
    await controllers(enabled=("pytorchjob", "kueue", "garbagecollector"), pytorchjob_restart_backoff=0.0)
    for i in range(2):
        await gpu_node(client, f"n{i}", 4, {"pool": "train"})
    await client.create(flavor("train", {"pool": "train"}))
    await client.create(cluster_queue("team-a", 8, flavor_name="train"))
    await client.create(local_queue("a", "team-a"))

    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [{
            "name": "pytorch", "image": "train:v1", "resources": {"limits": {GPU: "4"}}}]}}}

    def ptjob(name: str, workers: int) -> dict[str, Any]:
        return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"name": name, "namespace": NS, "labels": {QUEUE_NAME_LABEL: "a"}},
                "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(workers)}}}

    created = await client.create(ptjob("big", 2), raw=True)  # 12 GPUs: more than the quota
    assert created["spec"]["runPolicy"]["suspend"] is True
    await client.create(ptjob("fits", 1), raw=True)  # master + 1 worker x 4 GPUs = 8

    async def pods(job: str) -> list[dict[str, Any]]:
        return [p for p in await client.list("pods", NS, raw=True)
                if p["metadata"]["labels"].get("training.kubeflow.org/job-name") == job
                and not p["metadata"].get("deletionTimestamp")]

    async def gang() -> list | None:
        got = await pods("fits")
        return got if len(got) == 2 else None

    running = await eventually(gang, what="the fitting PyTorchJob's pods")
    assert all(p["spec"]["nodeSelector"] == {"pool": "train"} for p in running)

    async def wl_of(name: str) -> dict[str, Any] | None:
        job = await client.get("pytorchjobs", name, NS, raw=True)
        for wl in await client.list("workloads", NS, raw=True):
            if any(r.get("uid") == job["metadata"]["uid"] for r in wl["metadata"].get("ownerReferences") or []):
                return wl
        return None

    wl = await eventually(lambda: wl_of("fits"), what="workload")
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [("master", 1), ("worker", 1)]
    assert wl["metadata"]["name"].startswith("pytorchjob-fits-")

    async def big_waits() -> str:
        c = condition(await wl_of("big"), "QuotaReserved")
        return c.get("reason", "") if c.get("status") == "False" else ""

    assert await eventually(lambda: _eq(big_waits(), "Quota"), what="the big job waiting")
    assert await pods("big") == []


async def test_a_finished_job_gives_its_quota_to_the_next_in_line(client: Client, kueue):
    await gpu_node(client, "n0", 4)
    await client.create(flavor("default"))
    await client.create(cluster_queue("team-a", 4))
    await client.create(local_queue("a", "team-a"))
    await client.create(gpu_job("first", "a", 1, 4))
    first = await eventually(lambda: _one(job_pods(client, "first")), what="first running")
    await client.create(gpu_job("second", "a", 1, 4))

    async def reason(job: str) -> str:
        c = condition(await workload_of(client, job), "QuotaReserved")
        return f"{c.get('status')}/{c.get('reason')}"

    assert await eventually(lambda: _eq(reason("second"), "False/Quota"), what="second waiting")
    await set_pod_status(client, first[0]["metadata"]["name"], phase="Succeeded")
    await eventually(lambda: _one(job_pods(client, "second")), what="second running after first finished")
    wl = await workload_of(client, "first")
    assert condition(wl, "Finished")["status"] == "True"


async def _one(coro) -> list | None:
    pods = await coro
    return pods if len(pods) == 1 else None


async def test_deactivating_a_workload_stops_its_job_and_frees_the_quota(client: Client, kueue):
    await gpu_node(client, "n0", 4)
    await client.create(flavor("default"))
    await client.create(cluster_queue("team-a", 4))
    await client.create(local_queue("a", "team-a"))
    await client.create(gpu_job("first", "a", 1, 4))
    await eventually(lambda: _one(job_pods(client, "first")), what="first running")
    await client.create(gpu_job("second", "a", 1, 4))
    wl = await eventually(lambda: workload_of(client, "first"), what="workload")
    await client.patch("workloads", wl["metadata"]["name"], {"spec": {"active": False}}, NS)
    async with FakeAgent(client, delay=0.0):
        await eventually(lambda: _one(job_pods(client, "second")), what="second running")
    assert (await client.get("jobs", "first", NS, raw=True))["spec"]["suspend"] is True
    assert condition(await workload_of(client, "first"), "Evicted")["reason"] == "InactiveWorkload"


async def test_gpus_asked_of_a_queue_without_gpus_are_inadmissible(client: Client, kueue):
    await gpu_node(client, "n0", 8)
    await client.create(flavor("default"))
    await client.create({"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": "cpus"},
                         "spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                             {"name": "default", "resources": [{"name": "cpu", "nominalQuota": 64}]}]}]}})
    await client.create(local_queue("c", "cpus"))
    await client.create(gpu_job("gpus", "c", 1, 1))
    message = "couldn't assign flavors to pod set main: resource nvidia.com/gpu unavailable in ClusterQueue"

    async def refused() -> dict | None:
        wl = await workload_of(client, "gpus")
        c = condition(wl, "QuotaReserved")
        return wl if (c.get("status"), c.get("reason"), c.get("message")) == ("False", "Inadmissible", message) \
            else None

    wl = await eventually(refused, what="QuotaReserved=False, Inadmissible")
    assert condition(wl, "Admitted").get("status") != "True" and not (wl.get("status") or {}).get("admission")
    on_workload = await eventually(lambda: events_for(client, wl["metadata"]["name"], "Pending"),
                                   what="Pending event on the workload")
    assert on_workload[0]["message"] == message
    on_job = await eventually(lambda: events_for(client, "gpus", "Pending"), what="Pending event on the job")
    assert on_job[0]["message"] == f"Inadmissible: {message}"
    assert not await job_pods(client, "gpus")
    assert (await client.get("jobs", "gpus", NS, raw=True))["spec"]["suspend"] is True
