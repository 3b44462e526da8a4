"""The versioned object store: one interface, two backends (SQLite, PostgreSQL).

Shape (after k3s' kine): every write bumps one global revision, like etcd. An object's
``metadata.resourceVersion`` is the revision of its last write, so an update that names the
revision it read is a compare-and-swap. Each write is also appended to a bounded event
history from which watches are served; a watch that asks for a revision older than the
history holds gets :class:`Expired` (the API answers 410 Gone and clients relist).

Objects are plain JSON dicts. The store owns ``metadata.resourceVersion`` (it writes the new
revision into every object it stores or returns) and nothing else: uids, timestamps,
defaults and validation belong to the API server.

Keys are ``(resource, namespace, name)``; ``resource`` is the group-resource string
('pods', 'deployments.apps'); cluster-scoped objects use namespace ''.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gpufleet.utils import jsoncodec

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


class StoreError(Exception):
    """Base of the store's expected answers (not bugs)."""


class NotFound(StoreError):
    pass


class AlreadyExists(StoreError):
    pass


class Conflict(StoreError):
    """The object changed since the revision the caller read (compare-and-swap failed)."""

    def __init__(self, message: str, current: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.current = current


class Expired(StoreError):
    """The requested revision is older than the history the store keeps (410 Gone)."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested = requested
        self.oldest = oldest


class TransformError(StoreError):
    """A stored value the store cannot turn back into an object: encrypted with a key this
    server was not given, or with one that does not decrypt it (see store/encryption.py)."""


class WatchEvent:
    """One change of one object, as the store's watchers get it.

    ``prev``, the object before the write, is decoded only when first read (most watchers
    never look at it: a heartbeat's previous state would be decoded for nothing)."""

    __slots__ = ("type", "resource", "namespace", "name", "revision", "object", "error", "_prev", "_load_prev")

    def __init__(self, type: EventType, resource: str, namespace: str, name: str, revision: int,  # noqa: A002
                 object: dict[str, Any], prev: dict[str, Any] | None = None,  # noqa: A002
                 error: StoreError | None = None, *,
                 load_prev: Callable[[], dict[str, Any] | None] | None = None) -> None:
        self.type = type
        self.resource = resource
        self.namespace = namespace
        self.name = name
        self.revision = revision
        # The object after the write; for DELETED, its last state stamped with the deletion revision.
        self.object = object
        # Set when the stored value could not be read (TransformError): ``object`` then holds
        # only the key's metadata, and a watch that meets the event ends with this error.
        self.error = error
        self._prev = prev
        self._load_prev = load_prev

    @property
    def prev(self) -> dict[str, Any] | None:
        """The object before the write (None for ADDED). Lets a filtered watch turn "stopped
        matching" into DELETED and "started matching" into ADDED, as Kubernetes does."""
        if self._load_prev is not None:
            self._prev, self._load_prev = self._load_prev(), None
        return self._prev

    def _fields(self) -> tuple[Any, ...]:
        return (self.type, self.resource, self.namespace, self.name, self.revision, self.object, self.prev,
                self.error)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WatchEvent) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # its objects are dicts: it cannot be hashed

    def __repr__(self) -> str:
        return (f"WatchEvent(type={self.type!r}, resource={self.resource!r}, namespace={self.namespace!r}, "
                f"name={self.name!r}, revision={self.revision!r})")


@dataclass(frozen=True)
class ListResult:
    items: list[dict[str, Any]]
    # The store revision the list was read at: a watch from here misses nothing.
    revision: int
    # (namespace, name) of the last item when more remain after `limit`, else None.
    next_key: tuple[str, str] | None = None


@dataclass(frozen=True)
class Update:
    """One object of ``Store.update_many``: its new state and, for a compare-and-swap, the
    revision the caller read (None: any)."""

    namespace: str
    name: str
    object: dict[str, Any]
    expected_revision: int | None = None


class Watch(Protocol):
    """An open watch: iterate it for events in revision order; close() to stop."""

    def __aiter__(self) -> AsyncIterator[WatchEvent]: ...

    def ready(self) -> bool:
        """Whether the next event (or the end) is already here, so that taking it will not wait."""
        ...

    async def close(self) -> None: ...


class Store(Protocol):
    async def start(self) -> None:
        """Open connections, create the schema, start the event pump."""

    async def close(self) -> None: ...

    async def revision(self) -> int:
        """The current global revision (0 for an empty store)."""

    async def create(
        self, resource: str, namespace: str, name: str, obj: dict[str, Any], *, ttl: float | None = None
    ) -> dict[str, Any]:
        """Store a new object. Raises AlreadyExists. ``ttl`` seconds: the store deletes it then."""

    async def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        """Raises NotFound."""

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
        """Replace an object. With ``expected_revision`` it is a compare-and-swap: raises
        Conflict when the stored revision differs. Raises NotFound."""

    async def update_many(self, resource: str, updates: list[Update]) -> list[dict[str, Any]]:
        """Replace several objects of one resource in one transaction: all are stored, at
        consecutive revisions in the order given, or none is (the first Conflict or NotFound
        is raised). Watchers get one MODIFIED event per object, as for ``update``."""

    async def delete(
        self, resource: str, namespace: str, name: str, *, expected_revision: int | None = None
    ) -> dict[str, Any]:
        """Remove an object; returns its last state stamped with the deletion revision."""

    async def list(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        limit: int | None = None,
        after: tuple[str, str] | None = None,
        node: str | None = None,
    ) -> ListResult:
        """Objects of a resource (in one namespace, or all when None), sorted by (namespace, name),
        starting after the key ``after``, at most ``limit``. ``node``: for pods, only those
        with that spec.nodeName, read through an index; ignored for other resources and where
        pods are stored encrypted (callers filter what comes back in either case)."""

    async def watch(
        self, resource: str | None, namespace: str | None, from_revision: int
    ) -> Watch:
        """Events with revision > from_revision, in order, exactly once, then live ones.
        ``resource``/``namespace`` None mean all. Raises Expired when from_revision is older
        than the history kept (from_revision < oldest kept revision - 1)."""

    async def history(
        self, resource: str | None, namespace: str | None, after: int, upto: int
    ) -> list[WatchEvent]:
        """Events with after < revision <= upto, in order. Raises Expired when compacted."""

    async def compact(self, revision: int) -> None:
        """Drop history at or below ``revision``."""

    async def sweep_expired(self) -> int:
        """Delete objects whose ttl has passed (by the store's clock); returns how many."""

    def is_stale(self, resource: str, namespace: str, name: str, revision: int) -> bool:
        """Whether the object at ``revision`` was last read encrypted with another key than
        writes use now (or unencrypted while encryption is on): an update that changes
        nothing rewrites it then, as kube-apiserver does."""


async def list_items(store: Any, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
    """The objects ``store.list`` returns, for readers that take a whole small kind on every
    request (admission's LimitRanges, ResourceQuotas and PriorityClasses): from the stored JSON
    through ``list_json`` where the store has it (SQLite answers from the kind's list cache, as
    consistent as a read of the database, instead of a read transaction per call)."""
    list_json = getattr(store, "list_json", None)
    got = await list_json(resource, namespace) if list_json is not None else None
    if got is None:
        return (await store.list(resource, namespace)).items
    return [jsoncodec.loads(text) for text in got[1]]


def open_store(url: str, **kwargs: Any) -> Store:
    """``sqlite:///path/to/db`` (``sqlite://:memory:`` for tests) or ``postgresql://...``."""
    if url.startswith("sqlite:"):
        from gpufleet.store.sqlite import SQLiteStore

        return SQLiteStore(url, **kwargs)
    if url.startswith(("postgresql:", "postgres:")):
        from gpufleet.store.postgres import PostgresStore

        return PostgresStore(url, **kwargs)
    raise ValueError(f"unknown store URL {url!r}: use sqlite:///PATH or postgresql://USER@HOST/DB")
