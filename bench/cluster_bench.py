"""Cluster benchmark: pod startup latency under churn, and failover time when a node dies,
on a real control plane with real agents running pods as host processes.

    .venv/bin/python bench/cluster_bench.py [--churn-rate 20] [--duration 30] [--repeats 3]

Startup: `gpufleet server` (SQLite, scheduler and controllers) and 2 `gpufleet agent`s with
the process runtime and 4 declared GPUs each. Bare pods (`sleep 2`, restartPolicy Never, a
small CPU request) are created at --churn-rate for --duration seconds, and finished ones are
deleted. Per pod: create request sent -> PodScheduled=True, and -> phase Running, both as
first seen on a watch.

Failover: a fresh cluster of 3 agents runs a Deployment of 3 replicas (1 GPU each). One agent
holding a replica is killed with SIGKILL, along with its pods' processes, as a host that
loses power would. From that instant: -> its Node reads Ready=Unknown/False, -> every pod
it held is gone from the API, -> as many replacement pods Running on other nodes.

Figures are printed, never asserted. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import platform
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import transport_from_kubeconfig

if __package__:
    from ._pg import die_with_parent
else:
    from _pg import die_with_parent

NAMESPACE = "default"
perf = time.perf_counter
_LISTENING = re.compile(rb"API server listening on (https?://\S+)")


# --- the cluster -----------------------------------------------------------------------------


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen[bytes], grace: float = 10) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def source_env(src: str | None) -> dict[str, str] | None:
    """The environment that runs gpufleet from the source tree ``src`` (None: this one)."""
    if src is None:
        return None
    root = Path(src).expanduser().resolve()
    if not (root / "gpufleet" / "cli" / "main.py").exists():
        raise SystemExit(f"--compare-src {src}: no gpufleet source tree there (gpufleet/cli/main.py)")
    # PYTHONSAFEPATH: `python -m` would put the working directory first on sys.path, ahead of
    # PYTHONPATH, so a benchmark started from this repository's root would run this tree twice.
    return {**os.environ, "PYTHONPATH": str(root), "PYTHONSAFEPATH": "1"}



class Cluster:
    """One server and its agents in a temporary directory. Every container process the
    benchmark ever saw is remembered: the process runtime puts each in a session of its own,
    so a killed agent leaves them behind and only their process groups reach them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = ""
        self.server: subprocess.Popen[bytes] | None = None
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.container_pgids: set[int] = set()
        # The environment of the server and agents (None: this process's; gang_bench runs
        # a second cluster from another source tree through PYTHONPATH).
        self.env: dict[str, str] | None = None

    # Arguments a subclass adds to `gpufleet server` (gang_bench runs it without a gateway).
    server_args: tuple[str, ...] = ()
    # Arguments to the server's Python before the module (fleet_bench profiles with cProfile).
    python_args: tuple[str, ...] = ()

    def start_server(self, timeout: float = 60) -> None:
        state = self.root / "server"
        state.mkdir(parents=True, exist_ok=True)  # list_bench fills its store first
        log_path = state / "server.log"
        cmd = [sys.executable, *self.python_args, "-m", "gpufleet.cli.main", "server", "--store",
               f"sqlite:///{state / 'state.db'}", "--port", "0", "--host", "127.0.0.1",
               "--state-dir", str(state), *self.server_args]
        with open(log_path, "wb") as log:
            # A session of its own so Ctrl-C reaches only the benchmark, which stops it in order.
            self.server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=self.env,
                                           start_new_session=True, preexec_fn=die_with_parent)
        assert self.server.stdout is not None
        deadline, buf = time.monotonic() + timeout, b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.server.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(self.server.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
                m = _LISTENING.search(buf)
                if m:
                    self.url = m.group(1).decode()
                    return
            elif self.server.poll() is not None:
                break
        raise RuntimeError(f"the server did not start:\n{_tail(log_path)}")

    def start_agent(self, name: str, gpus: int = 4) -> None:
        state = self.root / name
        state.mkdir(parents=True)
        cmd = [sys.executable, "-m", "gpufleet.cli.main", "agent", "--server", self.url,
               "--kubeconfig", str(self.root / "server" / "kubeconfig"), "--name", name,
               "--gpus", str(gpus), "--gpu-model", "NVIDIA H100 80GB HBM3", "--runtime", "process",
               "--state-dir", str(state)]
        with open(state / "agent.log", "wb") as log:
            self.agents[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                                 start_new_session=True, preexec_fn=die_with_parent)

    def client(self) -> Client:
        return Client(transport_from_kubeconfig(self.root / "server" / "kubeconfig"), read_retries=3)

    def kill_node(self, name: str, pgids: list[int]) -> None:
        """SIGKILL the agent and its containers, as close to one instant as Python gets."""
        proc = self.agents[name]
        proc.kill()
        for pgid in pgids:
            _killpg(pgid)
        proc.wait()

    def close(self) -> None:
        for proc in self.agents.values():
            # Descendants first: an agent that stops cleanly kills its pods, one that hangs
            # or was killed does not, and the pods outlive it in their own sessions.
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    self.container_pgids.add(child.pid)
            _stop(proc)
        for pgid in self.container_pgids:
            _killpg(pgid)
        if self.server is not None:
            _stop(self.server)
            if self.server.stdout is not None:
                self.server.stdout.close()


@contextlib.contextmanager
def cluster(agents: int) -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-cluster-"))
    c = Cluster(root)
    try:
        c.start_server()
        for i in range(agents):
            c.start_agent(f"node-{i}")
        yield c
    finally:
        c.close()
        shutil.rmtree(root, ignore_errors=True)


# --- reading objects -------------------------------------------------------------------------


def _condition(obj: dict[str, Any], ctype: str) -> str | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond.get("status")
    return None


def _pgids(pod: dict[str, Any]) -> list[int]:
    out = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        cid = cs.get("containerID") or ""
        if cid.startswith("process://"):
            with contextlib.suppress(ValueError):
                out.append(int(cid.removeprefix("process://")))
    return out


async def wait_nodes_ready(client: Client, names: list[str], within: float = 60) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        nodes = await client.list("nodes", raw=True)
        ready = {n["metadata"]["name"] for n in nodes if _condition(n, "Ready") == "True"}
        if set(names) <= ready:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"nodes not Ready after {within:.0f} s: {names}")


