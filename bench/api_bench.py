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

All servers run at once and the phases alternate between them: the sequential ones (create,
get, list) request by request, the loaded ones (concurrent writes, churn with a watch) in turns
of a few seconds, one backend at a time. A burst of other work on the machine then lands on
every backend alike, and the ratio column stays meaningful on a shared machine.

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
from gpufleet.client.kubeconfig import transport_from_kubeconfig

if __package__:
    from ._pg import PostgresUnavailable, die_with_parent, throwaway_postgres
else:
    from _pg import PostgresUnavailable, die_with_parent, throwaway_postgres

NAMESPACE = "default"
TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
BACKENDS = ("sqlite", "postgres")

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


def pod_names(n: int) -> list[str]:
    return [f"train-{i:05d}" for i in range(n)]


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
    Metric("create_client_cpu", "  CPU per create: client", "ms/op"),
    Metric("create_server_cpu", "  CPU per create: API server", "ms/op"),
    Metric("create_store_cpu", "  CPU per create: PostgreSQL", "ms/op"),
    Metric("concurrent_rate", "writes/s, {writers} concurrent writers", "/s"),
    Metric("concurrent_p50", "  write p50 under that load", "ms"),
    Metric("concurrent_p99", "  write p99 under that load", "ms"),
    Metric("get_p50", "get p50", "ms"),
    Metric("get_p99", "get p99", "ms"),
    Metric("get_client_cpu", "  CPU per get: client", "ms/op"),
    Metric("get_server_cpu", "  CPU per get: API server", "ms/op"),
    Metric("get_store_cpu", "  CPU per get: PostgreSQL", "ms/op"),
    Metric("list_p50", "list {objects} (typed) p50", "ms"),
    Metric("list_p99", "list {objects} (typed) p99", "ms"),
    Metric("list_raw_p50", "list {objects} (JSON dicts) p50", "ms"),
    Metric("list_raw_p99", "list {objects} (JSON dicts) p99", "ms"),
    Metric("list_table_p50", "list {objects} (Table) p50", "ms"),
    Metric("list_table_p99", "list {objects} (Table) p99", "ms"),
    Metric("list_server_cpu", "  CPU per list (of the 3): API server", "ms/op"),
    Metric("list_store_cpu", "  CPU per list (of the 3): PostgreSQL", "ms/op"),
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


# --- the servers under test ------------------------------------------------------------------


_LISTENING = re.compile(rb"API server listening on (https?://\S+)")


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


class CpuMeter:
    """CPU seconds used so far by a backend's processes (the API server and, for PostgreSQL,
    the postmaster with its backends), to tell where a request's time goes on a machine where
    client, server and database share the same few cores."""

    def __init__(self, server_pid: int, store_pid: int | None) -> None:
        self._server = psutil.Process(server_pid)
        self._store = psutil.Process(store_pid) if store_pid else None

    def _store_seconds(self) -> float | None:
        if self._store is None:
            return None
        t = self._store.cpu_times()
        # Backends that already exited were reaped by the postmaster: their time is in children_*.
        total = t.user + t.system + t.children_user + t.children_system
        for child in self._store.children():
            with contextlib.suppress(psutil.Error):
                c = child.cpu_times()
                total += c.user + c.system
        return total

    def sample(self) -> tuple[float, float | None]:
        server = self._server.cpu_times()
        return server.user + server.system, self._store_seconds()


