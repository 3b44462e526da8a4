"""The relays of pods/exec, attach and portforward: the client's protocol on one side (a
WebSocket with the channel framing, or SPDY/3.1 streams), the node agent on the other, to
which the API server always speaks a WebSocket with the v5 channel framing:

  to the agent:   0 stdin, 4 terminal size (JSON {"Width","Height"}), 255 [0] stdin closed
  from the agent: 1 stdout, 2 stderr, 3 the final v1 Status (JSON), then it closes

A port-forward connection is one such WebSocket to ``/portforward/...?port=N``: 0 the
client's bytes, 255 [0] the client's half-close, 1 the pod's bytes, 3 an error (text).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException

from gpufleet.utils import spdy
from gpufleet.utils.http import MessageChannel

log = logging.getLogger(__name__)

STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
INTERNAL = "v5.channel.k8s.io"
# How long a SPDY client has to open the streams its request asked for.
STREAM_CREATION_TIMEOUT = 30.0


@dataclass
class ExecOptions:
    stdin: bool = False
    stdout: bool = True
    stderr: bool = True
    tty: bool = False
    command: list[str] = field(default_factory=list)


def failure(message: str, reason: str = "InternalError", code: int = 500) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class AgentUnreachable(Exception):
    pass


class AgentConn:
    """The WebSocket to an agent."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def recv(self) -> bytes | None:
        while True:
            try:
                message = await self.ws.recv()
            except (WebSocketException, OSError):
                return None
            if isinstance(message, bytes) and message:
                return message

    async def send(self, channel: int, data: bytes = b"") -> bool:
        try:
            await self.ws.send(bytes([channel]) + data)
        except (WebSocketException, OSError):
            return False
        return True

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()


@dataclass
class AgentDialer:
    url: str
    headers: Callable[[], dict[str, str]]
    tls: ssl.SSLContext | None
    server_name: str | None

    async def connect(self) -> AgentConn:
        kwargs: dict[str, Any] = {}
        if self.url.startswith("wss:"):
            kwargs.update(ssl=self.tls or ssl.create_default_context(), server_hostname=self.server_name)
        try:
            ws = await connect(self.url, additional_headers=self.headers(), subprotocols=[INTERNAL],  # type: ignore[list-item]
                               open_timeout=10, ping_interval=None, max_size=None, compression=None, **kwargs)
        except InvalidStatus as exc:
            body = exc.response.body or b""
            try:
                message = json.loads(body).get("message") or body.decode(errors="replace")
            except (ValueError, AttributeError):
                message = body.decode(errors="replace").strip()
            raise AgentUnreachable(message or f"the node agent answered {exc.response.status_code}") from None
        except (OSError, WebSocketException, TimeoutError) as exc:
            raise AgentUnreachable(f"error dialing backend: {exc or type(exc).__name__}") from None
        return AgentConn(ws)


def _exit_text(status: dict[str, Any]) -> str:
    """What the v1-v3 protocols carry on the error channel: the message of a failure."""
    if status.get("status") == "Success":
        return ""
    return str(status.get("message") or "error")


# --------------------------------------------------------------------------- exec / attach


class _ClientFrames:
    """The channel framing of a WebSocket client (binary, or base64 text)."""

    def __init__(self, channel: MessageChannel, proto: str) -> None:
        self.channel = channel
        self.b64 = proto.startswith("base64.") or ".base64." in proto
        self.proto = proto

    async def recv(self) -> tuple[int, bytes] | None:
        while True:
            message = await self.channel.recv()
            if message is None:
                return None
            if isinstance(message, str):
                if not message:
                    continue
                if self.b64:
                    try:
                        return int(message[0]), base64.b64decode(message[1:])
                    except ValueError:
                        continue
                message = message.encode()
            if message:
                return message[0], message[1:]

    async def send(self, channel: int, data: bytes) -> None:
        if self.b64:
            await self.channel.send(str(channel) + base64.b64encode(data).decode())
        else:
            await self.channel.send(bytes([channel]) + data)


