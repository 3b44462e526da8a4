"""The embedded store: one SQLite file in WAL mode.

Tables (after k3s' kine, simplified):

    meta(id = 0, revision, compacted)       the global revision and the compaction point
    objects(resource, namespace, name)      current state -> (revision, value, expires_at)
    events(revision)                        append-only history: type, key, value, prev_revision,
                                            prev_value; compacted from the oldest end

Every write runs in a ``BEGIN IMMEDIATE`` transaction that reads the revision, checks the
object, bumps the revision and writes both tables, so revisions are dense and commit in
order, including between processes sharing the file. Calls are synchronous on the event
loop: a write is one short transaction (a create took 0.7 ms at the median with
synchronous=FULL, 0.2 ms with NORMAL, on the development VM), and staying on the loop keeps
the commit order and the fast path trivial. A disk with slow fsync stalls the loop for as long.

Group commit: the creates, updates and deletes asked for within one turn of the event loop
are written in one transaction, each in a savepoint of its own, so one commit (one fsync)
carries all of them. Each write still succeeds or fails alone (a Conflict rolls back only
its own savepoint), takes the next revision in the order asked, and is answered only after
the commit, so an acknowledged write is as durable as before.

Another process writing the same file is noticed by polling ``PRAGMA data_version``, which
changes only when some other connection commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gpufleet.store._common import StoreBase
from gpufleet.store._rows import (
    Codec,
    Events,
    all_objects,
    already_exists,
    conflict,
    event_from_row,
    events_query,
    not_found,
    objects_query,
    stamped_json,
)
from gpufleet.store.base import WatchEvent
from gpufleet.store.listcache import IDLE_SECONDS, ListCache
from gpufleet.utils.clock import REAL_CLOCK, Clock
from gpufleet.utils.files import private_file, tighten
from gpufleet.utils.tasks import cancel_and_wait

T = TypeVar("T")
# A write: given the connection inside the transaction and the current revision, it checks
# and writes, returning its result and its events (revisions current+1, ...); it raises
# before writing anything when it cannot be made.
_Op = Callable[[sqlite3.Connection, int], tuple[T, "Events"]]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    revision INTEGER NOT NULL,
    compacted INTEGER NOT NULL
);
INSERT OR IGNORE INTO meta (id, revision, compacted) VALUES (0, 0, 0);
CREATE TABLE IF NOT EXISTS objects (
    resource TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    revision INTEGER NOT NULL,
    value TEXT NOT NULL,
    expires_at REAL,
    PRIMARY KEY (resource, namespace, name)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS objects_expires_at ON objects (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS objects_pod_node ON objects (json_extract(value, '$.spec.nodeName'), namespace, name)
    WHERE resource = 'pods';
CREATE TABLE IF NOT EXISTS events (
    revision INTEGER PRIMARY KEY,
    type TEXT NOT NULL,
    resource TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    prev_revision INTEGER,
    prev_value TEXT
);
"""

# As in the index objects_pod_node (named in the query: without statistics SQLite's planner
# prefers the primary key's resource prefix, which reads every pod).
_NODE_EXPR = "json_extract(value, '$.spec.nodeName')"
_EVENT_COLUMNS = "revision, type, resource, namespace, name, value, prev_revision, prev_value"
_SWEEP_BATCH = 1000


def _parse_url(url: str) -> str:
    if not url.startswith("sqlite://"):
        raise ValueError(f"not a sqlite URL: {url!r}")
    rest = url[len("sqlite://") :]
    if rest in (":memory:", "/:memory:", ""):
        return ":memory:"
    return rest


