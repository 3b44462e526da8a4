"""The scheduling loop: pending pods are scheduled back to back, not one per event-loop turn.

The loop shares its event loop with the API server and the controllers in `gpufleet up`
and `gpufleet server`; under a burst one turn of that loop takes tens of milliseconds, so
a loop that yields after every cycle places one pod per turn. These tests drive the real
loop (``Scheduler._run``) over a scheduler cache of real nodes, one turn at a time; the
bindings it starts are collected instead of run (there is no API server here).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from sched_factories import make_node, make_pod

from gpufleet.scheduler import Scheduler
from gpufleet.scheduler.snapshot import PodInfo


def scheduler_with(nodes: dict[str, int], pods: int, **kwargs) -> tuple[Scheduler, list[str], list[PodInfo]]:
    """A scheduler holding these nodes (name -> GPUs) and ``pods`` pending 1-GPU pods."""
    scheduler = Scheduler(None, **kwargs)
    for name, gpus in nodes.items():
        scheduler.cache.add_node(make_node(name, cpu="64", memory="256Gi", gpus=gpus))
    pending = [PodInfo(make_pod(f"p{i}", gpus=1, created=1_700_000_000 + i)) for i in range(pods)]
    for pod_info in pending:
        scheduler.queue.add(pod_info)
    started: list[str] = []

    def spawn(coro, name: str) -> asyncio.Future:
        started.append(name.split(":", 1)[0])
        coro.close()
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    scheduler._spawn = spawn  # type: ignore[method-assign]
    return scheduler, started, pending


@contextlib.asynccontextmanager
async def loop_of(scheduler: Scheduler) -> AsyncIterator[None]:
    task = asyncio.ensure_future(scheduler._run())
    try:
        yield
    finally:
        scheduler.queue.close()
        await asyncio.wait_for(task, 5)


async def one_turn() -> None:
    await asyncio.sleep(0)


async def test_a_burst_is_scheduled_in_one_turn_without_double_booking():
    scheduler, started, pending = scheduler_with({"a": 2, "b": 2}, pods=5)
    async with loop_of(scheduler):
        await one_turn()
        # All five cycles ran before the loop yielded: four pods placed, one rejected
        # because the four assumed before it hold every GPU.
        assert scheduler.stats["scheduled"] == 4
        assert scheduler.stats["unschedulable"] == 1
        assert started.count("bind") == 4 and started.count("report") == 1
        assert len(scheduler.queue) == 1
        placed = [scheduler.cache.get_pod(p) for p in pending]
        used = [(p.node_name, i) for p in placed if p is not None for i in p.gpu_indices]
        assert len(used) == 4 and len(set(used)) == 4


async def test_the_batch_is_bounded_then_the_loop_yields():
    scheduler, started, _ = scheduler_with({"a": 8}, pods=5, max_batch=2)
    async with loop_of(scheduler):
        await one_turn()
        assert scheduler.stats["scheduled"] == 2
        await one_turn()
        assert scheduler.stats["scheduled"] == 4
        await one_turn()
        assert scheduler.stats["scheduled"] == 5 and started == ["bind"] * 5


async def test_a_rejected_pod_is_retried_on_the_next_event_when_idle():
    # The first pod takes the only GPU; the second is rejected. When the first is deleted,
    # the second is moved back and, the queue being otherwise empty, retried at once
    # instead of after its back-off.
    scheduler, started, (p0, p1) = scheduler_with({"a": 1}, pods=2)
    async with loop_of(scheduler):
        await one_turn()
        assert started == ["bind", "report"]
        first = scheduler.cache.get_pod(p0)
        assert first is not None
        scheduler._on_pod_delete(first.pod)
        await one_turn()
        assert started == ["bind", "report", "bind"]
        second = scheduler.cache.get_pod(p1)
        assert second is not None and second.node_name == "a"

