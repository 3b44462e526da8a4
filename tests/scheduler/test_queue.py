"""SchedulingQueue: order, back-off, and moving unschedulable pods back."""

from __future__ import annotations

import asyncio

import pytest
from sched_factories import pod_info

from gpufleet.scheduler.plugins.queuesort import PrioritySort
from gpufleet.scheduler.queue import (
    ACTIVE,
    BACKOFF,
    GATED,
    UNSCHEDULABLE,
    QueueClosed,
    SchedulingQueue,
)
from gpufleet.utils.clock import FakeClock


def make_queue(**kwargs) -> tuple[SchedulingQueue, FakeClock]:
    clock = FakeClock()
    return SchedulingQueue(PrioritySort().less, clock=clock, **kwargs), clock


def drain(queue: SchedulingQueue) -> list[str]:
    out = []
    while (qpi := queue.pop_nowait()) is not None:
        out.append(qpi.pod_info.name)
    return out


def fail(queue: SchedulingQueue, qpi, *plugins: str) -> None:
    qpi.unschedulable_plugins = set(plugins)
    queue.add_unschedulable_if_not_present(qpi, queue.scheduling_cycle)


class TestOrder:
    def test_priority_then_age(self):
        queue, _ = make_queue()
        queue.add(pod_info("old-low", priority=0, created=100))
        queue.add(pod_info("new-high", priority=100, created=300))
        queue.add(pod_info("young-low", priority=0, created=200))
        queue.add(pod_info("old-high", priority=100, created=50))
        assert drain(queue) == ["old-high", "new-high", "old-low", "young-low"]

    def test_arrival_order_without_timestamps(self):
        queue, clock = make_queue()
        for name in ("a", "b", "c"):
            queue.add(pod_info(name))
            clock.advance(1)
        assert drain(queue) == ["a", "b", "c"]

    def test_a_pod_is_queued_once(self):
        queue, _ = make_queue()
        p = pod_info("a")
        queue.add(p)
        queue.add(p)
        assert len(queue) == 1

    def test_priority_change_reorders(self):
        queue, _ = make_queue()
        queue.add(pod_info("a", uid="a", created=1))
        queue.add(pod_info("b", uid="b", created=2))
        queue.update(pod_info("b", uid="b", created=2, priority=10))
        assert drain(queue) == ["b", "a"]

    def test_delete(self):
        queue, _ = make_queue()
        p = pod_info("a")
        queue.add(p)
        queue.delete(p)
        assert drain(queue) == [] and len(queue) == 0

    async def test_pop_waits_for_a_pod(self):
        queue, _ = make_queue()
        waiter = asyncio.ensure_future(queue.pop())
        await asyncio.sleep(0)
        assert not waiter.done()
        queue.add(pod_info("a"))
        assert (await waiter).pod_info.name == "a"
        assert (await asyncio.wait_for(asyncio.shield(waiter), 1)).attempts == 1

    async def test_closing_wakes_pop(self):
        queue, _ = make_queue()
        waiter = asyncio.ensure_future(queue.pop())
        await asyncio.sleep(0)
        queue.close()
        with pytest.raises(QueueClosed):
            await waiter


class TestBackoff:
    def test_doubles_from_one_to_ten_seconds(self):
        queue, _ = make_queue()
        queue.add(pod_info("a"))
        qpi = queue.pop_nowait()
        durations = []
        for attempts in range(1, 7):
            qpi.attempts = attempts
            durations.append(queue.backoff_duration(qpi))
        assert durations == [1, 2, 4, 8, 10, 10]

    def test_errors_back_off_then_return(self):
        queue, clock = make_queue()
        queue.add(pod_info("a"))
        qpi = queue.pop_nowait()
        queue.requeue_after_error(qpi)
        assert queue.where(qpi.key) == BACKOFF
        clock.advance(0.5)
        assert queue.flush_backoff_completed() == 0
        clock.advance(0.6)
        assert queue.flush_backoff_completed() == 1
        assert queue.where(qpi.key) == ACTIVE
        assert queue.pop_nowait().attempts == 2

    def test_second_failure_waits_longer(self):
        queue, clock = make_queue()
        queue.add(pod_info("a"))
        for _ in range(2):
            qpi = queue.pop_nowait()
            queue.requeue_after_error(qpi)
            clock.advance(queue.backoff_duration(qpi) + 0.01)
            queue.flush_backoff_completed()
        assert queue.backoff_duration(qpi) == 2


