"""HTTP adapter: Starlette in front of ApiServer.handle, served by uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import ssl
import zlib
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, HTTPConnection, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import request_response
from starlette.websockets import WebSocket, WebSocketDisconnect

from gpufleet.apiserver.headers import safe_headers
from gpufleet.utils.http import BodyIncomplete, BodyTooLarge, Handler, RawRequest, RawResponse
from gpufleet.utils.upgrades import SERVER_PROTOCOL, TAKEOVER
from gpufleet.utils.uvicornserver import ServerTask

log = logging.getLogger("gpufleet.apiserver")

def _text(value: str) -> str:
    """A header value as the UTF-8 text its bytes spell, as Go's servers read it (Starlette
    decodes them as latin-1); bytes that are not UTF-8 stay as latin-1 characters."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


def _headers(request: HTTPConnection) -> dict[str, str]:
    """Lower-cased names; a header sent several times (kubectl's Impersonate-Group for each
    --as-group) is joined with ", " as HTTP allows, so no value is lost."""
    out: dict[str, str] = {}
    for k, v in request.headers.items():
        k, v = k.lower(), _text(v)
        out[k] = f"{out[k]}, {v}" if k in out else v
    return out


# What is left of a refused body is read and thrown away after the answer (a client that
# writes its whole body before it reads, as most Python ones over TLS, then gets the answer,
# not a reset) up to this much from an authenticated sender, else the connection is closed
# instead: a stranger cannot keep the server decrypting megabytes.
_DRAIN_BYTES = 64 * 1024 * 1024
_UNAUTHENTICATED_DRAIN_BYTES = 256 * 1024


class _Body:
    """The request body as it arrives, read only when ApiServer asks and only up to its
    limit. Until then uvicorn holds at most its 64 KiB read buffer of it."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.complete = False

    async def read(self, limit: int) -> bytes:
        declared = self.request.headers.get("content-length", "")
        if limit and declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(limit)
        body = bytearray()
        try:
            async for chunk in self.request.stream():
                body += chunk
                if limit and len(body) > limit:
                    raise BodyTooLarge(limit)
        except ClientDisconnect:
            raise BodyIncomplete() from None
        self.complete = True
        return bytes(body)

    def close_after(self, authenticated: bool) -> bool:
        """Whether to close the connection after the answer rather than drain the body."""
        if self.complete:
            return False
        bound = _DRAIN_BYTES if authenticated else _UNAUTHENTICATED_DRAIN_BYTES
        declared = self.request.headers.get("content-length", "")
        if declared.isdigit():
            return int(declared) > bound
        # A chunked body's size is unknown: a stranger's is cut off, an authenticated
        # sender's drained (uvicorn's keep-alive timeout still ends an endless one).
        return not authenticated and "chunked" in self.request.headers.get("transfer-encoding", "").lower()


class _Messages:
    """A Starlette WebSocket as a MessageChannel."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    async def recv(self) -> bytes | str | None:
        try:
            message = await self.ws.receive()
        except (WebSocketDisconnect, RuntimeError):
            return None
        if message["type"] == "websocket.disconnect":
            return None
        data = message.get("bytes")
        return data if data is not None else message.get("text") or ""

    async def send(self, data: bytes | str) -> None:
        if isinstance(data, str):
            await self.ws.send_text(data)
        else:
            await self.ws.send_bytes(data)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        with contextlib.suppress(Exception):
            await self.ws.close(code, reason)


def _raw_request(conn: HTTPConnection, method: str, **kwargs: Any) -> RawRequest:
    return RawRequest(
        method=method,
        # The decoded path as sent: request.url.path would drop tabs and line breaks.
        path=conn.scope["path"],
        query=list(conn.query_params.multi_items()),
        headers=_headers(conn),
        remote_addr=conn.client.host if conn.client else "",
        **kwargs,
    )


def _response(resp: RawResponse, headers: dict[str, str] | None = None) -> Response:
    # The last line of defence: a header value that cannot be encoded would fail the
    # response after the handler may have stored a write, so it is escaped here too.
    sent = safe_headers(resp.headers)
    media_type = sent.get("content-type")
    out = {k: v for k, v in sent.items() if k not in ("content-type", "transfer-encoding")}
    out.update(headers or {})
    if resp.stream is not None:
        return StreamingResponse(resp.stream, status_code=resp.status, headers=out, media_type=media_type)
    return Response(resp.body, status_code=resp.status, headers=out, media_type=media_type)


async def _websocket(handler: Handler, ws: WebSocket) -> None:
    """A WebSocket handshake: the API decides (exec, attach, port-forward); a refusal is
    answered as HTTP (kubectl reads the Status in it), else the WebSocket is the stream's."""
    raw = _raw_request(ws, "GET", upgrades=frozenset({"websocket"}))
    # The handshake's own headers, as the client sent them (wsproto keeps them out of the scope).
    raw.headers["upgrade"] = "websocket"
    if ws.scope.get("subprotocols"):
        raw.headers["sec-websocket-protocol"] = ", ".join(ws.scope["subprotocols"])
    resp = await handler.handle(raw)
    if resp.upgrade is None or resp.upgrade.kind != "websocket":
        if resp.status == 101:
            resp = RawResponse(400, {"content-type": "text/plain"}, b"this request cannot be upgraded to a WebSocket")
        await ws.send_denial_response(_response(resp))
        return
    await ws.accept(subprotocol=resp.upgrade.subprotocol)
    channel = _Messages(ws)
    try:
        await resp.upgrade.run(channel)
    finally:
        await channel.close()


