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
import logging
from collections.abc import Awaitable, Mapping
from typing import Any

from gpufleet.agent import podstatus, podsync
from gpufleet.agent.backoff import RestartBackoff
from gpufleet.agent.podcontainers import ContainerActs, prepare_checkpoint_dir
from gpufleet.agent.podcontext import NORMAL, WARNING, ContainerRecord, ObjectGetter, WorkerContext
from gpufleet.agent.podreport import RUNTIME_LIMITATION, StatusReport
from gpufleet.agent.podsetup import PodSetup
from gpufleet.agent.resources import (
    HOST_PORTS_ANNOTATION,
    port_requests,
)
from gpufleet.agent.runtime.base import (
    ContainerHandle,
    RecoveredContainer,
    SandboxHandle,
)
from gpufleet.client import ApiError, Conflict, NotFound, TransportError
from gpufleet.utils.clock import rfc3339

__all__ = ["NORMAL", "RUNTIME_LIMITATION", "WARNING", "ContainerRecord", "ObjectGetter", "PodWorker",
           "WorkerContext", "prepare_checkpoint_dir"]

log = logging.getLogger(__name__)

# How often an idle worker re-checks its pod anyway (status retries, deadlines).
_RESYNC = 10.0



class PodWorker(ContainerActs, PodSetup, StatusReport):
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
        # Why the pod is stopped for a failed GPU (the message of its DisruptionTarget condition).
        self.gpu_failure: str | None = None
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
        rec.state = podsync.initial_state(init, self._has_init())
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

    def fail_for_gpu(self, message: str) -> None:
        """A GPU the pod holds failed: stop it and report it Failed, reason GPUUnhealthy."""
        if self.terminal or self.gpu_failure is not None:
            return
        self.gpu_failure = message
        self._event(WARNING, "GPUUnhealthy", f"stopping the pod: {message}")
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
                    await self._sync()
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
        return _earliest(await self._sync(), await self._write_status())

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
                rec.state = podsync.transition(
                    state, "lost", podsync.STATUS_UNKNOWN,
                    "The container could not be located when the agent restarted", exitCode=137,
                    startedAt=state["running"].get("startedAt"), finishedAt=rfc3339(self.ctx.clock.now()))
                rec.last_exit = rec.state["terminated"]
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

    # -- the pass: decide, then act ----------------------------------------------------------

    def view(self) -> podsync.PodView:
        """What the decision reads: the pod's spec and each container's record."""
        spec = self.pod.get("spec") or {}
        meta = self.pod.get("metadata") or {}
        return podsync.PodView(
            name=self.name, namespace=self.namespace, uid=self.uid,
            restart_policy=spec.get("restartPolicy") or "Always",
            containers=tuple(podsync.ContainerView(
                name=r.name, init=r.init, image=r.spec.get("image") or "", state=r.state,
                last_state=r.last_state, ran=r.ran, running=r.running, stopping=r.stopping,
                last_exit=r.last_exit, pull_error=r.pull_error, started_mono=r.started_mono,
                exited_mono=r.exited_mono, not_before=r.not_before, current_delay=r.current_delay,
                backoff=r.backoff.current, sidecar=podsync.is_sidecar(r.spec, r.init),
                started=r.started and r.running) for r in self.records),
            backoff=podsync.BackoffPolicy(self.ctx.backoff_initial, self.ctx.backoff_cap, self.ctx.backoff_reset),
            grace=self._grace(), active_deadline_seconds=spec.get("activeDeadlineSeconds"),
            start_time=self.start_time, terminal=self.terminal, removed=self.removed,
            deleting=bool(meta.get("deletionTimestamp")), deleted=self.deleted, killed=self.killed,
            gpu_failed=self.gpu_failure is not None, reported_terminal=self._reported_terminal())

    def _reported_terminal(self) -> str | None:
        """The finished phase someone else recorded for a pod this worker has not finished."""
        phase = (self.pod.get("status") or {}).get("phase")
        return phase if not self.terminal and phase in ("Succeeded", "Failed") else None

    async def _sync(self) -> float | None:
        clock = self.ctx.clock
        return await self._apply(podsync.decide(self.view(), clock.now(), clock.monotonic()))

    async def _apply(self, actions: podsync.PodActions) -> float | None:
        """Carry the decision out, step by step; the time to look again."""
        wake_at = actions.requeue_at
        for step in actions.steps:
            if isinstance(step, podsync.Release):
                self._release()
            elif isinstance(step, podsync.KillAll):
                await self._kill_all(step.grace, step.why)
            elif isinstance(step, podsync.StopSandbox):
                if self.sandbox is not None:
                    with contextlib.suppress(Exception):
                        await self.ctx.runtime.stop_sandbox(self.sandbox)
            elif isinstance(step, podsync.Finish):
                if step.deadline_exceeded:
                    self.deadline_exceeded = True
                phase = step.phase or self.terminal or podstatus.terminal_phase(self._statuses(init=False))
                self._finish(phase)
            elif isinstance(step, podsync.StopSidecars):
                await self._stop_sidecars(step)
            elif isinstance(step, podsync.WriteFinalStatus):
                await self._write_status(final=True)
            elif isinstance(step, podsync.DeletePod):
                if not await self._delete_pod():
                    return self.ctx.clock.monotonic() + 1.0
            elif isinstance(step, podsync.Prepare):
                if not await self._prepare():
                    return step.retry_at
            elif isinstance(step, podsync.Arm):
                rec = self._rec(step.container)
                rec.current_delay, rec.not_before, rec.backoff.current = step.delay, step.not_before, step.backoff
            elif isinstance(step, podsync.Wait):
                rec = self._rec(step.container)
                for ev in step.events:
                    self._event(ev.type, ev.reason, ev.message)
                if step.state is not None:
                    rec.state = step.state
                if step.last_state is not None:
                    rec.last_state = step.last_state
            elif isinstance(step, podsync.Start):
                rec = self._rec(step.container)
                rec.not_before = None
                await self._start(rec)
                wake_at = _earliest(wake_at, rec.not_before)
        return wake_at

    def _rec(self, name: str) -> ContainerRecord:
        rec = self.record_for(name)
        assert rec is not None, name
        return rec

    async def _prepare(self) -> bool:
        """GPUs and ports, the pod's annotations, its start time, volumes and sandbox."""
        if not await self._acquire():
            return False
        await self._sync_metadata()
        if self.start_time is None:
            self.start_time = rfc3339(self.ctx.clock.now())
        return await self._setup_volumes() and await self._ensure_sandbox()

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

    async def _stop_sidecars(self, step: podsync.StopSidecars) -> None:
        """The app containers are done: stop the sidecars one by one, the last started first."""
        for name in step.containers:
            rec = self._rec(name)
            if rec.running and rec.handle is not None and not rec.stopping:
                self._event(NORMAL, "Killing", f"Stopping container {rec.name}")
                await self._stop(rec, rec.handle, step.grace)

    async def _delete_pod(self) -> bool:
        """Delete the pod object for good (grace 0, only this uid) once its containers
        stopped and its final status was written; False to retry."""
        try:
            await self.ctx.client.delete("pods", self.name, self.namespace, grace_period_seconds=0,
                                         preconditions_uid=self.uid, raw=True)
        except (NotFound, Conflict):
            pass
        except (TransportError, ApiError) as exc:
            log.warning("%s: deleting the pod failed (%s); retrying", self.key, exc)
            return False
        self.deleted = True
        return True

    # -- events -------------------------------------------------------------------------

    def _event(self, type_: str, reason: str, message: str) -> None:
        ref = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid}}
        with contextlib.suppress(RuntimeError):
            self.ctx.recorder.record_nowait(ref, type_, reason, message)




def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)

