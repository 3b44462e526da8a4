"""Informers: a local, always-current copy of one kind of object, plus change callbacks.

The shape is client-go's reflector + indexer + shared informer, on one asyncio loop: list,
then watch from the list's resourceVersion; on 410 Gone or a broken stream, list again and
turn the difference between the cache and the new list into the add/update/delete callbacks
that were missed, so a handler never needs to know a disconnect happened.

Objects in the cache are shared by every handler and every caller of get()/list(): treat
them as read-only (copy before changing and writing back), as with client-go's listers.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.client import objects
from gpufleet.client.api import Client, KindLike
from gpufleet.client.errors import ApiError, Gone, TransportError
from gpufleet.utils.clock import Clock

log = logging.getLogger(__name__)

IndexFunc = Callable[[Any], str | Iterable[str] | None]

NAMESPACE_INDEX = "namespace"
# A list's objects are decoded and cached this many at a time, the event loop free between.
LIST_CHUNK = 500


def _index_values(fn: IndexFunc, obj: Any) -> list[str]:
    values = fn(obj)
    if values is None:
        return []
    if isinstance(values, str):
        return [values]
    return [v for v in values if v is not None]


class Indexer:
    """Objects by key ('namespace/name'), with secondary indices (e.g. pods by node name)."""

    def __init__(self) -> None:
        self._items: dict[str, Any] = {}
        self._indexers: dict[str, IndexFunc] = {}
        # index name -> value -> keys
        self._indices: dict[str, dict[str, set[str]]] = {}
        self.add_indexer(NAMESPACE_INDEX, lambda o: objects.namespace_of(o) or None)

    def add_indexer(self, name: str, fn: IndexFunc) -> None:
        """Index every object by ``fn(obj)`` (a value, several, or None to leave it out).
        Adding an index after objects arrived indexes them too."""
        self._indexers[name] = fn
        index: dict[str, set[str]] = {}
        for key, obj in self._items.items():
            for value in _index_values(fn, obj):
                index.setdefault(value, set()).add(key)
        self._indices[name] = index

    def get(self, key: str) -> Any | None:
        return self._items.get(key)

    def get_by_name(self, name: str, namespace: str | None = None) -> Any | None:
        return self._items.get(f"{namespace}/{name}" if namespace else name)

    def list(self) -> list[Any]:
        return list(self._items.values())

    def keys(self) -> list[str]:
        return list(self._items)

    def items(self) -> list[tuple[str, Any]]:
        """(key, object) pairs; an object is replaced, never changed, when it is updated."""
        return list(self._items.items())

    def by_index(self, name: str, value: str) -> list[Any]:
        return [self._items[k] for k in sorted(self.index_keys(name, value))]

    def index_keys(self, name: str, value: str) -> set[str]:
        try:
            index = self._indices[name]
        except KeyError:
            raise KeyError(f"no index named {name!r}") from None
        return set(index.get(value, ()))

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def put(self, key: str, obj: Any) -> Any | None:
        old = self._items.get(key)
        if old is not None:
            self._unindex(key, old)
        self._items[key] = obj
        for name, fn in self._indexers.items():
            index = self._indices[name]
            for value in _index_values(fn, obj):
                index.setdefault(value, set()).add(key)
        return old

    def pop(self, key: str) -> Any | None:
        old = self._items.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        return old

    def _unindex(self, key: str, obj: Any) -> None:
        for name, fn in self._indexers.items():
            index = self._indices[name]
            for value in _index_values(fn, obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]


@dataclass(eq=False)
class EventHandlers:
    """One registration (client-go's ResourceEventHandlerRegistration): ``synced`` is set once
    it has been given everything the cache held when it was added (the first list's on_add
    calls, or the replay of a cache already filled)."""

    on_add: Callable[[Any], Any] | None = None
    on_update: Callable[[Any, Any], Any] | None = None
    on_delete: Callable[[Any], Any] | None = None
    synced: asyncio.Event = field(default_factory=asyncio.Event)


_SYNCED = object()
_HANDLER_SYNCED = object()


class Informer:
    """List+watch of one kind (optionally one namespace and selectors) into an Indexer."""

    def __init__(
        self,
        client: Client,
        kind: KindLike,
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        field_selector: str | Mapping[str, str] | None = None,
        resync_period: float | None = None,
        clock: Clock | None = None,
        raw: bool = False,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        watch_timeout: tuple[int, int] = (300, 600),
        strip_managed_fields: bool = False,
    ) -> None:
        self.client = client
        # Drop metadata.managedFields from each object before it is decoded and cached, as
        # kube-scheduler's and kube-controller-manager's informers do: no controller reads
        # them, and they are most of a Node (an update sent without them keeps the stored ones).
        self.strip_managed_fields = strip_managed_fields
        self.rt = client.resource_type(kind)
        self.namespace = namespace if self.rt.namespaced else None
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.resync_period = resync_period
        self.clock = clock or client.clock
        self.raw = raw
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.watch_timeout = watch_timeout
        self.indexer = Indexer()
        # The version to resume the watch from: the list's, then each event's or bookmark's.
        self.resource_version = ""
        # How many times the cache was rebuilt from a list (1 after a clean start).
        self.list_count = 0
        self._handlers: list[EventHandlers] = []
        self._pending: deque[tuple[Any, ...]] = deque()
        self._pending_event = asyncio.Event()
        self._synced = asyncio.Event()
        self._listed_once = False
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._delivered = 0

    # -- cache access -----------------------------------------------------------------

    def get(self, key: str) -> Any | None:
        return self.indexer.get(key)

    def list(self) -> list[Any]:
        return self.indexer.list()

    def items(self) -> list[tuple[str, Any]]:
        return self.indexer.items()

    def by_index(self, name: str, value: str) -> list[Any]:
        return self.indexer.by_index(name, value)

    def add_indexer(self, name: str, fn: IndexFunc) -> None:
        self.indexer.add_indexer(name, fn)

    # -- handlers ---------------------------------------------------------------------

    def add_event_handler(
        self,
        on_add: Callable[[Any], Any] | None = None,
        on_update: Callable[[Any, Any], Any] | None = None,
        on_delete: Callable[[Any], Any] | None = None,
    ) -> EventHandlers:
        """Register callbacks (plain functions or coroutine functions). A handler added
        after the cache filled first gets on_add for everything already in it; its
        ``synced`` is set once that replay was delivered."""
        handlers = EventHandlers(on_add, on_update, on_delete)
        self._handlers.append(handlers)
        # What the cache holds (all of it, or the chunks of a first list decoded so far: the
        # rest reach every handler as they come).
        for obj in self.indexer.list():
            self._notify("add", None, obj, handlers)
        if self._listed_once:
            self._pending.append((_HANDLER_SYNCED, handlers))
            self._pending_event.set()
        return handlers

    def remove_event_handler(self, handlers: EventHandlers) -> None:
        """No more calls to ``handlers``, also of events already queued for it."""
        with contextlib.suppress(ValueError):
            self._handlers.remove(handlers)

    # -- lifecycle --------------------------------------------------------------------

    @property
    def has_synced(self) -> bool:
        """True once the first list is in the cache and its on_add callbacks have run."""
        return self._synced.is_set()

    @property
    def started(self) -> bool:
        return self._started

    async def start(self) -> None:
        """Start listing and watching in the background; returns at once (see wait_for_sync)."""
        if self._started:
            return
        self._started = True
        name = f"informer:{self.rt.key}"
        self._tasks = [
            asyncio.create_task(self._run(), name=name),
            asyncio.create_task(self._dispatch(), name=f"{name}:dispatch"),
        ]
        if self.resync_period:
            self._tasks.append(asyncio.create_task(self._resync_loop(), name=f"{name}:resync"))

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._started = False

    async def wait_for_sync(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        try:
            await asyncio.wait_for(self._synced.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # -- list and watch ---------------------------------------------------------------

    async def _run(self) -> None:
        backoff = self.backoff_initial
        need_list = True
        while True:
            self._delivered = 0
            try:
                if need_list:
                    await self._list_and_replace()
                    need_list = False
                await self._watch_once()
                if self._delivered:
                    backoff = self.backoff_initial
                    continue
                # A stream that ends without a word (a server timeout on a quiet kind, or a
                # server that closes at once) is resumed from the same version, but not in a
                # tight loop.
            except asyncio.CancelledError:
                raise
            except Gone as exc:
                log.info("%s: watch expired (%s); listing again", self.rt.key, exc.message)
                need_list = True
            except (TransportError, ApiError) as exc:
                log.warning("%s: list/watch failed (%s); listing again", self.rt.key, exc)
                need_list = True
            except Exception:
                log.exception("%s: list/watch failed unexpectedly; listing again", self.rt.key)
                need_list = True
            if self._delivered:
                # The stream worked for a while before it broke: retry promptly.
                backoff = self.backoff_initial
            await self.clock.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, self.backoff_max)

    async def _list_and_replace(self) -> None:
        result = await self.client.list(
            self.rt,
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            raw=self.raw or self.strip_managed_fields,
        )
        previous = {key: self.indexer.get(key) for key in self.indexer.keys()}
        fresh: set[str] = set()
        # In chunks, yielding to the event loop between them: a list of tens of thousands of
        # objects decodes for seconds, and nothing else on the loop (a Lease renewal, the
        # API server itself in-process) may wait that long. The cache is marked synced only
        # after the last chunk, so no reader acts on a partial first list.
        for start in range(0, len(result.items), LIST_CHUNK):
            if start:
                await asyncio.sleep(0)
            for obj in result.items[start:start + LIST_CHUNK]:
                if self.strip_managed_fields:
                    obj = self._decode(obj)
                key = objects.object_key(obj)
                fresh.add(key)
                old = self.indexer.put(key, obj)
                if old is None:
                    self._notify("add", None, obj)
                elif objects.resource_version_of(old) != objects.resource_version_of(obj):
                    self._notify("update", old, obj)
        for key, old in previous.items():
            if key not in fresh:
                self.indexer.pop(key)
                self._notify("delete", old, None)
        self.resource_version = result.resource_version
        self.list_count += 1
        if not self._listed_once:
            self._listed_once = True
            # The handlers the list was delivered to; one added after it gets its own replay.
            self._pending.append((_SYNCED, tuple(self._handlers)))
            self._pending_event.set()

    async def _watch_once(self) -> None:
        """Apply watch events until the stream ends, counting them in ``_delivered``."""
        low, high = self.watch_timeout
        events = self.client.watch(
            self.rt,
            self.namespace,
            resource_version=self.resource_version or None,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=random.randint(low, high),
            allow_bookmarks=True,
            raw=self.raw or self.strip_managed_fields,
        )
        try:
            async for event in events:
                self._delivered += 1
                rv = event.resource_version
                if event.type == "BOOKMARK":
                    self.resource_version = rv or self.resource_version
                    continue
                self._apply(event.type, self._decode(event.object) if self.strip_managed_fields else event.object)
                self.resource_version = rv or self.resource_version
        finally:
            await events.aclose()

    def _decode(self, data: dict[str, Any]) -> Any:
        """A listed or watched object (a dict) without managedFields, as the cache keeps it."""
        meta = data.get("metadata")
        if isinstance(meta, dict) and "managedFields" in meta:
            data = {**data, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        return self.client.decode(data, self.rt, raw=self.raw)

    def _apply(self, etype: str, obj: Any) -> None:
        key = objects.object_key(obj)
        if etype in ("ADDED", "MODIFIED"):
            old = self.indexer.put(key, obj)
            if old is None:
                self._notify("add", None, obj)
            else:
                self._notify("update", old, obj)
        elif etype == "DELETED":
            old = self.indexer.pop(key)
            # A delete for something never seen (it stopped matching the selector before we
            # listed) has nothing to tell anyone.
            if old is not None:
                self._notify("delete", old, obj)
        else:
            log.warning("%s: ignoring watch event of type %r", self.rt.key, etype)

    async def _resync_loop(self) -> None:
        assert self.resync_period
        while True:
            await self.clock.sleep(self.resync_period)
            if not self._listed_once:
                continue
            for obj in self.indexer.list():
                self._notify("update", obj, obj)

    # -- delivery ---------------------------------------------------------------------

    def _notify(self, what: str, old: Any, new: Any, only: EventHandlers | None = None) -> None:
        # Delivery runs on its own task so a slow handler delays other handlers, never the
        # watch stream (which would fall behind and expire). The handlers are fixed now, so
        # one added later gets its replay of the cache instead of these.
        targets = (only,) if only is not None else tuple(self._handlers)
        self._pending.append((what, old, new, targets))
        self._pending_event.set()

    async def _dispatch(self) -> None:
        while True:
            while not self._pending:
                self._pending_event.clear()
                await self._pending_event.wait()
            item = self._pending.popleft()
            if item[0] is _SYNCED:
                for handlers in item[1]:
                    handlers.synced.set()
                self._synced.set()
                continue
            if item[0] is _HANDLER_SYNCED:
                item[1].synced.set()
                continue
            what, old, new, targets = item
            for handlers in targets:
                # One removed since (a component stopped) gets nothing more.
                if handlers in self._handlers:
                    await self._call(handlers, what, old, new)

    async def _call(self, handlers: EventHandlers, what: str, old: Any, new: Any) -> None:
        if what == "add":
            fn, args = handlers.on_add, (new,)
        elif what == "update":
            fn, args = handlers.on_update, (old, new)
        else:
            # The delete callback gets the last state: the watch's final object, or the cached
            # one when the delete was only noticed by a relist.
            fn, args = handlers.on_delete, (new if new is not None else old,)
        if fn is None:
            return
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: %s handler failed for %s", self.rt.key, what, objects.object_key(args[-1]))


def _selector_key(sel: str | Mapping[str, str] | None) -> str:
    if sel is None or isinstance(sel, str):
        return sel or ""
    return ",".join(f"{k}={v}" for k, v in sorted(sel.items()))


class SharedInformerFactory:
    """One informer per (kind, namespace, selectors), shared by every controller that asks."""

    def __init__(
        self,
        client: Client,
        *,
        resync_period: float | None = None,
        raw: bool = False,
        **informer_options: Any,
    ) -> None:
        self.client = client
        self.resync_period = resync_period
        self.raw = raw
        self._options = informer_options
        self._informers: dict[tuple[str, str, str, str], Informer] = {}
        self._running = False

    def informer(
        self,
        kind: KindLike,
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        field_selector: str | Mapping[str, str] | None = None,
    ) -> Informer:
        rt = self.client.resource_type(kind)
        ns = (namespace or "") if rt.namespaced else ""
        key = (rt.key, ns, _selector_key(label_selector), _selector_key(field_selector))
        informer = self._informers.get(key)
        if informer is None:
            informer = Informer(
                self.client,
                rt,
                namespace=ns or None,
                label_selector=label_selector,
                field_selector=field_selector,
                resync_period=self.resync_period,
                raw=self.raw,
                **self._options,
            )
            self._informers[key] = informer
        return informer

    def informers(self) -> list[Informer]:
        return list(self._informers.values())

    async def start(self) -> None:
        """Start every informer asked for so far; call again after asking for more."""
        self._running = True
        for informer in self._informers.values():
            await informer.start()

    async def wait_for_sync(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        results = await asyncio.gather(*(i.wait_for_sync(timeout) for i in self._informers.values()))
        return all(results)

    async def stop(self) -> None:
        self._running = False
        # On Python 3.11 a cancellation that lands while the in-process watch stream's
        # asyncio.wait_for is handing over an event is swallowed, and the informer task
        # keeps watching; cancelling again until the tasks are done gets past that.
        tasks = [t for informer in self._informers.values() for t in informer._tasks]
        stopping = asyncio.ensure_future(asyncio.gather(*(i.stop() for i in self._informers.values())))
        while True:
            done, _ = await asyncio.wait({stopping}, timeout=0.5)
            if done:
                stopping.result()
                return
            for t in tasks:
                if not t.done():
                    t.cancel()


class InformerScope:
    """One component's share of a SharedInformerFactory that outlives it (the scheduler and
    the controller manager of one process, each made afresh for every leadership term): the
    informers and their caches are the factory's, listed once for the process; the event
    handlers the component adds through it are its own, and ``stop()`` removes them, leaving
    the informers running for the next term or the other component. ``wait_for_sync`` waits
    for the informers the component asked for and for its handlers to have been given the
    cache."""

    def __init__(self, factory: SharedInformerFactory) -> None:
        self.factory = factory
        self.client = factory.client
        self._handlers: list[tuple[Informer, EventHandlers]] = []
        self._asked: list[Informer] = []

    def informer(self, kind: KindLike, **selectors: Any) -> Informer:
        informer = self.factory.informer(kind, **selectors)
        if informer not in self._asked:
            self._asked.append(informer)
        return _ScopedInformer(informer, self)  # type: ignore[return-value]

    def informers(self) -> list[Informer]:
        return self.factory.informers()

    async def start(self) -> None:
        await self.factory.start()

    async def wait_for_sync(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        async def synced() -> None:
            # This component's informers only: another's that cannot list (a kind it may not
            # read) must not hold this one back.
            await asyncio.gather(*(i.wait_for_sync(None) for i in self._asked))
            await asyncio.gather(*(h.synced.wait() for _, h in list(self._handlers)))

        try:
            await asyncio.wait_for(synced(), timeout)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        handlers, self._handlers = self._handlers, []
        for informer, h in handlers:
            informer.remove_event_handler(h)


class _ScopedInformer:
    """An Informer as an InformerScope hands it out: the same cache, handlers remembered."""

    def __init__(self, informer: Informer, scope: InformerScope) -> None:
        self._informer = informer
        self._scope = scope

    def add_event_handler(self, *args: Any, **kwargs: Any) -> EventHandlers:
        handlers = self._informer.add_event_handler(*args, **kwargs)
        self._scope._handlers.append((self._informer, handlers))
        return handlers

    def remove_event_handler(self, handlers: EventHandlers) -> None:
        self._informer.remove_event_handler(handlers)
        self._scope._handlers = [(i, h) for i, h in self._scope._handlers if h is not handlers]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._informer, name)
