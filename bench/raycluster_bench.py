"""RayCluster bring-up: `kubectl apply` of a 1-head + 4-worker RayCluster on gpufleet to every
Ray node alive, against Ray's own `ray.cluster_utils.Cluster` of the same shape, in one run on
the same machine.

    .venv/bin/python bench/raycluster_bench.py [--runs 3] [--workers 4] [--agents 2]

gpufleet: `gpufleet server` (SQLite, scheduler and controllers) and --agents `gpufleet agent`s
with the process runtime and enough declared GPUs for the workers. KubeRay's sample cluster
(examples/ray/ray-cluster.sample.yaml: a head of 1 CPU, workers of 1 CPU and 1 GPU) with
--workers replicas is applied with the real kubectl when one is on PATH (`$KUBECTL` names
another), else with gpufleet's client. Each Ray process is the real `ray start`, from this
interpreter's environment. Timed from just before the apply:

    pods      every pod of the cluster exists
    running   every pod is Running (its `ray start` launched)
    head      the head's GCS answers (its address read from the `<cluster>-head` ConfigMap)
    alive     the GCS lists 1 + workers nodes ALIVE (what `ray status` would show)

Ray: `Cluster(initialize_head=True)` with a head of 1 CPU and no GPU, then --workers
`add_node(num_cpus=1, num_gpus=1)`; timed from just before `Cluster()`:

    head      the head node is up (Cluster() returned)
    alive     the GCS lists 1 + workers nodes ALIVE

Both count ALIVE nodes through the same GCS client call. Between runs the RayCluster is
deleted and its pods gone, and Ray's cluster is shut down. Figures are printed (a table, and
JSON with --json), never asserted; the ratio is gpufleet / Ray (above 1: gpufleet slower).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

if __package__:
    from .cluster_bench import Cluster, _pgids, wait_nodes_ready
else:
    from cluster_bench import Cluster, _pgids, wait_nodes_ready

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "ray" / "ray-cluster.sample.yaml"
NAME = "raycluster-kuberay"
NAMESPACE = "default"
OBJECT_STORE = 80_000_000
perf = time.perf_counter


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def manifest(workers: int, temp_dir: str) -> dict[str, Any]:
    cluster = yaml.safe_load(SAMPLE.read_text())
    spec = cluster["spec"]
    groups = spec["workerGroupSpecs"]
    groups[0].update(replicas=workers, minReplicas=workers, maxReplicas=max(workers, groups[0]["maxReplicas"]))
    for g in [spec["headGroupSpec"], *groups]:
        g["rayStartParams"]["temp-dir"] = temp_dir
        for c in g["template"]["spec"]["containers"]:
            # The pods run `ray` from this machine's environment, on the node, as the e2e tests do.
            c["securityContext"] = {"privileged": True}
            c["env"] = [{"name": "RAY_USAGE_STATS_ENABLED", "value": "0"}]
    return cluster


class GcsNodes:
    """Counts the nodes a GCS lists as ALIVE. The client is made once the GCS port accepts
    connections (Ray's client waits up to half a minute for a GCS that is not there yet)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.client: Any = None

    def alive(self) -> int | None:
        """None while the GCS does not answer."""
        if self.client is None:
            host, _, port = self.address.rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=0.5).close()
            except OSError:
                return None
            from ray._raylet import GcsClient

            self.client = GcsClient(address=self.address)
        try:
            info = self.client.get_all_node_info(timeout=2)
        except Exception:  # noqa: BLE001 - any failure means "not answering yet"
            return None
        return sum(1 for n in info.values() if n.state == 0)  # GcsNodeState ALIVE


def _ray_pids(marker: str) -> set[int]:
    out: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if marker in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                    out.add(int(entry))
    return out


def _kill_ray(marker: str) -> None:
    for pid in _ray_pids(marker):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


# --- gpufleet --------------------------------------------------------------------------------


def apply(c: Cluster, body: dict[str, Any]) -> None:
    kubectl = os.environ.get("KUBECTL") or shutil.which("kubectl")
    kubeconfig = str(c.root / "server" / "kubeconfig")
    if kubectl:
        out = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "apply", "-f", "-"], input=json.dumps(body),
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"kubectl apply failed: {out.stderr}")
    else:
        asyncio.run(_create(c, body))


async def _create(c: Cluster, body: dict[str, Any]) -> None:
    client = c.client()
    try:
        await client.create(body, raw=True)
    finally:
        await client.close()


