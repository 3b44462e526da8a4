"""Container log files: where each attempt's output lives, and reading it the way
`kubectl logs` asks (tail, since, timestamps, follow).

Layout, as the kubelet's /var/log/pods: ``<state>/pods/<ns>_<pod>_<uid>/<container>/<attempt>.log``.
A runtime may write plain output or CRI lines (``<RFC3339Nano> stdout F <text>``); both read
back as the program's own lines.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.utils.clock import parse_rfc3339

_CRI = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) (stdout|stderr) ([FP]) ?(.*)$")
_FOLLOW_POLL = 0.1


def pod_log_dir(state_dir: Path, namespace: str, name: str, uid: str) -> Path:
    return state_dir / "pods" / f"{namespace}_{name}_{uid}"


def container_log_path(state_dir: Path, namespace: str, name: str, uid: str, container: str, attempt: int) -> Path:
    return pod_log_dir(state_dir, namespace, name, uid) / container / f"{attempt}.log"


def attempts(directory: Path) -> list[int]:
    """The attempts with a log file in a container's directory, oldest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    for n in names:
        stem, dot, ext = n.partition(".")
        if dot and ext == "log" and stem.isdigit():
            out.append(int(stem))
    return sorted(out)


@dataclass
class LogLine:
    text: bytes  # without the newline
    time: float | None
    complete: bool = True


def _parse(raw: bytes, fallback_time: float | None) -> LogLine:
    m = _CRI.match(raw)
    if m:
        try:
            ts = _parse_nano(m.group(1).decode())
        except ValueError:
            ts = fallback_time
        return LogLine(m.group(4), ts, m.group(3) == b"F")
    return LogLine(raw, fallback_time)


def _parse_nano(text: str) -> float:
    # Python's fromisoformat takes at most microseconds.
    m = re.match(r"^(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", text)
    if not m:
        raise ValueError(text)
    frac = float(m.group(2) or 0)
    return parse_rfc3339(m.group(1) + m.group(3)) + frac


def format_timestamp(ts: float) -> str:
    from datetime import UTC, datetime

    dt = datetime.fromtimestamp(ts, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(round((ts % 1) * 1e9)) % 1_000_000_000:09d}Z"


@dataclass
class LogOptions:
    tail_lines: int | None = None
    since_time: float | None = None  # seconds since the epoch
    timestamps: bool = False
    limit_bytes: int | None = None


def _render(lines: list[LogLine], opts: LogOptions) -> bytes:
    out = []
    pending = b""
    for line in lines:
        if not line.complete:
            pending += line.text
            continue
        text = pending + line.text
        pending = b""
        if opts.timestamps:
            out.append(format_timestamp(line.time or 0).encode() + b" " + text + b"\n")
        else:
            out.append(text + b"\n")
    return b"".join(out)


def _split(data: bytes, fallback_time: float | None) -> tuple[list[LogLine], bytes]:
    """Complete lines, and the unterminated rest to carry over."""
    parts = data.split(b"\n")
    rest = parts.pop()
    return [_parse(p, fallback_time) for p in parts], rest


def read_log(path: Path, opts: LogOptions) -> bytes:
    """The whole (tail of the) file, rendered."""
    try:
        data = path.read_bytes()
        mtime = path.stat().st_mtime
    except OSError:
        return b""
    lines, rest = _split(data, mtime)
    if rest:
        lines.append(_parse(rest, mtime))
    return _render(_select(lines, opts), opts)


def _select(lines: list[LogLine], opts: LogOptions) -> list[LogLine]:
    if opts.since_time is not None:
        lines = [ln for ln in lines if ln.time is None or ln.time >= opts.since_time]
    if opts.tail_lines is not None:
        # Count whole lines: a CRI partial line belongs to the complete one after it.
        ends = [i for i, ln in enumerate(lines) if ln.complete]
        if opts.tail_lines <= 0:
            return []
        if len(ends) > opts.tail_lines:
            start = ends[-opts.tail_lines - 1] + 1
            lines = lines[start:]
    return lines


def _read_from(path: Path, offset: int) -> tuple[bytes, float | None]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(), os.fstat(f.fileno()).st_mtime
    except OSError:
        return b"", None


async def follow_log(path: Path, opts: LogOptions, running: Callable[[], bool]) -> AsyncIterator[bytes]:
    """The tail of the file, then what is appended to it, until ``running()`` turns false and
    the rest has been read."""
    data, mtime = _read_from(path, 0)
    offset = len(data)
    lines, rest = _split(data, mtime)
    first = _render(_select(lines, opts), opts)
    if first:
        yield first
    while True:
        alive = running()
        more, _ = _read_from(path, offset)
        offset += len(more)
        if more:
            new_lines, rest = _split(rest + more, None)
            for ln in new_lines:
                if ln.time is None:
                    ln.time = _now()
            chunk = _render(new_lines, LogOptions(timestamps=opts.timestamps))
            if chunk:
                yield chunk
        if not alive:
            if rest:
                yield _render([_parse(rest, _now())], LogOptions(timestamps=opts.timestamps))
            return
        await asyncio.sleep(_FOLLOW_POLL)


def _now() -> float:
    import time

    return time.time()
