"""HTTP adapter: Starlette in front of ApiServer.handle, served by uvicorn."""

from __future__ import annotations

import logging
import ssl
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import request_response

from gpufleet.apiserver.headers import safe_headers
from gpufleet.utils.http import BodyIncomplete, BodyTooLarge, Handler, RawRequest
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


def _headers(request: Request) -> dict[str, str]:
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


def build_asgi_app(handler: Handler) -> Starlette:
    async def endpoint(request: Request) -> Response:
        body = _Body(request)
        raw = RawRequest(
            method=request.method,
            # The decoded path as sent: request.url.path would drop tabs and line breaks.
            path=request.scope["path"],
            query=list(request.query_params.multi_items()),
            headers=_headers(request),
            reader=body.read,
            remote_addr=request.client.host if request.client else "",
        )
        resp = await handler.handle(raw)
        # The last line of defence: a header value that cannot be encoded would fail the
        # response after the handler may have stored a write, so it is escaped here too.
        sent = safe_headers(resp.headers)
        headers = {k: v for k, v in sent.items() if k not in ("content-type", "transfer-encoding")}
        if body.close_after(raw.authenticated):
            headers["connection"] = "close"
        media_type = sent.get("content-type")
        if resp.stream is not None:
            return StreamingResponse(resp.stream, status_code=resp.status, headers=headers, media_type=media_type)
        return Response(resp.body, status_code=resp.status, headers=headers, media_type=media_type)

    # Every method and every path reach the handler, which answers each with a Status (a
    # route's pattern would not match a path holding a line break, %0A, and a route's method
    # list answers others with a plain-text 404 or 405): the router's default is the endpoint.
    app = Starlette()
    app.router.default = request_response(endpoint)
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
            lifespan="off", timeout_keep_alive=75, timeout_graceful_shutdown=2, **kwargs,
        )
        super().__init__(config, what="API server", stop_timeout=5)
