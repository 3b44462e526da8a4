"""Fleet benchmark: what a fleet of idle nodes costs the control plane.

    .venv/bin/python bench/fleet_bench.py [--nodes 1000] [--duration 45] [--pod-rate 20] [--compare-src DIR]

A real `gpufleet server` (SQLite, scheduler and controllers on) and N simulated nodes,
written over HTTP as `gpufleet agent` writes them: each node registers its Node (8 GPUs) and
its Lease in kube-node-lease, then renews the Lease every 2 s (a merge patch of
`spec.renewTime`) and writes its status every 30 s (a merge patch of .../status, heartbeat
times only), first writes spread over the period. Each node sends its heartbeats over a TLS
connection of its own, opened as it registers, as raw HTTP/1.1 (HeartbeatConnection): with
gpufleet's client the generator spent as much CPU per call as the server and was the first to
saturate a core, so what it measured was its own queue. Besides, pods are created at half --pod-rate and each deleted 5 s later (the other
half): bare pods with a small CPU request that the scheduler binds to the simulated nodes.

Printed after a warm-up (--warmup, 40 s: the backlog the registrations leave is worked off, and
every node has sent its first renewals): p50/p99/max of every
mutating call the nodes and the pod writer made, per kind; Lease renewals served per second
against those due (N / 2 s); and the server process's CPU% over the window (100% = one core)
and its CPU time per mutating call served (everything the server did, controllers included,
divided by the calls: the figure that holds up on a machine shared with other work, where a
starved server shows long latencies at a low CPU%), its RSS at the end, and how many nodes
the node lifecycle controller marked NotReady or Unknown (a renewal served too late).
The server gets --cluster-cidr (default 10.0.0.0/12, 4,096 node subnets) so every node has a
pod CIDR, as in a fleet sized for its nodes. --compare-src DIR runs the same load, after this
tree's run, against a `gpufleet server` from another source tree (its ratios are meaningful
only within one run of this script).
The load generator runs on the same machine and takes CPU of its own (printed; about a
quarter of a core at 500 nodes): compare figures measured on one machine. A server that cannot
keep up falls behind without bound; the run ends anyway, 5 s after the window, and what was
still unanswered is left out. Figures are printed, never asserted. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import psutil

from gpufleet.agent.node import LEASE_NAMESPACE, NodeSettings, new_lease, new_node, node_status, system_info
from gpufleet.client.errors import ApiError, TransportError
from gpufleet.utils.clock import rfc3339

if __package__:
    from .cluster_bench import Cluster, pct, source_env
    from .cluster_bench import _stop as stop_process
else:
    from cluster_bench import Cluster, pct, source_env
    from cluster_bench import _stop as stop_process

perf = time.perf_counter
LEASE_PERIOD = 2.0
STATUS_PERIOD = 30.0


_INFO = system_info("sim://1.0")


def _settings(name: str) -> NodeSettings:
    return NodeSettings(name=name, address="127.0.0.1", port=10250, cpus=64, memory_bytes=512 << 30,
                        runtime_version="sim://1.0", max_pods=110, ephemeral_storage_bytes=0, info=_INFO)


class _Gpu:
    health = "Healthy"


class HeartbeatConnection:
    """One simulated node's own keep-alive HTTPS connection, as an agent keeps its own, that
    sends the node's merge patches as raw HTTP/1.1 and reads each answer's status and body.
    The load generator shares the machine with the server: with gpufleet's client (httpx) it
    spent as much CPU per call as the server and saturated its core first, so the latencies
    were the generator's. Statuses other than 200 count as errors."""

    def __init__(self, host: str, port: int, ssl_ctx: ssl.SSLContext | None, token: str) -> None:
        self.host, self.port, self.ssl = host, port, ssl_ctx
        self.head = f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\nUser-Agent: gpufleet-agent/bench\r\n" \
            "Content-Type: application/merge-patch+json\r\nAccept: application/json\r\n"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    @classmethod
    def factory(cls, kubeconfig: Path) -> Any:
        from urllib.parse import urlsplit

        from gpufleet.client.kubeconfig import load_kubeconfig

        cfg = load_kubeconfig(kubeconfig)
        url = urlsplit(cfg.server)
        ctx = None
        if url.scheme == "https":
            ctx = ssl.create_default_context(cafile=cfg.ca_file,
                                             cadata=cfg.ca_data.decode() if cfg.ca_data else None)
        return lambda: cls(url.hostname or "127.0.0.1", url.port or 443, ctx, cfg.token or "")

    async def connect(self) -> HeartbeatConnection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, ssl=self.ssl)
        return self

    async def patch(self, path: str, body: dict[str, Any]) -> None:
        data = orjson.dumps(body)
        request = f"PATCH {path} HTTP/1.1\r\n{self.head}Content-Length: {len(data)}\r\n\r\n".encode() + data
        for attempt in (0, 1):
            try:
                if self.writer is None:
                    await self.connect()
                assert self.reader is not None and self.writer is not None
                self.writer.write(request)
                head = await self.reader.readuntil(b"\r\n\r\n")
                break
            except (OSError, asyncio.IncompleteReadError) as exc:
                self.close()  # the server closed an idle connection: once more on a new one
                if attempt:
                    raise TransportError(f"PATCH {path}: {type(exc).__name__}: {exc}") from None
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        answer = await self.reader.readexactly(length) if length else b""
        if status != 200:
            raise ApiError(status, answer.decode(errors="replace")[:200])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Load:
    def __init__(self, clients: list[Any], args: argparse.Namespace, connection: Any = None) -> None:
        # Each node's heartbeats go over a connection of its own (HeartbeatConnection).
        self.clients = clients
        self.client = clients[0]
        self.connection = connection
        self.args = args
        self.measuring = False
        self.lat: dict[str, list[float]] = {"lease": [], "node-status": [], "pod-create": [], "pod-delete": []}
        self.renewals = 0
        self.errors: dict[str, int] = {}

    async def timed(self, kind: str, call: Any) -> Any:
        t0 = perf()
        try:
            out = await call
        except (ApiError, TransportError) as exc:
            if self.measuring:
                key = f"{kind}: {type(exc).__name__}"
                self.errors[key] = self.errors.get(key, 0) + 1
            return None
        if self.measuring:
            self.lat[kind].append(perf() - t0)
            if kind == "lease":
                self.renewals += 1
        return out

    async def register(self, i: int) -> dict[str, Any]:
        name = f"sim-{i:04d}"
        settings = _settings(name)
        now = time.time()
        body = new_node(settings, [_Gpu()] * 8, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "", now)
        body["metadata"]["annotations"] = {}
        node = await self.client.create(body, raw=True)
        node = await self.client.patch("nodes", name, {"status": body["status"]}, subresource="status", raw=True)
        await self.client.create(new_lease(name, node["metadata"]["uid"], 40, now), raw=True)
        return node

    async def heartbeat(self, node: dict[str, Any], conn: HeartbeatConnection, stop: asyncio.Event) -> None:
        """As `gpufleet agent` writes them: merge patches of the Lease's spec and the status."""
        name = node["metadata"]["name"]
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}"
        status_path = f"/api/v1/nodes/{name}/status"
        settings = _settings(name)
        gpus = [_Gpu()] * 8
        status = node["status"]
        loop = asyncio.get_running_loop()
        start = loop.time()
        next_lease = start + random.uniform(0, LEASE_PERIOD)
        next_status = start + random.uniform(0, STATUS_PERIOD)
        while not stop.is_set():
            due = min(next_lease, next_status)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, due - loop.time()))
                return
            if loop.time() >= next_lease:
                next_lease += LEASE_PERIOD
                spec = {"spec": {"renewTime": rfc3339(time.time(), micro=True)}}
                await self.timed("lease", conn.patch(lease_path, spec))
            if loop.time() >= next_status:
                next_status += STATUS_PERIOD
                status = node_status(settings, gpus, status, time.time())
                await self.timed("node-status", conn.patch(status_path, {"status": status}))
        conn.close()

    async def pods(self, stop: asyncio.Event) -> None:
        rate = self.args.pod_rate / 2
        if rate <= 0:
            return
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[Any]] = set()
        n, t = 0, loop.time()

        async def one(name: str) -> None:
            body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "bench"}},
                    "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                             "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "60"],
                                             "resources": {"requests": {"cpu": "10m"}}}]}}
            if await self.timed("pod-create", self.client.create(body, "default", raw=True)) is None:
                return
            await asyncio.sleep(5)
            await self.timed("pod-delete", self.client.delete("Pod", name, "default", grace_period_seconds=0))

        while not stop.is_set():
            t += 1 / rate
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, t - loop.time()))
                break
            task = asyncio.create_task(one(f"bench-{n}"))
            n += 1
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def not_ready(nodes: list[dict[str, Any]]) -> int:
    """How many of ``nodes`` have a Ready condition that is not True (the node lifecycle
    controller's NotReady or Unknown), or none at all."""
    count = 0
    for n in nodes:
        ready = [c for c in (n.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
        count += not ready or ready[0].get("status") != "True"
    return count


async def run(args: argparse.Namespace, src: str | None = None) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-fleet-"))
    c = Cluster(root)
    c.env = source_env(src)
    if args.cluster_cidr:
        c.server_args = ("--cluster-cidr", args.cluster_cidr)
    if args.profile:
        c.python_args = ("-m", "cProfile", "-o", str(args.profile.resolve()))
    if args.split:
        c.server_args += ("--components", "apiserver")
    components: subprocess.Popen[bytes] | None = None
    try:
        c.start_server()
        if args.split:
            components = start_components(root / "server", c.env, args.cluster_cidr)
        clients = [c.client()]  # registration, the pods and the final list
        load = Load(clients, args, HeartbeatConnection.factory(root / "server" / "kubeconfig"))
        t0 = perf()
        registered: list[dict[str, Any]] = []
        connections: list[HeartbeatConnection] = []
        for start in range(0, args.nodes, 20):
            batch = range(start, min(args.nodes, start + 20))
            registered += await asyncio.gather(*(load.register(i) for i in batch))
            connections += await asyncio.gather(*(load.connection().connect() for _ in batch))
        register_s = perf() - t0
        stop = asyncio.Event()
        tasks = [asyncio.create_task(load.heartbeat(n, conn, stop)) for n, conn in zip(registered, connections, strict=True)]
        tasks.append(asyncio.create_task(load.pods(stop)))
        await asyncio.sleep(args.warmup)
        assert c.server is not None
        proc = psutil.Process(c.server.pid)
        comp = psutil.Process(components.pid) if components is not None else None
        me = psutil.Process()
        cpu0, mine0 = proc.cpu_times(), me.cpu_times()
        comp0 = comp.cpu_times() if comp is not None else None
        w0 = perf()
        load.measuring = True
        await asyncio.sleep(args.duration)
        load.measuring = False
        window = perf() - w0
        cpu1, mine1 = proc.cpu_times(), me.cpu_times()
        rss = proc.memory_info().rss
        comp_busy = comp_rss = None
        if comp is not None and comp0 is not None:
            comp1 = comp.cpu_times()
            comp_busy = (comp1.user - comp0.user) + (comp1.system - comp0.system)
            comp_rss = comp.memory_info().rss
        # While the nodes still renew: a node marked NotReady in the window stays so only
        # until its next renewal is read, so this counts the ones marked and not yet back.
        for attempt in range(5):
            try:
                listed = await clients[0].list("nodes", raw=True)
                break
            except TransportError:
                if attempt == 4:
                    raise
        stop.set()
        # An overloaded server may still owe answers: what is not back in 5 s is cancelled.
        _, pending = await asyncio.wait(tasks, timeout=5)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn in connections:
            conn.close()
        for client in clients:
            await client.close()
        busy = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        mutating = [x for v in load.lat.values() for x in v]
        out: dict[str, Any] = {
            "nodes": args.nodes, "pod_rate": args.pod_rate, "window_s": round(window, 1),
            "register_s": round(register_s, 1), "src": src or "this tree",
            "server_rss_mib": round(rss / (1 << 20), 1),
            "nodes_not_ready": not_ready(list(listed)),
            "renewals_due_per_s": round(args.nodes / LEASE_PERIOD, 1),
            "renewals_served_per_s": round(load.renewals / window, 1),
            "server_cpu_pct": round(100 * busy / window, 1),
            "server_cpu_ms_per_call": round(1000 * busy / max(1, len(mutating)), 2),
            "loadavg_1m": round(os.getloadavg()[0], 2),
            "load_cpu_pct": round(100 * ((mine1.user - mine0.user) + (mine1.system - mine0.system)) / window, 1),
            "mutating": {"n": len(mutating), "p50_ms": _ms(pct(mutating, 50)), "p99_ms": _ms(pct(mutating, 99)),
                         "max_ms": _ms(max(mutating) if mutating else None)},
            "per_kind": {k: {"n": len(v), "p50_ms": _ms(pct(v, 50)), "p99_ms": _ms(pct(v, 99))}
                         for k, v in load.lat.items()},
            "errors": load.errors,
        }
        if comp_busy is not None and comp_rss is not None:
            out["components_cpu_pct"] = round(100 * comp_busy / window, 1)
            out["components_rss_mib"] = round(comp_rss / (1 << 20), 1)
        return out
    finally:
        if components is not None:
            stop_process(components)
        c.close()
        shutil.rmtree(root, ignore_errors=True)


def start_components(state: Path, env: dict[str, str] | None, cluster_cidr: str,
                     timeout: float = 60) -> subprocess.Popen[bytes]:
    """`gpufleet server --components scheduler,controllers` against the API server whose
    state directory is STATE, once it says it runs (its node IPAM gets the same --cluster-cidr)."""
    log_path = state / "components.log"
    cmd = [sys.executable, "-m", "gpufleet.cli.main", "server", "--components", "scheduler,controllers",
           "--state-dir", str(state)]
    if cluster_cidr:
        cmd += ["--cluster-cidr", cluster_cidr]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if b" running against the API server" in log_path.read_bytes():
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    stop_process(proc)
    raise RuntimeError(f"the scheduler and controllers did not start:\n{log_path.read_text()[-3000:]}")


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 1)


def render(r: dict[str, Any]) -> str:
    m = r["mutating"]
    lines = [
        f"fleet bench ({r['src']}): {r['nodes']} nodes (Lease every {LEASE_PERIOD:g} s, status every {STATUS_PERIOD:g} s), "
        f"{r['pod_rate']} pod writes/s, {r['window_s']} s window (registration took {r['register_s']} s)",
        f"  mutating calls: n={m['n']} p50={m['p50_ms']} ms p99={m['p99_ms']} ms max={m['max_ms']} ms",
        f"  renewals served/s: {r['renewals_served_per_s']} of {r['renewals_due_per_s']} due",
        f"  server CPU: {r['server_cpu_pct']}% of one core, {r['server_cpu_ms_per_call']} ms per mutating call "
        f"(the load generator: {r['load_cpu_pct']}%; machine load average {r['loadavg_1m']})",
        f"  server RSS: {r['server_rss_mib']} MiB; nodes not Ready at the end: {r['nodes_not_ready']}",
    ]
    if "components_cpu_pct" in r:
        lines[3] = lines[3].replace("  server CPU:", "  API server CPU:")
        lines.insert(5, f"  scheduler and controllers (their own process): {r['components_cpu_pct']}% of one core, "
                        f"RSS {r['components_rss_mib']} MiB")
    for k, v in r["per_kind"].items():
        lines.append(f"    {k:<12} n={v['n']:<6} p50={v['p50_ms']} ms p99={v['p99_ms']} ms")
    if r["errors"]:
        lines.append(f"  errors: {r['errors']}")
    return "\n".join(lines)


def compare(r: dict[str, Any], other: dict[str, Any]) -> str:
    """This tree's figures next to the other tree's, with their ratios."""
    def row(what: str, a: float | None, b: float | None) -> str:
        ratio = f"{b / a:.2f}x" if a and b else "-"
        return f"  {what:<28} {a!s:>10} {b!s:>10}   {ratio}"
    return "\n".join([
        f"  {'':<28} {'this tree':>10} {'other':>10}   other / this",
        row("mutating p50 ms", r["mutating"]["p50_ms"], other["mutating"]["p50_ms"]),
        row("mutating p99 ms", r["mutating"]["p99_ms"], other["mutating"]["p99_ms"]),
        row("renewals served/s", r["renewals_served_per_s"], other["renewals_served_per_s"]),
        row("server CPU ms per call", r["server_cpu_ms_per_call"], other["server_cpu_ms_per_call"]),
        row("server RSS MiB", r["server_rss_mib"], other["server_rss_mib"]),
        row("nodes not Ready", r["nodes_not_ready"], other["nodes_not_ready"]),
    ])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--cluster-cidr", default="10.0.0.0/12",
                   help="the server's --cluster-cidr ('' leaves the server's default, 256 nodes)")
    p.add_argument("--compare-src", help="also run the load against the server of this source tree, after")
    p.add_argument("--duration", type=float, default=45, help="measured window, seconds")
    p.add_argument("--warmup", type=float, default=40,
                   help="seconds of load before the window (at 1,000 nodes a server takes 20-30 s to work off "
                        "the backlog the registrations left; with less the window measures that)")
    p.add_argument("--pod-rate", type=float, default=20, help="pod writes/s (half creates, half deletes)")
    p.add_argument("--split", action="store_true",
                   help="run the scheduler and controllers in a process of their own "
                        "(`gpufleet server --components scheduler,controllers`) beside `--components apiserver`")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--profile", type=Path,
                   help="run the server under cProfile and write its profile here (slows it down)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    r = asyncio.run(run(args))
    print(render(r), flush=True)
    results = [r]
    if args.compare_src:
        other = asyncio.run(run(args, args.compare_src))
        print(render(other))
        results.append(other)
        print(compare(r, other))
    if args.json:
        args.json.write_text(json.dumps(results if args.compare_src else r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
