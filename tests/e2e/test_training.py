"""Distributed training end to end: `gpufleet up --no-agent`, three `gpufleet agent`s with
declared GPUs running pods as host processes, and examples/training/train.py training a
real model with torch.distributed (gloo) under a PyTorchJob.

(a) A server dies mid-training, agent and pods SIGKILLed: the gang restarts whole on the
    remaining servers, resumes from its checkpoint (the step goes on, not back to 0), and
    the job succeeds.
(b) An elastic job under torchrun is scaled 2 -> 4 (`gpufleet scale`) -> 2 (`kubectl scale`)
    Workers: the world size in its log follows, and the step never goes back. Then a GPU
    fails under one Worker (the agent's report written through pods/status): only that
    Worker is replaced, the other keeps its pod and torchrun, and training goes on.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Fleet, kubectl_binary, process_pids, running_fleet

from gpufleet.client.api import Client
from gpufleet.client.errors import ApiError
from gpufleet.client.kubeconfig import transport_from_kubeconfig

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "training" / "train.py")
NODES = ("node-a", "node-b", "node-c")
GPUS_PER_NODE = 2
NS = "default"
_STEP = re.compile(r"^step=(\d+) loss=([0-9.]+) world_size=(\d+) rank=(\d+)$", re.M)
_RESUMED = re.compile(r"^resumed from step=(\d+)", re.M)


@pytest.fixture
def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """Server and agents. Parametrized with "spread", each agent has an address of its own
    (127.0.0.1, .2, .3, all loopback), as servers of a real fleet do."""
    spread = getattr(request, "param", "") == "spread"
    addresses = [f"127.0.0.{i + 1}" if spread else "127.0.0.1" for i in range(len(NODES))]
    # The agents run `python` from their PATH: the interpreter running these tests has torch.
    with running_fleet(
        tmp_path, ["up", "--no-agent"], NODES, gpus=GPUS_PER_NODE, runtime="process",
        addresses=addresses, join=False, python_on_path=True, poll_interval=0.3,
        # Checkpoints live where the agents mount them from into the pods' sandboxes.
        agent_args=["--checkpoint-root", str(tmp_path / "ckpt")],
    ) as f:
        yield f


async def job_pods(client: Client, job: str, fleet: Fleet) -> list[dict[str, Any]]:
    pods = await client.list("Pod", NS, label_selector={"training.kubeflow.org/job-name": job}, raw=True)
    # Pod processes lead sessions of their own: the fleet kills them by pid at teardown.
    fleet.pids |= process_pids(pods)
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


async def pod_log(client: Client, name: str) -> str:
    try:
        return await client.log(name, NS)
    except ApiError:
        return ""


def steps(text: str) -> list[tuple[int, float, int]]:
    """(step, loss, world_size) of every progress line, in order."""
    return [(int(s), float(loss), int(w)) for s, loss, w, _ in _STEP.findall(text)]


async def condition(client: Client, name: str, type_: str) -> dict[str, Any] | None:
    job = await client.get("pytorchjobs", name, NS, raw=True)
    for c in (job.get("status") or {}).get("conditions") or []:
        if c["type"] == type_ and c["status"] == "True":
            return c
    return None


async def gpufleet_cli(fleet: Fleet, *args: str) -> subprocess.CompletedProcess:
    """The gpufleet command, as a user runs it."""
    return await asyncio.to_thread(fleet.run_cli, *args)


def container(args: list[str], *, elastic: bool = False) -> dict[str, Any]:
    launcher = ["python", "-m", "torch.distributed.run"] if elastic else ["python"]
    return {
        "name": "pytorch",
        "image": "python:3.11",
        "command": [*launcher, TRAIN, *args],
        "resources": {"limits": {"nvidia.com/gpu": 1}},
        # The interpreter that has torch lives under this machine's private /root: the pods
        # run as root on the node (what a bare-metal team with its own Python would do), in a
        # namespace labelled privileged. The sandboxed default user is tested elsewhere.
        "securityContext": {"privileged": True},
    }


async def allow_privileged(client: Client) -> None:
    await client.patch("Namespace", NS, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/warn": "privileged"}}},
        raw=True)


def replica(n: int, args: list[str], *, elastic: bool = False) -> dict[str, Any]:
    return {"replicas": n, "restartPolicy": "OnFailure",
            "template": {"spec": {"terminationGracePeriodSeconds": 3,
                                  "containers": [container(args, elastic=elastic)]}}}


@pytest.mark.parametrize("fleet", ["spread"], indirect=True)
async def test_gang_restarts_from_checkpoint_when_a_server_dies(fleet: Fleet) -> None:
    args = ["--steps", "160", "--step-sleep", "0.05", "--checkpoint-every", "10"]
    ckpt = fleet.root / "ckpt" / NS / "ckpt-a"
    job = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "mlp", "annotations": {"gpufleet.io/checkpoint-dir": str(ckpt)}},
        "spec": {"runPolicy": {"backoffLimit": 3},
                 "pytorchReplicaSpecs": {"Master": replica(1, args), "Worker": replica(1, args)}},
    }
    async with Client(transport_from_kubeconfig(fleet.kubeconfig)) as client:
        await fleet.nodes_ready(client)
        await allow_privileged(client)
        await client.create(job, NS, raw=True)

        async def training() -> list | None:
            found = steps(await pod_log(client, "mlp-master-0"))
            return found if found and found[-1][0] >= 50 else None

        before = await fleet.wait_until(training, 90, "the master to pass step 50")
        # Nodes have addresses of their own: the Workers found the Master through the
        # rendezvous ConfigMap, written once the Master was bound.
        rdzv = await client.get("ConfigMap", "mlp-rendezvous", NS, raw=True)
        master = await client.get("Pod", "mlp-master-0", NS, raw=True)
        assert rdzv["data"]["MASTER_ADDR"] == master["status"]["hostIP"]
        assert before[-1][2] == 2
        assert before[-1][1] < before[0][1], f"loss did not go down: {before}"

        pods = await job_pods(client, "mlp", fleet)
        victim = next(p for p in pods if p["metadata"]["name"] == "mlp-worker-0")["spec"]["nodeName"]
        fleet.kill_node(victim, process_pids(p for p in pods if p["spec"]["nodeName"] == victim))
        t0 = time.monotonic()

        async def restarted() -> dict | None:
            job = await client.get("pytorchjobs", "mlp", NS, raw=True)
            if (job["metadata"].get("annotations") or {}).get("gpufleet.io/gang-restarts") != "1":
                return None
            pods = await job_pods(client, "mlp", fleet)
            running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
                       and p["metadata"]["annotations"].get("gpufleet.io/gang-attempt") == "1"]
            return job if len(running) == 2 else None

        await fleet.wait_until(restarted, 60, "the gang running again")
        print(f"gang restart: running again {time.monotonic() - t0:.1f} s after node {victim} died")
        pods = await job_pods(client, "mlp", fleet)
        assert all(p["spec"]["nodeName"] != victim for p in pods)
        master = next(p for p in pods if p["metadata"]["name"] == "mlp-master-0")
        rdzv = await client.get("ConfigMap", "mlp-rendezvous", NS, raw=True)
        assert rdzv["data"]["MASTER_ADDR"] == master["status"]["hostIP"]
        assert rdzv["data"]["LEADER_UID"] == master["metadata"]["uid"]

        async def resumed() -> int | None:
            m = _RESUMED.search(await pod_log(client, "mlp-master-0"))
            return int(m.group(1)) if m else None

        resumed_at = await fleet.wait_until(resumed, 30, "the master to resume from its checkpoint")
        assert resumed_at >= 40, f"resumed from step {resumed_at}, expected the checkpoint near step 50"

        done = await fleet.wait_until(lambda: condition(client, "mlp", "Succeeded"), 90, "the job to succeed")
        assert done["reason"] == "PyTorchJobSucceeded"
        after = steps(await pod_log(client, "mlp-master-0"))
        assert after[0][0] > resumed_at and after[-1][0] == 160
        assert after[-1][1] < before[0][1]
        restarting = [c for c in (await client.get("pytorchjobs", "mlp", NS, raw=True))["status"]["conditions"]
                      if c["type"] == "Restarting"]
        assert restarting and "mlp-" in restarting[0]["message"], restarting


async def test_elastic_resize_changes_world_size_without_losing_progress(fleet: Fleet) -> None:
    args = ["--steps", "100000", "--step-sleep", "0.05", "--checkpoint-every", "5"]
    job = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "elastic", "annotations": {"gpufleet.io/checkpoint-dir": str(fleet.root / "ckpt" / NS / "ckpt-b"),
                                                        "gpufleet.io/elastic-autoscale": "false"}},
        "spec": {
            "elasticPolicy": {"minReplicas": 2, "maxReplicas": 4, "maxRestarts": 20,
                              "rdzvConf": [{"key": "last_call_timeout", "value": "2"}]},
            "pytorchReplicaSpecs": {"Worker": replica(2, args, elastic=True)},
        },
    }
    async with Client(transport_from_kubeconfig(fleet.kubeconfig)) as client:
        await fleet.nodes_ready(client)
        await allow_privileged(client)
        await client.create(job, NS, raw=True)

        async def at_world(size: int, after_step: int) -> list | None:
            await job_pods(client, "elastic", fleet)
            found = [s for s in steps(await pod_log(client, "elastic-worker-0")) if s[2] == size and s[0] > after_step]
            return found if len(found) >= 2 else None

        first = await fleet.wait_until(lambda: at_world(2, 0), 90, "training with 2 workers")
        mark = first[-1][0]

        scaled = await gpufleet_cli(fleet, "scale", "pytorchjob/elastic", "--replicas", "4")
        assert scaled.returncode == 0, scaled.stderr
        t0 = time.monotonic()
        grown = await fleet.wait_until(lambda: at_world(4, mark), 90, "training with 4 workers")
        print(f"elastic 2 -> 4: world_size 4 after {time.monotonic() - t0:.1f} s")
        assert grown[0][0] >= mark - 5, f"progress lost: at step {mark} before, {grown[0][0]} after"
        assert len(await job_pods(client, "elastic", fleet)) == 4

        async def one_group() -> bool:
            # Every Worker trains in the same group of 4 (not two groups of 2).
            latest = [steps(await pod_log(client, f"elastic-worker-{i}")) for i in range(4)]
            return all(s and s[-1][2] == 4 for s in latest)

        await fleet.wait_until(one_group, 30, "all four Workers in one group of 4")

        too_many = await gpufleet_cli(fleet, "scale", "pytorchjob/elastic", "--replicas", "5")
        assert too_many.returncode != 0 and "maxReplicas (4)" in too_many.stderr, too_many.stderr

        mark = grown[-1][0]
        shrink = await asyncio.to_thread(
            subprocess.run, [kubectl_binary(), "--kubeconfig", fleet.kubeconfig, "scale", "pytorchjob/elastic",
                             "--replicas", "2"],
            capture_output=True, text=True, timeout=60, env=dict(os.environ, HOME=str(fleet.root)))
        assert shrink.returncode == 0, shrink.stderr
        t0 = time.monotonic()
        shrunk = await fleet.wait_until(lambda: at_world(2, mark), 90, "training with 2 workers again")
        print(f"elastic 4 -> 2: world_size 2 after {time.monotonic() - t0:.1f} s")
        assert shrunk[0][0] >= mark - 5, f"progress lost: at step {mark} before, {shrunk[0][0]} after"
        job_now = await client.get("pytorchjobs", "elastic", NS, raw=True)
        assert "gpufleet.io/gang-restarts" not in (job_now["metadata"].get("annotations") or {})
        await job_pods(client, "elastic", fleet)

        # A GPU fails under worker-1: the node agent's report (Failed, DisruptionTarget
        # GPUUnhealthy). Only that member is replaced; worker-0's pod and its torchrun keep
        # running, and the group re-forms at 2 from the checkpoint.
        before = {p["metadata"]["name"]: p for p in await job_pods(client, "elastic", fleet)}
        mark = shrunk[-1][0]
        await report_gpu_failed(client, "elastic-worker-1")
        t0 = time.monotonic()

        async def replaced() -> list | None:
            pods = {p["metadata"]["name"]: p for p in await job_pods(client, "elastic", fleet)}
            w1 = pods.get("elastic-worker-1")
            if w1 is None or w1["metadata"]["uid"] == before["elastic-worker-1"]["metadata"]["uid"]:
                return None
            return await at_world(2, mark)

        again = await fleet.wait_until(replaced, 90, "worker-1 replaced and training with 2 workers again")
        print(f"elastic member on a failed GPU: world_size 2 again after {time.monotonic() - t0:.1f} s")
        assert again[0][0] >= mark - 5, f"progress lost: at step {mark} before, {again[0][0]} after"
        w0 = await client.get("Pod", "elastic-worker-0", NS, raw=True)
        assert w0["metadata"]["uid"] == before["elastic-worker-0"]["metadata"]["uid"]
        assert process_pids([w0]) == process_pids([before["elastic-worker-0"]])  # the same torchrun
        annotations = (await client.get("pytorchjobs", "elastic", NS, raw=True))["metadata"]["annotations"]
        assert annotations["gpufleet.io/hardware-restarts"] == "1" and "gpufleet.io/gang-restarts" not in annotations


async def report_gpu_failed(client: Client, name: str) -> None:
    """What the node agent writes through pods/status when the pod's GPU fails."""
    pod = await client.get("Pod", name, NS, raw=True)
    message = f"GPU 0 on node {pod['spec']['nodeName']} is unhealthy: XID 79 (GPU has fallen off the bus)"
    status = pod["status"]
    status.update(phase="Failed", reason="GPUUnhealthy", message=message)
    status["conditions"] = [c for c in status.get("conditions") or [] if c["type"] != "DisruptionTarget"] + [
        {"type": "DisruptionTarget", "status": "True", "reason": "GPUUnhealthy", "message": message,
         "lastTransitionTime": status.get("startTime")}]
    await client.update_status(pod, raw=True)
