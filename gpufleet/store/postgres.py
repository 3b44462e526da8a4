"""The shared store: PostgreSQL, for a control plane with several API server processes.

Same tables as the SQLite store (meta, objects, events; see gpufleet/store/sqlite.py). A write
is one call of a PL/pgSQL function in autocommit mode, one round trip: it locks the single
``meta`` row first, checks the object, bumps the revision, writes both tables and NOTIFYs the
revision. The row lock is held until commit, so writers commit in revision order and a
reader that sees revision N sees every revision below it; revisions stay dense because a
failed check returns before the counter moves.

Each store instance keeps one extra connection LISTENing on the channel. A notification for a
revision this instance has not delivered yet (another process wrote it) wakes the event pump,
which reads the history table from the last delivered revision.

Connections come from a small pool of our own (no psycopg_pool dependency): ``pool_size``
connections at most, opened on demand, dropped when broken.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus

from gpufleet.store._common import StoreBase
from gpufleet.store._rows import (
    Codec,
    Events,
    already_exists,
    conflict,
    event_from_row,
    events_query,
    key_str,
    not_found,
    objects_query,
)
from gpufleet.utils.clock import REAL_CLOCK, Clock
from gpufleet.utils.tasks import cancel_and_wait

log = logging.getLogger(__name__)

CHANNEL = "gpufleet_events"
# Held while creating the schema so that several servers starting at once do not race.
_SCHEMA_LOCK = 0x67707566

def _has_nul(*parts: str) -> bool:
    """PostgreSQL's text cannot hold NUL, so no stored key does: a key with one names nothing
    (a read finds nothing, rather than the driver raising)."""
    return any("\x00" in p for p in parts)


def _after_without_nul(after: tuple[str, str]) -> tuple[str, str]:
    """A key that sorts, among keys without NUL, as ``after`` does: a stored string is after
    ``p + "\x00" + rest`` exactly when it is after ``p`` (it cannot equal it, and NUL is the
    smallest character)."""
    ns, name = after
    if "\x00" in ns:
        # After every name in namespace p: the largest name, as no stored name reaches it.
        return ns.split("\x00", 1)[0], "\U0010ffff" * 254
    return ns, name.split("\x00", 1)[0]


# As in the index objects_pod_node, so the planner uses it.
_NODE_EXPR = "value #>> '{spec,nodeName}'"

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS meta (
        id integer PRIMARY KEY CHECK (id = 0),
        revision bigint NOT NULL,
        compacted bigint NOT NULL
    )""",
    "INSERT INTO meta (id, revision, compacted) VALUES (0, 0, 0) ON CONFLICT DO NOTHING",
    # COLLATE "C": (namespace, name) order and pagination by bytes, as in SQLite.
    """CREATE TABLE IF NOT EXISTS objects (
        resource text COLLATE "C" NOT NULL,
        namespace text COLLATE "C" NOT NULL,
        name text COLLATE "C" NOT NULL,
        revision bigint NOT NULL,
        value json NOT NULL,
        expires_at double precision,
        PRIMARY KEY (resource, namespace, name)
    )""",
    "CREATE INDEX IF NOT EXISTS objects_expires_at ON objects (expires_at) WHERE expires_at IS NOT NULL",
    f"CREATE INDEX IF NOT EXISTS objects_pod_node ON objects (({_NODE_EXPR}), namespace, name) WHERE resource = 'pods'",
    """CREATE TABLE IF NOT EXISTS events (
        revision bigint PRIMARY KEY,
        type text NOT NULL,
        resource text COLLATE "C" NOT NULL,
        namespace text COLLATE "C" NOT NULL,
        name text COLLATE "C" NOT NULL,
        value json NOT NULL,
        prev_revision bigint,
        prev_value json
    )""",
    f"""CREATE OR REPLACE FUNCTION gpufleet_write(
        p_type text, p_resource text, p_namespace text, p_name text, p_value json,
        p_set_expiry boolean, p_expires_at double precision, p_expected bigint)
    RETURNS TABLE (o_status text, o_revision bigint, o_prev_revision bigint, o_prev_value text)
    LANGUAGE plpgsql AS $$
    DECLARE
        rev bigint;
        cur_rev bigint;
        cur_value json;
    BEGIN
        SELECT m.revision INTO rev FROM meta m WHERE m.id = 0 FOR UPDATE;
        SELECT o.revision, o.value INTO cur_rev, cur_value FROM objects o
            WHERE o.resource = p_resource AND o.namespace = p_namespace AND o.name = p_name;
        IF p_type = 'ADDED' THEN
            IF cur_rev IS NOT NULL THEN
                RETURN QUERY SELECT 'exists', NULL::bigint, cur_rev, cur_value::text;
                RETURN;
            END IF;
        ELSIF cur_rev IS NULL THEN
            RETURN QUERY SELECT 'missing', NULL::bigint, NULL::bigint, NULL::text;
            RETURN;
        ELSIF p_expected IS NOT NULL AND cur_rev <> p_expected THEN
            RETURN QUERY SELECT 'conflict', NULL::bigint, cur_rev, cur_value::text;
            RETURN;
        END IF;
        rev := rev + 1;
        UPDATE meta SET revision = rev WHERE id = 0;
        IF p_type = 'ADDED' THEN
            INSERT INTO objects (resource, namespace, name, revision, value, expires_at)
                VALUES (p_resource, p_namespace, p_name, rev, p_value, p_expires_at);
        ELSIF p_type = 'MODIFIED' THEN
            UPDATE objects o SET revision = rev, value = p_value,
                expires_at = CASE WHEN p_set_expiry THEN p_expires_at ELSE o.expires_at END
                WHERE o.resource = p_resource AND o.namespace = p_namespace AND o.name = p_name;
        ELSE
            DELETE FROM objects o
                WHERE o.resource = p_resource AND o.namespace = p_namespace AND o.name = p_name;
            p_value := cur_value;
        END IF;
        INSERT INTO events (revision, type, resource, namespace, name, value, prev_revision, prev_value)
            VALUES (rev, p_type, p_resource, p_namespace, p_name, p_value, cur_rev, cur_value);
        PERFORM pg_notify('{CHANNEL}', rev::text);
        RETURN QUERY SELECT 'ok', rev, cur_rev, cur_value::text;
    END $$""",
    f"""CREATE OR REPLACE FUNCTION gpufleet_sweep(p_now double precision, p_limit integer)
    RETURNS TABLE (o_revision bigint, o_resource text, o_namespace text, o_name text,
                   o_prev_revision bigint, o_value text)
    LANGUAGE plpgsql AS $$
    DECLARE
        rev bigint;
        r record;
    BEGIN
        SELECT m.revision INTO rev FROM meta m WHERE m.id = 0 FOR UPDATE;
        FOR r IN SELECT o.resource, o.namespace, o.name, o.revision, o.value FROM objects o
                WHERE o.expires_at <= p_now
                ORDER BY o.expires_at, o.resource, o.namespace, o.name LIMIT p_limit LOOP
            rev := rev + 1;
            DELETE FROM objects o
                WHERE o.resource = r.resource AND o.namespace = r.namespace AND o.name = r.name;
            INSERT INTO events (revision, type, resource, namespace, name, value, prev_revision, prev_value)
                VALUES (rev, 'DELETED', r.resource, r.namespace, r.name, r.value, r.revision, r.value);
            o_revision := rev;
            o_resource := r.resource;
            o_namespace := r.namespace;
            o_name := r.name;
            o_prev_revision := r.revision;
            o_value := r.value::text;
            RETURN NEXT;
        END LOOP;
        IF o_revision IS NOT NULL THEN
            UPDATE meta SET revision = rev WHERE id = 0;
            PERFORM pg_notify('{CHANNEL}', rev::text);
        END IF;
    END $$""",
]

