"""What the process runtime knows of each container and sandbox it runs: the processes
(by pid and start time, with a pidfd where the kernel has them) and their records."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.agent.runtime import monitor as mon
from gpufleet.agent.runtime.base import (
    ContainerHandle,
    ContainerState,
)
from gpufleet.agent.runtime.cgroups import Cgroup
from gpufleet.agent.runtime.sandbox import (
    Identity,
)
from gpufleet.utils.clock import Clock

log = logging.getLogger(__name__)

class _Pid:
    """A process known by pid and start time, with a pidfd where the kernel has them."""

    def __init__(self, pid: int | None, start: int | None) -> None:
        self.pid = pid
        self.start = start
        self.fd: int | None = None
        if pid is not None and start is not None:
            with contextlib.suppress(OSError, AttributeError):
                fd = os.pidfd_open(pid)
                # The pidfd names whatever has the pid now: it is ours only if the start
                # time still matches once it is open.
                if mon.start_time(pid) == start:
                    self.fd = fd
                else:
                    os.close(fd)

    def alive(self) -> bool:
        if self.pid is None or self.start is None:
            return False
        if self.fd is not None:
            readable, _, _ = select.select([self.fd], [], [], 0)
            if readable:
                return False
        return mon.start_time(self.pid) == self.start

    def signal(self, sig: int) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.fd, sig)
            return
        if self.alive():
            with contextlib.suppress(OSError):
                os.kill(self.pid, sig)  # type: ignore[arg-type]

    async def wait(self, clock: Clock) -> None:
        if self.fd is not None:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            fd = self.fd

            def ready() -> None:
                if not fut.done():
                    fut.set_result(None)

            loop.add_reader(fd, ready)
            try:
                if not self.alive():
                    return
                await fut
            finally:
                loop.remove_reader(fd)
            return
        # No pidfd (before Linux 5.3): look now and then.
        while True:
            if not self.alive():
                return
            await asyncio.sleep(0.2)

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


@dataclass(eq=False)
class _Ctr:
    handle: ContainerHandle
    dir: Path
    info: dict
    env: dict[str, str]
    cgroup: Cgroup | None
    main: _Pid
    sandbox: _Pid
    monitor: _Pid
    sandboxed: bool
    ident: Identity
    memory_limit: int | None = None
    started_mono: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    final: ContainerState | None = None
    watcher: asyncio.Task[None] | None = None
    stopping: bool = False
    last_cpu: tuple[float, float] | None = None  # (cpu seconds, monotonic time)

    @property
    def started_at(self) -> float | None:
        return self.info.get("started_at")

    def close(self) -> None:
        for p in (self.main, self.sandbox, self.monitor):
            p.close()


@dataclass
class _Sandbox:
    id: str
    dir: Path
    record: dict
