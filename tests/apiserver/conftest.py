from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from apiserver_helpers import Api

from gpufleet.apiserver.server import ApiServer
from gpufleet.store.base import Store, open_store

MakeApi = Callable[..., Awaitable[Api]]


@pytest.fixture
async def make_api(store_url: str) -> AsyncIterator[MakeApi]:
    """Starts an ApiServer on a fresh store of the test's backend. Store options (history,
    clock, housekeeping_interval) and server options (clock, event_ttl) are passed through."""
    opened: list[Store] = []

    async def make(*, store_options: dict[str, Any] | None = None, **server_options: Any) -> Api:
        store = open_store(store_url, **(store_options or {}))
        await store.start()
        opened.append(store)
        server = ApiServer(store, **server_options)
        await server.start()
        return Api(server)

    yield make
    for s in opened:
        await s.close()


@pytest.fixture
async def api(make_api: MakeApi) -> Api:
    return await make_api()
