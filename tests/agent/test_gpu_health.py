"""The GPU health loop end to end: a real control plane over HTTP, a real agent with declared
GPUs from an inventory file and the process runtime running real pods. Marking a GPU failed
in the inventory fences it (out of allocatable, its pod stopped as Failed with a
DisruptionTarget condition, the node's condition, Events and taint), no new pod gets it, a
validation brings it back; repeated failures hold it out until `gpufleet uncordon --gpu`."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from test_agent import NODE, Harness, eventually
from typer.testing import CliRunner

from gpufleet.agent.devices import DeclaredDevices
from gpufleet.api.gpu import GPU_INDICES_ANNOTATION, GPU_UNHEALTHY_REASON, parse_gpu_indices
from gpufleet.api.gpuhealth import GPU_CORDON_ANNOTATION, GPU_HEALTH_ANNOTATION, GPU_UNHEALTHY_TAINT
from gpufleet.cli.main import app
from gpufleet.client import NotFound

# Each pod says which GPU it was handed (the agent's environment for it), then waits.
HOLD = ["sh", "-c", 'echo "gpu=$NVIDIA_VISIBLE_DEVICES"; exec sleep 600']
FENCE_LIMIT_S = 5.0


class Inventory:
    def __init__(self, path: Path, count: int) -> None:
        self.path, self.count, self.tick = path, count, 0
        self.write({})

    def write(self, faults: dict[int, str]) -> None:
        lines = ["gpus:"]
        for i in range(self.count):
            extra = f", {faults[i]}" if i in faults else ""
            lines.append(f"  - {{model: H100-80GB-HBM3, memoryMiB: 81920, group: nvlink-0{extra}}}")
        self.path.write_text("\n".join(lines) + "\n")
        # mtimes move in whole steps, so two writes within a clock tick still read as a change.
        self.tick += 1
        stamp = (int(time.time()) + self.tick) * 10**9
        os.utime(self.path, ns=(stamp, stamp))


@pytest.fixture
async def h(tmp_path, answers):
    harness = Harness(tmp_path)
    harness.answers = answers
    await harness.start_control_plane()
    try:
        yield harness
    finally:
        await harness.close()


@pytest.fixture
def answers():
    """Where the validation pod's command reads its exit code: outside /tmp, since a pod's
    /tmp is its own."""
    path = Path(tempfile.mkdtemp(prefix="gpufleet-validation-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def gpu_agent(h: Harness, inv: Inventory, rc_value: str = "0", **config: Any):
    rc = h.answers / "validation-rc"
    rc.write_text(rc_value)
    rc.chmod(0o644)
    settings = dict(gpu_health_interval=0.2, gpu_validation_backoff=0.3,
                    gpu_validation_command=("sh", "-c", f'exit "$(cat {rc})"'))
    settings.update(config)
    return await h.start_agent(devices=DeclaredDevices.from_file(inv.path, NODE), **settings), rc


async def node(h: Harness) -> dict[str, Any]:
    return await h.api.get("nodes", NODE, raw=True)


def allocatable(n: dict[str, Any]) -> str:
    return n["status"]["allocatable"]["nvidia.com/gpu"]


def condition(n: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in n["status"]["conditions"] if c["type"] == "GPUHealthy")


def health(n: dict[str, Any], index: int) -> dict[str, Any]:
    return json.loads(n["metadata"]["annotations"][GPU_HEALTH_ANNOTATION])[str(index)]


def tainted(n: dict[str, Any]) -> bool:
    return any(t["key"] == GPU_UNHEALTHY_TAINT for t in n["spec"].get("taints") or [])


async def gpu_pod(h: Harness, name: str) -> dict[str, Any]:
    await h.pod(name, command=HOLD, container={"resources": {"limits": {"nvidia.com/gpu": 1}}},
                terminationGracePeriodSeconds=1)
    p = await h.wait_pod(name, lambda p: p["status"].get("phase") == "Running", what=f"{name} running")
    return await h.wait_pod(name, lambda p: GPU_INDICES_ANNOTATION in (p["metadata"].get("annotations") or {}),
                            what=f"{name}'s GPU recorded") if p else p


def index_of(p: dict[str, Any]) -> int:
    (i,) = parse_gpu_indices(p["metadata"]["annotations"][GPU_INDICES_ANNOTATION])
    return i


async def node_events(h: Harness) -> list[dict[str, Any]]:
    for a in h.agents:
        await a.recorder.flush()
    evs = await h.api.list("events", "default", raw=True)
    return [e for e in evs.items if e["involvedObject"].get("kind") == "Node"]


async def cli(h: Harness, *args: str) -> Any:
    return await asyncio.to_thread(CliRunner().invoke, app, [*args, "--kubeconfig", str(h.tmp / "cp" / "kubeconfig")])


async def test_xid_fences_the_gpu_stops_its_pod_and_validation_returns_it(h):
    inv = Inventory(h.tmp / "gpus.yaml", 2)
    # The default validation of declared GPUs: a pod given exactly that GPU checks it is the
    # one it got and that the inventory reports it healthy.
    agent, _ = await gpu_agent(h, inv, gpu_validation_command=None)
    assert allocatable(await node(h)) == "2" and condition(await node(h))["status"] == "True"
    first = await gpu_pod(h, "trainer")
    bad = index_of(first)
    uuid = agent.gpus[bad].uuid

    inv.write({bad: "xid: 79"})

    async def fenced():
        n = await node(h)
        return n if allocatable(n) == "1" and condition(n)["status"] == "False" else None
    n = await eventually(fenced, FENCE_LIMIT_S, "the GPU out of allocatable")
    p = await h.wait_pod("trainer", lambda p: p["status"].get("phase") == "Failed", FENCE_LIMIT_S, "trainer failed")
    assert n["status"]["capacity"]["nvidia.com/gpu"] == "2"
    cond = condition(n)
    assert cond["reason"] == "XID79" and f"GPU {bad} ({uuid})" in cond["message"] and "XID 79" in cond["message"]
    assert health(n, bad)["state"] == "Fenced" and health(n, bad)["xids"] == {"79": 1}
    gpus = json.loads(n["metadata"]["annotations"]["gpufleet.io/gpus"])
    assert gpus[bad]["health"] == "Unhealthy"  # what the scheduler reads
    # The pod: stopped, reported as Kubernetes users (and the PyTorchJob gang restart) expect.
    st = p["status"]
    assert st["reason"] == GPU_UNHEALTHY_REASON and f"GPU {bad}" in st["message"] and "XID 79" in st["message"]
    dt = next(c for c in st["conditions"] if c["type"] == "DisruptionTarget")
    assert (dt["status"], dt["reason"]) == ("True", GPU_UNHEALTHY_REASON) and "XID 79" in dt["message"]
    assert "terminated" in st["containerStatuses"][0]["state"]
    assert any(e["reason"] == "GPUUnhealthy" and "XID 79" in e["message"] for e in await node_events(h))
    assert not tainted(n)  # one GPU is still healthy

    # New pods never get the failed GPU: the next takes the other one, the one after waits.
    second = await gpu_pod(h, "second")
    assert index_of(second) != bad
    assert f"gpu={agent.gpus[1 - bad].uuid}" in (await agent_log(h, "second"))
    await h.pod("third", command=HOLD, container={"resources": {"limits": {"nvidia.com/gpu": 1}}})
    await h.wait_pod("third", lambda p: (p["status"].get("containerStatuses") or [{}])[0].get("state", {})
                     .get("waiting", {}).get("reason") == "GPUsUnavailable", what="third waiting for a GPU")
    await h.api.delete("pods", "third", "default", grace_period_seconds=0)
    # Nor does a pod that comes with the failed GPU named (a scheduler that read a stale node):
    # it can never run here, so it fails, and its controller makes another.
    await h.pod("stale", command=HOLD, container={"resources": {"limits": {"nvidia.com/gpu": 1}}},
                annotations={GPU_INDICES_ANNOTATION: str(bad)})
    p = await h.wait_pod("stale", lambda p: p["status"].get("phase") == "Failed", FENCE_LIMIT_S, "stale failed")
    assert p["status"]["reason"] == GPU_UNHEALTHY_REASON and f"GPU {bad} ({uuid})" in p["status"]["message"]
    assert "fenced" in p["status"]["message"] and "XID 79" in p["status"]["message"]
    assert not any("running" in cs.get("state", {}) for cs in p["status"].get("containerStatuses") or [])
    await h.api.delete("pods", "stale", "default", grace_period_seconds=0)

    # Both GPUs fail: the node is tainted.
    inv.write({bad: "xid: 79", 1 - bad: "ecc: {volatile: 2}"})
    n = await eventually(lambda: _node_if(h, lambda n: tainted(n) and allocatable(n) == "0"), FENCE_LIMIT_S,
                         "the node tainted")
    await h.wait_pod("second", lambda p: p["status"].get("phase") == "Failed", FENCE_LIMIT_S, "second failed")

    # Healthy again: validated, back in allocatable, the taint gone.
    inv.write({})
    n = await eventually(lambda: _node_if(h, lambda n: allocatable(n) == "2" and not tainted(n)
                                          and condition(n)["status"] == "True"), 10, "the GPUs back")
    assert [e["event"] for e in health(n, bad)["history"]] == ["Unhealthy", "Healthy"]
    reasons = [e["reason"] for e in await node_events(h)]
    assert "GPUValidating" in reasons and "GPUHealthy" in reasons
    # Each GPU came back through its validation pod, which said what it checked.
    returned = " ".join(e["message"] for e in await node_events(h) if e["reason"] == "GPUHealthy")
    for i in (0, 1):
        assert f"pod kube-system/gpu-validation-{NODE}-{i}: GPU {i} ({agent.gpus[i].uuid}): given to this pod " \
            "alone; the inventory reports it healthy" in returned
    # A validation that passed leaves no pod behind.
    left = await h.api.list("pods", "kube-system", raw=True)
    assert not [p for p in left if p["metadata"]["name"].startswith("gpu-validation-")]
    # The agent's /metrics, read as Prometheus does through the API server.
    metrics = (await h.api.raw_request("GET", f"/api/v1/nodes/{NODE}/proxy/metrics")).body.decode()
    assert f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{NODE}",UUID="{uuid}",gpu="{bad}",modelName="H100-80GB-HBM3"}} 79.0' \
        in metrics
    assert 'gpufleet_gpu_xid_errors_total{' in metrics and 'xid="79"} 1.0' in metrics
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" in metrics and "gpufleet_gpu_fenced{" in metrics

    # What an operator reads: the history in `gpufleet describe node` and `kubectl describe node`.
    r = await cli(h, "describe", "node", NODE)
    assert r.exit_code == 0, r.output
    section = r.output.split("GPU Health:")[1]
    assert uuid in section and "79x1" in section and "XID 79" in section and "Unhealthy" in section
    kubectl = await asyncio.to_thread(subprocess.run, ["kubectl", "--kubeconfig", str(h.tmp / "cp" / "kubeconfig"),
                                                       "describe", "node", NODE], capture_output=True, text=True,
                                      timeout=60)
    assert kubectl.returncode == 0, kubectl.stderr
    assert GPU_HEALTH_ANNOTATION in kubectl.stdout and "GPUHealthy" in kubectl.stdout
    assert "GPUUnhealthy" in kubectl.stdout  # the Events


async def test_repeated_failures_hold_the_gpu_until_uncordoned_and_cordon_gpu(h):
    inv = Inventory(h.tmp / "gpus.yaml", 2)
    agent, rc = await gpu_agent(h, inv)
    rc.write_text("1")
    # Failure 1: the XID. Failures 2 and 3: validations once it reads healthy again.
    inv.write({1: "xid: 48"})
    await eventually(lambda: _node_if(h, lambda n: allocatable(n) == "1"), FENCE_LIMIT_S, "GPU 1 fenced")
    inv.write({})
    n = await eventually(lambda: _node_if(h, lambda n: health(n, 1)["state"] == "Held"
                                          and GPU_CORDON_ANNOTATION in n["metadata"]["annotations"]), 10, "GPU 1 held")
    assert n["metadata"]["annotations"][GPU_CORDON_ANNOTATION] == "1"
    assert condition(n)["reason"] == "RepeatedFailures" and allocatable(n) == "1"
    assert [e["event"] for e in health(n, 1)["history"]].count("ValidationFailed") == 2
    # The failed validation pod stays for the operator: Failed, bound here, what it ran.
    vp = await h.api.get("pods", f"gpu-validation-{NODE}-1", "kube-system", raw=True)
    assert vp["status"]["phase"] == "Failed" and vp["spec"]["nodeName"] == NODE
    assert vp["metadata"]["ownerReferences"][0]["kind"] == "Node"
    assert vp["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
    assert "nvidia.com/gpu" not in str(vp["spec"]["containers"][0]["resources"])  # outside allocatable
    failed = [e["message"] for e in await node_events(h) if e["reason"] == "GPUValidationFailed"]
    assert any(f"pod kube-system/gpu-validation-{NODE}-1: exit code 1" in m for m in failed), failed
    # A passing check alone does not bring it back...
    rc.write_text("0")
    validations = sum(e["reason"] == "GPUValidating" for e in await node_events(h))
    for _ in range(5):
        await agent._gpu_health_pass()
    assert sum(e["reason"] == "GPUValidating" for e in await node_events(h)) == validations
    assert allocatable(await node(h)) == "1"
    # ...the operator's uncordon does (after one more validation).
    r = await cli(h, "uncordon", "--gpu", f"{NODE}:1")
    assert r.exit_code == 0 and r.output.strip() == f"node/{NODE} gpu 1 uncordoned", r.output
    await eventually(lambda: _node_if(h, lambda n: allocatable(n) == "2"), 10, "GPU 1 back")

    # cordon --gpu: out of service without touching its pod; uncordon: straight back.
    p = await gpu_pod(h, "keeps-running")
    i = index_of(p)
    r = await cli(h, "cordon", "--gpu", f"{NODE}:{i}")
    assert r.exit_code == 0 and r.output.strip() == f"node/{NODE} gpu {i} cordoned", r.output
    n = await eventually(lambda: _node_if(h, lambda n: allocatable(n) == "1"), FENCE_LIMIT_S, "cordoned GPU out")
    assert condition(n)["reason"] == "OperatorCordon" and health(n, i)["state"] == "Cordoned"
    assert (await h.get("keeps-running"))["status"]["phase"] == "Running"
    r = await cli(h, "cordon", "--gpu", f"{NODE}:{i}")
    assert r.output.strip() == f"node/{NODE} gpu {i} already cordoned"
    r = await cli(h, "cordon", "--gpu", f"{NODE}:7")
    assert r.exit_code == 1 and f"node {NODE} has no GPU 7" in r.output
    r = await cli(h, "cordon", "--gpu", "nocolon")
    assert r.exit_code != 0 and "is not NODE:INDEX" in r.output
    r = await cli(h, "uncordon", "--gpu", f"{NODE}:{i}")
    assert r.exit_code == 0, r.output
    await eventually(lambda: _node_if(h, lambda n: allocatable(n) == "2"), FENCE_LIMIT_S, "uncordoned GPU back")


async def test_a_fence_outlives_an_agent_restart(h):
    inv = Inventory(h.tmp / "gpus.yaml", 2)
    agent, _ = await gpu_agent(h, inv)
    inv.write({0: "xid: 119"})
    await eventually(lambda: _node_if(h, lambda n: allocatable(n) == "1"), FENCE_LIMIT_S, "GPU 0 fenced")
    # A pod that only looks like a validation pod (here an admin's) is never run nor given the
    # fenced GPU: the agent removes it.
    forged = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "forged", "namespace": "kube-system",
        "annotations": {"kubernetes.io/config.mirror": "x", "gpufleet.io/gpu-validation": "0",
                        "gpufleet.io/gpu-validation-token": "guess"}},
        "spec": {"nodeName": NODE, "restartPolicy": "Never",
                 "containers": [{"name": "check", "image": "host", "command": HOLD}]}}
    await h.api.create(forged, raw=True)

    async def forged_gone():
        try:
            p = await h.api.get("pods", "forged", "kube-system", raw=True)
        except NotFound:
            return True
        assert not any("running" in cs.get("state", {}) for cs in p["status"].get("containerStatuses") or [])
        return False
    await eventually(forged_gone, 10, "the forged validation pod removed")
    assert agent.gpu_table.owner.get(0) is None
    await agent.stop()
    await agent.client.close()
    h.agents.remove(agent)
    # While the agent is away the inventory reads healthy again; the next agent still wants a
    # passing validation before GPU 0 returns.
    inv.write({})
    agent, rc = await gpu_agent(h, inv, rc_value="1")

    async def refused():
        n = await node(h)
        failed = [e for e in await node_events(h) if e["reason"] == "GPUValidationFailed"]
        return n if failed and allocatable(n) == "1" else None
    n = await eventually(refused, 10, "the restarted agent's validation refused")
    assert health(n, 0)["state"] == "Fenced" and health(n, 0)["xids"] == {"119": 1}
    rc.write_text("0")
    await eventually(lambda: _node_if(h, lambda n: allocatable(n) == "2"), 10, "GPU 0 back")


async def _node_if(h: Harness, pred) -> dict[str, Any] | None:
    n = await node(h)
    return n if pred(n) else None


async def agent_log(h: Harness, name: str) -> str:
    async def read():
        text = await h.api.log(name)
        return text if "gpu=" in text else None
    return await eventually(read, 5, f"{name}'s log")