@dataclass
class Target:
    """One backend under test: its server, a client of its own and what was measured on it."""

    backend: str
    store: str
    url: str
    server_pid: int
    store_pid: int | None
    # The kubeconfig `gpufleet server` wrote (TLS CA and admin token).
    kubeconfig: Path | None = None
    client: Client = field(init=False)
    cpu: CpuMeter = field(init=False)
    figures: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: int = 0
    # CPU time of the benchmark's own thread spent inside timed calls: the client's share of a
    # request, exact while one request runs at a time.
    client_cpu: float = 0.0
    _seq: int = 0

    def __post_init__(self) -> None:
        transport = transport_from_kubeconfig(self.kubeconfig) if self.kubeconfig else HttpTransport(self.url)
        self.client = Client(transport, read_retries=1)
        self.cpu = CpuMeter(self.server_pid, self.store_pid)

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def fail(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        if self.errors <= 5:
            self.notes.append(f"{what} failed: {type(exc).__name__}: {exc}")

    async def timed(self, call: Callable[[], Awaitable[Any]], into: list[float], missing_ok: bool = False) -> Any:
        c0, t = time.thread_time(), perf()
        try:
            out = await call()
        except NotFound as exc:
            if not missing_ok:
                self.fail("a request for an object the benchmark wrote", exc)
            return None
        except Exception as exc:
            self.fail("a request", exc)
            return None
        into.append(perf() - t)
        self.client_cpu += time.thread_time() - c0
        return out


class CpuWindow:
    """Per-request CPU of client, API server and PostgreSQL over one sequential phase."""

    def __init__(self, t: Target) -> None:
        self.t = t
        self.client0 = t.client_cpu
        self.server0, self.store0 = t.cpu.sample()

    def per_op_ms(self, ops: int, prefix: str) -> dict[str, float | None]:
        ops = max(ops, 1)
        server, store = self.t.cpu.sample()
        return {
            f"{prefix}_client_cpu": (self.t.client_cpu - self.client0) * 1000 / ops,
            f"{prefix}_server_cpu": (server - self.server0) * 1000 / ops,
            f"{prefix}_store_cpu": None if store is None or self.store0 is None
            else (store - self.store0) * 1000 / ops,
        }


# --- the phases ------------------------------------------------------------------------------


async def warm_up(t: Target) -> None:
    # The first requests pay for the connection, lazy imports and caches on both sides.
    c = t.client
    await c.create(make_pod("warmup", 0))
    for _ in range(20):
        await c.get("pods", "warmup", NAMESPACE)
        await c.patch("pods", "warmup", annotation_patch(t.next_seq()), NAMESPACE)
    await c.list("pods", NAMESPACE)
    await c.delete("pods", "warmup", NAMESPACE)


async def create(targets: list[Target], args: argparse.Namespace) -> None:
    lat: dict[str, list[float]] = {t.backend: [] for t in targets}
    windows = [CpuWindow(t) for t in targets]
    for i, name in enumerate(pod_names(args.objects)):
        for t in targets:
            await t.timed(lambda t=t, name=name, i=i: t.client.create(make_pod(name, i)), lat[t.backend])
    for t, w in zip(targets, windows, strict=True):
        ms = lat[t.backend]
        # Requests alternate between backends, so a backend's own time is the sum of its
        # latencies, not the wall time.
        t.figures.update(create_p50=pct(ms, 50), create_p99=pct(ms, 99),
                         create_rate=len(ms) / sum(ms) if ms else None,
                         **w.per_op_ms(len(ms), "create"))


async def get(targets: list[Target], args: argparse.Namespace, rng: random.Random) -> None:
    names = pod_names(args.objects)
    lat: dict[str, list[float]] = {t.backend: [] for t in targets}
    windows = [CpuWindow(t) for t in targets]
    for _ in range(args.objects):
        name = rng.choice(names)
        for t in targets:
            await t.timed(lambda t=t, name=name: t.client.get("pods", name, NAMESPACE), lat[t.backend])
    for t, w in zip(targets, windows, strict=True):
        ms = lat[t.backend]
        t.figures.update(get_p50=pct(ms, 50), get_p99=pct(ms, 99), **w.per_op_ms(len(ms), "get"))


async def list_all(targets: list[Target], args: argparse.Namespace) -> None:
    kinds = ("typed", "raw", "table")
    lat = {(t.backend, k): [] for t in targets for k in kinds}
    counts: dict[str, set[int]] = {t.backend: set() for t in targets}
    windows = [CpuWindow(t) for t in targets]

    def call(t: Target, kind: str) -> Callable[[], Awaitable[int]]:
        async def typed() -> int:
            return len(await t.client.list("pods", NAMESPACE))

        async def raw() -> int:
            return len(await t.client.list("pods", NAMESPACE, raw=True))

        async def table() -> int:
            resp = await t.client.raw_request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods",
                                              headers={"accept": TABLE_ACCEPT})
            return len(json.loads(resp.body).get("rows") or [])

        return {"typed": typed, "raw": raw, "table": table}[kind]

    for _ in range(args.lists):
        for kind in kinds:
            for t in targets:
                n = await t.timed(call(t, kind), lat[t.backend, kind])
                counts[t.backend].add(-1 if n is None else n)
    for t, w in zip(targets, windows, strict=True):
        if counts[t.backend] != {args.objects}:
            t.notes.append(f"lists returned {sorted(counts[t.backend])} items, expected {args.objects}")
        cpu = w.per_op_ms(args.lists * len(kinds), "list")
        t.figures.update(list_p50=pct(lat[t.backend, "typed"], 50), list_p99=pct(lat[t.backend, "typed"], 99),
                         list_raw_p50=pct(lat[t.backend, "raw"], 50), list_raw_p99=pct(lat[t.backend, "raw"], 99),
                         list_table_p50=pct(lat[t.backend, "table"], 50),
                         list_table_p99=pct(lat[t.backend, "table"], 99),
                         list_server_cpu=cpu["list_server_cpu"], list_store_cpu=cpu["list_store_cpu"])


