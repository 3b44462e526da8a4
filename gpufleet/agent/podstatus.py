"""Pod status as the kubelet derives it from its containers' statuses: the phase, and the
Initialized / ContainersReady / Ready conditions. Pure functions, no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.utils.clock import rfc3339

OWNED_CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")


def sidecar_names(spec: Mapping[str, Any]) -> frozenset[str]:
    """The init containers with restartPolicy Always (native sidecars)."""
    return frozenset(c.get("name", "") for c in spec.get("initContainers") or []
                     if c.get("restartPolicy") == "Always")


def phase(spec: Mapping[str, Any], init_statuses: Sequence[Mapping[str, Any]],
          statuses: Sequence[Mapping[str, Any]]) -> str:
    """The kubelet's getPhase over container statuses (one per container, same order). A
    running sidecar counts as a running container; a stopped one counts for nothing."""
    policy = spec.get("restartPolicy") or "Always"
    sidecars = sidecar_names(spec)
    pending_init = failed_init = 0
    for cs in init_statuses:
        if cs.get("name") in sidecars:
            continue
        state = cs.get("state") or {}
        if "running" in state:
            pending_init += 1
        elif "terminated" in state:
            if state["terminated"].get("exitCode", 0) != 0:
                failed_init += 1
        elif "waiting" in state:
            last = (cs.get("lastState") or {}).get("terminated")
            if last is not None and last.get("exitCode", 0) != 0:
                failed_init += 1
            else:
                pending_init += 1
        else:
            pending_init += 1
    if failed_init and policy == "Never":
        return "Failed"
    if pending_init or failed_init:
        return "Pending"
    running = waiting = stopped = succeeded = unknown = 0
    for cs in statuses:
        state = cs.get("state") or {}
        if "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            if state["terminated"].get("exitCode", 0) == 0:
                succeeded += 1
        elif "waiting" in state:
            if (cs.get("lastState") or {}).get("terminated") is not None:
                stopped += 1
            else:
                waiting += 1
        else:
            unknown += 1
    for cs in init_statuses:
        if cs.get("name") not in sidecars:
            continue
        state = cs.get("state") or {}
        if "running" in state:
            running += 1
        elif "waiting" in state and (cs.get("lastState") or {}).get("terminated") is None:
            waiting += 1
    if waiting:
        return "Pending"
    if running and not unknown:
        return "Running"
    if not running and stopped and not unknown:
        if policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        if policy == "Never":
            return "Failed"
        return "Running"
    return "Pending"


def terminal_phase(statuses: Sequence[Mapping[str, Any]]) -> str:
    """The phase of a pod whose containers were all stopped for good (deleted, or evicted):
    Succeeded only when every container exited cleanly."""
    for cs in statuses:
        term = (cs.get("state") or {}).get("terminated")
        if term is None or term.get("exitCode", 0) != 0:
            return "Failed"
    return "Succeeded"


def _names(statuses: Sequence[Mapping[str, Any]], pred) -> list[str]:
    return [cs["name"] for cs in statuses if pred(cs)]


def conditions(pod_phase: str, init_statuses: Sequence[Mapping[str, Any]],
               statuses: Sequence[Mapping[str, Any]], readiness_gates: Sequence[Mapping[str, Any]],
               existing: Sequence[Mapping[str, Any]], now: float,
               sidecars: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The pod's conditions: those the agent owns recomputed (keeping lastTransitionTime when
    a status did not change), every other condition (DisruptionTarget, readiness gates
    written by others) kept as it was. A sidecar (named in ``sidecars``) is initialized once
    started, and its readiness counts toward ContainersReady."""
    by_type = {c.get("type"): c for c in existing}
    new: dict[str, tuple[str, str, str]] = {}

    sched = by_type.get("PodScheduled")
    new["PodScheduled"] = ("True", "", "") if sched is None else (
        sched.get("status", "True"), sched.get("reason", ""), sched.get("message", ""))

    incomplete = _names(init_statuses, lambda cs: not (cs.get("started") if cs.get("name") in sidecars
                                                       else _succeeded(cs)))
    if incomplete and any(_ran(cs) for cs in statuses):
        incomplete = []  # initialized before: a sidecar restarting does not undo that
    if not incomplete:
        new["Initialized"] = ("True", "PodCompleted" if pod_phase in ("Succeeded", "Failed") and init_statuses
                              else "", "")
    else:
        new["Initialized"] = ("False", "ContainersNotInitialized",
                              f"containers with incomplete status: [{' '.join(incomplete)}]")

    unready = _names([cs for cs in init_statuses if cs.get("name") in sidecars], lambda cs: not cs.get("ready"))
    unready += _names(statuses, lambda cs: not cs.get("ready"))
    if pod_phase == "Succeeded":
        new["ContainersReady"] = ("False", "PodCompleted", "")
    elif unready:
        new["ContainersReady"] = ("False", "ContainersNotReady",
                                  f"containers with unready status: [{' '.join(unready)}]")
    else:
        new["ContainersReady"] = ("True", "", "")

    ready = new["ContainersReady"]
    if ready[0] == "True":
        missing = [g.get("conditionType") for g in readiness_gates
                   if (by_type.get(g.get("conditionType")) or {}).get("status") != "True"]
        if missing:
            ready = ("False", "ReadinessGatesNotReady",
                     f"corresponding condition of pod readiness gate \"{missing[0]}\" does not exist.")
    new["Ready"] = ready

    out: list[dict[str, Any]] = []
    stamp = rfc3339(now)
    for ctype in OWNED_CONDITIONS:
        status, reason, message = new[ctype]
        old = by_type.get(ctype)
        cond: dict[str, Any] = {"type": ctype, "status": status, "lastProbeTime": None}
        if old is not None and old.get("status") == status and old.get("lastTransitionTime"):
            cond["lastTransitionTime"] = old["lastTransitionTime"]
        else:
            cond["lastTransitionTime"] = stamp
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        out.append(cond)
    out.extend(dict(c) for c in existing if c.get("type") not in OWNED_CONDITIONS)
    return out


def _ran(cs: Mapping[str, Any]) -> bool:
    state = cs.get("state") or {}
    return "running" in state or "terminated" in state or bool((cs.get("lastState") or {}).get("terminated"))


def _succeeded(cs: Mapping[str, Any]) -> bool:
    term = (cs.get("state") or {}).get("terminated")
    return term is not None and term.get("exitCode", 0) == 0


def conditions_equal(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """Equal except for times: a rewrite that only moves lastTransitionTime is no change."""
    def key(conds):
        return sorted((c.get("type"), c.get("status"), c.get("reason"), c.get("message")) for c in conds)
    return key(a) == key(b)
