"""Load generator: open-loop requests at a rate that steps up and down.

    .venv/bin/python bench/load.py --url http://127.0.0.1:8080/services/serving/classifier/predict \
        --steps 2:10,20:30,0:40 [--method POST] [--body '{"inputs": ...}'] [--timeout 60]

``--steps rate:seconds,...``: each step sends ``rate`` requests per second (evenly spaced,
whether or not earlier ones have answered: open loop, as real clients behave) for
``seconds``. Every second it prints the rate sent, answers, failures, in-flight and the
p50/p99 latency of that second; at the end, the totals.

``run_load`` is the same thing as a coroutine, for tests and other benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp


@dataclass
class Result:
    start: float  # monotonic
    latency: float
    status: int  # 0 for a transport error
    error: str = ""
    body: bytes = b""


@dataclass
class LoadReport:
    results: list[Result] = field(default_factory=list)

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if r.status == 0 or r.status >= 500 or r.status == 429]

    def percentile(self, q: float) -> float:
        lat = sorted(r.latency for r in self.results if r.status and r.status < 400)
        if not lat:
            return float("nan")
        return lat[min(len(lat) - 1, int(q * len(lat)))]


def parse_steps(text: str) -> list[tuple[float, float]]:
    steps = []
    for part in text.split(","):
        rate, _, seconds = part.partition(":")
        try:
            steps.append((float(rate), float(seconds)))
        except ValueError:
            raise ValueError(f"--steps: {part!r} is not rate:seconds (for example 20:30)") from None
    return steps


class Load:
    """Sends requests at ``rate`` per second until stopped; the rate may change any time."""

    def __init__(self, url: str, *, method: str = "POST", body: bytes | None = None, timeout: float = 60.0,
                 session: aiohttp.ClientSession | None = None,
                 on_result: Callable[[Result], None] | None = None) -> None:
        self.url = url
        self.method = method
        self.body = body
        self.timeout = timeout
        self.rate = 0.0
        self.report = LoadReport()
        self.on_result = on_result
        self._session = session
        self._own_session = session is None
        self._tasks: set[asyncio.Task] = set()
        self._runner: asyncio.Task | None = None
        self.in_flight = 0

    async def __aenter__(self) -> Load:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self._runner = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self, wait: bool = True) -> None:
        if self._runner is not None:
            self._runner.cancel()
            try:
                await self._runner
            except asyncio.CancelledError:
                pass
            self._runner = None
        if wait and self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def drain(self) -> None:
        """Wait for every request sent so far to be answered."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _run(self) -> None:
        next_at = time.monotonic()
        while True:
            if self.rate <= 0:
                await asyncio.sleep(0.05)
                next_at = time.monotonic()
                continue
            now = time.monotonic()
            if now < next_at:
                await asyncio.sleep(next_at - now)
                continue  # the rate may have changed meanwhile
            task = asyncio.create_task(self.one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            next_at += 1.0 / self.rate

    async def one(self) -> Result:
        assert self._session is not None
        start = time.monotonic()
        self.in_flight += 1
        try:
            async with self._session.request(self.method, self.url, data=self.body,
                                             timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                body = await resp.read()
                result = Result(start, time.monotonic() - start, resp.status, body=body[:200] if resp.status >= 400
                                else b"")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            result = Result(start, time.monotonic() - start, 0, f"{type(exc).__name__}: {exc}")
        finally:
            self.in_flight -= 1
        self.report.results.append(result)
        if self.on_result is not None:
            self.on_result(result)
        return result


async def run_load(url: str, steps: Sequence[tuple[float, float]], *, method: str = "POST",
                   body: bytes | None = None, request_timeout: float = 60.0,
                   verbose: bool = True) -> LoadReport:
    async with Load(url, method=method, body=body, timeout=request_timeout) as load:
        t0 = time.monotonic()
        for rate, seconds in steps:
            load.rate = rate
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                mark = len(load.report.results)
                await asyncio.sleep(min(1.0, end - time.monotonic()))
                if verbose:
                    window = load.report.results[mark:]
                    lat = sorted(r.latency for r in window if r.status and r.status < 400)
                    failed = sum(1 for r in window if r.status == 0 or r.status >= 500)
                    p50 = f"{lat[len(lat) // 2] * 1000:7.1f}" if lat else "      -"
                    p99 = f"{lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000:7.1f}" if lat else "      -"
                    print(f"t={time.monotonic() - t0:6.1f}s rate={rate:6.1f}/s answered={len(window):4d} "
                          f"failed={failed:3d} in-flight={load.in_flight:4d} p50={p50}ms p99={p99}ms", flush=True)
        load.rate = 0
        await load.drain()
        return load.report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--steps", default="2:10,20:30,0:30", help="rate:seconds,... (default %(default)s)")
    ap.add_argument("--method", default="POST")
    ap.add_argument("--body", default=None)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args(argv)
    try:
        steps = parse_steps(args.steps)
    except ValueError as exc:
        ap.error(str(exc))
    report = asyncio.run(run_load(args.url, steps, method=args.method,
                                  body=args.body.encode() if args.body else None, request_timeout=args.timeout))
    ok = [r for r in report.results if r.status and r.status < 400]
    print(f"\nrequests {len(report.results)}  answered 2xx/3xx {len(ok)}  failed {len(report.failures)}")
    if ok:
        lat = [r.latency * 1000 for r in ok]
        print(f"latency ms: p50 {statistics.median(lat):.1f}  p99 {report.percentile(0.99) * 1000:.1f}  "
              f"max {max(lat):.1f}")
    for r in report.failures[:10]:
        print(f"  failed: status {r.status} {r.error or r.body[:120]!r}")
    return 0 if not report.failures else 1


if __name__ == "__main__":
    sys.exit(main())
