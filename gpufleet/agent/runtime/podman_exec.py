"""Interactive processes in podman containers (kubectl exec and attach): ``podman exec -i``
and ``podman attach``, under a terminal of their own when the stream has a tty, so a
terminal size set on it reaches the container (podman passes SIGWINCH on)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil

from gpufleet.agent.runtime.process_exec import ExecStream


async def spawn_stream(argv: list[str], *, tty: bool) -> ExecStream:
    """``argv`` with pipes for stdin, stdout and stderr, or with one terminal for the three
    (its own session, the terminal its controlling one)."""
    if not tty:
        p = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        assert p.stdin is not None and p.stdout is not None
        return ExecStream(p, p.stdin, p.stdout, p.stderr, None)
    master, slave = os.openpty()
    setsid = shutil.which("setsid") or "/usr/bin/setsid"
    try:
        p = await asyncio.create_subprocess_exec(setsid, "--ctty", "--wait", *argv, stdin=slave, stdout=slave,
                                                 stderr=slave, start_new_session=True)
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(master, "rb", 0))
    wfd = os.dup(master)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(wfd, "wb", 0))
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return ExecStream(p, writer, reader, None, wfd)


class PodmanStreamsMixin:
    """PodmanRuntime's exec_stream and attach_stream."""

    podman: str

    async def exec_stream(self, handle, command: list[str], tty: bool = False) -> ExecStream:  # noqa: ANN001
        flags = ["-i", "-t"] if tty else ["-i"]
        return await spawn_stream([self.podman, "exec", *flags, handle.id, *command], tty=tty)

    async def attach_stream(self, handle, tty: bool = False, stdin: bool = False) -> ExecStream:  # noqa: ANN001
        args = [self.podman, "attach", "--sig-proxy=false"]
        if not stdin:
            args.append("--no-stdin")
        stream = await spawn_stream([*args, handle.id], tty=tty)
        if not stdin:
            with contextlib.suppress(Exception):
                stream.stdin.close()
        return stream
