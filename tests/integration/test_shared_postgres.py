"""Several API servers on one PostgreSQL: what one accepts, the others serve and watch."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet.api.k8s import ConfigMap
from gpufleet.apiserver.app import HttpServer
from gpufleet.apiserver.server import ApiServer
from gpufleet.client.api import Client
from gpufleet.client.errors import Conflict
from gpufleet.client.transport import HttpTransport
from gpufleet.store.base import open_store

pytestmark = pytest.mark.postgres


async def _server(url: str):
    store = open_store(url)
    await store.start()
    api = ApiServer(store)
    await api.start()
    http = HttpServer(api, port=0)
    await http.start()
    client = Client(HttpTransport(f"http://127.0.0.1:{http.port}"))
    return store, http, client


async def test_two_api_servers_share_one_database(postgres_url: str) -> None:
    (store_a, http_a, a), (store_b, http_b, b) = await _server(postgres_url), await _server(postgres_url)
    try:
        start = (await b.list(ConfigMap, "default")).resource_version
        seen: list[tuple[str, str]] = []

        async def watch_b() -> None:
            async for ev in b.watch(ConfigMap, "default", resource_version=start):
                seen.append((ev.type, ev.object.metadata.name))
                if len(seen) == 3:
                    return

        watcher = asyncio.create_task(watch_b())
        created = await a.create(ConfigMap(metadata={"name": "shared"}, data={"k": "1"}), "default")
        # Served by B at once, and a compare-and-swap through B with A's revision wins once.
        assert (await b.get(ConfigMap, "shared", "default")).data == {"k": "1"}
        created.data = {"k": "2"}
        await b.update(created)
        created.data = {"k": "3"}
        with pytest.raises(Conflict):
            await a.update(created)
        await a.delete(ConfigMap, "shared", "default")
        await asyncio.wait_for(watcher, 10)
        assert seen == [("ADDED", "shared"), ("MODIFIED", "shared"), ("DELETED", "shared")]
    finally:
        for client, http, store in ((a, http_a, store_a), (b, http_b, store_b)):
            await client.close()
            await http.stop()
            await store.close()
