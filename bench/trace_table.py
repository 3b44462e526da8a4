"""Replay a trace under several policies with `gpufleet simulate` and print one table, each
average JCT next to the published figure it is compared with (docs/simulate.md).

    .venv/bin/python bench/trace_table.py ../shared/traces/philly-muri/trace1.csv
    .venv/bin/python bench/trace_table.py TRACE --run fifo --run attained-service:60 \\
        --run attained-service:0:3250,7200 --limit 300 --jobs 2 --json /tmp/table.json

A run is POLICY[:RESTART_OVERHEAD[:LEVELS]]. Each is the real command (`gpufleet simulate
-o json`) in its own process; ``--jobs`` of them at a time (each takes one core). The
published averages are those of the Philly traces as published with the Muri simulator
(../shared/traces/README.md, simulator/draw_fig9-10.py), 64 GPUs (8 x 8), no restart
overhead; they compare only with a replay of the whole trace (no ``--limit``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Published average JCTs in seconds, by trace file and scheduler.
PUBLISHED = {
    "trace1.csv": {"SRTF": 1_370_603, "SRSF": 980_141, "Tiresias 2D-LAS": 3_330_371, "Themis": 1_823_179},
    "trace2.csv": {"SRTF": 2_665_607, "SRSF": 2_213_950, "Tiresias 2D-LAS": 7_396_369, "Themis": 4_628_172},
}
TIRESIAS_LEVELS = "3250,7200"
# What each run is compared with, and the target of the comparison (published / ours).
COMPARED = {
    "shortest-remaining-service": ("SRSF", "within 1.15x of SRSF"),
    "attained-service": ("Tiresias 2D-LAS", "at least 1.7x lower than Tiresias"),
}
DEFAULT_RUNS = ["fifo", "shortest-remaining-service", f"attained-service:0:{TIRESIAS_LEVELS}",
                "attained-service", "attained-service:60"]


def parse_run(text: str) -> tuple[str, float, str | None]:
    policy, _, rest = text.partition(":")
    overhead, _, levels = rest.partition(":")
    return policy, float(overhead or 0), levels or None


def replay(trace: str, run: str, nodes: str, limit: int | None) -> dict:
    policy, overhead, levels = parse_run(run)
    cmd = [sys.executable, "-m", "gpufleet.cli.main", "simulate", "--trace", trace, "--nodes", nodes,
           "--policy", policy, "--restart-overhead", str(overhead), "-o", "json"]
    if levels:
        cmd += ["--attained-service-levels", levels]
    if limit:
        cmd += ["--limit", str(limit)]
    t0, started = time.perf_counter(), time.strftime("%H:%M:%S")
    print(f"{started} start {run}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    if proc.returncode != 0:
        raise SystemExit(f"{run}: gpufleet simulate failed:\n{proc.stderr[-2000:]}")
    figures = json.loads(proc.stdout)
    figures["run"] = run
    figures["processWallSeconds"] = time.perf_counter() - t0
    print(f"{time.strftime('%H:%M:%S')} done {run}: avg JCT {figures['avgJCTSeconds']:,.0f} s in "
          f"{figures['wallSeconds']:.0f} s", file=sys.stderr, flush=True)
    return figures


def comparison(trace: str, figures: dict, whole: bool) -> tuple[str, str, str]:
    """(published figure named, its value, ratio) for a run."""
    published = PUBLISHED.get(Path(trace).name)
    if figures["policy"] == "attained-service" and figures.get("attainedServiceLevels") == TIRESIAS_LEVELS:
        name = "Tiresias 2D-LAS"
    elif figures["policy"] in COMPARED:
        name = COMPARED[figures["policy"]][0]
    else:
        return "", "", ""
    if published is None or not whole or figures["avgJCTSeconds"] is None:
        return name, "", ""
    value = published[name]
    ratio = value / figures["avgJCTSeconds"]
    return name, f"{value:,}", f"{ratio:.2f}x {'lower' if ratio >= 1 else 'higher'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--run", action="append", help="POLICY[:RESTART_OVERHEAD[:LEVELS]]; repeatable")
    ap.add_argument("--nodes", default="8x8")
    ap.add_argument("--limit", type=int, default=None, help="only the first N jobs (not comparable)")
    ap.add_argument("--jobs", type=int, default=1, help="replays at a time (one core each)")
    ap.add_argument("--json", help="also write every run's figures here")
    args = ap.parse_args()
    runs = args.run or DEFAULT_RUNS
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda r: replay(args.trace, r, args.nodes, args.limit), runs))
    whole = args.limit is None
    print(f"\n{Path(args.trace).name}, {args.nodes}, {results[0]['jobs']} jobs"
          + ("" if whole else " (a prefix: not comparable with the published figures)"))
    print("\n| policy | levels (GPU-s) | restart overhead (s) | avg JCT (s) | p99 JCT (s) | makespan (s) | GPU util "
          "| preemptions | published | published avg JCT (s) | published / ours | replay wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for f in results:
        name, value, ratio = comparison(args.trace, f, whole)
        print(f"| {f['policy']} | {f.get('attainedServiceLevels', '')} | {f['restartOverheadSeconds']:g} "
              f"| {f['avgJCTSeconds']:,.0f} | {f['p99JCTSeconds']:,.0f} | {f['makespanSeconds']:,.0f} "
              f"| {f['gpuUtilization']:.3f} | {f['preemptions']:,} | {name} | {value} | {ratio} "
              f"| {f['wallSeconds']:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
