"""A RayCluster with enableInTreeAutoscaling, end to end with real Ray: Ray's own autoscaler
(`ray kuberay-autoscaler`, the head's sidecar, calling the API as the cluster's service
account) scales a worker group of 1-GPU workers (min 0, max 4) on two agents with 2
declared GPUs each.

Tasks demanding 4 GPUs bring the workers 0 -> 4; once idle for idleTimeoutSeconds they go
back to 0. With one node cordoned (2 free GPUs) the same demand gets exactly 2 workers, on
the schedulable node, and the other 2 are reported unschedulable with the scheduler's reason
(condition ReplicaFailure, status.reason, an Event) instead of being left as Pending pods.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from e2e_helpers import Fleet, process_pids
from test_ray import cluster_manifest, fleet, kubectl_for  # noqa: F401  (fleet: the fixture)

from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import transport_from_kubeconfig

pytestmark = pytest.mark.e2e

NS = "default"
NAME = "raycluster-autoscaler"
GROUP = "gpu-group"

# The driver, run in the head: one GPU task per worker wanted, then the tasks' hosts.
DRIVER = """
import os, socket, time, ray
ray.init(address="127.0.0.1:" + os.environ["GPUFLEET_PORT_GCS_SERVER"], log_to_driver=False)

@ray.remote(num_gpus=1)
def task(i):
    time.sleep(3)
    return os.environ["RAY_CLOUD_INSTANCE_ID"]

