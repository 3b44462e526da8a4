"""A failed GPU on a real fleet: `gpufleet up --no-agent` (API server, scheduler, controllers)
and a `gpufleet agent` process whose GPUs come from an inventory file. Marking the GPU a
Deployment's pod holds `xid: 79` fails that pod (reason GPUUnhealthy, DisruptionTarget), the
ReplicaSet's replacement is scheduled onto the other GPU (what the replacement's process
reports in NVIDIA_VISIBLE_DEVICES), and once the inventory reads healthy the GPU returns."""

from __future__ import annotations

import json
import os
import time

import pytest
from e2e_helpers import running_fleet

from gpufleet.api.gpu import GPU_INDICES_ANNOTATION, GPU_UNHEALTHY_REASON, GPUS_ANNOTATION, parse_gpu_indices
from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import transport_from_kubeconfig

pytestmark = pytest.mark.e2e

NODE = "gpu-node-h"


def inventory(path, faults: dict[int, str], tick: int) -> None:
    rows = [f"  - {{model: H100-80GB-HBM3, memoryMiB: 81920, group: nvlink-0{', ' + faults[i] if i in faults else ''}}}"
            for i in range(2)]
    path.write_text("gpus:\n" + "\n".join(rows) + "\n")
    stamp = (int(time.time()) + tick) * 10**9
    os.utime(path, ns=(stamp, stamp))


def deployment() -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "trainer", "namespace": "default"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "trainer"}}, "template": {
            "metadata": {"labels": {"app": "trainer"}},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                "name": "main", "image": "localhost/gpufleet/busybox:1",
                "command": ["sh", "-c", 'echo "gpu=$NVIDIA_VISIBLE_DEVICES"; exec sleep 600'],
                "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}},
    }


def live(pods: list[dict]) -> list[dict]:
    return [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


async def test_failed_gpu_on_a_fleet(tmp_path) -> None:
    inv = tmp_path / "gpus.yaml"
    inventory(inv, {}, 0)
    with running_fleet(tmp_path, ["up", "--no-agent"], [], gpus=0) as fleet:
        fleet.start_agent(NODE, gpus=0, gpu_inventory=inv,
                          extra=["--gpu-health-interval", "0.2", "--gpu-validation-backoff", "0.5"])
        client = Client(transport_from_kubeconfig(fleet.kubeconfig))
        try:
            await fleet.nodes_ready(client)
            await client.create(deployment(), raw=True)

            async def pods() -> list[dict]:
                return await client.list("Pod", "default", label_selector={"app": "trainer"}, raw=True)

            async def one_running():
                ps = live(await pods())
                return ps[0] if len(ps) == 1 and GPU_INDICES_ANNOTATION in ps[0]["metadata"]["annotations"] else None
            first = await fleet.wait_until(one_running, 60, "the trainer running")
            (bad,) = parse_gpu_indices(first["metadata"]["annotations"][GPU_INDICES_ANNOTATION])
            node = await client.get("Node", NODE, raw=True)
            uuids = {g["index"]: g["uuid"] for g in json.loads(node["metadata"]["annotations"][GPUS_ANNOTATION])}

            inventory(inv, {bad: "xid: 79"}, 1)

            async def failed():
                p = await client.get("Pod", first["metadata"]["name"], "default", raw=True)
                return p if p["status"].get("phase") == "Failed" else None
            p = await fleet.wait_until(failed, 5, "the pod on the failed GPU stopped")
            assert p["status"]["reason"] == GPU_UNHEALTHY_REASON and "XID 79" in p["status"]["message"]
            assert any(c["type"] == "DisruptionTarget" and c["reason"] == GPU_UNHEALTHY_REASON
                       for c in p["status"]["conditions"])

            async def replaced():
                ps = [q for q in live(await pods()) if q["metadata"]["uid"] != first["metadata"]["uid"]]
                return ps[0] if ps and GPU_INDICES_ANNOTATION in ps[0]["metadata"]["annotations"] else None
            second = await fleet.wait_until(replaced, 30, "the replacement running")
            assert parse_gpu_indices(second["metadata"]["annotations"][GPU_INDICES_ANNOTATION]) == (1 - bad,)

            async def says():
                text = await client.log(second["metadata"]["name"], "default")
                return text if "gpu=" in text else None
            assert (await fleet.wait_until(says, 10, "the replacement's log")).strip() == f"gpu={uuids[1 - bad]}"
            node = await client.get("Node", NODE, raw=True)
            assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"

            inventory(inv, {}, 2)

            async def back():
                n = await client.get("Node", NODE, raw=True)
                return n["status"]["allocatable"]["nvidia.com/gpu"] == "2"
            await fleet.wait_until(back, 10, "the GPU back in allocatable")
        finally:
            await client.close()
