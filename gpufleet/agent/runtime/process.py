"""Containers as host processes: no image, no namespaces, the host's network.

A container's command (with its args) runs in its own session, so the whole tree it
starts is one process group that stop() can signal at once, and under its own cgroup
where the machine lets us write one (cpu and memory limits, OOM detection, and a list of
every process it started, even those that left the group). stdout and stderr are written
to the container's log in the CRI format (see crilog.py).

Host processes do not outlive this runtime: their output pipes and exit codes belong to
it, so close() stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gpufleet.agent.runtime._common import exit_code, safe_name, signal_name, terminated_reason, within
from gpufleet.agent.runtime.base import (
    ContainerHandle,
    ContainerSpec,
    ContainerState,
    ContainerStats,
    HostSandboxMixin,
    RuntimeError_,
)
from gpufleet.agent.runtime.cgroups import Cgroup, Cgroups
from gpufleet.agent.runtime.crilog import CRILogWriter
from gpufleet.agent.runtime.gpuenv import gpu_env
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

_INHERITED_ENV = ("PATH", "HOME")
# Joins the cgroups before exec'ing the program, so not one allocation happens outside
# them. Arguments: the cgroup.procs files, "--", the program and its arguments.
_JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"'
# After SIGKILL the kernel needs a moment to reap; this bounds how long we wait for it.
_KILL_SETTLE_S = 10.0
_CLOSE_GRACE_S = 2.0


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Tells when the process itself exits. asyncio's Process.wait() (before 3.12) also
    waits for its output pipes to close, which a background child holding them open can
    delay forever."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


async def _spawn(program: list[str], **kw) -> tuple[asyncio.subprocess.Process, _ExitProtocol]:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _ExitProtocol(2**16, loop),
        *program,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=kw.pop("stderr", asyncio.subprocess.PIPE),
        start_new_session=True,
        **kw,
    )
    return asyncio.subprocess.Process(transport, protocol, loop), protocol


@dataclass(eq=False)
class _Proc:
    handle: ContainerHandle
    spec: ContainerSpec
    env: dict[str, str]
    cwd: str
    proc: asyncio.subprocess.Process
    exited: asyncio.Future[None]
    cgroup: Cgroup | None
    oom_base: int
    started_at: float
    started_mono: float
    done: asyncio.Event = field(default_factory=asyncio.Event)
    final: ContainerState | None = None
    waiter: asyncio.Task[None] | None = None
    pumps: list[asyncio.Task[None]] = field(default_factory=list)
    last_cpu: tuple[float, float] | None = None  # (cpu seconds, monotonic time)

    @property
    def pgid(self) -> int:
        return self.proc.pid


class ProcessRuntime(HostSandboxMixin):
    name = "process"
    capabilities: frozenset[str] = frozenset()

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        clock: Clock = REAL_CLOCK,
        *,
        cgroup_root: str | os.PathLike[str] | None = "/sys/fs/cgroup",
    ) -> None:
        self.state_dir = Path(state_dir)
        self.clock = clock
        self._procs: dict[str, _Proc] = {}
        self._seq = 0
        if cgroup_root is None:
            self.cgroups: Cgroups | None = None
            self.limits_unsupported_reason = "cgroups are disabled"
        else:
            self.cgroups = Cgroups(cgroup_root)
            self.limits_unsupported_reason = self.cgroups.reason
        missing = {"cpu", "memory"} - self.limits_supported
        if missing:
            log.warning(
                "process runtime: %s limits will not be enforced: %s",
                " and ".join(sorted(missing)),
                self.limits_unsupported_reason,
            )

    @property
    def limits_supported(self) -> frozenset[str]:
        """The limits this runtime enforces: {"cpu", "memory"}, a part of it, or nothing."""
        return self.cgroups.supported if self.cgroups is not None else frozenset()

    # --- start ------------------------------------------------------------------------

    def _sandbox(self, spec: ContainerSpec) -> Path:
        return self.state_dir / "containers" / safe_name(spec.pod_uid) / safe_name(spec.name)

    def _log_path(self, spec: ContainerSpec) -> str:
        if spec.log_path:
            return spec.log_path
        return str(
            self.state_dir / "logs" / safe_name(spec.pod_uid) / safe_name(spec.name) / f"{spec.attempt}.log"
        )

    @staticmethod
    def _resolve(exe: str, env: dict[str, str], cwd: str) -> str | None:
        if "/" in exe:
            path = exe if os.path.isabs(exe) else os.path.join(cwd, exe)
            return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
        return shutil.which(exe, path=env.get("PATH", os.defpath))

    async def start(self, spec: ContainerSpec) -> ContainerHandle:
        # Kubernetes: command replaces the image's entrypoint; args alone run as given,
        # since a host process has no entrypoint to pass them to.
        argv = [*spec.command, *spec.args] if spec.command else list(spec.args)
        if not argv:
            raise RuntimeError_("the process runtime needs a command", "CreateContainerError")

        sandbox = self._sandbox(spec)
        cwd = spec.working_dir or str(sandbox)
        if not os.path.isabs(cwd):
            cwd = str(sandbox / cwd)
        try:
            os.makedirs(cwd, exist_ok=True)
        except OSError as e:
            raise RuntimeError_(
                f"cannot create the working directory {cwd}: {e.strerror or e}", "CreateContainerError"
            ) from e

        env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
        env.update(spec.env)
        # The GPUs the agent assigned are the only ones the process may see, whatever the
        # pod's own env says.
        env.update(gpu_env(spec.gpus))

        exe = self._resolve(argv[0], env, cwd)
        if exe is None:
            raise RuntimeError_(
                f'executable file "{argv[0]}" not found (PATH={env.get("PATH", "")})', "RunContainerError"
            )

        cgroup = self._cgroup_for(spec)
        program = [exe, *argv[1:]]
        if cgroup is not None:
            program = ["/bin/sh", "-c", _JOIN_CGROUPS, "gpufleet-start", *cgroup.procs_files, "--", *program]

        writer: CRILogWriter | None = None
        try:
            writer = CRILogWriter(self._log_path(spec), self.clock.now)
            proc, protocol = await _spawn(program, cwd=cwd, env=env)
        except OSError as e:
            if writer is not None:
                writer.close()
            if cgroup is not None:
                cgroup.remove()
            raise RuntimeError_(f"cannot start {argv[0]}: {e.strerror or e}", "RunContainerError") from e

        self._seq += 1
        handle = ContainerHandle(
            id=f"{safe_name(spec.pod_uid)}/{safe_name(spec.name)}/{spec.attempt}/{self._seq}", pid=proc.pid
        )
        rec = _Proc(
            handle=handle,
            spec=spec,
            env=env,
            cwd=cwd,
            proc=proc,
            exited=protocol.exited,
            cgroup=cgroup,
            oom_base=cgroup.oom_kills() if cgroup is not None else 0,
            started_at=self.clock.now(),
            started_mono=self.clock.monotonic(),
        )
        assert proc.stdout is not None and proc.stderr is not None
        rec.pumps = [
            asyncio.create_task(writer.pump(proc.stdout, "stdout")),
            asyncio.create_task(writer.pump(proc.stderr, "stderr")),
        ]
        rec.waiter = asyncio.create_task(self._wait_exit(rec))
        self._procs[handle.id] = rec
        return handle

    def _cgroup_for(self, spec: ContainerSpec) -> Cgroup | None:
        if self.cgroups is None or not self.cgroups.supported:
            return None
        try:
            cg = self.cgroups.create([spec.pod_uid, spec.name, str(spec.attempt)])
            if cg is not None:
                cg.set_limits(spec.cpu_limit_millis, spec.memory_limit_bytes)
            return cg
        except OSError as e:
            # Running without the limits the pod asked for would hide the problem until a
            # neighbour suffers; fail the start and let the agent retry and report it.
            raise RuntimeError_(
                f"cannot set up the container's cgroup: {e.strerror or e}", "CreateContainerError"
            ) from e

    async def _wait_exit(self, rec: _Proc) -> None:
        await rec.exited
        rc = rec.proc.returncode
        assert rc is not None
        finished = self.clock.now()
        code = exit_code(rc)
        oom = rec.cgroup is not None and rec.cgroup.oom_kills() > rec.oom_base
        # The container ends with its main process: nothing it started may outlive it
        # (and hold on to GPU memory), as when a container's PID namespace goes away.
        self._kill_all(rec)
        reason = terminated_reason(code, oom)
        if reason == "OOMKilled":
            message = f"the container exceeded its memory limit ({rec.spec.memory_limit_bytes} bytes)"
        elif signal_name(code):
            message = f"killed by {signal_name(code)}"
        else:
            message = ""
        rec.final = ContainerState(
            state="exited",
            exit_code=code,
            started_at=rec.started_at,
            finished_at=finished,
            reason=reason,
            message=message,
        )
        rec.done.set()

    def _signal(self, rec: _Proc, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(rec.pgid, sig)
        # The main process may have left its group. Not Process.send_signal: it polls
        # (waitpid) first and can reap the child under the child watcher, which then
        # reports exit code 255 instead of the real one.
        if not rec.exited.done():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(rec.proc.pid, sig)

    def _kill_all(self, rec: _Proc) -> None:
        self._signal(rec, signal.SIGKILL)
        if rec.cgroup is not None:
            for pid in rec.cgroup.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    # --- observe ------------------------------------------------------------------------

    async def state(self, handle: ContainerHandle) -> ContainerState:
        rec = self._procs.get(handle.id)
        if rec is None:
            return ContainerState(state="unknown", message="no such container")
        if rec.final is None and rec.exited.done():
            # The process is gone; the waiter is about to record how it ended.
            await rec.done.wait()
        if rec.final is not None:
            return rec.final
        return ContainerState(state="running", started_at=rec.started_at)

    async def wait(self, handle: ContainerHandle) -> ContainerState:
        rec = self._procs.get(handle.id)
        if rec is None:
            return ContainerState(state="unknown", message="no such container")
        await rec.done.wait()
        assert rec.final is not None
        return rec.final

    async def stop(self, handle: ContainerHandle, grace_seconds: float) -> ContainerState:
        rec = self._procs.get(handle.id)
        if rec is None:
            return ContainerState(state="unknown", message="no such container")
        if not rec.done.is_set():
            self._signal(rec, signal.SIGTERM)
            if not await within(rec.done.wait(), self.clock, grace_seconds):
                self._kill_all(rec)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(rec.done.wait(), _KILL_SETTLE_S)
        if rec.final is None:
            return ContainerState(
                state="running", started_at=rec.started_at, message="still running after SIGKILL"
            )
        return rec.final

    async def exec(
        self,
        handle: ContainerHandle,
        command: list[str],
        timeout: float,  # noqa: ASYNC109 - the signature is base.Runtime's
    ) -> tuple[int, str]:
        """The command as a host process with the container's environment, working
        directory and cgroup. A timeout kills it and answers -1."""
        rec = self._procs.get(handle.id)
        if rec is None or rec.done.is_set():
            return -1, "container is not running"
        if not command:
            return -1, "no command"
        exe = self._resolve(command[0], rec.env, rec.cwd)
        if exe is None:
            return 127, f'executable file "{command[0]}" not found'
        program = [exe, *command[1:]]
        if rec.cgroup is not None:
            program = [
                "/bin/sh",
                "-c",
                _JOIN_CGROUPS,
                "gpufleet-exec",
                *rec.cgroup.procs_files,
                "--",
                *program,
            ]
        try:
            p, _ = await _spawn(program, cwd=rec.cwd, env=rec.env, stderr=asyncio.subprocess.STDOUT)
        except OSError as e:
            return 126, f"cannot run {command[0]}: {e.strerror or e}"
        out = asyncio.ensure_future(p.communicate())
        if not await within(out, self.clock, timeout):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(out, _KILL_SETTLE_S)
            return -1, f"command timed out after {timeout:g}s"
        stdout, _ = out.result()
        assert p.returncode is not None
        return exit_code(p.returncode), stdout.decode(errors="replace")

    async def stats(self, handle: ContainerHandle) -> ContainerStats | None:
        rec = self._procs.get(handle.id)
        if rec is None or rec.done.is_set():
            return None
        cpu, mem = self._usage(rec)
        now = self.clock.monotonic()
        prev_cpu, prev_t = rec.last_cpu or (0.0, rec.started_mono)
        rec.last_cpu = (cpu, now)
        dt = now - prev_t
        # A child that exited takes its cpu time with it: never report negative use.
        millis = max(0.0, cpu - prev_cpu) / dt * 1000.0 if dt > 0 else 0.0
        if rec.cgroup is not None:
            mem = rec.cgroup.memory_bytes() or mem
        return ContainerStats(cpu_millis=millis, memory_bytes=mem)

    def _usage(self, rec: _Proc) -> tuple[float, int]:
        """cpu seconds and resident memory of every process of the container."""
        procs: list[psutil.Process] = []
        pids = rec.cgroup.pids() if rec.cgroup is not None else []
        if pids:
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    procs.append(psutil.Process(pid))
        else:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(rec.proc.pid)
                procs = [root, *root.children(recursive=True)]
        cpu, rss = 0.0, 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                cpu += t.user + t.system
                rss += p.memory_info().rss
        return cpu, rss

    # --- forget -----------------------------------------------------------------------

    async def remove(self, handle: ContainerHandle) -> None:
        rec = self._procs.pop(handle.id, None)
        if rec is None:
            return
        if not rec.done.is_set():
            self._kill_all(rec)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rec.done.wait(), _KILL_SETTLE_S)
        await self._release(rec)

    async def _release(self, rec: _Proc) -> None:
        if rec.cgroup is None:
            return
        # Killed processes leave their cgroup a moment after they die.
        for _ in range(50):
            rec.cgroup.remove()
            if not any(d.exists() for d in rec.cgroup.dirs.values()):
                return
            await asyncio.sleep(0.02)
        log.warning("cgroup of %s still busy, left in place", rec.handle.id)

    async def close(self) -> None:
        recs = list(self._procs.values())
        self._procs.clear()

        async def finish(rec: _Proc) -> None:
            if not rec.done.is_set():
                self._signal(rec, signal.SIGTERM)
                if not await within(rec.done.wait(), self.clock, _CLOSE_GRACE_S):
                    self._kill_all(rec)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(rec.done.wait(), _KILL_SETTLE_S)
            for t in rec.pumps:
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(t, 1.0)
            await self._release(rec)

        await asyncio.gather(*(finish(r) for r in recs))