print("done", sorted(set(ray.get([task.remote(i) for i in range(4)]))), flush=True)
"""


def autoscaling_manifest(temp_dir: str) -> dict[str, Any]:
    cluster = cluster_manifest(temp_dir)
    cluster["metadata"]["name"] = NAME
    spec = cluster["spec"]
    spec["enableInTreeAutoscaling"] = True
    spec["autoscalerOptions"] = {
        "idleTimeoutSeconds": 5,
        "upscalingMode": "Default",
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": {"privileged": True},
        "env": [{"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
                {"name": "AUTOSCALER_UPDATE_INTERVAL_S", "value": "2"}],
    }
    group = spec["workerGroupSpecs"][0]
    group.update(replicas=0, minReplicas=0, maxReplicas=4)
    # Two cores per node here: the workers ask for little CPU so that GPUs are what limits.
    group["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "100m"
    return cluster


# A Ray head and six Ray workers (4, then 2) start on the machine's cores: about 165 s on 2
# idle cores, past the suite's 300 s when the machine is loaded.
@pytest.mark.timeout(600)
async def test_autoscaling_0_to_4_to_0_and_only_what_fits(fleet: Fleet) -> None:  # noqa: F811
    kubectl = kubectl_for(fleet)
    temp_dir = fleet.ray_dir  # type: ignore[attr-defined]
    async with Client(transport_from_kubeconfig(fleet.kubeconfig)) as client:
        await fleet.nodes_ready(client)
        await client.patch("Namespace", NS, {"metadata": {"labels": {
            "pod-security.kubernetes.io/enforce": "privileged"}}}, raw=True)
        kubectl("apply", "-f", "-", input=json.dumps(autoscaling_manifest(temp_dir))).ok()

        async def workers() -> list[dict[str, Any]]:
            pods = await client.list("Pod", NS, label_selector={"ray.io/cluster": NAME}, raw=True)
            fleet.pids |= process_pids(pods)
            return [p for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker"
                    and not p["metadata"].get("deletionTimestamp")
                    and p["status"].get("phase") not in ("Succeeded", "Failed")]

        async def head_ready() -> dict[str, Any] | None:
            await workers()
            st = (await client.get("rayclusters", NAME, NS, raw=True)).get("status") or {}
            return st if st.get("state") == "ready" else None

        st = await fleet.wait_until(head_ready, 180, "the autoscaling RayCluster's head to be ready")
        head = await client.get("Pod", st["head"]["podName"], NS, raw=True)
        assert [c["name"] for c in head["spec"]["containers"]] == ["ray-head", "autoscaler"]
        assert head["spec"]["serviceAccountName"] == NAME
        assert set(st["endpoints"]) == {"client", "dashboard", "gcs-server"}
        for kind in ("ServiceAccount", "Role", "RoleBinding"):
            assert (await client.get(kind, NAME, NS, raw=True))["metadata"]["name"] == NAME

        def drive() -> str:
            r = kubectl("exec", st["head"]["podName"], "-c", "ray-head", "--", "python", "-c", DRIVER, timeout=200)
            return r.stdout + "\n" + r.stderr

        async def autoscaler_log() -> str:
            return (await client.log(st["head"]["podName"], NS, container="autoscaler"))[-6000:]

        seen: set[str] = set()  # every worker pod seen

        async def scale_with_demand() -> tuple[str, int, set[str], set[str]]:
            """Runs the driver; returns its output, the most workers seen at once, the nodes
            they were bound to (unbound: "") and the ReplicaFailure messages reported."""
            run = asyncio.ensure_future(asyncio.to_thread(drive))
            most, nodes, reported = 0, set(), set()
            while not run.done():
                ws = await workers()
                seen.update(w["metadata"]["name"] for w in ws)
                most = max(most, len(ws))
                nodes |= {w["spec"].get("nodeName") or "" for w in ws if w["status"].get("phase") == "Running"}
                nodes |= {"" for w in ws if any(c["type"] == "PodScheduled" and c["status"] == "False"
                                                for c in w["status"].get("conditions") or [])}
                st = (await client.get("rayclusters", NAME, NS, raw=True)).get("status") or {}
                reported |= {c.get("message") or "" for c in st.get("conditions") or []
                             if c["type"] == "ReplicaFailure" and c["status"] == "True"}
                await asyncio.sleep(0.5)
            return await run, most, nodes, reported

        # -- 0 -> 4 with 4 GPUs free --------------------------------------------------------
        t0 = time.monotonic()
        out, most, nodes, reported = await asyncio.wait_for(scale_with_demand(), 240)
        assert "done [" in out and most == 4 and "" not in nodes and not reported, \
            (out, most, nodes, reported, await autoscaler_log())
        print(f"0 -> 4 workers, 4 GPU tasks done: {time.monotonic() - t0:.1f}s")

        # -- back to 0 after idleTimeoutSeconds -----------------------------------------------
        t0 = time.monotonic()

        async def idle_gone() -> dict[str, Any] | None:
            rc = await client.get("rayclusters", NAME, NS, raw=True)
            ws = await workers()
            seen.update(w["metadata"]["name"] for w in ws)
            return rc if not ws and rc["spec"]["workerGroupSpecs"][0]["replicas"] == 0 else None

        async def wait_idle_gone() -> None:
            try:
                await fleet.wait_until(idle_gone, 90, "the idle workers to go")
            except BaseException:
                print(await autoscaler_log())
                raise

        await wait_idle_gone()
        print(f"4 -> 0 idle workers: {time.monotonic() - t0:.1f}s")

        # -- only 2 GPUs free: exactly 2 workers, the rest reported ---------------------------
        head_node = head["spec"]["nodeName"]
        other = "node-b" if head_node == "node-a" else "node-a"
        kubectl("cordon", other).ok()
        t0 = time.monotonic()
        out, most, nodes, reported = await asyncio.wait_for(scale_with_demand(), 240)
        # Never more than the 2 that fit, all placed on the schedulable node, none Pending.
        assert "done [" in out and most == 2 and nodes == {head_node}, (out, most, nodes, await autoscaler_log())
        print(f"4 GPU tasks on the 2 workers that fit: {time.monotonic() - t0:.1f}s")
        want = f"2 of 4 workers of group {GROUP} cannot be placed: 0/2 nodes are available:"
        assert any(want in m and "Insufficient nvidia.com/gpu" in m and "unschedulable" in m for m in reported), reported
        events = await client.list("Event", NS, raw=True)
        held = [e["message"] for e in events if e.get("reason") == "Unschedulable"
                and e["involvedObject"].get("name") == NAME]
        assert any(want in m for m in held), held

        # Once idle the 2 go, and the 2 never placed are dropped with them: the GPUs the
        # idle ones free do not get 2 new, idle workers.
        before = set(seen)
        t0 = time.monotonic()
        await wait_idle_gone()
        assert seen == before, seen - before
        print(f"2 -> 0 idle workers: {time.monotonic() - t0:.1f}s")
        kubectl("uncordon", other).ok()
        kubectl("delete", "raycluster", NAME, "--wait=false").ok()

        async def gone() -> bool:
            pods = await client.list("Pod", NS, label_selector={"ray.io/cluster": NAME}, raw=True)
            return not [p for p in pods if not p["metadata"].get("deletionTimestamp")]

        await fleet.wait_until(gone, 30, "the Ray pods to go with their cluster")