# kube-apiserver's response compression (APIResponseCompression): a GET answer over 128 KiB
# is sent gzip-compressed, at level 1, to a client that accepts gzip (Go's HTTP client and
# httpx ask for it unless told not to; kubectl --disable-compression turns it off).
GZIP_THRESHOLD = 128 * 1024
GZIP_LEVEL = 1


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding value admits gzip (``gzip`` or ``*`` with a q above 0)."""
    for part in accept_encoding.split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() not in ("gzip", "*"):
            continue
        q = params.strip().lower()
        if q.startswith("q="):
            try:
                if float(q[2:]) <= 0:
                    continue
            except ValueError:
                continue
        return True
    return False


# A body over this is sent as it is compressed, piece by piece (chunked): the client reads
# and decompresses the first pieces while the rest are compressed.
GZIP_STREAM_THRESHOLD = 4 * 1024 * 1024
GZIP_PIECE = 8 * 1024 * 1024


async def _compressed(raw: RawRequest, resp: RawResponse) -> RawResponse:
    if (raw.method != "GET" or resp.stream is not None or resp.status != 200 or len(resp.body) <= GZIP_THRESHOLD
            or any(k.lower() == "content-encoding" for k in resp.headers)
            or not accepts_gzip(raw.headers.get("accept-encoding", ""))):
        return resp
    headers = {k: v for k, v in resp.headers.items() if k.lower() != "content-length"}
    headers["content-encoding"] = "gzip"
    if len(resp.body) > GZIP_STREAM_THRESHOLD:
        return RawResponse(resp.status, headers, stream=_gzip_pieces(resp.body))
    # In a thread: zlib lets go of the GIL while it works, so the loop serves others meanwhile.
    body = await asyncio.to_thread(gzip.compress, resp.body, GZIP_LEVEL, mtime=0)
    return RawResponse(resp.status, headers, body)


async def _gzip_pieces(body: bytes) -> AsyncIterator[bytes]:
    """One gzip stream of ``body``, compressed a piece at a time in a thread."""
    z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # 31: the gzip wrapper
    view = memoryview(body)
    for start in range(0, len(body), GZIP_PIECE):
        out = await asyncio.to_thread(z.compress, view[start:start + GZIP_PIECE])
        if out:
            yield out
    yield z.flush()


def build_asgi_app(handler: Handler) -> Starlette:
    async def endpoint(request: Request) -> Response:
        body = _Body(request)
        takeover = (request.scope.get("extensions") or {}).get(TAKEOVER)
        raw = _raw_request(request, request.method, reader=body.read,
                           upgrades=frozenset({"spdy"}) if takeover is not None else frozenset())
        resp = await handler.handle(raw)
        if resp.upgrade is not None and resp.upgrade.kind == "spdy" and takeover is not None:
            conn = await takeover([(k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.upgrade.headers.items()])
            try:
                await resp.upgrade.run(conn)
            finally:
                conn.close()
            return Response()  # not sent: the connection was the stream's
        resp = await _compressed(raw, resp)
        return _response(resp, {"connection": "close"} if body.close_after(raw.authenticated) else None)

    http = request_response(endpoint)

    async def default(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await _websocket(handler, WebSocket(scope, receive, send))
        else:
            await http(scope, receive, send)

    # Every method and every path reach the handler, which answers each with a Status (a
    # route's pattern would not match a path holding a line break, %0A, and a route's method
    # list answers others with a plain-text 404 or 405): the router's default is the endpoint.
    app = Starlette()
    app.router.default = default
    return app


class HttpServer(ServerTask):
    """A uvicorn server run as a task of the current event loop (so `gpufleet up` can host the
    API next to the scheduler, controllers and agent in one process)."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 6443,
                 certfile: str | None = None, keyfile: str | None = None, log_level: str = "warning") -> None:
        kwargs: dict[str, Any] = {}
        if certfile:
            kwargs.update(ssl_certfile=certfile, ssl_keyfile=keyfile, ssl_version=ssl.PROTOCOL_TLS_SERVER)
        config = uvicorn.Config(
            build_asgi_app(handler), host=host, port=port, log_level=log_level, access_log=False,
            lifespan="off", timeout_keep_alive=75, timeout_graceful_shutdown=2,
            # SPDY upgrades (exec, attach, port-forward) are taken over by the application.
            http=SERVER_PROTOCOL, ws="wsproto", **kwargs,
        )
        super().__init__(config, what="API server", stop_timeout=5)
