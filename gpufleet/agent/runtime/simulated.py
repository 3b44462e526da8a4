"""A runtime that pretends: containers "run" for as long as their annotations say, on the
injected clock, so one process can stand in for thousands of nodes and a trace can be
replayed in virtual time.

A container is a few numbers (when it started, how long it lasts, how it ends); its
state is computed from them and the clock whenever asked, so there is no task per
container. Only wait() holds anything while it waits: one future, and one clock sleep
when the end is known.

Behaviour comes from the container's annotations:

    gpufleet.io/sim-start-delay      seconds start() takes (pulling, creating) before running
    gpufleet.io/sim-duration         seconds until the container exits; absent: runs until stopped
    gpufleet.io/sim-exit-code        its exit code when it ends by itself (default 0)
    gpufleet.io/sim-fail-start       start() fails with this message
    gpufleet.io/sim-fail-reason      ... and this waiting reason (e.g. ErrImagePull)
    gpufleet.io/sim-cpu-millis       what stats() reports while running
    gpufleet.io/sim-memory-bytes     same; above the memory limit the container is OOMKilled at once
    gpufleet.io/sim-ignore-sigterm   "true": stop() waits out the grace period, then exit 137
    gpufleet.io/sim-stop-exit-code   exit code when stopped within grace (default 143, as SIGTERM)
    gpufleet.io/sim-exec-exit-code   what exec() answers (default 0)
    gpufleet.io/sim-exec-fail-after  seconds after start from which exec() answers 1 (a liveness probe going bad)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from gpufleet.agent.runtime._common import terminated_reason
from gpufleet.agent.runtime.base import (
    CAPABILITIES,
    ContainerHandle,
    ContainerSpec,
    ContainerState,
    ContainerStats,
    HostSandboxMixin,
    RuntimeError_,
)
from gpufleet.agent.runtime.crilog import append_line
from gpufleet.utils.clock import REAL_CLOCK, Clock

PREFIX = "gpufleet.io/sim-"
START_DELAY = PREFIX + "start-delay"
DURATION = PREFIX + "duration"
EXIT_CODE = PREFIX + "exit-code"
FAIL_START = PREFIX + "fail-start"
FAIL_REASON = PREFIX + "fail-reason"
CPU_MILLIS = PREFIX + "cpu-millis"
MEMORY_BYTES = PREFIX + "memory-bytes"
IGNORE_SIGTERM = PREFIX + "ignore-sigterm"
STOP_EXIT_CODE = PREFIX + "stop-exit-code"
EXEC_EXIT_CODE = PREFIX + "exec-exit-code"
EXEC_FAIL_AFTER = PREFIX + "exec-fail-after"


def _number(ann: Mapping[str, str], key: str, default: float | None, problems: list[str]) -> float | None:
    raw = ann.get(key)
    if raw is None or raw == "":
        return default
    try:
        v = float(raw)
    except ValueError:
        problems.append(f"{key}={raw!r} is not a number")
        return default
    if v < 0:
        problems.append(f"{key}={raw!r} is negative")
        return default
    return v


def _integer(ann: Mapping[str, str], key: str, default: int, problems: list[str]) -> int:
    raw = ann.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        problems.append(f"{key}={raw!r} is not an integer")
        return default


class _Sim:
    __slots__ = (
        "handle",
        "log_path",
        "started_at",
        "duration",
        "exit_code",
        "reason",
        "stopped_at",
        "stop_code",
        "cpu_millis",
        "memory_bytes",
        "ignore_sigterm",
        "graceful_code",
        "exec_code",
        "exec_fail_after",
        "exit_logged",
        "waiters",
    )

    def __init__(self) -> None:
        self.stopped_at: float | None = None
        self.stop_code = 0
        self.exit_logged = False
        self.waiters: list[asyncio.Future[None]] | None = None

    def end(self) -> float | None:
        if self.stopped_at is not None:
            return self.stopped_at
        return None if self.duration is None else self.started_at + self.duration

    def state_at(self, now: float) -> ContainerState:
        if self.stopped_at is not None and (
            self.duration is None or self.stopped_at < self.started_at + self.duration
        ):
            code = self.stop_code
            return ContainerState("exited", code, self.started_at, self.stopped_at, terminated_reason(code))
        if self.duration is not None and now >= self.started_at + self.duration:
            return ContainerState(
                "exited",
                self.exit_code,
                self.started_at,
                self.started_at + self.duration,
                self.reason or terminated_reason(self.exit_code),
            )
        return ContainerState("running", started_at=self.started_at)

    def wake(self) -> None:
        for f in self.waiters or ():
            if not f.done():
                f.set_result(None)


class SimulatedRuntime(HostSandboxMixin):
    name = "simulated"
    # It pretends to honour everything a pod asks for.
    capabilities = frozenset(CAPABILITIES)

    def __init__(self, clock: Clock = REAL_CLOCK) -> None:
        self.clock = clock
        self._sims: dict[str, _Sim] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self._sims)

    async def start(self, spec: ContainerSpec) -> ContainerHandle:
        ann = spec.annotations
        problems: list[str] = []
        delay = _number(ann, START_DELAY, 0.0, problems) or 0.0
        duration = _number(ann, DURATION, None, problems)
        code = _integer(ann, EXIT_CODE, 0, problems)
        cpu = _number(ann, CPU_MILLIS, 0.0, problems) or 0.0
        mem = int(_number(ann, MEMORY_BYTES, 0.0, problems) or 0)
        graceful = _integer(ann, STOP_EXIT_CODE, 143, problems)
        exec_code = _integer(ann, EXEC_EXIT_CODE, 0, problems)
        exec_fail_after = _number(ann, EXEC_FAIL_AFTER, None, problems)
        if problems:
            raise RuntimeError_("bad simulation annotations: " + "; ".join(problems), "CreateContainerError")
        if delay > 0:
            await self.clock.sleep(delay)
        if FAIL_START in ann:
            raise RuntimeError_(ann[FAIL_START] or "simulated start failure", ann.get(FAIL_REASON, ""))

        self._seq += 1
        s = _Sim()
        s.handle = ContainerHandle(id=f"sim-{self._seq}")
        s.log_path = spec.log_path
        s.started_at = self.clock.now()
        s.duration = duration
        s.exit_code = code
        s.reason = ""
        s.cpu_millis = cpu
        s.memory_bytes = mem
        s.ignore_sigterm = ann.get(IGNORE_SIGTERM, "").lower() == "true"
        s.graceful_code = graceful
        s.exec_code = exec_code
        s.exec_fail_after = exec_fail_after
        if spec.memory_limit_bytes and mem > spec.memory_limit_bytes:
            s.duration, s.exit_code, s.reason = 0.0, 137, "OOMKilled"
        self._sims[s.handle.id] = s
        if s.log_path:
            append_line(s.log_path, s.started_at, "stdout", f"simulated container {spec.name} started")
        return s.handle

    def _observe(self, s: _Sim) -> ContainerState:
        st = s.state_at(self.clock.now())
        if st.state == "exited" and not s.exit_logged:
            s.exit_logged = True
            if s.log_path:
                append_line(
                    s.log_path,
                    st.finished_at or self.clock.now(),
                    "stdout",
                    f"simulated container exited with code {st.exit_code} ({st.reason})",
                )
        return st

    async def state(self, handle: ContainerHandle) -> ContainerState:
        s = self._sims.get(handle.id)
        if s is None:
            return ContainerState("unknown", message="no such container")
        return self._observe(s)

    async def wait(self, handle: ContainerHandle) -> ContainerState:
        loop = asyncio.get_running_loop()
        while True:
            s = self._sims.get(handle.id)
            if s is None:
                return ContainerState("unknown", message="no such container")
            st = self._observe(s)
            if st.state == "exited":
                return st
            # stop(), remove() and close() resolve this; the end of the run is the clock's.
            woken: asyncio.Future[None] = loop.create_future()
            if s.waiters is None:
                s.waiters = []
            s.waiters.append(woken)
            end = s.end()
            try:
                if end is None:
                    await woken
                else:
                    sleeper = asyncio.ensure_future(self.clock.sleep(max(0.0, end - self.clock.now())))
                    try:
                        await asyncio.wait({woken, sleeper}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        sleeper.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await sleeper
            finally:
                with contextlib.suppress(ValueError):
                    s.waiters.remove(woken)

    async def stop(self, handle: ContainerHandle, grace_seconds: float) -> ContainerState:
        s = self._sims.get(handle.id)
        if s is None:
            return ContainerState("unknown", message="no such container")
        st = self._observe(s)
        if st.state == "exited":
            return st
        if s.ignore_sigterm:
            await self.clock.sleep(grace_seconds)
            st = self._observe(s)
            if st.state == "exited":  # it finished by itself during the grace period
                return st
            s.stop_code = 137
        else:
            s.stop_code = s.graceful_code
        s.stopped_at = self.clock.now()
        s.wake()
        return self._observe(s)

    async def exec(
        self,
        handle: ContainerHandle,
        command: list[str],
        timeout: float,  # noqa: ASYNC109 - the signature is base.Runtime's
    ) -> tuple[int, str]:
        s = self._sims.get(handle.id)
        if s is None or s.state_at(self.clock.now()).state != "running":
            return -1, "container is not running"
        if s.exec_fail_after is not None and self.clock.now() - s.started_at >= s.exec_fail_after:
            return 1, "simulated failure"
        return s.exec_code, ""

    async def stats(self, handle: ContainerHandle) -> ContainerStats | None:
        s = self._sims.get(handle.id)
        if s is None or s.state_at(self.clock.now()).state != "running":
            return None
        return ContainerStats(cpu_millis=s.cpu_millis, memory_bytes=s.memory_bytes)

    async def remove(self, handle: ContainerHandle) -> None:
        s = self._sims.pop(handle.id, None)
        if s is not None:
            s.wake()

    async def close(self) -> None:
        sims = list(self._sims.values())
        self._sims.clear()
        for s in sims:
            s.wake()
