"""End-to-end scheduling throughput through the API: pods bound per second on a large fleet.

    .venv/bin/python bench/sched_throughput_bench.py [--nodes 5000] [--pods 5000] [--compare-src DIR]

What kube-scheduler's scheduler_perf measures with a real API server (SchedulingBasic: 5,000
nodes, pods with small requests, the scheduler's binds counted by a watch), in two phases:

1. **backlog**: a real `gpufleet server --components apiserver` on a store that already holds
   --nodes Ready Nodes (8 GPUs, 64 cores each; no heartbeats, and no node lifecycle controller
   to mark them NotReady, as in scheduler_perf); --pods pending pods are created through the
   API (--gpu-share of them asking for 1 GPU, the rest 100m cpu and 128Mi); then a scheduler
   starts in a process of its own (`gpufleet server --components scheduler`, over HTTP as a
   separate kube-scheduler would) and binds the backlog. Printed: pods/s from its first bind to
   its last (the scheduler's steady rate) and from the process's start (with its initial lists).
2. **stream**: one `gpufleet server` with the API server and scheduler in one process (as
   `gpufleet up` runs them, controllers off) on the same fleet; the benchmark creates --pods pods
   as fast as --concurrency parallel creates go and a watch counts the binds. Printed: pods/s
   from the first create to the last bind, and the create rate the API took meanwhile.

Both phases count a pod as scheduled when a watch on pods sees its spec.nodeName set. The
benchmark's own client runs on the same cores (2 on the development machine), as
scheduler_perf's does. For scale: the floor kube-scheduler's CI holds at 5,000 nodes is
680-810 pods/s (compiled Go, every core); issue 13 aims at 2,000 pods/s.
--compare-src DIR runs both phases again with another source tree's gpufleet, after this
tree's (ratios are meaningful only within one run). Figures are printed, never asserted.
See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from gpufleet.store.sqlite import SQLiteStore

if __package__:
    from ._pg import die_with_parent
    from .cluster_bench import Cluster, source_env
    from .settle_bench import _node
else:
    from _pg import die_with_parent
    from cluster_bench import Cluster, source_env
    from settle_bench import _node

perf = time.perf_counter


def pending_pod(i: int, gpu: bool) -> dict[str, Any]:
    requests = {"nvidia.com/gpu": "1", "cpu": "1", "memory": "1Gi"} if gpu else {"cpu": "100m", "memory": "128Mi"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"bench-{i:06d}", "namespace": "default", "labels": {"app": "bench"}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "busybox", "command": ["sleep", "3600"],
                "resources": {"requests": requests, "limits": dict(requests) if gpu else {}}}]}}


async def fill_nodes(db: Path, nodes: int) -> None:
    store = SQLiteStore(f"sqlite:///{db}", synchronous="normal")
    await store.start()
    try:
        for n in range(nodes):
            name = f"node-{n:05d}"
            await store.create("nodes", "", name, _node(name))
    finally:
        await store.close()


class BindCounter:
    """A watch on pods from the current resourceVersion: when each pod was first seen bound."""

    def __init__(self, client: Any, resource_version: str) -> None:
        self.client = client
        self.rv = resource_version
        self.bound: dict[str, float] = {}
        self.done = asyncio.Event()
        self.want = 0
        self.task: asyncio.Task[None] | None = None

    def start(self, want: int) -> None:
        self.want = want
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        rv = self.rv
        while True:
            try:
                async for ev in self.client.watch("pods", "default", resource_version=rv, raw=True,
                                                  timeout_seconds=600):
                    obj = ev.object
                    meta = obj.get("metadata") or {}
                    rv = meta.get("resourceVersion") or rv
                    if ev.type == "BOOKMARK":
                        continue
                    name = meta.get("name")
                    if (obj.get("spec") or {}).get("nodeName") and name not in self.bound:
                        self.bound[name] = perf()
                        if len(self.bound) >= self.want:
                            self.done.set()
                            return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broken watch resumes from the last version seen
                print(f"  watch broke ({exc}); resuming", file=sys.stderr, flush=True)
                await asyncio.sleep(0.2)

    async def wait(self, seconds: float) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await self.done.wait()
            return True
        except TimeoutError:
            return False
        finally:
            if self.task is not None:
                self.task.cancel()


async def create_all(client: Any, pods: list[dict[str, Any]], concurrency: int) -> tuple[float, float]:
    """Create every pod with ``concurrency`` creates in flight; (first start, last answer)."""
    it = iter(pods)
    t0 = perf()

    async def worker() -> None:
        for pod in it:
            await client.create(pod)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return t0, perf()


async def list_rv(client: Any) -> str:
    resp = await client.raw_request("GET", "/api/v1/namespaces/default/pods", params={"limit": "1"})
    return str(json.loads(resp.body)["metadata"]["resourceVersion"])


def start_scheduler(cmd: list[str], log_path: Path, env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=die_with_parent)


def cpu_seconds(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return float("nan")


async def fleet(root: Path, src: str | None, components: str, nodes: int) -> Cluster:
    """A `gpufleet server --components ...` on a store already holding the Ready nodes."""
    c = Cluster(root)
    c.env = source_env(src)
    c.server_args = ("--components", components)
    (c.root / "server").mkdir(parents=True)
    await fill_nodes(c.root / "server" / "state.db", nodes)
    c.start_server(timeout=300)
    return c


async def backlog(args: argparse.Namespace, src: str | None, root: Path) -> dict[str, Any]:
    c = await fleet(root / "backlog", src, "apiserver", args.nodes)
    sched: subprocess.Popen[bytes] | None = None
    client = c.client()
    try:
        pods = [pending_pod(i, i < args.pods * args.gpu_share) for i in range(args.pods)]
        t0, t1 = await create_all(client, pods, args.concurrency)
        created_rate = args.pods / (t1 - t0)
        print(f"  backlog: {args.pods:,} pending pods created ({created_rate:,.0f}/s)", file=sys.stderr, flush=True)
        counter = BindCounter(client, await list_rv(client))
        counter.start(args.pods)
        cmd = [sys.executable, "-m", "gpufleet.cli.main", "server", "--components", "scheduler",
               "--kubeconfig", str(c.root / "server" / "kubeconfig"), "--state-dir", str(c.root / "scheduler")]
        api_cpu0 = cpu_seconds(c.server.pid) if c.server else float("nan")
        started = perf()
        sched = start_scheduler(cmd, c.root / "scheduler.log", c.env)
        finished = await counter.wait(args.timeout)
        times = sorted(counter.bound.values())
        out: dict[str, Any] = {"bound": len(times), "all_bound": finished, "create_rate": round(created_rate)}
        if len(times) >= 2:
            out["steady_pods_s"] = round((len(times) - 1) / (times[-1] - times[0]))
            out["from_start_pods_s"] = round(len(times) / (times[-1] - started))
            out["first_bind_s"] = round(times[0] - started, 2)
        out["scheduler_cpu_s"] = round(cpu_seconds(sched.pid), 1)
        out["apiserver_cpu_s"] = round(cpu_seconds(c.server.pid) - api_cpu0, 1) if c.server else None
        return out
    finally:
        await client.close()
        if sched is not None:
            sched.terminate()
            try:
                sched.wait(15)
            except subprocess.TimeoutExpired:
                sched.kill()
        c.close()


async def stream(args: argparse.Namespace, src: str | None, root: Path) -> dict[str, Any]:
    c = await fleet(root / "stream", src, "apiserver,scheduler", args.nodes)
    client = c.client()
    try:
        # The scheduler's informers list the fleet after the API answers: wait until it binds.
        probe = pending_pod(10**6 - 1, False)
        probe["metadata"]["name"] = "bench-probe"
        counter = BindCounter(client, await list_rv(client))
        counter.start(1)
        await client.create(probe)
        if not await counter.wait(300):
            raise RuntimeError("the scheduler bound nothing in 300 s")
        counter = BindCounter(client, await list_rv(client))
        counter.start(args.pods)
        cpu0 = cpu_seconds(c.server.pid) if c.server else float("nan")
        pods = [pending_pod(i, i < args.pods * args.gpu_share) for i in range(args.pods)]
        t0, t1 = await create_all(client, pods, args.concurrency)
        finished = await counter.wait(args.timeout)
        times = sorted(counter.bound.values())
        out: dict[str, Any] = {"bound": len(times), "all_bound": finished,
                               "create_rate": round(args.pods / (t1 - t0))}
        if times:
            out["pods_s"] = round(len(times) / (times[-1] - t0))
            out["last_bind_after_last_create_s"] = round(times[-1] - t1, 2)
        out["server_cpu_s"] = round(cpu_seconds(c.server.pid) - cpu0, 1) if c.server else None
        return out
    finally:
        await client.close()
        c.close()


async def run(args: argparse.Namespace, src: str | None) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-schedtp-"))
    try:
        label = src or "this tree"
        out: dict[str, Any] = {"src": label, "backlog": {}, "stream": {}}
        for phase, fn in (("backlog", backlog), ("stream", stream)):
            if phase in args.phases:
                print(f"{label}: {phase} phase ...", file=sys.stderr, flush=True)
                out[phase] = await fn(args, src, root)
        out["loadavg_1m"] = round(os.getloadavg()[0], 2)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def render(args: argparse.Namespace, rs: list[dict[str, Any]]) -> str:
    lines = [f"End-to-end scheduling through the API: {args.nodes:,} nodes, {args.pods:,} pods "
             f"({args.gpu_share:.0%} with 1 GPU), {args.concurrency} creates in flight",
             "| code | backlog: pods/s first to last bind | from scheduler start | first bind after | "
             "scheduler / API CPU | stream: pods/s create to bind | creates/s | last bind after last create | "
             "server CPU | load avg |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        b, s = r["backlog"], r["stream"]
        lines.append(f"| {r['src']} | {b.get('steady_pods_s')} | {b.get('from_start_pods_s')} | "
                     f"{b.get('first_bind_s')} s | {b.get('scheduler_cpu_s')} / {b.get('apiserver_cpu_s')} s | "
                     f"{s.get('pods_s')} | {s.get('create_rate')} | {s.get('last_bind_after_last_create_s')} s | "
                     f"{s.get('server_cpu_s')} s | {r['loadavg_1m']} |")
        for phase in ("backlog", "stream"):
            if r[phase] and not r[phase]["all_bound"]:
                lines.append(f"  {r['src']} {phase}: only {r[phase]['bound']:,} of {args.pods:,} bound "
                             f"within {args.timeout:.0f} s")
    if len(rs) == 2:
        for key, phase, what in (("steady_pods_s", "backlog", "backlog"), ("pods_s", "stream", "stream")):
            a, b = rs[0][phase].get(key), rs[1][phase].get(key)
            if a and b:
                lines.append(f"this tree / other, {what} pods/s: {a / b:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods", type=int, default=5000)
    p.add_argument("--gpu-share", type=float, default=0.5, help="share of the pods asking for 1 GPU")
    p.add_argument("--concurrency", type=int, default=8, help="creates in flight")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for every bind, per phase")
    p.add_argument("--phases", default="backlog,stream", type=lambda v: set(v.split(",")),
                   help="which phases to run, comma-separated: backlog, stream")
    p.add_argument("--compare-src", help="also run it with another source tree's gpufleet, after")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    results = [asyncio.run(run(args, None))]
    if args.compare_src:
        results.append(asyncio.run(run(args, args.compare_src)))
    print(render(args, results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
