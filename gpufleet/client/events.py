"""Recording core/v1 Events about objects, the way `kubectl describe` shows them.

A controller that fails the same way every few seconds must not write a new Event each
time: as client-go's EventCorrelator does, a repeat of the same (object, type, reason,
message) from the same component bumps ``count`` and ``lastTimestamp`` on the Event already
written. Recording is best effort: an Event that cannot be written is logged and dropped,
never raised into the controller that reported it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.errors import AlreadyExists, ClientError, NotFound
from gpufleet.utils.clock import REAL_CLOCK, Clock, rfc3339

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"


@dataclass
class _Seen:
    namespace: str
    name: str
    count: int
    first_timestamp: str


class EventRecorder:
    def __init__(
        self,
        client: Client,
        component: str,
        host: str | None = None,
        clock: Clock = REAL_CLOCK,
        *,
        cache_size: int = 4096,
    ) -> None:
        self.client = client
        self.component = component
        self.host = host
        self.clock = clock
        self.cache_size = cache_size
        self._seen: OrderedDict[tuple[Any, ...], _Seen] = OrderedDict()
        self._lock = asyncio.Lock()
        self._last_nanos = 0
        self._background: set[asyncio.Task[None]] = set()

    def _reference(self, obj: Any) -> dict[str, Any]:
        api_version = objects.field(obj, "apiVersion") or getattr(type(obj), "API_VERSION", None)
        kind = objects.field(obj, "kind") or getattr(type(obj), "KIND", None)
        ref = {
            "apiVersion": api_version,
            "kind": kind,
            "name": objects.name_of(obj),
            "namespace": objects.namespace_of(obj) or None,
            "uid": objects.uid_of(obj) or None,
            "resourceVersion": objects.resource_version_of(obj) or None,
        }
        return {k: v for k, v in ref.items() if v}

    def _event_name(self, obj_name: str) -> str:
        # client-go names Events "<object>.<unix nanos in hex>"; a virtual clock can stand
        # still, so the nanos are kept strictly increasing within this recorder.
        nanos = int(self.clock.now() * 1e9)
        nanos = max(nanos, self._last_nanos + 1)
        self._last_nanos = nanos
        return f"{obj_name}.{nanos:x}"

    async def record(
        self, obj: Any, type: str, reason: str, message: str, *, action: str | None = None
    ) -> None:
        """Record that ``reason``/``message`` happened to ``obj`` (a model or dict). Never raises."""
        if not getattr(self.client, "record_events", True):
            return
        try:
            async with self._lock:
                await self._record(obj, type, reason, message, action)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            level = logging.WARNING if isinstance(exc, ClientError) else logging.ERROR
            log.log(
                level,
                "dropping event %s %s on %s: %s",
                type,
                reason,
                objects.object_key(obj) if obj is not None else "?",
                exc,
                exc_info=not isinstance(exc, ClientError),
            )

    def record_nowait(
        self, obj: Any, type: str, reason: str, message: str, *, action: str | None = None
    ) -> None:
        """record() without waiting for the API (from synchronous code, or hot paths)."""
        if not getattr(self.client, "record_events", True):
            return
        task = asyncio.get_running_loop().create_task(self.record(obj, type, reason, message, action=action))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def flush(self) -> None:
        """Wait for every record_nowait() issued so far."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def _record(self, obj: Any, type: str, reason: str, message: str, action: str | None) -> None:
        ref = self._reference(obj)
        if not ref.get("name") or not ref.get("kind"):
            raise ValueError("an event needs an object with kind and metadata.name")
        # Events about cluster-scoped objects live in "default", as in Kubernetes.
        namespace = ref.get("namespace") or "default"
        key = (
            ref.get("apiVersion"),
            ref["kind"],
            ref.get("namespace", ""),
            ref["name"],
            ref.get("uid", ""),
            type,
            reason,
            message,
        )
        now = rfc3339(self.clock.now())
        seen = self._seen.get(key)
        if seen is not None:
            try:
                await self.client.patch(
                    "events",
                    seen.name,
                    {"count": seen.count + 1, "lastTimestamp": now},
                    seen.namespace,
                    patch_type="merge",
                    raw=True,
                )
            except NotFound:
                # The Event expired or was deleted: start a fresh one.
                self._seen.pop(key, None)
            else:
                seen.count += 1
                self._seen.move_to_end(key)
                return

        event: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": self._event_name(ref["name"]), "namespace": namespace},
            "involvedObject": ref,
            "type": type,
            "reason": reason,
            "message": message,
            "source": {"component": self.component, **({"host": self.host} if self.host else {})},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": self.component,
            "reportingInstance": self.host or "",
        }
        if action:
            event["action"] = action
        try:
            created = await self.client.create(event, namespace, raw=True)
        except AlreadyExists:
            # Another recorder with the same object and the same (virtual) time: tell the
            # names apart rather than lose the event.
            event["metadata"]["name"] += f"{random.getrandbits(16):04x}"
            created = await self.client.create(event, namespace, raw=True)
        meta = created.get("metadata", {}) if isinstance(created, dict) else {}
        self._seen[key] = _Seen(
            namespace=meta.get("namespace") or namespace,
            name=meta.get("name") or event["metadata"]["name"],
            count=1,
            first_timestamp=now,
        )
        while len(self._seen) > self.cache_size:
            self._seen.popitem(last=False)
