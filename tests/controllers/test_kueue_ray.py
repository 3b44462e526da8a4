"""KubeRay's kinds in team queues, as Kueue's ray integrations: a RayCluster or RayJob
labelled ``kueue.x-k8s.io/queue-name`` is created suspended, gets a Workload with Kueue's pod
sets (head, each worker group, a RayJob's submitter), and makes pods only once admitted, on
its flavor's nodes; a RayJob taken back by its queue is Suspending, then Suspended with its
cluster gone. A queued RayJob that would keep or borrow a cluster is refused as Kueue's
webhook refuses it. In-process API server and controllers; no agents."""

from __future__ import annotations

from typing import Any

import pytest
from ctrl_helpers import NS, eventually, stays
from test_kueue import GPU, cluster_queue, condition, flavor, gpu_node, local_queue

from gpufleet.api.kueue import QUEUE_NAME_LABEL
from gpufleet.client.api import Client
from gpufleet.client.errors import ApiError, NotFound


def template(gpus: int) -> dict[str, Any]:
    limits = {"cpu": "1"} | ({"nvidia.com/gpu": str(gpus)} if gpus else {})
    return {"spec": {"containers": [{"name": "ray", "image": "rayproject/ray:2.60.0",
                                     "resources": {"limits": limits}}]}}


def cluster_spec(workers: int) -> dict[str, Any]:
    return {"headGroupSpec": {"template": template(0)},
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": workers, "minReplicas": 0, "maxReplicas": 4,
                                  "template": template(1)}]}


def raycluster(name: str, workers: int) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "namespace": NS, "labels": {QUEUE_NAME_LABEL: "a"}},
            "spec": cluster_spec(workers)}


def rayjob(name: str, workers: int, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "namespace": NS, "labels": {QUEUE_NAME_LABEL: "a"}},
            "spec": {"entrypoint": "python -c 'print(1)'", "shutdownAfterJobFinishes": True,
                     "rayClusterSpec": cluster_spec(workers), **spec}}


async def ray_pods(client: Client, cluster: str) -> list[dict[str, Any]]:
    return [p for p in await client.list("Pod", NS, label_selector={"ray.io/cluster": cluster}, raw=True)
            if not p["metadata"].get("deletionTimestamp")]


