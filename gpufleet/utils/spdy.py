"""SPDY/3.1, as kubectl and client-go speak it for exec, attach, cp and port-forward
(moby/spdystream): the frames (SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY,
HEADERS, WINDOW_UPDATE and DATA), the zlib-compressed header blocks with SPDY/3's
dictionary, and a session of streams over any byte stream (a TCP or TLS connection taken
over after ``101 Switching Protocols``, or a WebSocket carrying SPDY in its binary messages,
as kubectl 1.31+ tunnels port-forward).

No maintained SPDY library exists for Python; this is the part of the protocol those
clients use. Flow control: every stream has a 64 KiB window each way. What the peer sends
is acknowledged with WINDOW_UPDATE as it is read. What we send is held to the peer's window
once the peer shows it keeps windows (it sent SETTINGS or a WINDOW_UPDATE): spdystream, the
peer of every kubectl, does neither and ignores ours, so with it the TCP connection alone
paces the data (a session stops reading while a stream holds more than ``BUFFER_LIMIT``
unread bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)

VERSION = 3
DATA = 0
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02
SETTINGS_INITIAL_WINDOW_SIZE = 7
# RST_STREAM status codes.
PROTOCOL_ERROR, INVALID_STREAM, REFUSED_STREAM, CANCEL, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 1, 2, 3, 5, 6, 7
DEFAULT_WINDOW = 64 * 1024
MAX_LENGTH = (1 << 24) - 1
# The largest DATA frame we send, and what one stream may hold unread before the session
# stops reading the connection.
CHUNK = 16 * 1024
BUFFER_LIMIT = 1024 * 1024
# Decompressed header blocks larger than this end the session (a zlib bomb is refused).
MAX_HEADER_BLOCK = 256 * 1024

_DICTIONARY_WORDS = (
    'options', 'head', 'post', 'put', 'delete', 'trace', 'accept', 'accept-charset', 'accept-encoding',
    'accept-language', 'accept-ranges', 'age', 'allow', 'authorization', 'cache-control', 'connection',
    'content-base', 'content-encoding', 'content-language', 'content-length', 'content-location',
    'content-md5', 'content-range', 'content-type', 'date', 'etag', 'expect', 'expires', 'from', 'host',
    'if-match', 'if-modified-since', 'if-none-match', 'if-range', 'if-unmodified-since', 'last-modified',
    'location', 'max-forwards', 'pragma', 'proxy-authenticate', 'proxy-authorization', 'range', 'referer',
    'retry-after', 'server', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'user-agent', 'vary', 'via',
    'warning', 'www-authenticate', 'method', 'get', 'status', '200 OK', 'version', 'HTTP/1.1', 'url',
    'public', 'set-cookie', 'keep-alive', 'origin',
)
_DICTIONARY_TAIL = (
    b'100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505203 '
    b'Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 '
    b'Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service '
    b'UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, '
    b'Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+x'
    b'ml,text/plain,text/javascript,publicprivatemax-'
    b'age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.'
)


DICTIONARY = (b"".join(struct.pack(">I", len(w)) + w.encode() for w in _DICTIONARY_WORDS)
              + _DICTIONARY_TAIL)


class ProtocolError(Exception):
    """The peer broke the framing; the session ends."""


class ByteStream(Protocol):
    """What a session runs over: read() answers b"" at the end."""

    async def read(self, n: int) -> bytes: ...

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


Headers = Mapping[str, "str | Sequence[str]"]


class HeaderCodec:
    """One side's two zlib contexts: each lasts the whole session, so the header blocks of
    a direction must be encoded (and decoded) in the order their frames are sent."""

    def __init__(self) -> None:
        self._compress = zlib.compressobj(zdict=DICTIONARY)
        self._decompress = zlib.decompressobj(zdict=DICTIONARY)

    def encode(self, headers: Headers) -> bytes:
        parts = [struct.pack(">I", len(headers))]
        for name, value in headers.items():
            key = name.lower().encode()
            raw = (value if isinstance(value, str) else "\0".join(value)).encode()
            parts += [struct.pack(">I", len(key)), key, struct.pack(">I", len(raw)), raw]
        block = b"".join(parts)
        return self._compress.compress(block) + self._compress.flush(zlib.Z_SYNC_FLUSH)

    def decode(self, data: bytes) -> dict[str, list[str]]:
        try:
            raw = self._decompress.decompress(data, MAX_HEADER_BLOCK)
        except zlib.error as exc:
            raise ProtocolError(f"header block: {exc}") from None
        if self._decompress.unconsumed_tail:
            raise ProtocolError(f"header block over {MAX_HEADER_BLOCK} bytes")
        return parse_header_block(raw)


def parse_header_block(raw: bytes) -> dict[str, list[str]]:
    def take(at: int) -> tuple[bytes, int]:
        if at + 4 > len(raw):
            raise ProtocolError("header block cut short")
        (n,) = struct.unpack_from(">I", raw, at)
        if at + 4 + n > len(raw):
            raise ProtocolError("header block cut short")
        return raw[at + 4:at + 4 + n], at + 4 + n

    if len(raw) < 4:
        raise ProtocolError("header block cut short")
    (count,) = struct.unpack_from(">I", raw, 0)
    out: dict[str, list[str]] = {}
    at = 4
    for _ in range(count):
        name, at = take(at)
        value, at = take(at)
        if not name:
            raise ProtocolError("empty header name")
        out.setdefault(name.decode("latin-1").lower(), []).extend(value.decode("latin-1").split("\0"))
    return out


@dataclass
class Frame:
    """One frame; ``type`` DATA (0) or a control frame type. The fields a type does not use
    keep their defaults."""

    type: int
    flags: int = 0
    stream_id: int = 0
    data: bytes = b""
    headers: dict[str, list[str]] = field(default_factory=dict)
    associated: int = 0
    priority: int = 0
    status: int = 0
    delta: int = 0
    settings: dict[int, int] = field(default_factory=dict)

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


def _control(type_: int, flags: int, payload: bytes) -> bytes:
    if len(payload) > MAX_LENGTH:
        raise ValueError("frame too long")
    return struct.pack(">HHI", 0x8000 | VERSION, type_, (flags << 24) | len(payload)) + payload


def encode_data(stream_id: int, data: bytes, fin: bool = False) -> bytes:
    if len(data) > MAX_LENGTH:
        raise ValueError("frame too long")
    return struct.pack(">II", stream_id & 0x7FFFFFFF, ((FLAG_FIN if fin else 0) << 24) | len(data)) + data


def encode_syn_stream(codec: HeaderCodec, stream_id: int, headers: Headers, *, fin: bool = False,
                      associated: int = 0, priority: int = 0) -> bytes:
    payload = struct.pack(">IIBB", stream_id & 0x7FFFFFFF, associated & 0x7FFFFFFF, (priority & 7) << 5, 0)
    return _control(SYN_STREAM, FLAG_FIN if fin else 0, payload + codec.encode(headers))


def encode_syn_reply(codec: HeaderCodec, stream_id: int, headers: Headers, *, fin: bool = False) -> bytes:
    return _control(SYN_REPLY, FLAG_FIN if fin else 0, struct.pack(">I", stream_id & 0x7FFFFFFF)
                    + codec.encode(headers))


def encode_rst_stream(stream_id: int, status: int) -> bytes:
    return _control(RST_STREAM, 0, struct.pack(">II", stream_id & 0x7FFFFFFF, status))


def encode_settings(settings: Mapping[int, int]) -> bytes:
    body = struct.pack(">I", len(settings)) + b"".join(
        struct.pack(">II", key & 0xFFFFFF, value) for key, value in settings.items())
    return _control(SETTINGS, 0, body)


def encode_ping(ping_id: int) -> bytes:
    return _control(PING, 0, struct.pack(">I", ping_id))


def encode_goaway(last_good: int, status: int = 0) -> bytes:
    return _control(GOAWAY, 0, struct.pack(">II", last_good & 0x7FFFFFFF, status))


def encode_window_update(stream_id: int, delta: int) -> bytes:
    return _control(WINDOW_UPDATE, 0, struct.pack(">II", stream_id & 0x7FFFFFFF, delta & 0x7FFFFFFF))


async def _exactly(conn: ByteStream, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = await conn.read(n - len(buf))
        if not chunk:
            if buf:
                raise ProtocolError("connection closed inside a frame")
            return None
        buf += chunk
    return bytes(buf)


async def read_frame(conn: ByteStream, codec: HeaderCodec) -> Frame | None:
    """The next frame, or None at the end of the connection."""
    head = await _exactly(conn, 8)
    if head is None:
        return None
    first, second = struct.unpack(">II", head)
    flags, length = second >> 24, second & 0xFFFFFF
    payload = await _exactly(conn, length) if length else b""
    if payload is None:
        raise ProtocolError("connection closed inside a frame")
    if not first & 0x80000000:
        return Frame(DATA, flags, first & 0x7FFFFFFF, payload)
    version, type_ = (first >> 16) & 0x7FFF, first & 0xFFFF
    if version != VERSION:
        raise ProtocolError(f"SPDY version {version}, not {VERSION}")
    frame = Frame(type_, flags)

    def need(n: int) -> None:
        if len(payload) < n:
            raise ProtocolError(f"control frame {type_} too short")

    if type_ == SYN_STREAM:
        need(10)
        sid, assoc, pri, _ = struct.unpack_from(">IIBB", payload)
        frame.stream_id, frame.associated, frame.priority = sid & 0x7FFFFFFF, assoc & 0x7FFFFFFF, pri >> 5
        frame.headers = codec.decode(payload[10:])
    elif type_ in (SYN_REPLY, HEADERS):
        need(4)
        frame.stream_id = struct.unpack_from(">I", payload)[0] & 0x7FFFFFFF
        frame.headers = codec.decode(payload[4:])
    elif type_ in (RST_STREAM, GOAWAY):
        need(8)
        sid, frame.status = struct.unpack_from(">II", payload)
        frame.stream_id = sid & 0x7FFFFFFF
    elif type_ == WINDOW_UPDATE:
        need(8)
        sid, delta = struct.unpack_from(">II", payload)
        frame.stream_id, frame.delta = sid & 0x7FFFFFFF, delta & 0x7FFFFFFF
    elif type_ == SETTINGS:
        need(4)
        (count,) = struct.unpack_from(">I", payload)
        need(4 + 8 * count)
        for i in range(count):
            key, value = struct.unpack_from(">II", payload, 4 + 8 * i)
            frame.settings[key & 0xFFFFFF] = value
    elif type_ == PING:
        need(4)
        frame.stream_id = struct.unpack_from(">I", payload)[0]  # the ping's id
    else:
        frame.data = payload  # an unknown control frame: ignored, as SPDY asks
    return frame


class StreamReset(Exception):
    """The stream was reset (RST_STREAM) or its session ended."""


class Stream:
    """One SPDY stream: ``headers`` as its SYN_STREAM carried them (first value of each),
    read() until b"" (the peer's FIN), write(), close() (our FIN), reset()."""

    def __init__(self, session: Session, stream_id: int, headers: dict[str, list[str]], remote_fin: bool) -> None:
        self.session = session
        self.id = stream_id
        self.all_headers = headers
        self.headers = {k: v[0] if v else "" for k, v in headers.items()}
        self.remote_fin = remote_fin
        self.local_fin = False
        self.was_reset = False
        self.replied = asyncio.Event()
        self.reply_headers: dict[str, list[str]] = {}
        self._buffer = bytearray()
        self._readable = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._window = asyncio.Event()
        self.send_window = session.peer_initial_window
        self.unacked = 0  # bytes read here that no WINDOW_UPDATE has returned yet
        if remote_fin:
            self._readable.set()

    def __repr__(self) -> str:
        return f"<spdy stream {self.id} {self.headers}>"

    # -- from the session's reader ----------------------------------------------------------

    def _data(self, data: bytes, fin: bool) -> None:
        if data and not self.remote_fin:
            self._buffer += data
            if len(self._buffer) > BUFFER_LIMIT:
                self._drained.clear()
        if fin:
            self.remote_fin = True
        self._readable.set()

    def _reset(self) -> None:
        self.was_reset = True
        self.remote_fin = self.local_fin = True
        self._readable.set()
        self._drained.set()
        self._window.set()
        self.replied.set()

    def _more_window(self, delta: int) -> None:
        self.send_window += delta
        if self.send_window > 0:
            self._window.set()

    # -- for the application ---------------------------------------------------------------

    async def read(self, n: int = 64 * 1024) -> bytes:
        """Up to ``n`` bytes; b"" once the peer finished (or reset) the stream."""
        while not self._buffer:
            if self.remote_fin:
                return b""
            self._readable.clear()
            await self._readable.wait()
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        if len(self._buffer) <= BUFFER_LIMIT:
            self._drained.set()
        self.unacked += len(data)
        if self.unacked >= self.session.initial_window // 2 and not self.remote_fin:
            delta, self.unacked = self.unacked, 0
            await self.session._send(encode_window_update(self.id, delta))
        return data

    async def read_all(self, limit: int = 1024 * 1024) -> bytes:
        out = bytearray()
        while len(out) <= limit:
            chunk = await self.read()
            if not chunk:
                break
            out += chunk
        return bytes(out)

    async def write(self, data: bytes) -> None:
        """Sends ``data`` within the peer's window (once it keeps one); StreamReset when the
        stream can take no more."""
        view = memoryview(data)
        while view:
            if self.was_reset or self.local_fin:
                raise StreamReset(f"stream {self.id} is closed")
            if self.session.peer_flow_control and self.send_window <= 0:
                self._window.clear()
                await self._window.wait()
                continue
            size = min(len(view), CHUNK)
            if self.session.peer_flow_control:
                size = min(size, self.send_window)
            self.send_window -= size
            await self.session._send(encode_data(self.id, bytes(view[:size])))
            view = view[size:]

    async def close(self) -> None:
        """Our half of the stream is done (FIN)."""
        if self.local_fin or self.was_reset:
            return
        self.local_fin = True
        await self.session._send(encode_data(self.id, b"", fin=True))
        self.session._forget_if_done(self)

    async def reply(self, headers: Headers | None = None, fin: bool = False) -> None:
        """SYN_REPLY to a stream the peer opened (spdystream waits for it)."""
        if fin:
            self.local_fin = True
        await self.session._send_headers(
            lambda codec: encode_syn_reply(codec, self.id, headers or {}, fin=fin))

    async def reset(self, status: int = CANCEL) -> None:
        if self.was_reset:
            return
        self._reset()
        self.session._streams.pop(self.id, None)
        await self.session._send(encode_rst_stream(self.id, status))


class Session:
    """A SPDY/3.1 session over ``conn``. ``serve()`` reads frames until the connection ends;
    streams the peer opens come out of ``accept()``; ``open()`` starts one of ours."""

    def __init__(self, conn: ByteStream, *, client: bool, initial_window: int = DEFAULT_WINDOW) -> None:
        self.conn = conn
        self.client = client
        self.codec = HeaderCodec()
        self.initial_window = initial_window
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_flow_control = False
        self._next_id = 1 if client else 2
        self._next_ping = 1 if client else 2
        self._pings: dict[int, asyncio.Future[None]] = {}
        self._streams: dict[int, Stream] = {}
        self._incoming: asyncio.Queue[Stream | None] = asyncio.Queue()
        self._lock = asyncio.Lock()
        self._last_peer_stream = 0
        self.gone_away = False
        self.closed = asyncio.Event()

    async def _send(self, frame: bytes) -> None:
        async with self._lock:
            self._write(frame)
            await self.conn.drain()

    def _write(self, frame: bytes) -> None:
        if self.closed.is_set():
            raise StreamReset("the SPDY session is closed")
        self.conn.write(frame)

    async def _send_headers(self, build) -> None:
        # Compression order is frame order: encode under the same lock that writes.
        async with self._lock:
            self._write(build(self.codec))
            await self.conn.drain()

    def _forget_if_done(self, stream: Stream) -> None:
        if stream.local_fin and stream.remote_fin and not stream._buffer:
            self._streams.pop(stream.id, None)

    async def settings(self, initial_window: int | None = None) -> None:
        """Announces our stream window (SETTINGS INITIAL_WINDOW_SIZE)."""
        if initial_window is not None:
            self.initial_window = initial_window
        await self._send(encode_settings({SETTINGS_INITIAL_WINDOW_SIZE: self.initial_window}))

    async def open(self, headers: Headers, *, fin: bool = False, wait_reply: bool = True) -> Stream:
        async with self._lock:
            sid = self._next_id
            self._next_id += 2
            stream = Stream(self, sid, {}, remote_fin=False)
            stream.local_fin = fin
            self._streams[sid] = stream
            self._write(encode_syn_stream(self.codec, sid, headers, fin=fin))
            await self.conn.drain()
        if wait_reply:
            await stream.replied.wait()
            if stream.was_reset:
                raise StreamReset(f"stream {sid} was refused")
        return stream

    async def accept(self) -> Stream | None:
        """The next stream the peer opened; None once the session has ended."""
        if self.closed.is_set() and self._incoming.empty():
            return None
        stream = await self._incoming.get()
        if stream is None:
            self._incoming.put_nowait(None)
        return stream

    async def ping(self) -> None:
        """A PING answered by the peer."""
        pid = self._next_ping
        self._next_ping += 2
        fut = self._pings[pid] = asyncio.get_running_loop().create_future()
        await self._send(encode_ping(pid))
        await fut

    async def serve(self) -> None:
        try:
            while True:
                frame = await read_frame(self.conn, self.codec)
                if frame is None:
                    break
                await self._handle(frame)
        except (ProtocolError, ConnectionError) as exc:
            log.info("SPDY session ended: %s", exc)
        finally:
            self._end()

    def _end(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for stream in list(self._streams.values()):
            stream._reset()
        self._streams.clear()
        for fut in self._pings.values():
            if not fut.done():
                fut.cancel()
        self._incoming.put_nowait(None)

    async def _handle(self, frame: Frame) -> None:
        t = frame.type
        stream = self._streams.get(frame.stream_id) if t not in (PING, SETTINGS, GOAWAY) else None
        if t == DATA:
            if stream is None:
                return  # a stream already gone (spdystream drops these too)
            stream._data(frame.data, frame.fin)
            self._forget_if_done(stream)
            if not stream._drained.is_set():
                await stream._drained.wait()  # pace a peer that ignores windows: stop reading
        elif t == SYN_STREAM:
            sid = frame.stream_id
            if sid == 0 or sid in self._streams or (sid % 2 == 1) == self.client or sid <= self._last_peer_stream:
                await self._send(encode_rst_stream(sid or 1, PROTOCOL_ERROR))
                return
            self._last_peer_stream = sid
            if self.gone_away:
                await self._send(encode_rst_stream(sid, REFUSED_STREAM))
                return
            new = self._streams[sid] = Stream(self, sid, frame.headers, frame.fin)
            self._incoming.put_nowait(new)
        elif t == SYN_REPLY:
            if stream is not None:
                stream.reply_headers = frame.headers
                if frame.fin:
                    stream._data(b"", True)
                stream.replied.set()
        elif t == HEADERS:
            if stream is not None and frame.fin:
                stream._data(b"", True)
        elif t == RST_STREAM:
            if stream is not None:
                stream._reset()
                self._streams.pop(stream.id, None)
        elif t == WINDOW_UPDATE:
            self.peer_flow_control = True
            if stream is not None:
                stream._more_window(frame.delta)
        elif t == SETTINGS:
            window = frame.settings.get(SETTINGS_INITIAL_WINDOW_SIZE)
            if window is not None:
                self.peer_flow_control = True
                change, self.peer_initial_window = window - self.peer_initial_window, window
                for s in self._streams.values():
                    s._more_window(change)
        elif t == PING:
            pid = frame.stream_id
            if (pid % 2 == 1) == self.client:
                fut = self._pings.pop(pid, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            else:
                await self._send(encode_ping(pid))
        elif t == GOAWAY:
            self.gone_away = True

    async def close(self) -> None:
        """GOAWAY, then the connection closes; every stream ends."""
        if not self.closed.is_set():
            with contextlib.suppress(Exception):
                await self._send(encode_goaway(self._last_peer_stream))
        self._end()
        with contextlib.suppress(Exception):
            self.conn.close()
