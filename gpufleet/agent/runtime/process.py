"""Containers as the node's own programs, each in a bubblewrap sandbox: the bare-metal
runtime (the host's CUDA stack and tools, HPC habits), with the host's network.

What a container sees
  Its own mount, PID, UTS and IPC namespaces (SysV IPC is the container's own; POSIX
  shared memory, which NCCL and PyTorch use, goes through the pod's /dev/shm): the node's
  filesystem read-only (its top-level entries bound onto a fresh root, so volumes can
  appear at new top-level paths; a missing mount point deeper in the node's directories
  is refused before the start), a new /proc showing only its own processes, a minimal /dev with exactly the
  device nodes of its GPUs (/dev/nvidia<N> for each assigned index, plus nvidiactl,
  nvidia-uvm, nvidia-uvm-tools and nvidia-modeset) when the node has them, a private
  /tmp (a directory on disk, fresh for each attempt, and the default working directory),
  the pod's /dev/shm (one tmpfs per pod sized by SandboxSpec.shm_size_bytes, shared by its
  containers), the pod's /etc/hosts and hostname, each ContainerSpec.mount at its
  container_path, the constructor's ``shared_paths`` read-write at their own place (home
  and scratch filesystems), and the ``hidden_paths`` (plus this runtime's state dir, which
  holds every pod's sandbox, log and volume) as empty read-only directories. /proc and
  /sys paths that container runtimes mask are masked, except for privileged containers,
  which see the node's /dev and a writable /sys. CUDA_VISIBLE_DEVICES counts the
  container's GPUs from 0 when their device nodes are there (CUDA sees only those; the
  UUIDs stay in NVIDIA_VISIBLE_DEVICES); on a node without them it keeps the node's
  indices. The network is the node's: "pod-network" is not offered.

Whom it runs as
  SecuritySpec.run_as_user/run_as_group, or the unprivileged default user (65534:65534,
  a constructor argument); supplementary groups are those the node's /etc/group gives
  the user, then supplemental_groups and fs_group (Kubernetes' Merge policy). The switch
  happens after bwrap built the namespaces, with util-linux's setpriv (bwrap's --uid only
  works inside a user namespace, which cannot hold the node's own uids and groups that
  volumes and shared filesystems are owned by); every capability is dropped on the way.
  Never root on the node unless privileged: a container asking for uid 0 without it runs
  as root inside a user namespace whose root is the default user on the node (setpriv,
  then ``unshare --user --map-root-user``; the mounts were made before, by the node's
  root, and stay read-only and locked), keeping the default container capabilities with
  its add/drop; where the kernel refuses user namespaces it is refused with a
  RuntimeError_ saying so. runAsNonRoot is checked with the kubelet's words. Every
  process of a sandbox has no_new_privs (bwrap always sets it), so allowPrivilegeEscalation
  true is not honoured: setuid programs do not elevate. An agent that is not root cannot
  switch users: everything runs as the agent's user and "run-as-user" and "capabilities"
  are left out of ``capabilities``. Without bwrap a container is a plain host process
  (as before) and only what that honours is offered.

Secrets
  The environment never appears on a command line: the agent hands it to the container's
  monitor on a pipe and it reaches the program through exec. A container sees no other
  pod's processes, so no other /proc/<pid>/environ either.

Lifetime
  Each container has a monitor (monitor.py), detached from the agent, that starts the
  sandbox, writes the program's output to the container's log in the CRI format and
  records the container and how it ended in a state file under the state dir. So
  containers outlive the agent as podman's do: close() only stops watching them;
  stop_all(grace) stops everything this runtime knows (the agent calls it when it is
  asked to take its pods down). recover() reads the state files and re-adopts what an
  earlier agent started: wait/stop/exec/stats/remove work on the recovered handles.

  The agent's service must leave the monitors alone when it stops (systemd:
  KillMode=process, as containerd's unit has); a SIGKILLed monitor takes its container
  with it (bwrap --die-with-parent), since nobody would be left to record its end.

Images
  The runtime runs the node's programs. ensure_image() accepts any image without
  pulling; ``image_honoured(image)`` says whether the image means "the host" (the
  constructor's ``host_images``, default "host" and "localhost/gpufleet/host"), so the
  agent can tell a pod asking for another image that it runs the node's programs instead.

Interactive use: exec() runs a command inside the sandbox (nsenter into its namespaces,
then the container's user, working directory, environment and cgroup); exec_stream()
does the same with stdin/stdout/stderr streams, or one terminal of the container's own
/dev/pts, for kubectl exec.

Not honoured: SandboxSpec.directory (a sandbox lives under the state dir, hidden from
other pods), ports and sysctls (the node's network and kernel settings), seccomp profiles,
and ContainerSpec.stdin/tty (a container's stdin is /dev/null).

cpu and memory limits and OOM detection use the container's cgroup (cgroups.py), which
every process of the sandbox is in.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import grp
import json
import logging
import marshal
import os
import pwd
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gpufleet.agent.runtime import monitor as mon
from gpufleet.agent.runtime._common import exit_code, safe_name, signal_name, terminated_reason, within
from gpufleet.agent.runtime.base import (
    ContainerHandle,
    ContainerSpec,
    ContainerState,
    ContainerStats,
    Mount,
    PulledImage,
    RecoveredContainer,
    RecoveredSandbox,
    RegistryAuth,
    RuntimeError_,
    SandboxHandle,
    SandboxSpec,
)
from gpufleet.agent.runtime.cgroups import Cgroup, Cgroups
from gpufleet.agent.runtime.gpuenv import CUDA_VISIBLE_DEVICES, gpu_env
from gpufleet.agent.runtime.sandbox import (
    DEFAULT_SHM_BYTES,
    MASKED_PATHS,
    NVIDIA_CONTROL_DEVICES,
    ExpandedDir,
    Identity,
    Passwd,
    Plan,
    bwrap_args,
    child_entries,
    expansion_chain,
    hostname_for,
    hosts_file,
    resolv_conf,
    resolve_identity,
    root_entries,
    user_chain,
    view_to_node,
    visible_hidden,
)
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

_INHERITED_ENV = ("PATH",)
# Joins the cgroups before exec'ing the program, so not one allocation happens outside
# them. Arguments: the cgroup.procs files, "--", the program and its arguments.
_JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"'
# After SIGKILL the kernel needs a moment to reap; this bounds how long we wait for it.
_KILL_SETTLE_S = 10.0
# How long start() waits for the monitor to report the program running.
_START_TIMEOUT_S = 60.0
_GONE_MESSAGE = (
    "The container could not be located when the agent started again: its monitor ended "
    "without recording how it exited"
)
DEFAULT_HOST_IMAGES = ("host", "localhost/gpufleet/host")
DEFAULT_USER = (65534, 65534)


def _package_root() -> str:
    import gpufleet

    return str(Path(gpufleet.__file__).resolve().parent.parent)


class _Pid:
    """A process known by pid and start time, with a pidfd where the kernel has them."""

    def __init__(self, pid: int | None, start: int | None) -> None:
        self.pid = pid
        self.start = start
        self.fd: int | None = None
        if pid is not None and start is not None:
            with contextlib.suppress(OSError, AttributeError):
                fd = os.pidfd_open(pid)
                # The pidfd names whatever has the pid now: it is ours only if the start
                # time still matches once it is open.
                if mon.start_time(pid) == start:
                    self.fd = fd
                else:
                    os.close(fd)

    def alive(self) -> bool:
        if self.pid is None or self.start is None:
            return False
        if self.fd is not None:
            readable, _, _ = select.select([self.fd], [], [], 0)
            if readable:
                return False
        return mon.start_time(self.pid) == self.start

    def signal(self, sig: int) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.fd, sig)
            return
        if self.alive():
            with contextlib.suppress(OSError):
                os.kill(self.pid, sig)  # type: ignore[arg-type]

    async def wait(self, clock: Clock) -> None:
        if self.fd is not None:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            fd = self.fd

            def ready() -> None:
                if not fut.done():
                    fut.set_result(None)

            loop.add_reader(fd, ready)
            try:
                if not self.alive():
                    return
                await fut
            finally:
                loop.remove_reader(fd)
            return
        # No pidfd (before Linux 5.3): look now and then.
        while True:
            if not self.alive():
                return
            await asyncio.sleep(0.2)

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


@dataclass(eq=False)
class _Ctr:
    handle: ContainerHandle
    dir: Path
    info: dict
    env: dict[str, str]
    cgroup: Cgroup | None
    main: _Pid
    sandbox: _Pid
    monitor: _Pid
    sandboxed: bool
    ident: Identity
    memory_limit: int | None = None
    started_mono: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    final: ContainerState | None = None
    watcher: asyncio.Task[None] | None = None
    stopping: bool = False
    last_cpu: tuple[float, float] | None = None  # (cpu seconds, monotonic time)

    @property
    def started_at(self) -> float | None:
        return self.info.get("started_at")

    def close(self) -> None:
        for p in (self.main, self.sandbox, self.monitor):
            p.close()


@dataclass
class _Sandbox:
    id: str
    dir: Path
    record: dict


class ProcessRuntime:
    name = "process"

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        clock: Clock = REAL_CLOCK,
        *,
        cgroup_root: str | os.PathLike[str] | None = "/sys/fs/cgroup",
        hidden_paths: Iterable[str | os.PathLike[str]] = (),
        shared_paths: Iterable[str | os.PathLike[str]] = (),
        default_user: tuple[int, int] = DEFAULT_USER,
        host_images: Sequence[str] = DEFAULT_HOST_IMAGES,
        bwrap: str | None = "bwrap",
        device_dir: str | os.PathLike[str] = "/dev",
        node_address: str | None = None,
        monitor_python: str | None = None,
    ) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.clock = clock
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if default_user[0] == 0:
            raise ValueError("default_user must not be root: containers that name no user run unprivileged")
        self.default_user = (int(default_user[0]), int(default_user[1]))
        self.host_images = tuple(host_images)
        self.shared_paths = [os.path.abspath(p) for p in shared_paths]
        self.hidden_paths = [os.path.abspath(p) for p in hidden_paths]
        self.device_dir = Path(device_dir)
        self.node_address = node_address or _node_address()
        # The monitor needs only the standard library: any Python 3.11+ of the node will do.
        self.monitor_python = monitor_python or sys.executable
        self._containers: dict[str, _Ctr] = {}
        self._sandboxes: dict[str, _Sandbox] = {}
        # What hidden and masked files show: nothing (/dev/null itself would be a device
        # node on a nodev mount, which cannot even be opened).
        self._empty = self.state_dir / "empty"
        if not self._empty.exists():
            _write_file(self._empty, "", 0o444)
        self._root = os.geteuid() == 0
        self._setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
        self._unshare = shutil.which("unshare") or "/usr/bin/unshare"
        self._nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
        self._userns: bool | None = None
        self._bwrap, self.sandbox_unsupported_reason = _probe_bwrap(bwrap)
        if self._bwrap is None:
            log.warning(
                "process runtime: containers run as plain host processes (no mounts, no hidden paths, "
                "no PID namespace): %s",
                self.sandbox_unsupported_reason,
            )
        self._can_mount = self._root and _has_cap_sys_admin()
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
        caps = set()
        if self._bwrap:
            caps |= {"mounts", "read-only-rootfs", "pid-namespace"}
            if self._can_mount:
                caps.add("shm-size")
        if self._root:
            caps |= {"run-as-user", "capabilities"}
        self.capabilities = frozenset(caps)

    @property
    def limits_supported(self) -> frozenset[str]:
        """The limits this runtime enforces: {"cpu", "memory"}, a part of it, or nothing."""
        return self.cgroups.supported if self.cgroups is not None else frozenset()

    @property
    def sandboxed(self) -> bool:
        return self._bwrap is not None

    # --- images -------------------------------------------------------------------------

    def image_honoured(self, image: str) -> bool:
        """Whether ``image`` means the node's own programs (what this runtime runs)."""
        name = image.strip()
        for suffix in (":latest",):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
        return name in self.host_images or image in self.host_images

    async def ensure_image(self, image: str, pull_policy: str, auth: list[RegistryAuth]) -> PulledImage:
        """Nothing to pull: the container runs the node's programs whatever the image.
        image_honoured() says whether that is what the pod asked for."""
        return PulledImage(image=image, image_id=image, pulled=False)

    # --- pod sandboxes --------------------------------------------------------------------

    def _sandbox_dir(self, sid: str) -> Path:
        return self.state_dir / "sandboxes" / sid

    async def run_sandbox(self, spec: SandboxSpec) -> SandboxHandle:
        """The pod's /etc/hosts, hostname and /dev/shm under the state dir (hidden from
        every container; SandboxSpec.directory is not used, since a sandbox elsewhere would
        be visible to other pods)."""
        sid = safe_name(spec.pod_uid)
        known = self._sandboxes.get(sid) or self._load_sandbox(sid)
        if known is not None:
            await self._ensure_shm(known)
            return SandboxHandle(id=sid)
        d = self._sandbox_dir(sid)
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        hostname = hostname_for(spec.hostname or spec.pod_name)
        _write_file(d / "hosts", hosts_file(hostname, self.node_address, spec.hosts, _read_text("/etc/hosts")))
        _write_file(d / "hostname", hostname + "\n")
        if spec.dns_servers:
            _write_file(d / "resolv.conf", resolv_conf(spec.dns_servers, _read_text("/etc/resolv.conf")))
        record = {
            "pod_uid": spec.pod_uid,
            "namespace": spec.namespace,
            "pod_name": spec.pod_name,
            "hostname": hostname,
            "gpus": list(spec.gpus),
            "shm_bytes": spec.shm_size_bytes or DEFAULT_SHM_BYTES,
            "created_at": self.clock.now(),
        }
        if spec.sysctls:
            log.info("sandbox %s: sysctls %s not applied (the pod shares the node's kernel settings)", sid,
                     ", ".join(sorted(spec.sysctls)))
        sb = _Sandbox(sid, d, record)
        await self._ensure_shm(sb)
        _write_json(d / "sandbox.json", sb.record)
        self._sandboxes[sid] = sb
        return SandboxHandle(id=sid)

    async def _ensure_shm(self, sb: _Sandbox) -> None:
        """The pod's /dev/shm: a tmpfs of the asked size where the agent may mount one,
        else a directory under the node's /dev/shm (its size then is not enforced)."""
        shm = sb.dir / "shm"
        if _shm_ready(sb.record):
            return
        size = int(sb.record.get("shm_bytes") or DEFAULT_SHM_BYTES)
        if self._can_mount:
            shm.mkdir(exist_ok=True)
            rc, err = await _run(
                "mount", "-t", "tmpfs", "-o", f"size={size},mode=1777,nosuid,nodev", f"gpufleet-shm-{sb.id}", str(shm)
            )
            if rc == 0:
                sb.record.update(shm_dir=str(shm), shm_mounted=True)
                if (sb.dir / "sandbox.json").exists():
                    _write_json(sb.dir / "sandbox.json", sb.record)
                return
            log.warning("sandbox %s: cannot mount a tmpfs for /dev/shm (%s); using a directory under /dev/shm "
                        "whose size is not enforced", sb.id, err.strip())
        else:
            log.info("sandbox %s: /dev/shm is a directory under the node's /dev/shm (size not enforced: "
                     "the agent cannot mount a tmpfs)", sb.id)
        tag = f"{zlib.crc32(str(self.state_dir).encode()):08x}"
        d = Path("/dev/shm") / f"gpufleet-{tag}-{sb.id}"
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o1777)
        sb.record.update(shm_dir=str(d), shm_mounted=False)
        if (sb.dir / "sandbox.json").exists():
            _write_json(sb.dir / "sandbox.json", sb.record)

    def _load_sandbox(self, sid: str) -> _Sandbox | None:
        d = self._sandbox_dir(sid)
        try:
            record = json.loads((d / "sandbox.json").read_text())
        except (OSError, ValueError):
            return None
        sb = _Sandbox(sid, d, record)
        self._sandboxes[sid] = sb
        return sb

    async def stop_sandbox(self, handle: SandboxHandle) -> None:
        """Kills what still runs in the pod (the agent stops its containers first)."""
        left = [c for c in self._containers.values() if c.info.get("sandbox_id") == handle.id and not c.done.is_set()]
        await asyncio.gather(*(self.stop(c.handle, 0) for c in left))

    async def remove_sandbox(self, handle: SandboxHandle) -> None:
        sb = self._sandboxes.pop(handle.id, None) or self._load_sandbox(handle.id)
        self._sandboxes.pop(handle.id, None)
        if sb is None:
            return
        shm = sb.record.get("shm_dir")
        if shm and sb.record.get("shm_mounted"):
            if _shm_ready(sb.record):
                rc, err = await _run("umount", shm)
                if rc != 0:
                    await _run("umount", "-l", shm)
        elif shm:
            shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(sb.dir, ignore_errors=True)

    # --- start ------------------------------------------------------------------------

    def _log_path(self, spec: ContainerSpec) -> str:
        if spec.log_path:
            return spec.log_path
        return str(
            self.state_dir / "logs" / safe_name(spec.pod_uid) / safe_name(spec.name) / f"{spec.attempt}.log"
        )

    async def _userns_available(self) -> bool:
        if self._userns is None:
            rc, _ = await _run(
                self._setpriv, f"--reuid={self.default_user[0]}", f"--regid={self.default_user[1]}",
                "--clear-groups", "--", self._unshare, "--user", "--map-root-user", "--", "true",
            )
            self._userns = rc == 0
        return self._userns

    async def _identity(self, spec: ContainerSpec) -> Identity:
        sec = spec.security
        uid = os.geteuid()
        # Only uid 0 without privileged needs a user namespace (privileged is the node's root).
        wants_userns = self._root and sec.run_as_user == 0 and not sec.privileged
        userns = await self._userns_available() if wants_userns else False
        lookup: dict[int, Passwd] = {}
        for u in {uid, sec.run_as_user if sec.run_as_user is not None else self.default_user[0]}:
            pw = _passwd(u)
            if pw is not None:
                lookup[u] = pw
        return resolve_identity(
            sec,
            default_user=self.default_user,
            agent_uid=uid,
            agent_gid=os.getegid(),
            userns_available=userns,
            lookup=lookup,
            pod=f"{spec.pod_name}_{spec.namespace}({spec.pod_uid})",
            container=spec.name,
        )

    def _devices(self, spec: ContainerSpec) -> list[str]:
        if not spec.gpus:
            return []
        out = []
        for g in spec.gpus:
            p = self.device_dir / f"nvidia{g.index}"
            if os.path.exists(p):
                out.append(str(p))
        if out:
            for name in NVIDIA_CONTROL_DEVICES:
                p = self.device_dir / name
                if os.path.exists(p):
                    out.append(str(p))
        return out

    def _env(self, spec: ContainerSpec, ident: Identity, gpus_renumbered: bool, hostname: str | None) -> dict[str, str]:
        env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
        env["HOME"] = ident.home
        if hostname:
            env["HOSTNAME"] = hostname
        env.update(spec.env)
        # The GPUs the agent assigned are the only ones the process may see, whatever the
        # pod's own env says.
        env.update(gpu_env(spec.gpus))
        if gpus_renumbered:
            env[CUDA_VISIBLE_DEVICES] = ",".join(str(i) for i in range(len(spec.gpus)))
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        return env

    async def start(self, spec: ContainerSpec) -> ContainerHandle:
        # Kubernetes: command replaces the image's entrypoint; args alone run as given,
        # since a host process has no entrypoint to pass them to.
        argv = [*spec.command, *spec.args] if spec.command else list(spec.args)
        if not argv:
            raise RuntimeError_("the process runtime needs a command", "CreateContainerError")
        ident = await self._identity(spec)
        sb: _Sandbox | None = None
        if spec.sandbox is not None:
            sb = self._sandboxes.get(spec.sandbox.id) or self._load_sandbox(spec.sandbox.id)
            if sb is None:
                raise RuntimeError_(f"pod sandbox {spec.sandbox.id} does not exist on this node", "CreateContainerError")
        cid = f"{safe_name(spec.pod_uid)}/{safe_name(spec.name)}/{spec.attempt}.{secrets.token_hex(4)}"
        cdir = self.state_dir / "containers" / cid
        _make_container_dir(cdir)
        cgroup: Cgroup | None = None
        try:
            launch = self._prepare(spec, argv, ident, sb, cid, cdir)
            cgroup = self._cgroup_for(spec)
            if cgroup is not None:
                launch["cgroup_procs"] = cgroup.procs_files
                if "memory" in cgroup.dirs:
                    name = "memory.oom_control" if cgroup.version == 1 else "memory.events"
                    launch["oom_file"] = str(cgroup.dirs["memory"] / name)
                launch["record"]["cgroup"] = [spec.pod_uid, spec.name, str(spec.attempt)]
            report = await self._launch(cdir, launch)
            if "error" in report:
                raise RuntimeError_(report["error"], "RunContainerError")
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            shutil.rmtree(cdir, ignore_errors=True)
            raise
        info = dict(launch["record"])
        info.update(report)
        handle = ContainerHandle(id=cid, pid=report.get("pid"))
        rec = _Ctr(
            handle=handle,
            dir=cdir,
            info=info,
            env=launch["env"],
            cgroup=cgroup,
            main=_Pid(report.get("pid"), report.get("pid_start")),
            sandbox=_Pid(report.get("sandbox_pid"), report.get("sandbox_start")),
            monitor=_Pid(report.get("monitor_pid"), report.get("monitor_start")),
            sandboxed=bool(launch["sandboxed"]),
            ident=ident,
            memory_limit=spec.memory_limit_bytes,
            started_mono=self.clock.monotonic(),
        )
        self._adopt(rec)
        return handle

    def _check_mounts(self, spec: ContainerSpec, tmp: str, hidden: list[str]) -> tuple[list[ExpandedDir], list[Mount]]:
        """The node directories to show as tmpfs copies so that every volume's mount point
        can be made (the node's filesystem is read-only in the container: a missing mount
        point under it goes on a copy, e.g. /var/run/secrets/kubernetes.io/serviceaccount);
        refuses, before bwrap would, one that cannot be made at all."""
        chains: dict[str, None] = {}
        mounts = list(spec.mounts)
        for i, m in enumerate(spec.mounts):
            where = f"cannot mount {m.host_path} at {m.container_path}"
            if not os.path.isabs(m.container_path):
                raise RuntimeError_(f"{where}: the mount path must be absolute", "CreateContainerConfigError")
            if not os.path.exists(m.host_path):
                raise RuntimeError_(f"{where}: {m.host_path} does not exist on the node", "CreateContainerError")
            earlier = spec.mounts[:i]
            path = os.path.normpath(m.container_path)
            while path != "/":
                node = view_to_node(path, mounts=earlier, shared=self.shared_paths, hidden=hidden, tmp_dir=tmp)
                if node is not None and os.path.exists(node):
                    break
                path = os.path.dirname(path)
            if path in ("/", os.path.normpath(m.container_path)):
                continue
            writable = ["/tmp", *self.shared_paths, *(e.container_path for e in earlier if not e.read_only)]
            if any(path == w or path.startswith(w.rstrip("/") + "/") for w in writable):
                continue
            node = view_to_node(path, mounts=earlier, shared=self.shared_paths, hidden=hidden, tmp_dir=tmp)
            real = os.path.realpath(node) if node is not None and node == path else ""
            top = real.split("/")[1] if real.count("/") >= 1 and real != "/" else ""
            if real and os.path.isdir(real) and top and top not in ("proc", "dev", "tmp", "sys") \
                    and not any(real == h or real.startswith(h.rstrip("/") + "/") for h in hidden):
                for d in expansion_chain(real):
                    chains.setdefault(d, None)
                # bwrap makes mount points with the node's view of symlinks: name the real place.
                dest = os.path.join(real, os.path.relpath(os.path.normpath(m.container_path), path))
                mounts[i] = Mount(m.host_path, dest, m.read_only)
                continue
            raise RuntimeError_(
                f"{where}: {path} is part of the node's filesystem, read-only in the container, and has no "
                f"{os.path.relpath(m.container_path, path)} to mount on (use a path that exists on the node, "
                "one under /tmp or another volume, or a new top-level directory)",
                "CreateContainerError",
            )
        out = []
        for d in chains:
            try:
                out.append(ExpandedDir(d, os.stat(d).st_mode, child_entries(d, _listing(d))))
            except OSError as e:
                raise RuntimeError_(f"cannot show {d} in the container: {e.strerror or e}", "CreateContainerError") from e
        return out, mounts

    def _prepare(self, spec: ContainerSpec, argv: list[str], ident: Identity, sb: _Sandbox | None,
                 cid: str, cdir: Path) -> dict:
        """What the monitor is to start: the command line, environment and the record."""
        tmp = str(cdir / "tmp")
        sandboxed = self._bwrap is not None
        devices = self._devices(spec) if sandboxed else []
        # A privileged container sees the node's whole /dev: there CUDA counts every GPU.
        renumbered = not spec.security.privileged and any(
            os.path.basename(d).removeprefix("nvidia").isdigit() for d in devices
        )
        hostname = hostname_for(sb.record["hostname"] if sb else spec.pod_name)
        env = self._env(spec, ident, renumbered, hostname if sandboxed else None)
        hidden = [str(self.state_dir), *self.hidden_paths]
        shared = list(self.shared_paths)
        expanded: list[ExpandedDir] = []
        if sandboxed:
            expanded, mounts = self._check_mounts(spec, tmp, visible_hidden(hidden, shared))
            default_cwd = "/tmp"
        else:
            mounts = []
            default_cwd = tmp
        cwd = spec.working_dir or default_cwd
        if not os.path.isabs(cwd):
            cwd = os.path.join(default_cwd, cwd)

        def node_path(p: str) -> str | None:
            if not sandboxed:
                return p
            return view_to_node(p, mounts=mounts, shared=shared, hidden=visible_hidden(hidden, shared), tmp_dir=tmp)

        make_cwd = False
        node_cwd = node_path(cwd)
        if node_cwd is None:
            raise RuntimeError_(f"working directory {cwd} is not available in the container", "CreateContainerError")
        if not os.path.isdir(node_cwd):
            # Kubernetes creates a missing workingDir. Inside a volume or /tmp that is a
            # directory on the node; elsewhere the node's filesystem is read-only, and
            # bwrap can only add it at the top level of the container's root.
            writable = [*(m.host_path for m in mounts if not m.read_only), *shared, tmp] if sandboxed else None
            if writable is None or any(node_cwd == w or node_cwd.startswith(w.rstrip("/") + "/") for w in writable):
                try:
                    _make_dirs_for(node_cwd, ident)
                except OSError as e:
                    raise RuntimeError_(f"cannot create the working directory {cwd}: {e.strerror or e}",
                                        "CreateContainerError") from e
            elif os.path.dirname(cwd.rstrip("/")) == "/":
                make_cwd = True
            else:
                raise RuntimeError_(
                    f"cannot create the working directory {cwd}: the node's filesystem is read-only in the "
                    "container (use a path inside a volume or /tmp)",
                    "CreateContainerError",
                )

        exe = _resolve(argv[0], env.get("PATH", os.defpath), cwd, node_path, ident)
        if exe is None:
            raise RuntimeError_(
                f'executable file "{argv[0]}" not found (PATH={env.get("PATH", "")})', "RunContainerError"
            )
        chain = user_chain(ident, setpriv=self._setpriv, unshare=self._unshare)
        command = [*chain, exe, *argv[1:]]
        if sandboxed:
            # Mount points inside the container's /tmp are its own placeholders: made here
            # traversable, rather than by bwrap with the modes of the node's directories
            # (the node's /tmp/x may well be private to its owner).
            for target in [*shared, *(m.container_path for m in mounts)]:
                if target.startswith("/tmp/"):
                    parent = os.path.dirname(target.rstrip("/"))
                    os.makedirs(tmp + parent[len("/tmp"):], mode=0o755, exist_ok=True)
            if sb is not None:
                hosts_path, hostname_path = str(sb.dir / "hosts"), str(sb.dir / "hostname")
                resolv = sb.dir / "resolv.conf"
                resolv_path = str(resolv) if resolv.exists() else None
                shm_dir = sb.record.get("shm_dir")
                shm_bytes = int(sb.record.get("shm_bytes") or DEFAULT_SHM_BYTES)
            else:
                hosts_path, hostname_path = str(cdir / "hosts"), str(cdir / "hostname")
                _write_file(Path(hosts_path), hosts_file(hostname, self.node_address, [], _read_text("/etc/hosts")))
                _write_file(Path(hostname_path), hostname + "\n")
                resolv_path, shm_dir, shm_bytes = None, None, DEFAULT_SHM_BYTES
            plan = Plan(
                hostname=hostname,
                root=root_entries(_listing("/")),
                tmp_dir=tmp,
                hosts_path=hosts_path,
                hostname_path=hostname_path,
                resolv_path=resolv_path,
                shm_dir=shm_dir,
                shm_bytes=shm_bytes,
                devices=devices,
                shared=shared,
                hidden=[(h, os.path.isdir(h)) for h in visible_hidden(hidden, shared) if os.path.exists(h)],
                hidden_in_mounts=_hidden_in_mounts(hidden, mounts),
                mounts=mounts,
                empty_file=str(self._empty),
                privileged=spec.security.privileged,
                read_only_root=spec.security.read_only_root_filesystem,
                mask_proc=not spec.security.unmasked_proc,
                masked=[(p, os.path.isdir(p)) for p in MASKED_PATHS if os.path.exists(p)],
                cwd=cwd,
                make_cwd=make_cwd,
                expanded=expanded,
            )
            program = [*bwrap_args(self._bwrap, plan), *command]  # type: ignore[arg-type]
            spawn_cwd = "/"
        else:
            program = command
            spawn_cwd = cwd

        log_path = self._log_path(spec)
        record = {
            "id": cid,
            "pod_uid": spec.pod_uid,
            "namespace": spec.namespace,
            "pod_name": spec.pod_name,
            "container": spec.name,
            "attempt": spec.attempt,
            "gpus": [g.index for g in spec.gpus],
            "node_name": spec.node_name,
            "sandbox_id": spec.sandbox.id if spec.sandbox else "",
            "log_path": log_path,
            "memory_limit": spec.memory_limit_bytes,
            "cgroup": None,
            "sandboxed": sandboxed,
            "cwd": cwd,
            "user": {"uid": ident.uid, "gid": ident.gid, "groups": list(ident.groups), "mode": ident.mode,
                     "capabilities": None if ident.capabilities is None else list(ident.capabilities),
                     "home": ident.home, "outer_uid": ident.outer_uid, "outer_gid": ident.outer_gid},
            "command": [exe, *argv[1:]],
        }
        return {
            "argv": program,
            "env": env,
            "cwd": spawn_cwd,
            "sandboxed": sandboxed,
            "program": argv[0],
            "cgroup_procs": [],
            "oom_file": None,
            "log_path": log_path,
            "record": record,
        }

    async def _launch(self, cdir: Path, launch: dict) -> dict:
        """Starts the monitor and waits for its word: the pids, or why it could not start."""
        env = {"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": _package_root()}
        try:
            proc = await asyncio.create_subprocess_exec(
                self.monitor_python, "-S", "-m", "gpufleet.agent.runtime.monitor", str(cdir),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True, env=env, cwd="/",
            )
        except OSError as e:
            raise RuntimeError_(f"cannot start the container's monitor: {e.strerror or e}", "RunContainerError") from e
        assert proc.stdin is not None and proc.stdout is not None
        # marshal (format 4, read by any Python 3): the monitor has no json to import.
        proc.stdin.write(marshal.dumps(launch, 4))
        with contextlib.suppress(ConnectionError):
            await proc.stdin.drain()
        proc.stdin.close()
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), _START_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if not line:
            state = mon.read_state(str(cdir)) or {}
            pid = state.get("monitor_pid")
            if pid and mon.alive(pid, state.get("monitor_start")):
                # Stuck: its death takes the sandbox with it (bwrap --die-with-parent).
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), _KILL_SETTLE_S)
            msg = state.get("message") or f"the container's monitor did not report (see {cdir}/monitor.log)"
            return {"error": msg}
        await proc.wait()
        return json.loads(line)

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

    # --- watching ------------------------------------------------------------------------

    def _adopt(self, rec: _Ctr) -> None:
        self._containers[rec.handle.id] = rec
        rec.watcher = asyncio.create_task(self._watch(rec), name=f"process-runtime:{rec.handle.id}")

    async def _watch(self, rec: _Ctr) -> None:
        try:
            if rec.monitor.alive():
                await rec.monitor.wait(self.clock)
            elif rec.main.alive():
                # A monitor that died on its own leaves a container (without a sandbox)
                # that nobody records the end of.
                await rec.main.wait(self.clock)
            rec.final = self._final(rec)
        finally:
            rec.done.set()

    def _final(self, rec: _Ctr) -> ContainerState:
        state = mon.read_state(str(rec.dir)) or rec.info
        rec.info.update(state)
        started = state.get("started_at")
        if state.get("phase") == "exited":
            code = int(state.get("exit_code") or 0)
            oom = bool(state.get("oom"))
            reason = terminated_reason(code, oom)
            if reason == "OOMKilled":
                message = f"the container exceeded its memory limit ({rec.memory_limit} bytes)"
            elif signal_name(code):
                message = f"killed by {signal_name(code)}"
            else:
                message = ""
            return ContainerState("exited", code, started, state.get("finished_at"), reason, message)
        if state.get("phase") == "failed":
            return ContainerState("exited", 128, started, state.get("finished_at"), "ContainerCannotRun",
                                  state.get("message", ""))
        return ContainerState("exited", 137, started, state.get("finished_at") or self.clock.now(),
                              "ContainerStatusUnknown", _GONE_MESSAGE)

    # --- observe ------------------------------------------------------------------------

    async def state(self, handle: ContainerHandle) -> ContainerState:
        rec = self._containers.get(handle.id)
        if rec is None:
            return ContainerState(state="unknown", message="no such container")
        if rec.final is None and not rec.main.alive():
            # The program is gone; its monitor is about to record how it ended.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rec.done.wait(), _KILL_SETTLE_S)
        if rec.final is not None:
            return rec.final
        return ContainerState(state="running", started_at=rec.started_at)

    async def wait(self, handle: ContainerHandle) -> ContainerState:
        rec = self._containers.get(handle.id)
        if rec is None:
            return ContainerState(state="unknown", message="no such container")
        await rec.done.wait()
        if rec.final is None:
            return ContainerState(state="unknown", message="no longer watched")
        return rec.final

    async def stop(self, handle: ContainerHandle, grace_seconds: float) -> ContainerState:
        """SIGTERM to the container's main process (as Kubernetes signals a container's
        PID 1), SIGKILL to everything in the sandbox after the grace period."""
        rec = self._containers.get(handle.id)
        if rec is None:
            return ContainerState(state="unknown", message="no such container")
        rec.stopping = True
        if not rec.done.is_set():
            rec.main.signal(signal.SIGTERM)
            if not await within(rec.done.wait(), self.clock, grace_seconds):
                self._kill_all(rec)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(rec.done.wait(), _KILL_SETTLE_S)
        if rec.final is None:
            return ContainerState(state="running", started_at=rec.started_at, message="still running after SIGKILL")
        return rec.final

    def _kill_all(self, rec: _Ctr) -> None:
        # The sandbox's init: its death takes its whole PID namespace.
        rec.sandbox.signal(signal.SIGKILL)
        rec.main.signal(signal.SIGKILL)
        if not rec.sandboxed and rec.main.alive():
            with contextlib.suppress(OSError):
                os.killpg(rec.main.pid, signal.SIGKILL)  # type: ignore[arg-type]
        if rec.cgroup is not None:
            for pid in rec.cgroup.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

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

    async def stats(self, handle: ContainerHandle) -> ContainerStats | None:
        rec = self._containers.get(handle.id)
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

    def _usage(self, rec: _Ctr) -> tuple[float, int]:
        """cpu seconds and resident memory of every process of the container."""
        procs: list[psutil.Process] = []
        pids = rec.cgroup.pids() if rec.cgroup is not None else []
        if pids:
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    procs.append(psutil.Process(pid))
        else:
            top = rec.sandbox if rec.sandbox.alive() else rec.main
            if top.alive():
                with contextlib.suppress(psutil.Error):
                    root = psutil.Process(top.pid)
                    procs = [root, *root.children(recursive=True)]
        cpu, rss = 0.0, 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                cpu += t.user + t.system
                rss += p.memory_info().rss
        return cpu, rss

    # --- recovery -----------------------------------------------------------------------

    async def recover(self, node_name: str) -> tuple[list[RecoveredSandbox], list[RecoveredContainer]]:
        """What earlier runs of the agent left under the state dir: each pod sandbox, and
        each container with its pod, attempt and GPUs, running (its program alive, same
        start time) or exited (with the code its monitor recorded, or
        ContainerStatusUnknown when its monitor died without recording one)."""
        sandboxes: list[RecoveredSandbox] = []
        base = self.state_dir / "sandboxes"
        for d in sorted(base.iterdir()) if base.is_dir() else []:
            sb = self._sandboxes.get(d.name) or self._load_sandbox(d.name)
            if sb is None:
                continue
            await self._ensure_shm(sb)
            r = sb.record
            sandboxes.append(RecoveredSandbox(SandboxHandle(id=sb.id), r.get("pod_uid", ""), r.get("namespace", ""),
                                              r.get("pod_name", ""), tuple(r.get("gpus") or ())))
        containers: list[RecoveredContainer] = []
        root = self.state_dir / "containers"
        for state_file in sorted(root.glob(f"*/*/*/{mon.STATE}")) if root.is_dir() else []:
            cdir = state_file.parent
            cid = str(cdir.relative_to(root))
            rec = self._containers.get(cid)
            if rec is None:
                rec = self._recover_one(cid, cdir, node_name)
                if rec is None:
                    continue
            info = rec.info
            if rec.final is None and rec.main.alive():
                state = ContainerState("running", started_at=rec.started_at)
            else:
                state = await self.state(rec.handle)
            containers.append(RecoveredContainer(
                handle=rec.handle, pod_uid=info.get("pod_uid", ""), name=info.get("container", ""),
                attempt=int(info.get("attempt") or 0), gpus=tuple(info.get("gpus") or ()), state=state,
                namespace=info.get("namespace", ""), pod_name=info.get("pod_name", ""),
                sandbox_id=info.get("sandbox_id", ""), log_path=info.get("log_path", ""),
            ))
        return sandboxes, containers

    def _recover_one(self, cid: str, cdir: Path, node_name: str) -> _Ctr | None:
        info = mon.read_state(str(cdir))
        if info is None:
            return None
        if info.get("node_name") and node_name and info["node_name"] != node_name:
            return None
        monitor = _Pid(info.get("monitor_pid"), info.get("monitor_start"))
        if info.get("phase") in ("starting", "failed") and not monitor.alive():
            # A start that never got going (the agent got, or would have got, the error).
            monitor.close()
            shutil.rmtree(cdir, ignore_errors=True)
            return None
        main = _Pid(info.get("pid"), info.get("pid_start"))
        sandbox = _Pid(info.get("sandbox_pid"), info.get("sandbox_start"))
        cgroup = None
        if info.get("cgroup") and self.cgroups is not None and self.cgroups.supported:
            with contextlib.suppress(OSError):
                cgroup = self.cgroups.create(info["cgroup"])
        env: dict[str, str] = {}
        if main.alive() or sandbox.alive():
            # The sandbox's init runs with exactly the container's environment (the
            # program may have rewritten its own); nothing kept it on disk.
            env = _environ(sandbox.pid if sandbox.alive() else main.pid)  # type: ignore[arg-type]
        u = info.get("user") or {}
        caps = u.get("capabilities")
        ident = Identity(int(u.get("uid", self.default_user[0])), int(u.get("gid", self.default_user[1])),
                         tuple(u.get("groups") or ()), u.get("mode", "host"), None if caps is None else tuple(caps),
                         u.get("home", "/"), int(u.get("outer_uid", 0)), int(u.get("outer_gid", 0)))
        rec = _Ctr(
            handle=ContainerHandle(id=cid, pid=info.get("pid")),
            dir=cdir,
            info=info,
            env=env,
            cgroup=cgroup,
            main=main,
            sandbox=sandbox,
            monitor=monitor,
            sandboxed=bool(info.get("sandboxed")),
            ident=ident,
            memory_limit=info.get("memory_limit"),
            started_mono=self.clock.monotonic(),
        )
        self._adopt(rec)
        return rec

    # --- forget -----------------------------------------------------------------------

    async def remove(self, handle: ContainerHandle) -> None:
        rec = self._containers.pop(handle.id, None)
        if rec is None:
            return
        if not rec.done.is_set():
            self._kill_all(rec)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rec.done.wait(), _KILL_SETTLE_S)
        await self._release(rec)
        rec.close()
        shutil.rmtree(rec.dir, ignore_errors=True)
        # The pod's directory goes with its last container.
        for parent in (rec.dir.parent, rec.dir.parent.parent):
            with contextlib.suppress(OSError):
                parent.rmdir()

    async def _release(self, rec: _Ctr) -> None:
        if rec.cgroup is None:
            return
        # Killed processes leave their cgroup a moment after they die.
        for _ in range(50):
            rec.cgroup.remove()
            if not any(d.exists() for d in rec.cgroup.dirs.values()):
                return
            await asyncio.sleep(0.02)
        log.warning("cgroup of %s still busy, left in place", rec.handle.id)

    async def stop_all(self, grace_seconds: float) -> None:
        """Stops every container this runtime knows (started or recovered) and the
        sandboxes' processes: what the agent calls when asked to take its pods down.
        The containers stay known (state and wait answer) until removed."""
        await asyncio.gather(*(self.stop(r.handle, grace_seconds) for r in list(self._containers.values())))

    async def close(self) -> None:
        """Stops watching; the containers run on (stop_all stops them)."""
        recs = list(self._containers.values())
        self._containers.clear()
        for rec in recs:
            if rec.watcher is not None and not rec.watcher.done():
                rec.watcher.cancel()
        for rec in recs:
            if rec.watcher is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await rec.watcher
            rec.close()


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