async def _first_done(*aws: Any) -> None:
    """Runs the coroutines until the first ends; the others are cancelled."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t


async def ws_exec(channel: MessageChannel, dialer: AgentDialer, proto: str, opts: ExecOptions) -> None:
    client = _ClientFrames(channel, proto)
    v4plus = proto.startswith(("v4.", "v5."))
    try:
        agent = await dialer.connect()
    except AgentUnreachable as exc:
        status = failure(str(exc))
        await client.send(ERROR, json.dumps(status).encode() if v4plus else _exit_text(status).encode())
        return

    async def up() -> None:
        while (frame := await client.recv()) is not None:
            ch, data = frame
            if ch in (STDIN, RESIZE) or (ch == CLOSE and proto.startswith("v5.")):
                if not await agent.send(ch, data):
                    return
        # The client went away: so does the stream (the process sees its stdin end).
        await agent.close()

    async def down() -> None:
        while (message := await agent.recv()) is not None:
            ch, data = message[0], message[1:]
            if ch in (STDOUT, STDERR):
                await client.send(ch, data)
            elif ch == ERROR:
                if v4plus:
                    await client.send(ERROR, data)
                else:
                    text = _exit_text(_json(data))
                    if text:
                        await client.send(ERROR, text.encode())

    try:
        await _first_done(down(), _after(up(), asyncio.Event()))
    finally:
        await agent.close()


async def _after(coro: Any, forever: asyncio.Event) -> None:
    """``coro``, then wait (the other side decides when the relay ends)."""
    await coro
    await forever.wait()


def _json(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return failure(data.decode(errors="replace"))
    return value if isinstance(value, dict) else failure(str(value))


async def spdy_exec(conn: spdy.ByteStream, dialer: AgentDialer, proto: str, opts: ExecOptions) -> None:
    session = spdy.Session(conn, client=False)
    serving = asyncio.ensure_future(session.serve())
    try:
        await _spdy_exec(session, dialer, proto, opts)
    finally:
        await session.close()
        serving.cancel()
        with contextlib.suppress(BaseException):
            await serving


async def _spdy_exec(session: spdy.Session, dialer: AgentDialer, proto: str, opts: ExecOptions) -> None:
    version = 1 if proto == "channel.k8s.io" else int(proto[1])
    wanted = {"error"} | {n for n, on in (("stdin", opts.stdin), ("stdout", opts.stdout),
                                           ("stderr", opts.stderr)) if on}
    if opts.tty and version >= 3:
        wanted.add("resize")
    streams: dict[str, spdy.Stream] = {}

    async def collect() -> None:
        while not wanted <= streams.keys():
            s = await session.accept()
            if s is None:
                return
            await s.reply()
            streams[s.headers.get("streamtype", "")] = s

    try:
        await asyncio.wait_for(collect(), STREAM_CREATION_TIMEOUT)
    except TimeoutError:
        log.info("exec: the client opened %s of the streams %s", sorted(streams), sorted(wanted))
    if session.closed.is_set():
        return
    error = streams.get("error")

    async def report(status: dict[str, Any]) -> None:
        if error is None:
            return
        with contextlib.suppress(spdy.StreamReset):
            await error.write(json.dumps(status).encode() if version >= 4 else _exit_text(status).encode())

    try:
        agent = await dialer.connect()
    except AgentUnreachable as exc:
        await report(failure(str(exc)))
        await _close_all(streams)
        return

    async def stdin_up() -> None:
        s = streams.get("stdin")
        if s is not None:
            while data := await s.read():
                if not await agent.send(STDIN, data):
                    return
        await agent.send(CLOSE, bytes([STDIN]))

    async def resize_up() -> None:
        s = streams.get("resize")
        if s is None:
            return
        decoder, buf = json.JSONDecoder(), ""
        while data := await s.read():
            buf += data.decode(errors="replace")
            while buf.strip():
                try:
                    size, end = decoder.raw_decode(buf.lstrip())
                except ValueError:
                    break
                buf = buf.lstrip()[end:]
                await agent.send(RESIZE, json.dumps(size).encode())

    async def down() -> None:
        by_channel = {STDOUT: streams.get("stdout"), STDERR: streams.get("stderr")}
        while (message := await agent.recv()) is not None:
            ch, data = message[0], message[1:]
            target = by_channel.get(ch)
            if target is not None and data:
                with contextlib.suppress(spdy.StreamReset):
                    await target.write(data)
            elif ch == ERROR:
                status = _json(data)
                if version >= 4 or status.get("status") != "Success":
                    await report(status)

    ups = [asyncio.ensure_future(stdin_up()), asyncio.ensure_future(resize_up())]
    try:
        await _first_done(down(), session.closed.wait())
    finally:
        for t in ups:
            t.cancel()
        await agent.close()
        await _close_all(streams)


async def _close_all(streams: dict[str, spdy.Stream]) -> None:
    for s in streams.values():
        with contextlib.suppress(Exception):
            await s.close()


# --------------------------------------------------------------------------- port-forward


async def _forward_one(agent_for: Callable[[int], AgentDialer], port: int, where: str,
                       recv: Callable[[], Any], send_data: Callable[[bytes], Any],
                       send_error: Callable[[str], Any]) -> None:
    """One connection to ``port`` of the pod: the client's bytes from ``recv`` (b"" at its
    half-close, None once it is gone), the pod's to ``send_data``, failures to ``send_error``."""
    try:
        agent = await agent_for(port).connect()
    except AgentUnreachable as exc:
        await send_error(f"error forwarding port {port} to {where}: {exc}")
        return

    async def up() -> None:
        while True:
            data = await recv()
            if not data:
                if data is not None:
                    await agent.send(CLOSE, bytes([STDIN]))
                    return
                await agent.close()
                return
            if not await agent.send(STDIN, data):
                return

    async def down() -> None:
        while (message := await agent.recv()) is not None:
            ch, data = message[0], message[1:]
            if ch == STDOUT and data:
                await send_data(data)
            elif ch == ERROR:
                await send_error(f"error forwarding port {port} to {where}: {data.decode(errors='replace')}")

    try:
        await _first_done(down(), _after(up(), asyncio.Event()))
    finally:
        await agent.close()


