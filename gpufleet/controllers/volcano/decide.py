"""A Volcano Job's sync as a decision: ``decide(observed, now) -> Actions``, touching nothing.

The phase is ``status.state.phase``, moved as Volcano's job state machine moves it
(``TRANSITIONS``). A sync reads, in order: finished (stop what still runs, expire after the
TTL); a phase on its way somewhere (Restarting, Aborting, Completing, Terminating: delete the
pods, then go on once they are gone); an event of a pod that a lifecycle policy answers
(PodFailed, PodEvicted, TaskCompleted, ... -> RestartJob, AbortJob, CompleteJob,
TerminateJob, RestartTask, RestartPod); otherwise the PodGroup, the plugins' objects, and,
once the Queue admitted the PodGroup (it left Pending), the missing pods; then Pending ->
Running -> Completed or Failed from the counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api import volcano as vc
from gpufleet.api.k8s import Pod
from gpufleet.client import objects
from gpufleet.client.events import NORMAL, WARNING
from gpufleet.controllers._common import is_being_deleted, pod_phase, status_dict, timestamp
from gpufleet.controllers.actions import Actions, Create, Delete, Instant, Patch
from gpufleet.controllers.pytorchjob.model import exit_code
from gpufleet.controllers.volcano.model import (
    KIND_REF,
    SSH_PLUGIN,
    SVC_PLUGIN,
    counts,
    is_active,
    matching_policy,
    phase_of,
    pod_index,
    pod_name,
    pod_task,
    pod_version,
    podgroup_name,
    retry_count,
    ssh_secret_name,
    svc_configmap_name,
    task_status_count,
    version_of,
)
from gpufleet.controllers.volcano.pods import (
    fleet_address,
    pod_body,
    podgroup_body,
    service_body,
    ssh_secret_body,
    svc_configmap_body,
)

# Every phase change a sync may make: (from phases, to phase).
TRANSITIONS: dict[str, tuple[frozenset[str], str]] = {
    "Start": (frozenset({""}), vc.PENDING),
    "Run": (frozenset({vc.PENDING}), vc.RUNNING),
    "Restart": (frozenset({vc.PENDING, vc.RUNNING}), vc.RESTARTING),
    "Restarted": (frozenset({vc.RESTARTING}), vc.PENDING),
    "ExceedMaxRetry": (frozenset({vc.RESTARTING}), vc.FAILED),
    "Abort": (frozenset({vc.PENDING, vc.RUNNING, vc.RESTARTING}), vc.ABORTING),
    "Aborted": (frozenset({vc.ABORTING}), vc.ABORTED),
    "Complete": (frozenset({vc.PENDING, vc.RUNNING}), vc.COMPLETING),
    "Completed": (frozenset({vc.COMPLETING}), vc.COMPLETED),
    "Terminate": (frozenset({vc.PENDING, vc.RUNNING, vc.RESTARTING}), vc.TERMINATING),
    "Terminated": (frozenset({vc.TERMINATING}), vc.TERMINATED),
    "Succeed": (frozenset({vc.PENDING, vc.RUNNING}), vc.COMPLETED),
    "Fail": (frozenset({vc.PENDING, vc.RUNNING}), vc.FAILED),
}

# The action that moves a job, and the phase the pods are then deleted in.
_ACTION_TRANSITION = {vc.RESTART_JOB: "Restart", vc.ABORT_JOB: "Abort", vc.COMPLETE_JOB: "Complete",
                      vc.TERMINATE_JOB: "Terminate"}
# Phases on their way somewhere: (what happens once the pods are gone, keep ended pods).
_LEAVING = {vc.ABORTING: ("Aborted", True), vc.COMPLETING: ("Completed", True),
            vc.TERMINATING: ("Terminated", True), vc.RESTARTING: ("Restarted", False)}


@dataclass(frozen=True)
class Memory:
    """What the controller remembers of a job between syncs."""

    created: tuple[int, frozenset[str]] | None = None  # (version, pod names it created)
    deleting: frozenset[str] = frozenset()  # uids of pods the controller deleted itself
    pending_reason: str | None = None  # the last PodGroupPending reason reported


@dataclass(frozen=True)
class Observed:
    job: vc.VolcanoJob
    pods: list[Any]  # the pods the job owns
    podgroup: vc.VolcanoPodGroup | None = None
    nodes: list[Any] = field(default_factory=list)
    ssh_secret_exists: bool = False
    memory: Memory = Memory()


def decide(observed: Observed, now: Instant) -> Actions:
    if is_being_deleted(observed.job):
        return Actions(reason="Deleting")
    return _Sync(observed, now).run()


class _Sync:
    def __init__(self, observed: Observed, now: Instant) -> None:
        self.o = observed
        self.job = observed.job
        self.now = now
        self.name = objects.name_of(self.job)
        self.ns = objects.namespace_of(self.job)
        self.status = dict(status_dict(self.job))
        self.phase = phase_of(self.job)
        self.a = Actions()

    # -- the vocabulary -------------------------------------------------------------------

    def move(self, transition: str, reason: str = "", message: str = "") -> None:
        sources, to = TRANSITIONS[transition]
        if self.phase == to:
            return
        self.phase = to
        self.status["state"] = {"phase": to, "reason": reason, "message": message,
                                "lastTransitionTime": self.now.text}
        self.status["conditions"] = [*(self.status.get("conditions") or []),
                                     {"status": to, "lastTransitionTime": self.now.text}]
        if to in vc.FINISHED_PHASES:
            self.mark_podgroup_completed()

    def mark_podgroup_completed(self) -> None:
        pg = self.o.podgroup
        if pg is not None and (pg.status is None or pg.status.phase != vc.PG_COMPLETED):
            self.a.patches.append(Patch(vc.VolcanoPodGroup, podgroup_name(self.job), self.ns,
                                        {"status": {"phase": vc.PG_COMPLETED}}, subresource="status"))

    def done(self, reason: str, requeue: float | None = None) -> Actions:
        self.write()
        self.a.reason = reason
        self.a.requeue(requeue)
        return self.a

    def write(self) -> None:
        pods = [p for p in self.o.pods if pod_version(p) == version_of_status(self.status)]
        self.status.update(counts(pods))
        self.status["taskStatusCount"] = task_status_count(pods)
        self.status["minAvailable"] = vc.job_min_available(self.job)
        controlled = {f"plugin-{p}": p for p in vc.plugins_of(self.job) if p in vc.PLUGINS}
        if controlled:
            self.status["controlledResources"] = controlled
        status = {k: v for k, v in self.status.items() if v not in (None, {}, [])}
        old = {k: v for k, v in status_dict(self.job).items() if v not in (None, {}, [])}
        if _normal(old) != _normal(status):
            self.a.status = status

    def delete_pods(self, pods: list[Any]) -> None:
        for p in pods:
            if is_being_deleted(p):
                continue
            self.a.deletes.append(Delete(Pod, objects.name_of(p), self.ns, uid=objects.uid_of(p), expect=True,
                                         must=False, success_reason="SuccessfulDeletePod"))

    def expire(self, reason: str) -> Actions:
        ttl = self.job.spec.ttl_seconds_after_finished if self.job.spec is not None else None
        if ttl is None:
            return self.done(reason)
        at = timestamp((self.status.get("state") or {}).get("lastTransitionTime")) or self.now.wall
        left = at + ttl - self.now.wall
        if left > 0:
            return self.done(reason, left + 0.001)
        self.a.deletes.append(Delete(KIND_REF, self.name, self.ns, uid=objects.uid_of(self.job),
                                     propagation_policy="Background", ignore_conflict=True))
        self.a.reason = reason
        return self.a

    # -- the sync -------------------------------------------------------------------------

    def run(self) -> Actions:
        pods = self.o.pods
        if self.phase in vc.FINISHED_PHASES:
            # Whatever still runs stops; ended pods stay for their logs.
            self.delete_pods([p for p in pods if is_active(p)])
            self.mark_podgroup_completed()
            return self.expire("Finished")
        if not self.phase:
            self.move("Start")
            self.status.setdefault("version", 0)
            self.status.setdefault("retryCount", 0)
        if self.phase in _LEAVING:
            return self.leave()

        version = version_of(self.job)
        stale = [p for p in pods if pod_version(p) != version]
        self.delete_pods(stale)
        current = [p for p in pods if pod_version(p) == version]
        event = self.pod_event(current, pods, version)
        if event is not None:
            return self.react(*event, current)

        self.ensure_around()
        pg = self.o.podgroup
        pg_phase = (pg.status.phase if pg is not None and pg.status is not None else None) or vc.PG_PENDING
        if pg is None or pg_phase == vc.PG_PENDING:
            self.report_pending(pg)
            return self.done("PodGroupPending")
        self.create_missing(current, version)
        c = counts(current)
        min_available = vc.job_min_available(self.job)
        total = vc.total_replicas(self.job)
        min_success = self.job.spec.min_success if self.job.spec is not None else None
        if min_success is not None and c["succeeded"] >= min_success:
            self.move("Succeed", "", f"{c['succeeded']} pods succeeded (minSuccess {min_success})")
            self.delete_pods([p for p in current if is_active(p)])
            return self.expire("Completed")
        if total and c["succeeded"] + c["failed"] >= total and len(current) >= total:
            if (min_success is not None and c["succeeded"] < min_success) or c["succeeded"] < min_available \
                    or self.task_short():
                self.move("Fail", "", f"{c['succeeded']} of {total} pods succeeded, minAvailable {min_available}")
                self.a.event(WARNING, "JobFailed", f"Job {self.ns}/{self.name} failed: {c['failed']} pods failed")
                return self.expire("Failed")
            self.move("Succeed", "", f"{c['succeeded']} of {total} pods succeeded")
            return self.expire("Completed")
        if self.phase == vc.PENDING and c["running"] + c["succeeded"] + c["failed"] >= min_available:
            self.move("Run")
        return self.done("Sync")

    def task_short(self) -> bool:
        """A task with fewer Succeeded pods than its minAvailable, once all pods ended (as
        Volcano checks it: only when the job's minAvailable covers every task's)."""
        tasks_min = sum(t.min_available or 0 for t in vc.tasks_of(self.job))
        if vc.job_min_available(self.job) < tasks_min:
            return False
        counted = task_status_count([p for p in self.o.pods if pod_version(p) == version_of(self.job)])
        for t in vc.tasks_of(self.job):
            if t.min_available is not None and t.min_available > 0:
                ok = ((counted.get(t.name or "") or {}).get("phase") or {}).get("Succeeded", 0)
                if ok < t.min_available:
                    return True
        return False

    def leave(self) -> Actions:
        """Restarting, Aborting, Completing, Terminating: delete the pods (all of them for a
        restart; those still running otherwise), then move on once they are gone. A restart
        that used up maxRetry fails the job instead."""
        then, keep_ended = _LEAVING[self.phase]
        pods = self.o.pods
        if self.phase == vc.RESTARTING and retry_count(self.job) >= vc.max_retry(self.job):
            self.delete_pods([p for p in pods if is_active(p)])
            self.move("ExceedMaxRetry", "MaxRetryExceeded",
                      f"Job {self.ns}/{self.name} was restarted {retry_count(self.job)} times (maxRetry "
                      f"{vc.max_retry(self.job)})")
            self.a.event(WARNING, "JobFailed", (self.status.get("state") or {}).get("message", ""))
            return self.expire("Failed")
        going = [p for p in pods if not keep_ended or is_active(p) or
                 (is_being_deleted(p) and pod_phase(p) in ("Pending", "Running"))]
        self.delete_pods(going)
        if going:
            return self.done(f"{self.phase}Waiting")
        self.move(then, (self.status.get("state") or {}).get("reason", ""),
                  (self.status.get("state") or {}).get("message", ""))
        if self.phase in vc.FINISHED_PHASES:
            return self.expire(then)
        return self.done(then, 0.01)

    def pod_event(self, current: list[Any], pods: list[Any], version: int) -> tuple[str, Any, str] | None:
        """(event, pod or task name, why) of the first pod event a lifecycle policy answers."""
        for p in sorted(current, key=objects.name_of):
            task = pod_task(p)
            if pod_phase(p) == "Failed":
                code = exit_code(p)
                event = vc.POD_EVICTED if (p.status is not None and p.status.reason == "Evicted") else vc.POD_FAILED
                why = f"pod {objects.name_of(p)} failed" + (f" (exit code {code})" if code is not None else "")
                if matching_policy(self.job, task, event, code) is not None:
                    return event, p, why
            elif is_being_deleted(p) and objects.uid_of(p) not in self.o.memory.deleting \
                    and pod_phase(p) in ("Pending", "Running"):
                if matching_policy(self.job, task, vc.POD_EVICTED, None) is not None:
                    return vc.POD_EVICTED, p, f"pod {objects.name_of(p)} was evicted"
        created = self.o.memory.created
        if created is not None and created[0] == version:
            present = {objects.name_of(p) for p in current}
            for gone in sorted(created[1] - present):
                task = next((t.name for t in vc.tasks_of(self.job)
                             if gone.startswith(f"{self.name}-{t.name}-")), None)
                if matching_policy(self.job, task, vc.POD_EVICTED, None) is not None:
                    return vc.POD_EVICTED, gone, f"pod {gone} was deleted"
        for t in vc.tasks_of(self.job):
            mine = [p for p in current if pod_task(p) == t.name]
            if vc.task_replicas(t) and len(mine) >= vc.task_replicas(t) \
                    and all(pod_phase(p) == "Succeeded" for p in mine) \
                    and matching_policy(self.job, t.name, vc.TASK_COMPLETED, None) is not None:
                return vc.TASK_COMPLETED, t.name, f"task {t.name} completed"
        return None

    def react(self, event: str, subject: Any, why: str, current: list[Any]) -> Actions:
        task = subject if isinstance(subject, str) and event == vc.TASK_COMPLETED else (
            pod_task(subject) if not isinstance(subject, str) else next(
                (t.name for t in vc.tasks_of(self.job) if subject.startswith(f"{self.name}-{t.name}-")), None))
        code = exit_code(subject) if not isinstance(subject, str) else None
        policy = matching_policy(self.job, task, event, code)
        assert policy is not None
        action = policy.action or vc.SYNC_JOB
        self.a.event(NORMAL, "ExecuteAction", f"Start to execute action {action} because {why} ({event})")
        transition = _ACTION_TRANSITION.get(action)
        if transition is not None:
            self.move(transition, event, f"{action}: {why}")
            if action == vc.RESTART_JOB:
                self.status["retryCount"] = retry_count(self.job) + 1
                self.status["version"] = version_of(self.job) + 1
                self.delete_pods(list(self.o.pods))
            else:
                self.delete_pods([p for p in self.o.pods if is_active(p)])
            return self.done(action, 0.01)
        if action == vc.RESTART_TASK:
            self.delete_pods([p for p in current if pod_task(p) == task])
            return self.done(action)
        if action == vc.RESTART_POD and not isinstance(subject, str):
            self.delete_pods([subject])
            return self.done(action)
        return self.done("SyncJob")

    def ensure_around(self) -> None:
        uid = objects.uid_of(self.job)
        pg = podgroup_body(self.job)
        self.a.creates.append(Create(pg, on_exists="update", fields=("spec",),
                                     memo=(("pg", self.ns, self.name), (uid, json.dumps(pg["spec"], sort_keys=True)))))
        plugins = vc.plugins_of(self.job)
        if SVC_PLUGIN in plugins:
            self.a.creates.append(Create(service_body(self.job), on_exists="ignore",
                                         memo=(("svc", self.ns, self.name), uid)))
            cm = svc_configmap_body(self.job)
            self.a.creates.append(Create(cm, on_exists="update", fields=("data",),
                                         memo=(("cm", self.ns, svc_configmap_name(self.job)), json.dumps(
                                             cm["data"], sort_keys=True))))
        if SSH_PLUGIN in plugins and not self.o.ssh_secret_exists:
            self.a.creates.append(Create(ssh_secret_body(self.job), on_exists="ignore",
                                         memo=(("secret", self.ns, ssh_secret_name(self.job)), uid)))

    def report_pending(self, pg: vc.VolcanoPodGroup | None) -> None:
        """Volcano's PodGroupPending Event, once per distinct reason its Queue gave."""
        reason = None if pg is None else next(
            (c.message for c in (pg.status.conditions if pg.status is not None else None) or []
             if c.type == vc.PG_UNSCHEDULABLE and c.status == "True" and c.message), None)
        if reason is not None and reason != self.o.memory.pending_reason:
            self.a.memo["pending_reason"] = reason
            self.a.event(NORMAL, "PodGroupPending",
                         f"PodGroup {self.ns}:{podgroup_name(self.job)} unschedule,reason: {reason}")

    def create_missing(self, current: list[Any], version: int) -> None:
        # A missing pod (never made, or deleted with no policy answering) is made, as Volcano does.
        have = {(pod_task(p), pod_index(p)) for p in current}
        shared = fleet_address(self.o.nodes) if SVC_PLUGIN in vc.plugins_of(self.job) else None
        for t in vc.tasks_of(self.job):
            for i in range(vc.task_replicas(t)):
                if (t.name, i) in have:
                    continue
                name = pod_name(self.name, t.name or "", i)
                body = pod_body(self.job, t, i, version=version, retries=retry_count(self.job), shared_address=shared)
                self.a.creates.append(Create(body, expect=True, on_exists="ignore", tag=(version, name),
                                             success_reason="SuccessfulCreatePod",
                                             failure_reason="FailedCreatePod"))


def version_of_status(status: dict[str, Any]) -> int:
    return int(status.get("version") or 0)


def _normal(status: dict[str, Any]) -> str:
    return json.dumps(status, sort_keys=True, default=str)

