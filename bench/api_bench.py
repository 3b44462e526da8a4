"""API server benchmark: create / get / list / watch-delivery latency and writes/s, on SQLite
and on PostgreSQL, with a realistic object count and a steady churn of writes.

    .venv/bin/python bench/api_bench.py [--objects 1000] [--churn-rate 20] [--duration 10]
                                        [--backends sqlite,postgres] [--json out.json]

For each backend the real `gpufleet server` runs in its own process (no controllers), reached
over HTTP on 127.0.0.1 through the official client (gpufleet.client.Client on HttpTransport,
typed models), so the figures are what a component of a deployed cluster sees: client
encode/decode, HTTP, admission, the store and its durability. PostgreSQL is a throwaway
server in a temporary directory with its default durability (fsync on); SQLite runs with the
store's default synchronous=FULL. Both flush on commit, so their write figures compare.

Figures are printed, never asserted: they depend on the machine and on whatever else runs on
it. Compare backends through the ratio column, measured in one run on the same machine.
See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import random
import re
import select
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from gpufleet.client import Client, HttpTransport, NotFound

if __package__:
    from ._pg import PostgresServer, PostgresUnavailable, die_with_parent, throwaway_postgres
else:
    from _pg import PostgresServer, PostgresUnavailable, die_with_parent, throwaway_postgres

NAMESPACE = "default"
TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"

perf = time.perf_counter


# --- the objects -----------------------------------------------------------------------------


def make_pod(name: str, i: int) -> dict[str, Any]:
    """A training worker as a controller would write it: one container asking for a GPU."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app": f"train-{i % 50}", "team": f"team-{i % 7}", "gpufleet.io/bench": "api"},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "worker",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "command": ["torchrun", "--nproc-per-node=1", "train.py"],
                    "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "RUN_ID", "value": str(i)}],
                    "resources": {
                        "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                        "limits": {"memory": "16Gi", "nvidia.com/gpu": "1"},
                    },
                }
            ],
        },
    }


def annotation_patch(seq: int) -> dict[str, Any]:
    return {"metadata": {"annotations": {"gpufleet.io/bench-seq": str(seq)}}}


# --- figures ---------------------------------------------------------------------------------


def pct(samples: list[float], q: int) -> float | None:
    """The q-th percentile in milliseconds (linear between closest ranks), None without samples."""
    if not samples:
        return None
    if len(samples) == 1:
        return samples[0] * 1000
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] * 1000


@dataclass
class Metric:
    key: str
    label: str
    unit: str  # "ms", "/s", "ms/op" or "" (a count)


METRICS = [
    Metric("create_p50", "create p50", "ms"),
    Metric("create_p99", "create p99", "ms"),
    Metric("create_rate", "sequential creates/s (1 client)", "/s"),
    Metric("create_server_cpu", "server CPU per create", "ms/op"),
    Metric("concurrent_rate", "writes/s, {writers} concurrent writers", "/s"),
    Metric("concurrent_p50", "  write p50 under that load", "ms"),
    Metric("concurrent_p99", "  write p99 under that load", "ms"),
    Metric("get_p50", "get p50", "ms"),
    Metric("get_p99", "get p99", "ms"),
    Metric("get_server_cpu", "server CPU per get", "ms/op"),
    Metric("list_p50", "list {objects} (typed) p50", "ms"),
    Metric("list_p99", "list {objects} (typed) p99", "ms"),
    Metric("list_raw_p50", "list {objects} (JSON dicts) p50", "ms"),
    Metric("list_raw_p99", "list {objects} (JSON dicts) p99", "ms"),
    Metric("list_table_p50", "list {objects} (Table) p50", "ms"),
    Metric("list_table_p99", "list {objects} (Table) p99", "ms"),
    Metric("churn_rate", "churn writes/s achieved", "/s"),
    Metric("churn_write_p50", "  churn write p50", "ms"),
    Metric("churn_write_p99", "  churn write p99", "ms"),
    Metric("watch_p50", "watch delivery p50", "ms"),
    Metric("watch_p99", "watch delivery p99", "ms"),
    Metric("churn_get_p50", "get p50 during churn", "ms"),
    Metric("churn_get_p99", "get p99 during churn", "ms"),
    Metric("watch_missed", "watch events not seen (of churn writes)", ""),
    Metric("errors", "failed requests (all phases)", ""),
]


@dataclass
class Result:
    figures: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)


# --- the server under test -------------------------------------------------------------------


_LISTENING = re.compile(rb"listening on (http://\S+)")