class SQLiteStore(StoreBase):
    """``SQLiteStore("sqlite:///abs/path.db")`` or ``"sqlite://:memory:"``.

    history: revisions of event history kept for watches (older ones are compacted).
    synchronous: "full" (default: an acknowledged write survives power loss) or "normal"
    (survives a process crash; the last commits may be lost on power loss, about 10x faster).
    busy_timeout: seconds a write waits for another process holding the write lock.
    watch_buffer: live events a watch may have queued before it is ended with Expired.
    housekeeping_interval: seconds between ttl sweeps and compactions (None: never).
    poll_interval: seconds between checks for other processes' writes.
    list_cache: serve full lists (no selector) from texts kept current in memory.
    """

    def __init__(
        self,
        url: str,
        *,
        clock: Clock = REAL_CLOCK,
        history: int = 20000,
        synchronous: str = "full",
        busy_timeout: float = 10.0,
        watch_buffer: int = 10000,
        housekeeping_interval: float | None = 1.0,
        poll_interval: float = 0.05,
        codec: Codec | None = None,
        list_cache: bool = True,
    ) -> None:
        if synchronous.lower() not in ("full", "normal", "extra", "off"):
            raise ValueError(f"synchronous must be 'full' or 'normal', not {synchronous!r}")
        self._path = _parse_url(url)
        self._setup(clock=clock, history=history, housekeeping_interval=housekeeping_interval, codec=codec,
                    watch_buffer=watch_buffer)
        self._synchronous = synchronous.upper()
        self._busy_timeout = busy_timeout
        self._poll_interval = poll_interval
        self._db: sqlite3.Connection | None = None
        self._batch: list[tuple[_Op[Any], asyncio.Future[Any]]] = []
        self.commits = 0  # write transactions committed (group commits count once)
        self._poll_task: asyncio.Task[None] | None = None
        self._data_version = 0
        # Full lists served from memory, kind by kind (see store/listcache.py); None: off.
        self._list_caches: dict[str, ListCache] | None = {} if list_cache else None

    # -- lifecycle

    async def _enter_wal(self, db: sqlite3.Connection) -> None:
        """Switch to WAL. Changing the journal mode needs the database to itself and SQLite
        answers "database is locked" at once, not after busy_timeout, while another process
        opens the same fresh file: so wait and retry here, within the busy timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(self._busy_timeout, 1.0)
        delay = 0.01
        while True:
            try:
                db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or loop.time() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def start(self) -> None:
        if self._path != ":memory:":
            # The database holds every Secret: owner-only, from its first byte. SQLite makes
            # its -wal and -shm files with the database's mode; ones left by an earlier run
            # are tightened too. (Where the file cannot be made, sqlite3 says why below.)
            with contextlib.suppress(OSError):
                private_file(Path(self._path))
        db = sqlite3.connect(self._path, isolation_level=None, timeout=self._busy_timeout)
        db.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
        if self._path != ":memory:":
            await self._enter_wal(db)
            for suffix in ("-wal", "-shm", "-journal"):
                with contextlib.suppress(OSError):
                    tighten(Path(self._path + suffix))
        db.execute(f"PRAGMA synchronous = {self._synchronous}")
        self._db = db

        def schema() -> None:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)

        self._write_txn(schema)
        self._data_version = db.execute("PRAGMA data_version").fetchone()[0]
        self._hub.start(await self.revision())
        if self._path != ":memory:":
            self._poll_task = asyncio.create_task(self._poll(), name="sqlite-store-poll")
        self._start_housekeeping()

    async def close(self) -> None:
        await self._stop_housekeeping()
        await cancel_and_wait(self._poll_task)
        self._poll_task = None
        await self._hub.stop()
        if self._db is not None:
            self._db.close()
            self._db = None

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval)
            if self._db is None:
                return
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
            if version != self._data_version:
                self._data_version = version
                self._hub.poke()
            self._drop_idle_list_caches()

    # -- transactions

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("store is not started")
        return self._db

    def _write_txn(self, fn: Callable[[], T]) -> T:
        db = self._conn
        db.execute("BEGIN IMMEDIATE")
        try:
            result = fn()
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return result

    def _read_txn(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        db = self._conn
        db.execute("BEGIN")
        try:
            return fn(db)
        finally:
            db.execute("COMMIT")

    def _enqueue(self, op: _Op[T]) -> asyncio.Future[T]:
        """Queue a write for this turn's group commit; its future is answered after the commit."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        if not self._batch:
            loop.call_soon(self._flush)
        self._batch.append((op, fut))
        return fut

    def _flush(self) -> None:
        """Run the queued writes in one transaction, each in its own savepoint, then publish
        their events in revision order and answer each write."""
        batch, self._batch = self._batch, []
        if not batch:
            return
        outcomes: list[tuple[asyncio.Future[Any], BaseException | None, Any]] = []
        published: Events = []
        try:
            db = self._conn
            db.execute("BEGIN IMMEDIATE")
            try:
                rev = db.execute("SELECT revision FROM meta WHERE id = 0").fetchone()[0]
                alone = len(batch) == 1  # no savepoint needed: a failure rolls back the whole
                for op, fut in batch:
                    if not alone:
                        db.execute("SAVEPOINT write")
                    try:
                        result, events = op(db, rev)
                    except Exception as exc:
                        db.execute("ROLLBACK" if alone else "ROLLBACK TO write")
                        if not alone:
                            db.execute("RELEASE write")
                        outcomes.append((fut, exc, None))
                        continue
                    if not alone:
                        db.execute("RELEASE write")
                    if events:
                        rev = events[-1].revision
                        published.extend(events)
                    outcomes.append((fut, None, result))
                if published:
                    db.execute("UPDATE meta SET revision = ? WHERE id = 0", (rev,))
                if db.in_transaction:  # a lone write that failed has rolled back already
                    db.execute("COMMIT")
                    self.commits += 1
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except Exception as exc:  # nothing of the batch is stored
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        self._hub.publish(published)
        for fut, exc, result in outcomes:
            if fut.done():  # its caller was cancelled; the write stands, as one already sent
                continue
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(result)

    def _write(self, fn: Callable[[sqlite3.Connection, int], tuple[T, Events]]) -> T:
        """Run fn(db, current revision) inside a write transaction; fn returns its result and
        the events it wrote (revisions current+1, current+2, ...)."""
        db = self._conn

        def txn() -> tuple[T, Events]:
            rev = db.execute("SELECT revision FROM meta WHERE id = 0").fetchone()[0]
            result, events = fn(db, rev)
            if events:
                db.execute("UPDATE meta SET revision = ? WHERE id = 0", (events[-1].revision,))
            return result, events

        result, events = self._write_txn(txn)
        self.commits += 1
        self._hub.publish(events)
        return result

    # -- reads

    async def revision(self) -> int:
        return self._conn.execute("SELECT revision FROM meta WHERE id = 0").fetchone()[0]

    async def _compacted(self) -> int:
        return self._conn.execute("SELECT compacted FROM meta WHERE id = 0").fetchone()[0]

    async def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        row = self._conn.execute(
            "SELECT revision, value FROM objects WHERE resource = ? AND namespace = ? AND name = ?",
            (resource, namespace, name),
        ).fetchone()
        if row is None:
            raise not_found(resource, namespace, name)
        return self._codec.decode(resource, namespace, name, row[1], row[0])

    async def _list_rows(
        self, resource: str, namespace: str | None, after: tuple[str, str] | None, limit: int | None,
        node: str | None = None,
    ) -> tuple[int, list[Any]]:
        sql, args = objects_query("?", resource, namespace, after, limit, node, _NODE_EXPR,
                                  "objects INDEXED BY objects_pod_node")

        def read(db: sqlite3.Connection) -> tuple[int, list[Any]]:
            rev = db.execute("SELECT revision FROM meta WHERE id = 0").fetchone()[0]
            return rev, db.execute(sql, args).fetchall()

        return self._read_txn(read)

    async def list_json(
        self, resource: str, namespace: str | None = None, *, limit: int | None = None,
    ) -> tuple[int, list[Any], tuple[str, str] | None] | None:
        """As StoreBase.list_json, from the kind's list cache when the event hub has delivered
        every committed revision (the cache is then the kind as at that revision); the first
        full list of a kind reads the database and makes the cache."""
        caches = self._list_caches
        if caches is None or self._codec.may_encrypt(resource):
            return await super().list_json(resource, namespace, limit=limit)
        cache = caches.get(resource)
        if cache is not None and not cache.live:
            del caches[resource]
            cache = None
        if cache is None:
            # No await from the read to attaching the cache: no event can fall in between.
            rev, rows = await self._list_rows(resource, None, None, None)
            if self._hub.delivered != rev or not all_objects(rows):
                # Another process's writes not delivered yet, or a value only the codec reads.
                return await super().list_json(resource, namespace, limit=limit)
            cache = ListCache(self._hub, resource, {
                (r[0], r[1]): stamped_json(r[3] if isinstance(r[3], str) else r[3].decode(), r[2]).encode()
                for r in rows})
            self._hub.attach(cache)
            caches[resource] = cache
        else:
            rev = self._conn.execute("SELECT revision FROM meta WHERE id = 0").fetchone()[0]
            if self._hub.delivered != rev:
                return await super().list_json(resource, namespace, limit=limit)
        texts, next_key = cache.texts(namespace, limit)
        return rev, texts, next_key

    def _drop_idle_list_caches(self) -> None:
        if not self._list_caches:
            return
        idle = time.monotonic() - IDLE_SECONDS
        for resource, cache in list(self._list_caches.items()):
            if not cache.live or cache.used < idle:
                cache.close()
                del self._list_caches[resource]

    async def _read_after(self, revision: int, limit: int) -> Events:
        rows = self._conn.execute(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE revision > ? ORDER BY revision LIMIT ?",
            (revision, limit),
        ).fetchall()
        return [event_from_row(*r, self._codec) for r in rows]

    async def _read_replay(
        self, resource: str | None, namespace: str | None, after: int, upto: int, limit: int
    ) -> tuple[int, Events]:
        sql, args = events_query("?", _EVENT_COLUMNS, resource, namespace, after, upto, limit)

        def read(db: sqlite3.Connection) -> tuple[int, list[Any]]:
            compacted = db.execute("SELECT compacted FROM meta WHERE id = 0").fetchone()[0]
            rows = db.execute(sql, args).fetchall() if after < upto else []
            return compacted, rows

        compacted, rows = self._read_txn(read)
        return compacted, [event_from_row(*r, self._codec) for r in rows]

    # -- writes

    def _expiry(self, ttl: float | None) -> float | None:
        return None if ttl is None else self._clock.now() + ttl

    async def _write_one(
        self, type_: str, resource: str, namespace: str, name: str, text: str | None, ttl: float | None,
        expected: int | None,
    ) -> tuple[int, str]:
        expires_at = self._expiry(ttl)

        def op(db: sqlite3.Connection, rev: int) -> tuple[tuple[int, str], Events]:
            new = rev + 1
            if type_ == "ADDED":
                assert text is not None
                cur = db.execute(
                    "INSERT INTO objects (resource, namespace, name, revision, value, expires_at)"
                    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (resource, namespace, name, new, text, expires_at),
                )
                if cur.rowcount == 0:
                    raise already_exists(resource, namespace, name)
                db.execute(
                    f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES (?, 'ADDED', ?, ?, ?, ?, NULL, NULL)",
                    (new, resource, namespace, name, text),
                )
                return (new, text), [event_from_row(new, "ADDED", resource, namespace, name, text, None, None,
                                                    self._codec)]
            if type_ == "DELETED":
                prev_rev, prev_text, _ = self._current(db, resource, namespace, name)
                if expected is not None and prev_rev != expected:
                    raise conflict(self._codec, resource, namespace, name, prev_rev, expected, prev_text)
                return (new, prev_text), [
                    self._delete_row(db, new, resource, namespace, name, prev_rev, prev_text)
                ]
            assert text is not None
            ev = self._modify_row(db, new, resource, namespace, name, text, ttl, expected)
            return (new, text), [ev]

        return await self._enqueue(op)

    async def _write_many(self, resource: str, writes: list[tuple[str, str, str, int | None]]) -> list[int]:
        def op(db: sqlite3.Connection, rev: int) -> tuple[list[int], Events]:
            events = [self._modify_row(db, rev + i, resource, namespace, name, text, None, expected)
                      for i, (namespace, name, text, expected) in enumerate(writes, start=1)]
            return [ev.revision for ev in events], events

        result = self._write(op)
        await asyncio.sleep(0)
        return result

    def _modify_row(
        self, db: sqlite3.Connection, new: int, resource: str, namespace: str, name: str, text: str,
        ttl: float | None, expected: int | None,
    ) -> WatchEvent:
        """Replace the object (compare-and-swap on ``expected``) at revision ``new``; ttl None
        keeps its expiry."""
        prev_rev, prev_text, prev_expires = self._current(db, resource, namespace, name)
        if expected is not None and prev_rev != expected:
            raise conflict(self._codec, resource, namespace, name, prev_rev, expected, prev_text)
        db.execute(
            "UPDATE objects SET revision = ?, value = ?, expires_at = ?"
            " WHERE resource = ? AND namespace = ? AND name = ?",
            (new, text, prev_expires if ttl is None else self._expiry(ttl), resource, namespace, name),
        )
        db.execute(
            f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES (?, 'MODIFIED', ?, ?, ?, ?, ?, ?)",
            (new, resource, namespace, name, text, prev_rev, prev_text),
        )
        return event_from_row(new, "MODIFIED", resource, namespace, name, text, prev_rev, prev_text, self._codec)

    def _current(
        self, db: sqlite3.Connection, resource: str, namespace: str, name: str
    ) -> tuple[int, str, Any]:
        row = db.execute(
            "SELECT revision, value, expires_at FROM objects WHERE resource = ? AND namespace = ? AND name = ?",
            (resource, namespace, name),
        ).fetchone()
        if row is None:
            raise not_found(resource, namespace, name)
        return row

    def _delete_row(
        self,
        db: sqlite3.Connection,
        new: int,
        resource: str,
        namespace: str,
        name: str,
        prev_rev: int,
        text: str,
    ) -> WatchEvent:
        db.execute(
            "DELETE FROM objects WHERE resource = ? AND namespace = ? AND name = ?",
            (resource, namespace, name),
        )
        db.execute(
            f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES (?, 'DELETED', ?, ?, ?, ?, ?, ?)",
            (new, resource, namespace, name, text, prev_rev, text),
        )
        return event_from_row(new, "DELETED", resource, namespace, name, text, prev_rev, text, self._codec)

    async def sweep_expired(self) -> int:
        now = self._clock.now()
        total = 0
        while True:
            # Look before taking the write lock: most sweeps find nothing.
            if (
                self._conn.execute("SELECT 1 FROM objects WHERE expires_at <= ? LIMIT 1", (now,)).fetchone()
                is None
            ):
                return total

            def op(db: sqlite3.Connection, rev: int) -> tuple[int, Events]:
                rows = db.execute(
                    "SELECT resource, namespace, name, revision, value FROM objects WHERE expires_at <= ?"
                    " ORDER BY expires_at, resource, namespace, name LIMIT ?",
                    (now, _SWEEP_BATCH),
                ).fetchall()
                events = []
                for resource, namespace, name, prev_rev, text in rows:
                    rev += 1
                    events.append(self._delete_row(db, rev, resource, namespace, name, prev_rev, text))
                return len(events), events

            total += self._write(op)
            await asyncio.sleep(0)

    async def compact(self, revision: int) -> None:
        def op() -> None:
            current, compacted = self._conn.execute(
                "SELECT revision, compacted FROM meta WHERE id = 0"
            ).fetchone()
            target = min(revision, current)
            if target <= compacted:
                return
            self._conn.execute("DELETE FROM events WHERE revision <= ?", (target,))
            self._conn.execute("UPDATE meta SET compacted = ? WHERE id = 0", (target,))

        self._write_txn(op)
