"""``GET /ui/watch?path=...&path=...``: the dashboard's watches carried on one stream.

A browser keeps at most six HTTP/1.1 connections to a host, and a watch holds one for as long
as it runs: a view that watches pods, Workloads and five kinds of workload would leave no
connection for the lists, logs and metrics it also asks for, which would then wait forever.
So the page sends its watches here, each ``path`` a collection's URL with its query
(``/api/v1/pods?resourceVersion=12&allowWatchBookmarks=true``), and reads one stream of lines:

    {"stream": 0, "event": {"type": "ADDED", "object": {...}}}   an event of path 0's watch
    {"stream": 1, "status": {"kind": "Status", "code": 403, ...}} path 1 was refused
    {"stream": 0, "end": true}                                   path 0's watch ended (its timeout)

Each path is served by ``ApiServer.handle`` as its own watch request with the caller's own
headers (its bearer token): authentication, RBAC, flow control, metrics and the audit log
treat it exactly as the watch the page would otherwise have sent. This endpoint adds no
access of its own: a path another request could not watch gets the same refusal here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import parse_qsl, urlsplit

import orjson

from gpufleet.apiserver.errors import bad_request, method_not_allowed
from gpufleet.utils.http import RawRequest, RawResponse

log = logging.getLogger("gpufleet.apiserver")

PATH = "/ui/watch"
MAX_STREAMS = 16
# The caller's headers that each watch request carries (who it is, what it accepts).
_CARRIED = ("authorization", "impersonate-user", "impersonate-group", "impersonate-uid", "user-agent",
            "accept-language")

Handle = Callable[[RawRequest], Awaitable[RawResponse]]


def watch_request(req: RawRequest, target: str) -> RawRequest:
    """The watch of one ``path`` parameter, as a request of its own with the caller's identity."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not (parts.path.startswith("/api/") or parts.path.startswith("/apis/")):
        raise bad_request(f'path: Invalid value: "{target}": must be a collection under /api/ or /apis/',
                          [{"field": "path", "message": "a collection's path, e.g. /api/v1/pods"}])
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "watch"]
    headers = {k: v for k, v in req.headers.items() if k in _CARRIED}
    headers["accept"] = "application/json"
    return RawRequest(method="GET", path=parts.path, query=[*query, ("watch", "1")], headers=headers,
                      remote_addr=req.remote_addr)


def _line(obj: dict) -> bytes:
    return orjson.dumps(obj) + b"\n"


async def _pump(i: int, resp: RawResponse, out: asyncio.Queue[bytes | None]) -> None:
    """Path i's events onto the shared stream, a line each; then its end."""
    if resp.status != 200 or resp.stream is None:
        try:
            status = orjson.loads(resp.body)
        except orjson.JSONDecodeError:
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": resp.status,
                      "message": resp.body.decode("utf-8", "replace")[:500]}
        await out.put(_line({"stream": i, "status": status}))
        return
    if not resp.headers.get("content-type", "").startswith("application/json"):
        await _discard(resp.stream)
        await out.put(_line({"stream": i, "status": {
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 400, "reason": "BadRequest",
            "message": "path: Invalid value: not a collection's watch (its answer is not watch events)"}}))
        return
    prefix = b'{"stream":%d,"event":' % i
    buf = b""
    stream = resp.stream
    try:
        async for chunk in stream:
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.strip():
                    await out.put(prefix + line + b"}\n")
        if buf.strip():
            await out.put(prefix + buf + b"}\n")
    except Exception:  # the watch broke: the page lists again, as after any end
        log.exception("dashboard watch %d ended with an error", i)
    finally:
        await _discard(stream)
    await out.put(_line({"stream": i, "end": True}))


async def _discard(stream: AsyncIterator[bytes]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


async def serve(handle: Handle, req: RawRequest) -> RawResponse:
    if req.method.upper() != "GET":
        raise method_not_allowed()
    targets = [v for k, v in req.query if k == "path"]
    if not targets:
        raise bad_request("path: Required value: name at least one collection to watch, e.g. ?path=/api/v1/pods",
                          [{"field": "path", "message": "Required value"}])
    if len(targets) > MAX_STREAMS:
        raise bad_request(f"path: Too many: {len(targets)}: at most {MAX_STREAMS} watches on one stream",
                          [{"field": "path", "message": f"at most {MAX_STREAMS}"}])
    subs = [watch_request(req, t) for t in targets]
    # Each watch is answered (or refused) before the stream starts: a refusal of the whole
    # request (no token) is then the answer, as for one watch.
    resps = await asyncio.gather(*(handle(s) for s in subs))
    if all(r.status == 401 for r in resps):
        return resps[0]
    return RawResponse(200, {"content-type": "application/json", "transfer-encoding": "chunked",
                             "cache-control": "no-store"}, stream=_merged(resps))


async def _merged(resps: list[RawResponse]) -> AsyncIterator[bytes]:
    out: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=256)
    tasks = [asyncio.create_task(_pump(i, r, out)) for i, r in enumerate(resps)]
    done = asyncio.create_task(_close_when_done(tasks, out))
    try:
        while (line := await out.get()) is not None:
            yield line
    finally:
        done.cancel()
        for t in tasks:
            t.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*tasks, done, return_exceptions=True)


async def _close_when_done(tasks: list[asyncio.Task[None]], out: asyncio.Queue[bytes | None]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)
    await out.put(None)


__all__ = ["PATH", "serve"]
