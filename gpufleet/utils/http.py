"""The request/response pair shared by the API server and the in-process client transport.

The API server's core handler takes a RawRequest and gives a RawResponse; the HTTP adapter
(Starlette) and the client's in-process transport both speak this pair, so a component cannot
tell whether it runs in the same process as the server or across the network.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx


class BodyTooLarge(Exception):
    """The request body is over the limit it was read with (the rest is left unread)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over {limit} bytes")
        self.limit = limit


class BodyIncomplete(Exception):
    """The client went away before it had sent the whole body."""


# Reads a body the HTTP adapter left unread: at most ``limit`` bytes, else BodyTooLarge.
BodyReader = Callable[[int], Awaitable[bytes]]


@dataclass
class RawRequest:
    method: str
    path: str
    # Query parameters in order; a key may repeat.
    query: list[tuple[str, str]] = field(default_factory=list)
    # Header names in lower case.
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    # The peer's address, as the HTTP server saw it ("" in-process): the audit log's sourceIPs.
    remote_addr: str = ""
    # Set by the HTTP adapter: the body is still on the wire, read by read_body once the
    # request is authenticated and admitted (an unauthenticated sender cannot make the server
    # buffer it). In-process requests carry their body in ``body``.
    reader: BodyReader | None = field(default=None, repr=False, compare=False)
    # Set by the server once it knows who sent the request (the adapter then drains a
    # refused body rather than cut the connection).
    authenticated: bool = field(default=False, repr=False, compare=False)
    # The protocols the HTTP adapter can switch this request's connection to ("websocket"
    # for a WebSocket handshake, "spdy" for an HTTP/1.1 connection it can hand over); empty
    # in-process.
    upgrades: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    async def read_body(self, limit: int) -> bytes:
        """The body, read now if it is still on the wire; BodyTooLarge past ``limit`` bytes
        (0: no limit)."""
        if self.reader is not None:
            reader, self.reader = self.reader, None
            self.body = await reader(limit)
        elif limit and len(self.body) > limit:
            raise BodyTooLarge(limit)
        return self.body

    def declared_length(self) -> int | None:
        """The Content-Length the client sent, if it sent a valid one."""
        value = self.headers.get("content-length", "")
        return int(value) if value.isascii() and value.isdigit() else None

    def param(self, name: str, default: str | None = None) -> str | None:
        for k, v in self.query:
            if k == name:
                return v
        return default


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    # Set for streaming answers (watch, log -f): chunks to send as they come; body is then empty.
    stream: AsyncIterator[bytes] | None = None
    # Set when the answer switches protocols (status 101): the adapter completes the switch
    # and hands the connection to it.
    upgrade: Upgrade | None = None


@dataclass
class Upgrade:
    """A protocol switch: ``kind`` "websocket" (accepted with ``subprotocol``) or "spdy"
    (101 with ``headers``); ``run`` is then given the connection: a ``MessageChannel`` for
    a WebSocket, a byte stream (read/write/drain/close) for SPDY."""

    kind: str
    run: Callable[[Any], Awaitable[None]]
    subprotocol: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


class MessageChannel(Protocol):
    """A WebSocket's messages: recv() answers bytes or str, None once it closed."""

    async def recv(self) -> bytes | str | None: ...

    async def send(self, data: bytes | str) -> None: ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...


class Handler(Protocol):
    async def handle(self, request: RawRequest) -> RawResponse: ...


async def relay_body(resp: httpx.Response, log: logging.Logger, what: str) -> AsyncIterator[bytes]:
    """The raw body of a streamed httpx answer, chunk by chunk, for an answer relayed on; a
    stream that breaks off ends the relay (logged as ``what``) and the answer is closed."""
    try:
        async for chunk in resp.aiter_raw():
            if chunk:
                yield chunk
    except httpx.HTTPError as exc:
        log.info("%s: %s", what, exc)
    finally:
        with contextlib.suppress(Exception):
            await resp.aclose()