@contextlib.contextmanager
def api_server(store_url: str, state_dir: Path, timeout: float = 60) -> Iterator[tuple[str, int]]:
    """`gpufleet server` on a free port; yields (url, pid) once it is serving."""
    log_path = state_dir / "server.log"
    cmd = [sys.executable, "-m", "gpufleet.cli.main", "server", "--store", store_url, "--port", "0",
           "--host", "127.0.0.1", "--state-dir", str(state_dir), "--no-controllers"]
    with open(log_path, "wb") as log:
        # A session of its own so Ctrl-C reaches only the benchmark, which stops it in order.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                                preexec_fn=die_with_parent)
        try:
            url = _wait_listening(proc, log_path, timeout)
            yield url, proc.pid
            if proc.poll() is not None:
                raise RuntimeError(f"the API server exited during the run (rc {proc.returncode}):\n"
                                   f"{_tail(log_path)}")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()


def _wait_listening(proc: subprocess.Popen[bytes], log_path: Path, timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            m = _LISTENING.search(buf)
            if m:
                return m.group(1).decode()
        elif proc.poll() is not None:
            break
    raise RuntimeError(f"the API server did not start:\n{_tail(log_path)}")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ServerCpu:
    """CPU seconds the server process has used, to tell its cost per request from the client's
    and from waiting on the disk."""

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)

    def seconds(self) -> float:
        t = self._proc.cpu_times()
        return t.user + t.system


# --- the phases ------------------------------------------------------------------------------


