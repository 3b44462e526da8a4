"""WATCH of a collection or one object: initial events, bookmarks, selector transitions."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from gpufleet.api.selectors import parse_field_selector
from gpufleet.apiserver import params
from gpufleet.apiserver.errors import bad_request, internal
from gpufleet.apiserver.genericregistry import matches, rv
from gpufleet.apiserver.handlers.list import selectors
from gpufleet.apiserver.handlers.scope import JSON, Scope, dumps, truthy, wants_table
from gpufleet.store import base as store_base
from gpufleet.utils.http import RawResponse

log = logging.getLogger("gpufleet.apiserver")

WATCH_DEFAULT_TIMEOUT = 1800.0
# A chunk of coalesced events is sent once it holds this much, ready events or not.
COALESCE_BYTES = 256 * 1024


def _expired(e: Exception) -> bytes:
    return dumps({"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": str(e), "reason": "Expired", "code": 410}}) + b"\n"


async def watch(scope: Scope) -> RawResponse:
    req, rt, ns, name = scope.req, scope.rt, scope.ns, scope.name
    store, clock, strategy = scope.api.store, scope.api.clock, scope.strategy
    label_sel, field_sel = selectors(req, rt)
    if name:
        extra = parse_field_selector(f"metadata.name={name}")
        field_sel = extra if field_sel is None else parse_field_selector(
            f"{req.param('fieldSelector')},metadata.name={name}")
    rv_param = req.param("resourceVersion")
    timeout = params.watch_timeout(req, WATCH_DEFAULT_TIMEOUT)
    bookmarks = truthy(req.param("allowWatchBookmarks"))
    as_table = wants_table(req)
    initial: list[dict[str, Any]] = []
    send_initial = truthy(req.param("sendInitialEvents"))
    requested_rev = 0
    if rv_param:
        try:
            requested_rev = int(rv_param)
        except ValueError:
            raise bad_request(f'resourceVersion: Invalid value: "{rv_param}": must be an integer') from None
    if not requested_rev or send_initial:
        initial, start_rev, _ = await scope.generic.list(rt, ns, label_sel, field_sel)
        start_rev = max(start_rev, requested_rev)
    else:
        start_rev = requested_rev
    try:
        watcher = await store.watch(rt.key, ns or None, start_rev)
    except store_base.Expired as e:
        err = _expired(e)

        async def expired() -> AsyncIterator[bytes]:
            yield err

        return RawResponse(200, {"content-type": JSON, "transfer-encoding": "chunked"}, stream=expired())

    def encode(ev_type: str, obj: dict[str, Any]) -> bytes:
        if as_table and ev_type != "BOOKMARK":
            obj = strategy.table([obj], resource_version=str(rv(obj)), now=clock.now())
        return dumps({"type": ev_type, "object": obj}) + b"\n"

    def frames(ev: store_base.WatchEvent) -> bytes | None:
        """The event as this watch sends it (selector transitions as kube-apiserver makes
        them), or None when it is not for this watch."""
        now_match = matches(ev.object, label_sel, field_sel)
        was_match = ev.prev is not None and matches(ev.prev, label_sel, field_sel)
        if ev.type == "DELETED":
            return encode("DELETED", ev.object) if was_match or now_match else None
        if now_match:  # an object that enters the selection is ADDED for this watch
            return encode(ev.type if was_match else "ADDED", ev.object)
        if was_match:  # and one that leaves it, DELETED
            return encode("DELETED", ev.object)
        return None

    async def stream() -> AsyncIterator[bytes]:
        last_rev = start_rev
        # Events already queued are sent together, in one chunk: a group commit's burst costs
        # one write to the connection (and one read for the client), not one per event.
        # Nothing waits to be sent while the watch waits for the next event.
        out: list[bytes] = []
        size = 0
        try:
            for obj in initial:
                yield encode("ADDED", obj)
            if send_initial and bookmarks:
                yield encode("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": {
                    "resourceVersion": str(start_rev),
                    "annotations": {"k8s.io/initial-events-end": "true"}}})
            deadline = clock.monotonic() + timeout
            it = watcher.__aiter__()
            while True:
                if out and (size >= COALESCE_BYTES or not watcher.ready()):
                    yield b"".join(out)
                    out, size = [], 0
                remaining = deadline - clock.monotonic()
                if remaining <= 0:
                    return
                try:
                    if out:  # ready(): answers at once
                        ev = await it.__anext__()
                    else:
                        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel
                        # that races with an event, and the stream would never end.
                        async with asyncio.timeout(min(remaining, 30.0)):
                            ev = await it.__anext__()
                except TimeoutError:
                    if bookmarks:
                        yield encode("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version,
                                                  "metadata": {"resourceVersion": str(last_rev)}})
                    continue
                except StopAsyncIteration:
                    if out:
                        yield b"".join(out)
                    return
                except store_base.Expired as e:
                    yield b"".join(out) + _expired(e)
                    return
                except store_base.TransformError as e:
                    yield b"".join(out) + dumps({"type": "ERROR", "object": internal(str(e)).status()}) + b"\n"
                    return
                last_rev = ev.revision
                frame = frames(ev)
                if frame is not None:
                    out.append(frame)
                    size += len(frame)
        except Exception as e:  # a bug: end the stream with an ERROR event, not a cut connection
            log.exception("internal error in a watch of %s", rt.key)
            yield b"".join(out) + dumps(
                {"type": "ERROR", "object": internal(f"{type(e).__name__}: {e}").status()}) + b"\n"
        finally:
            await watcher.close()

    return RawResponse(200, {"content-type": JSON, "transfer-encoding": "chunked"}, stream=stream())