def pct(samples: list[float], q: int) -> float | None:
    if not samples:
        return None
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


# --- startup latency under churn -------------------------------------------------------------


def churn_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"gpufleet.io/bench": "churn"}},
        "spec": {
            "restartPolicy": "Never",
            # Short-lived on purpose: the churn is pods arriving and leaving, and `sleep` costs
            # the shared cores far less to start than a Python interpreter would.
            "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "2"],
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
        },
    }


async def startup_phase(args: argparse.Namespace) -> dict[str, Any]:
    with cluster(2) as c:
        client = c.client()
        try:
            await wait_nodes_ready(client, list(c.agents))
            return await _churn(c, client, args)
        finally:
            await client.close()


async def _churn(c: Cluster, client: Client, args: argparse.Namespace) -> dict[str, Any]:
    sent: dict[str, float] = {}
    scheduled: dict[str, float] = {}
    running: dict[str, float] = {}
    finished: set[str] = set()
    errors: list[str] = []
    deletes: set[asyncio.Task[Any]] = set()

    async def delete(name: str) -> None:
        with contextlib.suppress(Exception):
            await client.delete("pods", name, NAMESPACE, grace_period_seconds=0)

    initial = await client.list("pods", NAMESPACE, raw=True)
    watching = asyncio.Event()

    async def watcher() -> None:
        rv = initial.resource_version
        while True:
            try:
                async for ev in client.watch("pods", NAMESPACE, resource_version=rv,
                                             label_selector="gpufleet.io/bench=churn", raw=True):
                    watching.set()
                    now = perf()
                    if ev.type == "BOOKMARK":
                        rv = ev.resource_version or rv
                        continue
                    rv = ev.resource_version or rv
                    if ev.type == "DELETED":
                        continue
                    pod = ev.object
                    name = pod["metadata"]["name"]
                    if name not in scheduled and _condition(pod, "PodScheduled") == "True":
                        scheduled[name] = now
                    phase = (pod.get("status") or {}).get("phase")
                    if phase == "Running" and name not in running:
                        running[name] = now
                    for pgid in _pgids(pod):
                        c.container_pgids.add(pgid)
                    if phase in ("Succeeded", "Failed") and name not in finished:
                        finished.add(name)
                        task = asyncio.create_task(delete(name))
                        deletes.add(task)
                        task.add_done_callback(deletes.discard)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                errors.append(f"watch: {type(exc).__name__}: {exc}")
                await asyncio.sleep(0.2)

    async def create(name: str) -> None:
        sent[name] = perf()
        try:
            await client.create(churn_pod(name), raw=True)
        except Exception as exc:
            sent.pop(name, None)
            errors.append(f"create: {type(exc).__name__}: {exc}")

    watch_task = asyncio.create_task(watcher())
    creates: list[asyncio.Task[None]] = []
    try:
        await asyncio.wait_for(watching.wait(), 5)
    except TimeoutError:
        pass  # no event yet only means nothing changed; the watch is open all the same
    total = int(args.churn_rate * args.duration)
    t0 = perf()
    for i in range(total):
        delay = t0 + i / args.churn_rate - perf()
        if delay > 0:
            await asyncio.sleep(delay)
        # Each create is its own task: a slow answer must not hold back the next arrival.
        creates.append(asyncio.create_task(create(f"churn-{i:05d}")))
    await asyncio.gather(*creates)
    create_wall = perf() - t0
    # Let the last arrivals start, so the tail is measured rather than cut off.
    deadline = perf() + 30
    while perf() < deadline and not set(sent) <= set(running) | finished:  # noqa: ASYNC110 - a few checks, not worth an event
        await asyncio.sleep(0.2)
    watch_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watch_task
    if deletes:
        await asyncio.gather(*deletes, return_exceptions=True)

    sched_lat = [scheduled[n] - sent[n] for n in sent if n in scheduled]
    run_lat = [running[n] - sent[n] for n in sent if n in running]
    return {
        "pods": len(sent), "rate": len(sent) / create_wall if create_wall else 0.0,
        "sched": sched_lat, "running": run_lat,
        "not_running": len([n for n in sent if n not in running]),
        "errors": errors,
    }


