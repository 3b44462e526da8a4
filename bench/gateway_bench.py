"""Gateway benchmark: what the gateway adds to a request, and how fast serving scales.

    .venv/bin/python bench/gateway_bench.py [--requests 2000] [--concurrency 32] [--duration 5]
                                            [--skip-scale]

Part 1, overhead. The real `gpufleet up` (no agent) runs in its own process with its gateway;
a plain aiohttp backend (answers 200 with a small JSON body, no work) runs in another; a
selector-less Service's Endpoints point at it. This process then measures, in one run,
alternating in turns so a burst of other load on the machine lands on both alike:
  - sequential requests (one at a time): p50 / p99 latency direct and through the gateway;
    the difference is the latency the gateway adds;
  - throughput: ``--concurrency`` requests in flight for ``--duration`` s: requests/s direct
    and through the gateway.

Part 2, load step to Ready. `gpufleet up` with its node agent (process runtime) runs
examples/serving (a PyTorch model server; HPA on the gateway's requests_per_second, 5 per
pod wanted, 1..4 replicas), with up's default HPA sync (15 s, --hpa-sync-period), once with
the HPA's rate watch on (--hpa-rate-watch 1, the default) and once off (0), in one run. At 2 req/s for a few seconds, then a step to
20 req/s: printed are the times from the step to the HPA's first rescale, to the first new
replica Ready, and to 4 replicas Ready; then the requests that failed (should be 0).

Figures are printed, never asserted: they depend on the machine and what else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from load import Load  # noqa: E402

from gpufleet.client.api import Client  # noqa: E402
from gpufleet.client.kubeconfig import transport_from_kubeconfig  # noqa: E402

_GATEWAY = re.compile(r"Gateway listening on (\S+)")
BACKEND = """
import sys
from aiohttp import web
async def ok(request):
    await request.read()
    return web.json_response({"ok": True})
