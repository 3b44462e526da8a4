"""List benchmark: what a list of pods costs at fleet scale, through HTTP.

    .venv/bin/python bench/list_bench.py [--pods 50000] [--nodes 5000] [--repeats 30] [--compare-src DIR]

The store (SQLite, as `gpufleet up` makes it) is filled first with --pods pods bound evenly to
--nodes node names, each a typical pod as the scheduler and an agent leave it (about 2 KB of
JSON: labels, annotations, one container with resources, a Running status with conditions);
then a real `gpufleet server` (no controllers, so the figures are the API's alone) serves it.

Printed, in one run (p50 / p99 of --repeats requests, wall time of the whole request through
HTTP, the response read but not decoded):
- an agent's node-scoped list, `fieldSelector=spec.nodeName=NODE`, which the store answers from
  its spec.nodeName index;
- the same pods selected by a label every pod carries with its node's name
  (`labelSelector=bench-node=NODE`), which has no index: every pod is read and matched, what
  the node-scoped list cost before the index;
- a full list of every pod (fewer repeats: --full-repeats): the first one apart (it makes the
  store's list cache) and the p50 of the rest;
- the CPU the server and this client spent per full list (p50 after the first);
- the server's RSS after the lists.
--compare-src DIR then runs the same with the server of another source tree, on a store filled
the same way (ratios are meaningful only within one run of this script).
Figures are printed, never asserted. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from gpufleet.store.sqlite import SQLiteStore

if __package__:
    from .cluster_bench import Cluster, pct, source_env
else:
    from cluster_bench import Cluster, pct, source_env

perf = time.perf_counter


def _pod(i: int, node: str) -> dict[str, Any]:
    name = f"job-{i // 8:05d}-worker-{i % 8}"
    stamp = "2026-12-01T10:00:00Z"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"00000000-0000-4000-8000-{i:012d}",
                     "creationTimestamp": stamp, "labels": {"app": "trainer", "bench-node": node,
                                                            "training.kubeflow.org/job-name": f"job-{i // 8:05d}"},
                     "annotations": {"gpufleet.io/gpu-indices": str(i % 8)}},
        "spec": {"nodeName": node, "schedulerName": "default-scheduler", "restartPolicy": "Never",
                 "serviceAccountName": "default", "terminationGracePeriodSeconds": 30,
                 "containers": [{"name": "pytorch", "image": "localhost/gpufleet/pytorch:1",
                                 "command": ["torchrun", "--nproc-per-node=1", "train.py"],
                                 "env": [{"name": "MASTER_PORT", "value": "23456"}],
                                 "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi"},
                                               "requests": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi"}}}]},
        "status": {"phase": "Running", "hostIP": "10.0.0.1", "podIP": f"10.244.{i % 250}.{i % 200 + 2}",
                   "startTime": stamp, "qosClass": "Guaranteed",
                   "conditions": [{"type": t, "status": "True", "lastTransitionTime": stamp}
                                  for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
                   "containerStatuses": [{"name": "pytorch", "ready": True, "restartCount": 0, "started": True,
                                          "image": "localhost/gpufleet/pytorch:1", "imageID": "sha256:" + "0" * 64,
                                          "containerID": f"process://{i}",
                                          "state": {"running": {"startedAt": stamp}}}]},
    }


async def fill(db: Path, pods: int, nodes: int) -> float:
    store = SQLiteStore(f"sqlite:///{db}", synchronous="normal")
    await store.start()
    t0 = perf()
    try:
        for i in range(pods):
            await store.create("pods", "default", _pod(i, "")["metadata"]["name"], _pod(i, f"node-{i % nodes:05d}"))
            if (i + 1) % 5000 == 0:
                print(f"  stored {i + 1}/{pods} pods ({perf() - t0:.0f} s)", file=sys.stderr, flush=True)
    finally:
        await store.close()
    return perf() - t0


async def timed_get(client: Any, path: str, params: dict[str, str]) -> tuple[float, int]:
    t0 = perf()
    resp = await client.raw_request("GET", path, params=params)
    took = perf() - t0
    if resp.status != 200:
        raise RuntimeError(f"GET {path} {params}: {resp.status} {resp.body[:200]!r}")
    return took, len(resp.body)


async def run(args: argparse.Namespace, src: str | None = None) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-list-"))
    c = Cluster(root)
    c.env = source_env(src)
    c.server_args = ("--no-controllers",)
    try:
        (root / "server").mkdir()
        fill_s = await fill(root / "server" / "state.db", args.pods, args.nodes)
        c.start_server(timeout=180)
        client = c.client()
        try:
            rng = random.Random(1)
            out: dict[str, Any] = {"src": src or "this tree", "pods": args.pods, "nodes": args.nodes, "fill_s": round(fill_s, 1),
                                   "loadavg_1m": round(os.getloadavg()[0], 2)}
            node_lat, label_lat, full_lat = [], [], []
            returned = set()
            for _ in range(args.repeats):
                node = f"node-{rng.randrange(args.nodes):05d}"
                took, _ = await timed_get(client, "/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})
                node_lat.append(took)
                resp = await client.raw_request("GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"})
                returned.add(len(json.loads(resp.body)["items"]))
            for _ in range(args.label_repeats):
                node = f"node-{rng.randrange(args.nodes):05d}"
                took, _ = await timed_get(client, "/api/v1/pods", {"labelSelector": f"bench-node={node}"})
                label_lat.append(took)
            size = 0
            assert c.server is not None
            server_proc, me = psutil.Process(c.server.pid), psutil.Process()
            cpu = lambda p: sum(p.cpu_times()[:2])  # noqa: E731
            server_cpu, client_cpu = [], []
            for _ in range(args.full_repeats):
                s0, m0 = cpu(server_proc), cpu(me)
                took, size = await timed_get(client, "/api/v1/pods", {})
                full_lat.append(took)
                server_cpu.append(cpu(server_proc) - s0)
                client_cpu.append(cpu(me) - m0)
            ms = lambda v: round(1000 * v, 2)  # noqa: E731
            out["node_scoped"] = {"n": len(node_lat), "items": sorted(returned), "p50_ms": ms(pct(node_lat, 50)),
                                  "p99_ms": ms(pct(node_lat, 99))}
            out["label_scan"] = {"n": len(label_lat), "p50_ms": ms(pct(label_lat, 50)), "p99_ms": ms(pct(label_lat, 99))}
            rest = full_lat[1:] or full_lat
            out["full_list"] = {"n": len(full_lat), "first_ms": ms(full_lat[0]), "p50_ms": ms(pct(rest, 50)),
                                "max_ms": ms(max(rest)), "mib": round(size / 2**20, 1),
                                "server_cpu_ms": ms(pct(server_cpu[1:] or server_cpu, 50)),
                                "client_cpu_ms": ms(pct(client_cpu[1:] or client_cpu, 50))}
            out["server_rss_mib"] = round(psutil.Process(c.server.pid).memory_info().rss / 2**20)
            out["index_speedup"] = round(pct(label_lat, 50) / pct(node_lat, 50), 1)
            return out
        finally:
            await client.close()
    finally:
        c.close()
        shutil.rmtree(root, ignore_errors=True)


def render(r: dict[str, Any]) -> str:
    return "\n".join([
        f"{r['src']}: {r['pods']} pods on {r['nodes']} nodes (stored in {r['fill_s']} s; load average {r['loadavg_1m']})",
        f"node-scoped list (fieldSelector spec.nodeName, indexed): p50 {r['node_scoped']['p50_ms']} ms, "
        f"p99 {r['node_scoped']['p99_ms']} ms, {r['node_scoped']['items']} pods each",
        f"same pods by label (every pod read):                 p50 {r['label_scan']['p50_ms']} ms, "
        f"p99 {r['label_scan']['p99_ms']} ms  -> the index is {r['index_speedup']}x faster",
        f"full list: first {r['full_list']['first_ms']} ms, then p50 {r['full_list']['p50_ms']} ms, "
        f"max {r['full_list']['max_ms']} ms, {r['full_list']['mib']} MiB; CPU p50 server "
        f"{r['full_list']['server_cpu_ms']} ms, client {r['full_list']['client_cpu_ms']} ms",
        f"server RSS after the lists: {r['server_rss_mib']} MiB",
    ])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=50_000)
    p.add_argument("--nodes", type=int, default=5_000)
    p.add_argument("--repeats", type=int, default=30, help="node-scoped lists")
    p.add_argument("--label-repeats", type=int, default=5, help="label-selected lists")
    p.add_argument("--full-repeats", type=int, default=6, help="full lists (the first makes the list cache)")
    p.add_argument("--compare-src", help="also run it with the server of this source tree, after")
    p.add_argument("--json", type=Path, help="also write the figures here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rs = [asyncio.run(run(args))]
    print(render(rs[0]), flush=True)
    if args.compare_src:
        rs.append(asyncio.run(run(args, args.compare_src)))
        print(render(rs[1]))
        a, b = rs[0]["full_list"]["p50_ms"], rs[1]["full_list"]["p50_ms"]
        print(f"full list after the first: {b} ms -> {a} ms ({b / a:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps(rs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
