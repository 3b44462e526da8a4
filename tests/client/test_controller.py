from __future__ import annotations

import asyncio
import logging

import pytest
from client_helpers import ManualClock, settle

from gpufleet.client.controller import (
    Controller,
    PermanentError,
    Requeue,
    TemporaryError,
    enqueue_object,
    enqueue_owner,
    owner_key,
)
from gpufleet.client.workqueue import WorkQueue


def pod(name: str, ns: str = "default", owner: dict | None = None) -> dict:
    meta: dict = {"name": name, "namespace": ns}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


async def test_outcomes_decide_what_happens_to_a_key(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    outcomes = {
        "ok": [None],
        "boom": [RuntimeError("bad"), RuntimeError("bad"), None],
        "temp": [TemporaryError("wait", delay=30), None],
        "perm": [PermanentError("never")],
        "again": [Requeue(after=10), None],
    }

    async def reconcile(key: str):
        calls.append(key)
        outcome = outcomes[key].pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    q = WorkQueue("t", clock=clock)
    ctrl = Controller("t", reconcile, q, workers=2)
    await ctrl.start()
    caplog.set_level(logging.INFO)
    for key in outcomes:
        ctrl.enqueue(key)
    await settle(50)
    assert sorted(calls) == ["again", "boom", "ok", "perm", "temp"]
    assert q.num_requeues("boom") == 1
    assert q.num_requeues("ok") == 0 and q.num_requeues("perm") == 0
    assert "reconcile failed" in caplog.text and "Traceback" in caplog.text

    clock.advance(0.005)  # first back-off for "boom"
    await settle(50)
    assert calls.count("boom") == 2 and q.num_requeues("boom") == 2
    clock.advance(0.01)
    await settle(50)
    assert calls.count("boom") == 3
    assert q.num_requeues("boom") == 0  # success forgets

    clock.advance(10)
    await settle(50)
    assert calls.count("again") == 2 and calls.count("temp") == 1
    clock.advance(20)
    await settle(50)
    assert calls.count("temp") == 2
    clock.advance(1000)
    await settle(50)
    assert calls.count("perm") == 1 and calls.count("ok") == 1
    await ctrl.stop()


async def test_one_bad_key_never_stops_the_loop(clock: ManualClock) -> None:
    done: list[str] = []

    async def reconcile(key: str) -> None:
        if key == "bad":
            raise ValueError("always")
        done.append(key)

    q = WorkQueue(clock=clock)
    ctrl = Controller("c", reconcile, q, workers=1)
    runner = asyncio.create_task(ctrl.run())
    for i in range(5):
        ctrl.enqueue("bad")
        ctrl.enqueue(f"good-{i}")
        clock.advance(1)
        await settle(30)
    assert done == [f"good-{i}" for i in range(5)]
    assert q.num_requeues("bad") >= 3
    q.shutdown()
    await asyncio.wait_for(runner, 1)


async def test_requeue_without_delay_uses_back_off(clock: ManualClock) -> None:
    calls = 0

    async def reconcile(key: str):
        nonlocal calls
        calls += 1
        return Requeue()

    q = WorkQueue(clock=clock)
    ctrl = Controller("r", reconcile, q)
    await ctrl.start()
    ctrl.enqueue("k")
    await settle(30)
    assert calls == 1
    clock.advance(0.005)
    await settle(30)
    assert calls == 2 and q.num_requeues("k") == 2
    await ctrl.stop()


async def test_stop_with_drain_finishes_in_flight_work(clock: ManualClock) -> None:
    release = asyncio.Event()
    finished: list[str] = []

    async def reconcile(key: str) -> None:
        await release.wait()
        finished.append(key)

    ctrl = Controller("d", reconcile, WorkQueue(clock=clock))
    await ctrl.start()
    ctrl.enqueue("k")
    await settle()
    stopping = asyncio.create_task(ctrl.stop(drain=True))
    await settle()
    assert not stopping.done()
    release.set()
    await asyncio.wait_for(stopping, 1)
    assert finished == ["k"]


def test_enqueue_helpers(clock: ManualClock) -> None:
    q = WorkQueue(clock=clock)
    enqueue_object(q, pod("a", "ns1"))
    enqueue_object(q, {"kind": "Node", "metadata": {"name": "n1"}})
    rs_ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "u", "controller": True}
    enqueue_owner(q, pod("b", "ns1", rs_ref))
    enqueue_owner(q, pod("c", "ns1", {**rs_ref, "controller": False}))  # not the controller
    enqueue_owner(q, pod("d", "ns1", rs_ref), kind="Job")  # wrong kind
    assert list(q._queue) == ["ns1/a", "n1", "ns1/web-1"]
    assert owner_key(pod("e", "ns2", rs_ref), kind="ReplicaSet", api_version="apps/v1") == "ns2/web-1"
    assert owner_key(pod("e")) is None


def test_enqueue_helpers_accept_models(clock: ManualClock) -> None:
    k8s = pytest.importorskip("gpufleet.api.k8s")
    q = WorkQueue(clock=clock)
    p = k8s.Pod.from_dict(
        pod(
            "m",
            "ns",
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": True},
        )
    )
    enqueue_object(q, p)
    enqueue_owner(q, p, kind="ReplicaSet")
    assert list(q._queue) == ["ns/m", "ns/rs"]


class FakeInformer:
    def __init__(self) -> None:
        self.handlers: dict = {}

    def add_event_handler(self, on_add=None, on_update=None, on_delete=None):
        self.handlers = {"add": on_add, "update": on_update, "delete": on_delete}


def test_watch_wires_informer_events_to_keys(clock: ManualClock) -> None:
    async def reconcile(key: str) -> None:
        return None

    ctrl = Controller("w", reconcile, WorkQueue(clock=clock))
    inf = FakeInformer()
    ctrl.watch(inf, owner_kind="ReplicaSet")
    ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "old", "uid": "1", "controller": True}
    new_ref = {**ref, "name": "new", "uid": "2"}
    inf.handlers["update"](pod("p", "ns", ref), pod("p", "ns", new_ref))
    assert sorted(ctrl.queue._queue) == ["ns/new", "ns/old"]
