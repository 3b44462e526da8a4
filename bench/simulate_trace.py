"""Replay a trace prefix through `gpufleet simulate`'s engine and print its figures with the
CPU time it took (what docs/simulate.md quotes).

    PYTHONPATH=. python bench/simulate_trace.py TRACE LIMIT POLICY RESTART_OVERHEAD

LIMIT 0 replays the whole trace. Progress every 25 finished jobs (and every 30 s), then one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time

from gpufleet.cli.simulate.engine import Progress, simulate
from gpufleet.cli.simulate.trace import read_trace


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    trace, limit, policy, overhead = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    jobs = read_trace(trace, limit if limit > 0 else None)
    cpu0, wall0 = time.process_time(), time.perf_counter()

    last = [0.0]

    def progress(p: Progress) -> None:
        wall = time.perf_counter() - wall0
        if p.done % 25 == 0 or p.done == p.total or wall - last[0] >= 30:
            last[0] = wall
            print(f"{p.done}/{p.total} virtual day {p.now / 86400:.1f} running {p.running} "
                  f"waiting {p.submitted - p.done - p.running} preemptions {p.preemptions} "
                  f"wall {wall:.0f}s cpu {time.process_time() - cpu0:.0f}s", flush=True)

    result = asyncio.run(simulate(jobs, nodes=8, gpus_per_node=8, policy=policy, restart_overhead=overhead,
                                  progress=progress))
    figures = result.figures()
    figures["cpuSeconds"] = time.process_time() - cpu0
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
