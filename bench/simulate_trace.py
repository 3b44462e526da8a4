"""Replay a trace prefix through `gpufleet simulate`'s engine and print its figures with the
CPU time it took (what docs/simulate.md quotes).

    PYTHONPATH=. python bench/simulate_trace.py TRACE LIMIT POLICY RESTART_OVERHEAD

LIMIT 0 replays the whole trace. Progress every 25 finished jobs, then one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time

from gpufleet.cli.simulate.engine import simulate
from gpufleet.cli.simulate.trace import read_trace


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    trace, limit, policy, overhead = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    jobs = read_trace(trace, limit if limit > 0 else None)
    cpu0, wall0 = time.process_time(), time.perf_counter()

    def progress(done: int, total: int, now: float) -> None:
        if done % 25 == 0 or done == total:
            print(f"{done}/{total} virtual day {now / 86400:.1f} wall {time.perf_counter() - wall0:.0f}s "
                  f"cpu {time.process_time() - cpu0:.0f}s", flush=True)

    result = asyncio.run(simulate(jobs, nodes=8, gpus_per_node=8, policy=policy, restart_overhead=overhead,
                                  progress=progress))
    figures = result.figures()
    figures["cpuSeconds"] = time.process_time() - cpu0
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
