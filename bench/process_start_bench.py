"""Container start latency of the process runtime: from calling start() to the program
running (its first own instruction: it prints the time, read back from its CRI log), and
how long start() itself takes to return.

    PYTHONPATH=$PWD .venv/bin/python bench/process_start_bench.py             # 30 starts per case
    PYTHONPATH=$PWD .venv/bin/python bench/process_start_bench.py --runs 50 --json /tmp/start.json

Cases: a container without a pod sandbox (what an agent that does not call run_sandbox
gets), one in a pod sandbox (run_sandbox first: shared /dev/shm, the pod's /etc/hosts), and
one run as root in a user namespace (runAsUser 0, not privileged). Each container is
`sh -c 'date +%s%N; exec sleep 60'`, with the node's cgroups where writable.

To compare with a runtime without these (an older checkout), point PYTHONPATH at it: the
script uses only what both offer and names the cases it could not run.

The machine is shared and noisy: compare medians from runs made one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpufleet.agent.runtime.base import ContainerSpec, SecuritySpec
from gpufleet.agent.runtime.crilog import read_cri_messages
from gpufleet.agent.runtime.process import ProcessRuntime


def save(path: str, data: dict) -> None:
    Path(path).write_text(json.dumps(data, indent=1))


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


async def first_line(path: str, deadline_s: float = 30.0) -> str:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        msgs = read_cri_messages(path)
        if msgs:
            return msgs[0]
        await asyncio.sleep(0.002)
    raise TimeoutError(f"no output in {path}")


async def case(rt: ProcessRuntime, tmp: Path, name: str, runs: int, *, sandbox: bool, security) -> dict:
    running, returned = [], []
    handles = []
    for i in range(runs):
        uid = f"bench-{name}-{i}"
        handle = None
        if sandbox:
            from gpufleet.agent.runtime.base import SandboxSpec

            handle = await rt.run_sandbox(SandboxSpec(uid, f"p{i}", "default", f"p{i}", directory=""))
        kw = {"sandbox": handle} if sandbox else {}
        if security is not None:
            kw["security"] = security
        spec = ContainerSpec(uid, f"p{i}", "default", "main", "host", ["sh", "-c", "date +%s%N; exec sleep 60"], [],
                             {}, None, log_path=str(tmp / name / f"{i}.log"), **kw)
        t0 = time.time()
        h = await rt.start(spec)
        t1 = time.time()
        ran = int(await first_line(spec.log_path)) / 1e9
        running.append((ran - t0) * 1000)
        returned.append((t1 - t0) * 1000)
        handles.append((h, handle))
    for h, sb in handles:
        await rt.stop(h, 1)
        await rt.remove(h)
        if sb is not None:
            await rt.remove_sandbox(sb)
    return {
        "case": name,
        "runs": runs,
        "running_ms_p50": statistics.median(running),
        "running_ms_p90": pct(running, 0.9),
        "start_returned_ms_p50": statistics.median(returned),
        "start_returned_ms_p90": pct(returned, 0.9),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-start-bench-"))
    rt = ProcessRuntime(tmp / "state")
    new = hasattr(rt, "run_sandbox")
    results = []
    skipped = []
    cases = [("no-sandbox", False, None), ("pod-sandbox", True, None), ("root-in-userns", True, SecuritySpec(run_as_user=0))]
    for name, sandbox, security in cases:
        if (sandbox or security is not None) and not new:
            skipped.append(name)
            continue
        results.append(await case(rt, tmp, name, args.runs, sandbox=sandbox, security=security))
    stop_all = getattr(rt, "stop_all", None)
    if stop_all is not None:
        await stop_all(1)
    await rt.close()
    label = "sandboxed (bwrap + monitor)" if getattr(rt, "sandboxed", False) else "plain host processes"
    print(f"process runtime: {label}; {args.runs} starts per case; {os.cpu_count()} cpus")
    print(f"{'case':<16} {'running p50':>12} {'p90':>8} {'start() p50':>12} {'p90':>8}   (ms)")
    for r in results:
        print(f"{r['case']:<16} {r['running_ms_p50']:>12.1f} {r['running_ms_p90']:>8.1f} "
              f"{r['start_returned_ms_p50']:>12.1f} {r['start_returned_ms_p90']:>8.1f}")
    for name in skipped:
        print(f"{name:<16} (not offered by this runtime)")
    if args.json:
        save(args.json, {"sandboxed": label, "results": results})


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
