"""A uvicorn server run as a task of the current event loop, so one process can host an HTTP
server next to its other work (the API server in `gpufleet up`, the agent's HTTP endpoints)."""

from __future__ import annotations

import asyncio

import uvicorn

from gpufleet.utils.tlsbuffer import use_small_tls_buffers


class ServerTask:
    """Serves ``config`` as a task: start() returns once it listens (or raises why it could
    not), stop() asks it to finish and cancels it after ``stop_timeout`` seconds."""

    def __init__(self, config: uvicorn.Config, *, what: str, task_name: str | None = None,
                 stop_timeout: float = 5.0) -> None:
        self.config = config
        use_small_tls_buffers()  # 32 KiB per TLS connection rather than asyncio's 256
        self.server = uvicorn.Server(config)
        self._task: asyncio.Task | None = None
        self._what = what
        self._task_name = task_name
        self._stop_timeout = stop_timeout

    async def start(self) -> None:
        self.server.config.setup_event_loop = lambda: None  # type: ignore[method-assign]
        self._task = asyncio.create_task(self.server.serve(), name=self._task_name)
        while not self.server.started:
            if self._task.done():
                self._task.result()  # re-raise a bind failure
                raise RuntimeError(f"{self._what} stopped while starting")
            await asyncio.sleep(0.01)

    @property
    def port(self) -> int:
        for s in self.server.servers:
            for sock in s.sockets:
                return sock.getsockname()[1]
        return self.config.port

    async def stop(self) -> None:
        self.server.should_exit = True
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=self._stop_timeout)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
