"""Test helpers for the client tests (a module with a unique name: a bare `import conftest`
would clash with other test folders' conftest modules)."""

from __future__ import annotations

import asyncio


class ManualClock:
    """Virtual time that moves only on advance(); sleepers wake when it passes their deadline.

    Unlike FakeClock (whose sleep() moves time itself), this lets a test observe that
    something has *not* happened yet.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._wall = start
        self._mono = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._wall + self._mono

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self._mono + seconds, fut)
        self._sleepers.append(entry)
        try:
            await fut
        finally:
            if entry in self._sleepers:
                self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        self._mono += seconds
        for deadline, fut in list(self._sleepers):
            if deadline <= self._mono + 1e-9 and not fut.done():
                fut.set_result(None)


async def settle(rounds: int = 20) -> None:
    """Let every ready task run until things stop moving."""
    for _ in range(rounds):
        await asyncio.sleep(0)
