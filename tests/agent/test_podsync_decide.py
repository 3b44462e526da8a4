"""The pod worker's decision (agent/podsync.py) on its own: no runtime, no control plane."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet.agent import podstatus, podsync
from gpufleet.agent.podsync import (
    Arm,
    ContainerView,
    DeletePod,
    Finish,
    InvalidTransition,
    KillAll,
    PodView,
    Prepare,
    Release,
    Start,
    StopSandbox,
    Wait,
    WriteFinalStatus,
    decide,
    transition,
)
from gpufleet.utils.clock import rfc3339

NOW = 1_700_000_000.0
MONO = 1000.0


def waiting(reason: str, message: str | None = None) -> dict:
    body = {"reason": reason}
    if message is not None:
        body["message"] = message
    return {"waiting": body}


def exited(code: int, reason: str | None = None) -> dict:
    return {"exitCode": code, "reason": reason or ("Completed" if code == 0 else "Error")}


def done(name: str, code: int, init: bool = False, **kw) -> ContainerView:
    """A container that ran and exited with ``code``."""
    last = exited(code)
    return ContainerView(name=name, init=init, ran=True, state={"terminated": last}, last_exit=last,
                         started_mono=MONO - 5, exited_mono=MONO - 1, **kw)


def running(name: str, init: bool = False) -> ContainerView:
    return ContainerView(name=name, init=init, ran=True, running=True, state={"running": {"startedAt": "x"}})


def fresh(name: str, init: bool = False, pod_has_init: bool = False) -> ContainerView:
    return ContainerView(name=name, init=init, state=podsync.initial_state(init, pod_has_init))


def pod(*containers: ContainerView, **kw) -> PodView:
    kw.setdefault("start_time", rfc3339(NOW - 1))
    return PodView(name="p", namespace="ns", uid="u1", containers=tuple(containers), **kw)


def kinds(actions) -> list[type]:
    return [type(s) for s in actions.steps]


def starts(actions) -> list[str]:
    return [s.container for s in actions.of(Start)]


# -- the transition table -----------------------------------------------------------------------


def test_every_container_state_change_the_kubelet_makes_is_in_the_table():
    table = {(t.source, t.event): t.target for t in podsync.TRANSITIONS.values()}
    assert table == {
        ("waiting", "blocked"): "waiting",
        ("waiting", "unblocked"): "waiting",
        ("waiting", "start-failed"): "waiting",
        ("terminated", "start-failed"): "waiting",
        ("waiting", "pull-back-off"): "waiting",
        ("waiting", "crash-loop"): "waiting",
        ("terminated", "crash-loop"): "waiting",
        ("waiting", "started"): "running",
        ("terminated", "started"): "running",
        ("running", "exited"): "terminated",
        ("running", "lost"): "terminated",
    }
    # A running container never goes back to waiting, and a terminated one only by a restart.
    assert ("running", "crash-loop") not in podsync.TRANSITIONS
    assert ("terminated", "exited") not in podsync.TRANSITIONS


@pytest.mark.parametrize(("state", "event", "reason", "want"), [
    (waiting("ContainerCreating"), "started", "", {"running": {"startedAt": "t"}}),
    (waiting("PodInitializing"), "blocked", "GPUsUnavailable",
     {"waiting": {"reason": "GPUsUnavailable", "message": "m"}}),
    (waiting("GPUsUnavailable", "m"), "unblocked", "ContainerCreating", {"waiting": {"reason": "ContainerCreating"}}),
    (waiting("ContainerCreating"), "start-failed", "CreateContainerConfigError",
     {"waiting": {"reason": "CreateContainerConfigError", "message": "m"}}),
    (waiting("ContainerCreating"), "start-failed", "ErrImagePull", {"waiting": {"reason": "ErrImagePull", "message": "m"}}),
    (waiting("ErrImagePull", "m"), "pull-back-off", "ImagePullBackOff",
     {"waiting": {"reason": "ImagePullBackOff", "message": "m"}}),
    ({"terminated": exited(1)}, "crash-loop", "CrashLoopBackOff",
     {"waiting": {"reason": "CrashLoopBackOff", "message": "m"}}),
    ({"terminated": exited(1)}, "started", "", {"running": {"startedAt": "t"}}),
])
def test_transitions_build_the_kubelets_states(state, event, reason, want):
    fields = {"startedAt": "t"} if event == "started" else {}
    message = None if event in ("started", "unblocked") else "m"
    assert transition(state, event, reason, message, **fields) == want


@pytest.mark.parametrize(("code", "runtime_reason", "want"), [
    (0, None, "Completed"), (1, None, "Error"), (137, "OOMKilled", "OOMKilled")])
def test_an_exit_terminates_with_completed_error_or_the_runtimes_reason(code, runtime_reason, want):
    reason = podsync.exit_reason(code, runtime_reason)
    state = transition({"running": {"startedAt": "t"}}, "exited", reason, exitCode=code, startedAt="t")
    assert state == {"terminated": {"exitCode": code, "reason": want, "startedAt": "t"}}


@pytest.mark.parametrize(("state", "event", "reason"), [
    ({"running": {}}, "crash-loop", "CrashLoopBackOff"),   # running -> waiting: never
    ({"running": {}}, "started", ""),                     # already running
    ({"terminated": exited(0)}, "exited", "Completed"),   # exits only from running
    (waiting("ContainerCreating"), "exited", "Error"),
    (waiting("ContainerCreating"), "crash-loop", "Error"),  # the table's reasons only
    (waiting("ContainerCreating"), "blocked", "CrashLoopBackOff"),
])
def test_a_change_outside_the_table_is_refused(state, event, reason):
    with pytest.raises(InvalidTransition):
        transition(state, event, reason, "m")


def test_containers_start_in_pod_initializing_while_the_pod_has_init_containers():
    assert podsync.initial_state(True, True) == waiting("PodInitializing")
    assert podsync.initial_state(False, True) == waiting("PodInitializing")
    assert podsync.initial_state(False, False) == waiting("ContainerCreating")


# -- init containers ----------------------------------------------------------------------------


def test_init_containers_run_one_at_a_time_in_order_before_the_app_containers():
    a = pod(fresh("init-1", True, True), fresh("init-2", True, True), fresh("app", pod_has_init=True))
    out = decide(a, NOW, MONO)
    assert kinds(out) == [Prepare, Arm, Start]
    assert starts(out) == ["init-1"]

    b = replace(a, containers=(running("init-1", True), *a.containers[1:]))
    out = decide(b, NOW, MONO)
    assert kinds(out) == [Prepare] and out.requeue_at is None  # waits for init-1's exit

    c = replace(a, containers=(done("init-1", 0, init=True), *a.containers[1:]))
    assert starts(decide(c, NOW, MONO)) == ["init-2"]

    d = replace(a, containers=(done("init-1", 0, init=True), done("init-2", 0, init=True), a.containers[2]))
    assert starts(decide(d, NOW, MONO)) == ["app"]


def test_a_failed_init_container_fails_the_pod_under_never_and_restarts_otherwise():
    never = pod(done("init", 1, init=True), fresh("app", pod_has_init=True), restart_policy="Never")
    out = decide(never, NOW, MONO)
    assert out.of(Finish) == [Finish("Failed")]
    assert not out.of(Start)

    for policy in ("Always", "OnFailure"):
        again = replace(never, restart_policy=policy)
        out = decide(again, NOW, MONO)
        assert not out.of(Finish)
        # The first restart is immediate (the back-off starts at no delay)...
        assert starts(out) == ["init"]
        # ...the app container does not start meanwhile.
        assert "app" not in starts(out)


def test_an_init_container_that_succeeded_is_not_run_again_even_under_always():
    p = pod(done("init", 0, init=True), fresh("app", pod_has_init=True), restart_policy="Always")
    assert starts(decide(p, NOW, MONO)) == ["app"]


# -- restart policy ---------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "code", "restarts", "phase"), [
    ("Always", 0, True, None),
    ("Always", 1, True, None),
    ("OnFailure", 0, False, "Succeeded"),
    ("OnFailure", 1, True, None),
    ("Never", 0, False, "Succeeded"),
    ("Never", 1, False, "Failed"),
])
def test_restart_policy_decides_restart_or_finish(policy, code, restarts, phase):
    out = decide(pod(done("app", code), restart_policy=policy), NOW, MONO)
    assert bool(out.of(Start)) == restarts
    assert out.of(Finish) == ([Finish(phase)] if phase else [])


def test_a_pod_with_one_container_still_running_is_not_finished():
    out = decide(pod(done("a", 0), running("b"), restart_policy="Never"), NOW, MONO)
    assert not out.of(Finish) and not out.of(Start)


def test_a_finished_pod_only_releases_what_it_holds():
    out = decide(pod(done("app", 0), terminal="Succeeded"), NOW, MONO)
    assert kinds(out) == [Release]


# -- crash-loop back-off ---------------------------------------------------------------------


def crash_loop(restarts: int, policy=podsync.BackoffPolicy(10, 300, 600)) -> list[float]:
    """The delays a container that keeps exiting after 1s waits before each restart."""
    backoff, delays = 0.0, []
    for _ in range(restarts):
        c = replace(done("app", 1), backoff=backoff)
        out = decide(pod(c, backoff=policy), NOW, MONO)
        (arm,) = out.of(Arm)
        delays.append(arm.delay)
        backoff = arm.backoff
    return delays


def test_crash_loop_back_off_doubles_up_to_the_cap():
    assert crash_loop(8) == [0, 10, 20, 40, 80, 160, 300, 300]


def test_a_container_that_ran_long_enough_starts_its_back_off_over():
    c = replace(done("app", 1), backoff=160.0, started_mono=MONO - 700, exited_mono=MONO - 1)
    (arm,) = decide(pod(c), NOW, MONO).of(Arm)
    assert arm.delay == 0


def test_while_backing_off_the_container_waits_in_crash_loop_back_off_with_an_event_once():
    c = replace(done("app", 1), backoff=10.0)
    out = decide(pod(c), NOW, MONO)
    (arm,) = out.of(Arm)
    assert arm.delay == 10 and arm.not_before == c.exited_mono + 10
    assert starts(out) == []
    (wait,) = out.of(Wait)
    assert wait.until == arm.not_before == out.requeue_at
    assert wait.state == {"waiting": {"reason": "CrashLoopBackOff",
                                      "message": "back-off 10s restarting failed container=app pod=p_ns(u1)"}}
    assert wait.last_state == {"terminated": c.last_exit}
    assert [e.reason for e in wait.events] == ["BackOff"]

    # The next pass, already in CrashLoopBackOff with the clock armed: no second Event, no re-arm.
    again = replace(c, state=wait.state, last_state=wait.last_state, not_before=arm.not_before,
                    current_delay=arm.delay, backoff=arm.backoff)
    out = decide(pod(again), NOW, MONO + 1)
    assert not out.of(Arm)
    (wait,) = out.of(Wait)
    assert wait.events == ()

    # Once it is due, it restarts.
    out = decide(pod(again), NOW, arm.not_before)
    assert starts(out) == ["app"] and out.of(Start)[0].rule == "restart after back-off"


# -- image pulls ------------------------------------------------------------------------------


def test_a_failed_pull_turns_into_image_pull_back_off_and_is_retried_when_due():
    c = ContainerView(name="app", image="reg/x:1", state=waiting("ErrImagePull", "not found"),
                      pull_error="ErrImagePull", not_before=MONO + 10, current_delay=10)
    out = decide(pod(c), NOW, MONO)
    (wait,) = out.of(Wait)
    assert wait.state == {"waiting": {"reason": "ImagePullBackOff",
                                      "message": 'Back-off pulling image "reg/x:1": ErrImagePull: not found'}}
    assert [(e.type, e.reason) for e in wait.events] == [("Normal", "BackOff"), ("Warning", "Failed")]
    assert out.requeue_at == MONO + 10

    backing_off = replace(c, state=wait.state)
    (wait,) = decide(pod(backing_off), NOW, MONO + 5).of(Wait)
    assert wait.state is None and wait.events == ()

    assert starts(decide(pod(backing_off), NOW, MONO + 10)) == ["app"]


def test_a_start_that_failed_on_its_config_waits_out_its_delay_then_tries_again():
    c = ContainerView(name="app", state=waiting("CreateContainerConfigError", "no such secret"),
                      not_before=MONO + 10, current_delay=10)
    out = decide(pod(c), NOW, MONO)
    (wait,) = out.of(Wait)
    assert wait.state is None and out.requeue_at == MONO + 10
    assert starts(decide(pod(c), NOW, MONO + 10)) == ["app"]


# -- deletion, removal, deadline --------------------------------------------------------------


def test_deletion_stops_every_container_within_the_grace_reports_then_deletes():
    p = pod(running("a"), done("b", 0), deleting=True, grace=7.0)
    out = decide(p, NOW, MONO)
    assert kinds(out) == [KillAll, StopSandbox, Finish, WriteFinalStatus, DeletePod]
    assert out.steps[0] == KillAll(7.0, "the pod is being deleted")
    # The phase is the containers' as they stopped (Succeeded only if all exited 0).
    assert out.of(Finish) == [Finish(None)]

    # Stopped already (the delete call failed): only the delete again; and nothing once deleted.
    assert kinds(decide(replace(p, killed=True), NOW, MONO)) == [DeletePod]
    assert decide(replace(p, killed=True, deleted=True), NOW, MONO).steps == []


def test_a_finished_pod_being_deleted_keeps_its_phase():
    out = decide(pod(done("a", 1), deleting=True, terminal="Failed"), NOW, MONO)
    assert out.of(Finish) == [Finish("Failed")]


def test_a_pod_removed_from_the_node_is_stopped_and_its_worker_ends():
    out = decide(pod(running("a"), removed=True, grace=3.0), NOW, MONO)
    assert out.steps == [KillAll(3.0, "the pod was removed from the node")] and out.done


def test_the_active_deadline_stops_the_pod_and_fails_it():
    p = pod(running("a"), active_deadline_seconds=30, start_time=rfc3339(NOW - 31), grace=5.0)
    out = decide(p, NOW, MONO)
    assert out.steps == [KillAll(5.0, "the pod's active deadline passed"), Finish("Failed", deadline_exceeded=True)]

    # Before it: a look again when it runs out.
    early = replace(p, start_time=rfc3339(NOW - 10))
    out = decide(early, NOW, MONO)
    assert not out.of(KillAll) and out.requeue_at == pytest.approx(MONO + 20, abs=1)


# -- probes -----------------------------------------------------------------------------------


def test_probes_a_container_runs_first():
    startup = {"startupProbe": {"exec": {}}, "readinessProbe": {"exec": {}}, "livenessProbe": {"exec": {}}}
    assert podsync.probes_to_run(startup, init=False) == ("startup",)
    health = {"readinessProbe": {"exec": {}}, "livenessProbe": {"exec": {}}}
    assert podsync.probes_to_run(health, init=False) == ("readiness", "liveness")
    assert podsync.probes_to_run(startup, init=True) == ()


def test_a_failed_liveness_probe_kills_with_the_probes_grace_else_the_pods():
    kill = podsync.probe_failed("app", "liveness", {"terminationGracePeriodSeconds": 2}, 30.0)
    assert kill is not None and kill.grace == 2.0
    assert kill.event.message == "Container app failed liveness probe, will be restarted"
    kill = podsync.probe_failed("app", "startup", {}, 30.0)
    assert kill is not None and kill.grace == 30.0
    assert podsync.probe_failed("app", "readiness", {}, 30.0) is None


# -- native sidecars (init containers with restartPolicy Always) ---------------------------------


def sidecar(name: str, *, started: bool = True, **kw) -> ContainerView:
    if kw.pop("run", True):
        return ContainerView(name=name, init=True, sidecar=True, ran=True, running=True, started=started,
                             state={"running": {"startedAt": "x"}}, **kw)
    return ContainerView(name=name, init=True, sidecar=True, state=podsync.initial_state(True, True), **kw)


def test_a_sidecar_starts_first_and_the_next_container_once_it_is_started():
    first = decide(pod(sidecar("proxy", run=False), fresh("main", pod_has_init=True), restart_policy="Never"),
                   NOW, MONO)
    assert starts(first) == ["proxy"] and first.reason == "sidecar proxy"
    # Running but its startupProbe has not passed: the next one waits.
    probing = decide(pod(sidecar("proxy", started=False), fresh("main", pod_has_init=True), restart_policy="Never"),
                     NOW, MONO)
    assert starts(probing) == [] and probing.reason == "sidecar proxy starting"
    ready = decide(pod(sidecar("proxy"), fresh("setup", init=True), fresh("main", pod_has_init=True)), NOW, MONO)
    assert starts(ready) == ["setup"]
    after_init = decide(pod(sidecar("proxy"), done("setup", 0, init=True), fresh("main", pod_has_init=True)),
                        NOW, MONO)
    assert starts(after_init) == ["main"]


def test_a_sidecar_that_exits_is_restarted_with_back_off_without_holding_the_app_back():
    crashed = replace(done("proxy", 1, init=True), sidecar=True, backoff=10.0)
    actions = decide(pod(crashed, running("main"), restart_policy="Never"), NOW, MONO)
    assert starts(actions) == []
    (wait,) = actions.of(Wait)
    assert wait.container == "proxy" and wait.state["waiting"]["reason"] == "CrashLoopBackOff"
    assert actions.requeue_at == wait.until
    # A sidecar that exited 0 is restarted too (restartPolicy Always is its own).
    clean = replace(done("proxy", 0, init=True), sidecar=True, not_before=MONO - 1)
    assert starts(decide(pod(clean, running("main")), NOW, MONO)) == ["proxy"]


def test_a_running_sidecar_keeps_the_pod_running_until_the_app_is_done_then_it_is_stopped():
    live = pod(sidecar("proxy"), sidecar("log"), running("main"), restart_policy="Never", grace=7)
    assert decide(live, NOW, MONO).of(Finish) == []
    finished = pod(sidecar("proxy"), sidecar("log"), done("main", 0), restart_policy="Never", grace=7)
    actions = decide(finished, NOW, MONO)
    assert actions.of(podsync.StopSidecars) == [podsync.StopSidecars(("log", "proxy"), 7)]
    assert actions.of(Finish) == [] and starts(actions) == []
    stopped = [replace(done(n, 143, init=True), sidecar=True) for n in ("proxy", "log")]
    end = decide(pod(*stopped, done("main", 0), restart_policy="Never"), NOW, MONO)
    # The sidecars' exit codes do not count: the app succeeded, so does the pod.
    assert end.of(Finish) == [Finish("Succeeded")] and starts(end) == []
    failed = decide(pod(*stopped, done("main", 2), restart_policy="Never"), NOW, MONO)
    assert failed.of(Finish) == [Finish("Failed")]


def test_under_restart_policy_always_the_sidecar_is_never_stopped_for_the_app():
    actions = decide(pod(sidecar("proxy"), done("main", 0), restart_policy="Always"), NOW, MONO)
    assert actions.of(podsync.StopSidecars) == []


def test_sidecars_count_in_phase_and_conditions():
    spec = {"restartPolicy": "Never", "initContainers": [{"name": "proxy", "restartPolicy": "Always"}]}
    side = {"name": "proxy", "state": {"running": {}}, "ready": False, "started": True}
    main = {"name": "main", "state": {"running": {}}, "ready": True}
    assert podstatus.phase(spec, [side], [main]) == "Running"
    assert podstatus.phase(spec, [{**side, "state": {"terminated": {"exitCode": 143}}}],
                           [{**main, "state": {"terminated": {"exitCode": 0}}}]) == "Succeeded"
    conds = {c["type"]: c for c in podstatus.conditions("Running", [side], [main], [], [], NOW, frozenset({"proxy"}))}
    assert conds["Initialized"]["status"] == "True"
    assert conds["ContainersReady"]["status"] == "False"
    assert conds["ContainersReady"]["message"] == "containers with unready status: [proxy]"
    conds = {c["type"]: c for c in podstatus.conditions("Running", [{**side, "ready": True}], [main], [], [], NOW,
                                                        frozenset({"proxy"}))}
    assert conds["Ready"]["status"] == "True"
    starting = {"name": "proxy", "state": {"running": {}}, "ready": False, "started": False}
    waiting_main = {"name": "main", "state": {"waiting": {"reason": "PodInitializing"}}}
    conds = {c["type"]: c for c in podstatus.conditions("Pending", [starting], [waiting_main], [], [], NOW,
                                                        frozenset({"proxy"}))}
    assert conds["Initialized"]["status"] == "False"


def test_an_init_container_failing_after_a_sidecar_stops_the_sidecar_then_fails_the_pod():
    failing = pod(sidecar("proxy"), done("setup", 1, init=True), fresh("main", pod_has_init=True),
                  restart_policy="Never", grace=3)
    actions = decide(failing, NOW, MONO)
    assert actions.of(podsync.StopSidecars) == [podsync.StopSidecars(("proxy",), 3)] and not actions.of(Finish)
    stopped = replace(done("proxy", 143, init=True), sidecar=True)
    after = decide(pod(stopped, done("setup", 1, init=True), fresh("main", pod_has_init=True),
                       restart_policy="Never"), NOW, MONO)
    assert after.of(Finish) == [Finish("Failed")] and starts(after) == []


def test_a_failed_gpu_stops_the_pod_and_fails_it():
    p = pod(running("main"), gpu_failed=True)
    out = podsync.decide(p, NOW, MONO)
    assert [type(s).__name__ for s in out.steps] == ["KillAll", "Finish"]
    assert out.steps[1].phase == "Failed"
    # Once it finished, nothing more happens to it.
    assert podsync.decide(replace(p, terminal="Failed", killed=True), NOW, MONO).of(podsync.KillAll) == []


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_a_pod_reported_finished_elsewhere_is_stopped_and_keeps_that_phase(phase):
    # A container that just exited would be restarted (restartPolicy Always), but the pod's
    # phase on record is terminal: it is stopped and finishes in that phase, not Running.
    p = pod(running("main"), ContainerView(name="side", ran=True, state=exited(1)), restart_policy="Always")
    assert podsync.decide(p, NOW, MONO).of(Start)  # what happens to it otherwise
    out = podsync.decide(replace(p, reported_terminal=phase), NOW, MONO)
    assert [type(s).__name__ for s in out.steps] == ["KillAll", "Finish"]
    assert out.steps[1].phase == phase and out.of(Start) == []