class TestUnschedulable:
    def test_waits_for_an_event_its_plugins_care_about(self):
        queue, clock = make_queue()
        queue.add(pod_info("a"))
        qpi = queue.pop_nowait()
        fail(queue, qpi, "NodeResourcesFit")
        assert queue.where(qpi.key) == UNSCHEDULABLE
        clock.advance(60)
        assert queue.move_all_to_active_or_backoff({"TaintToleration"}) == 0
        assert queue.move_all_to_active_or_backoff({"NodeResourcesFit", "GPUTopology"}) == 1
        assert queue.where(qpi.key) == ACTIVE

    def test_moved_while_backing_off_goes_to_backoff(self):
        queue, clock = make_queue()
        queue.add(pod_info("a"))
        qpi = queue.pop_nowait()
        fail(queue, qpi, "NodeResourcesFit")
        queue.move_all_to_active_or_backoff(None)
        assert queue.where(qpi.key) == BACKOFF
        clock.advance(1.1)
        queue.flush_backoff_completed()
        assert queue.where(qpi.key) == ACTIVE

    def test_event_during_the_cycle_is_not_lost(self):
        queue, _ = make_queue()
        queue.add(pod_info("a"))
        qpi = queue.pop_nowait()
        cycle = queue.scheduling_cycle
        queue.move_all_to_active_or_backoff(None)  # a node was added meanwhile
        qpi.unschedulable_plugins = {"NodeResourcesFit"}
        queue.add_unschedulable_if_not_present(qpi, cycle)
        assert queue.where(qpi.key) == BACKOFF

    def test_left_over_pods_are_retried_eventually(self):
        queue, clock = make_queue(max_unschedulable_seconds=300)
        queue.add(pod_info("a"))
        qpi = queue.pop_nowait()
        fail(queue, qpi, "NodeAffinity")
        clock.advance(299)
        assert queue.flush_unschedulable_left_over() == 0
        clock.advance(2)
        assert queue.flush_unschedulable_left_over() == 1
        assert queue.where(qpi.key) == ACTIVE

    def test_a_relevant_update_retries_at_once(self):
        queue, clock = make_queue()
        queue.add(pod_info("a", uid="a"))
        qpi = queue.pop_nowait()
        fail(queue, qpi, "TaintToleration")
        clock.advance(30)
        # A status-only change (our own condition write) leaves it waiting...
        queue.update(pod_info("a", uid="a", phase="Pending"))
        assert queue.where("a") == UNSCHEDULABLE
        # ...a new toleration does not.
        queue.update(pod_info("a", uid="a", tolerations=[{"key": "gpu", "operator": "Exists"}]))
        assert queue.where("a") == ACTIVE
        assert queue.pop_nowait().pod_info.tolerations == (("gpu", "Exists", "", ""),)


class TestPopFromBackoff:
    """While activeQ is empty, a rejected pod in backoffQ is popped without waiting out its
    back-off (kube-scheduler's SchedulerPopFromBackoffQ); one that failed with an error is not."""

    def test_an_idle_queue_pops_a_rejected_pod_backing_off(self):
        queue, _ = make_queue()
        queue.add(pod_info("a", uid="a"))
        fail(queue, queue.pop_nowait(), "NodeResourcesFit")
        queue.move_all_to_active_or_backoff({"NodeResourcesFit"})  # room freed, 0 s later
        assert queue.where("a") == BACKOFF
        qpi = queue.pop_nowait()
        assert qpi is not None and qpi.pod_info.name == "a" and qpi.attempts == 2
        assert queue.where("a") is None and len(queue) == 0
        # Its back-off entry is gone with it: nothing is flushed back later.
        assert queue.flush_backoff_completed() == 0

    def test_active_pods_go_first_then_the_earliest_back_off(self):
        queue, clock = make_queue()
        for name in ("early", "late"):
            queue.add(pod_info(name, uid=name))
            fail(queue, queue.pop_nowait(), "NodeResourcesFit")
            clock.advance(0.1)
        queue.move_all_to_active_or_backoff(None)
        queue.add(pod_info("new", uid="new"))
        assert queue.pending() == {ACTIVE: 1, BACKOFF: 2, UNSCHEDULABLE: 0, GATED: 0}
        assert drain(queue) == ["new", "early", "late"]

    def test_an_error_waits_out_its_back_off(self):
        queue, clock = make_queue()
        queue.add(pod_info("a", uid="a"))
        queue.requeue_after_error(queue.pop_nowait())
        assert queue.where("a") == BACKOFF
        assert queue.pop_nowait() is None
        clock.advance(1.1)
        assert queue.flush_backoff_completed() == 1
        assert queue.pop_nowait().pod_info.name == "a"

    def test_a_pod_flushed_from_backoff_is_popped_once(self):
        queue, clock = make_queue()
        queue.add(pod_info("a", uid="a"))
        fail(queue, queue.pop_nowait(), "NodeResourcesFit")
        queue.move_all_to_active_or_backoff(None)
        clock.advance(1.1)
        assert queue.flush_backoff_completed() == 1
        assert drain(queue) == ["a"]

    async def test_a_waiting_pop_wakes_for_a_rejected_pod_moved_to_backoff(self):
        queue, _ = make_queue()
        queue.add(pod_info("a", uid="a"))
        fail(queue, queue.pop_nowait(), "NodeResourcesFit")
        waiter = asyncio.ensure_future(queue.pop())
        await asyncio.sleep(0)
        assert not waiter.done()
        queue.move_all_to_active_or_backoff(None)
        assert (await asyncio.wait_for(waiter, 1)).pod_info.name == "a"


class TestGates:
    def test_gated_pods_wait_until_ungated(self):
        queue, _ = make_queue(pre_enqueue=lambda p: not p.pod.spec.scheduling_gates)
        queue.add(pod_info("g", uid="g", scheduling_gates=["quota"]))
        assert queue.where("g") == GATED
        assert queue.pending() == {ACTIVE: 0, BACKOFF: 0, UNSCHEDULABLE: 0, GATED: 1}
        assert queue.move_all_to_active_or_backoff(None) == 0
        queue.update(pod_info("g", uid="g"))
        assert queue.where("g") == ACTIVE


def test_activate_skips_the_wait():
    queue, _ = make_queue()
    p = pod_info("a", uid="a")
    queue.add(p)
    fail(queue, queue.pop_nowait(), "Gang")
    queue.activate([p])
    assert queue.where("a") == ACTIVE
