"""Connection upgrades other than WebSocket on uvicorn (SPDY/3.1 for kubectl exec, attach and
port-forward), which uvicorn does not hand over by itself.

``UpgradableHttpToolsProtocol`` (uvicorn's httptools protocol, llhttp's C parser; the API
server's) and ``UpgradableH11Protocol`` (its h11 protocol, pure Python) add, for
``uvicorn.Config(http=...)``, one ASGI extension to every HTTP scope, ``gpufleet.takeover``:
an async function that the application calls once it has decided (authenticated,
authorized, checked the request) to switch protocols. It writes ``101 Switching Protocols``
with the given headers and answers the connection as a ``RawConnection``
(read/write/drain/close), bytes the client sent after the request included. The ASGI
request is then over (what the application sends through ``send`` afterwards is dropped),
and the connection is the application's until it closes it; a server shutting down closes
it too. A request that asks for an upgrade which the application does not take is answered
as any other request.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a dependency; h11 serves without it
    httptools = None
    HttpToolsProtocol = None

TAKEOVER = "gpufleet.takeover"
# Unread bytes past which the connection stops reading until the application catches up.
_READ_HIGH_WATER = 1024 * 1024


class RawConnection(asyncio.Protocol):
    """An upgraded connection as a byte stream (the transport's protocol from the switch on)."""

    def __init__(self, transport: asyncio.Transport, buffered: bytes, connections: set[Any]) -> None:
        self.transport = transport
        self._buffer = bytearray(buffered)
        self._eof = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._connections = connections
        self._paused = False
        connections.add(self)
        if buffered:
            self._readable.set()

    # asyncio.Protocol
    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._readable.set()
        if len(self._buffer) > _READ_HIGH_WATER and not self._paused:
            self._paused = True
            with contextlib.suppress(Exception):
                self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        self._eof = True
        self._readable.set()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._readable.set()
        self._writable.set()
        self._connections.discard(self)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # what uvicorn asks of every connection when it shuts down
    def shutdown(self) -> None:
        self.close()

    # the byte stream
    async def read(self, n: int = 65536) -> bytes:
        while not self._buffer:
            if self._eof:
                return b""
            self._readable.clear()
            await self._readable.wait()
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        if self._paused and len(self._buffer) < _READ_HIGH_WATER // 2:
            self._paused = False
            with contextlib.suppress(Exception):
                self.transport.resume_reading()
        return data

    def write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)

    async def drain(self) -> None:
        if self.transport.is_closing():
            raise ConnectionResetError("the connection is closed")
        await self._writable.wait()

    def close(self) -> None:
        self._eof = True
        self._readable.set()
        self.transport.close()


def _with_takeover(protocol: Any) -> None:
    """Wrap the protocol's application so that every HTTP scope carries its takeover."""
    inner = protocol.app

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope.setdefault("extensions", {})[TAKEOVER] = protocol._takeover
        await inner(scope, receive, send)

    protocol.app = app


