"""KubeRay's RayCluster and RayJob end to end with real Ray (the `ray` package) in the pods:
`gpufleet up --no-agent`, two `gpufleet agent`s with declared GPUs running pods as host
processes, and KubeRay's sample manifest applied with kubectl.

The head and two 1-GPU workers run `ray start`; the workers join the head (`ray status`
through `kubectl exec` counts 2 GPUs, given by the nvidia.com/gpu limits alone); the status
has KubeRay's fields and `kubectl get rayclusters` its columns; a RayJob runs one GPU task
per worker to SUCCEEDED / Complete with its output in the submitter's log; then a worker
named in scaleStrategy.workersToDelete goes, with replicas lowered, and no other.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import Fleet, Kubectl, kubectl_binary, process_pids, running_fleet, table

from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import transport_from_kubeconfig

pytest.importorskip("ray", reason="the Ray tests run the `ray` package (pip install 'ray[default]')")

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "ray"
NS = "default"
NAME = "raycluster-kuberay"


def _ray_pids(marker: str) -> set[int]:
    """Processes whose command line names this test's Ray directory (Ray's own daemons)."""
    out: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            out.add(int(entry))
    return out


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    kubectl_binary()
    # The agents run `ray` from their PATH: the interpreter running these tests has it.
    # Ray's socket paths must stay under 108 bytes: a short directory of its own, also what
    # finds Ray's daemons at the end (they may outlive a pod killed at teardown).
    ray_dir = tempfile.mkdtemp(prefix="gfray-", dir="/tmp")
    with running_fleet(tmp_path, ["up", "--no-agent"], ("node-a", "node-b"), gpus=2, runtime="process",
                       join=False, python_on_path=True, poll_interval=0.3) as f:
        f.ray_dir = ray_dir  # type: ignore[attr-defined]
        try:
            yield f
        finally:
            for pid in _ray_pids(ray_dir):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            shutil.rmtree(ray_dir, ignore_errors=True)


def _ray_template(template: dict[str, Any], temp_dir: str) -> None:
    # Ray lives in this machine's virtualenv: the pods run as root on the node, in a
    # namespace labelled privileged (as the training tests do).
    for c in template["spec"]["containers"]:
        c["securityContext"] = {"privileged": True}
        c["env"] = [{"name": "RAY_USAGE_STATS_ENABLED", "value": "0"}]


def cluster_manifest(temp_dir: str) -> dict[str, Any]:
    cluster = yaml.safe_load((EXAMPLES / "ray-cluster.sample.yaml").read_text())
    spec = cluster["spec"]
    spec["headGroupSpec"]["rayStartParams"]["temp-dir"] = temp_dir
    _ray_template(spec["headGroupSpec"]["template"], temp_dir)
    for g in spec["workerGroupSpecs"]:
        g["rayStartParams"]["temp-dir"] = temp_dir
        _ray_template(g["template"], temp_dir)
    return cluster


def kubectl_for(fleet: Fleet) -> Kubectl:
    home = fleet.root / "kubectl-home"
    home.mkdir(exist_ok=True)
    k = Kubectl(kubectl_binary(), fleet.kubeconfig, str(home), timeout=60)
    return k


async def test_raycluster_and_rayjob_with_real_ray(fleet: Fleet) -> None:
    kubectl = kubectl_for(fleet)
    temp_dir = fleet.ray_dir  # type: ignore[attr-defined]
    async with Client(transport_from_kubeconfig(fleet.kubeconfig)) as client:
        await fleet.nodes_ready(client)
        await client.patch("Namespace", NS, {"metadata": {"labels": {
            "pod-security.kubernetes.io/enforce": "privileged"}}}, raw=True)
        kubectl("apply", "-f", "-", input=json.dumps(cluster_manifest(temp_dir))).ok()

        async def ray_pods() -> list[dict[str, Any]]:
            pods = await client.list("Pod", NS, label_selector={"ray.io/cluster": NAME}, raw=True)
            fleet.pids |= process_pids(pods)
            return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

        async def ready() -> dict[str, Any] | None:
            await ray_pods()
            rc = await client.get("rayclusters", NAME, NS, raw=True)
            st = rc.get("status") or {}
            return st if st.get("state") == "ready" and st.get("availableWorkerReplicas") == 2 else None

        st = await fleet.wait_until(ready, 120, "the RayCluster to be ready with 2 workers")
        assert st["desiredWorkerReplicas"] == 2 and st["readyWorkerReplicas"] == 2
        assert st["minWorkerReplicas"] == 1 and st["maxWorkerReplicas"] == 4
        assert st["desiredGPU"] == "2" and st["desiredCPU"] == "1500m"
        head = st["head"]
        assert head["podIP"] and head["serviceIP"] and head["podName"].startswith(f"{NAME}-head-")
        assert set(st["endpoints"]) == {"client", "dashboard", "gcs-server"}
        assert {c["type"]: c["status"] for c in st["conditions"]}["HeadPodReady"] == "True"

        # The workers joined the head: Ray counts their GPUs (from nvidia.com/gpu alone).
        status = kubectl("exec", head["podName"], "--", "bash", "-c",
                         "ray status --address=127.0.0.1:$GPUFLEET_PORT_GCS_SERVER").ok().stdout
        assert "0.0/2.0 GPU" in status, status
        assert " 1 headgroup" in status and " 2 gpu-group" in status, status  # nodes by group

        rows = table(kubectl("get", "rayclusters", "-o", "wide").ok().stdout)
        assert rows[0]["DESIRED WORKERS"] == "2" and rows[0]["AVAILABLE WORKERS"] == "2", rows
        assert rows[0]["GPUS"] == "2" and rows[0]["STATUS"] == "ready", rows
        assert rows[0]["HEAD POD IP"] == head["podIP"], rows

        # A RayJob on this cluster: one GPU task per worker, to SUCCEEDED.
        kubectl("apply", "-f", str(EXAMPLES / "rayjob-gpu-tasks.yaml")).ok()
        job = yaml.safe_load((EXAMPLES / "rayjob-gpu-tasks.yaml").read_text())["metadata"]["name"]

        async def finished() -> dict[str, Any] | None:
            await ray_pods()
            js = (await client.get("rayjobs", job, NS, raw=True)).get("status") or {}
            return js if js.get("jobDeploymentStatus") in ("Complete", "Failed") else None

        js = await fleet.wait_until(finished, 90, "the RayJob to finish")
        submitters = await client.list("Pod", NS, label_selector={"job-name": job}, raw=True)
        fleet.pids |= process_pids(submitters)
        logs = "".join([await client.log(p["metadata"]["name"], NS) for p in submitters])
        assert js["jobDeploymentStatus"] == "Complete" and js["jobStatus"] == "SUCCEEDED", (js, logs)
        assert js["rayClusterName"] == NAME and js["jobId"].startswith(f"{job}-")
        assert "tasks done: [(0, [" in logs and "(1, [" in logs, logs
        cli = await asyncio.to_thread(fleet.run_cli, "logs", f"rayjob/{job}")
        assert cli.returncode == 0 and "tasks done: [(0, [" in cli.stdout, cli
        jrows = table(kubectl("get", "rayjobs").ok().stdout)
        assert jrows[0]["JOB STATUS"] == "SUCCEEDED" and jrows[0]["DEPLOYMENT STATUS"] == "Complete", jrows

        # Scale down by name: the worker in workersToDelete goes, the other stays.
        workers = [p for p in await ray_pods() if p["metadata"]["labels"]["ray.io/node-type"] == "worker"]
        doomed, kept = workers[0]["metadata"]["name"], workers[1]["metadata"]["name"]
        rc = await client.get("rayclusters", NAME, NS, raw=True)
        groups = rc["spec"]["workerGroupSpecs"]
        groups[0]["replicas"] = 1
        groups[0]["scaleStrategy"] = {"workersToDelete": [doomed]}
        kubectl("patch", "raycluster", NAME, "--type=merge", "-p",
                json.dumps({"spec": {"workerGroupSpecs": groups}})).ok()

        async def scaled() -> dict[str, Any] | None:
            names = {p["metadata"]["name"] for p in await ray_pods()
                     if p["metadata"]["labels"]["ray.io/node-type"] == "worker"}
            rc = await client.get("rayclusters", NAME, NS, raw=True)
            cleared = not (rc["spec"]["workerGroupSpecs"][0].get("scaleStrategy") or {}).get("workersToDelete")
            st = rc.get("status") or {}
            return st if names == {kept} and cleared and st.get("availableWorkerReplicas") == 1 else None

        st = await fleet.wait_until(scaled, 30, "the named worker to go")
        assert st["desiredWorkerReplicas"] == 1

        kubectl("delete", "raycluster", NAME, "--wait=false").ok()

        async def gone() -> bool:
            return not await ray_pods()

        await fleet.wait_until(gone, 30, "the Ray pods to go with their cluster")
