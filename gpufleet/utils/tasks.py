"""Small asyncio helpers every component uses."""

from __future__ import annotations

import asyncio
import contextlib


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has ended; its cancellation
    is not raised here, so a component's stop() can go on with the rest of its clean-up."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