def _switching_protocols(headers: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join([b"HTTP/1.1 101 Switching Protocols\r\n",
                     *(name + b": " + value + b"\r\n" for name, value in headers), b"\r\n"])


class UpgradableH11Protocol(H11Protocol):
    """uvicorn's h11 protocol whose applications may take over an upgraded connection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _with_takeover(self)

    def _should_upgrade(self) -> bool:
        # Only WebSocket is uvicorn's to upgrade; others reach the application, which may
        # take them over (no "Unsupported upgrade request" warning for each).
        return self._get_upgrade() == b"websocket" and self._should_upgrade_to_ws()

    async def _takeover(self, headers: list[tuple[bytes, bytes]]) -> RawConnection:
        cycle = self.cycle
        if cycle is None or cycle.response_started:
            raise RuntimeError("the response has started: the connection cannot be taken over")
        # The request must be complete (h11 waits in MIGHT_SWITCH_PROTOCOL then).
        while self.conn.their_state is h11.SEND_BODY and not cycle.disconnected:
            message = await cycle.receive()
            if message["type"] == "http.disconnect":
                break
        if self.conn.their_state is not h11.MIGHT_SWITCH_PROTOCOL:
            raise RuntimeError("the request did not ask to switch protocols")
        out = self.conn.send(h11.InformationalResponse(status_code=101, headers=headers,
                                                       reason=b"Switching Protocols"))
        self.transport.write(out or b"")
        buffered, _ = self.conn.trailing_data
        cycle.response_started = cycle.response_complete = True
        cycle.disconnected = True  # what the application sends through ASGI now is dropped
        self._unset_keepalive_if_required()
        self.connections.discard(self)
        raw = RawConnection(self.transport, bytes(buffered), self.connections)
        self.transport.set_protocol(raw)
        self.transport.resume_reading()
        return raw


if HttpToolsProtocol is not None:

    class UpgradableHttpToolsProtocol(HttpToolsProtocol):  # type: ignore[misc,valid-type]
        """uvicorn's httptools protocol whose applications may take over an upgraded connection.

        llhttp stops parsing at a request that asks to upgrade (HttpParserUpgrade, with where
        the other protocol's bytes begin). The request still reaches the application as any
        other; what the client sends after it is kept (reading paused past a limit) for the
        connection a takeover returns. A request the application answers without taking the
        connection over closes it once answered: the parser cannot go on after an upgrade."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            _with_takeover(self)
            self._upgraded: bytearray | None = None
            # Header values with control characters (other than CR and LF, which end a line)
            # reach the application, as under h11, which answers them with a Status.
            with contextlib.suppress(AttributeError, TypeError):
                self.parser.set_dangerous_leniencies(lenient_headers=True)

        def _should_upgrade(self) -> bool:
            return self._get_upgrade() == b"websocket" and self._should_upgrade_to_ws()

        def data_received(self, data: bytes) -> None:
            if self._upgraded is not None:
                self._keep(data)
                return
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserInvalidMethodError:
                if self.cycle is None or self.cycle.response_complete:
                    # llhttp knows a fixed list of methods; HTTP allows any token, and the
                    # API answers the others with a Status (405), as kube-apiserver does.
                    # The connection goes on under h11, from this request on.
                    self._to_h11(data)
                    return
                self.send_400_response("Invalid HTTP request received.")
            except httptools.HttpParserError:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
            except httptools.HttpParserUpgrade as exc:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                    return
                offset = exc.args[0] if exc.args and isinstance(exc.args[0], int) else len(data)
                self._upgraded = bytearray()
                if self.cycle is not None:
                    self.cycle.keep_alive = False
                self._keep(data[offset:])

        def _to_h11(self, data: bytes) -> None:
            self.connections.discard(self)
            other = UpgradableH11Protocol(config=self.config, server_state=self.server_state,
                                          app_state=self.app_state, _loop=self.loop)
            other.connection_made(self.transport)
            self.transport.set_protocol(other)
            other.data_received(data)

        def _keep(self, data: bytes) -> None:
            assert self._upgraded is not None
            self._upgraded += data
            if len(self._upgraded) > _READ_HIGH_WATER:
                self.flow.pause_reading()

        async def _takeover(self, headers: list[tuple[bytes, bytes]]) -> RawConnection:
            cycle = self.cycle
            if cycle is None or cycle.response_started:
                raise RuntimeError("the response has started: the connection cannot be taken over")
            if self._upgraded is None:
                raise RuntimeError("the request did not ask to switch protocols")
            self.transport.write(_switching_protocols(headers))
            cycle.response_started = cycle.response_complete = True
            cycle.disconnected = True  # what the application sends through ASGI now is dropped
            cycle.message_event.set()
            self._unset_keepalive_if_required()
            self.connections.discard(self)
            raw = RawConnection(self.transport, bytes(self._upgraded), self.connections)
            self.transport.set_protocol(raw)
            self.transport.resume_reading()
            return raw

    SERVER_PROTOCOL: type = UpgradableHttpToolsProtocol
else:  # pragma: no cover
    SERVER_PROTOCOL = UpgradableH11Protocol
