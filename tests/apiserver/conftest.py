from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
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


_schemas = itertools.count()


@pytest.fixture(scope="session")
def _apiserver_pg_database(postgres_server: Any) -> Iterator[str]:
    import psycopg

    dbname = f"apiserver_{os.getpid()}"
    with psycopg.connect(postgres_server.url("postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    yield postgres_server.url(dbname)
    with psycopg.connect(postgres_server.url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


@pytest.fixture
def postgres_url(_apiserver_pg_database: str) -> Iterator[str]:
    """A fresh, empty schema in one database shared by this package's tests. Overrides the
    root fixture's fresh database per test: CREATE DATABASE costs most of a second, a schema
    almost nothing, and the store never names its schema (it follows search_path)."""
    import psycopg

    schema = f"t{next(_schemas)}"
    with psycopg.connect(_apiserver_pg_database, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    yield f"{_apiserver_pg_database}?options=-csearch_path%3D{schema}"
    with psycopg.connect(_apiserver_pg_database, autocommit=True) as admin:
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