class Phases:
    def __init__(self, client: Client, cpu: ServerCpu, args: argparse.Namespace, rng: random.Random) -> None:
        self.client = client
        self.cpu = cpu
        self.args = args
        self.rng = rng
        self.names = [f"train-{i:05d}" for i in range(args.objects)]
        self.figures: dict[str, float | None] = {}
        self.notes: list[str] = []
        self.errors = 0
        self._seq = 0

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    async def _timed(self, call: Callable[[], Awaitable[Any]], into: list[float], missing_ok: bool = False) -> Any:
        t = perf()
        try:
            out = await call()
        except NotFound:
            if missing_ok:
                return None
            self.errors += 1
            self.notes.append("an object the benchmark wrote was not found")
            return None
        except Exception as exc:
            self.errors += 1
            if self.errors <= 5:
                self.notes.append(f"request failed: {type(exc).__name__}: {exc}")
            return None
        into.append(perf() - t)
        return out

    async def warm_up(self) -> None:
        # The first requests pay for the connection, lazy imports and caches on both sides.
        c = self.client
        await c.create(make_pod("warmup", 0))
        for _ in range(20):
            await c.get("pods", "warmup", NAMESPACE)
            await c.patch("pods", "warmup", annotation_patch(self._next_seq()), NAMESPACE)
        await c.list("pods", NAMESPACE)
        await c.delete("pods", "warmup", NAMESPACE)

    async def create(self) -> None:
        lat: list[float] = []
        cpu0, t0 = self.cpu.seconds(), perf()
        for i, name in enumerate(self.names):
            await self._timed(lambda name=name, i=i: self.client.create(make_pod(name, i)), lat)
        elapsed, cpu = perf() - t0, self.cpu.seconds() - cpu0
        self.figures.update(create_p50=pct(lat, 50), create_p99=pct(lat, 99),
                            create_rate=len(lat) / elapsed,
                            create_server_cpu=cpu * 1000 / max(len(lat), 1))

    async def get(self) -> None:
        lat: list[float] = []
        cpu0 = self.cpu.seconds()
        for _ in range(self.args.objects):
            name = self.rng.choice(self.names)
            await self._timed(lambda name=name: self.client.get("pods", name, NAMESPACE), lat)
        cpu = self.cpu.seconds() - cpu0
        self.figures.update(get_p50=pct(lat, 50), get_p99=pct(lat, 99),
                            get_server_cpu=cpu * 1000 / max(len(lat), 1))

    async def list(self) -> None:
        typed: list[float] = []
        raw: list[float] = []
        table: list[float] = []
        c = self.client

        async def as_table() -> int:
            resp = await c.raw_request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods",
                                       headers={"accept": TABLE_ACCEPT})
            return len(json.loads(resp.body).get("rows") or [])

        counts = set()
        # Interleaved, so a burst of load from elsewhere on the machine spreads over all three.
        for _ in range(self.args.lists):
            out = await self._timed(lambda: c.list("pods", NAMESPACE), typed)
            counts.add(len(out) if out is not None else -1)
            out = await self._timed(lambda: c.list("pods", NAMESPACE, raw=True), raw)
            counts.add(len(out) if out is not None else -1)
            counts.add(await self._timed(as_table, table))
        if counts != {self.args.objects}:
            self.notes.append(f"lists returned {sorted(counts, key=str)} items, expected {self.args.objects}")
        self.figures.update(list_p50=pct(typed, 50), list_p99=pct(typed, 99),
                            list_raw_p50=pct(raw, 50), list_raw_p99=pct(raw, 99),
                            list_table_p50=pct(table, 50), list_table_p99=pct(table, 99))

    async def concurrent_writes(self) -> None:
        lat: list[float] = []
        writers = self.args.writers
        deadline = perf() + self.args.concurrent_duration

        async def writer(w: int) -> int:
            mine = self.names[w::writers]
            done = 0
            while perf() < deadline:
                name = mine[done % len(mine)]
                patch = annotation_patch(self._next_seq())
                await self._timed(lambda n=name, p=patch: self.client.patch("pods", n, p, NAMESPACE), lat)
                done += 1
            return done

        t0 = perf()
        await asyncio.gather(*(writer(w) for w in range(writers)))
        elapsed = perf() - t0
        self.figures.update(concurrent_rate=len(lat) / elapsed,
                            concurrent_p50=pct(lat, 50), concurrent_p99=pct(lat, 99))

    async def churn(self) -> None:
        """Open-loop churn at a fixed rate (updates, creates, deletes of pods) with a watch
        open: how long from sending a write until its event reaches the watcher, and what a
        reader sees meanwhile."""
        c, rng, args = self.client, self.rng, self.args
        live = list(self.names)
        created = 0
        sent: dict[int, float] = {}
        arrived: dict[int, float] = {}
        arrival = asyncio.Event()

        start_rv = (await c.list("pods", NAMESPACE, limit=1)).resource_version

        async def watcher() -> None:
            async for ev in c.watch("pods", NAMESPACE, resource_version=start_rv):
                if ev.type != "BOOKMARK":
                    arrived[int(ev.resource_version)] = perf()
                    arrival.set()

        watch_task = asyncio.create_task(watcher())
        try:
            # The watch is open (and caught up) once the event of a write made now arrives.
            marker = await c.patch("pods", live[0], annotation_patch(self._next_seq()), NAMESPACE)
            marker_rv = int(marker.metadata.resource_version)
            await _wait_for(lambda: marker_rv in arrived, arrival, within=30, what="the watch to open")

            write_lat: list[float] = []
            get_lat: list[float] = []
            stop_probe = asyncio.Event()

            async def write(kind: str, name: str, body: Any) -> None:
                t = perf()
                try:
                    if kind == "create":
                        out = await c.create(body)
                    elif kind == "delete":
                        out = await c.delete("pods", name, NAMESPACE)
                    else:
                        out = await c.patch("pods", name, body, NAMESPACE)
                except NotFound:
                    # An update raced a delete of the same pod; not a failure of the server.
                    return
                except Exception as exc:
                    self.errors += 1
                    if self.errors <= 5:
                        self.notes.append(f"churn {kind} failed: {type(exc).__name__}: {exc}")
                    return
                write_lat.append(perf() - t)
                rv = _rv(out)
                if rv:
                    sent[rv] = t
                else:
                    self.notes.append(f"churn {kind} answer carried no resourceVersion")

            async def probe() -> None:
                period = 1 / args.probe_rate
                while not stop_probe.is_set():
                    name = rng.choice(live)
                    # A pod deleted by the churn since it was picked is an answer, not an error.
                    await self._timed(lambda name=name: c.get("pods", name, NAMESPACE), get_lat, missing_ok=True)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop_probe.wait(), period)

            probe_task = asyncio.create_task(probe())
            writes: list[asyncio.Task[None]] = []
            total = int(args.churn_rate * args.duration)
            t0 = perf()
            for k in range(total):
                delay = t0 + k / args.churn_rate - perf()
                if delay > 0:
                    await asyncio.sleep(delay)
                roll = rng.random()
                if roll < 0.1 or len(live) < 2:
                    name = f"churn-{created:05d}"
                    created += 1
                    live.append(name)
                    task = write("create", name, make_pod(name, args.objects + created))
                elif roll < 0.2:
                    name = live.pop(rng.randrange(len(live)))
                    task = write("delete", name, None)
                else:
                    task = write("update", rng.choice(live), annotation_patch(self._next_seq()))
                writes.append(asyncio.create_task(task))
            await asyncio.gather(*writes)
            elapsed = perf() - t0
            stop_probe.set()
            await probe_task
            with contextlib.suppress(TimeoutError):
                await _wait_for(lambda: all(rv in arrived for rv in sent), arrival, within=10, what="")
        finally:
            watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watch_task

        delivery = [arrived[rv] - t for rv, t in sent.items() if rv in arrived]
        missed = sum(1 for rv in sent if rv not in arrived)
        if missed:
            self.notes.append(f"{missed} of {len(sent)} churn writes never showed up on the watch")
        self.figures.update(churn_rate=len(write_lat) / elapsed,
                            churn_write_p50=pct(write_lat, 50), churn_write_p99=pct(write_lat, 99),
                            watch_p50=pct(delivery, 50), watch_p99=pct(delivery, 99),
                            churn_get_p50=pct(get_lat, 50), churn_get_p99=pct(get_lat, 99),
                            watch_missed=float(missed))