async def spdy_portforward(conn: spdy.ByteStream, agent_for: Callable[[int], AgentDialer], where: str) -> None:
    """kubelet's SPDY port-forward: the client opens an error and a data stream per
    connection (headers streamType, port, requestID); the pair is forwarded once both came."""
    session = spdy.Session(conn, client=False)
    serving = asyncio.ensure_future(session.serve())
    pending: dict[str, dict[str, spdy.Stream]] = {}
    tasks: set[asyncio.Task] = set()

    async def forward(port_text: str, error: spdy.Stream, data: spdy.Stream) -> None:
        async def send_error(text: str) -> None:
            with contextlib.suppress(spdy.StreamReset):
                await error.write(text.encode())

        async def send_data(chunk: bytes) -> None:
            await data.write(chunk)

        async def recv() -> bytes | None:
            chunk = await data.read()
            return None if not chunk and data.was_reset else chunk

        try:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                await send_error(f'invalid port: "{port_text}"')
            else:
                await _forward_one(agent_for, int(port_text), where, recv, send_data, send_error)
        except spdy.StreamReset:
            pass
        finally:
            for s in (data, error):
                with contextlib.suppress(Exception):
                    await s.close()

    try:
        while (s := await session.accept()) is not None:
            await s.reply()
            kind = s.headers.get("streamtype", "")
            key = s.headers.get("requestid") or s.headers.get("port", "")
            if kind not in ("error", "data"):
                await s.reset(spdy.PROTOCOL_ERROR)
                continue
            pair = pending.setdefault(key, {})
            pair[kind] = s
            if len(pair) == 2:
                del pending[key]
                t = asyncio.ensure_future(forward(pair["data"].headers.get("port", ""), pair["error"], pair["data"]))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
    finally:
        for t in list(tasks):
            t.cancel()
        await session.close()
        serving.cancel()
        with contextlib.suppress(BaseException):
            await serving


class _Tunnel:
    """A WebSocket's binary messages as a byte stream (kubectl 1.31+ port-forward)."""

    def __init__(self, channel: MessageChannel) -> None:
        self.channel = channel
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self._eof = False

    async def read(self, n: int = 65536) -> bytes:
        while not self._buffer and not self._eof:
            message = await self.channel.recv()
            if message is None:
                self._eof = True
            else:
                self._buffer += message if isinstance(message, bytes) else message.encode()
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def write(self, data: bytes) -> None:
        self._out.append(data)

    async def drain(self) -> None:
        while self._out:
            await self.channel.send(self._out.pop(0))

    def close(self) -> None:
        self._eof = True


async def tunnel_portforward(channel: MessageChannel, agent_for: Callable[[int], AgentDialer], where: str) -> None:
    await spdy_portforward(_Tunnel(channel), agent_for, where)


async def ws_portforward(channel: MessageChannel, agent_for: Callable[[int], AgentDialer], ports: list[int],
                         where: str) -> None:
    """kubelet's WebSocket port-forward (v4.channel.k8s.io): port i has data channel 2i and
    error channel 2i+1, each opened with the port as 2 bytes little-endian; one connection
    a port, made at once; the WebSocket closes when every one has ended."""
    client = _ClientFrames(channel, "v4.channel.k8s.io")
    inboxes: list[asyncio.Queue[bytes | None]] = [asyncio.Queue() for _ in ports]
    for i, port in enumerate(ports):
        await client.send(2 * i, struct.pack("<H", port))
        await client.send(2 * i + 1, struct.pack("<H", port))

    async def route() -> None:
        while (frame := await client.recv()) is not None:
            ch, data = frame
            if ch % 2 == 0 and ch // 2 < len(inboxes) and data:
                inboxes[ch // 2].put_nowait(data)
        for q in inboxes:
            q.put_nowait(None)

    def one(i: int, port: int) -> Any:
        async def send_error(text: str) -> None:
            await client.send(2 * i + 1, text.encode())

        async def send_data(chunk: bytes) -> None:
            await client.send(2 * i, chunk)

        return _forward_one(agent_for, port, where, inboxes[i].get, send_data, send_error)

    router = asyncio.ensure_future(route())
    try:
        await asyncio.gather(*(one(i, p) for i, p in enumerate(ports)))
    finally:
        router.cancel()
        with contextlib.suppress(BaseException):
            await router
