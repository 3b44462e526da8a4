"""What a gang costs the store while its members arrive: every write from the PodGroup's
creation until all members are bound, by resource and type, for gangs of N members created
one by one (as a controller does), against an in-process control plane (SQLite) and the real
scheduler, on 8 Node objects of 8 GPUs (no agents).

    .venv/bin/python bench/gang_writes_bench.py                  # gangs of 16 and 64
    .venv/bin/python bench/gang_writes_bench.py --sizes 8,32,64

Counts, not times: they do not depend on the machine. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from gpufleet.cli.controlplane import ControlPlane
from gpufleet.scheduler import Scheduler

GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


def node(name: str, gpus: int = 8) -> dict[str, Any]:
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": dict(allocatable), "allocatable": allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def member(name: str) -> dict[str, Any]:
    resources = {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {GROUP_LABEL: "gang"}},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": resources}]}}


async def one(size: int) -> Counter[tuple[str, str]]:
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-gangwrites-"))
    cp = ControlPlane(store_url=f"sqlite:///{tmp / 'db'}", port=0, state_dir=tmp, run_controllers=False,
                      kubernetes_service=False)
    await cp.start()
    assert cp.client is not None and cp.store is not None
    scheduler = Scheduler(cp.client, flush_interval=0.2)
    await scheduler.start(sync_timeout=10)
    try:
        for i in range(8):
            await cp.client.create(node(f"n{i}"), raw=True)
        await cp.client.create({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                                "metadata": {"name": "gang", "namespace": "default"},
                                "spec": {"minMember": size}}, raw=True)
        start = await cp.store.revision()
        for i in range(size):
            await cp.client.create(member(f"m-{i:03d}"), raw=True)
            await asyncio.sleep(0.02)  # one by one, the scheduler seeing each
        for _ in range(600):
            pods = await cp.client.list("pods", "default", raw=True)
            if len(pods) == size and all(p["spec"].get("nodeName") for p in pods):
                break
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"the gang of {size} was not bound within 60 s")
        await scheduler.wait_idle()
        events = await cp.store.history(None, None, start, await cp.store.revision())
        counts: Counter[tuple[str, str]] = Counter((e.resource, e.type) for e in events)
        counts[("events", "FailedScheduling")] = sum(
            1 for e in events if e.resource == "events" and e.object.get("reason") == "FailedScheduling")
        return counts
    finally:
        await scheduler.stop()
        await cp.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16,64", help="comma-separated gang sizes")
    args = p.parse_args(argv)
    print("| members | all writes | pods created | pods modified | Events created | of which FailedScheduling |")
    print("|---|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        c = asyncio.run(one(size))
        total = sum(v for k, v in c.items() if k[1] != "FailedScheduling")
        print(f"| {size} | {total} | {c[('pods', 'ADDED')]} | {c[('pods', 'MODIFIED')]} "
              f"| {c[('events', 'ADDED')]} | {c[('events', 'FailedScheduling')]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
