from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gpufleet.store.base import Store, open_store

MakeStore = Callable[..., Awaitable[Store]]


@pytest.fixture
async def make_store(store_url: str) -> AsyncIterator[MakeStore]:
    """Opens and starts store instances on the test's store; closes the ones still open at the
    end. Several instances on one URL stand for several API server processes."""
    opened: list[Store] = []

    async def make(url: str | None = None, **kwargs: Any) -> Store:
        s = open_store(url or store_url, **kwargs)
        await s.start()
        opened.append(s)
        return s

    yield make
    for s in opened:
        await s.close()


@pytest.fixture
async def store(make_store: MakeStore) -> Store:
    return await make_store()
