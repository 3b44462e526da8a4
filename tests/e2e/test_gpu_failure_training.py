"""A GPU fails under real training: `gpufleet up --no-agent` and three `gpufleet agent`s of 4
declared GPUs each (inventory files, process runtime), running examples/training/train.py with
gloo under two PyTorchJobs: a fixed gang of 4 (backoffLimit 0) and an elastic job under
torchrun (min 2, max 4). One GPU of each job is marked `xid: 79` in its agent's inventory:

- the GPU leaves its node's allocatable and the pod on it is stopped (Failed, GPUUnhealthy,
  DisruptionTarget);
- the fixed gang restarts from its checkpoint on healthy GPUs (the step goes on, not from 0)
  without spending its backoffLimit (the move is counted in gpufleet.io/hardware-restarts);
- the elastic job replaces only that member; the other keeps its pod and its torchrun;
- no pod is ever given a failed GPU (each pod's annotation and the NVIDIA_VISIBLE_DEVICES its
  process printed);
- once the inventory reads healthy again the GPU is validated and returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Fleet, process_pids, running_fleet

from gpufleet.api.gpu import GPU_INDICES_ANNOTATION, GPU_UNHEALTHY_REASON, GPUS_ANNOTATION, parse_gpu_indices
from gpufleet.client.api import Client
from gpufleet.client.errors import ApiError
from gpufleet.client.kubeconfig import transport_from_kubeconfig

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "training" / "train.py")
NODES = ("gpu-a", "gpu-b", "gpu-c")
GPUS = 4
NS = "default"
_STEP = re.compile(r"^step=(\d+) loss=[0-9.]+ world_size=(\d+) rank=\d+$", re.M)
_RESUMED = re.compile(r"^resumed from step=(\d+)", re.M)
_GPU = re.compile(r"^gpu=(\S*)$", re.M)
ARGS = ["--steps", "100000", "--step-sleep", "0.1", "--checkpoint-every", "5", "--log-every", "5",
        "--batch-size", "16"]


def inventory(path: Path, faults: set[int], tick: int) -> None:
    rows = [f"  - {{model: H100-80GB-HBM3, memoryMiB: 81920, group: nvlink-0{', xid: 79' if i in faults else ''}}}"
            for i in range(GPUS)]
    path.write_text("gpus:\n" + "\n".join(rows) + "\n")
    # The agent re-reads the file when its mtime changes: make each write's mtime differ.
    stamp = (int(time.time()) + tick) * 10**9
    os.utime(path, ns=(stamp, stamp))


def replica(n: int, *, elastic: bool) -> dict[str, Any]:
    launcher = ["python", "-m", "torch.distributed.run"] if elastic else ["python"]
    return {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": {
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "pytorch", "image": "python:3.11",
            # The process says which GPU it was given, then becomes the launcher (same pid).
            "command": ["sh", "-c", 'echo "gpu=$NVIDIA_VISIBLE_DEVICES"; exec "$@"', "sh", *launcher, TRAIN, *ARGS],
            "resources": {"limits": {"nvidia.com/gpu": 1}},
            # The interpreter with torch lives under this machine's /root (see test_training.py).
            "securityContext": {"privileged": True}}]}}}


def jobs(root: Path) -> list[dict[str, Any]]:
    fixed = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "fixed", "annotations": {"gpufleet.io/checkpoint-dir": str(root / "ckpt" / NS / "fixed")}},
        "spec": {"runPolicy": {"backoffLimit": 0},
                 "pytorchReplicaSpecs": {"Master": replica(1, elastic=False), "Worker": replica(3, elastic=False)}},
    }
    elastic = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "elastic", "annotations": {
            "gpufleet.io/checkpoint-dir": str(root / "ckpt" / NS / "elastic"), "gpufleet.io/elastic-autoscale": "false"}},
        "spec": {"elasticPolicy": {"minReplicas": 2, "maxReplicas": 4, "maxRestarts": 10,
                                   "rdzvConf": [{"key": "last_call_timeout", "value": "1"}]},
                 "pytorchReplicaSpecs": {"Worker": replica(2, elastic=True)}},
    }
    return [fixed, elastic]


def live(pods: list[dict]) -> list[dict]:
    return [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")]


async def log(client: Client, name: str) -> str:
    try:
        return await client.log(name, NS)
    except ApiError:
        return ""


async def test_gpu_failure_under_training(tmp_path: Path) -> None:
    t_start = time.monotonic()
    invs = {n: tmp_path / f"gpus-{n}.yaml" for n in NODES}
    for path in invs.values():
        inventory(path, set(), 0)
    extra = ["--checkpoint-root", str(tmp_path / "ckpt"), "--gpu-health-interval", "0.2",
             "--gpu-validation-backoff", "0.5"]
    with running_fleet(tmp_path, ["up", "--no-agent"], [], gpus=0, python_on_path=True, poll_interval=0.3) as fleet:
        for n in NODES:
            fleet.start_agent(n, gpus=0, gpu_inventory=invs[n], join=False, extra=extra)
        async with Client(transport_from_kubeconfig(fleet.kubeconfig)) as client:
            await run(fleet, client, invs, t_start)


async def run(fleet: Fleet, client: Client, invs: dict[str, Path], t_start: float) -> None:
    await fleet.nodes_ready(client)
    await client.patch("Namespace", NS, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/warn": "privileged"}}}, raw=True)
    uuids = {}
    for n in NODES:
        node = await client.get("Node", n, raw=True)
        uuids[n] = {g["index"]: g["uuid"] for g in json.loads(node["metadata"]["annotations"][GPUS_ANNOTATION])}
    for job in jobs(fleet.root):
        await client.create(job, NS, raw=True)

    # Every pod ever seen, by uid: where it ran, which GPUs it was given (and which GPUs had
    # failed by then), and every status it went through, from a watch that misses none.
    seen: dict[str, dict[str, Any]] = {}
    fenced: dict[str, set[int]] = {}  # node -> indices failed, from the moment they were marked

    def record(p: dict) -> None:
        uid, ann = p["metadata"]["uid"], p["metadata"].get("annotations") or {}
        s = seen.setdefault(uid, {"name": p["metadata"]["name"], "statuses": []})
        if GPU_INDICES_ANNOTATION in ann and "gpus" not in s:
            s.update(node=p["spec"]["nodeName"], gpus=set(parse_gpu_indices(ann[GPU_INDICES_ANNOTATION])),
                     after={k: set(v) for k, v in fenced.items()})
        st = p.get("status") or {}
        entry = (st.get("phase"), st.get("reason"), st.get("message"),
                 [c for c in st.get("conditions") or [] if c["type"] == "DisruptionTarget"], time.monotonic())
        if not s["statuses"] or s["statuses"][-1][:2] != entry[:2]:
            s["statuses"].append(entry)

    async def watch() -> None:
        version = None
        while True:  # the server ends a watch now and then: go on from the last version seen
            async for ev in client.watch("Pod", NS, resource_version=version, raw=True, allow_bookmarks=False):
                record(ev.object)
                version = ev.object["metadata"]["resourceVersion"]

    watcher = asyncio.create_task(watch())
    try:
        await scenario(fleet, client, invs, t_start, uuids, seen, fenced)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    # No pod went back from Failed to a phase that is not terminal.
    for uid, s in seen.items():
        phases = [e[0] for e in s["statuses"]]
        if "Failed" in phases:
            assert set(phases[phases.index("Failed"):]) <= {"Failed"}, f"{s['name']} ({uid}): {phases}"


async def scenario(fleet: Fleet, client: Client, invs: dict[str, Path], t_start: float, uuids: dict,
                   seen: dict[str, dict[str, Any]], fenced: dict[str, set[int]]) -> None:
    async def pods() -> list[dict]:
        got = await client.list("Pod", NS, raw=True)
        fleet.pids |= process_pids(got)
        return got

    def job_of(p: dict) -> str:
        return p["metadata"].get("labels", {}).get("training.kubeflow.org/job-name", "")

    async def training() -> dict | None:
        ps = live(await pods())
        by = {j: {p["metadata"]["name"]: p for p in ps if job_of(p) == j} for j in ("fixed", "elastic")}
        if len(by["fixed"]) != 4 or len(by["elastic"]) != 2:
            return None
        master = [(s, w) for s, w in _STEP.findall(await log(client, "fixed-master-0"))]
        e0 = [(s, w) for s, w in _STEP.findall(await log(client, "elastic-worker-0"))]
        if master and int(master[-1][0]) >= 10 and e0 and int(e0[-1][0]) >= 10 and e0[-1][1] == "2":
            return by
        return None

    by = await fleet.wait_until(training, 180, "both jobs training past step 10")
    t_training = time.monotonic()
    print(f"both jobs training {t_training - t_start:.1f} s after the fleet started")

    victims = {"fixed": by["fixed"]["fixed-worker-1"], "elastic": by["elastic"]["elastic-worker-1"]}
    survivor = by["elastic"]["elastic-worker-0"]
    survivor_pids = process_pids([survivor])
    assert survivor_pids
    bad: dict[str, set[int]] = {}
    for v in victims.values():
        (idx,) = parse_gpu_indices(v["metadata"]["annotations"][GPU_INDICES_ANNOTATION])
        bad.setdefault(v["spec"]["nodeName"], set()).add(idx)
    fenced.update({n: set(i) for n, i in bad.items()})
    resumes_before = len(_RESUMED.findall(await log(client, "elastic-worker-0")))
    for n, idx in bad.items():
        inventory(invs[n], idx, 1)
    t0 = time.monotonic()

    async def out_of_allocatable() -> bool:
        for n, idx in bad.items():
            node = await client.get("Node", n, raw=True)
            if node["status"]["allocatable"]["nvidia.com/gpu"] != str(GPUS - len(idx)):
                return False
        return True

    await fleet.wait_until(out_of_allocatable, 10, "the failed GPUs out of allocatable", interval=0.1)
    t_fenced = time.monotonic() - t0

    stopped: dict[str, float] = {}

    async def both_stopped() -> bool:
        for j, v in victims.items():
            for phase, reason, message, disruption, at in seen[v["metadata"]["uid"]]["statuses"]:
                if phase == "Failed" and j not in stopped:
                    assert reason == GPU_UNHEALTHY_REASON and "XID 79" in message, (j, reason, message)
                    assert any(c["status"] == "True" and c["reason"] == GPU_UNHEALTHY_REASON for c in disruption)
                    stopped[j] = at - t0
        return len(stopped) == 2

    await fleet.wait_until(both_stopped, 10, "the pods on the failed GPUs stopped", interval=0.1)
    print(f"xid 79: GPUs out of allocatable after {t_fenced:.2f} s, pods stopped after "
          + ", ".join(f"{j} {s:.2f} s" for j, s in sorted(stopped.items())))

    # The fixed gang: a new attempt of 4 running, resumed from its checkpoint, backoffLimit unspent.
    async def fixed_resumed() -> int | None:
        ps = [p for p in live(await pods()) if job_of(p) == "fixed"
              and p["metadata"]["annotations"].get("gpufleet.io/gang-attempt") == "1"]
        if len(ps) != 4:
            return None
        m = _RESUMED.search(await log(client, "fixed-master-0"))
        return int(m.group(1)) if m else None

    resumed_at = await fleet.wait_until(fixed_resumed, 120, "the fixed gang resumed from its checkpoint")
    print(f"fixed gang resumed from step {resumed_at} {time.monotonic() - t0:.1f} s after the XID")
    assert resumed_at >= 5, f"the gang started over (resumed from step {resumed_at})"
    job = await client.get("pytorchjobs", "fixed", NS, raw=True)
    assert not any(c["type"] == "Failed" and c["status"] == "True" for c in job["status"].get("conditions") or []), job
    ann = job["metadata"]["annotations"]
    assert ann.get("gpufleet.io/hardware-restarts") == "1", ann
    assert ann.get("gpufleet.io/gang-restarts", "0") == "0", ann

    async def fixed_goes_on() -> bool:
        after = [int(s) for s, _ in _STEP.findall(await log(client, "fixed-master-0"))]
        return bool(after) and after[0] > resumed_at - 1 and after[-1] > resumed_at

    await fleet.wait_until(fixed_goes_on, 60, "the fixed gang training on from its checkpoint")

    # The elastic job: only worker-1 replaced; worker-0 keeps its pod and torchrun, whose
    # worker resumes from the checkpoint in the re-formed group of 2.
    async def elastic_again() -> list | None:
        ps = {p["metadata"]["name"]: p for p in live(await pods()) if job_of(p) == "elastic"}
        w1 = ps.get("elastic-worker-1")
        if w1 is None or w1["metadata"]["uid"] == victims["elastic"]["metadata"]["uid"]:
            return None
        text = await log(client, "elastic-worker-0")
        if len(_RESUMED.findall(text)) <= resumes_before:
            return None
        later = [int(s) for s, w in _STEP.findall(text.split("resumed from step")[-1]) if w == "2"]
        return later if len(later) >= 2 else None

    again = await fleet.wait_until(elastic_again, 120, "elastic worker-1 replaced and training at 2 again")
    print(f"elastic member replaced, training again at step {again[0]} {time.monotonic() - t0:.1f} s after the XID")
    w0 = await client.get("Pod", "elastic-worker-0", NS, raw=True)
    assert w0["metadata"]["uid"] == survivor["metadata"]["uid"]
    assert process_pids([w0]) == survivor_pids, "worker-0's torchrun was restarted"
    ann = (await client.get("pytorchjobs", "elastic", NS, raw=True))["metadata"]["annotations"]
    assert ann.get("gpufleet.io/hardware-restarts") == "1" and "gpufleet.io/gang-restarts" not in ann, ann

    # No pod was ever given a failed GPU after it failed: the scheduler's view, and the process's.
    await pods()
    for uid, s in seen.items():
        if "gpus" not in s:
            continue
        given = s["gpus"] & s["after"].get(s["node"], set())
        assert not given, f"pod {s['name']} ({uid}) was given failed GPU {given} on {s['node']}"
    for p in live(await pods()):
        node, (idx,) = p["spec"]["nodeName"], parse_gpu_indices(p["metadata"]["annotations"][GPU_INDICES_ANNOTATION])
        assert idx not in bad.get(node, set()), f"{p['metadata']['name']} holds failed GPU {idx} on {node}"
        printed = _GPU.findall(await log(client, p["metadata"]["name"]))
        assert printed == [uuids[node][idx]], f"{p['metadata']['name']} saw {printed}, given {uuids[node][idx]}"

    # Healthy again: validated, back in allocatable.
    for n in bad:
        inventory(invs[n], set(), 2)
    t1 = time.monotonic()

    async def back() -> bool:
        for n in bad:
            node = await client.get("Node", n, raw=True)
            healthy = next(c for c in node["status"]["conditions"] if c["type"] == "GPUHealthy")
            if node["status"]["allocatable"]["nvidia.com/gpu"] != str(GPUS) or healthy["status"] != "True":
                return False
        return True

    await fleet.wait_until(back, 15, "the GPUs back in allocatable", interval=0.1)
    # Each came back through its node's validation pod, given that GPU alone.
    events = await client.list("Event", "default", raw=True)
    for n, idx in bad.items():
        for i in idx:
            said = [e["message"] for e in events if e["reason"] == "GPUHealthy" and e["involvedObject"]["name"] == n
                    and f"pod kube-system/gpu-validation-{n}-{i}: GPU {i} ({uuids[n][i]}): given to this pod "
                        "alone" in e["message"]]
            assert said, f"no validation pod returned GPU {i} of {n}"
    print(f"healthy again: back in allocatable after {time.monotonic() - t1:.2f} s; "
          f"whole test {time.monotonic() - t_start:.1f} s")
