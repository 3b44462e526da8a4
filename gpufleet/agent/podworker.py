"""One worker per pod: drives the pod's containers to what its spec asks for, and reports
what it sees through the pod's status.

Level-triggered, as the kubelet's pod workers are: every pass reads the pod as it is now and
the containers as they are now, acts on the difference (start, restart after back-off,
kill on a failed probe, stop for deletion), then writes status if it changed. Anything that
happens in between (an exit, a probe flipping, a new version of the pod) only wakes the
worker up for another pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpufleet.agent import podspec, podstatus
from gpufleet.agent.backoff import RestartBackoff, go_duration
from gpufleet.agent.envvars import EnvError, build_env, expand_command
from gpufleet.agent.logfiles import container_log_path
from gpufleet.agent.probes import Prober, make_action
from gpufleet.agent.resources import (
    HOST_PORTS_ANNOTATION,
    GPUTable,
    PortsUnavailable,
    PortTable,
    parse_host_ports,
    port_env,
    port_requests,
    split_gpus,
)
from gpufleet.agent.runtime.base import (
    ContainerHandle,
    ContainerSpec,
    ContainerState,
    GPUAssignment,
    ImagePullError,
    Mount,
    PortMapping,
    RecoveredContainer,
    Runtime,
    RuntimeError_,
    SandboxHandle,
    SandboxSpec,
)
from gpufleet.api.gpu import GPU_INDICES_ANNOTATION, format_gpu_indices, parse_gpu_indices
from gpufleet.api.podresources import pod_gpu_request
from gpufleet.api.quantity import cpu_millis, to_int_bytes
from gpufleet.client import ApiError, Client, Conflict, EventRecorder, NotFound, TransportError
from gpufleet.utils.clock import Clock, parse_rfc3339, rfc3339

log = logging.getLogger(__name__)

NORMAL, WARNING = "Normal", "Warning"
# A pod condition saying what the node's runtime could not honour (an image on the process
# runtime, a user it cannot switch to...), beside the Event of the same reason.
RUNTIME_LIMITATION = "gpufleet.io/RuntimeLimitation"
# How often an idle worker re-checks its pod anyway (status retries, deadlines).
_RESYNC = 10.0
_RETRY_RESOURCES = 2.0

ObjectGetter = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]


@dataclass
class WorkerContext:
    """What a pod worker needs from its agent; the agent fills it once."""

    client: Client
    runtime: Runtime
    recorder: EventRecorder
    clock: Clock
    node_name: str
    address: str
    state_dir: Path
    gpu_table: GPUTable
    port_table: PortTable
    get_object: ObjectGetter
    # -> the node's GPUs as the device plugin fingerprints them (objects with index, uuid, health, group)
    gpus: Callable[[], list[Any]]
    reserve: Callable[[list[int]], Awaitable[dict[str, str]]]
    node_allocatable: Callable[[], dict[str, Any]]
    describe_uid: Callable[[str], str]
    http: httpx.AsyncClient
    # Containers share the host's network (process, simulated): they listen on their host port.
    host_network: bool = True
    backoff_initial: float = 10.0
    backoff_cap: float = 300.0
    backoff_reset: float = 600.0
    probe_period_scale: float = 1.0
    on_change: Callable[[], None] = lambda: None
    # The node's volume manager (agent/volumes.py); None: volumes are not mounted.
    volumes: Any = None
    # How programs in pods reach the API server: the address /etc/hosts gives
    # kubernetes.default.svc, and the port (KUBERNETES_SERVICE_HOST/PORT). None: not offered.
    api_endpoint: Callable[[bool], tuple[str, int] | None] = lambda host_network: None
    # Where pod sandboxes keep their files.
    sandbox_root: Path | None = None
    # Where training checkpoint directories may be mounted from (see podspec.checkpoint_dir).
    checkpoint_roots: tuple[str, ...] = ("/var/tmp/gpufleet/checkpoints",)
    # False while the node's pod network is being made: sandboxes wait for it.
    network_ready: Callable[[], bool] = lambda: True


@dataclass
class ContainerRecord:
    spec: dict[str, Any]
    init: bool
    backoff: RestartBackoff
    restart_count: int = 0
    # Started at least once (by this agent or, before a restart of the agent, by another).
    ran: bool = False
    # The image as pulled (what the status reports as imageID), and the last pull's failure.
    image_id: str = ""
    pull_error: str = ""
    handle: ContainerHandle | None = None
    container_id: str = ""
    running: bool = False
    stopping: bool = False
    state: dict[str, Any] = field(default_factory=dict)
    last_state: dict[str, Any] = field(default_factory=dict)
    last_exit: dict[str, Any] | None = None
    started_mono: float = 0.0
    exited_mono: float = 0.0
    # Monotonic time before which the container must not be (re)started.
    not_before: float | None = None
    current_delay: float = 0.0
    ready: bool = False
    started: bool = False
    gpus: list[int] = field(default_factory=list)
    tasks: list[asyncio.Task] = field(default_factory=list)
    old_handles: list[ContainerHandle] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.get("name", "")


class PodWorker:
    def __init__(self, ctx: WorkerContext, pod: dict[str, Any],
                 recovered: list[RecoveredContainer] | None = None,
                 sandbox: SandboxHandle | None = None) -> None:
        self.ctx = ctx
        self.pod = pod
        # What an earlier run of the agent started for this pod and the runtime still has.
        self.recovered = list(recovered or [])
        self.sandbox: SandboxHandle | None = sandbox
        self.pod_volumes: Any = None
        self.volume_error: tuple[str, str] | None = None
        self.told_unhonoured = False
        self.unhonoured: list[str] = []
        self.told_notices: set[str] = set()
        meta = pod.get("metadata") or {}
        self.uid: str = meta.get("uid", "")
        self.namespace: str = meta.get("namespace", "default")
        self.name: str = meta.get("name", "")
        self.removed = False
        self.terminal: str | None = None
        self.deleted = False
        self.killed = False
        self.start_time: str | None = None
        self.ports: dict[str, int] | None = None
        self.gpu_indices: list[int] | None = None
        self.gpu_env: dict[str, dict[str, str]] = {}
        self.chose_gpus = False
        self.metadata_synced = False
        self.last_written: dict[str, Any] | None = None
        self.write_retry_at: float | None = None
        self.write_backoff = 0.5
        self.blocked: tuple[str, str] | None = None  # (reason, message) while resources are unavailable
        self.deadline_exceeded = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._bg: set[asyncio.Task] = set()
        spec = pod.get("spec") or {}
        self.records: list[ContainerRecord] = []
        for c in spec.get("initContainers") or []:
            self.records.append(self._record(c, init=True))
        for c in spec.get("containers") or []:
            self.records.append(self._record(c, init=False))

    def _record(self, spec: dict[str, Any], init: bool) -> ContainerRecord:
        rec = ContainerRecord(spec=spec, init=init, backoff=RestartBackoff(
            self.ctx.backoff_initial, self.ctx.backoff_cap, self.ctx.backoff_reset))
        rec.state = {"waiting": {"reason": "PodInitializing" if init or self._has_init() else "ContainerCreating"}}
        return rec

    def _has_init(self) -> bool:
        return bool((self.pod.get("spec") or {}).get("initContainers"))

    # -- outside view -------------------------------------------------------------------

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=f"pod:{self.key}")

    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self.wake()

    def remove(self) -> None:
        self.removed = True
        self.wake()

    def wake(self) -> None:
        self._wake.set()

    async def join(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def cancel(self) -> None:
        """Stop the worker without touching its containers (the agent is shutting down)."""
        if self._task is not None:
            self._task.cancel()
            await self.join()

    async def shut_down(self, grace: float) -> None:
        """Stop the worker and its containers, sandbox and volumes, leaving the pod object as
        it is (the node goes away with its pods; a later agent starts them again)."""
        await self.cancel()
        handles = [(r, r.handle) for r in self.records if r.running and r.handle is not None]
        runtime = self.ctx.runtime
        for _, h in handles:
            with contextlib.suppress(Exception):
                await runtime.stop(h, grace)
        for r in self.records:
            for h in [*r.old_handles, r.handle]:
                if h is not None:
                    with contextlib.suppress(Exception):
                        await runtime.remove(h)
        await self._teardown_sandbox()

    @property
    def done(self) -> bool:
        return self._task is not None and self._task.done()

    def record_for(self, container: str) -> ContainerRecord | None:
        return next((r for r in self.records if r.name == container), None)

    def running_handles(self) -> list[tuple[ContainerRecord, ContainerHandle]]:
        return [(r, r.handle) for r in self.records if r.running and r.handle is not None]

    # -- the loop -----------------------------------------------------------------------

    async def run(self) -> None:
        try:
            self._adopt()
            self._resume_adopted()
            while True:
                self._wake.clear()
                if self.removed:
                    await self._kill_all(self._grace(), "the pod was removed from the node")
                    return
                try:
                    wake_at = await self._pass()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # A bug must not orphan the pod's containers: report it and try again.
                    log.exception("pod worker %s: sync failed", self.key)
                    wake_at = self.ctx.clock.monotonic() + 1.0
                await self._sleep(wake_at)
        finally:
            self._cleanup()

    async def _pass(self) -> float | None:
        if (self.pod.get("metadata") or {}).get("deletionTimestamp"):
            wake_at = await self._terminate()
        else:
            wake_at = await self._sync()
        return _earliest(wake_at, await self._write_status())

    async def _sleep(self, deadline: float | None) -> None:
        now = self.ctx.clock.monotonic()
        timeout = _RESYNC if deadline is None else min(max(deadline - now, 0.0), _RESYNC)
        if self._wake.is_set():
            return
        waiter = asyncio.ensure_future(self._wake.wait())
        sleeper = asyncio.ensure_future(self.ctx.clock.sleep(timeout))
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            sleeper.cancel()

    def _spawn(self, coro: Awaitable[Any], rec: ContainerRecord | None = None) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        if rec is not None:
            rec.tasks.append(task)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        return task

    def _cleanup(self) -> None:
        for task in list(self._bg):
            task.cancel()
        self._release()
        handles = [h for r in self.records for h in [*r.old_handles, r.handle] if h is not None]
        if self.removed or self.deleted:
            runtime = self.ctx.runtime

            async def forget() -> None:
                for h in handles:
                    with contextlib.suppress(Exception):
                        await runtime.remove(h)
                await self._teardown_sandbox()

            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().create_task(forget())

    def _release(self) -> None:
        self.ctx.gpu_table.release(self.uid)
        self.ctx.port_table.release(self.uid)

    # -- adopting what an earlier agent reported -------------------------------------------

    def _adopt(self) -> None:
        """Pick up from the status an earlier run of the agent wrote and from what the
        runtime still runs for this pod: keep restart counts and finished init containers,
        re-adopt containers that are still there (running ones keep running; their exits are
        reported as they really were), treat the rest it had running as lost, and leave a
        finished pod finished."""
        status = self.pod.get("status") or {}
        self.start_time = status.get("startTime")
        if status.get("phase") in ("Succeeded", "Failed"):
            self.terminal = status["phase"]
        ann = (self.pod.get("metadata") or {}).get("annotations") or {}
        self.metadata_synced = (HOST_PORTS_ANNOTATION in ann or not port_requests(self.pod)
                                or not self.ctx.host_network)
        by_name = {cs.get("name"): cs for cs in [*(status.get("initContainerStatuses") or []),
                                                 *(status.get("containerStatuses") or [])]}
        found = self._latest_recovered()
        for rec in self.records:
            cs = by_name.get(rec.name) or {}
            rec.restart_count = int(cs.get("restartCount") or 0)
            rec.container_id = cs.get("containerID") or ""
            rec.image_id = cs.get("imageID") or ""
            state = cs.get("state") or {}
            last = (cs.get("lastState") or {}).get("terminated")
            if self.terminal:
                rec.state, rec.last_state = state, cs.get("lastState") or {}
                rec.ready, rec.started = bool(cs.get("ready")), bool(cs.get("started"))
                continue
            again = found.get(rec.name)
            if again is not None:
                self._adopt_container(rec, again, cs)
                continue
            if not cs:
                continue
            if "terminated" in state:
                rec.ran = True
                rec.last_exit = state["terminated"]
                rec.state = {"terminated": state["terminated"]}
                rec.last_state = cs.get("lastState") or {}
            elif "running" in state:
                rec.ran = True
                rec.last_exit = {"exitCode": 137, "reason": "ContainerStatusUnknown",
                                 "message": "The container could not be located when the agent restarted",
                                 "startedAt": state["running"].get("startedAt"),
                                 "finishedAt": rfc3339(self.ctx.clock.now())}
                rec.state = {"terminated": rec.last_exit}
            elif last is not None:
                rec.ran = True
                rec.last_exit = last
                rec.state = {"terminated": last}
            if rec.ran:
                rec.exited_mono = self.ctx.clock.monotonic()

    def _latest_recovered(self) -> dict[str, RecoveredContainer]:
        """The newest attempt of each container the runtime still has; older attempts (and
        containers the pod no longer declares) are removed."""
        latest: dict[str, RecoveredContainer] = {}
        names = {r.name for r in self.records}
        stale: list[RecoveredContainer] = []
        for c in sorted(self.recovered, key=lambda c: c.attempt):
            if c.name not in names or self.terminal:
                stale.append(c)
                continue
            if c.name in latest:
                stale.append(latest[c.name])
            latest[c.name] = c
        self.recovered = []
        for c in stale:
            self._spawn(self._discard(c))
        return latest

    async def _discard(self, c: RecoveredContainer) -> None:
        with contextlib.suppress(Exception):
            if c.state.state == "running":
                await self.ctx.runtime.stop(c.handle, 0)
            await self.ctx.runtime.remove(c.handle)

    def _adopt_container(self, rec: ContainerRecord, c: RecoveredContainer, cs: Mapping[str, Any]) -> None:
        rec.ran = True
        rec.handle = c.handle
        rec.restart_count = max(rec.restart_count, c.attempt)
        ident = c.handle.pid if self.ctx.runtime.name == "process" and c.handle.pid else c.handle.id
        rec.container_id = f"{self.ctx.runtime.name}://{ident}"
        rec.gpus = list(c.gpus)
        rec.last_state = dict(cs.get("lastState") or {})
        if rec.last_state.get("terminated"):
            rec.last_exit = rec.last_state["terminated"]
        started = c.state.started_at or self.ctx.clock.now()
        if c.state.state == "running":
            rec.running = True
            rec.started_mono = self.ctx.clock.monotonic() - max(self.ctx.clock.now() - started, 0.0)
            rec.state = {"running": {"startedAt": rfc3339(started)}}
            log.info("%s/%s: adopted the running container %s", self.key, rec.name, c.handle.id)
            return
        code = c.state.exit_code if c.state.exit_code is not None else 137
        term: dict[str, Any] = {
            "exitCode": code,
            "reason": c.state.reason or ("Completed" if code == 0 else "Error"),
            "startedAt": rfc3339(started),
            "finishedAt": rfc3339(c.state.finished_at or self.ctx.clock.now()),
            "containerID": rec.container_id,
        }
        if c.state.message:
            term["message"] = c.state.message
        rec.last_exit = term
        rec.state = {"terminated": term}
        rec.exited_mono = self.ctx.clock.monotonic()
        rec.old_handles.append(c.handle)
        rec.handle = None

    def _resume_adopted(self) -> None:
        """Watch the adopted containers: their exits, and their probes from scratch."""
        for rec in self.records:
            if rec.running and rec.handle is not None and not rec.tasks:
                self._spawn(self._wait_exit(rec, rec.handle), rec)
                self._start_probes(rec, rec.handle)

    # -- the normal pass ----------------------------------------------------------------

    def _policy(self) -> str:
        return (self.pod.get("spec") or {}).get("restartPolicy") or "Always"

    def _should_restart(self, rec: ContainerRecord) -> bool:
        if rec.init:
            code = (rec.last_exit or {}).get("exitCode", 0)
            return code != 0 and self._policy() != "Never"
        policy = self._policy()
        if policy == "Always":
            return True
        if policy == "OnFailure":
            return (rec.last_exit or {}).get("exitCode", 0) != 0
        return False

    async def _sync(self) -> float | None:
        if self.terminal:
            self._release()
            return None
        now = self.ctx.clock.monotonic()
        if self._active_deadline_passed():
            self.deadline_exceeded = True
            await self._kill_all(self._grace(), "the pod's active deadline passed")
            self._finish("Failed")
            return None
        if not await self._acquire():
            return now + _RETRY_RESOURCES
        await self._sync_metadata()
        if self.start_time is None:
            self.start_time = rfc3339(self.ctx.clock.now())
        if not await self._setup_volumes() or not await self._ensure_sandbox():
            return now + _RETRY_RESOURCES

        for rec in self.records:
            if not rec.init:
                break
            if rec.running or rec.stopping:
                return None
            if rec.ran and (rec.last_exit or {}).get("exitCode", 0) == 0 and "terminated" in rec.state:
                continue
            if rec.ran and not self._should_restart(rec):
                self._finish("Failed")
                return None
            return await self._start_when_due(rec, now)

        deadlines: list[float] = []
        for rec in self.records:
            if rec.init or rec.running or rec.stopping:
                continue
            if rec.ran and not self._should_restart(rec):
                continue
            when = await self._start_when_due(rec, now)
            if when is not None:
                deadlines.append(when)

        phase = self._phase()
        if phase in ("Succeeded", "Failed"):
            self._finish(phase)
            return None
        deadline = self._active_deadline_in()
        if deadline is not None:
            deadlines.append(now + deadline)
        return min(deadlines) if deadlines else None

    def _finish(self, phase: str) -> None:
        self.terminal = phase
        for rec in self.records:
            for task in rec.tasks:
                task.cancel()
            rec.tasks.clear()
            rec.ready = False
        self._release()
        if self.sandbox is not None and not self.killed:
            # A finished pod keeps its status and logs, not its network namespace.
            self._spawn(self.ctx.runtime.stop_sandbox(self.sandbox))

    def _active_deadline_in(self) -> float | None:
        """Seconds until spec.activeDeadlineSeconds runs out (None without one)."""
        deadline = (self.pod.get("spec") or {}).get("activeDeadlineSeconds")
        if not deadline or not self.start_time:
            return None
        try:
            started = parse_rfc3339(self.start_time)
        except ValueError:
            return None
        return started + float(deadline) - self.ctx.clock.now()

    def _active_deadline_passed(self) -> bool:
        left = self._active_deadline_in()
        return left is not None and left <= 0

    async def _start_when_due(self, rec: ContainerRecord, now: float) -> float | None:
        """Start the container now, or say when it may be (CrashLoopBackOff until then)."""
        if rec.not_before is None:
            delay = 0.0
            if rec.ran:
                ran_for = max(rec.exited_mono - rec.started_mono, 0.0)
                delay = rec.backoff.next_delay(ran_for)
            rec.current_delay = delay
            rec.not_before = (rec.exited_mono if rec.ran else now) + delay
        if now < rec.not_before:
            waiting = rec.state.get("waiting") or {}
            if rec.pull_error and waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
                if waiting.get("reason") == "ErrImagePull":
                    image = rec.spec.get("image") or ""
                    self._event(NORMAL, "BackOff", f'Back-off pulling image "{image}"')
                    self._event(WARNING, "Failed", "Error: ImagePullBackOff")
                    rec.state = {"waiting": {"reason": "ImagePullBackOff",
                                             "message": f'Back-off pulling image "{image}": ErrImagePull: '
                                                        f'{waiting.get("message", "")}'}}
                return rec.not_before
            if rec.ran and rec.last_exit is not None:
                reason = "CrashLoopBackOff"
                message = (f"back-off {go_duration(rec.current_delay)} restarting failed container={rec.name} "
                           f"pod={self.name}_{self.namespace}({self.uid})")
                if (rec.state.get("waiting") or {}).get("reason") != reason:
                    self._event(WARNING, "BackOff",
                                f"Back-off restarting failed container {rec.name} in pod "
                                f"{self.name}_{self.namespace}({self.uid})")
                rec.state = {"waiting": {"reason": reason, "message": message}}
                rec.last_state = {"terminated": rec.last_exit}
            return rec.not_before
        rec.not_before = None
        await self._start(rec)
        return rec.not_before

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
        rec.state = {"running": {"startedAt": rfc3339(started_at)}}
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
        rec.state = {"waiting": {"reason": reason, "message": message}}
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
        reason = final.reason or ("Completed" if code == 0 else "Error")
        started = (rec.state.get("running") or {}).get("startedAt") or rfc3339(final.started_at or now)
        term: dict[str, Any] = {
            "exitCode": code,
            "reason": reason,
            "startedAt": started,
            "finishedAt": rfc3339(final.finished_at or now),
            "containerID": rec.container_id,
        }
        if final.message:
            term["message"] = final.message
        rec.running = False
        rec.stopping = False
        rec.ready = False
        rec.started = False
        rec.last_exit = term
        rec.state = {"terminated": term}
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
        if rec.init:
            rec.started = True
            return
        startup = rec.spec.get("startupProbe")
        if startup:
            self._spawn(self._probe(rec, handle, "startup", startup), rec)
        else:
            rec.started = True
            self._start_health_probes(rec, handle)

    def _start_health_probes(self, rec: ContainerRecord, handle: ContainerHandle) -> None:
        readiness = rec.spec.get("readinessProbe")
        liveness = rec.spec.get("livenessProbe")
        if readiness:
            self._spawn(self._probe(rec, handle, "readiness", readiness), rec)
        else:
            rec.ready = True
        if liveness:
            self._spawn(self._probe(rec, handle, "liveness", liveness), rec)

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
                self._spawn(self._kill_for_restart(rec, handle, kind, probe))
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

    async def _kill_for_restart(self, rec: ContainerRecord, handle: ContainerHandle, kind: str,
                                probe: Mapping[str, Any]) -> None:
        if rec.stopping or rec.handle is not handle or not rec.running:
            return
        rec.stopping = True
        self._event(NORMAL, "Killing", f"Container {rec.name} failed {kind} probe, will be restarted")
        grace = probe.get("terminationGracePeriodSeconds")
        if grace is None:
            grace = self._spec_grace()
        await self._stop(rec, handle, float(grace))

    async def _stop(self, rec: ContainerRecord, handle: ContainerHandle, grace: float) -> None:
        rec.stopping = True
        try:
            final = await self.ctx.runtime.stop(handle, grace)
        except Exception as exc:
            log.warning("%s/%s: stopping the container failed: %s", self.key, rec.name, exc)
            final = ContainerState(state="exited", exit_code=137, reason="Error", message=str(exc))
        self._exited(rec, handle, final)

    # -- termination --------------------------------------------------------------------

    def _spec_grace(self) -> float:
        value = (self.pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        return float(30 if value is None else value)

    def _grace(self) -> float:
        meta = self.pod.get("metadata") or {}
        value = meta.get("deletionGracePeriodSeconds")
        return float(value) if value is not None else self._spec_grace()

    async def _kill_all(self, grace: float, why: str) -> None:
        live = self.running_handles()
        for rec, _ in live:
            self._event(NORMAL, "Killing", f"Stopping container {rec.name}")
        if live:
            log.info("%s: stopping %d container(s): %s", self.key, len(live), why)
            await asyncio.gather(*(self._stop(rec, h, grace) for rec, h in live))
        self.killed = True

    async def _terminate(self) -> float | None:
        """Graceful deletion: stop every container within the pod's grace period, report the
        final status, then delete the pod object for good (grace 0, only this uid)."""
        if self.deleted:
            return None
        if not self.killed:
            await self._kill_all(self._grace(), "the pod is being deleted")
            if self.sandbox is not None:
                with contextlib.suppress(Exception):
                    await self.ctx.runtime.stop_sandbox(self.sandbox)
            if self.terminal is None:
                self.terminal = podstatus.terminal_phase(self._statuses(init=False))
            self._finish(self.terminal)
            await self._write_status(final=True)
        try:
            await self.ctx.client.delete("pods", self.name, self.namespace, grace_period_seconds=0,
                                         preconditions_uid=self.uid, raw=True)
        except (NotFound, Conflict):
            pass
        except (TransportError, ApiError) as exc:
            log.warning("%s: deleting the pod failed (%s); retrying", self.key, exc)
            return self.ctx.clock.monotonic() + 1.0
        self.deleted = True
        return None

    # -- volumes and the sandbox ----------------------------------------------------------

    async def _setup_volumes(self) -> bool:
        """Every volume ready (and config maps, secrets, tokens refreshed); False while one
        cannot be: the containers wait in ContainerCreating with the reason in an Event."""
        vm = self.ctx.volumes
        if vm is None:
            return True
        from gpufleet.agent.volumes import VolumeError

        try:
            self.pod_volumes = await vm.setup(self.pod)
        except VolumeError as exc:
            return self._volume_failed(exc.reason or "FailedMount", exc.message or str(exc))
        except (TransportError, ApiError) as exc:
            return self._volume_failed("FailedMount", f"cannot read the pod's volume sources: {exc}")
        for notice in getattr(self.pod_volumes, "notices", None) or []:
            if notice not in self.told_notices:
                self.told_notices.add(notice)
                self._event(WARNING, "VolumeNotice", notice)
        if self.volume_error is not None:
            self.volume_error = None
            self._unblock(("ContainerCreating",))
        return True

    def _volume_failed(self, reason: str, message: str) -> bool:
        if self.volume_error != (reason, message):
            self._event(WARNING, reason, message)
        self.volume_error = (reason, message)
        for rec in self.records:
            if not rec.ran and not rec.running:
                rec.state = {"waiting": {"reason": "PodInitializing" if rec.init or self._has_init()
                                         else "ContainerCreating"}}
        return False

    def _unblock(self, reasons: tuple[str, ...]) -> None:
        for rec in self.records:
            if (rec.state.get("waiting") or {}).get("reason") in reasons:
                rec.state = {"waiting": {"reason": "PodInitializing" if rec.init or self._has_init()
                                         else "ContainerCreating"}}

    def uses_host_network(self) -> bool:
        return bool((self.pod.get("spec") or {}).get("hostNetwork")) or self.ctx.host_network

    async def _ensure_sandbox(self) -> bool:
        if self.sandbox is not None:
            return True
        ctx = self.ctx
        spec = self.pod.get("spec") or {}
        if not spec.get("hostNetwork") and not ctx.network_ready():
            self.blocked = ("NetworkNotReady", "the node's pod network is not ready yet")
            return False
        api = ctx.api_endpoint(self.uses_host_network())
        shm = ctx.volumes.shm_size(self.pod) if ctx.volumes is not None else None
        root = ctx.sandbox_root or (ctx.state_dir / "sandboxes")
        sandbox = SandboxSpec(
            pod_uid=self.uid, pod_name=self.name, namespace=self.namespace,
            hostname=podspec.pod_hostname(self.pod), directory=str(root / self.uid),
            host_network=bool(spec.get("hostNetwork")), host_pid=bool(spec.get("hostPID")),
            host_ipc=bool(spec.get("hostIPC")), shm_size_bytes=shm,
            ports=[PortMapping(r.name or r.key, r.container_port, int(r.host_port), r.protocol)
                   for r in port_requests(self.pod) if r.host_port],
            hosts=podspec.host_aliases(self.pod, api[0] if api else None),
            sysctls=podspec.sysctls(self.pod), gpus=list(self.gpu_indices or []),
            labels={"node": ctx.node_name},
        )
        try:
            self.sandbox = await ctx.runtime.run_sandbox(sandbox)
        except RuntimeError_ as exc:
            message = f"Failed to create pod sandbox: {exc}"
            if self.blocked != ("FailedCreatePodSandBox", message):
                self._event(WARNING, "FailedCreatePodSandBox", message)
            self.blocked = ("FailedCreatePodSandBox", message)
            return False
        if self.blocked is not None and self.blocked[0] == "FailedCreatePodSandBox":
            self.blocked = None
        self._tell_unhonoured()
        return True

    @property
    def pod_ip(self) -> str:
        if self.sandbox is not None and self.sandbox.ip:
            return self.sandbox.ip
        return self.ctx.address

    def _tell_unhonoured(self) -> None:
        """What the node's runtime cannot do for this pod, said once as an Event and kept
        as a condition, never silently dropped."""
        if self.told_unhonoured:
            return
        self.told_unhonoured = True
        runtime = self.ctx.runtime
        caps = getattr(runtime, "capabilities", frozenset())
        honoured = getattr(runtime, "image_honoured", None)
        images = {str(r.spec.get("image") or "") for r in self.records}
        host_image = honoured is not None and all(honoured(i) for i in images)
        problems = podspec.unhonoured(self.pod, caps, host_image)
        self.unhonoured = problems
        if problems:
            self._event(WARNING, "RuntimeLimitation", f"the {runtime.name} runtime: " + "; ".join(problems))

    async def _teardown_sandbox(self) -> None:
        if self.sandbox is not None:
            with contextlib.suppress(Exception):
                await self.ctx.runtime.stop_sandbox(self.sandbox)
            with contextlib.suppress(Exception):
                await self.ctx.runtime.remove_sandbox(self.sandbox)
            self.sandbox = None
        if self.ctx.volumes is not None:
            with contextlib.suppress(Exception):
                await self.ctx.volumes.teardown(self.uid)

    # -- resources ----------------------------------------------------------------------

    async def _acquire(self) -> bool:
        """GPUs and host ports for the pod, once; False (and a waiting reason) while what it
        needs is held by another pod."""
        if self.gpu_indices is not None and self.ports is not None:
            return True
        ctx = self.ctx
        ann = (self.pod.get("metadata") or {}).get("annotations") or {}
        need = pod_gpu_request(self.pod)
        gpus = ctx.gpus()
        known = {g.index: g for g in gpus}
        if self.gpu_indices is None:
            text = (ann.get(GPU_INDICES_ANNOTATION) or "").strip()
            if text:
                indices = list(parse_gpu_indices(text))
                missing = [i for i in indices if i not in known]
                if missing:
                    return self._blocked("GPUsUnavailable", f"GPU {missing[0]} does not exist on node {ctx.node_name}")
                if len(indices) < need:
                    return self._blocked("GPUsUnavailable", f"the pod requests {need} GPUs but its "
                                         f"{GPU_INDICES_ANNOTATION} annotation names {len(indices)}")
            elif need:
                chosen = ctx.gpu_table.choose(self.uid, need, gpus)
                if chosen is None:
                    free = len([g for g in gpus if ctx.gpu_table.owner.get(g.index, self.uid) == self.uid])
                    return self._blocked("GPUsUnavailable", f"the pod requests {need} GPUs, {free} of "
                                         f"{len(gpus)} are free on node {ctx.node_name}")
                indices = chosen
                self.chose_gpus = True
            else:
                indices = []
            conflicts = ctx.gpu_table.conflicts(self.uid, indices)
            if conflicts:
                index, holder = sorted(conflicts.items())[0]
                return self._blocked("GPUsUnavailable", f"GPU {index} is in use by pod {ctx.describe_uid(holder)}")
            ctx.gpu_table.acquire(self.uid, indices)
            self.gpu_indices = indices
            per_container = split_gpus(self.pod, indices)
            for rec in self.records:
                rec.gpus = per_container.get(rec.name, [])
                if rec.gpus:
                    self.gpu_env[rec.name] = dict(await ctx.reserve(rec.gpus))
                else:
                    # A container without GPUs must not see (and use) the node's.
                    self.gpu_env[rec.name] = {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
        if self.ports is None:
            requests = port_requests(self.pod)
            if not self.uses_host_network():
                # In its own network namespace a pod listens on its container ports; only
                # hostPorts take a port of the node.
                requests = [r for r in requests if r.host_port]
            try:
                self.ports = ctx.port_table.allocate(self.uid, requests,
                                                     parse_host_ports(ann.get(HOST_PORTS_ANNOTATION)))
            except PortsUnavailable as exc:
                return self._blocked("PortsUnavailable", str(exc))
        if self.blocked is not None:
            self.blocked = None
            for rec in self.records:
                if (rec.state.get("waiting") or {}).get("reason") in ("GPUsUnavailable", "PortsUnavailable"):
                    rec.state = {"waiting": {"reason": "PodInitializing" if rec.init or self._has_init()
                                             else "ContainerCreating"}}
        return True

    def _blocked(self, reason: str, message: str) -> bool:
        if self.blocked != (reason, message):
            self._event(WARNING, reason, message)
        self.blocked = (reason, message)
        for rec in self.records:
            if not rec.ran:
                rec.state = {"waiting": {"reason": reason, "message": message}}
        return False

    async def _sync_metadata(self) -> None:
        """Record the host ports (and GPUs the agent picked itself) on the pod, once."""
        if self.metadata_synced and not self.chose_gpus:
            return
        ann = (self.pod.get("metadata") or {}).get("annotations")
        want: dict[str, str] = {}
        if self.ports and (ann or {}).get(HOST_PORTS_ANNOTATION) is None:
            want[HOST_PORTS_ANNOTATION] = json.dumps(self.ports, separators=(",", ":"), sort_keys=True)
        if self.chose_gpus and self.gpu_indices is not None and not (ann or {}).get(GPU_INDICES_ANNOTATION):
            want[GPU_INDICES_ANNOTATION] = format_gpu_indices(self.gpu_indices)
        if not want:
            self.metadata_synced = True
            self.chose_gpus = False
            return
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": self.uid}]
        if ann is None:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": want})
        else:
            ops += [{"op": "add", "path": "/metadata/annotations/" + k.replace("~", "~0").replace("/", "~1"),
                     "value": v} for k, v in want.items()]
        try:
            await self.ctx.client.patch("pods", self.name, ops, self.namespace, patch_type="json", raw=True)
        except (TransportError, ApiError) as exc:
            log.info("%s: recording host ports failed (%s); will retry", self.key, exc)
            return
        self.metadata_synced = True
        self.chose_gpus = False

    # -- status -------------------------------------------------------------------------

    def _pod_with_ips(self) -> dict[str, Any]:
        pod = dict(self.pod)
        status = dict(pod.get("status") or {})
        status.setdefault("hostIP", self.ctx.address)
        status["podIP"] = self.pod_ip
        status["podIPs"] = [{"ip": self.pod_ip}]
        pod["status"] = status
        return pod

    def _container_status(self, rec: ContainerRecord) -> dict[str, Any]:
        image = rec.spec.get("image") or ""
        cs: dict[str, Any] = {
            "name": rec.name,
            "image": image,
            "imageID": (rec.image_id or image) if rec.ran else "",
            "ready": bool(rec.ready and rec.running),
            "restartCount": rec.restart_count,
            "started": bool(rec.started and rec.running),
            "state": copy.deepcopy(rec.state),
            "lastState": copy.deepcopy(rec.last_state),
        }
        if rec.container_id:
            cs["containerID"] = rec.container_id
        if rec.init:
            term = rec.state.get("terminated")
            cs["ready"] = bool(term is not None and term.get("exitCode", 0) == 0)
        return cs

    def _statuses(self, init: bool) -> list[dict[str, Any]]:
        return [self._container_status(r) for r in self.records if r.init == init]

    def _phase(self) -> str:
        return podstatus.phase(self.pod.get("spec") or {}, self._statuses(True), self._statuses(False))

    def compute_status(self) -> dict[str, Any]:
        pod_status = self.pod.get("status") or {}
        init_statuses = self._statuses(True)
        statuses = self._statuses(False)
        phase = self.terminal or self._phase()
        existing = list(pod_status.get("conditions") or [])
        if self.last_written is not None:
            mine = {c["type"]: c for c in self.last_written.get("conditions") or []}
            seen = {c.get("type") for c in existing}
            existing = [mine.get(c.get("type"), c) for c in existing]
            existing += [c for t, c in mine.items() if t not in seen]
        conds = podstatus.conditions(phase, init_statuses, statuses,
                                     (self.pod.get("spec") or {}).get("readinessGates") or [], existing,
                                     self.ctx.clock.now())
        if self.unhonoured and not any(c.get("type") == RUNTIME_LIMITATION for c in conds):
            conds.append({"type": RUNTIME_LIMITATION, "status": "True", "reason": "NotHonoured",
                          "message": f"the {self.ctx.runtime.name} runtime: " + "; ".join(self.unhonoured),
                          "lastProbeTime": None, "lastTransitionTime": rfc3339(self.ctx.clock.now())})
        status = {k: v for k, v in pod_status.items() if k not in (
            "phase", "conditions", "hostIP", "hostIPs", "podIP", "podIPs", "startTime",
            "containerStatuses", "initContainerStatuses", "reason", "message")}
        status["phase"] = phase
        status["conditions"] = conds
        status["hostIP"] = self.ctx.address
        status["hostIPs"] = [{"ip": self.ctx.address}]
        status["podIP"] = self.pod_ip
        status["podIPs"] = [{"ip": self.pod_ip}]
        if self.start_time:
            status["startTime"] = self.start_time
        if init_statuses:
            status["initContainerStatuses"] = init_statuses
        status["containerStatuses"] = statuses
        if self.deadline_exceeded:
            status["reason"] = "DeadlineExceeded"
            status["message"] = "Pod was active on the node longer than the specified deadline"
        return status

    async def _write_status(self, final: bool = False) -> float | None:
        """Write the status if it changed; the time to retry when the API did not take it."""
        if self.removed or self.deleted:
            return None
        if self.terminal and self.last_written is None and not self.killed and \
                (self.pod.get("status") or {}).get("phase") == self.terminal:
            # Finished before this agent started: the status on record is the last word.
            return None
        now = self.ctx.clock.monotonic()
        if self.write_retry_at is not None and now < self.write_retry_at and not final:
            return self.write_retry_at
        status = self.compute_status()
        current = self.pod.get("status") or {}
        if self.last_written is not None and _same_status(status, self.last_written):
            return None
        if self.last_written is None and _same_status(status, current):
            self.last_written = status
            return None
        ops = [{"op": "test", "path": "/metadata/uid", "value": self.uid},
               {"op": "add", "path": "/status", "value": status}]
        try:
            await self.ctx.client.patch("pods", self.name, ops, self.namespace, patch_type="json",
                                        subresource="status", raw=True)
        except NotFound:
            return None
        except ApiError as exc:
            if exc.code == 422 and "/metadata/uid" in (exc.message or ""):
                log.info("%s: the pod was replaced; leaving it to its new worker", self.key)
                self.removed = True
                self.wake()
                return None
            return self._write_failed(exc)
        except TransportError as exc:
            return self._write_failed(exc)
        self.last_written = status
        self.write_retry_at = None
        self.write_backoff = 0.5
        return None

    def _write_failed(self, exc: Exception) -> float:
        log.log(logging.INFO if isinstance(exc, TransportError) else logging.WARNING,
                "%s: writing status failed (%s); retrying in %.1fs", self.key, exc, self.write_backoff)
        self.write_retry_at = self.ctx.clock.monotonic() + self.write_backoff
        self.write_backoff = min(self.write_backoff * 2, 10.0)
        return self.write_retry_at

    # -- events -------------------------------------------------------------------------

    def _event(self, type_: str, reason: str, message: str) -> None:
        ref = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid}}
        with contextlib.suppress(RuntimeError):
            self.ctx.recorder.record_nowait(ref, type_, reason, message)


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


def _same_status(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    def strip(s: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if k != "conditions"}

    return strip(a) == strip(b) and podstatus.conditions_equal(a.get("conditions") or [], b.get("conditions") or [])


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _quiet(fn: Callable[[Any], int], value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(fn(value))
    except (ValueError, TypeError):
        return None