app = web.Application()
app.router.add_route("*", "/{tail:.*}", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


class Up:
    """`gpufleet up` in a subprocess; its gateway URL and kubeconfig."""

    def __init__(self, *args: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gpufleet-gw-bench-"))
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.gateway = ""

    def __enter__(self) -> Up:
        env = dict(os.environ, HOME=str(self.root), PYTHONUNBUFFERED="1")
        env.pop("KUBECONFIG", None)
        self.log = open(self.root / "server.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.cli.main", "up", "--state-dir", str(self.root / "state"),
             "--port", "0", "--gateway-port", "0", *self.args],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, start_new_session=True, cwd=ROOT)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, lines), daemon=True).start()
        deadline = time.monotonic() + 90
        while not self.gateway:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None or time.monotonic() > deadline:
                raise SystemExit(f"gpufleet up did not start; see {self.root / 'server.log'}")
            m = _GATEWAY.search(line)
            if m:
                self.gateway = m.group(1)
        return self

    @property
    def kubeconfig(self) -> Path:
        return self.root / "state" / "kubeconfig"

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def _sequential(session: aiohttp.ClientSession, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        async with session.post(url, data=b'{"inputs": []}') as resp:
            await resp.read()
            assert resp.status == 200, resp.status
        out.append(time.perf_counter() - t)
    return out


async def _throughput(session: aiohttp.ClientSession, url: str, concurrency: int, seconds: float) -> tuple[int, int]:
    done = errors = 0
    end = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done, errors
        while time.perf_counter() < end:
            try:
                async with session.post(url, data=b'{"inputs": []}') as resp:
                    await resp.read()
                    if resp.status == 200:
                        done += 1
                    else:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done, errors


async def overhead(args: argparse.Namespace) -> None:
    port = _free_port()
    backend = await asyncio.create_subprocess_exec(sys.executable, "-c", BACKEND, str(port), start_new_session=True)
    try:
        with Up("--no-agent") as up:
            client = Client(transport_from_kubeconfig(up.kubeconfig))
            await client.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": "default"},
                                 "spec": {"ports": [{"name": "http", "port": 80}]}}, "default", raw=True)
            await client.create({"apiVersion": "v1", "kind": "Endpoints",
                                 "metadata": {"name": "echo", "namespace": "default"},
                                 "subsets": [{"addresses": [{"ip": "127.0.0.1", "targetRef": {
                                     "kind": "Pod", "namespace": "default", "name": "echo-0"}}],
                                              "ports": [{"name": "http", "port": port}]}]}, "default", raw=True)
            await client.close()
            direct = f"http://127.0.0.1:{port}/predict"
            via = f"{up.gateway}/services/default/echo/predict"
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                deadline = time.monotonic() + 15
                while True:
                    try:
                        await _sequential(session, via, 1)
                        await _sequential(session, direct, 1)
                        break
                    except (AssertionError, aiohttp.ClientError):
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.2)
                await _sequential(session, via, 100)  # warm-up
                await _sequential(session, direct, 100)
                lat = {"direct": [], "gateway": []}
                turns = 10
                for _ in range(turns):
                    lat["direct"] += await _sequential(session, direct, args.requests // turns)
                    lat["gateway"] += await _sequential(session, via, args.requests // turns)
                rps = {"direct": [0, 0, 0.0], "gateway": [0, 0, 0.0]}
                for _ in range(4):
                    for name, url in (("direct", direct), ("gateway", via)):
                        done, errors = await _throughput(session, url, args.concurrency, args.duration / 4)
                        rps[name][0] += done
                        rps[name][1] += errors
                        rps[name][2] += args.duration / 4
        print(f"\n== gateway overhead ({args.requests} sequential requests each; "
              f"{args.concurrency} concurrent for {args.duration:g}s each) ==")
        print(f"{'':10s} {'p50 ms':>8s} {'p99 ms':>8s} {'req/s':>9s} {'errors':>7s}")
        for name in ("direct", "gateway"):
            done, errors, secs = rps[name]
            print(f"{name:10s} {_pct(lat[name], .5) * 1000:8.3f} {_pct(lat[name], .99) * 1000:8.3f} "
                  f"{done / secs:9.0f} {errors:7d}")
        print(f"{'added':10s} {(_pct(lat['gateway'], .5) - _pct(lat['direct'], .5)) * 1000:8.3f} "
              f"{(_pct(lat['gateway'], .99) - _pct(lat['direct'], .99)) * 1000:8.3f} "
              f"{rps['gateway'][0] / rps['gateway'][2] / max(rps['direct'][0] / rps['direct'][2], 1e-9):8.2f}x")
    finally:
        os.killpg(backend.pid, signal.SIGTERM)
        await backend.wait()


async def scale_step(args: argparse.Namespace, rate_watch: str) -> None:
    example = ROOT / "examples" / "serving"
    text = (example / "model.yaml").read_text().replace("__PYTHON__", sys.executable).replace("__DIR__", str(example))
    docs = [d for d in yaml.safe_load_all(text) if d]
    for d in docs:
        if d["kind"] == "HorizontalPodAutoscaler":
            d["spec"]["minReplicas"] = 1
    with Up("--hpa-sync-period", str(args.hpa_sync_period), "--hpa-rate-watch", rate_watch) as up:
        client = Client(transport_from_kubeconfig(up.kubeconfig))
        try:
            for d in docs:
                await client.create(d, d["metadata"].get("namespace"), raw=True)

            async def ready() -> set[str]:
                pods = await client.list("pods", "serving", label_selector={"app": "classifier"}, raw=True)
                return {p["metadata"]["name"] for p in pods.items if not p["metadata"].get("deletionTimestamp")
                        and any(c.get("type") == "Ready" and c.get("status") == "True"
                                for c in (p.get("status") or {}).get("conditions") or [])}

            while not await ready():  # noqa: ASYNC110 (polling the API)
                await asyncio.sleep(0.2)
            url = f"{up.gateway}/services/serving/classifier/predict"
            async with Load(url) as load:
                load.rate = 2
                await asyncio.sleep(args.warmup)
                before = await ready()
                load.rate = 20
                step = time.monotonic()
                rescaled = first = full = None
                while full is None and time.monotonic() - step < 120:
                    dep = await client.get("deployments", "classifier", "serving", raw=True)
                    if rescaled is None and dep["spec"]["replicas"] > 1:
                        rescaled = time.monotonic() - step
                    now_ready = await ready()
                    if first is None and now_ready - before:
                        first = time.monotonic() - step
                    if len(now_ready) >= 4:
                        full = time.monotonic() - step
                    await asyncio.sleep(0.1)
                load.rate = 0
                await load.drain()
            failures = load.report.failures
            print(f"\n== load step 2 -> 20 req/s (HPA: 5 req/s per pod, 1..4 replicas, sync {args.hpa_sync_period:g} s, "
                  f"rate watch {rate_watch} s) ==")
            print(f"step -> HPA rescaled:           {rescaled:.2f}s" if rescaled else "step -> HPA rescaled: -")
            print(f"step -> first new replica Ready: {first:.2f}s" if first else "step -> first new replica Ready: -")
            print(f"step -> 4 replicas Ready:        {full:.2f}s" if full else "step -> 4 replicas Ready: -")
            print(f"requests {len(load.report.results)}, failed {len(failures)}, "
                  f"p50 {load.report.percentile(.5) * 1000:.1f} ms, p99 {load.report.percentile(.99) * 1000:.1f} ms")
        finally:
            with contextlib.suppress(Exception):
                await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds at 2 req/s before the step")
    ap.add_argument("--skip-scale", action="store_true", help="only part 1 (no model, no torch)")
    ap.add_argument("--skip-overhead", action="store_true", help="only part 2")
    ap.add_argument("--hpa-sync-period", type=float, default=15.0, help="gpufleet up's --hpa-sync-period "
                    "(its default: 15)")
    ap.add_argument("--rate-watch", default="1,0", help="gpufleet up's --hpa-rate-watch values, one step each "
                    "(1: the default; 0: periodic syncs only)")
    args = ap.parse_args()
    if not args.skip_overhead:
        asyncio.run(overhead(args))
    if not args.skip_scale:
        for rate_watch in args.rate_watch.split(","):
            asyncio.run(scale_step(args, rate_watch.strip()))


if __name__ == "__main__":
    main()
