"""The list cache: every object of one kind as the JSON a list returns, kept current from the
store's own event stream, so a full list (an informer's first list, `kubectl get pods -o
json`) is a join of texts already made instead of a read, a stamp and an encode of every row
(kube-apiserver's watch cache serves lists the same way).

A cache is made by the first full list of its kind and fed every later event of that kind
by the event hub, in revision order and in the same step as the hub's watches, so after the
hub has delivered revision R the cache holds the kind exactly as at R. The store serves a
list from it only when the hub has delivered everything committed (a write of another
process not yet read from the history table sends the list to the database), so a list from
the cache is as consistent as one from the database. A cache the hub cannot keep current
(its history compacted past what it delivered) is dropped and made again on the next list;
one no list used for ``idle_seconds`` is dropped to give its memory back.
"""

from __future__ import annotations

import bisect
import time
from typing import Any

import orjson

from gpufleet.store.base import WatchEvent

# A kind's cache with no list for this long is dropped (its memory back; the next full list
# reads the database and makes it again).
IDLE_SECONDS = 120.0


class ListCache:
    """The objects of one kind, (namespace, name) -> the JSON bytes a list returns."""

    def __init__(self, hub: Any, resource: str, texts: dict[tuple[str, str], bytes]) -> None:
        self.resource = resource
        self.namespace = None  # what the hub's registry reads: every namespace
        self._hub = hub
        self._texts = texts
        self._keys: list[tuple[str, str]] | None = None  # sorted; None after a create or delete
        self.live = True
        self.used = time.monotonic()

    # -- fed by the event hub (the shape of a StoreWatch: matches, offer, _end)

    def matches(self, ev: WatchEvent) -> bool:
        return True

    def offer(self, ev: WatchEvent) -> None:
        if not self.live:
            return
        if ev.error is not None:  # a value that could not be read: the database knows best
            self._end()
            return
        key = (ev.namespace, ev.name)
        if ev.type == "DELETED":
            if self._texts.pop(key, None) is not None:
                self._keys = None
            return
        if key not in self._texts:
            self._keys = None
        # A copy of exactly its length: orjson's own bytes keep the buffer it grew (4 KiB for a
        # 1.5 KB pod), which 50,000 cached pods would pay 2.5 KiB each for.
        self._texts[key] = memoryview(orjson.dumps(ev.object)).tobytes()

    def _end(self, error: BaseException | None = None) -> None:
        if self.live:
            self.live = False
            self._texts = {}
            self._keys = None
            self._hub.unregister(self)

    def close(self) -> None:
        self._end()

    # -- read by the store's list_json

    def __len__(self) -> int:
        return len(self._texts)

    def texts(self, namespace: str | None, limit: int | None) -> tuple[list[bytes], tuple[str, str] | None]:
        """The objects of ``namespace`` (None: all) in (namespace, name) order, at most
        ``limit`` of them, and the key to continue after when there were more."""
        self.used = time.monotonic()
        keys = self._keys
        if keys is None:
            keys = self._keys = sorted(self._texts)
        lo, hi = 0, len(keys)
        if namespace is not None:
            lo = bisect.bisect_left(keys, (namespace, ""))
            hi = bisect.bisect_left(keys, (namespace + "\0", ""), lo)
        next_key = None
        if limit and hi - lo > limit:
            hi = lo + limit
            next_key = keys[hi - 1]
        texts = self._texts
        return [texts[k] for k in keys[lo:hi]], next_key