async def workload_of(client: Client, resource: str, name: str) -> dict[str, Any] | None:
    obj = await client.get(resource, name, NS, raw=True)
    for wl in await client.list("workloads", NS, raw=True):
        if any(r.get("uid") == obj["metadata"]["uid"] for r in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


@pytest.fixture
async def queue(client: Client, controllers) -> None:
    await controllers(enabled=("raycluster", "rayjob", "kueue", "garbagecollector"))
    await gpu_node(client, "n0", 4, {"pool": "ray"})
    await client.create(flavor("ray", {"pool": "ray"}))
    cq = cluster_queue("team-a", 2, flavor_name="ray")
    # Ray pods ask for CPUs (and the submitter for memory) too: the queue covers them, as it must on Kueue.
    group = cq["spec"]["resourceGroups"][0]
    group["coveredResources"] = ["cpu", "memory", GPU]
    group["flavors"][0]["resources"][:0] = [{"name": "cpu", "nominalQuota": 16},
                                            {"name": "memory", "nominalQuota": "64Gi"}]
    await client.create(cq)
    await client.create(local_queue("a", "team-a"))


async def test_a_queued_raycluster_waits_for_quota_and_runs_on_its_flavor(client: Client, queue) -> None:
    first = await client.create(raycluster("first", 2), raw=True)
    assert first["spec"]["suspend"] is True
    wl = await eventually(lambda: workload_of(client, "rayclusters", "first"), what="the first cluster's Workload")
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [("head", 1), ("gpu", 2)]
    assert wl["metadata"]["name"].startswith("raycluster-first-")

    async def head_of(name: str) -> list[dict[str, Any]] | None:
        pods = await ray_pods(client, name)
        return pods or None

    pods = await eventually(lambda: head_of("first"), what="the admitted cluster's pods")
    assert all(p["spec"]["nodeSelector"] == {"pool": "ray"} for p in pods)
    rc = await client.get("rayclusters", "first", NS, raw=True)
    assert rc["spec"]["suspend"] is False

    # A second cluster of 2 GPUs does not fit the quota of 2: suspended, no pod, reason Quota.
    await client.create(raycluster("second", 2), raw=True)

    async def waits() -> str:
        c = condition(await workload_of(client, "rayclusters", "second"), "QuotaReserved")
        return c.get("reason", "") if c.get("status") == "False" else ""

    assert await eventually(lambda: _truthy(waits()), what="the second cluster waiting") == "Quota"
    await stays(lambda: _none(ray_pods(client, "second")), 1.0)

    # The first goes: the second is admitted and makes its pods.
    await client.delete("rayclusters", "first", NS)
    await eventually(lambda: head_of("second"), timeout=20, what="the second cluster's pods")


async def test_a_queued_rayjob_makes_its_cluster_once_admitted_and_gives_it_back_when_taken_back(
        client: Client, queue) -> None:
    await client.create(rayjob("big", 3), raw=True)  # 3 GPUs: more than the quota
    job = await client.create(rayjob("fits", 2), raw=True)
    assert job["spec"]["suspend"] is True

    wl = await eventually(lambda: workload_of(client, "rayjobs", "fits"), what="the job's Workload")
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [("head", 1), ("gpu", 2),
                                                                          ("submitter", 1)]

    async def cluster_of(name: str) -> dict[str, Any] | None:
        st = (await client.get("rayjobs", name, NS, raw=True)).get("status") or {}
        if not st.get("rayClusterName"):
            return None
        try:
            return await client.get("rayclusters", st["rayClusterName"], NS, raw=True)
        except NotFound:
            return None

    cluster = await eventually(lambda: cluster_of("fits"), what="the admitted job's RayCluster")
    assert QUEUE_NAME_LABEL not in cluster["metadata"].get("labels", {})  # held by the job's Workload
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    assert all(g["template"]["spec"]["nodeSelector"] == {"pool": "ray"} for g in groups)

    async def deployment(name: str) -> str:
        return ((await client.get("rayjobs", name, NS, raw=True)).get("status") or {}).get("jobDeploymentStatus", "")

    assert await deployment("big") == "Suspended"
    assert await cluster_of("big") is None

    # The queue takes the job back (its Workload deactivated): Suspending, then Suspended with
    # the cluster deleted; the waiting job gets nothing it does not fit.
    await client.patch("workloads", wl["metadata"]["name"], {"spec": {"active": False}}, NS, raw=True)

    async def suspended() -> bool:
        return await deployment("fits") == "Suspended"

    await eventually(suspended, timeout=20, what="the taken-back job Suspended")
    assert await cluster_of("fits") is None
    assert (await client.get("rayjobs", "fits", NS, raw=True))["spec"]["suspend"] is True


async def test_a_queued_rayjob_must_make_and_delete_its_own_cluster(client: Client, queue) -> None:
    body = rayjob("keeps", 1, shutdownAfterJobFinishes=False, clusterSelector={"ray.io/cluster": "shared"})
    del body["spec"]["rayClusterSpec"]
    with pytest.raises(ApiError) as e:
        await client.create(body, raw=True)
    assert e.value.code == 422
    assert e.value.message == (
        'RayJob.ray.io "keeps" is invalid: [spec.shutdownAfterJobFinishes: Invalid value: false: a kueue managed '
        'job should delete the cluster after finishing, spec.clusterSelector: Invalid value: '
        'map[string]string{"ray.io/cluster":"shared"}: a kueue managed job should not use an existing cluster]')
    # Without the queue label nothing is asked of it.
    body = rayjob("plain", 1, shutdownAfterJobFinishes=False)
    del body["metadata"]["labels"]
    created = await client.create(body, raw=True)
    assert not created["spec"].get("suspend")


async def _truthy(aw: Any) -> Any:
    return await aw or None


async def _none(aw: Any) -> bool:
    return not await aw
