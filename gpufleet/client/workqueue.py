"""A rate-limited work queue for controllers, with client-go's workqueue semantics on asyncio.

The guarantees controllers are built on:
* an item is never queued twice: adding one that is already waiting does nothing;
* an item is never processed by two workers at once: adding one that is being processed
  marks it dirty, and done() puts it back so the change is not lost;
* failures back off per item (exponentially) and overall (a token bucket), so one broken
  object cannot starve the rest nor hammer the API server.
Items must be hashable (controllers use "namespace/name" keys).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections import deque
from collections.abc import Hashable
from typing import Protocol

from gpufleet.utils.clock import REAL_CLOCK, Clock


class ShutDown(Exception):
    """get() on a queue that was shut down and has nothing left."""


class RateLimiter(Protocol):
    def when(self, item: Hashable) -> float:
        """Seconds to wait before the item may be retried; counts a failure."""

    def forget(self, item: Hashable) -> None:
        """The item succeeded (or was given up on): stop tracking its failures."""

    def num_requeues(self, item: Hashable) -> int: ...


class ItemExponentialFailureRateLimiter:
    """base * 2**failures per item, capped at max_delay."""

    def __init__(self, base_delay: float = 0.005, max_delay: float = 1000.0) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        failures = self._failures.get(item, 0)
        self._failures[item] = failures + 1
        # Past 2**60 the float would only overflow toward the cap anyway.
        if failures > 60:
            return self.max_delay
        return min(self.base_delay * (2**failures), self.max_delay)

    def forget(self, item: Hashable) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        return self._failures.get(item, 0)


class BucketRateLimiter:
    """A token bucket shared by all items: ``qps`` refill, ``burst`` capacity. Each call
    reserves a token and answers how long until that token exists (golang's rate.Limiter)."""

    def __init__(self, qps: float = 10.0, burst: int = 100, clock: Clock = REAL_CLOCK) -> None:
        self.qps = qps
        self.burst = burst
        self.clock = clock
        self._tokens = float(burst)
        self._last = clock.monotonic()

    def when(self, item: Hashable) -> float:
        now = self.clock.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self.qps

    def forget(self, item: Hashable) -> None:
        return None

    def num_requeues(self, item: Hashable) -> int:
        return 0


class MaxOfRateLimiter:
    """The longest wait any of the limiters asks for."""

    def __init__(self, *limiters: RateLimiter) -> None:
        self.limiters = limiters

    def when(self, item: Hashable) -> float:
        return max(limiter.when(item) for limiter in self.limiters)

    def forget(self, item: Hashable) -> None:
        for limiter in self.limiters:
            limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        return max(limiter.num_requeues(item) for limiter in self.limiters)


def default_controller_rate_limiter(clock: Clock = REAL_CLOCK) -> RateLimiter:
    """client-go's DefaultControllerRateLimiter: 5 ms doubling to 1000 s per item, and at
    most 10 retries a second overall with bursts of 100."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0),
        BucketRateLimiter(10.0, 100, clock),
    )


class WorkQueue:
    """add / add_after / add_rate_limited, then ``item = await get()`` ... ``done(item)``."""

    def __init__(
        self,
        name: str = "",
        *,
        clock: Clock = REAL_CLOCK,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        self.name = name
        self.clock = clock
        self.rate_limiter = rate_limiter or default_controller_rate_limiter(clock)
        self._queue: deque[Hashable] = deque()
        # Items that need processing: queued ones, plus processing ones changed meanwhile.
        self._dirty: set[Hashable] = set()
        self._processing: set[Hashable] = set()
        self._shutting_down = False
        self._not_empty = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        # Delayed adds: a heap of (ready_at, seq, item); _waiting has each item's earliest
        # ready_at so a later, longer add_after of the same item does not postpone it.
        self._heap: list[tuple[float, int, Hashable]] = []
        self._waiting: dict[Hashable, float] = {}
        self._seq = itertools.count()
        self._timer: asyncio.Task[None] | None = None
        self._timer_wake = asyncio.Event()

    # -- the basic queue ----------------------------------------------------------------

    def add(self, item: Hashable) -> None:
        if self._shutting_down or item in self._dirty:
            return
        self._dirty.add(item)
        if item in self._processing:
            return
        self._queue.append(item)
        self._not_empty.set()

    async def get(self) -> Hashable:
        """The next item, waiting for one; raises ShutDown once shut down and drained."""
        while not self._queue:
            if self._shutting_down:
                raise ShutDown(self.name)
            # Clearing only while empty is safe: set() has already woken every waiter.
            self._not_empty.clear()
            await self._not_empty.wait()
        item = self._queue.popleft()
        self._processing.add(item)
        self._dirty.discard(item)
        self._idle.clear()
        return item

    def done(self, item: Hashable) -> None:
        """Processing of ``item`` finished; if it was added meanwhile, it is queued again."""
        self._processing.discard(item)
        if item in self._dirty:
            self._queue.append(item)
            self._not_empty.set()
        if not self._processing:
            self._idle.set()

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def processing(self) -> int:
        return len(self._processing)

    @property
    def waiting(self) -> int:
        """Items scheduled by add_after / add_rate_limited and not yet due."""
        return len(self._waiting)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def shutdown(self) -> None:
        """Stop accepting items; workers drain what is queued, then get() raises ShutDown.
        Delayed items not yet due are dropped."""
        self._shutting_down = True
        self._not_empty.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()
        self._waiting.clear()

    async def shutdown_with_drain(self) -> None:
        """shutdown(), then wait until every item being processed is done()."""
        self.shutdown()
        await self._idle.wait()

    def __aiter__(self) -> WorkQueue:
        return self

    async def __anext__(self) -> Hashable:
        try:
            return await self.get()
        except ShutDown:
            raise StopAsyncIteration from None

    # -- delays ---------------------------------------------------------------------------

    def add_after(self, item: Hashable, delay: float) -> None:
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(item)
            return
        ready_at = self.clock.monotonic() + delay
        current = self._waiting.get(item)
        if current is not None and current <= ready_at:
            return
        self._waiting[item] = ready_at
        heapq.heappush(self._heap, (ready_at, next(self._seq), item))
        if self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(
                self._run_timer(), name=f"workqueue:{self.name}:timer"
            )
        self._timer_wake.set()

    async def _run_timer(self) -> None:
        while not self._shutting_down:
            if not self._heap:
                self._timer_wake.clear()
                await self._timer_wake.wait()
                continue
            ready_at, _, item = self._heap[0]
            if self._waiting.get(item) != ready_at:
                heapq.heappop(self._heap)  # superseded by an earlier add_after
                continue
            remaining = ready_at - self.clock.monotonic()
            # Sub-nanosecond leftovers are float noise from summed delays, not time to wait.
            if remaining <= 1e-9:
                heapq.heappop(self._heap)
                del self._waiting[item]
                self.add(item)
                continue
            # Sleep on the clock (virtual time in replays) but wake early when an item due
            # sooner is added.
            self._timer_wake.clear()
            sleeper = asyncio.ensure_future(self.clock.sleep(remaining))
            waker = asyncio.ensure_future(self._timer_wake.wait())
            try:
                await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for fut in (sleeper, waker):
                    if not fut.done():
                        fut.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await fut

    # -- rate limiting ----------------------------------------------------------------------

    def add_rate_limited(self, item: Hashable) -> None:
        """Add after the rate limiter's delay for this item (one more failure counted)."""
        if self._shutting_down:
            return
        self.add_after(item, self.rate_limiter.when(item))

    def forget(self, item: Hashable) -> None:
        """Reset the item's failure count (call after it succeeded)."""
        self.rate_limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        return self.rate_limiter.num_requeues(item)
