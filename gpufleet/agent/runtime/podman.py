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

A pod is a sandbox container (catatonit in pause mode, image ``localhost/gpufleet/pause``,
made here from the host's catatonit) that holds the pod's network namespace (its own IP on
the node's network, so two pods may both listen on a fixed containerPort), IPC namespace and
/dev/shm, hostname and /etc/hosts; the pod's containers join it (``--network container:``,
``--ipc container:``, ``--uts container:``), as the kubelet's pods do with their pause
container. Only ports with a hostPort are published on the node.

Images are pulled by ensure_image() per imagePullPolicy with the pod's pull secrets (an
auth file in the Docker config format, mode 0600, removed after the pull); containers are
then run with ``--pull never``. Registries' TLS is podman's: /etc/containers/certs.d.

Everything carries labels (node, pod uid, namespace, pod, container, attempt, GPUs), so
recover() finds what an earlier agent started. Containers belong to podman (conmon
supervises them), so they survive this runtime and the agent; close() only stops watching.

The parts: podman_args.py (names, labels, run arguments, parsers), podman_images.py
(pulls), podman_sandbox.py (the pod network and sandboxes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.agent.runtime._common import safe_name, terminated_reason, within
from gpufleet.agent.runtime.base import (
    CAPABILITIES,
    ContainerHandle,
    ContainerSpec,
    ContainerState,
    ContainerStats,
    RecoveredContainer,
    RecoveredSandbox,
    RuntimeError_,
    SandboxHandle,
)
from gpufleet.agent.runtime.podman_args import (
    _IMAGE_ERROR,
    _INIT_EXEC_FAILED,
    _SANDBOX_ROLE,
    DEFAULT_ULIMITS,
    LABEL_PREFIX,
    _cdi_available,
    _podman_error,
    _sandbox_ip,
    _spec_stub,
    build_run_args,
    container_env,
    container_name,
    parse_go_duration,
    parse_size,
    parse_time,
    write_env_file,
)
from gpufleet.agent.runtime.podman_exec import PodmanStreamsMixin
from gpufleet.agent.runtime.podman_images import ImagesMixin
from gpufleet.agent.runtime.podman_sandbox import SandboxMixin
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

@dataclass(eq=False)
class _Container:
    handle: ContainerHandle
    name: str
    spec: ContainerSpec
    log_path: str
    stopping: bool = False
    waiter: asyncio.Task[ContainerState] | None = None
    last_cpu: tuple[float, float] | None = None  # (cpu seconds, monotonic time)


class PodmanRuntime(SandboxMixin, ImagesMixin, PodmanStreamsMixin):
    name = "podman"
    capabilities = frozenset(CAPABILITIES)

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
        # Which agent's containers these are: two agents of one node name (two clusters on
        # one machine) must never adopt or reap each other's.
        import hashlib

        self.owner = hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:12]
        # The podman network pods join (the node's pod network); "" is podman's default.
        self.network = ""
        self._pull_locks: dict[str, asyncio.Lock] = {}
        self._pause_ready = False
        self._cdi: bool | None = None
        self.version = ""

    def set_network(self, name: str) -> None:
        self.network = name

    def available(self) -> bool:
        return shutil.which(self.podman) is not None

    async def _run(self, *args: str, merge_stderr: bool = False) -> tuple[int, str, str]:
        # In the state directory: conmon, started by podman, leaves files such as "oom" (a
        # container was OOM-killed) in its working directory, which must not be the agent's.
        self.state_dir.mkdir(parents=True, exist_ok=True)
        p = await asyncio.create_subprocess_exec(
            self.podman,
            *args,
            cwd=self.state_dir,
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
        if self._cdi is None:
            self._cdi = _cdi_available()
        if spec.security.run_as_non_root:
            await self._check_non_root(spec)

        def run_args(name: str) -> list[str]:
            return build_run_args(
                spec,
                name=name,
                log_path=log_path,
                env_file=str(env_file),
                oci_runtime=self.oci_runtime,
                init=self.init,
                ulimits=self.ulimits,
                cdi=self._cdi,
                owner=self.owner,
            )

        try:
            rc, out, err = await self._run(*run_args(name))
            if rc != 0 and "already in use" in err:
                holder = await self._inspect(name)
                labels = ((holder or {}).get("Config") or {}).get("Labels") or {}
                if holder is None or labels.get(LABEL_PREFIX + "owner") == self.owner:
                    # A container of the same pod, container and attempt is left from this
                    # agent, which lost track of it: this start replaces it.
                    await self._run("rm", "-f", "-t", "0", "--ignore", name)
                else:
                    # Another agent's on this machine (another node, or another cluster's):
                    # never ours to remove; this one gets a name of its own (one left under
                    # it is this agent's).
                    name = container_name(spec, self.owner)
                    await self._run("rm", "-f", "-t", "0", "--ignore", name)
                rc, out, err = await self._run(*run_args(name))
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

    async def _check_non_root(self, spec: ContainerSpec) -> None:
        """runAsNonRoot as the kubelet checks it: the uid the container will run as, from
        runAsUser or else the image's USER, must be known and not 0."""
        if spec.security.run_as_user is not None:
            if spec.security.run_as_user == 0:
                raise RuntimeError_("container's runAsUser breaks non-root policy (pod: "
                                    f'"{spec.pod_name}_{spec.namespace}({spec.pod_uid})", container: {spec.name})',
                                    "CreateContainerConfigError")
            return
        rc, out, _ = await self._run("image", "inspect", "--format", "{{.Config.User}}", spec.image)
        user = out.strip().split(":", 1)[0] if rc == 0 else ""
        if user in ("", "0", "root"):
            raise RuntimeError_("container has runAsNonRoot and image will run as root (pod: "
                                f'"{spec.pod_name}_{spec.namespace}({spec.pod_uid})", container: {spec.name})',
                                "CreateContainerConfigError")
        if not user.isdigit():
            raise RuntimeError_(f"container has runAsNonRoot and image has non-numeric user ({user}), "
                                "cannot verify user is non-root (pod: "
                                f'"{spec.pod_name}_{spec.namespace}({spec.pod_uid})", container: {spec.name})',
                                "CreateContainerConfigError")

    # --- recovery -----------------------------------------------------------------------

    async def recover(self, node_name: str) -> tuple[list[RecoveredSandbox], list[RecoveredContainer]]:
        rc, out, err = await self._run("ps", "-a", "--format", "json", "--filter",
                                       f"label={LABEL_PREFIX}node={node_name}", "--filter",
                                       f"label={LABEL_PREFIX}owner={self.owner}")
        if rc != 0:
            log.warning("podman ps: %s", err.strip())
            return [], []
        try:
            rows = json.loads(out or "[]")
        except ValueError:
            return [], []
        sandboxes: list[RecoveredSandbox] = []
        containers: list[RecoveredContainer] = []
        for row in rows:
            cid = row.get("Id") or ""
            if not cid:
                continue
            info = await self._inspect(cid)
            if info is None:
                continue
            labels = (info.get("Config") or {}).get("Labels") or {}

            def label(key: str, labels: dict[str, str] = labels) -> str:
                return str(labels.get(LABEL_PREFIX + key, ""))

            gpus = tuple(int(x) for x in label("gpus").split(",") if x.strip().isdigit())
            if label("role") == _SANDBOX_ROLE:
                sandboxes.append(RecoveredSandbox(SandboxHandle(cid, _sandbox_ip(info)), label("pod-uid"),
                                                  label("namespace"), label("pod"), gpus))
                continue
            handle = ContainerHandle(id=cid, pid=(info.get("State") or {}).get("Pid") or None)
            log_path = label("log-path") or str(((info.get("HostConfig") or {}).get("LogConfig") or {}).get("Path") or "")
            try:
                attempt = int(label("attempt") or 0)
            except ValueError:
                attempt = 0
            stub = ContainerSpec(label("pod-uid"), label("pod"), label("namespace"), label("container"),
                                 str((info.get("Config") or {}).get("Image") or ""), [], [], {}, None)
            c = _Container(handle, str(info.get("Name", "")), stub, log_path)
            self._containers[cid] = c
            containers.append(RecoveredContainer(
                handle=handle, pod_uid=label("pod-uid"), name=label("container"), attempt=attempt, gpus=gpus,
                state=self._to_state(c, info), namespace=label("namespace"), pod_name=label("pod"),
                sandbox_id=label("sandbox"), log_path=log_path))
        return sandboxes, containers

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