_EVENT_COLUMNS = "revision, type, resource, namespace, name, value::text, prev_revision, prev_value::text"
_SWEEP_BATCH = 1000


class _Pool:
    """At most ``size`` autocommit connections, opened on demand."""

    def __init__(self, url: str, size: int) -> None:
        self._url = url
        self._idle: list[AsyncConnection[Any]] = []
        self._slots = asyncio.Semaphore(size)
        self._all: set[AsyncConnection[Any]] = set()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        async with self._slots:
            conn = None
            while self._idle and conn is None:
                conn = self._idle.pop()
                if conn.closed:
                    self._all.discard(conn)
                    conn = None
            if conn is None:
                conn = await AsyncConnection.connect(self._url, autocommit=True)
                self._all.add(conn)
            healthy = False
            try:
                yield conn
                healthy = True
            finally:
                if healthy and not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE:
                    self._idle.append(conn)
                else:
                    # A cancelled or failed call can leave a query in flight: never reuse it.
                    self._all.discard(conn)
                    with contextlib.suppress(Exception):
                        await conn.close()

    async def close(self) -> None:
        conns, self._all, self._idle = self._all, set(), []
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.close()


class PostgresStore(StoreBase):
    """``PostgresStore("postgresql://user@host:5432/db")``.

    history: revisions of event history kept for watches (older ones are compacted).
    pool_size: connections used for reads and writes (plus one for LISTEN).
    watch_buffer: live events a watch may have queued before it is ended with Expired.
    housekeeping_interval: seconds between ttl sweeps and compactions (None: never).
    """

    def __init__(
        self,
        url: str,
        *,
        clock: Clock = REAL_CLOCK,
        history: int = 20000,
        pool_size: int = 8,
        watch_buffer: int = 10000,
        housekeeping_interval: float | None = 1.0,
        codec: Codec | None = None,
    ) -> None:
        # libpq knows postgresql:// and postgres://; both are accepted by open_store.
        self._url = url
        self._setup(clock=clock, history=history, housekeeping_interval=housekeeping_interval, codec=codec,
                    watch_buffer=watch_buffer)
        self._pool = _Pool(url, pool_size)
        self._listen_task: asyncio.Task[None] | None = None

    # -- lifecycle

    async def start(self) -> None:
        async with self._pool.connection() as conn:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                for statement in _SCHEMA:
                    await conn.execute(statement)
        listening = asyncio.get_running_loop().create_future()
        self._listen_task = asyncio.create_task(self._listen(listening), name="postgres-store-listen")
        # LISTEN before reading the starting revision: no notification can fall in between.
        await listening
        self._hub.start(await self.revision())
        self._start_housekeeping()

    async def close(self) -> None:
        await self._stop_housekeeping()
        await cancel_and_wait(self._listen_task)
        self._listen_task = None
        await self._hub.stop()
        await self._pool.close()

    async def _listen(self, listening: asyncio.Future[None]) -> None:
        backoff = 0.1
        while True:
            conn = None
            try:
                conn = await AsyncConnection.connect(self._url, autocommit=True)
                await conn.execute(f"LISTEN {CHANNEL}")
                if not listening.done():
                    listening.set_result(None)
                else:
                    # Reconnected: notifications may have been missed meanwhile.
                    self._hub.poke()
                backoff = 0.1
                while True:
                    async for note in conn.notifies(timeout=1.0):
                        self._hub.observed(int(note.payload))
                    # A quiet second: look anyway, it costs one indexed query.
                    if self._hub.watching():
                        self._hub.poke()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not listening.done():
                    listening.set_exception(e)
                    return
                log.warning("postgres store: LISTEN connection lost (%s); reconnecting", e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()

    # -- reads

    async def _fetchone(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql, args)
            return await cur.fetchone()

    async def _fetchall(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[Any]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql, args)
            return await cur.fetchall()

    async def revision(self) -> int:
        return (await self._fetchone("SELECT revision FROM meta WHERE id = 0"))[0]

    async def _compacted(self) -> int:
        return (await self._fetchone("SELECT compacted FROM meta WHERE id = 0"))[0]

    async def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        if _has_nul(resource, namespace, name):
            raise not_found(resource, namespace, name)
        row = await self._fetchone(
            "SELECT revision, value::text FROM objects WHERE resource = %s AND namespace = %s AND name = %s",
            (resource, namespace, name),
        )
        if row is None:
            raise not_found(resource, namespace, name)
        return self._codec.decode(resource, namespace, name, row[1], row[0])

    async def _list_rows(
        self, resource: str, namespace: str | None, after: tuple[str, str] | None, limit: int | None,
        node: str | None = None,
    ) -> tuple[int, list[Any]]:
        if _has_nul(resource, namespace or ""):
            return await self.revision(), []
        if after is not None and _has_nul(*after):
            after = _after_without_nul(after)
        if node is not None and _has_nul(node):
            return await self.revision(), []
        inner, args = objects_query("%s", resource, namespace, after, limit, node, _NODE_EXPR)
        # One statement, one snapshot: the revision matches the rows (and comes back even when
        # there are none).
        rows = await self._fetchall(
            "SELECT m.revision, o.namespace, o.name, o.revision, o.value::text"
            f" FROM meta m LEFT JOIN LATERAL ({inner}) o ON true WHERE m.id = 0"
            " ORDER BY o.namespace, o.name",
            args,
        )
        return rows[0][0], [r[1:] for r in rows if r[1] is not None]

    async def _read_after(self, revision: int, limit: int) -> Events:
        rows = await self._fetchall(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE revision > %s ORDER BY revision LIMIT %s",
            (revision, limit),
        )
        return [event_from_row(*r, self._codec) for r in rows]

    async def _read_replay(
        self, resource: str | None, namespace: str | None, after: int, upto: int, limit: int
    ) -> tuple[int, Events]:
        if _has_nul(resource or "", namespace or ""):
            return await self._compacted(), []
        inner, args = events_query("%s", _EVENT_COLUMNS, resource, namespace, after, upto, limit)
        # The compaction point and the rows from one snapshot, so a concurrent compaction
        # cannot remove rows between the check and the read.
        rows = await self._fetchall(
            f"SELECT m.compacted, e.* FROM meta m LEFT JOIN LATERAL ({inner}) e ON true"
            " WHERE m.id = 0 ORDER BY e.revision",
            args,
        )
        compacted = rows[0][0]
        return compacted, [event_from_row(*r[1:], self._codec) for r in rows if r[1] is not None]

    # -- writes

    async def _write_one(
        self, type_: str, resource: str, namespace: str, name: str, text: str | None, ttl: float | None,
        expected: int | None,
    ) -> tuple[int, str]:
        if _has_nul(resource, namespace, name):
            if type_ == "ADDED":
                raise ValueError(f"{key_str(resource, namespace, name)}: a key cannot hold a NUL character")
            raise not_found(resource, namespace, name)
        # A create sets the expiry (none without a ttl); an update without a ttl keeps it.
        set_expiry = type_ == "ADDED" or ttl is not None
        expires_at = None if ttl is None else self._clock.now() + ttl
        row = await self._fetchone(
            "SELECT * FROM gpufleet_write(%s, %s, %s, %s, %s::json, %s, %s::float8, %s::bigint)",
            (type_, resource, namespace, name, text, set_expiry, expires_at, expected),
        )
        status, rev, prev_rev, prev_text = row
        if status == "exists":
            raise already_exists(resource, namespace, name)
        if status == "missing":
            raise not_found(resource, namespace, name)
        if status == "conflict":
            raise conflict(self._codec, resource, namespace, name, prev_rev, expected, prev_text)
        value = prev_text if type_ == "DELETED" else text
        assert value is not None
        self._hub.publish([event_from_row(rev, type_, resource, namespace, name, value, prev_rev, prev_text,
                                          self._codec)])
        return rev, value

    async def _write_many(self, resource: str, writes: list[tuple[str, str, str, int | None]]) -> list[int]:
        events: Events = []
        async with self._pool.connection() as conn:
            async with conn.transaction():  # an exception below rolls every write back
                for namespace, name, text, expected in writes:
                    if _has_nul(resource, namespace, name):
                        raise not_found(resource, namespace, name)
                    cur = await conn.execute(
                        "SELECT * FROM gpufleet_write(%s, %s, %s, %s, %s::json, %s, %s::float8, %s::bigint)",
                        ("MODIFIED", resource, namespace, name, text, False, None, expected),
                    )
                    status, rev, prev_rev, prev_text = await cur.fetchone()  # type: ignore[misc]
                    if status == "missing":
                        raise not_found(resource, namespace, name)
                    if status == "conflict":
                        raise conflict(self._codec, resource, namespace, name, prev_rev, expected, prev_text)
                    events.append(event_from_row(rev, "MODIFIED", resource, namespace, name, text, prev_rev,
                                                 prev_text, self._codec))
        self._hub.publish(events)
        return [ev.revision for ev in events]

    async def sweep_expired(self) -> int:
        now = self._clock.now()
        total = 0
        while True:
            # Look before taking the revision lock: most sweeps find nothing.
            if await self._fetchone("SELECT 1 FROM objects WHERE expires_at <= %s LIMIT 1", (now,)) is None:
                return total
            rows = await self._fetchall("SELECT * FROM gpufleet_sweep(%s, %s)", (now, _SWEEP_BATCH))
            self._hub.publish(
                [
                    event_from_row(rev, "DELETED", resource, namespace, name, value, prev_rev, value,
                                   self._codec)
                    for rev, resource, namespace, name, prev_rev, value in rows
                ]
            )
            total += len(rows)

    async def compact(self, revision: int) -> None:
        async with self._pool.connection() as conn:
            async with conn.transaction():
                cur = await conn.execute("SELECT LEAST(%s, revision) FROM meta WHERE id = 0", (revision,))
                (target,) = await cur.fetchone()  # type: ignore[misc]
                # Delete first and take the meta row lock last, so writers wait only for the commit.
                await conn.execute("DELETE FROM events WHERE revision <= %s", (target,))
                await conn.execute(
                    "UPDATE meta SET compacted = GREATEST(compacted, %s) WHERE id = 0", (target,)
                )