def _probe_bwrap(name: str | None) -> tuple[str | None, str]:
    if name is None:
        return None, "sandboxing is disabled"
    path = shutil.which(name)
    if path is None:
        return None, f"{name} (bubblewrap) is not installed"
    try:
        p = subprocess.run(
            [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--", "true"],
            capture_output=True, timeout=30, check=False,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{path} cannot run: {e}"
    if p.returncode != 0:
        return None, f"{path} cannot build a sandbox here: {p.stderr.decode(errors='replace').strip()}"
    return path, ""


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


def _hidden_in_mounts(hidden: Sequence[str], mounts: Sequence[Mount]) -> list[tuple[str, bool]]:
    """Hidden paths seen through a volume (a hostPath of a directory above the agent's
    state, say): where they appear in the container, to hide them there too."""
    out = []
    for h in hidden:
        h = os.path.normpath(h)
        if not os.path.exists(h):
            continue
        for m in mounts:
            base = os.path.normpath(m.host_path)
            if h == base or h.startswith(base.rstrip("/") + "/"):
                out.append((os.path.normpath(m.container_path + h[len(base):]), os.path.isdir(h)))
    return out


def _make_dirs_for(path: str, ident: Identity) -> None:
    """mkdir -p, the new directories owned by the container's user (on the node), so a
    working directory created for it is its own to write in."""
    new = []
    p = os.path.abspath(path)
    while not os.path.exists(p):
        new.append(p)
        p = os.path.dirname(p)
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0:
        return
    uid, gid = (ident.outer_uid, ident.outer_gid) if ident.mode == "userns" else (ident.uid, ident.gid)
    for d in new:
        os.chown(d, uid, gid)


def _make_container_dir(cdir: Path) -> None:
    try:
        cdir.mkdir(parents=True)
        os.chmod(cdir, 0o700)
        tmp = cdir / "tmp"
        tmp.mkdir()
        # The container's /tmp, as the node's own /tmp is.
        os.chmod(tmp, 0o1777)
    except OSError as e:
        raise RuntimeError_(f"cannot create the container's directory: {e.strerror or e}", "CreateContainerError") from e


def _shm_ready(record: dict) -> bool:
    """Whether the sandbox's /dev/shm is in place (a reboot takes tmpfs mounts away)."""
    d = record.get("shm_dir")
    if not d or not os.path.isdir(d):
        return False
    return not record.get("shm_mounted") or os.path.ismount(d)


def _has_cap_sys_admin() -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << 21))
    except (OSError, ValueError):
        pass
    return False


