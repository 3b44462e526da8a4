"""Real containers through the podman CLI.

Flags that matter on the machines we run on:

- ``--runtime runc``: crun fails on cgroup v1 hosts; runc works on v1 and v2.
- ``--ulimit nofile=1024:1024 --ulimit nproc=1024:1024``: without explicit limits podman
  copies the host's, which runc then cannot set inside some sandboxes.
- ``--init``: a tiny init (catatonit) as PID 1 forwards SIGTERM to the program. A program
  running as PID 1 gets no default signal handlers, so one that never installed a SIGTERM
  handler (busybox httpd, most scripts) would ignore ``podman stop`` until the grace
  period ran out. The price: catatonit masks "executable not found" as exit 1 with a line
  in the log, which state() recognizes as ContainerCannotRun.
- ``--log-driver k8s-file --log-opt path=LOG``: conmon writes CRI lines straight to the
  agent's log file (appending, and the file stays after ``podman rm``).
- ``--device nvidia.com/gpu=UUID``: GPUs through CDI (needs the NVIDIA CDI spec from
  ``nvidia-ctk cdi generate``). Inside, the container sees only those GPUs, numbered from
  0, so CUDA_VISIBLE_DEVICES is renumbered to match.

The environment goes through an ``--env-file`` (mode 0600, deleted once podman read it),
not ``-e K=V``, so secrets do not show up in the process list; a value that a line-based
file cannot carry (a newline) falls back to ``-e``.

Containers belong to podman (conmon supervises them), so they survive this runtime and
the agent; close() only stops watching them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpufleet.agent.runtime._common import safe_name, terminated_reason, within
from gpufleet.agent.runtime.base import (
    ContainerHandle,
    ContainerSpec,
    ContainerState,
    ContainerStats,
    RuntimeError_,
)
from gpufleet.agent.runtime.gpuenv import CUDA_VISIBLE_DEVICES, cdi_device, gpu_env
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

DEFAULT_ULIMITS = (("nofile", "1024:1024"), ("nproc", "1024:1024"))
LABEL_PREFIX = "gpufleet.io/"
_INIT_EXEC_FAILED = "failed to exec pid1"
_ZERO_TIME = "0001-01-01"
_IMAGE_ERROR = re.compile(
    r"initializing source|unable to pull|image not known|manifest unknown|pull access denied|"
    r"short-name|reading manifest|repository .* not found",
    re.IGNORECASE,
)


def container_name(spec: ContainerSpec) -> str:
    """gpufleet-<namespace>-<pod>-<container>-<attempt>: readable in ``podman ps``, unique
    on the node (two namespaces may hold pods of the same name)."""
    raw = f"gpufleet-{spec.namespace}-{spec.pod_name}-{spec.name}-{spec.attempt}"
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", raw)


def container_env(spec: ContainerSpec) -> dict[str, str]:
    env = dict(spec.env)
    env.update(gpu_env(spec.gpus))
    if spec.gpus:
        env[CUDA_VISIBLE_DEVICES] = ",".join(str(i) for i in range(len(spec.gpus)))
    return env


def _env_file_safe(value: str) -> bool:
    return "\n" not in value and not value.endswith("\r")


def build_run_args(
    spec: ContainerSpec,
    *,
    name: str,
    log_path: str,
    env_file: str | None,
    oci_runtime: str = "runc",
    init: bool = True,
    ulimits: tuple[tuple[str, str], ...] = DEFAULT_ULIMITS,
) -> list[str]:
    """The arguments of ``podman run`` for a container (without the program name).

    The variables a line-based env file can carry are expected in env_file (see
    write_env_file); the rest are passed with -e here."""
    args = ["run", "-d", "--name", name]
    if oci_runtime:
        args += ["--runtime", oci_runtime]
    if init:
        args.append("--init")
    for kind, value in ulimits:
        args += ["--ulimit", f"{kind}={value}"]
    for key, value in (
        ("pod-uid", spec.pod_uid),
        ("namespace", spec.namespace),
        ("pod", spec.pod_name),
        ("container", spec.name),
        ("attempt", str(spec.attempt)),
    ):
        args += ["--label", f"{LABEL_PREFIX}{key}={value}"]
    env = container_env(spec)
    if env_file is not None:
        args += ["--env-file", env_file]
    for k in sorted(env):
        if env_file is None or not _env_file_safe(env[k]):
            args += ["-e", f"{k}={env[k]}"]
    if spec.working_dir:
        args += ["-w", spec.working_dir]
    for p in spec.ports:
        args += ["-p", f"{p.host_port}:{p.container_port}/{p.protocol.lower()}"]
    if spec.cpu_limit_millis:
        args += ["--cpus", f"{spec.cpu_limit_millis / 1000:g}"]
    if spec.memory_limit_bytes:
        args += ["--memory", f"{spec.memory_limit_bytes}b"]
    for g in spec.gpus:
        args += ["--device", cdi_device(g.uuid)]
    args += ["--log-driver", "k8s-file", "--log-opt", f"path={log_path}"]
    if spec.command:
        # Kubernetes' command replaces the image's ENTRYPOINT (and drops its CMD, which
        # podman does too when --entrypoint is given); args replace CMD.
        args += ["--entrypoint", json.dumps(spec.command)]
    args.append(spec.image)
    args += spec.args
    return args


def write_env_file(path: Path, env: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        for k in sorted(env):
            if _env_file_safe(env[k]):
                f.write(f"{k}={env[k]}\n")


def parse_time(text: str | None) -> float | None:
    """podman's times ("2024-05-01T12:00:00.123456789Z", zero time for never)."""
    if not text or text.startswith(_ZERO_TIME):
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:\.(\d+))?\s*(Z|[+-]\d\d:?\d\d)?", text)
    if not m:
        return None
    frac = (m.group(3) or "0")[:6].ljust(6, "0")
    tz = m.group(4) or "Z"
    if tz == "Z":
        tz = "+00:00"
    elif ":" not in tz:
        tz = tz[:3] + ":" + tz[3:]
    return datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}.{frac}{tz}").timestamp()


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float | None:
    """Go's time.Duration text ("1m2.5s", "39.2ms") in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", text or "")
    if not parts:
        return None
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


_SIZE_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def parse_size(text: str) -> int | None:
    """podman's human sizes ("462.8kB", "1.5GiB") in bytes."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)", text or "")
    if not m:
        return None
    unit = (m.group(2) or "b").lower()
    if unit not in _SIZE_UNITS:
        return None
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