class ConcurrentWrites:
    """`writers` tasks, each patching its own share of the pods back to back."""

    def __init__(self, t: Target, args: argparse.Namespace) -> None:
        self.t = t
        self.args = args
        self.lat: list[float] = []
        self.elapsed = 0.0
        self.done = [0] * args.writers

    async def run_slice(self, seconds: float) -> None:
        t, names, writers = self.t, pod_names(self.args.objects), self.args.writers
        deadline = perf() + seconds

        async def writer(w: int) -> None:
            mine = names[w::writers]
            while perf() < deadline:
                patch = annotation_patch(t.next_seq())
                name = mine[self.done[w] % len(mine)]
                await t.timed(lambda n=name, p=patch: t.client.patch("pods", n, p, NAMESPACE), self.lat)
                self.done[w] += 1

        t0 = perf()
        await asyncio.gather(*(writer(w) for w in range(writers)))
        self.elapsed += perf() - t0

    def finish(self) -> None:
        self.t.figures.update(concurrent_rate=len(self.lat) / self.elapsed if self.elapsed else None,
                              concurrent_p50=pct(self.lat, 50), concurrent_p99=pct(self.lat, 99))


class Churn:
    """Open-loop churn at a fixed rate (updates, creates, deletes of pods) with a watch open:
    how long from sending a write until its event reaches the watcher, and what a reader sees
    meanwhile."""

    def __init__(self, t: Target, args: argparse.Namespace) -> None:
        self.t = t
        self.args = args
        # Same seed everywhere: every backend gets the same sequence of operations.
        self.rng = random.Random(args.seed)
        self.live = pod_names(args.objects)
        self.created = 0
        self.sent: dict[int, float] = {}
        self.arrived: dict[int, float] = {}
        self.arrival = asyncio.Event()
        self.write_lat: list[float] = []
        self.get_lat: list[float] = []
        self.elapsed = 0.0
        self._watch: asyncio.Task[None] | None = None

    async def open_watch(self) -> None:
        c = self.t.client
        start_rv = (await c.list("pods", NAMESPACE, limit=1)).resource_version

        async def watcher() -> None:
            async for ev in c.watch("pods", NAMESPACE, resource_version=start_rv):
                if ev.type != "BOOKMARK":
                    self.arrived[int(ev.resource_version)] = perf()
                    self.arrival.set()

        self._watch = asyncio.create_task(watcher())
        # The watch is open, and caught up, once the event of a write made now arrives.
        marker = await c.patch("pods", self.live[0], annotation_patch(self.t.next_seq()), NAMESPACE)
        marker_rv = _rv(marker)
        await _wait_for(lambda: marker_rv in self.arrived, self.arrival, within=30, what="the watch to open")

    async def close_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch

    async def _write(self, kind: str, name: str, body: Any) -> None:
        c, t0 = self.t.client, perf()
        try:
            if kind == "create":
                out = await c.create(body)
            elif kind == "delete":
                out = await c.delete("pods", name, NAMESPACE)
            else:
                out = await c.patch("pods", name, body, NAMESPACE)
        except NotFound:
            # An update raced a delete of the same pod: an answer, not a failure.
            return
        except Exception as exc:
            self.t.fail(f"churn {kind}", exc)
            return
        self.write_lat.append(perf() - t0)
        rv = _rv(out)
        if rv:
            self.sent[rv] = t0
        else:
            self.t.notes.append(f"churn {kind} answer carried no resourceVersion")

    async def _probe(self, stop: asyncio.Event) -> None:
        c, period = self.t.client, 1 / self.args.probe_rate
        while not stop.is_set():
            name = self.rng.choice(self.live)
            # A pod deleted by the churn since it was picked is an answer, not an error.
            await self.t.timed(lambda name=name: c.get("pods", name, NAMESPACE), self.get_lat, missing_ok=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)

    async def run_slice(self, seconds: float) -> None:
        rate, rng, live = self.args.churn_rate, self.rng, self.live
        stop = asyncio.Event()
        probe = asyncio.create_task(self._probe(stop))
        writes: list[asyncio.Task[None]] = []
        t0 = perf()
        for k in range(round(rate * seconds)):
            delay = t0 + k / rate - perf()
            if delay > 0:
                await asyncio.sleep(delay)
            roll = rng.random()
            if roll < 0.1 or len(live) < 2:
                name = f"churn-{self.created:05d}"
                self.created += 1
                live.append(name)
                job = self._write("create", name, make_pod(name, self.args.objects + self.created))
            elif roll < 0.2:
                job = self._write("delete", live.pop(rng.randrange(len(live))), None)
            else:
                job = self._write("update", rng.choice(live), annotation_patch(self.t.next_seq()))
            writes.append(asyncio.create_task(job))
        # The slice lasts its full length even when the last write went out early.
        delay = t0 + seconds - perf()
        if delay > 0:
            await asyncio.sleep(delay)
        await asyncio.gather(*writes)
        self.elapsed += perf() - t0
        stop.set()
        await probe
        # Let the watch catch up before the next slice, so a late event is counted here and
        # does not load another backend's slice.
        with contextlib.suppress(TimeoutError):
            await _wait_for(lambda: all(rv in self.arrived for rv in self.sent), self.arrival, within=10, what="")

    def finish(self) -> None:
        delivery = [self.arrived[rv] - sent_at for rv, sent_at in self.sent.items() if rv in self.arrived]
        missed = sum(1 for rv in self.sent if rv not in self.arrived)
        if missed:
            self.t.notes.append(f"{missed} of {len(self.sent)} churn writes never showed up on the watch")
        self.t.figures.update(
            churn_rate=len(self.write_lat) / self.elapsed if self.elapsed else None,
            churn_write_p50=pct(self.write_lat, 50), churn_write_p99=pct(self.write_lat, 99),
            watch_p50=pct(delivery, 50), watch_p99=pct(delivery, 99),
            churn_get_p50=pct(self.get_lat, 50), churn_get_p99=pct(self.get_lat, 99),
            watch_missed=float(missed))


