"""The resourcequota controller: status.used recomputed from what exists, releases held
back while a charge may still be on its way, finished and deleted pods freed."""

from __future__ import annotations

from typing import Any

from ctrl_helpers import NS, eventually, pod, set_pod_status

from gpufleet.client.api import Client
from gpufleet.controllers.resourcequota import desired_status


def quota(name: str, hard: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": NS},
            "spec": {"hard": hard}}


def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
    body = pod(name, {"app": "train"})
    body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return body


async def used(client: Client, name: str) -> dict[str, str]:
    return ((await client.get("resourcequotas", name, NS, raw=True)).get("status") or {}).get("used") or {}


def test_releases_wait_for_the_grace_but_raises_do_not() -> None:
    rq = {"spec": {"hard": {"pods": "10", "requests.cpu": "4"}},
          "status": {"used": {"pods": "5", "requests.cpu": "1"}}}
    computed = {"pods": 3, "requests.cpu": 2}
    held, was_held = desired_status(rq, computed, hold_releases=True)
    assert held["used"] == {"pods": "5", "requests.cpu": "2"} and was_held
    free, was_held = desired_status(rq, computed, hold_releases=False)
    assert free == {"hard": {"pods": "10", "requests.cpu": "4"}, "used": {"pods": "3", "requests.cpu": "2"}}
    assert not was_held


async def test_finished_and_deleted_pods_are_released(client: Client, controllers: Any) -> None:
    await controllers(enabled=("resourcequota",), quota_charge_grace=0.2, quota_resync_period=0.5)
    await client.create(quota("gpus", {"pods": "4", "requests.nvidia.com/gpu": "8",
                                       "count/deployments.apps": "2"}), raw=True)

    async def is_used(want: dict[str, str]) -> bool:
        return await used(client, "gpus") == want

    await eventually(lambda: is_used({"pods": "0", "requests.nvidia.com/gpu": "0", "count/deployments.apps": "0"}),
                     what="initial usage")
    for i in range(3):
        await client.create(gpu_pod(f"w{i}", 2), raw=True)
    assert await used(client, "gpus") == {"pods": "3", "requests.nvidia.com/gpu": "6", "count/deployments.apps": "0"}
    await set_pod_status(client, "w0", phase="Succeeded")
    await client.delete("pods", "w1", NS)
    await eventually(lambda: is_used({"pods": "1", "requests.nvidia.com/gpu": "2", "count/deployments.apps": "0"}),
                     what="released usage")
    # Kinds the controller does not watch are caught up by the periodic pass.
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": NS},
              "spec": {"replicas": 0, "selector": {"matchLabels": {"a": "b"}},
                       "template": {"metadata": {"labels": {"a": "b"}},
                                    "spec": {"containers": [{"name": "c", "image": "web:1"}]}}}}
    await client.create(deploy, raw=True)
    await eventually(lambda: is_used({"pods": "1", "requests.nvidia.com/gpu": "2", "count/deployments.apps": "1"}),
                     what="deployment counted")
    await client.delete("deployments.apps", "web", NS)
    await eventually(lambda: is_used({"pods": "1", "requests.nvidia.com/gpu": "2", "count/deployments.apps": "0"}),
                     what="deployment released")
    rq = await client.get("resourcequotas", "gpus", NS, raw=True)
    assert rq["status"]["hard"] == rq["spec"]["hard"]
