"""What both backends share above their SQL (the rows and queries are in _rows.py): the
watch fan-out and its event pump, the periodic housekeeping (ttl sweep, history
compaction), and StoreBase, the settings, watch and writes over each backend's one write.

The fan-out keeps one number, ``delivered``: every event up to it has been handed to every
registered watch, in revision order. Events reach it two ways. After a local commit the
backend hands the event over directly (the fast path); when that event is not the next
revision (another process or another connection of this one committed in between), the pump
reads the missing revisions from the history table. Both backends commit writes in revision
order, so a committed revision N implies every revision below N is committed and readable:
the pump never waits for a hole to fill, and a watch that registers at ``delivered`` = D can
replay (from, D] from history and take everything above D live, with no gap and no duplicate.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from gpufleet.store._rows import Codec, Events, all_objects, list_page, stamped_json
from gpufleet.store.base import Expired, ListResult, Update, WatchEvent
from gpufleet.utils.clock import Clock
from gpufleet.utils.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# Rows read per history query (pump catch-up and watch replay).
PAGE = 500
# Revisions of history compacted per transaction by housekeeping.
COMPACT_STEP = 100


class StoreWatch:
    """One open watch. Replays history (from_revision, replay_upto] page by page, then yields
    the live events the hub queued meanwhile. Live events wait in a bounded buffer; a consumer
    that lets it fill is ended with Expired after the events already queued, instead of
    holding up writers or growing memory without bound.

    Event objects are shared between all watches that receive them: treat them as read-only.
    """

    def __init__(
        self,
        hub: EventHub,
        resource: str | None,
        namespace: str | None,
        from_revision: int,
        replay_upto: int,
        buffer: int,
    ) -> None:
        self.resource = resource
        self.namespace = namespace
        self._hub = hub
        self._buffer = buffer
        self._replay: deque[WatchEvent] = deque()
        self._cursor = from_revision
        self._replay_upto = replay_upto
        self._live: deque[WatchEvent] = deque()
        # Last revision yielded (or skipped over): later duplicates and anything at or below
        # from_revision are dropped against it.
        self._last = from_revision
        self._wakeup = asyncio.Event()
        self._ended = False
        self._error: BaseException | None = None

    def matches(self, ev: WatchEvent) -> bool:
        return self.namespace is None or self.namespace == ev.namespace

    def offer(self, ev: WatchEvent) -> None:
        if self._ended:
            return
        if len(self._live) >= self._buffer:
            last = self._live[-1].revision
            self._end(Expired(last, ev.revision))
            return
        self._live.append(ev)
        self._wakeup.set()

    def _end(self, error: BaseException | None = None) -> None:
        """Stop taking events. Without an error (closed) nothing more is yielded; with one,
        what is queued still comes first, then the error."""
        if error is None:
            self._replay.clear()
            self._cursor = self._replay_upto
            self._live.clear()
        if self._ended:
            return
        self._ended = True
        self._error = error
        self._hub.unregister(self)
        self._wakeup.set()

    async def fill_replay(self) -> None:
        """Read the next page of history. Raises Expired when compaction got there first."""
        compacted, events = await self._hub.read_replay(
            self.resource, self.namespace, self._cursor, self._replay_upto, PAGE
        )
        if self._ended and self._error is None:
            return  # closed while reading
        if self._cursor < compacted:
            raise Expired(self._cursor, compacted + 1)
        self._replay.extend(events)
        if len(events) < PAGE:
            self._cursor = self._replay_upto
        else:
            self._cursor = events[-1].revision

    def ready(self) -> bool:
        """Whether the next ``__anext__`` answers without waiting: an event (or the error or end
        that follows the last one) is already here. A watch that writes its events to a
        client takes all that are ready before it sends, so one burst of writes (a group
        commit) goes out in one chunk rather than one chunk per event."""
        if self._replay:
            return True
        if self._cursor < self._replay_upto:
            return False  # the next page of history is still to be read
        live = self._live
        while live and live[0].revision <= self._last:
            live.popleft()  # a duplicate __anext__ would skip
        return bool(live) or self._ended

    def __aiter__(self) -> StoreWatch:
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            if self._replay:
                ev = self._replay.popleft()
                self._last = ev.revision
                if ev.error is not None:
                    self._end()
                    raise ev.error
                return ev
            # A watch ended by overflow still replays the rest: the history plus the live events
            # it queued are gap-free, and the Expired comes after the last of them.
            if self._cursor < self._replay_upto:
                try:
                    await self.fill_replay()
                except Expired as e:
                    # The live events queued lie beyond the hole: drop them too.
                    self._end()
                    self._error = e
                continue
            while self._live:
                ev = self._live.popleft()
                if ev.revision > self._last:
                    self._last = ev.revision
                    if ev.error is not None:
                        self._end()
                        raise ev.error
                    return ev
            if self._ended:
                if self._error is not None:
                    err, self._error = self._error, None
                    raise err
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()

    async def close(self) -> None:
        self._error = None
        self._end()


class EventHub:
    """The watch registry and the event pump of one store instance."""

    def __init__(
        self,
        *,
        read_after: Callable[[int, int], Awaitable[Events]],
        read_replay: Callable[[str | None, str | None, int, int, int], Awaitable[tuple[int, Events]]],
        compacted_revision: Callable[[], Awaitable[int]],
        current_revision: Callable[[], Awaitable[int]],
        buffer: int,
    ) -> None:
        self._read_after = read_after
        self.read_replay = read_replay
        self._compacted_revision = compacted_revision
        self._current_revision = current_revision
        self._buffer = buffer
        self.delivered = 0
        # Local commits that arrived ahead of a revision not yet delivered.
        self._pending: dict[int, WatchEvent] = {}
        self._by_resource: dict[str | None, set[StoreWatch]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self, revision: int) -> None:
        self.delivered = revision
        self._task = asyncio.create_task(self._pump(), name="store-event-pump")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        for watches in list(self._by_resource.values()):
            for w in list(watches):
                w._end()

    def register(self, resource: str | None, namespace: str | None, from_revision: int) -> StoreWatch:
        # Registration and delivery both run on the loop without awaiting in between, so the
        # watch takes every live event above `delivered` and replays the rest from history.
        w = StoreWatch(self, resource, namespace, from_revision, self.delivered, self._buffer)
        self._by_resource.setdefault(resource, set()).add(w)
        return w

    def attach(self, consumer: Any) -> None:
        """A consumer that takes every live event of its resource as a watch does (``matches``,
        ``offer``, ``_end``; a list cache); from the next revision after ``delivered`` on."""
        self._by_resource.setdefault(consumer.resource, set()).add(consumer)

    def unregister(self, w: StoreWatch) -> None:
        watches = self._by_resource.get(w.resource)
        if watches is not None:
            watches.discard(w)
            if not watches:
                del self._by_resource[w.resource]

    def watching(self) -> bool:
        return bool(self._by_resource)

    def publish(self, events: Events) -> None:
        """Fast path: events this instance just committed, in revision order."""
        for ev in events:
            if ev.revision <= self.delivered:
                continue
            if not self._by_resource:
                # Nobody to tell; a later watch replays these from history.
                self.delivered = ev.revision
            elif ev.revision == self.delivered + 1:
                self._deliver(ev)
            else:
                self._pending[ev.revision] = ev
                self._wake.set()
        if self._pending and not self._by_resource:
            self._pending.clear()

    def observed(self, revision: int) -> None:
        """Some writer (maybe another process) committed ``revision``."""
        if revision <= self.delivered:
            return
        if not self._by_resource:
            # Every revision up to it is committed too; a later watch replays them.
            self.delivered = revision
            self._pending.clear()
        else:
            self._wake.set()

    def poke(self) -> None:
        """Another writer may have committed: have the pump look at the history table."""
        self._wake.set()

    def _deliver(self, ev: WatchEvent) -> None:
        while True:
            self.delivered = ev.revision
            for key in (ev.resource, None):
                watches = self._by_resource.get(key)
                if watches:
                    for w in list(watches):
                        if w.matches(ev):
                            w.offer(ev)
            nxt = self._pending.pop(self.delivered + 1, None)
            if nxt is None:
                return
            ev = nxt

    def _expire_all(self, requested: int, oldest: int) -> None:
        for watches in list(self._by_resource.values()):
            for w in list(watches):
                w._end(Expired(requested, oldest))

    async def _pump(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._catch_up()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("store event pump: reading history failed; retrying")
                await asyncio.sleep(0.5)
                self._wake.set()

    async def _catch_up(self) -> None:
        while True:
            if not self._by_resource:
                current = await self._current_revision()
                if not self._by_resource:
                    self.delivered = max(self.delivered, current)
                    self._pending.clear()
                    return
            events = await self._read_after(self.delivered, PAGE)
            gap_before: int | None = None
            for ev in events:
                if ev.revision <= self.delivered:
                    continue
                if ev.revision != self.delivered + 1:
                    gap_before = ev.revision
                    break
                self._deliver(ev)
            for rev in [r for r in self._pending if r <= self.delivered]:
                del self._pending[rev]
            if gap_before is not None:
                await self._gap(gap_before)
                continue
            self._gap_retries = 0
            if len(events) < PAGE:
                return

    _gap_retries = 0

    async def _gap(self, found: int) -> None:
        missing = self.delivered + 1
        compacted = await self._compacted_revision()
        if found <= self.delivered:
            return
        if compacted >= missing or self._gap_retries >= 40:
            # History this instance had not delivered yet is gone (it fell more than `history`
            # revisions behind and was compacted): its watches cannot be continued.
            self._expire_all(self.delivered, max(compacted, found - 1) + 1)
            self.delivered = found - 1
            self._gap_retries = 0
        else:
            # Revisions commit in order, so a hole is not expected to last: look again shortly
            # rather than skip a revision.
            self._gap_retries += 1
            log.warning("store event pump: revision %d missing before %d; rereading", missing, found)
            await asyncio.sleep(0.05)


class HousekeepingMixin:
    """Runs sweep_expired() and compact_history() every ``housekeeping_interval`` seconds.

    The period is real time (asyncio.sleep), not the injected clock: it is a polling cadence,
    and a FakeClock's sleep would advance virtual time on its own. Expiry itself is decided by
    the injected clock's now().
    """

    _clock: Clock
    _history: int
    _housekeeping_interval: float | None
    _housekeeping_task: asyncio.Task[None] | None = None

    async def sweep_expired(self) -> int:  # pragma: no cover - provided by the backend
        raise NotImplementedError

    async def revision(self) -> int:  # pragma: no cover - provided by the backend
        raise NotImplementedError

    async def compact(self, revision: int) -> None:  # pragma: no cover - provided by the backend
        raise NotImplementedError

    async def _compacted(self) -> int:  # pragma: no cover - provided by the backend
        raise NotImplementedError

    def _start_housekeeping(self) -> None:
        if self._housekeeping_interval:
            self._housekeeping_task = asyncio.create_task(self._housekeeping(), name="store-housekeeping")

    async def _stop_housekeeping(self) -> None:
        await cancel_and_wait(self._housekeeping_task)
        self._housekeeping_task = None

    async def _read_replay(
        self, resource: str | None, namespace: str | None, after: int, upto: int, limit: int
    ) -> tuple[int, list[WatchEvent]]:  # pragma: no cover - provided by the backend
        raise NotImplementedError

    async def history(
        self, resource: str | None, namespace: str | None, after: int, upto: int
    ) -> list[WatchEvent]:
        """The events with after < revision <= upto, in order; Expired when compaction has
        dropped any of them. Lets the API server serve a list as of an older revision."""
        out: list[WatchEvent] = []
        cursor = after
        while cursor < upto:
            compacted, page = await self._read_replay(resource, namespace, cursor, upto, 500)
            if after < compacted:
                raise Expired(after, compacted + 1)
            out.extend(page)
            if len(page) < 500:
                break
            cursor = page[-1].revision
        return out

    async def compact_history(self) -> None:
        """Compact all but the last ``history`` revisions (what housekeeping runs), at most
        COMPACT_STEP revisions a transaction with a turn of the event loop between: deleting a
        second's history at once (550 events at 1,000 nodes) held the loop 18-100 ms, every
        second, and every request waited for it."""
        target = await self.revision() - self._history
        compacted = await self._compacted()
        while target > 0 and target > compacted:
            step = min(target, compacted + COMPACT_STEP)
            await self.compact(step)
            compacted = step
            if step < target:
                await asyncio.sleep(0)

    async def _housekeeping(self) -> None:
        assert self._housekeeping_interval
        while True:
            await asyncio.sleep(self._housekeeping_interval)
            try:
                await self.sweep_expired()
                await self.compact_history()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("store housekeeping failed")


class StoreBase(HousekeepingMixin):
    """What the two backends share above their SQL: the settings, the event hub, the watch,
    and create/update/delete over one ``_write_one`` each backend provides."""

    _codec: Codec
    _hub: EventHub

    def _setup(self, *, clock: Clock, history: int, housekeeping_interval: float | None, codec: Codec | None,
               watch_buffer: int) -> None:
        if codec is None:
            from gpufleet.store.encryption import IDENTITY as codec
        self._codec = codec
        self._clock = clock
        self._history = history
        self._housekeeping_interval = housekeeping_interval
        self._hub = EventHub(
            read_after=self._read_after,
            read_replay=self._read_replay,
            compacted_revision=self._compacted,
            current_revision=self.revision,
            buffer=watch_buffer,
        )

    async def _read_after(self, revision: int, limit: int) -> Events:  # pragma: no cover - the backend's
        raise NotImplementedError

    async def _write_one(
        self, type_: str, resource: str, namespace: str, name: str, text: str | None, ttl: float | None,
        expected: int | None,
    ) -> tuple[int, str]:  # pragma: no cover - provided by the backend
        """Write one event of ``type_`` (ADDED, MODIFIED, DELETED; ``text`` None for a delete)
        and publish it; returns its revision and the stored text of the object it leaves."""
        raise NotImplementedError

    async def _write_many(
        self, resource: str, writes: list[tuple[str, str, str, int | None]],
    ) -> list[int]:  # pragma: no cover - provided by the backend
        """Write one MODIFIED event per (namespace, name, text, expected revision), all in one
        transaction or none, and publish them; returns their revisions."""
        raise NotImplementedError

    async def _list_rows(
        self, resource: str, namespace: str | None, after: tuple[str, str] | None, limit: int | None,
        node: str | None = None,
    ) -> tuple[int, list[Any]]:  # pragma: no cover - provided by the backend
        """The revision read at and the rows (namespace, name, revision, value) of
        objects_query, in one snapshot."""
        raise NotImplementedError

    async def list(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        limit: int | None = None,
        after: tuple[str, str] | None = None,
        node: str | None = None,
    ) -> ListResult:
        if node and self._codec.may_encrypt(resource):
            node = None  # encrypted values hide spec.nodeName from the index: the caller filters
        rev, rows = await self._list_rows(resource, namespace, after, limit, node or None)
        return list_page(self._codec, resource, rows, rev, limit)

    async def list_json(
        self, resource: str, namespace: str | None = None, *, limit: int | None = None,
    ) -> tuple[int, list[str], tuple[str, str] | None] | None:
        """A list as the objects' JSON texts, resourceVersion stamped in, never decoded (what a
        full list of thousands of pods costs is mostly decoding and encoding them again):
        (revision, texts, the key to continue after). None where values may be encrypted:
        those need the codec, so the caller lists as usual."""
        if self._codec.may_encrypt(resource):
            return None
        rev, rows = await self._list_rows(resource, namespace, None, limit)
        if not all_objects(rows):
            return None
        next_key = None
        if limit and len(rows) > limit:
            rows = rows[:limit]
            next_key = (rows[-1][0], rows[-1][1])
        return rev, [stamped_json(r[3] if isinstance(r[3], str) else r[3].decode(), r[2]) for r in rows], next_key

    def is_stale(self, resource: str, namespace: str, name: str, revision: int) -> bool:
        """Whether the object at ``revision`` was stored with another encryption key than
        writes use now (an unchanged update rewrites it then)."""
        return self._codec.is_stale(resource, namespace, name, revision)

    async def watch(self, resource: str | None, namespace: str | None, from_revision: int) -> StoreWatch:
        w = self._hub.register(resource, namespace, from_revision)
        try:
            await w.fill_replay()
        except BaseException:
            await w.close()
            raise
        return w

    async def create(
        self, resource: str, namespace: str, name: str, obj: dict[str, Any], *, ttl: float | None = None
    ) -> dict[str, Any]:
        text = self._codec.encode(resource, namespace, name, obj)
        rev, _ = await self._write_one("ADDED", resource, namespace, name, text, ttl, None)
        return self._codec.decode(resource, namespace, name, text, rev)

    async def update(
        self,
        resource: str,
        namespace: str,
        name: str,
        obj: dict[str, Any],
        *,
        expected_revision: int | None = None,
        ttl: float | None = None,
    ) -> dict[str, Any]:
        """ttl None keeps the object's current expiry (if any)."""
        text = self._codec.encode(resource, namespace, name, obj)
        rev, _ = await self._write_one("MODIFIED", resource, namespace, name, text, ttl, expected_revision)
        return self._codec.decode(resource, namespace, name, text, rev)

    async def update_many(self, resource: str, updates: list[Update]) -> list[dict[str, Any]]:
        """All or none, in one transaction; one MODIFIED event per object (see Store)."""
        if not updates:
            return []
        keys = [(u.namespace, u.name) for u in updates]
        if len(set(keys)) != len(keys):
            raise ValueError(f"update_many of {resource}: an object is named twice")
        texts = [self._codec.encode(resource, u.namespace, u.name, u.object) for u in updates]
        revs = await self._write_many(
            resource, [(u.namespace, u.name, t, u.expected_revision) for u, t in zip(updates, texts, strict=True)])
        return [self._codec.decode(resource, u.namespace, u.name, t, r)
                for u, t, r in zip(updates, texts, revs, strict=True)]

    async def delete(
        self, resource: str, namespace: str, name: str, *, expected_revision: int | None = None
    ) -> dict[str, Any]:
        rev, text = await self._write_one("DELETED", resource, namespace, name, None, None, expected_revision)
        return self._codec.decode(resource, namespace, name, text, rev)
