"""Memory of one node agent: a real `gpufleet server` and one `gpufleet agent` (process runtime,
4 declared GPUs, reaching the server over HTTPS with a kubeconfig), idle and then running
--pods bare pods (`sleep`, a small CPU request). The agent process alone is measured (its pods
are processes of their own): RSS and USS (memory no other process shares), sampled every
0.5 s for --sample-seconds in each phase.

    .venv/bin/python bench/agent_memory_bench.py [--pods 10] [--compare-src /path/to/other/tree]

`--compare-src` runs the same on a second tree (its gpufleet on PYTHONPATH), one after the
other, and prints both side by side. Figures are printed, never asserted. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster_bench import Cluster, source_env, wait_nodes_ready  # noqa: E402

MIB = 1 << 20


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "busybox", "command": ["sleep", "3600"],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}


def sample(proc: psutil.Process, seconds: float) -> dict[str, Any]:
    rss, uss = [], []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            info = proc.memory_full_info()
            rss.append(info.rss / MIB)
            uss.append(info.uss / MIB)
        time.sleep(0.5)
    out: dict[str, Any] = {"rss_median": statistics.median(rss), "rss_max": max(rss),
                           "uss_median": statistics.median(uss)}
    # Whether the agent loaded the API's typed models (pydantic's core library is mapped).
    with contextlib.suppress(OSError):
        out["typed_models"] = "_pydantic_core" in Path(f"/proc/{proc.pid}/maps").read_text()
    return out


async def measure(src: str | None, pods: int, seconds: float) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-agentmem-"))
    c = Cluster(root)
    c.env = source_env(src)
    try:
        c.start_server()
        c.start_agent("node-0", gpus=4)
        client = c.client()
        await wait_nodes_ready(client, ["node-0"])
        agent = psutil.Process(c.agents["node-0"].pid)
        await asyncio.sleep(3)  # past the first status writes
        idle = await asyncio.to_thread(sample, agent, seconds)
        t0 = time.monotonic()
        for i in range(pods):
            await client.create(pod(f"mem-{i}"))
        while True:
            listed = await client.list("pods", namespace="default", raw=True)
            if sum((p.get("status") or {}).get("phase") == "Running" for p in listed) >= pods:
                break
            if time.monotonic() - t0 > 120:
                raise RuntimeError("pods not Running after 120 s")
            await asyncio.sleep(0.5)
        busy = await asyncio.to_thread(sample, agent, seconds)
        return {"idle": idle, "busy": busy}
    finally:
        c.close()
        # The pods' processes (each under a monitor in a session of its own) outlive their
        # agent, as a kubelet's containers do: whatever still runs from this directory goes.
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(str(root) in part for part in proc.info["cmdline"] or ()):
                    proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=10)
    ap.add_argument("--sample-seconds", type=float, default=15.0)
    ap.add_argument("--compare-src", default=None, metavar="DIR")
    args = ap.parse_args()
    trees = [("this tree", None)] + ([(args.compare_src, args.compare_src)] if args.compare_src else [])
    results = []
    for label, src in trees:
        print(f"measuring {label} ...", file=sys.stderr, flush=True)
        results.append((label, asyncio.run(measure(src, args.pods, args.sample_seconds))))
    print(f"agent memory, MiB (one agent; idle, then {args.pods} pods running; median of 0.5 s samples)")
    print(f"{'tree':<40} {'idle RSS':>9} {'idle USS':>9} {'pods RSS':>9} {'pods max':>9} {'pods USS':>9}"
          "  pydantic loaded")
    for label, r in results:
        i, b = r["idle"], r["busy"]
        print(f"{label[:40]:<40} {i['rss_median']:9.1f} {i['uss_median']:9.1f} {b['rss_median']:9.1f} "
              f"{b['rss_max']:9.1f} {b['uss_median']:9.1f}  {b.get('typed_models')}")
    if len(results) == 2:
        a, b = results[0][1]["busy"]["rss_median"], results[1][1]["busy"]["rss_median"]
        print(f"other / this tree, RSS with pods: {b / a:.2f}")


if __name__ == "__main__":
    main()