@dataclass(eq=False)
class _Container:
    handle: ContainerHandle
    name: str
    spec: ContainerSpec
    log_path: str
    stopping: bool = False
    waiter: asyncio.Task[ContainerState] | None = None
    last_cpu: tuple[float, float] | None = None  # (cpu seconds, monotonic time)


class PodmanRuntime:
    name = "podman"

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        clock: Clock = REAL_CLOCK,
        *,
        podman: str = "podman",
        oci_runtime: str = "runc",
        init: bool = True,
        ulimits: tuple[tuple[str, str], ...] = DEFAULT_ULIMITS,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.clock = clock
        self.podman = podman
        self.oci_runtime = oci_runtime
        self.init = init
        self.ulimits = ulimits
        self._containers: dict[str, _Container] = {}

    def available(self) -> bool:
        return shutil.which(self.podman) is not None

    async def _run(self, *args: str, merge_stderr: bool = False) -> tuple[int, str, str]:
        p = await asyncio.create_subprocess_exec(
            self.podman,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
        )
        try:
            out, err = await p.communicate()
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            with contextlib.suppress(Exception):
                await asyncio.shield(p.wait())
            raise
        assert p.returncode is not None
        return p.returncode, out.decode(errors="replace"), (err or b"").decode(errors="replace")

    async def _inspect(self, ref: str) -> dict[str, Any] | None:
        rc, out, _ = await self._run("inspect", "--type", "container", "--format", "json", ref)
        if rc != 0:
            return None
        try:
            data = json.loads(out)
        except ValueError:
            return None
        return data[0] if data else None

    # --- start ------------------------------------------------------------------------

    def _log_path(self, spec: ContainerSpec) -> str:
        if spec.log_path:
            return spec.log_path
        return str(
            self.state_dir / "logs" / safe_name(spec.pod_uid) / safe_name(spec.name) / f"{spec.attempt}.log"
        )

    async def start(self, spec: ContainerSpec) -> ContainerHandle:
        if not self.available():
            raise RuntimeError_(f"{self.podman} is not installed on this node", "CreateContainerError")
        name = container_name(spec)
        log_path = self._log_path(spec)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        env_file = self.state_dir / "env" / f"{name}.env"
        write_env_file(env_file, container_env(spec))
        args = build_run_args(
            spec,
            name=name,
            log_path=log_path,
            env_file=str(env_file),
            oci_runtime=self.oci_runtime,
            init=self.init,
            ulimits=self.ulimits,
        )
        try:
            rc, out, err = await self._run(*args)
            if rc != 0 and "already in use" in err:
                # A container of the same pod, container and attempt is left from an agent
                # that lost track of it: this start replaces it.
                await self._run("rm", "-f", "-t", "0", "--ignore", name)
                rc, out, err = await self._run(*args)
        finally:
            with contextlib.suppress(OSError):
                env_file.unlink()
        if rc != 0:
            # A failed run can leave a created-but-never-started container behind.
            await self._run("rm", "-f", "-t", "0", "--ignore", name)
            message = _podman_error(err) or f"podman run exited with {rc}"
            raise RuntimeError_(
                message, "ErrImagePull" if _IMAGE_ERROR.search(err) else "CreateContainerError"
            )
        cid = out.strip().splitlines()[-1] if out.strip() else name
        info = await self._inspect(cid)
        pid = (info or {}).get("State", {}).get("Pid") or None
        c = _Container(ContainerHandle(id=cid, pid=pid), name, spec, log_path)
        self._containers[cid] = c
        if info is not None:
            st = self._to_state(c, info)
            if st.reason == "ContainerCannotRun":
                await self._run("rm", "-f", "-t", "0", "--ignore", cid)
                self._containers.pop(cid, None)
                raise RuntimeError_(st.message, "RunContainerError")
        return c.handle

    # --- observe ------------------------------------------------------------------------

    def _cannot_run_message(self, c: _Container) -> str:
        """catatonit's complaint when the program could not be exec'd, if it left one."""
        try:
            with open(c.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                tail = f.read().decode(errors="replace")
        except OSError:
            return ""
        for line in reversed(tail.splitlines()):
            if _INIT_EXEC_FAILED in line:
                return line.split(" ", 3)[-1] if " stderr " in line else line
        return ""

    def _to_state(self, c: _Container, info: dict[str, Any]) -> ContainerState:
        s = info.get("State") or {}
        status = str(s.get("Status", "")).lower()
        started = parse_time(s.get("StartedAt"))
        finished = parse_time(s.get("FinishedAt"))
        if status in ("running", "paused", "stopping"):
            return ContainerState("running", started_at=started)
        if status not in ("exited", "stopped"):
            return ContainerState("unknown", started_at=started, message=f"podman status {status or '?'}")
        code = int(s.get("ExitCode") or 0)
        error = str(s.get("Error") or "")
        if self.init and code == 1:
            msg = self._cannot_run_message(c)
            if msg:
                return ContainerState("exited", 128, started, finished, "ContainerCannotRun", msg)
        if error and started is None:
            return ContainerState("exited", code or 128, started, finished, "ContainerCannotRun", error)
        oom = bool(s.get("OOMKilled"))
        message = ""
        if not oom and code == 137 and c.spec.memory_limit_bytes and not c.stopping:
            # conmon does not always see the OOM event (cgroup v1); a SIGKILL nobody here
            # sent, to a container with a memory limit, is the OOM killer's.
            oom = True
            message = f"killed with SIGKILL under a memory limit of {c.spec.memory_limit_bytes} bytes"
        reason = terminated_reason(code, oom)
        if reason == "OOMKilled" and not message:
            message = "the container exceeded its memory limit"
        return ContainerState("exited", code, started, finished, reason, message or error)

    async def state(self, handle: ContainerHandle) -> ContainerState:
        c = self._containers.get(handle.id)
        info = await self._inspect(handle.id)
        if info is None:
            return ContainerState("unknown", message="no such container")
        if c is None:
            c = _Container(handle, str(info.get("Name", "")), _spec_stub(), "")
        return self._to_state(c, info)

    async def _wait_exit(self, c: _Container) -> ContainerState:
        await self._run("wait", c.handle.id)
        return await self.state(c.handle)

    async def wait(self, handle: ContainerHandle) -> ContainerState:
        c = self._containers.get(handle.id)
        if c is None:
            return await self.state(handle)
        if c.waiter is None or (c.waiter.done() and c.waiter.cancelled()):
            c.waiter = asyncio.create_task(self._wait_exit(c))
        return await asyncio.shield(c.waiter)

    async def stop(self, handle: ContainerHandle, grace_seconds: float) -> ContainerState:
        c = self._containers.get(handle.id)
        if c is not None:
            c.stopping = True
        st = await self.state(handle)
        if st.state != "running":
            return st
        rc, _, err = await self._run("stop", "-t", str(max(0, math.ceil(grace_seconds))), handle.id)
        if rc != 0:
            log.warning("podman stop %s: %s", handle.id, err.strip())
        return await self.state(handle)

    async def exec(
        self,
        handle: ContainerHandle,
        command: list[str],
        timeout: float,  # noqa: ASYNC109 - the signature is base.Runtime's
    ) -> tuple[int, str]:
        if not command:
            return -1, "no command"
        run = asyncio.ensure_future(self._run("exec", handle.id, *command, merge_stderr=True))
        if not await within(run, self.clock, timeout):
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
            return -1, f"command timed out after {timeout:g}s"
        rc, out, _ = run.result()
        return rc, out

    async def stats(self, handle: ContainerHandle) -> ContainerStats | None:
        rc, out, _ = await self._run("stats", "--no-stream", "--format", "json", handle.id)
        if rc != 0:
            return None
        try:
            rows = json.loads(out)
        except ValueError:
            return None
        if not rows:
            return None
        row = rows[0]
        mem = parse_size(str(row.get("mem_usage", "")).split("/")[0]) or 0
        cpu_s = parse_go_duration(str(row.get("cpu_time", "")))
        c = self._containers.get(handle.id)
        now = self.clock.monotonic()
        millis: float
        if c is not None and cpu_s is not None and c.last_cpu is not None and now > c.last_cpu[1]:
            millis = max(0.0, cpu_s - c.last_cpu[0]) / (now - c.last_cpu[1]) * 1000.0
        else:
            pct = str(row.get("cpu_percent", "0")).rstrip("%") or "0"
            try:
                millis = float(pct) * 10.0
            except ValueError:
                millis = 0.0
        if c is not None and cpu_s is not None:
            c.last_cpu = (cpu_s, now)
        return ContainerStats(cpu_millis=millis, memory_bytes=mem)

    # --- forget -----------------------------------------------------------------------

    async def remove(self, handle: ContainerHandle) -> None:
        c = self._containers.pop(handle.id, None)
        if c is not None:
            c.stopping = True
        # A pending wait() sees `podman wait` return and answers "unknown".
        await self._run("rm", "-f", "-t", "0", "--ignore", handle.id)

    async def close(self) -> None:
        for c in self._containers.values():
            if c.waiter is not None and not c.waiter.done():
                c.waiter.cancel()
        self._containers.clear()


def _podman_error(err: str) -> str:
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    return (errors[-1] if errors else lines[-1]) if lines else ""


def _spec_stub() -> ContainerSpec:
    return ContainerSpec("", "", "", "", "", [], [], {}, None)