def _node_address() -> str:
    """The node's address for the pod's own name in /etc/hosts (pods share its network)."""
    with contextlib.suppress(OSError):
        addr = socket.gethostbyname(socket.gethostname())
        if not addr.startswith("127."):
            return addr
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        # No packet is sent: connect() on UDP only picks the outgoing address.
        s.connect(("10.255.255.255", 1))
        return s.getsockname()[0]
    return "127.0.1.1"


def _passwd(uid: int) -> Passwd | None:
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return None
    try:
        groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except OSError:
        groups = tuple(g.gr_gid for g in grp.getgrall() if pw.pw_name in g.gr_mem)
    return Passwd(pw.pw_name, pw.pw_gid, pw.pw_dir, groups)


def _listing(path: str) -> list[tuple[str, str, str]]:
    out = []
    for e in os.scandir(path):
        if e.is_symlink():
            out.append((e.name, "symlink", os.readlink(e.path)))
        elif e.is_dir(follow_symlinks=False):
            out.append((e.name, "dir", ""))
        elif e.is_file(follow_symlinks=False):
            out.append((e.name, "file", ""))
    return out


def _user_may_exec(path: str, ident: Identity | None) -> bool:
    """Whether the container's user looks able to run the file at ``path`` on the node,
    from the permission bits of the file and of every directory on the way. Only a hint
    for choosing among PATH entries: ACLs, and network or VM filesystems that grant more
    than their bits say, have the last word when the program runs."""
    if ident is None or os.geteuid() != 0 or ident.mode == "agent":
        return os.access(path, os.X_OK)
    if ident.mode == "host" and ident.uid == 0:
        return os.access(path, os.X_OK)
    if ident.mode == "userns":
        uid, gids = ident.outer_uid, {ident.outer_gid}
    else:
        uid, gids = ident.uid, {ident.gid, *ident.groups}

    def allowed(st: os.stat_result) -> bool:
        if st.st_uid == uid:
            return bool(st.st_mode & 0o100)
        if st.st_gid in gids:
            return bool(st.st_mode & 0o010)
        return bool(st.st_mode & 0o001)

    try:
        for p in {os.path.abspath(path), os.path.realpath(path)}:
            d = os.path.dirname(p)
            while True:
                if not allowed(os.stat(d)):
                    return False
                if d == "/":
                    break
                d = os.path.dirname(d)
        return allowed(os.stat(path))
    except OSError:
        return False