def _rv(obj: Any) -> int:
    if isinstance(obj, dict):
        value = (obj.get("metadata") or {}).get("resourceVersion")
    else:
        value = getattr(getattr(obj, "metadata", None), "resource_version", None)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


async def _wait_for(cond: Callable[[], bool], event: asyncio.Event, within: float, what: str) -> None:
    deadline = perf() + within
    while not cond():
        left = deadline - perf()
        if left <= 0:
            if what:
                raise TimeoutError(f"timed out waiting for {what}")
            raise TimeoutError
        event.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), min(left, 0.5))


async def measure(url: str, server_pid: int, args: argparse.Namespace) -> Result:
    client = Client(HttpTransport(url), read_retries=1)
    phases = Phases(client, ServerCpu(server_pid), args, random.Random(args.seed))
    try:
        await phases.warm_up()
        for name in ("create", "get", "list", "concurrent_writes", "churn"):
            t = perf()
            await getattr(phases, name)()
            print(f"    {name:<18} {perf() - t:6.1f} s", flush=True)
    finally:
        await client.close()
    phases.figures["errors"] = float(phases.errors)
    return Result(figures=phases.figures, notes=phases.notes)


def run_backend(backend: str, args: argparse.Namespace, workdir: Path) -> Result:
    with contextlib.ExitStack() as stack:
        state_dir = Path(tempfile.mkdtemp(prefix=f"gpufleet-bench-{backend}-", dir=workdir))
        stack.callback(shutil.rmtree, state_dir, True)
        facts: dict[str, str] = {}
        if backend == "sqlite":
            store_url = f"sqlite:///{state_dir / 'state.db'}"
            facts["store"] = f"SQLite {sqlite3.sqlite_version}, WAL, synchronous=FULL (store default)"
        elif backend == "postgres":
            pg: PostgresServer = stack.enter_context(throwaway_postgres(durable=not args.pg_no_fsync))
            store_url = pg.create_database("bench")
            s = pg.show("server_version", "fsync", "synchronous_commit", "full_page_writes", "shared_buffers")
            facts["store"] = (f"PostgreSQL {s['server_version'].split()[0]}, fsync={s['fsync']}, "
                              f"synchronous_commit={s['synchronous_commit']}, "
                              f"full_page_writes={s['full_page_writes']}, shared_buffers={s['shared_buffers']}")
        else:
            raise SystemExit(f"unknown backend {backend!r}: use sqlite and/or postgres")
        print(f"  {backend}: {facts['store']}", flush=True)
        url, pid = stack.enter_context(api_server(store_url, state_dir))
        result = asyncio.run(measure(url, pid, args))
        result.facts = facts
        return result


