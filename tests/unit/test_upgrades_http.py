"""utils/upgrades.py on a real uvicorn server and raw sockets, for both protocols: an upgrade
the application takes over gets 101 and the connection as a byte stream (bytes the client
sent right after the request included); one it declines is answered and the connection
closed; a method llhttp does not know still reaches the application."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
import uvicorn

from gpufleet.utils import upgrades
from gpufleet.utils.upgrades import TAKEOVER, UpgradableH11Protocol

PROTOCOLS = [UpgradableH11Protocol]
if getattr(upgrades, "UpgradableHttpToolsProtocol", None) is not None:
    PROTOCOLS.append(upgrades.UpgradableHttpToolsProtocol)


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    takeover = (scope.get("extensions") or {}).get(TAKEOVER)
    if scope["path"] == "/upgrade" and takeover is not None:
        raw = await takeover([(b"connection", b"Upgrade"), (b"upgrade", b"echo")])
        while data := await raw.read():
            raw.write(b"echo:" + data)
            await raw.drain()
        raw.close()
        return
    body = f"{scope['method']} {scope['path']}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(params=PROTOCOLS, ids=lambda p: p.__name__)
async def port(request) -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=request.param, lifespan="off", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)


async def _head(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)


async def test_a_taken_over_upgrade_streams_bytes_both_ways(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    # The first bytes of the other protocol come in the same packet as the request.
    writer.write(b"POST /upgrade HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n"
                 b"Content-Length: 0\r\n\r\nearly")
    head = await _head(reader)
    assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n") and b"upgrade: echo" in head.lower()
    assert await asyncio.wait_for(reader.readexactly(len(b"echo:early")), 5) == b"echo:early"
    writer.write(b"later")
    assert await asyncio.wait_for(reader.readexactly(len(b"echo:later")), 5) == b"echo:later"
    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_a_declined_upgrade_is_answered_and_the_connection_then_closed_or_kept(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /plain HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
    head = await _head(reader)
    assert head.startswith(b"HTTP/1.1 200")
    assert await asyncio.wait_for(reader.readexactly(len(b"GET /plain")), 5) == b"GET /plain"
    # A next request is served or the connection ends (llhttp parses nothing after an
    # upgrade, so there the answer said "connection: close"); it never hangs.
    writer.write(b"GET /again HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        again = await _head(reader)
    except asyncio.IncompleteReadError as exc:
        assert exc.partial == b"" and b"connection: close" in head.lower()
    else:
        assert again.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
        assert await asyncio.wait_for(reader.readexactly(len(b"GET /again")), 5) == b"GET /again"
    writer.close()


async def test_any_method_token_reaches_the_application_on_a_kept_alive_connection(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for method in (b"GET", b"FOO", b"PATCH", b"BREW"):
        writer.write(method + b" /m HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        head = await _head(reader)
        assert head.startswith(b"HTTP/1.1 200"), (method, head)
        expected = method + b" /m"
        assert await asyncio.wait_for(reader.readexactly(len(expected)), 5) == expected
    writer.close()
