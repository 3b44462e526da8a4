"""Two teams share a 16-GPU fleet through Kueue-style queues, on real processes: a
`gpufleet server` and four `gpufleet agent`s (4 declared GPUs each, simulated runtime).

Each team's ClusterQueue holds 8 GPUs nominally, in one cohort. Team A submits 12 GPUs of
gang jobs while team B is idle and borrows B's unused quota: all 12 GPUs run. Then team B
submits its 8: the job that fits the spare GPUs starts at once, A's borrowed job is
preempted whole (suspended, every pod gone) and B's second job takes its place. The test
prints how long B's jobs waited, and what `gpufleet get queues` / `get workloads` show.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import Fleet, running_fleet

from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import transport_from_kubeconfig

pytestmark = pytest.mark.e2e

NODES = ("node-0", "node-1", "node-2", "node-3")
GPUS_PER_NODE = 4
GPU = "nvidia.com/gpu"
KUEUE = "kueue.x-k8s.io/v1beta1"
NS = "default"
START_TIMEOUT = 60.0


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with running_fleet(
        tmp_path, ["server", "--store", f"sqlite:///{tmp_path / 'state.db'}", "--gateway-port", "-1"], NODES,
        gpus=GPUS_PER_NODE, gpu_model="H100-SXM-80GB", runtime="simulated", poll_interval=0.2,
    ) as f:
        yield f


def cli(fleet: Fleet, *args: str) -> str:
    res = fleet.run_cli(*args)
    assert res.returncode == 0, f"gpufleet {' '.join(args)}: {res.stderr}"
    return res.stdout


def team_objects() -> list[dict]:
    objs: list[dict] = [{"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": "h100"},
                         "spec": {"nodeLabels": {"nvidia.com/gpu.product": "H100-SXM-80GB"}}}]
    for team in ("a", "b"):
        objs.append({
            "apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": f"team-{team}"},
            "spec": {
                "cohort": "lab",
                "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
                "resourceGroups": [{"coveredResources": [GPU], "flavors": [
                    {"name": "h100", "resources": [{"name": GPU, "nominalQuota": 8}]}]}],
            },
        })
        objs.append({"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": team, "namespace": NS},
                     "spec": {"clusterQueue": f"team-{team}"}})
    return objs


def gang_job(name: str, team: str) -> dict:
    """Two pods of 2 GPUs that belong together: 4 GPUs per job."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "labels": {"kueue.x-k8s.io/queue-name": team}},
        "spec": {
            "parallelism": 2, "completions": 2,
            "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [{
                "name": "train", "image": "trainer:v1", "resources": {"limits": {GPU: "2"}}}]}},
        },
    }


async def running_pods(client: Client) -> dict[str, list[dict]]:
    """job name -> its pods that are Running and not being deleted."""
    out: dict[str, list[dict]] = {}
    for p in await client.list("pods", NS, raw=True):
        if p["metadata"].get("deletionTimestamp") or (p.get("status") or {}).get("phase") != "Running":
            continue
        out.setdefault(p["metadata"]["labels"].get("batch.kubernetes.io/job-name", ""), []).append(p)
    return out


async def all_pods_of(client: Client, job: str) -> list[dict]:
    return [p for p in await client.list("pods", NS, raw=True)
            if p["metadata"]["labels"].get("batch.kubernetes.io/job-name") == job]


async def workload(client: Client, job: str) -> dict:
    uid = (await client.get("jobs", job, NS, raw=True))["metadata"]["uid"]
    for wl in await client.list("workloads", NS, raw=True):
        if any(r.get("uid") == uid for r in wl["metadata"].get("ownerReferences") or []):
            return wl
    return {}


def condition(obj: dict, type_: str) -> dict:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return {}


async def test_team_b_reclaims_what_team_a_borrowed(fleet: Fleet) -> None:
    async with Client(transport_from_kubeconfig(fleet.kubeconfig)) as client:
        await fleet.nodes_ready(client, START_TIMEOUT)
        for obj in team_objects():
            await client.create(obj)

        # Team A: 3 gangs x 4 GPUs = 12, while B is idle.
        a_jobs = [f"a{i}" for i in range(3)]
        for name in a_jobs:
            await client.create(gang_job(name, "a"))

        async def a_running():
            pods = await running_pods(client)
            return all(len(pods.get(j, [])) == 2 for j in a_jobs)

        await fleet.wait_until(a_running, 30, "team A's 12 GPUs running")
        cq_a = await client.get("clusterqueues", "team-a", raw=True)
        usage = cq_a["status"]["flavorsUsage"][0]["resources"][0]
        assert (usage["total"], usage["borrowed"]) == ("12", "4"), usage

        # Team B submits its 8 GPUs.
        b_jobs = [f"b{i}" for i in range(2)]
        submitted = time.monotonic()
        for name in b_jobs:
            await client.create(gang_job(name, "b"))
        started: dict[str, float] = {}

        async def b_running():
            pods = await running_pods(client)
            for j in b_jobs:
                if len(pods.get(j, [])) == 2 and j not in started:
                    started[j] = time.monotonic() - submitted
            return len(started) == len(b_jobs)

        await fleet.wait_until(b_running, 40, "team B's 8 GPUs running")
        for j in b_jobs:
            print(f"team B job {j} waited {started[j]:.2f}s from submission to both pods Running")

        # Exactly one of A's gangs gave its GPUs back, whole: suspended, no pod left.
        preempted = []
        for j in a_jobs:
            wl = await workload(client, j)
            if condition(wl, "Preempted").get("status") == "True":
                preempted.append(j)
                assert condition(wl, "Preempted")["reason"] == "InCohortReclamation"
        assert len(preempted) == 1, preempted
        victim = preempted[0]
        assert (await client.get("jobs", victim, NS, raw=True))["spec"]["suspend"] is True

        async def victim_gone():
            return not await all_pods_of(client, victim)

        await fleet.wait_until(victim_gone, 10, f"every pod of {victim} gone")
        pods = await running_pods(client)
        assert sorted(j for j in pods if j) == sorted({*a_jobs, *b_jobs} - {victim})
        gpus = sum(int(c["resources"]["limits"][GPU]) for ps in pods.values() for p in ps
                   for c in p["spec"]["containers"])
        assert gpus == 16

        # The victim waits for quota again, and the tables say so.
        async def victim_waits():
            c = condition(await workload(client, victim), "QuotaReserved")
            return c if c.get("status") == "False" and c.get("reason") == "Quota" else None

        await fleet.wait_until(victim_waits, 10, f"{victim} waiting for quota")
        queues = cli(fleet, "get", "queues")
        print(queues)
        assert re.search(r"^a\s+team-a\s+1\s+2\s+Quota=1", queues, re.M), queues
        assert re.search(r"^b\s+team-b\s+0\s+2\s+<none>", queues, re.M), queues
        cqs = cli(fleet, "get", "cq")
        print(cqs)
        assert re.search(r"^team-a\s+lab\s+1\s+2\s+Quota=1", cqs, re.M), cqs
        workloads = cli(fleet, "get", "workloads")
        print(workloads)
        assert re.search(rf"job-{victim}-\w+\s+a\s+\S*\s*False\s+Quota", workloads), workloads
        name = (await workload(client, victim))["metadata"]["name"]
        described = cli(fleet, "describe", "workload", name)
        print(described)
        assert re.search(r"Type:\s+QuotaReserved", described) and "4 more needed" in described, described
        described = cli(fleet, "describe", "job", victim)
        print(described)
        assert "Preempted to accommodate a workload" in described, described
        assert "insufficient unused quota for nvidia.com/gpu in flavor h100" in described, described
