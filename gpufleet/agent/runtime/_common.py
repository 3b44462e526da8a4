"""Small pieces every runtime shares."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
from collections.abc import Awaitable

from gpufleet.utils.clock import Clock


async def within(fut: Awaitable[object], clock: Clock, seconds: float) -> bool:
    """Whether ``fut`` finishes within ``seconds`` of the clock's time. ``fut`` is left
    running either way, so the caller decides what happens to it."""
    fut = asyncio.ensure_future(fut)
    if fut.done():
        return True
    if seconds <= 0:
        return False
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({fut, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await timer
    return fut.done()


def exit_code(returncode: int) -> int:
    """A shell's view of a wait status: killed by signal N is 128+N (137 for SIGKILL)."""
    return 128 - returncode if returncode < 0 else returncode


def signal_name(code: int) -> str:
    if code > 128:
        with contextlib.suppress(ValueError):
            return signal.Signals(code - 128).name
    return ""


def terminated_reason(code: int, oom: bool = False) -> str:
    if oom and code != 0:
        return "OOMKilled"
    return "Completed" if code == 0 else "Error"


def safe_name(part: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]", "_", part)
    return s if s not in ("", ".", "..") else "_"