# --- failover --------------------------------------------------------------------------------


def deployment() -> dict[str, Any]:
    labels = {"app": "failover-bench"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "failover", "namespace": NAMESPACE},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{
                    "name": "worker", "image": "busybox", "command": ["sleep", "100000"],
                    "resources": {"requests": {"cpu": "10m", "nvidia.com/gpu": "1"},
                                  "limits": {"nvidia.com/gpu": "1"}},
                }]},
            },
        },
    }


async def _pods(client: Client) -> list[dict[str, Any]]:
    return list(await client.list("pods", NAMESPACE, label_selector="app=failover-bench", raw=True))


def _running(p: dict[str, Any]) -> bool:
    return (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")


async def failover_once(within: float) -> dict[str, float | None]:
    with cluster(3) as c:
        client = c.client()
        try:
            await wait_nodes_ready(client, list(c.agents))
            await client.create(deployment(), raw=True)
            deadline = time.monotonic() + 60
            while True:
                pods = await _pods(client)
                if sum(1 for p in pods if _running(p) and _pgids(p)) >= 3:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the Deployment's 3 replicas did not all start within 60 s")
                await asyncio.sleep(0.2)
            for p in pods:
                c.container_pgids.update(_pgids(p))
            victim = pods[0]["spec"]["nodeName"]
            lost = {p["metadata"]["uid"] for p in pods if p["spec"].get("nodeName") == victim}
            before = {p["metadata"]["uid"] for p in pods}
            pgids = [g for p in pods if p["spec"].get("nodeName") == victim for g in _pgids(p)]

            c.kill_node(victim, pgids)
            t0 = perf()
            t_node = t_gone = t_repl = None
            while perf() - t0 < within and None in (t_node, t_gone, t_repl):
                now = perf()
                if t_node is None:
                    node = await client.get("nodes", victim, raw=True)
                    if _condition(node, "Ready") in ("Unknown", "False"):
                        t_node = now - t0
                pods = await _pods(client)
                for p in pods:
                    c.container_pgids.update(_pgids(p))
                if t_gone is None and not lost & {p["metadata"]["uid"] for p in pods}:
                    t_gone = now - t0
                fresh = [p for p in pods if p["metadata"]["uid"] not in before and _running(p)
                         and p["spec"].get("nodeName") != victim]
                if t_repl is None and len(fresh) >= len(lost):
                    t_repl = now - t0
                await asyncio.sleep(0.1)
            return {"node_notready": t_node, "pods_deleted": t_gone, "replacement_running": t_repl,
                    "lost": float(len(lost))}
        finally:
            await client.close()


# --- output ----------------------------------------------------------------------------------


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def render(startup: dict[str, Any] | None, failovers: list[dict[str, float | None]],
           args: argparse.Namespace) -> str:
    lines = []
    if startup is not None:
        lines += [
            f"Pod startup, process runtime, 2 agents, {args.churn_rate:g} pods/s for {args.duration:g} s",
            "",
            "| figure | value |",
            "|---|---|",
            f"| pods created | {startup['pods']} |",
            f"| achieved create rate | {startup['rate']:.1f} /s |",
            f"| create -> PodScheduled=True p50 | {_ms(pct(startup['sched'], 50))} |",
            f"| create -> PodScheduled=True p99 | {_ms(pct(startup['sched'], 99))} |",
            f"| create -> Running p50 | {_ms(pct(startup['running'], 50))} |",
            f"| create -> Running p99 | {_ms(pct(startup['running'], 99))} |",
            f"| pods never seen Running | {startup['not_running']} |",
            f"| errors | {len(startup['errors'])} |",
            "",
        ]
    if failovers:
        keys = ("node_notready", "pods_deleted", "replacement_running")
        lines += [
            "Failover, process runtime, 3 agents, Deployment of 3 x 1 GPU, one agent SIGKILLed (seconds from the kill)",
            "",
            "| run | lost pods | node NotReady/Unknown | lost pods deleted | replacement Running |",
            "|---|---|---|---|---|",
        ]
        for i, f in enumerate(failovers, 1):
            lines.append(f"| {i} | {int(f['lost'] or 0)} | " + " | ".join(_s(f[k]) for k in keys) + " |")
        med = []
        for k in keys:
            vals = [f[k] for f in failovers if f[k] is not None]
            med.append(_s(statistics.median(vals)) if vals else "-")
        lines.append("| median | | " + " | ".join(med) + " |")
    return "\n".join(lines)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--churn-rate", type=float, default=20, help="pods created per second")
    p.add_argument("--duration", type=float, default=30, help="seconds of pod creation")
    p.add_argument("--repeats", type=int, default=3, help="failover runs, each on a fresh cluster")
    p.add_argument("--failover-timeout", type=float, default=60,
                   help="seconds to wait for each failover figure before giving up on it")
    p.add_argument("--skip-startup", action="store_true")
    p.add_argument("--skip-failover", action="store_true")
    return p.parse_args(argv)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


async def run(args: argparse.Namespace) -> tuple[dict[str, Any] | None, list[dict[str, float | None]]]:
    startup = None
    if not args.skip_startup:
        print("startup under churn ...", flush=True)
        startup = await startup_phase(args)
    failovers = []
    if not args.skip_failover:
        for i in range(args.repeats):
            print(f"failover {i + 1}/{args.repeats} ...", flush=True)
            failovers.append(await failover_once(args.failover_timeout))
    return startup, failovers


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so servers, agents and their pods go too.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    print("gpufleet cluster benchmark")
    print(f"  date       {dt.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"  machine    {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}")
    print(f"  python     {platform.python_version()}")
    print(f"  load avg   {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    t = perf()
    try:
        startup, failovers = asyncio.run(run(args))
    except KeyboardInterrupt:
        # Requests cut off mid-connect leave coroutines that warn at exit; they mean nothing here.
        warnings.filterwarnings("ignore", category=RuntimeWarning)
        print("\ninterrupted; servers, agents and pods stopped", file=sys.stderr)
        return 130
    print(f"  wall time  {perf() - t:.0f} s\n")
    print(render(startup, failovers, args))
    if startup and startup["errors"]:
        print("\nfirst errors:")
        for e in startup["errors"][:5]:
            print(f"  {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