async def gpufleet_run(c: Cluster, workers: int, temp_dir: str, within: float) -> dict[str, float | None]:
    client = c.client()
    marks: dict[str, float | None] = {"pods": None, "running": None, "head": None, "alive": None}
    body = manifest(workers, temp_dir)
    try:
        t0 = perf()
        await asyncio.to_thread(apply, c, body)
        marks["apply"] = perf() - t0
        gcs: GcsNodes | None = None
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and marks["alive"] is None:
            pods = [p for p in await client.list("Pod", NAMESPACE, label_selector={"ray.io/cluster": NAME}, raw=True)
                    if not p["metadata"].get("deletionTimestamp")]
            for p in pods:
                c.container_pgids.update(_pgids(p))
            now = perf() - t0
            if marks["pods"] is None and len(pods) == 1 + workers:
                marks["pods"] = now
            if marks["running"] is None and len(pods) == 1 + workers and all(
                    (p.get("status") or {}).get("phase") == "Running" for p in pods):
                marks["running"] = now
            if gcs is None:
                with contextlib.suppress(Exception):
                    data = (await client.get("ConfigMap", f"{NAME}-head", NAMESPACE, raw=True)).get("data") or {}
                    if data.get("RAY_IP") and data.get("RAY_PORT"):
                        gcs = GcsNodes(f"{data['RAY_IP']}:{data['RAY_PORT']}")
            if gcs is not None:
                n = await asyncio.to_thread(gcs.alive)
                if n is not None and marks["head"] is None:
                    marks["head"] = perf() - t0
                if n is not None and n >= 1 + workers:
                    marks["alive"] = perf() - t0
                    break
            await asyncio.sleep(0.1)
        if marks["alive"] is None:
            raise RuntimeError(f"the RayCluster's {1 + workers} Ray nodes were not alive after {within:.0f} s")
        await client.delete("rayclusters", NAME, NAMESPACE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not await client.list("Pod", NAMESPACE, label_selector={"ray.io/cluster": NAME}, raw=True):
                break
            await asyncio.sleep(0.2)
    finally:
        await client.close()
    return marks


# --- Ray -------------------------------------------------------------------------------------


def ray_run(workers: int, temp_dir: str) -> dict[str, float | None]:
    from ray.cluster_utils import Cluster as RayCluster

    t0 = perf()
    cluster = RayCluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0, "object_store_memory": OBJECT_STORE, "temp_dir": temp_dir})
    marks: dict[str, float | None] = {"head": perf() - t0, "alive": None}
    try:
        for _ in range(workers):
            cluster.add_node(num_cpus=1, num_gpus=1, object_store_memory=OBJECT_STORE, wait=False)
        gcs = GcsNodes(cluster.address)
        while marks["alive"] is None:
            n = gcs.alive()
            if n is not None and n >= 1 + workers:
                marks["alive"] = perf() - t0
            else:
                time.sleep(0.05)
    finally:
        cluster.shutdown()
    return marks


# --- the run ---------------------------------------------------------------------------------


def median(runs: list[dict[str, float | None]], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None  # type: ignore[type-var]


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def render(result: dict[str, Any]) -> str:
    ours, ray = result["gpufleet"], result["ray"]
    lines = [f"RayCluster 1 head + {result['workers']} workers (1 GPU each), {result['runs']} runs, medians",
             f"{'':26}{'gpufleet':>12}{'Ray Cluster':>14}{'ratio':>8}"]
    for key, label in (("pods", "all pods exist"), ("running", "all pods Running"), ("head", "head GCS answers"),
                       ("alive", "all Ray nodes ALIVE")):
        a, b = median(ours, key), median(ray, key) if key in ("head", "alive") else None
        ratio = f"{a / b:.2f}x" if a is not None and b else ""
        lines.append(f"{label:26}{_s(a):>12}{_s(b):>14}{ratio:>8}")
    lines.append("runs (alive): gpufleet " + ", ".join(_s(r["alive"]) for r in ours)
                 + "; Ray " + ", ".join(_s(r["alive"]) for r in ray))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--agents", type=int, default=2, help="gpufleet nodes; the workers' GPUs are spread over them")
    p.add_argument("--within", type=float, default=180, help="seconds a run may take")
    p.add_argument("--json", type=Path, help="also write the figures here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The pods run `ray` from this interpreter's environment (the agents pass PATH on).
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray's socket paths must stay short: one directory of its own per side.
    temp = tempfile.mkdtemp(prefix="gfrb-", dir="/tmp")
    ours_dir, ray_dir = f"{temp}/g", f"{temp}/r"
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-ray-"))
    gpus = -(-args.workers // args.agents)
    result: dict[str, Any] = {"workers": args.workers, "runs": args.runs, "gpufleet": [], "ray": []}
    c = Cluster(root)
    try:
        progress(f"starting gpufleet: a server and {args.agents} agents of {gpus} GPUs (process runtime)")
        c.start_server()
        for i in range(args.agents):
            c.start_agent(f"node-{i}", gpus=gpus)

        async def prepare() -> None:
            client = c.client()
            try:
                await wait_nodes_ready(client, list(c.agents))
                await client.patch("Namespace", NAMESPACE, {"metadata": {"labels": {
                    "pod-security.kubernetes.io/enforce": "privileged"}}}, raw=True)
            finally:
                await client.close()

        try:
            asyncio.run(prepare())
        except RuntimeError:
            for name in c.agents:
                progress(f"--- {name} ---\n" + (root / name / "agent.log").read_text(errors="replace")[-2000:])
            raise
        for run in range(args.runs):
            progress(f"run {run + 1}/{args.runs}: gpufleet")
            result["gpufleet"].append(asyncio.run(gpufleet_run(c, args.workers, ours_dir, args.within)))
            _kill_ray(ours_dir)
            progress(f"run {run + 1}/{args.runs}: Ray cluster_utils.Cluster")
            result["ray"].append(ray_run(args.workers, ray_dir))
            _kill_ray(ray_dir)
    finally:
        c.close()
        _kill_ray(temp)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(temp, ignore_errors=True)
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
