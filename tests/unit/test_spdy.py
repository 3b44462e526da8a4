"""SPDY/3.1 (gpufleet/utils/spdy.py): frames round-trip, header blocks decode with SPDY/3's
zlib dictionary (a frame kubectl 1.27 sent is read), and flow control holds a sender to the
peer's window once the peer keeps one, and only then."""

from __future__ import annotations

import asyncio
import zlib

import pytest

from gpufleet.utils import spdy

# The first frame kubectl 1.27 sends after `101 Switching Protocols` for `kubectl exec p -- true`:
# SYN_STREAM 1 for the error stream, its header block compressed with the dictionary.
KUBECTL_SYN_STREAM = bytes.fromhex(
    "80030001000000290000000100000000000078f9e3c6a7c26260606004a7b392a2d4c45c6851c29a0a0a6800000000ffff")


class Pipe:
    """One direction of an in-memory connection, as a ByteStream."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.event = asyncio.Event()
        self.closed = False
        self.written = 0

    async def read(self, n: int = 65536) -> bytes:
        while not self.buffer and not self.closed:
            self.event.clear()
            await self.event.wait()
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    def write(self, data: bytes) -> None:
        self.buffer += data
        self.written += len(data)
        self.event.set()

    async def drain(self) -> None:
        await asyncio.sleep(0)

    def close(self) -> None:
        self.closed = True
        self.event.set()


class End:
    """One end of a connection: reads one pipe, writes the other."""

    def __init__(self, inbound: Pipe, outbound: Pipe) -> None:
        self.inbound, self.outbound = inbound, outbound

    async def read(self, n: int = 65536) -> bytes:
        return await self.inbound.read(n)

    def write(self, data: bytes) -> None:
        self.outbound.write(data)

    async def drain(self) -> None:
        await asyncio.sleep(0)

    def close(self) -> None:
        self.outbound.close()
        self.inbound.close()


def connected() -> tuple[End, End]:
    a, b = Pipe(), Pipe()
    return End(a, b), End(b, a)


async def test_the_dictionary_is_spdy3s():
    assert len(spdy.DICTIONARY) == 1423
    assert zlib.adler32(spdy.DICTIONARY) == 0xE3C6A7C2  # the id zlib streams of SPDY/3 name
    assert spdy.DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert spdy.DICTIONARY.endswith(b"charset=iso-8859-1,utf-,*,enq=0.")


async def test_a_frame_kubectl_sent_decodes():
    pipe = Pipe()
    pipe.write(KUBECTL_SYN_STREAM)
    pipe.close()
    frame = await spdy.read_frame(pipe, spdy.HeaderCodec())
    assert frame is not None and frame.type == spdy.SYN_STREAM
    assert frame.stream_id == 1 and not frame.fin
    assert frame.headers == {"streamtype": ["error"]}


async def test_frames_round_trip():
    sender, receiver = spdy.HeaderCodec(), spdy.HeaderCodec()
    pipe = Pipe()
    headers = {"streamType": "data", "port": "8080", "multi": ["a", "b"]}
    pipe.write(spdy.encode_syn_stream(sender, 3, headers, fin=True, priority=2))
    pipe.write(spdy.encode_syn_reply(sender, 3, {"x": "1"}))
    pipe.write(spdy.encode_data(3, b"payload", fin=True))
    pipe.write(spdy.encode_rst_stream(3, spdy.CANCEL))
    pipe.write(spdy.encode_settings({spdy.SETTINGS_INITIAL_WINDOW_SIZE: 1234}))
    pipe.write(spdy.encode_ping(7))
    pipe.write(spdy.encode_window_update(3, 4096))
    pipe.write(spdy.encode_goaway(3))
    pipe.close()
    frames = []
    while (f := await spdy.read_frame(pipe, receiver)) is not None:
        frames.append(f)
    syn, reply, data, rst, settings, ping, window, goaway = frames
    assert (syn.type, syn.stream_id, syn.fin, syn.priority) == (spdy.SYN_STREAM, 3, True, 2)
    assert syn.headers == {"streamtype": ["data"], "port": ["8080"], "multi": ["a", "b"]}
    # The second block is compressed in the same zlib stream: it decodes only after the first.
    assert (reply.type, reply.headers) == (spdy.SYN_REPLY, {"x": ["1"]})
    assert (data.type, data.stream_id, data.data, data.fin) == (spdy.DATA, 3, b"payload", True)
    assert (rst.type, rst.stream_id, rst.status) == (spdy.RST_STREAM, 3, spdy.CANCEL)
    assert settings.settings == {spdy.SETTINGS_INITIAL_WINDOW_SIZE: 1234}
    assert (ping.type, ping.stream_id) == (spdy.PING, 7)
    assert (window.type, window.stream_id, window.delta) == (spdy.WINDOW_UPDATE, 3, 4096)
    assert (goaway.type, goaway.stream_id) == (spdy.GOAWAY, 3)


async def test_a_broken_header_block_ends_the_session_not_the_server():
    pipe = Pipe()
    pipe.write(spdy._control(spdy.SYN_STREAM, 0, b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00not zlib"))
    pipe.close()
    with pytest.raises(spdy.ProtocolError):
        await spdy.read_frame(pipe, spdy.HeaderCodec())
    server = spdy.Session(pipe, client=False)
    await server.serve()  # ends quietly
    assert server.closed.is_set() and await server.accept() is None


async def _pair(**server_kwargs) -> tuple[spdy.Session, spdy.Session, list[asyncio.Task]]:
    a, b = connected()
    client, server = spdy.Session(a, client=True), spdy.Session(b, client=False, **server_kwargs)
    tasks = [asyncio.ensure_future(client.serve()), asyncio.ensure_future(server.serve())]
    return client, server, tasks


async def test_streams_carry_data_both_ways_with_half_close():
    client, server, tasks = await _pair()

    async def serve() -> None:
        s = await server.accept()
        assert s is not None and s.headers["streamtype"] == "stdin"
        await s.reply()
        got = await s.read_all()
        await s.write(got.upper())
        await s.close()

    handler = asyncio.ensure_future(serve())
    stream = await client.open({"streamType": "stdin"})
    await stream.write(b"hello " * 20000)  # many frames
    await stream.close()
    assert await stream.read_all() == b"HELLO " * 20000
    await handler
    await client.ping()
    await client.close()
    await asyncio.gather(*tasks)
    assert server.closed.is_set()


async def test_flow_control_holds_to_the_peers_window_once_it_keeps_one():
    client, server, tasks = await _pair()
    accepted: list[spdy.Stream] = []

    async def accept() -> None:
        s = await server.accept()
        assert s is not None
        await s.reply()
        accepted.append(s)

    acceptor = asyncio.ensure_future(accept())
    # A peer that keeps windows says so (SETTINGS): 10 KiB a stream.
    await server.settings(initial_window=10 * 1024)
    stream = await client.open({"streamType": "data"})
    await acceptor
    sending = asyncio.ensure_future(stream.write(b"x" * 50 * 1024))
    await asyncio.sleep(0.05)
    assert not sending.done()  # held at the window
    assert stream.send_window <= 0 and len(accepted[0]._buffer) == 10 * 1024
    # Reading gives the window back (WINDOW_UPDATE for each half window read).
    got = b""
    while len(got) < 50 * 1024:
        got += await accepted[0].read()
    await asyncio.wait_for(sending, 2)
    assert got == b"x" * 50 * 1024
    await client.close()
    await asyncio.gather(*tasks)


async def test_a_peer_that_keeps_no_window_is_not_waited_for():
    # moby/spdystream (kubectl) never sends WINDOW_UPDATE: past 64 KiB a sender must not stall.
    client, server, tasks = await _pair()

    async def accept() -> spdy.Stream:
        s = await server.accept()
        assert s is not None
        await s.reply()
        return s

    acceptor = asyncio.ensure_future(accept())
    stream = await client.open({"streamType": "stdout"})
    peer = await acceptor
    client_window_updates_seen = server.peer_flow_control
    await asyncio.wait_for(peer.write(b"y" * 300 * 1024), 2)  # the client never read: no update came
    assert not client_window_updates_seen and not server.peer_flow_control
    assert len(stream._buffer) == 300 * 1024
    await client.close()
    await asyncio.gather(*tasks)


async def test_a_reset_stream_ends_its_reads_and_writes():
    client, server, tasks = await _pair()
    acceptor = asyncio.ensure_future(server.accept())
    stream = await client.open({"streamType": "data"}, wait_reply=False)
    peer = await acceptor
    assert peer is not None
    await peer.reset()
    await asyncio.wait_for(stream.replied.wait(), 2)
    assert stream.was_reset and await stream.read() == b""
    with pytest.raises(spdy.StreamReset):
        await stream.write(b"late")
    await client.close()
    await asyncio.gather(*tasks)