# --- the report ------------------------------------------------------------------------------


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "":
        return f"{value:.0f}"
    if unit == "/s":
        return f"{value:.0f}"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def render_table(results: dict[str, Result], args: argparse.Namespace) -> str:
    backends = list(results)
    show_ratio = "sqlite" in results and "postgres" in results
    rows = [["metric", "unit", *backends] + (["pg/sqlite"] if show_ratio else [])]
    for m in METRICS:
        label = m.label.format(writers=args.writers, objects=args.objects)
        row = [label, m.unit or "count"]
        row += [_fmt(results[b].figures.get(m.key), m.unit) for b in backends]
        if show_ratio:
            a, b = results["sqlite"].figures.get(m.key), results["postgres"].figures.get(m.key)
            row.append(f"{b / a:.2f}" if a and b is not None and m.unit else "")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1])] + [c.rjust(w) for c, w in zip(r[2:], widths[2:], strict=True)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine_facts(workdir: Path) -> dict[str, str]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    fs = ""
    with contextlib.suppress(OSError):
        best = ""
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and str(workdir).startswith(parts[1]) and len(parts[1]) >= len(best):
                best, fs = parts[1], parts[2]
    try:
        from importlib.metadata import version

        gpufleet_version = version("gpufleet")
    except Exception:
        gpufleet_version = "?"
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{model or platform.processor() or '?'}; {os.cpu_count()} cores "
               f"({len(os.sched_getaffinity(0))} usable)",
        "memory": f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
        "os": platform.platform(),
        "python": platform.python_version(),
        "gpufleet": gpufleet_version,
        "data dir": f"{workdir} ({fs or '?'})",
        "python speed": f"{_python_speed_us():.0f} us for sum(range(1000)), best of 5 (scales every figure)",
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _python_speed_us() -> float:
    # Server and client are pure Python: how fast this interpreter runs on this machine, right
    # now, says more about the latencies below than the CPU model does.
    import timeit

    return min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--objects", type=int, default=1000, help="pods created, then got, listed and churned")
    p.add_argument("--churn-rate", type=float, default=20, help="writes per second during the watch phase")
    p.add_argument("--duration", type=float, default=10, help="seconds of churn")
    p.add_argument("--backends", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--writers", type=int, default=8, help="concurrent writers in the writes/s phase")
    p.add_argument("--concurrent-duration", type=float, default=5, help="seconds of concurrent writes")
    p.add_argument("--lists", type=int, default=30, help="lists of each kind (typed, JSON, Table)")
    p.add_argument("--probe-rate", type=float, default=40, help="gets per second during churn")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()),
                   help="where the databases live (a tmpfs here would hide the cost of flushing)")
    p.add_argument("--pg-no-fsync", action="store_true",
                   help="run PostgreSQL without durability (as the tests do); off by default")
    args = p.parse_args(argv)
    if args.objects < args.writers:
        p.error("--objects must be at least --writers")
    return args


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the servers and temporary directories go too.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    workdir = args.workdir.resolve()
    facts = machine_facts(workdir)
    print("gpufleet API benchmark")
    for k, v in facts.items():
        print(f"  {k:<22} {v}")
    params = {"objects": args.objects, "churn_rate": args.churn_rate, "duration_s": args.duration,
              "writers": args.writers, "concurrent_duration_s": args.concurrent_duration,
              "lists": args.lists, "probe_rate": args.probe_rate, "seed": args.seed}
    print("  parameters             " + ", ".join(f"{k}={v}" for k, v in params.items()))
    print("  client                 gpufleet.client.Client over HttpTransport (HTTP/1.1 keep-alive), "
          "typed models unless noted")
    print("  server                 `gpufleet server --no-controllers` in its own process, 127.0.0.1\n",
          flush=True)

    results: dict[str, Result] = {}
    skipped: dict[str, str] = {}
    try:
        for backend in backends:
            t = perf()
            try:
                results[backend] = run_backend(backend, args, workdir)
            except PostgresUnavailable as exc:
                skipped[backend] = str(exc).splitlines()[0]
                print(f"  {backend}: skipped: {skipped[backend]}", flush=True)
                continue
            print(f"  {backend}: done in {perf() - t:.0f} s\n", flush=True)
    except KeyboardInterrupt:
        # Requests cut off mid-connect leave coroutines that warn at exit; they mean nothing here.
        warnings.filterwarnings("ignore", category=RuntimeWarning)
        print("\ninterrupted; servers stopped and temporary files removed", file=sys.stderr)
        return 130

    facts["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(render_table(results, args))
    print()
    for backend, r in results.items():
        print(f"{backend}: {r.facts['store']}")
        for note in r.notes:
            print(f"  note: {note}")
    for backend, why in skipped.items():
        print(f"{backend}: skipped ({why})")
    print(f"load average at end: {facts['load average at end']}")
    print("ratio = postgres / sqlite: above 1 means PostgreSQL takes longer (ms) or does more (/s).")

    if args.json:
        doc = {
            "machine": facts,
            "parameters": params,
            "backends": {b: {"store": r.facts.get("store"), "figures": r.figures, "notes": r.notes}
                         for b, r in results.items()},
            "units": {m.key: m.unit or "count" for m in METRICS},
            "skipped": skipped,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
