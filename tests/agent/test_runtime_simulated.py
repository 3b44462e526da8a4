"""The simulated runtime in virtual time."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpufleet.agent.runtime.base import ContainerHandle, ContainerSpec, RuntimeError_
from gpufleet.agent.runtime.crilog import read_cri_messages
from gpufleet.agent.runtime.simulated import SimulatedRuntime
from gpufleet.utils.clock import FakeClock, RealClock

T0 = 1_700_000_000.0


def make_spec(
    i: int = 0, log_path: str = "", memory_limit_bytes: int | None = None, **ann: str
) -> ContainerSpec:
    return ContainerSpec(
        pod_uid=f"uid-{i}",
        pod_name=f"pod-{i}",
        namespace="default",
        name="main",
        image="sim",
        command=[],
        args=[],
        env={},
        working_dir=None,
        log_path=log_path,
        memory_limit_bytes=memory_limit_bytes,
        annotations={f"gpufleet.io/sim-{k.replace('_', '-')}": v for k, v in ann.items()},
    )


@pytest.fixture
def clock():
    return FakeClock(start=T0)


@pytest.fixture
async def rt(clock):
    runtime = SimulatedRuntime(clock)
    yield runtime
    await runtime.close()


async def test_runs_for_its_duration_then_exits(rt, clock, tmp_path):
    log = str(tmp_path / "c.log")
    h = await rt.start(make_spec(duration="30", exit_code="3", log_path=log))
    st = await rt.state(h)
    assert (st.state, st.started_at) == ("running", T0)
    clock.advance(29.9)
    assert (await rt.state(h)).state == "running"
    clock.advance(0.1)
    st = await rt.state(h)
    assert (st.state, st.exit_code, st.reason, st.finished_at) == ("exited", 3, "Error", T0 + 30)
    msgs = read_cri_messages(log)
    assert msgs == ["simulated container main started", "simulated container exited with code 3 (Error)"]
    # Observing it again does not log it twice.
    await rt.state(h)
    assert len(read_cri_messages(log)) == 2


async def test_start_delay_on_the_clock(rt, clock):
    h = await rt.start(make_spec(start_delay="12.5", duration="10"))
    assert clock.now() == T0 + 12.5
    st = await rt.state(h)
    assert st.started_at == T0 + 12.5


async def test_wait_sleeps_on_the_clock_until_the_end(rt, clock):
    h = await rt.start(make_spec(duration="3600"))
    t0 = time.monotonic()
    st = await rt.wait(h)
    assert time.monotonic() - t0 < 1  # an hour of virtual time
    assert (st.exit_code, st.reason, st.finished_at) == (0, "Completed", T0 + 3600)
    assert clock.now() == T0 + 3600


async def test_a_container_without_duration_runs_until_stopped(rt, clock):
    h = await rt.start(make_spec(cpu_millis="1500", memory_bytes=str(2 << 30)))
    waiter = asyncio.create_task(rt.wait(h))
    clock.advance(86400)
    await asyncio.sleep(0)
    assert not waiter.done()
    stats = await rt.stats(h)
    assert stats is not None and (stats.cpu_millis, stats.memory_bytes) == (1500, 2 << 30)
    st = await rt.stop(h, grace_seconds=30)
    assert (st.state, st.exit_code, st.reason) == ("exited", 143, "Error")
    assert st.finished_at == T0 + 86400
    assert (await waiter).exit_code == 143
    assert await rt.stats(h) is None


async def test_stop_after_the_natural_end_keeps_the_natural_exit(rt, clock):
    h = await rt.start(make_spec(duration="5", exit_code="0"))
    clock.advance(10)
    st = await rt.stop(h, 30)
    assert (st.exit_code, st.reason, st.finished_at) == (0, "Completed", T0 + 5)


async def test_ignoring_sigterm_costs_the_grace_period(rt, clock):
    h = await rt.start(make_spec(ignore_sigterm="true"))
    st = await rt.stop(h, grace_seconds=30)
    assert (st.exit_code, st.finished_at) == (137, T0 + 30)


async def test_stop_wakes_a_waiter_on_a_real_clock():
    rt = SimulatedRuntime(RealClock())
    h = await rt.start(make_spec(duration="3600"))
    waiter = asyncio.create_task(rt.wait(h))
    await asyncio.sleep(0.01)
    await rt.stop(h, 1)
    st = await asyncio.wait_for(waiter, 2)
    assert st.exit_code == 143
    await rt.close()


async def test_fail_start_and_bad_annotations(rt, clock):
    with pytest.raises(RuntimeError_, match="image not found") as e:
        await rt.start(make_spec(fail_start="image not found", fail_reason="ErrImagePull", start_delay="2"))
    assert clock.now() == T0 + 2
    assert e.value.reason == "ErrImagePull"
    with pytest.raises(RuntimeError_) as e:
        await rt.start(make_spec(duration="soon", exit_code="x"))
    assert "sim-duration" in str(e.value) and "sim-exit-code" in str(e.value)


async def test_memory_above_the_limit_is_oomkilled(rt):
    h = await rt.start(make_spec(memory_bytes=str(2 << 30), memory_limit_bytes=1 << 30))
    st = await rt.state(h)
    assert (st.state, st.exit_code, st.reason) == ("exited", 137, "OOMKilled")


async def test_exec_answers_from_annotations(rt, clock):
    h = await rt.start(make_spec(exec_fail_after="60"))
    assert await rt.exec(h, ["true"], 1) == (0, "")
    clock.advance(60)
    assert (await rt.exec(h, ["true"], 1))[0] == 1
    h2 = await rt.start(make_spec(exec_exit_code="4", duration="1"))
    assert (await rt.exec(h2, ["x"], 1))[0] == 4
    clock.advance(1)
    assert (await rt.exec(h2, ["x"], 1))[0] == -1


async def test_remove_and_unknown(rt):
    h = await rt.start(make_spec())
    waiter = asyncio.create_task(rt.wait(h))
    await asyncio.sleep(0)
    await rt.remove(h)
    assert (await waiter).state == "unknown"
    assert (await rt.state(h)).state == "unknown"
    assert (await rt.state(ContainerHandle("nope"))).state == "unknown"


async def test_ten_thousand_containers_run_and_exit_in_virtual_time(rt, clock):
    n = 10_000
    specs = [make_spec(i, duration=str(60 + i % 600), exit_code=str(i % 2)) for i in range(n)]
    t0 = time.perf_counter()
    handles = [await rt.start(spec) for spec in specs]
    states = [await rt.state(h) for h in handles]
    assert all(s.state == "running" for s in states)
    clock.advance(700)
    states = [await rt.state(h) for h in handles]
    stats = [await rt.stats(h) for h in handles]
    elapsed = time.perf_counter() - t0
    assert all(s.state == "exited" for s in states)
    assert sum(s.exit_code for s in states) == n // 2
    assert all(s is None for s in stats)
    # Speed is bench/'s business (these machines are noisy); the figure is printed with -s.
    print(f"10,000 simulated containers started, run and exited in {elapsed:.3f} s")
    assert len(rt) == n


async def test_ten_thousand_waiters(rt, clock):
    n = 10_000
    handles = [await rt.start(make_spec(i, duration=str(1 + i % 100))) for i in range(n)]
    t0 = time.perf_counter()
    states = await asyncio.gather(*(rt.wait(h) for h in handles))
    assert time.perf_counter() - t0 < 5
    assert all(s.state == "exited" for s in states)
