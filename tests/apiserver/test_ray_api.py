"""KubeRay's kinds through the API server: a RayCluster is defaulted as KubeRay's webhook
and CRD defaults do, a bad one is refused in Kubernetes' Status shape naming the field, and
tables have KubeRay's printer columns."""

from __future__ import annotations

from typing import Any

from apiserver_helpers import TABLE_ACCEPT, Api

CLUSTERS = "/apis/ray.io/v1/namespaces/default/rayclusters"
JOBS = "/apis/ray.io/v1/namespaces/default/rayjobs"


def template() -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "ray", "image": "rayproject/ray:2.60.0",
                                     "resources": {"limits": {"cpu": 1, "nvidia.com/gpu": 1}}}]}}


def cluster(name: str = "rc", **group: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name},
            "spec": {"headGroupSpec": {"template": template()},
                     "workerGroupSpecs": [{"groupName": "gpu", "template": template(), **group}]}}


async def test_a_raycluster_is_defaulted_and_keeps_its_numbers(api: Api) -> None:
    stored = await api.create(CLUSTERS, cluster(minReplicas=1))
    group = stored["spec"]["workerGroupSpecs"][0]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (1, 1, 2147483647)
    assert group["rayStartParams"] == {} and stored["spec"]["headGroupSpec"]["serviceType"] == "ClusterIP"
    # The client's numbers stay numbers, as a CRD's int-or-string keeps them.
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


async def test_a_bad_raycluster_is_refused_naming_the_field(api: Api) -> None:
    reply = await api.post(CLUSTERS, cluster(minReplicas=3, maxReplicas=1))
    assert reply.status == 422, reply
    assert reply.json["kind"] == "Status" and reply.json["reason"] == "Invalid"
    fields = [c["field"] for c in reply.json["details"]["causes"]]
    assert fields == ["spec.workerGroupSpecs[0].maxReplicas"]
    reply = await api.post(JOBS, {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "j"},
                                  "spec": {"entrypoint": "python x.py"}})
    assert reply.status == 422 and "spec.rayClusterSpec" in reply.json["message"], reply


async def test_tables_have_kuberays_columns(api: Api) -> None:
    await api.create(CLUSTERS, cluster())
    table = (await api.get(CLUSTERS, accept=TABLE_ACCEPT)).json
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", "Desired Workers", "Available Workers", "CPUs", "Memory", "GPUs", "Status", "Age",
                     "Head Pod IP", "Head Service IP"]
    assert [c["priority"] for c in table["columnDefinitions"]][-2:] == [1, 1]
    job = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "j"},
           "spec": {"entrypoint": "python x.py", "clusterSelector": {"ray.io/cluster": "rc"}}}
    await api.create(JOBS, job)
    table = (await api.get(JOBS, accept=TABLE_ACCEPT)).json
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Name", "Job Status", "Deployment Status", "Ray Cluster Name", "Start Time", "End Time", "Age"]
