"""KubeRay's RayService through the API server: defaulted as KubeRay's CRD defaults its
rayClusterConfig, a bad one refused in Kubernetes' Status shape naming the field, and the
table with KubeRay's printer columns (its CRD names no Age)."""

from __future__ import annotations

from typing import Any

from apiserver_helpers import TABLE_ACCEPT, Api

SERVICES = "/apis/ray.io/v1/namespaces/default/rayservices"


def rayservice(name: str = "hello", **spec: Any) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "ray", "image": "rayproject/ray:2.60.0",
                                         "resources": {"limits": {"cpu": 1}}}]}}
    return {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": name},
            "spec": {"serveConfigV2": "applications:\n- name: a\n  import_path: m:app\n",
                     "rayClusterConfig": {"headGroupSpec": {"template": template},
                                          "workerGroupSpecs": [{"groupName": "w", "template": template}]},
                     **spec}}


async def test_a_rayservice_is_defaulted_refused_naming_the_field_and_tabled(api: Api) -> None:
    stored = await api.create(SERVICES, rayservice())
    group = stored["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (0, 0, 2147483647)
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == 1

    reply = await api.post(SERVICES, rayservice("bad", upgradeStrategy={"type": "Blue"}, serveConfigV2="[1, 2]"))
    assert reply.status == 422, reply
    assert reply.json["kind"] == "Status" and reply.json["reason"] == "Invalid"
    fields = sorted(c["field"] for c in reply.json["details"]["causes"])
    assert fields == ["spec.serveConfigV2", "spec.upgradeStrategy.type"], reply.json

    table = (await api.get(SERVICES, accept=TABLE_ACCEPT)).json
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "service status", "num serve endpoints"]
    assert table["rows"][0]["cells"] == ["hello", "", ""]