def _resolve(exe: str, path_var: str, cwd: str, node_path, ident: Identity | None = None) -> str | None:
    """The program as the container names it, if it exists there. Of the PATH entries
    that have it, the first one its user looks able to run (as its shell would pass over
    one it may not enter), else the first."""

    def exists(p: str) -> str | None:
        n = node_path(p)
        return n if n is not None and os.path.isfile(n) and os.access(n, os.X_OK) else None

    if "/" in exe:
        p = exe if os.path.isabs(exe) else os.path.normpath(os.path.join(cwd, exe))
        return p if exists(p) else None
    first = None
    for d in path_var.split(os.pathsep):
        if d and os.path.isabs(d):
            p = os.path.join(d, exe)
            n = exists(p)
            if n is None:
                continue
            if ident is None or _user_may_exec(n, ident):
                return p
            first = first or p
    return first


def _environ(pid: int) -> dict[str, str]:
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in data.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def _descendants(pid: int) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    return []


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _write_file(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _write_json(path: Path, data: dict) -> None:
    _write_file(path, json.dumps(data, sort_keys=True), 0o600)


async def _run(*argv: str) -> tuple[int, str]:
    try:
        p = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as e:
        return 127, str(e)
    _, err = await p.communicate()
    assert p.returncode is not None
    return p.returncode, err.decode(errors="replace")
