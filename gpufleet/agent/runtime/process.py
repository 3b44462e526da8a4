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

The parts: process_launch.py (the launch and the sandbox arguments), process_exec.py
(exec), process_recovery.py (recovery), process_records.py and process_host.py.

cpu and memory limits and OOM detection use the container's cgroup (cgroups.py), which
every process of the sandbox is in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import psutil

from gpufleet.agent.runtime import monitor as mon
from gpufleet.agent.runtime._common import safe_name, signal_name, terminated_reason, within
from gpufleet.agent.runtime.base import (
    ContainerHandle,
    ContainerSpec,
    ContainerState,
    ContainerStats,
    PulledImage,
    RegistryAuth,
    RuntimeError_,
    SandboxHandle,
    SandboxSpec,
)
from gpufleet.agent.runtime.cgroups import Cgroup, Cgroups
from gpufleet.agent.runtime.process_exec import ExecMixin
from gpufleet.agent.runtime.process_host import (
    _GONE_MESSAGE,
    _KILL_SETTLE_S,
    DEFAULT_HOST_IMAGES,
    DEFAULT_USER,
    _has_cap_sys_admin,
    _make_container_dir,
    _node_address,
    _probe_bwrap,
    _read_text,
    _run,
    _shm_ready,
    _write_file,
    _write_json,
)
from gpufleet.agent.runtime.process_launch import LaunchMixin
from gpufleet.agent.runtime.process_records import _Ctr, _Pid, _Sandbox
from gpufleet.agent.runtime.process_recovery import RecoveryMixin
from gpufleet.agent.runtime.sandbox import (
    DEFAULT_SHM_BYTES,
    hostname_for,
    hosts_file,
    resolv_conf,
)
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)


class ProcessRuntime(LaunchMixin, ExecMixin, RecoveryMixin):
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
