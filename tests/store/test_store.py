"""The store contract, run on both backends (see the `store_url` fixture)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gpufleet.store.base import (
    AlreadyExists,
    Conflict,
    Expired,
    NotFound,
    Store,
    Update,
    Watch,
    WatchEvent,
    open_store,
)
from gpufleet.utils.clock import FakeClock

MakeStore = Callable[..., Awaitable[Store]]


def pod(name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "x"}},
        "spec": spec,
    }


def rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


async def take(w: Watch, n: int, within: float = 10.0) -> list[WatchEvent]:
    out: list[WatchEvent] = []
    if n == 0:
        return out
    async with asyncio.timeout(within):
        async for ev in w:
            out.append(ev)
            if len(out) == n:
                break
    return out


async def take_until(w: Watch, revision: int, within: float = 20.0) -> list[WatchEvent]:
    out: list[WatchEvent] = []
    async with asyncio.timeout(within):
        async for ev in w:
            out.append(ev)
            if ev.revision >= revision:
                break
            # Like a consumer doing I/O per event: lets writers commit between events.
            await asyncio.sleep(0)
    return out


# -- basics


async def test_create_get_update_delete(store: Store) -> None:
    assert await store.revision() == 0
    original = pod("a", image="x")
    original["metadata"]["resourceVersion"] = "999"
    created = await store.create("pods", "default", "a", original)
    assert rv(created) == 1
    assert original["metadata"]["resourceVersion"] == "999", "the caller's object is not modified"
    assert created["spec"] == {"image": "x"}
    assert await store.get("pods", "default", "a") == created

    with pytest.raises(AlreadyExists):
        await store.create("pods", "default", "a", pod("a"))
    # Same name, other namespace or other resource: a different key.
    await store.create("pods", "other", "a", pod("a", "other"))
    await store.create("services", "default", "a", pod("a"))
    assert await store.revision() == 3

    updated = await store.update("pods", "default", "a", {**created, "spec": {"image": "y"}})
    assert rv(updated) == 4
    assert (await store.get("pods", "default", "a"))["spec"] == {"image": "y"}

    deleted = await store.delete("pods", "default", "a")
    assert rv(deleted) == 5
    assert deleted["spec"] == {"image": "y"}
    with pytest.raises(NotFound):
        await store.get("pods", "default", "a")
    with pytest.raises(NotFound):
        await store.update("pods", "default", "a", pod("a"))
    with pytest.raises(NotFound):
        await store.delete("pods", "default", "a")
    # Failed writes do not use up revisions.
    assert await store.revision() == 5
    # Recreating after delete is a fresh object.
    assert rv(await store.create("pods", "default", "a", pod("a"))) == 6


async def test_cluster_scoped_and_odd_values(store: Store) -> None:
    node = {"kind": "Node", "metadata": {"name": "n1"}, "status": {"gpu": "H100 ✓", "n": 1.5, "ok": None}}
    created = await store.create("nodes", "", "n1", node)
    got = await store.get("nodes", "", "n1")
    assert got == created
    assert got["status"] == {"gpu": "H100 ✓", "n": 1.5, "ok": None}
    # An object without metadata still gets a resourceVersion.
    bare = await store.create("configmaps", "default", "bare", {"data": {}})
    assert bare["metadata"] == {"resourceVersion": "2"}


async def test_a_key_with_nul_names_nothing(store: Store) -> None:
    """No key holds NUL (PostgreSQL's text cannot): reads of one find nothing, on both
    backends alike, and paging from one goes on as from the key it sorts like."""
    for name in ("a", "b", "c"):
        await store.create("pods", "default", name, pod(name))
    with pytest.raises(NotFound):
        await store.get("pods", "default", "a\x00")
    with pytest.raises(NotFound):
        await store.get("pods", "de\x00fault", "a")
    with pytest.raises(NotFound):
        await store.update("pods", "default", "a\x00", pod("a"))
    with pytest.raises(NotFound):
        await store.delete("pods", "default", "\x00")
    empty = await store.list("pods", "default\x00")
    assert empty.items == [] and empty.revision == await store.revision()
    names = [o["metadata"]["name"] for o in (await store.list("pods", "default", after=("default", "a\x00z"))).items]
    assert names == ["b", "c"]
    assert (await store.list("pods", None, after=("default\x00", "a"))).items == []
    w = await store.watch("pods", "default\x00", 0)
    await w.close()


async def test_compare_and_swap(store: Store) -> None:
    a = await store.create("pods", "default", "a", pod("a"))
    b = await store.update("pods", "default", "a", pod("a", v=1), expected_revision=rv(a))
    with pytest.raises(Conflict) as info:
        await store.update("pods", "default", "a", pod("a", v=2), expected_revision=rv(a))
    assert info.value.current == b
    with pytest.raises(Conflict):
        await store.delete("pods", "default", "a", expected_revision=rv(a))
    assert await store.get("pods", "default", "a") == b
    assert rv(await store.delete("pods", "default", "a", expected_revision=rv(b))) == rv(b) + 1


async def test_update_many_in_one_transaction(store: Store) -> None:
    """update_many stores every object at consecutive revisions, one MODIFIED event each, in
    the order given, and its answers are what a get reads back."""
    created = [await store.create("pods", "ns", n, pod(n)) for n in ("a", "b", "c")]
    await store.create("pods", "other", "x", pod("x", "other"))
    w = await store.watch("pods", "ns", await store.revision())
    out = await store.update_many("pods", [
        Update("ns", "c", pod("c", node="n1"), rv(created[2])),
        Update("ns", "a", pod("a", node="n1"), rv(created[0])),
        Update("ns", "b", pod("b", node="n2")),
    ])
    start = rv(created[-1]) + 2  # after the create in "other"
    assert [rv(o) for o in out] == [start, start + 1, start + 2]
    assert [o["spec"] for o in out] == [{"node": "n1"}, {"node": "n1"}, {"node": "n2"}]
    for o in out:
        assert await store.get("pods", "ns", o["metadata"]["name"]) == o
    events = await take(w, 3)
    assert [(e.type, e.name, e.revision) for e in events] == [
        ("MODIFIED", "c", start), ("MODIFIED", "a", start + 1), ("MODIFIED", "b", start + 2)]
    assert [e.prev for e in events] == [created[2], created[0], created[1]]
    assert await store.update_many("pods", []) == []
    await w.close()


async def test_update_many_is_all_or_nothing(store: Store) -> None:
    """One stale revision or one missing object: nothing is stored, no revision is used, no
    event is sent, and the error names the object that failed."""
    a = await store.create("pods", "ns", "a", pod("a"))
    b = await store.create("pods", "ns", "b", pod("b"))
    b2 = await store.update("pods", "ns", "b", pod("b", v=2))
    before = await store.revision()
    w = await store.watch("pods", None, before)
    with pytest.raises(Conflict) as conflict:
        await store.update_many("pods", [Update("ns", "a", pod("a", node="n"), rv(a)),
                                         Update("ns", "b", pod("b", node="n"), rv(b))])
    assert conflict.value.current == b2
    with pytest.raises(NotFound, match="gone"):
        await store.update_many("pods", [Update("ns", "a", pod("a", node="n"), rv(a)),
                                         Update("ns", "gone", pod("gone", node="n"))])
    with pytest.raises(ValueError, match="named twice"):
        await store.update_many("pods", [Update("ns", "a", pod("a")), Update("ns", "a", pod("a"))])
    assert await store.revision() == before
    assert await store.get("pods", "ns", "a") == a
    assert await store.get("pods", "ns", "b") == b2
    # The next write takes the next revision, and is the first event the watch sees.
    c = await store.create("pods", "ns", "c", pod("c"))
    assert rv(c) == before + 1
    (ev,) = await take(w, 1)
    assert (ev.type, ev.name) == ("ADDED", "c")
    await w.close()


async def test_concurrent_cas_exactly_one_wins(make_store: MakeStore) -> None:
    s1, s2 = await make_store(), await make_store()
    for round_ in range(10):
        name = f"p{round_}"
        base = await s1.create("pods", "default", name, pod(name))
        results = await asyncio.gather(
            s1.update("pods", "default", name, pod(name, by=1), expected_revision=rv(base)),
            s2.update("pods", "default", name, pod(name, by=2), expected_revision=rv(base)),
            return_exceptions=True,
        )
        winners = [r for r in results if isinstance(r, dict)]
        losers = [r for r in results if isinstance(r, Conflict)]
        assert len(winners) == 1 and len(losers) == 1, results
        assert losers[0].current == winners[0]
        assert await s2.get("pods", "default", name) == winners[0]


async def test_writes_asked_at_once_succeed_or_fail_alone(store: Store) -> None:
    """Writes in flight together (the SQLite store commits them as one group): each is
    answered on its own, a Conflict or AlreadyExists takes no revision and stores nothing,
    the others take dense revisions and their events come in revision order."""
    a = await store.create("pods", "ns", "a", pod("a"))
    b = await store.create("pods", "ns", "b", pod("b"))
    gone = await store.create("pods", "ns", "gone", pod("gone"))
    before = await store.revision()
    w = await store.watch("pods", None, before)
    results = await asyncio.gather(
        store.update("pods", "ns", "a", pod("a", v=1), expected_revision=rv(a)),
        store.update("pods", "ns", "b", pod("b", v=1), expected_revision=rv(a)),  # stale
        store.create("pods", "ns", "c", pod("c")),
        store.create("pods", "ns", "a", pod("a")),  # exists
        store.delete("pods", "ns", "gone", expected_revision=rv(gone)),
        store.update("pods", "ns", "missing", pod("missing")),
        return_exceptions=True,
    )
    assert isinstance(results[1], Conflict) and results[1].current == b
    assert isinstance(results[3], AlreadyExists) and isinstance(results[5], NotFound)
    done = [results[0], results[2], results[4]]
    assert all(isinstance(r, dict) for r in done), results
    assert sorted(rv(r) for r in done) == [before + 1, before + 2, before + 3]
    assert await store.revision() == before + 3
    assert await store.get("pods", "ns", "a") == results[0]
    assert await store.get("pods", "ns", "b") == b
    with pytest.raises(NotFound):
        await store.get("pods", "ns", "gone")
    events = await take(w, 3)
    assert [e.revision for e in events] == [before + 1, before + 2, before + 3]
    assert {(e.type, e.name) for e in events} == {("MODIFIED", "a"), ("ADDED", "c"), ("DELETED", "gone")}
    await w.close()


async def test_sqlite_commits_the_writes_of_one_turn_together(tmp_path: Any) -> None:
    """Group commit: the writes asked for in one turn of the loop are one transaction (one
    fsync), in the order asked; a failed one in the middle changes nothing for the rest."""
    from gpufleet.store.sqlite import SQLiteStore

    s = SQLiteStore(f"sqlite:///{tmp_path}/g.db", housekeeping_interval=None)
    await s.start()
    try:
        base = await s.create("pods", "ns", "x", pod("x"))
        commits = s.commits
        names = [f"p{i}" for i in range(20)]
        results = await asyncio.gather(
            *[s.create("pods", "ns", n, pod(n)) for n in names[:10]],
            s.update("pods", "ns", "x", pod("x", v=1), expected_revision=rv(base) + 7),
            *[s.create("pods", "ns", n, pod(n)) for n in names[10:]],
            return_exceptions=True,
        )
        assert s.commits == commits + 1
        assert isinstance(results[10], Conflict)
        made = results[:10] + results[11:]
        assert [rv(r) for r in made] == list(range(rv(base) + 1, rv(base) + 21))
        reopened = SQLiteStore(f"sqlite:///{tmp_path}/g.db", housekeeping_interval=None)
        await reopened.start()
        try:
            assert [o["metadata"]["name"] for o in (await reopened.list("pods", "ns")).items] == sorted(names + ["x"])
            assert await reopened.get("pods", "ns", "x") == base
        finally:
            await reopened.close()
    finally:
        await s.close()


async def test_one_global_revision(store: Store) -> None:
    seen = []
    for i in range(5):
        seen.append(rv(await store.create("pods", "ns", f"p{i}", pod(f"p{i}", "ns"))))
        seen.append(rv(await store.create("nodes", "", f"n{i}", {"metadata": {"name": f"n{i}"}})))
        seen.append(rv(await store.update("pods", "ns", f"p{i}", pod(f"p{i}", "ns", x=i))))
    seen.append(rv(await store.delete("nodes", "", "n0")))
    assert seen == list(range(1, 17))
    assert await store.revision() == 16


# -- list


async def test_list_sorted_and_paginated(store: Store) -> None:
    names = [("b", "z"), ("a", "y"), ("b", "a"), ("a", "b"), ("c", "m"), ("a", "a10"), ("a", "a9")]
    for ns, name in names:
        await store.create("pods", ns, name, pod(name, ns))
    await store.create("services", "a", "svc", pod("svc", "a"))

    every = await store.list("pods")
    keys = [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in every.items]
    assert keys == sorted(names)
    assert every.revision == await store.revision() == 8
    assert every.next_key is None

    in_a = await store.list("pods", "a")
    assert [o["metadata"]["name"] for o in in_a.items] == ["a10", "a9", "b", "y"]
    assert (await store.list("pods", "nope")).items == []
    assert (await store.list("nothing")).revision == 8

    for namespace, expected in ((None, sorted(names)), ("a", [k for k in sorted(names) if k[0] == "a"])):
        pages: list[tuple[str, str]] = []
        after = None
        while True:
            page = await store.list("pods", namespace, limit=3, after=after)
            assert len(page.items) <= 3
            pages += [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in page.items]
            if page.next_key is None:
                break
            assert page.next_key == pages[-1]
            after = page.next_key
        assert pages == expected

    # Exactly `limit` items left: no next page is announced.
    assert (await store.list("pods", "a", limit=4)).next_key is None


async def test_list_of_the_pods_bound_to_a_node(store: Store) -> None:
    """node=X (an agent's fieldSelector spec.nodeName=X) through the index: only that node's
    pods, in key order, paged, following rebinding and deletion; other resources ignore it."""
    want = []
    for i in range(40):
        ns, name = f"ns{i % 3}", f"p{i:02d}"
        body = pod(name, ns)
        body["spec"] = {"nodeName": f"n{i % 4}"} if i % 5 else {}
        await store.create("pods", ns, name, body)
        if i % 5 and i % 4 == 1:
            want.append((ns, name))
    await store.create("secrets", "ns0", "s", {"data": {"k": "dg=="}})
    keys = [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in (await store.list("pods", node="n1")).items]
    assert keys == sorted(want)
    assert [o["metadata"]["name"] for o in (await store.list("pods", "ns1", node="n1")).items] == \
        [n for ns, n in sorted(want) if ns == "ns1"]
    pages, after = [], None
    while True:
        page = await store.list("pods", node="n1", limit=3, after=after)
        pages += [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in page.items]
        if page.next_key is None:
            break
        after = page.next_key
    assert pages == sorted(want)
    # Rebound, unbound, deleted: the index follows.
    ns, name = sorted(want)[0]
    moved = await store.get("pods", ns, name)
    moved["spec"]["nodeName"] = "n9"
    await store.update("pods", ns, name, moved)
    await store.delete("pods", *sorted(want)[1])
    keys = [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in (await store.list("pods", node="n1")).items]
    assert keys == sorted(want)[2:]
    assert [o["metadata"]["name"] for o in (await store.list("pods", node="n9")).items] == [name]
    assert (await store.list("pods", node="nobody")).items == []
    assert len((await store.list("secrets", node="n1")).items) == 1


# -- watch


async def test_watch_basic_and_event_shape(store: Store) -> None:
    w = await store.watch("pods", None, 0)
    a = await store.create("pods", "default", "a", pod("a"))
    b = await store.update("pods", "default", "a", pod("a", v=1))
    d = await store.delete("pods", "default", "a")
    added, modified, deleted = await take(w, 3)
    assert (added.type, added.revision, added.object, added.prev) == ("ADDED", 1, a, None)
    assert (modified.type, modified.object, modified.prev) == ("MODIFIED", b, a)
    assert (deleted.type, deleted.revision, deleted.object, deleted.prev) == ("DELETED", 3, d, b)
    assert rv(deleted.object) == 3 and deleted.object["spec"] == {"v": 1}
    assert (deleted.resource, deleted.namespace, deleted.name) == ("pods", "default", "a")
    await w.close()
    assert [ev async for ev in w] == []


async def test_watch_replay_then_live_exactly_once_under_concurrent_writes(make_store: MakeStore) -> None:
    """A watch from an old revision replays several pages of history while writers, local and
    from another instance, keep committing; it must see every revision once, in order."""
    local, remote = await make_store(), await make_store()
    for i in range(1300):
        await local.create("pods", "ns", f"old{i}", pod(f"old{i}", "ns"))
    start = 100

    async def writer(s: Store, tag: str, n: int) -> None:
        for i in range(n):
            o = await s.create("pods", "ns", f"{tag}{i}", pod(f"{tag}{i}", "ns"))
            if i % 3 == 0:
                await s.update("pods", "ns", f"{tag}{i}", o)
            await asyncio.sleep(0)

    writers = [asyncio.create_task(writer(local, "l", 150)), asyncio.create_task(writer(remote, "r", 150))]
    final = 1300 + 2 * (150 + 50)
    await asyncio.sleep(0.01)
    w = await local.watch(None, None, start)
    # Consume while the writers run, so live events queue up behind pages still to replay.
    consumer = asyncio.create_task(take_until(w, final))
    await asyncio.gather(*writers)
    assert await local.revision() == final
    events = await consumer
    assert [ev.revision for ev in events] == list(range(start + 1, final + 1))
    assert all(rv(ev.object) == ev.revision for ev in events)
    # The same, watched through the other instance from the middle of the live writes.
    w2 = await remote.watch("pods", "ns", final - 200)
    assert [ev.revision for ev in await take_until(w2, final)] == list(range(final - 199, final + 1))


async def test_watch_filtered_by_resource_and_namespace(store: Store) -> None:
    async def write_mix(tag: str) -> None:
        for ns in ("a", "b"):
            await store.create("pods", ns, f"{tag}-p", pod(f"{tag}-p", ns))
            await store.create("services", ns, f"{tag}-s", pod(f"{tag}-s", ns))
        await store.create("nodes", "", f"{tag}-n", {"metadata": {"name": f"{tag}-n"}})

    await write_mix("old")  # revisions 1..5, replayed
    watches = {
        "pods/a": await store.watch("pods", "a", 0),
        "pods/*": await store.watch("pods", None, 0),
        "*/b": await store.watch(None, "b", 0),
        "*/*": await store.watch(None, None, 0),
        "nodes": await store.watch("nodes", "", 0),
    }
    await write_mix("new")  # revisions 6..10, live
    expected = {"pods/a": [1, 6], "pods/*": [1, 3, 6, 8], "*/b": [3, 4, 8, 9], "*/*": list(range(1, 11))}
    expected["nodes"] = [5, 10]
    for key, revisions in expected.items():
        got = await take(watches[key], len(revisions))
        assert [ev.revision for ev in got] == revisions, key
    assert await store.create("pods", "c", "x", pod("x", "c"))
    assert [ev.revision for ev in await take(watches["pods/*"], 1)] == [11]


async def test_watch_from_future_revision_waits(store: Store) -> None:
    for i in range(3):
        await store.create("pods", "ns", f"p{i}", pod(f"p{i}", "ns"))
    w = await store.watch(None, None, 5)
    for i in range(3, 7):
        await store.create("pods", "ns", f"p{i}", pod(f"p{i}", "ns"))
    assert [ev.revision for ev in await take(w, 2)] == [6, 7]


async def test_watch_from_compacted_revision_is_expired(make_store: MakeStore) -> None:
    store = await make_store(history=5, housekeeping_interval=None)
    for i in range(20):
        await store.create("pods", "ns", f"p{i}", pod(f"p{i}", "ns"))
    await store.compact(10)
    with pytest.raises(Expired) as info:
        await store.watch(None, None, 9)
    assert info.value.oldest == 11
    # Exactly at the compaction point nothing is missing.
    w = await store.watch(None, None, 10)
    assert [ev.revision for ev in await take(w, 10)] == list(range(11, 21))
    # Keeping the last `history` revisions.
    await store.compact_history()  # type: ignore[attr-defined]
    with pytest.raises(Expired):
        await store.watch(None, None, 14)
    w = await store.watch("pods", "ns", 15)
    assert [ev.revision for ev in await take(w, 5)] == [16, 17, 18, 19, 20]
    # Compacting past the head is clamped; the store keeps counting.
    await store.compact(1000)
    assert rv(await store.create("pods", "ns", "last", pod("last", "ns"))) == 21


async def test_housekeeping_compacts_a_long_history_in_steps(make_store: MakeStore,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction deletes at most COMPACT_STEP revisions a transaction and lets the loop run
    between them, so a long history does not hold every request; it ends where one step would."""
    from gpufleet.store import _common

    monkeypatch.setattr(_common, "COMPACT_STEP", 7)
    store = await make_store(history=5, housekeeping_interval=None)
    for i in range(40):
        await store.create("pods", "ns", f"p{i}", pod(f"p{i}", "ns"))
    steps: list[int] = []
    compact = store.compact

    async def counted(revision: int) -> None:
        steps.append(revision)
        await compact(revision)

    store.compact = counted  # type: ignore[method-assign]
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    t = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    before = ticks
    await store.compact_history()  # type: ignore[attr-defined]
    t.cancel()
    assert steps == [7, 14, 21, 28, 35]
    assert ticks - before >= len(steps) - 1  # the loop ran between the steps
    with pytest.raises(Expired):
        await store.watch(None, None, 34)
    w = await store.watch(None, None, 35)
    assert [ev.revision for ev in await take(w, 5)] == [36, 37, 38, 39, 40]
    await store.compact_history()  # type: ignore[attr-defined]
    assert steps == [7, 14, 21, 28, 35]  # nothing left to do


async def test_slow_watcher_is_expired(make_store: MakeStore) -> None:
    store = await make_store(watch_buffer=10)
    w = await store.watch(None, None, 0)
    for i in range(30):
        await store.create("pods", "ns", f"p{i}", pod(f"p{i}", "ns"))
    got = []
    with pytest.raises(Expired):
        async for ev in w:
            got.append(ev.revision)
    # What was queued before the overflow still comes, in order, without a gap.
    assert got == list(range(1, 11))
    # Writers were not held up, and a new watch from where the slow one stopped works.
    assert await store.revision() == 30
    w2 = await store.watch(None, None, got[-1])
    assert [ev.revision for ev in await take(w2, 20)] == list(range(11, 31))


async def test_close_ends_watches(make_store: MakeStore) -> None:
    store = await make_store()
    w = await store.watch(None, None, 0)
    waiter = asyncio.create_task(take(w, 1))
    await asyncio.sleep(0.05)
    await store.close()
    assert await asyncio.wait_for(waiter, 5) == []


# -- ttl


async def test_ttl_expiry_emits_deleted(make_store: MakeStore) -> None:
    clock = FakeClock()
    store = await make_store(clock=clock, housekeeping_interval=None)
    lease = await store.create("leases", "ns", "l", {"metadata": {"name": "l"}}, ttl=10)
    await store.create("leases", "ns", "forever", {"metadata": {"name": "forever"}})
    w = await store.watch("leases", None, rv(lease))
    clock.advance(5)
    assert await store.sweep_expired() == 0
    # An update without ttl keeps the expiry; one with ttl renews it.
    renewed = await store.update("leases", "ns", "l", {"metadata": {"name": "l"}, "spec": {"n": 1}})
    clock.advance(6)
    assert await store.sweep_expired() == 1
    with pytest.raises(NotFound):
        await store.get("leases", "ns", "l")
    lease2 = await store.create("leases", "ns", "l", {"metadata": {"name": "l"}}, ttl=10)
    clock.advance(9)
    await store.update("leases", "ns", "l", {"metadata": {"name": "l"}}, ttl=10)
    clock.advance(9)
    assert await store.sweep_expired() == 0
    clock.advance(2)
    assert await store.sweep_expired() == 1
    events = await take(w, 6)
    types = [(ev.type, ev.name) for ev in events]
    assert types == [
        ("ADDED", "forever"),
        ("MODIFIED", "l"),
        ("DELETED", "l"),
        ("ADDED", "l"),
        ("MODIFIED", "l"),
        ("DELETED", "l"),
    ]
    deleted = events[2]
    assert deleted.object["spec"] == {"n": 1} and rv(deleted.object) == deleted.revision
    assert deleted.prev == renewed
    assert rv(lease2) == deleted.revision + 1
    assert [o["metadata"]["name"] for o in (await store.list("leases")).items] == ["forever"]


async def test_ttl_swept_in_background(make_store: MakeStore) -> None:
    store = await make_store(housekeeping_interval=0.05)
    w = await store.watch(None, None, 0)
    await store.create("leases", "ns", "l", {"metadata": {"name": "l"}}, ttl=0.1)
    added, deleted = await take(w, 2, within=5)
    assert (added.type, deleted.type, deleted.revision) == ("ADDED", "DELETED", 2)


# -- several instances, several processes


async def test_watch_sees_writes_of_another_instance_in_order(make_store: MakeStore) -> None:
    a, b = await make_store(), await make_store()
    w = await a.watch(None, None, 0)
    for i in range(50):
        o = await b.create("pods", "ns", f"p{i}", pod(f"p{i}", "ns"))
        if i % 2:
            await a.update("pods", "ns", f"p{i}", o)
    events = await take_until(w, 75)
    assert [ev.revision for ev in events] == list(range(1, 76))
    assert [ev.type for ev in events[:3]] == ["ADDED", "ADDED", "MODIFIED"]


_WRITER = r"""
import asyncio, sys
from gpufleet.store.base import open_store

url, prefix, count, writers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

async def main():
    stores = [open_store(url) for _ in range(writers)]
    for s in stores:
        await s.start()
    print("ready", flush=True)

    async def write(k, s):
        for i in range(k, count, writers):
            name = f"{prefix}{i}"
            o = await s.create("pods", "ns", name, {"metadata": {"name": name}, "spec": {"i": i}})
            # Acknowledged only once the store returned, i.e. after commit.
            # One write per line: print()'s pieces can be flushed apart when the buffer fills.
            sys.stdout.write(f"{name} {o['metadata']['resourceVersion']}\n")
            sys.stdout.flush()
            await asyncio.sleep(0)

    await asyncio.gather(*(write(k, s) for k, s in enumerate(stores)))
    for s in stores:
        await s.close()

asyncio.run(main())
"""


def _writer_cmd(url: str, prefix: str, count: int, writers: int) -> list[str]:
    return [sys.executable, "-c", _WRITER, url, prefix, str(count), str(writers)]


async def test_concurrent_writers_then_reopen(store_url: str, make_store: MakeStore) -> None:
    """1,000 objects from 4 concurrent writers (4 processes on SQLite, 4 instances on
    PostgreSQL), all there after the store is closed and reopened, at dense revisions."""
    if store_url.startswith("sqlite"):
        procs = [
            await asyncio.create_subprocess_exec(
                *_writer_cmd(store_url, f"w{k}-", 250, 1), stdout=asyncio.subprocess.DEVNULL
            )
            for k in range(4)
        ]
        assert [await p.wait() for p in procs] == [0, 0, 0, 0]
    else:
        stores = [open_store(store_url) for _ in range(4)]
        for s in stores:
            await s.start()

        async def write(k: int, s: Store) -> None:
            for i in range(250):
                await s.create("pods", "ns", f"w{k}-{i}", pod(f"w{k}-{i}", "ns", i=i))

        await asyncio.gather(*(write(k, s) for k, s in enumerate(stores)))
        for s in stores:
            await s.close()

    reopened = await make_store()
    assert await reopened.revision() == 1000
    listed = await reopened.list("pods", "ns")
    assert len(listed.items) == 1000
    assert sorted(rv(o) for o in listed.items) == list(range(1, 1001))
    w = await reopened.watch(None, None, 0)
    assert [ev.revision for ev in await take(w, 1000)] == list(range(1, 1001))


async def test_acknowledged_writes_survive_sigkill(store_url: str, make_store: MakeStore) -> None:
    """A server process writing with 4 concurrent writers is killed mid-stream: every write it
    acknowledged is there after reopening."""
    proc = await asyncio.create_subprocess_exec(
        *_writer_cmd(store_url, "k", 1000, 4), stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    acked: dict[str, int] = {}
    killed = False

    def ack(line: bytes) -> None:
        name, revision = line.decode().split()
        acked[name] = int(revision)

    try:
        async with asyncio.timeout(30):
            assert (await proc.stdout.readline()).strip() == b"ready"
            while len(acked) < 250:
                line = await proc.stdout.readline()
                assert line, "writer exited early"
                ack(line)
            proc.send_signal(signal.SIGKILL)
            killed = True
            # Acknowledgements already in the pipe count too.
            # A line the kill cut short was never acknowledged.
            for line in (await proc.stdout.read()).splitlines(keepends=True):
                if line.endswith(b"\n"):
                    ack(line)
    finally:
        # Signal once only: Popen.send_signal() polls first, and a poll that reaps the child
        # leaves asyncio's watcher reporting 255.
        if not killed:
            proc.kill()
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert len(acked) < 1000, "the writer finished before the kill; the test proves nothing"

    reopened = await make_store()
    for name, revision in acked.items():
        assert rv(await reopened.get("pods", "ns", name)) == revision
    # The store is consistent and writable after the crash.
    head = await reopened.revision()
    assert head >= max(acked.values())
    listed = await reopened.list("pods")
    assert sorted(rv(o) for o in listed.items) == list(range(1, head + 1))
    assert rv(await reopened.create("pods", "ns", "after", pod("after", "ns"))) == head + 1


async def test_replay_expires_when_compacted_underneath(make_store: MakeStore) -> None:
    store = await make_store(housekeeping_interval=None)
    for i in range(700):
        await store.create("pods", "ns", f"p{i}", pod(f"p{i}", "ns"))
    w = await store.watch(None, None, 0)
    first = await take(w, 10)
    await store.compact(600)
    got = [ev.revision for ev in first]
    with pytest.raises(Expired):
        async for ev in w:
            got.append(ev.revision)
    # Whatever came is a gap-free prefix; the Expired is raised before any hole.
    assert got == list(range(1, len(got) + 1)) and len(got) < 700


async def test_random_operations_match_a_model(make_store: MakeStore) -> None:
    """Random creates, updates, CAS updates and deletes through two instances agree with a
    dict, and a watch from 0 rebuilds exactly the final state."""
    import random

    rng = random.Random(7)
    instances = [await make_store(), await make_store()]
    watch = await instances[0].watch(None, None, 0)
    model: dict[tuple[str, str, str], dict[str, Any]] = {}
    head = 0
    keys = [(r, ns, f"o{i}") for r in ("pods", "nodes") for ns in ("a", "b") for i in range(4)]
    for step in range(300):
        s = rng.choice(instances)
        key = rng.choice(keys)
        obj = {"metadata": {"name": key[2]}, "spec": {"step": step}}
        op = rng.choice(["create", "update", "cas", "stale", "delete"])
        current = model.get(key)
        try:
            if op == "create":
                result = await s.create(*key, obj)
            elif op == "update":
                result = await s.update(*key, obj)
            elif op in ("cas", "stale"):
                expected = rv(current) if current and op == "cas" else rng.randint(1, head + 1)
                result = await s.update(*key, obj, expected_revision=expected)
            else:
                result = await s.delete(*key)
        except AlreadyExists:
            assert op == "create" and current is not None
            continue
        except NotFound:
            assert op != "create" and current is None
            continue
        except Conflict as e:
            assert current is not None and e.current == current
            continue
        head += 1
        assert rv(result) == head
        if op == "create":
            assert current is None
        if op == "delete":
            assert result == {**current, "metadata": {**current["metadata"], "resourceVersion": str(head)}}  # type: ignore[index]
            del model[key]
        else:
            model[key] = result
    assert await instances[1].revision() == head
    for resource in ("pods", "nodes"):
        listed = await instances[1].list(resource)
        assert listed.items == [model[k] for k in sorted(model) if k[0] == resource]
    rebuilt: dict[tuple[str, str, str], dict[str, Any]] = {}
    for ev in await take_until(watch, head):
        key = (ev.resource, ev.namespace, ev.name)
        assert ev.prev == rebuilt.get(key)
        if ev.type == "DELETED":
            del rebuilt[key]
        else:
            rebuilt[key] = ev.object
    assert rebuilt == model
