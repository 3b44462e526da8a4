"""Finding again what earlier runs of the agent left under the state dir: each pod
sandbox, and each container, running or with how it ended."""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path

from gpufleet.agent.runtime import monitor as mon
from gpufleet.agent.runtime.base import (
    ContainerHandle,
    ContainerState,
    RecoveredContainer,
    RecoveredSandbox,
    SandboxHandle,
)
from gpufleet.agent.runtime.process_host import _environ
from gpufleet.agent.runtime.process_records import _Ctr, _Pid
from gpufleet.agent.runtime.sandbox import (
    Identity,
)

log = logging.getLogger(__name__)

class RecoveryMixin:
    """ProcessRuntime's recovery (see process.py)."""

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
