"""Full lists served from the SQLite store's list cache (store/listcache.py) read as the
database's own lists would, after any writes of this process or another."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpufleet.store import listcache
from gpufleet.store.sqlite import SQLiteStore

NAMESPACES = ("a", "a-b", "b")


def pod(ns: str, name: str, value: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": f"n{value % 3}", "priority": value}}


async def stores(tmp_path: Path) -> tuple[SQLiteStore, SQLiteStore]:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    cached, plain = SQLiteStore(url, synchronous="normal"), SQLiteStore(url, synchronous="normal", list_cache=False)
    await cached.start()
    await plain.start()
    return cached, plain


async def same_lists(cached: SQLiteStore, plain: SQLiteStore, namespace: str | None, limit: int | None) -> None:
    rev, texts, next_key = await cached.list_json("pods", namespace, limit=limit)
    want = await plain.list("pods", namespace, limit=limit)
    assert [orjson.loads(t) for t in texts] == want.items
    assert (rev, next_key) == (want.revision, want.next_key)


async def test_the_cached_list_is_the_databases_after_every_write(tmp_path: Path) -> None:
    cached, plain = await stores(tmp_path)
    try:
        rng = random.Random(7)
        live: dict[tuple[str, str], int] = {}
        await same_lists(cached, plain, None, None)  # the cache is made, empty
        assert cached._list_caches is not None and cached._list_caches["pods"].live
        for step in range(300):
            ns, name = rng.choice(NAMESPACES), f"p{rng.randrange(25)}"
            key = (ns, name)
            if key not in live:
                await cached.create("pods", ns, name, pod(ns, name, step))
                live[key] = step
            elif rng.random() < 0.3:
                await cached.delete("pods", ns, name)
                del live[key]
            else:
                await cached.update("pods", ns, name, pod(ns, name, step))
            if step % 10 == 0:
                await cached.create("nodes", "", f"node-{step}", {"metadata": {"name": f"node-{step}"}})
            await same_lists(cached, plain, rng.choice((None, *NAMESPACES)), rng.choice((None, 1, 3, 50)))
        assert len(cached._list_caches["pods"]) == len(live)
    finally:
        await cached.close()
        await plain.close()


async def test_a_write_of_another_process_is_in_the_next_list(tmp_path: Path) -> None:
    cached, plain = await stores(tmp_path)
    try:
        await cached.create("pods", "a", "mine", pod("a", "mine", 1))
        await same_lists(cached, plain, None, None)
        # `plain` stands for another API server on the file: its write is read from the
        # database until this process's event pump has delivered it, then from the cache.
        await plain.create("pods", "a", "theirs", pod("a", "theirs", 2))
        rev, texts, _ = await cached.list_json("pods")
        assert [orjson.loads(t)["metadata"]["name"] for t in texts] == ["mine", "theirs"]
        assert rev == await plain.revision()
        for _ in range(100):
            if cached._hub.delivered == rev:
                break
            await asyncio.sleep(0.02)
        await plain.delete("pods", "a", "mine")
        for _ in range(100):
            if cached._hub.delivered == await plain.revision():
                break
            await asyncio.sleep(0.02)
        await same_lists(cached, plain, None, None)
        assert len(cached._list_caches["pods"]) == 1
    finally:
        await cached.close()
        await plain.close()


async def test_a_cache_no_list_uses_is_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cached, plain = await stores(tmp_path)
    try:
        await cached.create("pods", "a", "x", pod("a", "x", 1))
        await cached.list_json("pods")
        assert "pods" in cached._list_caches
        monkeypatch.setattr("gpufleet.store.sqlite.IDLE_SECONDS", -1.0)
        for _ in range(100):
            if "pods" not in cached._list_caches:
                break
            await asyncio.sleep(0.02)
        assert "pods" not in cached._list_caches
        await cached.update("pods", "a", "x", pod("a", "x", 2))
        await same_lists(cached, plain, None, None)  # made again, from the database
        assert listcache.IDLE_SECONDS > 0
    finally:
        await cached.close()
        await plain.close()


async def test_a_value_only_the_codec_reads_is_not_listed_from_texts(tmp_path: Path) -> None:
    # A Secret stored encrypted, read by a server started without the key: the list goes the
    # decoding way, whose codec says why the value cannot be read (no cache, no half list).
    cached, plain = await stores(tmp_path)
    try:
        await cached.create("secrets", "a", "s", {"metadata": {"name": "s", "namespace": "a"}})
        with sqlite3.connect(tmp_path / "state.db") as db:
            db.execute("UPDATE objects SET value = ? WHERE name = 's'", ('"k8s:enc:aescbc:v1:key1:xyz"',))
        assert await cached.list_json("secrets") is None
        assert "secrets" not in cached._list_caches
    finally:
        await cached.close()
        await plain.close()
