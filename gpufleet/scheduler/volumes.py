"""The claims, volumes and storage classes a scheduling cycle looks at.

``StorageState`` is an immutable view (wire dicts by key), put on each cycle's snapshot so
the VolumeBinding plugin's decisions stay pure functions of the snapshot. ``StorageTracker``
keeps the current one from the scheduler's informers and lets the binding cycle wait for
the next change (a claim's PreBind waits until the PV controller has bound it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpufleet.utils.clock import Clock

Wire = Mapping[str, Any]


def _frozen(items: dict[str, Wire]) -> Mapping[str, Wire]:
    return MappingProxyType(dict(items))


@dataclass(frozen=True)
class StorageState:
    """Claims by 'namespace/name', volumes and classes by name, as the informers last saw them."""

    claims: Mapping[str, Wire] = field(default_factory=lambda: MappingProxyType({}))
    volumes: Mapping[str, Wire] = field(default_factory=lambda: MappingProxyType({}))
    classes: Mapping[str, Wire] = field(default_factory=lambda: MappingProxyType({}))
    generation: int = 0

    def claim(self, namespace: str, name: str) -> Wire | None:
        return self.claims.get(f"{namespace}/{name}")

    def volume(self, name: str) -> Wire | None:
        return self.volumes.get(name) if name else None

    def storage_class(self, name: str) -> Wire | None:
        return self.classes.get(name) if name else None

    @classmethod
    def of(cls, claims: Iterable[Wire] = (), volumes: Iterable[Wire] = (), classes: Iterable[Wire] = ()) -> StorageState:
        """A state from plain objects (tests, benchmarks)."""

        def key(obj: Wire, namespaced: bool) -> str:
            meta = obj.get("metadata") or {}
            return f"{meta.get('namespace') or ''}/{meta.get('name')}" if namespaced else str(meta.get("name"))

        return cls(_frozen({key(c, True): c for c in claims}), _frozen({key(v, False): v for v in volumes}),
                   _frozen({key(s, False): s for s in classes}))


EMPTY = StorageState()


def _wire(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else obj.to_dict()


def _key(obj: Wire, namespaced: bool) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}" if namespaced else str(meta.get("name") or "")


class StorageTracker:
    """Fed by informer callbacks (``put_*`` / ``delete_*``, models or wire dicts)."""

    def __init__(self) -> None:
        self._claims: dict[str, Wire] = {}
        self._volumes: dict[str, Wire] = {}
        self._classes: dict[str, Wire] = {}
        self.generation = 0
        self._state: StorageState = EMPTY
        self._changed = asyncio.Event()

    def _touch(self) -> None:
        self.generation += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def put_claim(self, obj: Any) -> None:
        data = _wire(obj)
        self._claims[_key(data, True)] = data
        self._touch()

    def delete_claim(self, obj: Any) -> None:
        self._claims.pop(_key(_wire(obj), True), None)
        self._touch()

    def put_volume(self, obj: Any) -> None:
        data = _wire(obj)
        self._volumes[_key(data, False)] = data
        self._touch()

    def delete_volume(self, obj: Any) -> None:
        self._volumes.pop(_key(_wire(obj), False), None)
        self._touch()

    def put_class(self, obj: Any) -> None:
        data = _wire(obj)
        self._classes[_key(data, False)] = data
        self._touch()

    def delete_class(self, obj: Any) -> None:
        self._classes.pop(_key(_wire(obj), False), None)
        self._touch()

    def state(self) -> StorageState:
        """The current state; the same object until something changes."""
        if self._state.generation != self.generation:
            self._state = StorageState(_frozen(self._claims), _frozen(self._volumes), _frozen(self._classes),
                                       self.generation)
        return self._state

    async def wait_changed(self, since: int, timeout: float, clock: Clock) -> bool:  # noqa: ASYNC109
        """Wait until the state moves past generation ``since`` (True) or ``timeout`` seconds
        of ``clock`` pass (False)."""
        if self.generation != since:
            return True
        changed = asyncio.ensure_future(self._changed.wait())
        sleeper = asyncio.ensure_future(clock.sleep(timeout))
        try:
            await asyncio.wait({changed, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (changed, sleeper):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        return self.generation != since