def slices(total: float, length: float) -> list[float]:
    """`total` seconds cut into slices of about `length` (at least one)."""
    n = max(1, round(total / length))
    return [total / n] * n


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
            raise TimeoutError(f"timed out waiting for {what}" if what else None)
        event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), min(left, 0.5))


async def measure(targets: list[Target], args: argparse.Namespace) -> None:
    async def step(label: str, run: Callable[[], Awaitable[None]]) -> None:
        t0 = perf()
        await run()
        print(f"  {label:<46} {perf() - t0:6.1f} s", flush=True)

    async def concurrent() -> None:
        phases = [ConcurrentWrites(t, args) for t in targets]
        for length in slices(args.concurrent_duration, args.slice):
            for p in phases:
                await p.run_slice(length)
        for p in phases:
            p.finish()

    async def churn() -> None:
        phases = [Churn(t, args) for t in targets]
        try:
            for p in phases:
                await p.open_watch()
            for length in slices(args.duration, args.slice):
                for p in phases:
                    await p.run_slice(length)
        finally:
            for p in phases:
                await p.close_watch()
        for p in phases:
            p.finish()

    try:
        for t in targets:
            await warm_up(t)
        each = "+".join(t.backend for t in targets)
        await step(f"create ({each}, request by request)", lambda: create(targets, args))
        await step(f"get ({each}, request by request)", lambda: get(targets, args, random.Random(args.seed)))
        await step(f"list ({each}, request by request)", lambda: list_all(targets, args))
        await step(f"concurrent writes ({each}, in turns)", concurrent)
        await step(f"churn + watch ({each}, in turns)", churn)
    finally:
        for t in targets:
            await t.client.close()
    for t in targets:
        t.figures["errors"] = float(t.errors)


def start_targets(stack: contextlib.ExitStack, backends: list[str], args: argparse.Namespace,
                  workdir: Path, skipped: dict[str, str]) -> list[Target]:
    targets = []
    for backend in backends:
        state_dir = Path(tempfile.mkdtemp(prefix=f"gpufleet-bench-{backend}-", dir=workdir))
        stack.callback(shutil.rmtree, state_dir, True)
        store_pid = None
        if backend == "sqlite":
            store_url = f"sqlite:///{state_dir / 'state.db'}"
            store = f"SQLite {sqlite3.sqlite_version}, WAL, synchronous=FULL (the store's default)"
        else:
            try:
                pg = stack.enter_context(throwaway_postgres(durable=not args.pg_no_fsync))
            except PostgresUnavailable as exc:
                skipped[backend] = str(exc).splitlines()[0]
                print(f"  {backend}: skipped: {skipped[backend]}", flush=True)
                continue
            store_url, store_pid = pg.create_database("bench"), pg.pid
            s = pg.show("server_version", "fsync", "synchronous_commit", "full_page_writes", "shared_buffers")
            store = (f"PostgreSQL {s['server_version'].split()[0]}, fsync={s['fsync']}, "
                     f"synchronous_commit={s['synchronous_commit']}, "
                     f"full_page_writes={s['full_page_writes']}, shared_buffers={s['shared_buffers']}")
        url, pid = stack.enter_context(api_server(store_url, state_dir))
        print(f"  {backend:<8} {store}; API server at {url}", flush=True)
        targets.append(Target(backend=backend, store=store, url=url, server_pid=pid, store_pid=store_pid,
                              kubeconfig=state_dir / "kubeconfig"))
    return targets


