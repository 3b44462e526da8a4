"""Injected time. Logic never calls time.time(): it asks a Clock, so the scheduler, the
controllers and the simulated runtime can run in virtual time (trace replay, tests)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class FakeClock:
    """A clock that moves only when told to (tests, virtual-time replay)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._mono = 0.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._mono += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)


class VirtualClock:
    """Virtual time that jumps to the next event (trace replay).

    ``sleep()`` waits, without taking real time, until the clock reaches its deadline; the
    clock moves only in ``run()``: once every task on the event loop is blocked (nothing is
    ready to run), it jumps straight to the earliest deadline any sleeper waits for and wakes
    the sleepers due then. So a component that waits for a timer, a watch event or a request
    behaves as in real time, and months of quiet between two events cost nothing.

    Only sleeps on this clock count as events: real-time timers (asyncio.sleep) and threads
    are not waited for, so everything driven by it must keep its time on the clock.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._start = start
        self._now = start
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self.jumps = 0  # how many times run() moved the clock

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now - self._start

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # At least the next representable time: a sleep shorter than the clock's resolution
        # would otherwise wake at the same instant and be slept again, forever.
        deadline = max(self._now + seconds, math.nextafter(self._now, math.inf))
        heapq.heappush(self._timers, (deadline, next(self._seq), fut))
        await fut

    def next_deadline(self) -> float | None:
        """The earliest deadline a sleeper still waits for."""
        timers = self._timers
        while timers and timers[0][2].done():  # cancelled sleeps are dropped here
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def advance_to(self, when: float) -> None:
        """Move the clock to ``when`` (never back) and wake every sleeper due by then."""
        self._now = max(self._now, when)
        timers = self._timers
        while timers and timers[0][0] <= self._now:
            fut = heapq.heappop(timers)[2]
            if not fut.done():
                fut.set_result(None)

    async def settle(self, rounds: int = 3) -> None:
        """Return once the event loop has had nothing else to run for ``rounds`` turns."""
        loop = asyncio.get_running_loop()
        ready = getattr(loop, "_ready", None)  # asyncio's run queue (BaseEventLoop)
        quiet = 0
        turns = 0
        while quiet < rounds:
            await asyncio.sleep(0)
            turns += 1
            if ready is None:
                quiet = turns // 20  # no view of the run queue: give it plenty of turns
            elif len(ready) == 0:
                quiet += 1
            else:
                quiet = 0

    async def run(self, done: Callable[[], bool], until: float | None = None) -> bool:
        """Jump from event to event until ``done()`` (True) or, with nothing left to wait
        for or past ``until``, False."""
        while True:
            await self.settle()
            if done():
                return True
            deadline = self.next_deadline()
            if deadline is None or (until is not None and deadline > until):
                return False
            self.jumps += 1
            self.advance_to(deadline)


def rfc3339(ts: float, micro: bool = False) -> str:
    """Kubernetes' wire form of a time: '2024-05-01T12:00:00Z' (MicroTime keeps 6 digits)."""
    dt = datetime.fromtimestamp(ts, tz=UTC)
    if micro:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


REAL_CLOCK = RealClock()
