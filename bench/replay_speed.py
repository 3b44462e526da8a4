"""How far a trace replay gets in a fixed wall time, for this source tree and another, side by
side (each `gpufleet simulate -o json` in a process of its own, started together, both
interrupted with SIGINT after the same wall time, so both had the same machine):

    .venv/bin/python bench/replay_speed.py ../shared/traces/philly-muri/trace2.csv \\
        [--policy attained-service] [--seconds 600] [--limit N] [--compare-src DIR]

Prints, per tree: jobs finished, preemptions, virtual seconds replayed and CPU seconds used;
with --compare-src, the ratios of this tree to the other. Both replay the same trace from its
start with the same seed, so the one that got further did the same work in less time: the
ratio of jobs finished plus preemptions made (the runs each replayed) is the speed-up. A
replay that finishes before the time is up reports its whole wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def virtual(r: dict) -> float:
    """Virtual seconds replayed: to the interruption, or to the last job's end."""
    return r.get("virtualSecondsReplayed", r.get("makespanSeconds", 0.0))


def start(src: Path, args: argparse.Namespace) -> subprocess.Popen:
    cmd = [sys.executable, "-c", "import sys; from gpufleet.cli.main import main; sys.argv[0] = 'gpufleet'; main()",
           "simulate", "--trace", str(Path(args.trace).resolve()), "--nodes", args.nodes, "--policy", args.policy,
           "-o", "json"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.Popen(cmd, cwd=src, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--policy", default="attained-service")
    p.add_argument("--nodes", default="8x8")
    p.add_argument("--limit", type=int, default=0, help="the first N jobs only")
    p.add_argument("--seconds", type=float, default=600.0, help="wall time given to each replay")
    p.add_argument("--compare-src", help="also replay with this source tree, at the same time")
    args = p.parse_args()

    trees = {"this tree": HERE}
    if args.compare_src:
        trees["other tree"] = Path(args.compare_src).resolve()
    procs = {name: start(src, args) for name, src in trees.items()}
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.seconds and any(pr.poll() is None for pr in procs.values()):
        time.sleep(1.0)
    for pr in procs.values():
        if pr.poll() is None:
            pr.send_signal(signal.SIGINT)
    results = {}
    for name, pr in procs.items():
        out, _ = pr.communicate()
        try:
            results[name] = json.loads(out)
        except json.JSONDecodeError:
            sys.exit(f"{name}: the replay printed no figures (exit {pr.returncode})")
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"{args.trace}, {args.policy}, {args.nodes}, {args.seconds:.0f} s each "
          f"(both together: {cpu.ru_utime + cpu.ru_stime:.0f} s of CPU)")
    print(f"{'':12} {'finished':>9} {'preemptions':>12} {'virtual s':>12} {'wall s':>8} {'interrupted':>12}")
    for name, r in results.items():
        print(f"{name:12} {r['finished']:>9} {r['preemptions']:>12} {virtual(r):>12.0f} "
              f"{r['wallSeconds']:>8.1f} {str(r.get('interrupted', False)):>12}")
    if len(results) == 2:
        a, b = results["this tree"], results["other tree"]
        runs_a, runs_b = a["finished"] + a["preemptions"], b["finished"] + b["preemptions"]
        va, vb = virtual(a), virtual(b)
        print(f"this tree / other tree: runs (finished + preempted) per wall second "
              f"{(runs_a / a['wallSeconds']) / max(runs_b / b['wallSeconds'], 1e-9):.2f}x, "
              f"virtual time replayed {va / max(vb, 1e-9):.2f}x")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
