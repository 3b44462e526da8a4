"""Commands run inside a running container: exec() and exec_stream() (kubectl exec), with
the terminal of the container's own /dev/pts."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import struct
import termios
from dataclasses import dataclass

from gpufleet.agent.runtime._common import exit_code, within
from gpufleet.agent.runtime.base import (
    ContainerHandle,
    RuntimeError_,
)
from gpufleet.agent.runtime.process_host import _JOIN_CGROUPS, _KILL_SETTLE_S, _descendants, _resolve
from gpufleet.agent.runtime.process_records import _Ctr
from gpufleet.agent.runtime.sandbox import (
    user_chain,
)

log = logging.getLogger(__name__)

class ExecMixin:
    """ProcessRuntime's exec (see process.py)."""

    def _exec_argv(self, rec: _Ctr, command: list[str], *, tty: bool = False) -> list[str] | str:
        """The command line that runs ``command`` in the container, or why it cannot."""
        if not command:
            return "no command"
        cwd = rec.info.get("cwd") or "/"
        # The container's own view of its files, volumes included, through its root.
        prefix = f"/proc/{rec.main.pid}/root" if rec.sandboxed else ""

        def node_path(p: str) -> str | None:
            return prefix + p

        exe = _resolve(command[0], rec.env.get("PATH", os.defpath), cwd, node_path)
        if exe is None:
            return f'executable file "{command[0]}" not found'
        chain = user_chain(rec.ident, setpriv=self._setpriv, unshare=self._unshare, for_exec=True)
        inner = [*chain, exe, *command[1:]]
        if tty:
            # A session of its own with the terminal as its controlling one (--wait: setsid
            # forks when it leads a group already, and the exit status must be the command's).
            inner = [shutil.which("setsid") or "/usr/bin/setsid", "--ctty", "--wait", *inner]
        if rec.sandboxed:
            ns = ["--mount", "--pid", "--uts", "--ipc"]
            if rec.ident.mode == "userns":
                ns.append("--user")
            program = [self._nsenter, f"--target={rec.main.pid}", *ns, f"--wdns={cwd}", "--", *inner]
        else:
            program = inner
        if rec.cgroup is not None:
            program = ["/bin/sh", "-c", _JOIN_CGROUPS, "gpufleet-exec", *rec.cgroup.procs_files, "--", *program]
        return program

    async def exec(
        self,
        handle: ContainerHandle,
        command: list[str],
        timeout: float,  # noqa: ASYNC109 - the signature is base.Runtime's
    ) -> tuple[int, str]:
        """The command inside the container: its namespaces, user, working directory,
        environment and cgroup. A timeout kills it and answers -1."""
        rec = self._containers.get(handle.id)
        if rec is None or rec.done.is_set() or not rec.main.alive():
            return -1, "container is not running"
        program = self._exec_argv(rec, command)
        if isinstance(program, str):
            return (127 if "not found" in program else -1), program
        try:
            p = await asyncio.create_subprocess_exec(
                *program, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env=rec.env, cwd="/" if rec.sandboxed else rec.info.get("cwd"),
                start_new_session=True,
            )
        except OSError as e:
            return 126, f"cannot run {command[0]}: {e.strerror or e}"
        out = asyncio.ensure_future(p.communicate())
        if not await within(out, self.clock, timeout):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            for pid in _descendants(p.pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(out, _KILL_SETTLE_S)
            return -1, f"command timed out after {timeout:g}s"
        stdout, _ = out.result()
        assert p.returncode is not None
        return exit_code(p.returncode), stdout.decode(errors="replace")

    async def exec_stream(self, handle: ContainerHandle, command: list[str], tty: bool = False) -> ExecStream:
        """An interactive process in the container (kubectl exec): its stdin, stdout and
        stderr as streams, or with tty one terminal for all three."""
        rec = self._containers.get(handle.id)
        if rec is None or rec.done.is_set() or not rec.main.alive():
            raise RuntimeError_("container is not running")
        program = self._exec_argv(rec, command, tty=tty)
        if isinstance(program, str):
            raise RuntimeError_(program)
        cwd = "/" if rec.sandboxed else rec.info.get("cwd")
        if not tty:
            p = await asyncio.create_subprocess_exec(
                *program, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=rec.env, cwd=cwd, start_new_session=True,
            )
            assert p.stdin is not None and p.stdout is not None
            return ExecStream(p, p.stdin, p.stdout, p.stderr, None)
        master, slave = _open_pty(rec)
        try:
            p = await asyncio.create_subprocess_exec(
                *program, stdin=slave, stdout=slave, stderr=slave, env={**rec.env, "TERM": rec.env.get("TERM", "xterm")},
                cwd=cwd, start_new_session=True,
            )
        finally:
            os.close(slave)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(master, "rb", 0))
        wfd = os.dup(master)
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.streams.FlowControlMixin(), os.fdopen(wfd, "wb", 0)
        )
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        return ExecStream(p, writer, reader, None, wfd)



@dataclass
class ExecStream:
    """An interactive process in a container. ``stdin``/``stdout`` (and ``stderr``
    without a tty) are its streams; with a tty they are one terminal and ``resize``
    sets its size."""

    process: asyncio.subprocess.Process
    stdin: asyncio.StreamWriter
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader | None
    pty: int | None

    def resize(self, rows: int, cols: int) -> None:
        if self.pty is not None:
            fcntl.ioctl(self.pty, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    async def wait(self) -> int:
        return exit_code(await self.process.wait())

    def close(self) -> None:
        """Closes our end of its input (the terminal's output side closes at its end)."""
        with contextlib.suppress(Exception):
            self.stdin.close()


# --- small helpers ------------------------------------------------------------------------


_TIOCSPTLCK = 0x40045431
_TIOCGPTPEER = 0x5441


def _open_pty(rec: _Ctr) -> tuple[int, int]:
    """A terminal (master, slave) for an exec. In a sandbox it is one of the container's own
    /dev/pts (opened through its root), so the program finds its name there; the slave
    belongs to the container's user, as a login's terminal does."""
    if not rec.sandboxed or rec.main.pid is None:
        return os.openpty()
    try:
        master = os.open(f"/proc/{rec.main.pid}/root/dev/ptmx", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return os.openpty()
    try:
        fcntl.ioctl(master, _TIOCSPTLCK, struct.pack("i", 0))
        slave = fcntl.ioctl(master, _TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY)
    except OSError:
        os.close(master)
        return os.openpty()
    ident = rec.ident
    if os.geteuid() == 0 and ident.mode != "agent":
        uid = ident.outer_uid if ident.mode == "userns" else ident.uid
        with contextlib.suppress(OSError):
            os.fchown(slave, uid, -1)
    return master, slave
