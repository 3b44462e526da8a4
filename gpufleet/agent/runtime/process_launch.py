"""Building a container's launch: its log path, devices, environment, mounts and the
bubblewrap arguments of its sandbox, then starting its monitor."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import marshal
import os
import signal
from pathlib import Path

from gpufleet.agent.runtime import monitor as mon
from gpufleet.agent.runtime._common import safe_name
from gpufleet.agent.runtime.base import (
    ContainerSpec,
    Mount,
    RuntimeError_,
)
from gpufleet.agent.runtime.gpuenv import CUDA_VISIBLE_DEVICES, gpu_env
from gpufleet.agent.runtime.process_host import (
    _INHERITED_ENV,
    _KILL_SETTLE_S,
    _START_TIMEOUT_S,
    _hidden_in_mounts,
    _listing,
    _make_dirs_for,
    _package_root,
    _passwd,
    _read_text,
    _resolve,
    _run,
    _write_file,
)
from gpufleet.agent.runtime.process_records import _Sandbox
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
    resolve_identity,
    root_entries,
    user_chain,
    view_to_node,
    visible_hidden,
)

log = logging.getLogger(__name__)

class LaunchMixin:
    """ProcessRuntime's launch building (see process.py)."""

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
