"""Container logs in the Kubernetes CRI format, one line per output line:

    2024-05-01T12:00:00.123456789Z stdout F message

"F" marks a full line, "P" a piece of a line longer than MAX_LINE (the next pieces follow,
the last one marked F). This is what the kubelet writes under /var/log/pods and what
podman's k8s-file driver writes, so every runtime's log reads back the same way, with
each line's time and stream kept without a side file.

The writer is plain blocking code with an async pump on top: the per-container monitor
(monitor.py) feeds it from a select loop, and importing this module must stay cheap for it
(no asyncio at import time).
"""

from __future__ import annotations

import os
import time

# Not typing.TYPE_CHECKING: importing typing alone costs the monitor milliseconds.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable
    from typing import BinaryIO

MAX_LINE = 16 * 1024

_CRI_PATTERN = rb"^(\S+) (stdout|stderr) ([FP]) ?(.*)$"


def cri_timestamp(ts: float) -> str:
    """RFC 3339 with nanoseconds, in UTC."""
    whole = int(ts)
    nanos = int(round((ts - whole) * 1e9))
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{nanos:09d}Z"


def cri_line(ts: float, stream: str, text: bytes, partial: bool = False) -> bytes:
    return b"%s %s %s %s\n" % (cri_timestamp(ts).encode(), stream.encode(), b"P" if partial else b"F", text)


def append_line(path: str | os.PathLike[str], ts: float, stream: str, text: str) -> None:
    """One whole line, appended (used for the runtime's own notes, e.g. the simulated one)."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    with open(path, "ab") as f:
        f.write(cri_line(ts, stream, text.encode()))


def read_cri_messages(path: str | os.PathLike[str], with_streams: bool = False) -> list:
    """The program's own lines from a CRI log (timestamps and tags stripped, P pieces
    joined); lines that are not CRI-formatted are passed through as they are. With
    with_streams, (stream, text) pairs."""
    import re

    cri = re.compile(_CRI_PATTERN, re.DOTALL)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    out: list = []
    pending: dict[bytes, bytes] = {}
    for raw in data.split(b"\n"):
        if not raw:
            continue
        m = cri.match(raw)
        if not m:
            out.append(
                ("stdout", raw.decode(errors="replace")) if with_streams else raw.decode(errors="replace")
            )
            continue
        stream, tag, text = m.group(2), m.group(3), m.group(4)
        if tag == b"P":
            pending[stream] = pending.get(stream, b"") + text
            continue
        text = pending.pop(stream, b"") + text
        msg = text.decode(errors="replace")
        out.append((stream.decode(), msg) if with_streams else msg)
    return out


class CRILogWriter:
    """Writes a container's stdout and stderr into one CRI log file.

    ``feed`` takes whatever a read returned; each complete line is written with one
    write() on a file opened for appending, so the two streams interleave by whole lines,
    and a later attempt may append to the same file. ``finish`` ends a stream (its last
    bytes without a newline are still a whole line); the file closes with the last one."""

    def __init__(self, path: str | os.PathLike[str], now: Callable[[], float], streams: int = 2) -> None:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        self._f: BinaryIO | None = open(path, "ab", buffering=0)  # noqa: SIM115
        self._now = now
        self._open = streams
        self._bufs: dict[str, bytes] = {}

    def _write(self, data: bytes) -> None:
        if self._f is not None:
            try:
                self._f.write(data)
            except OSError:
                pass  # A full disk must not take the container down with it.

    def feed(self, stream: str, chunk: bytes) -> None:
        buf = self._bufs.get(stream, b"") + chunk
        now = self._now()
        lines = buf.split(b"\n")
        buf = lines.pop()
        out = []
        for ln in lines:
            while len(ln) > MAX_LINE:
                out.append(cri_line(now, stream, ln[:MAX_LINE], partial=True))
                ln = ln[MAX_LINE:]
            out.append(cri_line(now, stream, ln))
        while len(buf) > MAX_LINE:
            out.append(cri_line(now, stream, buf[:MAX_LINE], partial=True))
            buf = buf[MAX_LINE:]
        self._bufs[stream] = buf
        if out:
            self._write(b"".join(out))

    def finish(self, stream: str) -> None:
        buf = self._bufs.pop(stream, b"")
        if buf:
            # Output that ended without a newline is still a whole line.
            self._write(cri_line(self._now(), stream, buf))
        self._open -= 1
        if self._open == 0:
            self.close()

    async def pump(self, reader: asyncio.StreamReader, stream: str) -> None:
        try:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                self.feed(stream, chunk)
        finally:
            self.finish(stream)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
