"""What one cached Pod costs in memory: a typed model (gpufleet.api.k8s.Pod, what the
scheduler's and the controllers' informers keep) against its JSON and the decoded dict.

    .venv/bin/python bench/pod_memory_bench.py [--pods 2000]

The pods are bench/list_bench.py's (about 1.5 KB of JSON each: labels, annotations, one
container with resources, a Running status with conditions). Each form is made --pods times
and measured with tracemalloc (the memory still held once they exist, divided by --pods);
the typed model's allocations are also counted. Figures are printed, never asserted. See
bench/README.md and docs/scale.md.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from typing import Any

import orjson

from gpufleet.api import k8s

if __package__:
    from .list_bench import _pod
else:
    from list_bench import _pod


def held(make: Any, n: int) -> tuple[float, int]:
    """(KiB held per object, allocations per object) of ``[make(i) for i in range(n)]``."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    made = [make(i) for i in range(n)]
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    diff = after.compare_to(before, "filename")
    size = sum(d.size_diff for d in diff)
    count = sum(d.count_diff for d in diff)
    del made
    return size / n / 1024, round(count / n)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=2000)
    args = p.parse_args(argv)
    bodies = [_pod(i, f"node-{i % 100:05d}") for i in range(args.pods)]
    texts = [orjson.dumps(b) for b in bodies]
    rows = [
        ("JSON bytes as orjson.dumps leaves them", lambda i: orjson.dumps(bodies[i])),
        ("JSON bytes copied to their length (the list cache's form)",
         lambda i: memoryview(orjson.dumps(bodies[i])).tobytes()),
        ("decoded dict (orjson)", lambda i: orjson.loads(texts[i])),
        ("typed model (k8s.Pod)", lambda i: k8s.Pod.model_validate(orjson.loads(texts[i]))),
    ]
    print(f"{args.pods} pods of {sum(map(len, texts)) / args.pods:.0f} bytes of JSON each")
    print("| form | KiB per pod | allocations per pod |")
    print("|---|---|---|")
    for label, make in rows:
        kib, count = held(make, args.pods)
        print(f"| {label} | {kib:.1f} | {count} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
