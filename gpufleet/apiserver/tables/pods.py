"""Pod printer: kube-apiserver's STATUS, READY and RESTARTS rules for `kubectl get pods`.
"""

from __future__ import annotations

from typing import Any

from gpufleet.api.podresources import pod_gpu_request
from gpufleet.apiserver.tables.core import (
    AGE_COLUMN,
    NAME_COLUMN,
    Column,
    Obj,
    _int,
    _meta,
    _name,
    _spec,
    _status,
    _true_condition,
    _ts,
    age_cell,
    human_duration,
)

# --- Pod -----------------------------------------------------------------------------------


def _restartable_init(container: dict[str, Any] | None) -> bool:
    return bool(container) and container.get("restartPolicy") == "Always"


def _last_termination_finished(cs: dict[str, Any]) -> float | None:
    terminated = (cs.get("lastState") or {}).get("terminated") or {}
    return _ts(terminated.get("finishedAt"))


def _pod_summary(pod: Obj) -> tuple[str, int, int, int, float | None]:
    """(status, ready, total, restarts, last restart time), following kube-apiserver's printPod."""
    spec, status = _spec(pod), _status(pod)
    init_specs = spec.get("initContainers") or []
    total = len(spec.get("containers") or [])
    ready = 0
    restarts = 0
    sidecar_restarts = 0
    last_restart: float | None = None
    last_sidecar_restart: float | None = None

    phase = status.get("phase") or ""
    reason = status.get("reason") or phase

    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"

    init_by_name = {c.get("name"): c for c in init_specs}
    total += sum(1 for c in init_specs if _restartable_init(c))

    initializing = False
    for i, cs in enumerate(status.get("initContainerStatuses") or []):
        restarts += _int(cs.get("restartCount"))
        finished = _last_termination_finished(cs)
        if finished is not None and (last_restart is None or finished > last_restart):
            last_restart = finished
        sidecar = _restartable_init(init_by_name.get(cs.get("name")))
        if sidecar:
            sidecar_restarts += _int(cs.get("restartCount"))
            if finished is not None and (last_sidecar_restart is None or finished > last_sidecar_restart):
                last_sidecar_restart = finished
        state = cs.get("state") or {}
        terminated = state.get("terminated")
        waiting = state.get("waiting")
        if terminated is not None and _int(terminated.get("exitCode")) == 0:
            continue
        if sidecar and cs.get("started"):
            if cs.get("ready"):
                ready += 1
            continue
        if terminated is not None:
            if not terminated.get("reason"):
                if _int(terminated.get("signal")) != 0:
                    reason = f"Init:Signal:{_int(terminated.get('signal'))}"
                else:
                    reason = f"Init:ExitCode:{_int(terminated.get('exitCode'))}"
            else:
                reason = "Init:" + terminated["reason"]
        elif waiting is not None and waiting.get("reason") and waiting.get("reason") != "PodInitializing":
            reason = "Init:" + waiting["reason"]
        else:
            reason = f"Init:{i}/{len(init_specs)}"
        initializing = True
        break

    if not initializing or _true_condition(status.get("conditions"), "Initialized"):
        restarts = sidecar_restarts
        last_restart = last_sidecar_restart
        has_running = False
        # Walked backwards so that, as in kube-apiserver, the first container's state has the last word.
        for cs in reversed(status.get("containerStatuses") or []):
            restarts += _int(cs.get("restartCount"))
            finished = _last_termination_finished(cs)
            if finished is not None and (last_restart is None or finished > last_restart):
                last_restart = finished
            state = cs.get("state") or {}
            waiting, terminated = state.get("waiting"), state.get("terminated")
            if waiting is not None and waiting.get("reason"):
                reason = waiting["reason"]
            elif terminated is not None and terminated.get("reason"):
                reason = terminated["reason"]
            elif terminated is not None:
                if _int(terminated.get("signal")) != 0:
                    reason = f"Signal:{_int(terminated.get('signal'))}"
                else:
                    reason = f"ExitCode:{_int(terminated.get('exitCode'))}"
            elif cs.get("ready") and state.get("running") is not None:
                has_running = True
                ready += 1
        if reason == "Completed" and has_running:
            reason = "Running" if _true_condition(status.get("conditions"), "Ready") else "NotReady"

    if _meta(pod).get("deletionTimestamp"):
        if status.get("reason") == "NodeLost":
            reason = "Unknown"
        elif phase not in ("Succeeded", "Failed"):
            reason = "Terminating"

    return reason, ready, total, restarts, last_restart


def pod_status(pod: Obj) -> str:
    """The STATUS kubectl shows for a pod: CrashLoopBackOff, Init:0/1, Terminating, Running..."""
    return _pod_summary(pod)[0]


def _pod_row(pod: Obj, now: float) -> list[Any]:
    reason, ready, total, restarts, last_restart = _pod_summary(pod)
    restarts_cell = str(restarts)
    if restarts and last_restart is not None:
        restarts_cell = f"{restarts} ({human_duration(now - last_restart)} ago)"
    spec, status = _spec(pod), _status(pod)
    pod_ips = status.get("podIPs") or []
    ip = (pod_ips[0].get("ip") if pod_ips else None) or status.get("podIP") or "<none>"
    gates = spec.get("readinessGates") or []
    readiness = "<none>"
    if gates:
        conds = status.get("conditions") or []
        true_count = 0
        for gate in gates:
            for c in conds:
                if c.get("type") == gate.get("conditionType"):
                    true_count += c.get("status") == "True"
                    break
        readiness = f"{true_count}/{len(gates)}"
    return [
        _name(pod),
        f"{ready}/{total}",
        reason,
        restarts_cell,
        age_cell(pod, now),
        ip,
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        readiness,
        pod_gpu_request(pod),
    ]


_POD_COLUMNS = (
    NAME_COLUMN,
    Column("Ready", description="The aggregate readiness state of this pod for accepting traffic."),
    Column("Status", description="The aggregate status of the containers in this pod."),
    Column(
        "Restarts",
        description="The number of times the containers in this pod have been restarted and when the last "
        "container in this pod has restarted.",
    ),
    AGE_COLUMN,
    Column("IP", priority=1, description="IP address allocated to the pod."),
    Column("Node", priority=1, description="The node the pod is bound to."),
    Column("Nominated Node", priority=1, description="The node preemption made room on for this pod."),
    Column("Readiness Gates", priority=1, description="Readiness gates that are true, of all declared."),
    Column("GPUs", type="integer", priority=1, description="nvidia.com/gpu the pod requests."),
)