# --- the report ------------------------------------------------------------------------------


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit in ("", "/s"):
        return f"{value:.0f}"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def render_table(targets: list[Target], args: argparse.Namespace) -> str:
    by = {t.backend: t for t in targets}
    show_ratio = "sqlite" in by and "postgres" in by
    rows = [["metric", "unit", *by] + (["pg/sqlite"] if show_ratio else [])]
    for m in METRICS:
        row = [m.label.format(writers=args.writers, objects=args.objects), m.unit or "count"]
        row += [_fmt(t.figures.get(m.key), m.unit) for t in targets]
        if show_ratio:
            a, b = by["sqlite"].figures.get(m.key), by["postgres"].figures.get(m.key)
            row.append(f"{b / a:.2f}" if a and b is not None and m.unit else "")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1])]
        cells += [c.rjust(w) for c, w in zip(r[2:], widths[2:], strict=True)]
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
    p.add_argument("--slice", type=float, default=2.5,
                   help="seconds a loaded phase runs on one backend before the next takes its turn")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()),
                   help="where the databases live (a tmpfs here would hide the cost of flushing)")
    p.add_argument("--pg-no-fsync", action="store_true",
                   help="run PostgreSQL without durability, as the tests do")
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in args.backends if b not in BACKENDS]
    if unknown or not args.backends:
        p.error(f"--backends: choose among {', '.join(BACKENDS)}")
    if args.objects < args.writers:
        p.error("--objects must be at least --writers")
    return args


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the servers and temporary directories go too.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    workdir = args.workdir.resolve()
    facts = machine_facts(workdir)
    print("gpufleet API benchmark")
    for k, v in facts.items():
        print(f"  {k:<22} {v}")
    params = {"objects": args.objects, "churn_rate": args.churn_rate, "duration_s": args.duration,
              "writers": args.writers, "concurrent_duration_s": args.concurrent_duration,
              "lists": args.lists, "probe_rate": args.probe_rate, "slice_s": args.slice, "seed": args.seed}
    print("  parameters             " + ", ".join(f"{k}={v}" for k, v in params.items()))
    print("  client                 gpufleet.client.Client over HttpTransport (httpx, HTTP/1.1 keep-alive), "
          "typed models unless noted")
    print("  server                 `gpufleet server --no-controllers`, one process per backend, 127.0.0.1\n",
          flush=True)

    skipped: dict[str, str] = {}
    try:
        with contextlib.ExitStack() as stack:
            targets = start_targets(stack, args.backends, args, workdir, skipped)
            if not targets:
                print("nothing to measure", file=sys.stderr)
                return 1
            asyncio.run(measure(targets, args))
    except KeyboardInterrupt:
        # Requests cut off mid-connect leave coroutines that warn at exit; they mean nothing here.
        warnings.filterwarnings("ignore", category=RuntimeWarning)
        print("\ninterrupted; servers stopped and temporary files removed", file=sys.stderr)
        return 130

    facts["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print()
    print(render_table(targets, args))
    print()
    for t in targets:
        print(f"{t.backend}: {t.store}")
        for note in t.notes:
            print(f"  note: {note}")
    for backend, why in skipped.items():
        print(f"{backend}: skipped ({why})")
    print(f"load average at end: {facts['load average at end']}")
    if len(targets) > 1:
        print("ratio = postgres / sqlite: above 1 means PostgreSQL takes longer (ms), costs more (ms/op) "
              "or does more (/s).")

    if args.json:
        doc = {
            "machine": facts,
            "parameters": params,
            "backends": {t.backend: {"store": t.store, "figures": t.figures, "notes": t.notes} for t in targets},
            "units": {m.key: m.unit or "count" for m in METRICS},
            "skipped": skipped,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
