"""A pod worker's acts on its containers: start one (environment, mounts, image, the
runtime), notice its exit, run its probes, stop it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.agent import podspec, podsync
from gpufleet.agent.backoff import go_duration
from gpufleet.agent.envvars import EnvError, build_env, expand_command
from gpufleet.agent.logfiles import container_log_path
from gpufleet.agent.podcontext import NORMAL, WARNING, ContainerRecord, WorkerContext
from gpufleet.agent.probes import Prober, make_action
from gpufleet.agent.resources import (
    port_env,
    port_requests,
)
from gpufleet.agent.runtime.base import (
    ContainerHandle,
    ContainerSpec,
    ContainerState,
    GPUAssignment,
    ImagePullError,
    Mount,
    PortMapping,
    RuntimeError_,
)
from gpufleet.api.quantity import cpu_millis, to_int_bytes
from gpufleet.client import ApiError, TransportError
from gpufleet.utils.clock import rfc3339

log = logging.getLogger("gpufleet.agent.podworker")


class ContainerActs:
    """The container acts of PodWorker (mixed into it)."""

    ctx: WorkerContext
    pod: dict[str, Any]
    records: list[ContainerRecord]

    async def _start(self, rec: ContainerRecord) -> None:
        pod = self.pod
        spec = rec.spec
        image = spec.get("image") or ""
        ctx = self.ctx
        requests = port_requests(pod)
        host_network = self.uses_host_network()
        base = {"HOSTNAME": podspec.pod_hostname(pod) if not host_network else self.name}
        base.update(port_env(requests, self.ports or {}, rec.name, ctx.host_network))
        api = ctx.api_endpoint(host_network)
        if api is not None:
            host, port = podspec.API_SERVICE_HOSTNAMES[0], str(api[1])
            base.update({"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
                         "KUBERNETES_SERVICE_PORT_HTTPS": port, "KUBERNETES_PORT": f"tcp://{host}:{port}"})
        try:
            env = await build_env(self._pod_with_ips(), spec, ctx.get_object, base=base,
                                  node_allocatable=ctx.node_allocatable())
        except EnvError as exc:
            self._start_failed(rec, "CreateContainerConfigError", str(exc))
            return
        except (TransportError, ApiError) as exc:
            self._start_failed(rec, "CreateContainerConfigError", f"cannot read the environment's sources: {exc}")
            return
        env.update(self.gpu_env.get(rec.name, {}))
        command, args = expand_command(spec, env)
        mounts = []
        if ctx.volumes is not None and self.pod_volumes is not None:
            from gpufleet.agent.volumes import VolumeError

            try:
                mounts = ctx.volumes.mounts(pod, spec, self.pod_volumes, env=env)
            except VolumeError as exc:
                self._start_failed(rec, "CreateContainerConfigError", exc.message or str(exc))
                return
        checkpoint = self._checkpoint_mount(rec)
        if checkpoint is not None:
            mounts = [m for m in mounts if m.container_path != checkpoint.container_path] + [checkpoint]
        if not await self._pull(rec, image):
            return
        attempt = rec.restart_count + 1 if rec.ran else rec.restart_count
        limits = (spec.get("resources") or {}).get("limits") or {}
        gpus = ctx.gpus()
        uuid_of = {g.index: getattr(g, "uuid", "") for g in gpus}
        cspec = ContainerSpec(
            pod_uid=self.uid,
            pod_name=self.name,
            namespace=self.namespace,
            name=rec.name,
            image=image,
            command=command,
            args=args,
            env=env,
            working_dir=spec.get("workingDir"),
            ports=[PortMapping(r.name or r.key, r.container_port, (self.ports or {}).get(r.key, r.container_port),
                               r.protocol) for r in requests if r.container == rec.name],
            gpus=[GPUAssignment(i, uuid_of.get(i, "")) for i in rec.gpus],
            cpu_limit_millis=_quiet(cpu_millis, limits.get("cpu")),
            memory_limit_bytes=_quiet(to_int_bytes, limits.get("memory")),
            log_path=str(container_log_path(ctx.state_dir, self.namespace, self.name, self.uid, rec.name, attempt)),
            attempt=attempt,
            annotations=dict((pod.get("metadata") or {}).get("annotations") or {}),
            mounts=mounts,
            security=podspec.security_spec(pod, spec),
            sandbox=self.sandbox,
            node_name=ctx.node_name,
            stdin=bool(spec.get("stdin")),
            stdin_once=bool(spec.get("stdinOnce")),
            tty=bool(spec.get("tty")),
        )
        Path(cspec.log_path).parent.mkdir(parents=True, exist_ok=True)
        try:
            handle = await ctx.runtime.start(cspec)
        except RuntimeError_ as exc:
            reason = getattr(exc, "reason", "") or ("ErrImagePull" if "image" in str(exc).lower()
                                                     else "CreateContainerError")
            self._start_failed(rec, reason, str(exc))
            return
        now_mono = ctx.clock.monotonic()
        if rec.handle is not None:
            rec.old_handles.append(rec.handle)
        if rec.ran:
            rec.restart_count += 1
            rec.last_state = {"terminated": rec.last_exit} if rec.last_exit else {}
        rec.ran = True
        rec.handle = handle
        # Host processes are known by their pid; other runtimes by their container id.
        ident = handle.pid if ctx.runtime.name == "process" and handle.pid else handle.id
        rec.container_id = f"{ctx.runtime.name}://{ident}"
        rec.running = True
        rec.stopping = False
        rec.started_mono = now_mono
        rec.ready = False
        rec.started = False
        started_at = ctx.clock.now()
        with contextlib.suppress(Exception):
            st = await ctx.runtime.state(handle)
            if st.started_at:
                started_at = st.started_at
        rec.state = podsync.transition(rec.state, "started", startedAt=rfc3339(started_at))
        self._event(NORMAL, "Created", f"Created container: {rec.name}")
        self._event(NORMAL, "Started", f"Started container {rec.name}")
        self._spawn(self._wait_exit(rec, handle), rec)
        self._start_probes(rec, handle)
        ctx.on_change()

    def _checkpoint_mount(self, rec: ContainerRecord) -> Mount | None:
        """The job's checkpoint directory, the same path inside as on the node, writable by
        the container's user; created on first use."""
        path, why = podspec.checkpoint_dir(self.pod, self.ctx.checkpoint_roots)
        if why:
            if why not in self.told_notices:
                self.told_notices.add(why)
                self._event(WARNING, "CheckpointDirNotMounted", why)
            return None
        if path is None:
            return None
        sec = podspec.security_spec(self.pod, rec.spec)
        try:
            prepare_checkpoint_dir(path, sec.run_as_user, sec.fs_group if sec.fs_group is not None else sec.run_as_group)
        except OSError as exc:
            message = f"cannot prepare the checkpoint directory {path}: {exc.strerror or exc}"
            if message not in self.told_notices:
                self.told_notices.add(message)
                self._event(WARNING, "CheckpointDirNotMounted", message)
            return None
        return Mount(path, path, read_only=False)

    async def _pull(self, rec: ContainerRecord, image: str) -> bool:
        """The image, per the container's imagePullPolicy, with the pod's pull secrets."""
        ctx = self.ctx
        if "images" not in getattr(ctx.runtime, "capabilities", frozenset()):
            rec.image_id = image
            return True
        policy = podspec.pull_policy(rec.spec)
        secrets, missing = [], []
        for ref in (self.pod.get("spec") or {}).get("imagePullSecrets") or []:
            name = (ref or {}).get("name")
            if not name:
                continue
            try:
                obj = await ctx.get_object("secrets", self.namespace, name)
            except (TransportError, ApiError):
                obj = None
            if obj is None:
                missing.append(name)
            else:
                secrets.append(obj)
        if missing:
            self._event(WARNING, "FailedToRetrieveImagePullSecret",
                        f"Unable to retrieve some image pull secrets ({', '.join(missing)}); attempting to pull "
                        "the image may not succeed.")
        will_pull = policy == "Always" or not rec.image_id
        if will_pull and policy != "Never":
            self._event(NORMAL, "Pulling", f'Pulling image "{image}"')
        try:
            pulled = await ctx.runtime.ensure_image(image, policy, podspec.registry_auth(secrets))
        except ImagePullError as exc:
            rec.pull_error = exc.reason
            self._event(WARNING, "Failed", f"Failed to pull image \"{image}\": {exc}" if exc.reason == "ErrImagePull"
                        else str(exc))
            self._start_failed(rec, exc.reason, str(exc), event=False)
            self._event(WARNING, "Failed", f"Error: {exc.reason}")
            return False
        rec.pull_error = ""
        rec.image_id = pulled.image_id or pulled.image
        if pulled.pulled:
            size = f" Image size: {pulled.size_bytes} bytes." if pulled.size_bytes else ""
            took = go_duration(round(pulled.seconds, 3))
            self._event(NORMAL, "Pulled", f'Successfully pulled image "{image}" in {took} ({took} including '
                                          f"waiting).{size}")
        else:
            self._event(NORMAL, "Pulled", f'Container image "{image}" already present on machine')
        return True

    def _start_failed(self, rec: ContainerRecord, reason: str, message: str, event: bool = True) -> None:
        rec.state = podsync.transition(rec.state, "start-failed", reason, message)
        if event:
            self._event(WARNING, "Failed", f"Error: {message}")
        delay = rec.backoff.next_delay(0.0) or rec.backoff.initial
        rec.current_delay = delay
        rec.not_before = self.ctx.clock.monotonic() + delay

    async def _wait_exit(self, rec: ContainerRecord, handle: ContainerHandle) -> None:
        try:
            final = await self.ctx.runtime.wait(handle)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s/%s: waiting for the container failed: %s", self.key, rec.name, exc)
            final = ContainerState(state="exited", exit_code=-1, reason="Error", message=str(exc))
        self._exited(rec, handle, final)

    def _exited(self, rec: ContainerRecord, handle: ContainerHandle, final: ContainerState) -> None:
        if rec.handle is not handle or not rec.running:
            return
        now = self.ctx.clock.now()
        code = final.exit_code if final.exit_code is not None else -1
        reason = podsync.exit_reason(code, final.reason)
        started = (rec.state.get("running") or {}).get("startedAt") or rfc3339(final.started_at or now)
        rec.state = podsync.transition(rec.state, "exited", reason, final.message or None, exitCode=code,
                                       startedAt=started, finishedAt=rfc3339(final.finished_at or now),
                                       containerID=rec.container_id)
        rec.running = False
        rec.stopping = False
        rec.ready = False
        rec.started = False
        rec.last_exit = rec.state["terminated"]
        rec.exited_mono = self.ctx.clock.monotonic()
        rec.not_before = None
        current = asyncio.current_task()
        for task in rec.tasks:
            if task is not current:
                task.cancel()
        rec.tasks = [t for t in rec.tasks if t is current]
        self.ctx.on_change()
        self.wake()

    # -- probes -------------------------------------------------------------------------

    def _start_probes(self, rec: ContainerRecord, handle: ContainerHandle) -> None:
        kinds = podsync.probes_to_run(rec.spec, rec.init)
        if "startup" in kinds:
            self._spawn(self._probe(rec, handle, "startup", rec.spec["startupProbe"]), rec)
        elif rec.init and not podsync.is_sidecar(rec.spec, rec.init):
            rec.started = True
        else:
            rec.started = True
            self._start_health_probes(rec, handle)

    def _start_health_probes(self, rec: ContainerRecord, handle: ContainerHandle) -> None:
        kinds = podsync.health_probes(rec.spec)
        if "readiness" not in kinds:
            rec.ready = True
        for kind in kinds:
            self._spawn(self._probe(rec, handle, kind, rec.spec[f"{kind}Probe"]), rec)

    async def _probe(self, rec: ContainerRecord, handle: ContainerHandle, kind: str, probe: dict[str, Any]) -> None:
        ctx = self.ctx

        async def run_exec(command: list[str], limit_s: float) -> tuple[int, str]:
            return await ctx.runtime.exec(handle, command, limit_s)

        action = make_action(probe, host=self.pod_ip, resolve_port=lambda p: self._resolve_port(rec, p),
                             run_exec=run_exec, http=ctx.http)
        if action is None:
            log.warning("%s/%s: %s probe kind not supported; treating it as passing", self.key, rec.name, kind)
            if kind == "readiness":
                rec.ready = True
            elif kind == "startup":
                rec.started = True
                self._start_health_probes(rec, handle)
            self.wake()
            return
        label = kind.capitalize()

        def on_failure(message: str) -> None:
            if rec.handle is handle and rec.running:
                self._event(WARNING, "Unhealthy", f"{label} probe failed: {message}")

        def on_flip(ok: bool) -> None:
            if rec.handle is not handle or not rec.running:
                return
            if kind == "readiness":
                rec.ready = ok
            elif kind == "startup" and ok:
                rec.started = True
                self._start_health_probes(rec, handle)
            elif not ok:
                kill = podsync.probe_failed(rec.name, kind, probe, self._spec_grace())
                if kill is not None:
                    self._spawn(self._kill_for_restart(rec, handle, kill))
            self.wake()

        prober = Prober(kind, probe, action, ctx.clock, on_flip, on_failure, ctx.probe_period_scale)
        await prober.run()

    def _resolve_port(self, rec: ContainerRecord, port: Any) -> int | None:
        # In a network namespace of its own the pod is probed at its IP on its container port.
        ports = (self.ports or {}) if self.uses_host_network() else {}
        if isinstance(port, str) and not port.isdigit():
            for req in port_requests(self.pod):
                if req.container == rec.name and req.name == port:
                    return ports.get(req.key, req.container_port)
            return None
        number = int(port)
        # Probes come from the host, so a declared container port is reached at its host port.
        for req in port_requests(self.pod):
            if req.container == rec.name and req.container_port == number:
                return ports.get(req.key, number)
        return number

    async def _kill_for_restart(self, rec: ContainerRecord, handle: ContainerHandle, kill: podsync.Kill) -> None:
        if rec.stopping or rec.handle is not handle or not rec.running:
            return
        rec.stopping = True
        self._event(kill.event.type, kill.event.reason, kill.event.message)
        await self._stop(rec, handle, kill.grace)

    async def _stop(self, rec: ContainerRecord, handle: ContainerHandle, grace: float) -> None:
        rec.stopping = True
        try:
            final = await self.ctx.runtime.stop(handle, grace)
        except Exception as exc:
            log.warning("%s/%s: stopping the container failed: %s", self.key, rec.name, exc)
            final = ContainerState(state="exited", exit_code=137, reason="Error", message=str(exc))
        self._exited(rec, handle, final)

def prepare_checkpoint_dir(path: str, uid: int | None, gid: int | None) -> None:
    """Make the directory; the container's user owns it when known (the agent may chown),
    else anyone may write it (its parents stay closed to listing by others)."""
    import os

    os.makedirs(path, exist_ok=True)
    if os.geteuid() == 0 and uid is not None:
        os.chown(path, uid, gid if gid is not None else -1)
        os.chmod(path, 0o770)
    else:
        os.chmod(path, 0o777)



def _quiet(fn: Callable[[Any], int], value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(fn(value))
    except (ValueError, TypeError):
        return None

