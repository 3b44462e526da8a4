"""Settle benchmark: a control plane starting on a store that already holds a large fleet.

    .venv/bin/python bench/settle_bench.py [--pods 20000] [--nodes 2000] [--window 120] [--compare-src DIR]

The store (SQLite, as `gpufleet server` makes it) is filled first with --nodes Ready Nodes of 8
GPUs and --pods Running pods bound evenly to them (bench/list_bench.py's pods, ~2 KB of JSON
each). Then a real `gpufleet server` starts on it with the scheduler and the controllers on,
as after a restart or a failover: every informer lists every pod and node at once. For
--window seconds from the moment the API answers, every second:
- GET /readyz, timed: how long the one event loop was held (the longest wait is printed);
- the component Leases in kube-system (gpufleet-scheduler, gpufleet-controller-manager):
  holder and leaseTransitions;
then the server's log is searched for "lost leadership". Printed: leadership losses, Lease
transitions after the first acquisition, the longest and p99 /readyz wait, the server's RSS
at the end and its peak. --compare-src DIR runs the same after this tree's run with the
server of another source tree (ratios are meaningful only within one run of this script).
The nodes send no heartbeats: node lifecycle marks them NotReady after its grace period,
which is part of the load. Figures are printed, never asserted. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
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
    from .list_bench import fill as fill_pods
else:
    from cluster_bench import Cluster, pct, source_env
    from list_bench import fill as fill_pods

perf = time.perf_counter
LEASES = ("gpufleet-scheduler", "gpufleet-controller-manager")


def _node(name: str) -> dict[str, Any]:
    stamp = "2026-12-01T10:00:00Z"
    res = {"cpu": "64", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"10000000-0000-4000-8000-{int(name.split('-')[1]):012d}",
                     "creationTimestamp": stamp, "labels": {"kubernetes.io/hostname": name,
                                                            "nvidia.com/gpu.product": "H100-SXM-80GB"}},
        "spec": {},
        "status": {"capacity": res, "allocatable": res,
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}],
                   "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]},
    }


async def fill(db: Path, pods: int, nodes: int) -> float:
    """The Nodes, then list_bench's pods bound evenly to them."""
    store = SQLiteStore(f"sqlite:///{db}", synchronous="normal")
    await store.start()
    t0 = perf()
    try:
        for n in range(nodes):
            name = f"node-{n:05d}"
            await store.create("nodes", "", name, _node(name))
    finally:
        await store.close()
    return perf() - t0 + await fill_pods(db, pods, nodes)


async def observe(c: Cluster, window: float) -> dict[str, Any]:
    client = c.client()
    proc = psutil.Process(c.server.pid) if c.server else None
    waits: list[float] = []
    transitions: dict[str, set[int]] = {name: set() for name in LEASES}
    holders: dict[str, set[str]] = {name: set() for name in LEASES}
    peak = 0
    t0 = perf()
    try:
        while perf() - t0 < window:
            tick = perf()
            t = perf()
            try:
                await client.raw_request("GET", "/readyz", raise_for_status=False)
            except Exception:  # a request that failed waited as long as it took
                pass
            waits.append(perf() - t)
            for name in LEASES:
                try:
                    lease = await client.get("leases", name, "kube-system", raw=True)
                except Exception:
                    continue
                spec = lease.get("spec") or {}
                transitions[name].add(int(spec.get("leaseTransitions") or 0))
                if spec.get("holderIdentity"):
                    holders[name].add(spec["holderIdentity"])
            if proc is not None:
                peak = max(peak, proc.memory_info().rss)
            await asyncio.sleep(max(0.0, 1.0 - (perf() - tick)))
        rss = proc.memory_info().rss if proc is not None else 0
    finally:
        await client.close()
    log = (c.root / "server" / "server.log").read_text(errors="replace")
    ms = lambda v: round(1000 * v, 1)  # noqa: E731
    return {
        "lost_leadership": len(re.findall(r"lost leadership", log)),
        "lease_transitions": {n: (max(v) - min(v)) if v else None for n, v in transitions.items()},
        "holders": {n: len(v) for n, v in holders.items()},
        "readyz_max_ms": ms(max(waits)) if waits else None,
        "readyz_p99_ms": ms(pct(waits, 99)) if waits else None,
        "readyz_p50_ms": ms(pct(waits, 50)) if waits else None,
        "probes": len(waits),
        "rss_mib": round(rss / 2**20), "rss_peak_mib": round(max(peak, rss) / 2**20),
    }


async def run(args: argparse.Namespace, src: str | None) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-settle-"))
    c = Cluster(root)
    c.env = source_env(src)
    try:
        (root / "server").mkdir()
        fill_s = await fill(root / "server" / "state.db", args.pods, args.nodes)
        t0 = perf()
        c.start_server(timeout=300)
        started = perf() - t0
        out = await observe(c, args.window)
        out.update({"src": src or "this tree", "pods": args.pods, "nodes": args.nodes, "fill_s": round(fill_s, 1),
                    "api_up_s": round(started, 1), "window_s": args.window,
                    "loadavg_1m": round(os.getloadavg()[0], 2)})
        return out
    finally:
        c.close()
        if args.keep_log:
            shutil.copy(root / "server" / "server.log", args.keep_log)
        shutil.rmtree(root, ignore_errors=True)


def render(rs: list[dict[str, Any]]) -> str:
    lines = ["| code | pods / nodes | leadership lost | Lease transitions (scheduler, controller manager) | "
             "/readyz p50 / p99 / max | RSS end / peak | load avg |", "|---|---|---|---|---|---|---|"]
    for r in rs:
        tr = r["lease_transitions"]
        lines.append(f"| {r['src']} | {r['pods']:,} / {r['nodes']:,} | {r['lost_leadership']} | "
                     f"{tr['gpufleet-scheduler']}, {tr['gpufleet-controller-manager']} | "
                     f"{r['readyz_p50_ms']} / {r['readyz_p99_ms']} / {r['readyz_max_ms']} ms | "
                     f"{r['rss_mib']} / {r['rss_peak_mib']} MiB | {r['loadavg_1m']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=20000)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--window", type=float, default=120, help="seconds observed from the API's first answer")
    p.add_argument("--compare-src", help="also run it with the server of this source tree, after")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--keep-log", type=Path, help="copy the server's log here (with PYTHONASYNCIODEBUG=1 in the "
                   "environment it names every step that held the event loop over 100 ms)")
    args = p.parse_args(argv)
    results = [asyncio.run(run(args, None))]
    if args.compare_src:
        results.append(asyncio.run(run(args, args.compare_src)))
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
