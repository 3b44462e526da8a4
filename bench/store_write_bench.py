"""Store write throughput under concurrency: what group commit buys.

    .venv/bin/python bench/store_write_bench.py [--writers 1,8,64] [--duration 5] [--synchronous full]
    .venv/bin/python bench/store_write_bench.py --compare-src /path/to/other/tree

The embedded SQLite store in one process, as the API server holds it: W writer tasks on one
event loop, each updating its own object (a Lease-sized JSON) as fast as its previous write
is answered, for --duration seconds. Printed per W: writes/s, write transactions committed
per second (the fsyncs, with synchronous=FULL), and p50/p99 of one write's latency. With
--compare-src, each round also runs the same in a second process whose PYTHONPATH is the
other source tree (say, a `git archive` of the code before a change), rounds interleaved,
and prints the ratio. Figures are printed, never asserted. See docs/scale.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _lease(name: str, n: int) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease", "labels": {"n": str(n)}},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                     "renewTime": f"2026-12-03T11:00:{n % 60:02d}.000000Z"}}


async def _run(writers: int, duration: float, synchronous: str) -> dict[str, Any]:
    from gpufleet.store.base import open_store

    with tempfile.TemporaryDirectory(prefix="gpufleet-store-bench-") as tmp:
        store = open_store(f"sqlite:///{tmp}/bench.db", synchronous=synchronous, housekeeping_interval=None)
        await store.start()
        try:
            for i in range(writers):
                await store.create("leases", "kube-node-lease", f"node-{i}", _lease(f"node-{i}", 0))
            lat: list[float] = []
            stop = time.perf_counter() + duration
            commits0 = getattr(store, "commits", None)

            async def writer(i: int) -> None:
                n = 0
                while time.perf_counter() < stop:
                    n += 1
                    t0 = time.perf_counter()
                    await store.update("leases", "kube-node-lease", f"node-{i}", _lease(f"node-{i}", n))
                    lat.append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            await asyncio.gather(*[writer(i) for i in range(writers)])
            elapsed = time.perf_counter() - t0
            commits = getattr(store, "commits", None)
        finally:
            await store.close()
    lat.sort()
    return {"writers": writers, "writes_per_s": len(lat) / elapsed,
            "commits_per_s": (commits - commits0) / elapsed if commits is not None and commits0 is not None
            else len(lat) / elapsed,  # a store without the counter commits once per write
            "p50_ms": statistics.median(lat) * 1e3, "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1e3}


def _in_tree(src: str, writers: int, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=src)
    out = subprocess.run(
        [sys.executable, __file__, "--one", str(writers), "--duration", str(args.duration),
         "--synchronous", args.synchronous], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", default="1,8,64", help="comma-separated numbers of concurrent writers")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    ap.add_argument("--synchronous", default="full", help="SQLite synchronous: full (the default) or normal")
    ap.add_argument("--compare-src", help="another source tree to run the same rounds on, interleaved")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(asyncio.run(_run(args.one, args.duration, args.synchronous))))
        return
    here = str(Path(__file__).resolve().parent.parent)
    trees = [("this tree", here)] + ([("compared", args.compare_src)] if args.compare_src else [])
    print(f"store write bench: SQLite, synchronous={args.synchronous}, {args.duration:g} s per measurement, "
          f"load average {os.getloadavg()[0]:.2f}")
    for w in [int(x) for x in args.writers.split(",")]:
        rows = [(label, _in_tree(src, w, args)) for label, src in trees]
        for label, r in rows:
            print(f"  writers={w:<4} {label:<10} {r['writes_per_s']:9.0f} writes/s  {r['commits_per_s']:8.0f} "
                  f"commits/s  p50={r['p50_ms']:7.2f} ms  p99={r['p99_ms']:7.2f} ms")
        if len(rows) == 2:
            print(f"  writers={w:<4} ratio      {rows[0][1]['writes_per_s'] / rows[1][1]['writes_per_s']:.2f}x writes/s")


if __name__ == "__main__":
    main()
