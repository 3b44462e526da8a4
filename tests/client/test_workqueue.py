from __future__ import annotations

import asyncio

import pytest
from client_helpers import ManualClock, settle

from gpufleet.client.workqueue import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    ShutDown,
    WorkQueue,
    default_controller_rate_limiter,
)


async def test_add_deduplicates_queued_items(clock: ManualClock) -> None:
    q = WorkQueue(clock=clock)
    q.add("a")
    q.add("b")
    q.add("a")
    assert len(q) == 2
    assert await q.get() == "a"
    assert await q.get() == "b"
    assert len(q) == 0


async def test_item_added_while_processing_is_requeued_once_after_done(clock: ManualClock) -> None:
    q = WorkQueue(clock=clock)
    q.add("a")
    item = await q.get()
    q.add("a")
    q.add("a")
    # Not handed to a second worker while the first still holds it.
    assert len(q) == 0
    q.done(item)
    assert len(q) == 1
    assert await q.get() == "a"
    q.done("a")
    assert len(q) == 0


async def test_done_without_new_add_does_not_requeue(clock: ManualClock) -> None:
    q = WorkQueue(clock=clock)
    q.add("a")
    q.done(await q.get())
    assert len(q) == 0 and q.processing == 0


async def test_get_waits_for_an_item_and_workers_share(clock: ManualClock) -> None:
    q = WorkQueue(clock=clock)
    getters = [asyncio.create_task(q.get()) for _ in range(2)]
    await settle()
    assert not any(g.done() for g in getters)
    q.add("x")
    q.add("y")
    got = await asyncio.gather(*getters)
    assert sorted(got) == ["x", "y"]


def test_exponential_limiter_doubles_to_the_cap_and_forgets() -> None:
    rl = ItemExponentialFailureRateLimiter(0.005, 1.0)
    delays = [rl.when("a") for _ in range(10)]
    assert delays[:4] == [0.005, 0.01, 0.02, 0.04]
    assert delays[-1] == 1.0
    assert all(b >= a for a, b in zip(delays, delays[1:], strict=False))
    assert rl.num_requeues("a") == 10
    assert rl.when("b") == 0.005  # per item
    rl.forget("a")
    assert rl.num_requeues("a") == 0
    assert rl.when("a") == 0.005
    big = ItemExponentialFailureRateLimiter(0.005, 1000.0)
    for _ in range(200):
        last = big.when("x")
    assert last == 1000.0


def test_bucket_limiter_allows_a_burst_then_paces(clock: ManualClock) -> None:
    rl = BucketRateLimiter(qps=10, burst=100, clock=clock)
    assert all(rl.when(i) == 0.0 for i in range(100))
    assert rl.when("x") == pytest.approx(0.1)
    assert rl.when("y") == pytest.approx(0.2)
    clock.advance(1.0)  # refills 10 tokens, 2 of them already promised
    assert [rl.when(i) for i in range(8)] == [0.0] * 8
    assert rl.when("z") == pytest.approx(0.1)


def test_default_limiter_is_max_of_per_item_and_bucket(clock: ManualClock) -> None:
    rl = default_controller_rate_limiter(clock)
    assert isinstance(rl, MaxOfRateLimiter)
    assert rl.when("a") == 0.005
    assert rl.when("a") == 0.01
    assert rl.num_requeues("a") == 2
    rl.forget("a")
    assert rl.num_requeues("a") == 0


async def test_add_rate_limited_backs_off_per_item(clock: ManualClock) -> None:
    q = WorkQueue(clock=clock)
    waits = []
    for _ in range(4):
        q.add_rate_limited("k")
        await settle()
        assert len(q) == 0
        needed = 0.0
        while len(q) == 0:
            clock.advance(0.005)
            needed += 0.005
            await settle()
        waits.append(round(needed, 3))
        q.done(await q.get())
    assert waits == [0.005, 0.01, 0.02, 0.04]
    assert q.num_requeues("k") == 4
    q.forget("k")
    assert q.num_requeues("k") == 0


async def test_add_after_releases_items_in_due_order(clock: ManualClock) -> None:
    q = WorkQueue(clock=clock)
    q.add_after("late", 3)
    q.add_after("early", 1)
    q.add_after("middle", 2)
    await settle()
    assert len(q) == 0 and q.waiting == 3
    order = []
    for _ in range(3):
        clock.advance(1)
        await settle()
        assert len(q) == 1
        order.append(await q.get())
    assert order == ["early", "middle", "late"]


async def test_add_after_keeps_the_earliest_time_for_an_item(clock: ManualClock) -> None:
    q = WorkQueue(clock=clock)
    q.add_after("a", 5)
    q.add_after("a", 1)  # sooner wins
    q.add_after("a", 3)  # later is ignored
    clock.advance(1)
    await settle()
    assert len(q) == 1
    q.done(await q.get())
    clock.advance(10)
    await settle()
    assert len(q) == 0


async def test_add_after_zero_adds_now_and_real_clock_delays_fire() -> None:
    q = WorkQueue()
    q.add_after("now", 0)
    assert len(q) == 1
    q.add_after("soon", 0.02)
    assert await asyncio.wait_for(q.get(), 1) == "now"
    assert await asyncio.wait_for(q.get(), 1) == "soon"
    q.shutdown()


async def test_shutdown_drains_then_stops_getters(clock: ManualClock) -> None:
    q = WorkQueue(clock=clock)
    q.add("a")
    q.add_after("later", 1)
    q.shutdown()
    q.add("b")  # ignored once shutting down
    assert q.shutting_down
    assert await q.get() == "a"
    with pytest.raises(ShutDown):
        await q.get()
    clock.advance(5)
    await settle()
    assert len(q) == 0


async def test_shutdown_wakes_a_waiting_get_and_ends_iteration(clock: ManualClock) -> None:
    q = WorkQueue(clock=clock)
    waiter = asyncio.create_task(q.get())
    await settle()
    q.shutdown()
    with pytest.raises(ShutDown):
        await waiter
    assert [item async for item in q] == []


async def test_shutdown_with_drain_waits_for_processing(clock: ManualClock) -> None:
    q = WorkQueue(clock=clock)
    q.add("a")
    item = await q.get()
    drained = asyncio.create_task(q.shutdown_with_drain())
    await settle()
    assert not drained.done()
    q.done(item)
    await asyncio.wait_for(drained, 1)
