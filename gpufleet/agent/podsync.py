"""A pod's sync as a decision: ``decide(pod, now, mono) -> PodActions``, touching nothing.

The pod worker (agent/podworker.py) reads what it holds (the pod's spec, each container's
state and restart back-off) into a ``PodView``, asks ``decide`` what to do, and carries the
steps out against the runtime. A sync reads, in order, as the kubelet's does: removed from the
node (stop everything), being deleted (stop within the grace period, report, delete the
object), finished (hold nothing), past spec.activeDeadlineSeconds (stop, Failed), then the
pod's resources, volumes and sandbox, then the init containers one at a time in order, then
the app containers, each started, restarted per restartPolicy once its back-off has passed,
or left waiting with the reason users see (CrashLoopBackOff, ImagePullBackOff).

Native sidecars (Kubernetes 1.29+): an init container with ``restartPolicy: Always`` starts in
its turn among the init containers, and the next one starts once it runs and its startupProbe
(if any) passed. It then keeps running beside the app containers, restarted with back-off
whenever it exits, without holding them back. Once the app containers of a pod whose
restartPolicy is not Always are done for good, the sidecars are stopped (in reverse order)
and the pod's phase is that of its app containers (a Job's pod Succeeds).

``TRANSITIONS`` is every change the worker makes to a container's state (waiting, running,
terminated, as the kubelet reports them), with the reasons each may carry; ``transition``
builds the new state and refuses any other change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.agent import podstatus
from gpufleet.agent.backoff import go_duration, next_backoff
from gpufleet.utils.clock import parse_rfc3339, rfc3339

# -- container states ------------------------------------------------------------------------

WAITING, RUNNING, TERMINATED = "waiting", "running", "terminated"

CONTAINER_CREATING = "ContainerCreating"
POD_INITIALIZING = "PodInitializing"
CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
ERR_IMAGE_PULL = "ErrImagePull"
CONFIG_ERROR = "CreateContainerConfigError"
CREATE_ERROR = "CreateContainerError"
GPUS_UNAVAILABLE = "GPUsUnavailable"
PORTS_UNAVAILABLE = "PortsUnavailable"
COMPLETED, ERROR, OOM_KILLED = "Completed", "Error", "OOMKilled"

# How soon a pod whose GPUs, ports, volumes or sandbox could not be had is tried again.
RETRY_RESOURCES = 2.0
STATUS_UNKNOWN = "ContainerStatusUnknown"


@dataclass(frozen=True)
class Transition:
    source: str
    event: str
    target: str
    # The reasons the new state may carry; None: as the runtime names it (the usual ones listed).
    reasons: frozenset[str] | None
    known: tuple[str, ...]
    rule: str


def _t(source: str, event: str, target: str, reasons: Sequence[str], rule: str, open_: bool = False) -> Transition:
    return Transition(source, event, target, None if open_ else frozenset(reasons), tuple(reasons), rule)


_CREATING = (POD_INITIALIZING, CONTAINER_CREATING)
_START_FAILED = (CONFIG_ERROR, CREATE_ERROR, ERR_IMAGE_PULL)
_EXITED = (COMPLETED, ERROR, OOM_KILLED)

TRANSITIONS: dict[tuple[str, str], Transition] = {(t.source, t.event): t for t in (
    _t(WAITING, "blocked", WAITING, (GPUS_UNAVAILABLE, PORTS_UNAVAILABLE),
       "a GPU or host port the pod needs is held by another pod (or does not exist)"),
    _t(WAITING, "unblocked", WAITING, _CREATING,
       "what the pod waited for came free, or its volumes are not ready yet"),
    _t(WAITING, "start-failed", WAITING, _START_FAILED,
       "the environment, a mount, the image or the runtime failed the start", open_=True),
    _t(TERMINATED, "start-failed", WAITING, _START_FAILED,
       "a restart failed before the container ran", open_=True),
    _t(WAITING, "pull-back-off", WAITING, (IMAGE_PULL_BACK_OFF,),
       "the image pull failed; the next one waits out the back-off"),
    _t(WAITING, "crash-loop", WAITING, (CRASH_LOOP_BACK_OFF,),
       "the container exited and its restart waits out the back-off"),
    _t(TERMINATED, "crash-loop", WAITING, (CRASH_LOOP_BACK_OFF,),
       "the container exited and its restart waits out the back-off"),
    _t(WAITING, "started", RUNNING, (), "the runtime started the container"),
    _t(TERMINATED, "started", RUNNING, (), "the runtime restarted the container (no back-off due)"),
    _t(RUNNING, "exited", TERMINATED, _EXITED,
       "the container's process ended (or was stopped): Completed on 0, else the runtime's reason",
       open_=True),
    _t(RUNNING, "lost", TERMINATED, (STATUS_UNKNOWN,),
       "the runtime no longer has the container an earlier agent ran"),
)}


class InvalidTransition(ValueError):
    pass


def kind_of(state: Mapping[str, Any]) -> str:
    for kind in (RUNNING, TERMINATED, WAITING):
        if kind in state:
            return kind
    return WAITING


def transition(state: Mapping[str, Any], event: str, reason: str = "", message: str | None = None,
               **fields: Any) -> dict[str, Any]:
    """The container's new state after ``event``: {"waiting": {reason, message}},
    {"running": {startedAt}} or {"terminated": {exitCode, reason, ...}}; InvalidTransition
    for a change the table does not have."""
    source = kind_of(state)
    t = TRANSITIONS.get((source, event))
    if t is None:
        raise InvalidTransition(f"no container transition from {source} on {event!r}")
    if t.reasons is not None and t.reasons and reason not in t.reasons:
        raise InvalidTransition(f"{source} -> {t.target} on {event!r} cannot carry reason {reason!r}")
    body: dict[str, Any] = {}
    if t.target == TERMINATED:
        body["exitCode"] = fields.pop("exitCode", 0)
    if reason:
        body["reason"] = reason
    if message is not None:
        body["message"] = message
    body.update(fields)
    return {t.target: body}


def initial_state(init: bool, pod_has_init: bool) -> dict[str, Any]:
    """Where every container starts: PodInitializing while the pod has init containers."""
    return {WAITING: {"reason": POD_INITIALIZING if init or pod_has_init else CONTAINER_CREATING}}


def exit_reason(code: int, runtime_reason: str | None) -> str:
    return runtime_reason or (COMPLETED if code == 0 else ERROR)


# -- what the decision reads -------------------------------------------------------------------


@dataclass(frozen=True)
class BackoffPolicy:
    initial: float = 10.0
    cap: float = 300.0
    reset_after: float = 600.0


@dataclass(frozen=True)
class ContainerView:
    name: str
    init: bool = False
    image: str = ""
    state: Mapping[str, Any] = field(default_factory=lambda: {WAITING: {"reason": CONTAINER_CREATING}})
    last_state: Mapping[str, Any] = field(default_factory=dict)
    ran: bool = False
    running: bool = False
    stopping: bool = False
    last_exit: Mapping[str, Any] | None = None
    pull_error: str = ""
    started_mono: float = 0.0
    exited_mono: float = 0.0
    # Monotonic time before which it must not be (re)started; None: not worked out yet.
    not_before: float | None = None
    current_delay: float = 0.0
    # Where its restart back-off stands (RestartBackoff.current).
    backoff: float = 0.0
    # An init container with restartPolicy Always (a native sidecar), and whether it counts
    # as started (running, its startupProbe passed if it has one).
    sidecar: bool = False
    started: bool = False


@dataclass(frozen=True)
class PodView:
    name: str
    namespace: str = "default"
    uid: str = ""
    restart_policy: str = "Always"
    containers: tuple[ContainerView, ...] = ()  # init containers first, in order
    backoff: BackoffPolicy = BackoffPolicy()
    grace: float = 30.0  # the deletion's grace period, else the spec's
    active_deadline_seconds: float | None = None
    start_time: str | None = None
    terminal: str | None = None
    removed: bool = False
    deleting: bool = False
    deleted: bool = False
    killed: bool = False
    # The node fenced a GPU this pod holds (gpuhealthloop.py).
    gpu_failed: bool = False
    # The pod's phase on record is Succeeded or Failed though this node still runs it: someone
    # else reported it finished (an operator, a controller, this node's own report before a
    # restart). A finished pod does not run again: the kubelet refuses the "illegal phase
    # transition" back and stops it.
    reported_terminal: str | None = None


# -- what it decides ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class KillAll:
    grace: float
    why: str


@dataclass(frozen=True)
class StopSandbox:
    pass


@dataclass(frozen=True)
class Prepare:
    """GPUs and ports, the pod's metadata, its start time, volumes and sandbox; the steps after
    it wait for the next try while one cannot be had."""
    retry_at: float


@dataclass(frozen=True)
class Arm:
    """Work out when the container may (re)start: ``delay`` after it exited (or now)."""
    container: str
    delay: float
    not_before: float
    backoff: float


@dataclass(frozen=True)
class Start:
    container: str
    rule: str


@dataclass(frozen=True)
class Wait:
    """Not before ``until``; the state to report meanwhile (None: as it is) and its Events."""
    container: str
    until: float
    state: dict[str, Any] | None = None
    last_state: dict[str, Any] | None = None
    events: tuple[Event, ...] = ()
    rule: str = ""


@dataclass(frozen=True)
class Finish:
    """The pod is done: Succeeded or Failed (None: Succeeded only if every container exited 0)."""
    phase: str | None
    deadline_exceeded: bool = False


@dataclass(frozen=True)
class WriteFinalStatus:
    pass


@dataclass(frozen=True)
class StopSidecars:
    """Stop these running sidecars, one after the other in this order (the app containers
    are done for good)."""
    containers: tuple[str, ...]
    grace: float


@dataclass(frozen=True)
class DeletePod:
    pass


@dataclass(frozen=True)
class Release:
    pass


@dataclass
class PodActions:
    steps: list[Any] = field(default_factory=list)
    # When to look again (monotonic); a Start adds its own retry time when it fails.
    requeue_at: float | None = None
    # The worker ends after these steps (the pod left the node).
    done: bool = False
    reason: str = ""

    def of(self, kind: type) -> list[Any]:
        return [s for s in self.steps if isinstance(s, kind)]


# -- the rules ---------------------------------------------------------------------------------


def should_restart(init: bool, policy: str, last_exit: Mapping[str, Any] | None) -> bool:
    """restartPolicy for a container that exited: init containers restart only on failure
    (and never under Never); app containers always, on failure, or never. (A sidecar always
    restarts while the pod runs.)"""
    code = (last_exit or {}).get("exitCode", 0)
    if init:
        return code != 0 and policy != "Never"
    if policy == "Always":
        return True
    if policy == "OnFailure":
        return code != 0
    return False


def active_deadline_in(pod: PodView, now: float) -> float | None:
    """Seconds until spec.activeDeadlineSeconds runs out (None without one)."""
    if not pod.active_deadline_seconds or not pod.start_time:
        return None
    try:
        started = parse_rfc3339(pod.start_time)
    except ValueError:
        return None
    return started + float(pod.active_deadline_seconds) - now


def is_sidecar(spec: Mapping[str, Any], init: bool) -> bool:
    """An init container with restartPolicy Always: a native sidecar."""
    return init and spec.get("restartPolicy") == "Always"


def probes_to_run(spec: Mapping[str, Any], init: bool) -> tuple[str, ...]:
    """The probes a new container runs first: none for an init container (started at once)
    unless it is a sidecar, else its startupProbe alone while it has one, else readiness and
    liveness."""
    if init and not is_sidecar(spec, init):
        return ()
    if spec.get("startupProbe"):
        return ("startup",)
    return health_probes(spec)


def health_probes(spec: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(k for k in ("readiness", "liveness") if spec.get(f"{k}Probe"))


@dataclass(frozen=True)
class Kill:
    container: str
    grace: float
    event: Event


def probe_failed(container: str, kind: str, probe: Mapping[str, Any], spec_grace: float) -> Kill | None:
    """A probe's verdict flipped to failing: readiness only marks the container unready; a
    startup or liveness failure kills it (the probe's own grace period, else the pod's) so
    restartPolicy brings it back."""
    if kind == "readiness":
        return None
    grace = probe.get("terminationGracePeriodSeconds")
    return Kill(container, float(spec_grace if grace is None else grace),
                Event("Normal", "Killing", f"Container {container} failed {kind} probe, will be restarted"))


def _when_due(pod: PodView, c: ContainerView, mono: float, out: PodActions) -> float | None:
    """Start the container now, or say when it may be (waiting in its back-off until then)."""
    not_before, delay = c.not_before, c.current_delay
    if not_before is None:
        delay, backoff = 0.0, c.backoff
        if c.ran:
            ran_for = max(c.exited_mono - c.started_mono, 0.0)
            delay, backoff = next_backoff(backoff, ran_for, pod.backoff.initial, pod.backoff.cap,
                                          pod.backoff.reset_after)
        not_before = (c.exited_mono if c.ran else mono) + delay
        out.steps.append(Arm(c.name, delay, not_before, backoff))
    if mono >= not_before:
        out.steps.append(Start(c.name, "restart after back-off" if c.ran else "first start"))
        return None
    waiting = c.state.get(WAITING) or {}
    if c.pull_error and waiting.get("reason") in (ERR_IMAGE_PULL, IMAGE_PULL_BACK_OFF):
        if waiting.get("reason") == ERR_IMAGE_PULL:
            out.steps.append(Wait(c.name, not_before, transition(
                c.state, "pull-back-off", IMAGE_PULL_BACK_OFF,
                f'Back-off pulling image "{c.image}": ErrImagePull: {waiting.get("message", "")}'),
                events=(Event("Normal", "BackOff", f'Back-off pulling image "{c.image}"'),
                        Event("Warning", "Failed", "Error: ImagePullBackOff")), rule="image pull back-off"))
        else:
            out.steps.append(Wait(c.name, not_before, rule="image pull back-off"))
        return not_before
    if c.ran and c.last_exit is not None:
        message = (f"back-off {go_duration(delay)} restarting failed container={c.name} "
                   f"pod={pod.name}_{pod.namespace}({pod.uid})")
        events = () if waiting.get("reason") == CRASH_LOOP_BACK_OFF else (
            Event("Warning", "BackOff", f"Back-off restarting failed container {c.name} in pod "
                                        f"{pod.name}_{pod.namespace}({pod.uid})"),)
        out.steps.append(Wait(c.name, not_before, transition(c.state, "crash-loop", CRASH_LOOP_BACK_OFF, message),
                              {TERMINATED: dict(c.last_exit)}, events, rule="crash-loop back-off"))
        return not_before
    out.steps.append(Wait(c.name, not_before, rule="start back-off"))
    return not_before


def _statuses(containers: Sequence[ContainerView]) -> list[dict[str, Any]]:
    return [{"name": c.name, "state": c.state, "lastState": c.last_state, "started": c.started}
            for c in containers]


def _phase_spec(pod: PodView) -> dict[str, Any]:
    """What podstatus.phase reads of the spec: the restart policy and which are sidecars."""
    return {"restartPolicy": pod.restart_policy,
            "initContainers": [{"name": c.name, **({"restartPolicy": "Always"} if c.sidecar else {})}
                               for c in pod.containers if c.init]}


def _apps_done(pod: PodView, apps: Sequence[ContainerView]) -> bool:
    """Every app container ran and exited for good (never under restartPolicy Always)."""
    return pod.restart_policy != "Always" and bool(apps) and all(
        c.ran and not c.running and not c.stopping and not should_restart(False, pod.restart_policy, c.last_exit)
        for c in apps)


def _failed_for_good(pod: PodView, c: ContainerView) -> bool:
    """An init container that exited and will not run again (its failure fails the pod)."""
    return (c.ran and not c.running and not c.stopping and (c.last_exit or {}).get("exitCode", 0) != 0
            and not should_restart(True, pod.restart_policy, c.last_exit))


def _stop_sidecars(pod: PodView, out: PodActions) -> bool:
    """Stop the running sidecars, the last started first; whether any is still up."""
    live = [c for c in pod.containers if c.sidecar and (c.running or c.stopping)]
    to_stop = tuple(c.name for c in reversed(live) if c.running and not c.stopping)
    if to_stop:
        out.steps.append(StopSidecars(to_stop, pod.grace))
    return bool(live)


def _initialized_after(pod: PodView, index: int) -> bool:
    """Whether a container after init container ``index`` ever ran (the kubelet's
    isPreviouslyInitialized): then a sidecar there restarts without holding the pod back."""
    return any(c.ran or c.running for c in pod.containers[index + 1:])


def decide(pod: PodView, now: float, mono: float) -> PodActions:
    """One sync of the pod: ``now`` is the wall clock (the active deadline), ``mono`` the
    monotonic one (back-off)."""
    out = PodActions()
    if pod.removed:
        out.steps.append(KillAll(pod.grace, "the pod was removed from the node"))
        out.done, out.reason = True, "removed from the node"
        return out
    if pod.deleting:
        out.reason = "deleted"
        if pod.deleted:
            return out
        if not pod.killed:
            out.steps += [KillAll(pod.grace, "the pod is being deleted"), StopSandbox(),
                          Finish(pod.terminal), WriteFinalStatus()]
        out.steps.append(DeletePod())
        return out
    if pod.terminal:
        out.steps.append(Release())
        out.reason = "finished"
        return out
    if pod.reported_terminal:
        out.steps += [KillAll(pod.grace, f"the pod was reported {pod.reported_terminal}"),
                      Finish(pod.reported_terminal)]
        out.reason = f"reported {pod.reported_terminal}"
        return out
    if pod.gpu_failed:
        # As the kubelet evicts: stop the containers, and the pod fails (its controller, not
        # this node, decides what runs next).
        out.steps += [KillAll(pod.grace, "its GPU failed"), Finish("Failed")]
        out.reason = "GPU failed"
        return out
    left = active_deadline_in(pod, now)
    if left is not None and left <= 0:
        out.steps += [KillAll(pod.grace, "the pod's active deadline passed"), Finish("Failed", True)]
        out.reason = "active deadline passed"
        return out
    out.steps.append(Prepare(mono + RETRY_RESOURCES))

    apps = [c for c in pod.containers if not c.init]
    if _apps_done(pod, apps):
        if _stop_sidecars(pod, out):
            out.reason = "app containers done: stopping sidecars"
            return out
        phase = podstatus.phase(_phase_spec(pod), _statuses([c for c in pod.containers if c.init]),
                                _statuses(apps))
        if phase in ("Succeeded", "Failed"):
            out.steps.append(Finish(phase))
            out.reason = f"containers done: {phase}"
            return out

    failed = next((c for c in pod.containers if c.init and not c.sidecar and _failed_for_good(pod, c)), None)
    if failed is not None:
        # The pod fails: the sidecars started before the init container are stopped first.
        if not _stop_sidecars(pod, out):
            out.steps.append(Finish("Failed"))
        out.reason = f"init container {failed.name} failed"
        return out

    deadlines: list[float] = []
    for i, c in enumerate(pod.containers):
        if not c.init:
            break
        if c.sidecar:
            settled = _initialized_after(pod, i)
            if c.stopping or (c.running and (c.started or settled)):
                continue
            if c.running:
                out.reason = f"sidecar {c.name} starting"
                return out
            when = _when_due(pod, c, mono, out)
            if settled:
                if when is not None:
                    deadlines.append(when)
                continue
            out.requeue_at = when
            out.reason = f"sidecar {c.name}"
            return out
        if c.running or c.stopping:
            out.reason = f"init container {c.name} running"
            return out
        if c.ran and (c.last_exit or {}).get("exitCode", 0) == 0 and TERMINATED in c.state:
            continue
        if c.ran and not should_restart(True, pod.restart_policy, c.last_exit):
            out.steps.append(Finish("Failed"))
            out.reason = f"init container {c.name} failed"
            return out
        out.requeue_at = _earliest(_when_due(pod, c, mono, out), *deadlines)
        out.reason = f"init container {c.name}"
        return out

    for c in apps:
        if c.running or c.stopping:
            continue
        if c.ran and not should_restart(False, pod.restart_policy, c.last_exit):
            continue
        when = _when_due(pod, c, mono, out)
        if when is not None:
            deadlines.append(when)
    if not out.of(Start) and not out.of(Wait):
        phase = podstatus.phase(_phase_spec(pod), _statuses([c for c in pod.containers if c.init]),
                                _statuses(apps))
        if phase in ("Succeeded", "Failed"):
            out.steps.append(Finish(phase))
            out.reason = f"containers done: {phase}"
            return out
    if pod.start_time is None:
        # Prepare stamps the start time now.
        left = active_deadline_in(replace(pod, start_time=rfc3339(now)), now)
    if left is not None:
        deadlines.append(mono + left)
    out.requeue_at = min(deadlines) if deadlines else None
    out.reason = out.reason or "containers"
    return out


def _earliest(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None
