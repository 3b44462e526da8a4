"""A PyTorchJob's sync as a decision: ``decide(observed, now) -> Actions``, touching nothing.

The job's phase is the condition that holds last in Kubeflow's order (Succeeded or Failed,
then Suspended, Restarting, Running, Created); ``TRANSITIONS`` is every change a sync may
make to it, with the condition, reason and Event each one writes. A sync reads, in order:
finished (clean pods, expire after the TTL), suspended (delete the gang), past the deadline,
an earlier gang still going, the leader succeeded, a member failed or lost (restart or fail),
the restart back-off, an automatic resize, a resize that re-forms the gang, and otherwise
members to add or remove in place.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api.gpu import GPU_UNHEALTHY_REASON, hardware_disruption
from gpufleet.api.k8s import ConfigMap, Pod
from gpufleet.api.kubeflow import (
    CREATED,
    FAILED,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    TRAINING_OPERATOR,
    WORKER,
    elastic_bounds,
    replica_specs,
    replicas_of,
    run_policy,
)
from gpufleet.api.podresources import pod_gpu_request
from gpufleet.client import objects
from gpufleet.client.events import NORMAL, WARNING
from gpufleet.controllers._common import find_condition, is_being_deleted, pod_phase, status_dict, timestamp
from gpufleet.controllers.actions import Actions, Create, Delete, Instant, Patch
from gpufleet.controllers.pytorchjob.model import (
    ATTEMPT_ANNOTATION,
    DEFAULT_CHECKPOINT_ROOT,
    ELASTIC_REASON_ANNOTATION,
    GANG_PENDING,
    GANG_SCHEDULED,
    HARDWARE_RESTARTS_ANNOTATION,
    KIND_REF,
    RESTARTS_ANNOTATION,
    _bound,
    _conditions,
    autoscale_enabled,
    exit_code,
    failure_is_retryable,
    gang_attempt,
    gang_members,
    gang_restarts,
    gang_wait_reason,
    hardware_restarts,
    is_finished,
    leader,
    pod_attempt,
    pod_gang_size,
    pod_member,
    pod_name,
    rendezvous_name,
    resize_in_place,
    set_job_condition,
)
from gpufleet.controllers.pytorchjob.pods import (
    fleet_address,
    free_gpus,
    node_down,
    pod_body,
    podgroup_body,
    rendezvous_body,
    replica_statuses,
    service_body,
)

log = logging.getLogger(__name__)

NEW = "New"  # no condition yet
ACTIVE = frozenset({CREATED, RUNNING, RESTARTING})


@dataclass(frozen=True)
class Transition:
    """One change of a job's phase: the condition it sets (``status``), with ``reason``, and
    the Event it records (``event``; every time it fires when ``always_event``, else only
    when the condition changed). ``sources``: the phases it fires from; ``to``: the phase
    after."""

    name: str
    sources: frozenset[str]
    to: str
    condition: str
    status: str
    reason: str
    event: str
    event_type: str = NORMAL
    always_event: bool = False


TRANSITIONS: dict[str, Transition] = {t.name: t for t in (
    Transition("Create", frozenset({NEW}), CREATED, CREATED, "True", "PyTorchJobCreated", "PyTorchJobCreated"),
    Transition("Suspend", ACTIVE, SUSPENDED, SUSPENDED, "True", "PyTorchJobSuspended", "PyTorchJobSuspended"),
    Transition("Resume", frozenset({SUSPENDED}), CREATED, SUSPENDED, "False", "PyTorchJobResumed",
               "PyTorchJobResumed"),
    Transition("Run", frozenset({CREATED, RESTARTING}), RUNNING, RUNNING, "True", "PyTorchJobRunning",
               "PyTorchJobRunning"),
    Transition("Restart", ACTIVE, RESTARTING, RESTARTING, "True", "PyTorchJobRestarting", "PyTorchJobRestarting",
               WARNING, True),
    # Work moves off failed hardware: not counted against backoffLimit. The reason is the
    # pod's DisruptionTarget reason (GPUUnhealthy, DeletionByTaintManager, DeletionByPodGC).
    Transition("MoveOffHardware", ACTIVE, RESTARTING, RESTARTING, "True", GPU_UNHEALTHY_REASON,
               GPU_UNHEALTHY_REASON, WARNING, True),
    Transition("Resize", ACTIVE, RESTARTING, RESTARTING, "True", "PyTorchJobResizing", "Resizing", NORMAL, True),
    Transition("Succeed", ACTIVE, SUCCEEDED, SUCCEEDED, "True", "PyTorchJobSucceeded", "PyTorchJobSucceeded",
               NORMAL, True),
    Transition("Fail", ACTIVE, FAILED, FAILED, "True", "PyTorchJobFailed", "PyTorchJobFailed", WARNING, True),
    Transition("ExceedBackoffLimit", ACTIVE, FAILED, FAILED, "True", "BackoffLimitExceeded",
               "BackoffLimitExceeded", WARNING, True),
    Transition("ExceedDeadline", ACTIVE, FAILED, FAILED, "True", "DeadlineExceeded", "DeadlineExceeded",
               WARNING, True),
)}


def phase(conditions: list[dict[str, Any]]) -> str:
    """The job's phase: the condition that holds last in Kubeflow's order."""
    for type_ in (SUCCEEDED, FAILED, SUSPENDED, RESTARTING, RUNNING, CREATED):
        cond = find_condition(conditions, type_)
        if cond is not None and cond.get("status") == "True":
            return type_
    return NEW


@dataclass(frozen=True)
class Settings:
    restart_backoff: float = 1.0
    restart_backoff_max: float = 60.0
    checkpoint_root: str = DEFAULT_CHECKPOINT_ROOT
    elastic_resize_interval: float = 30.0


@dataclass(frozen=True)
class Memory:
    """What the controller remembers of a job between syncs (monotonic times)."""

    not_before: float = 0.0  # no new gang before this (restart back-off)
    last_resize: float | None = None
    created: tuple[int, frozenset[tuple[str, int]]] | None = None  # (attempt, members it created)
    deleting: frozenset[str] = frozenset()  # uids of pods the controller deleted itself
    gang_wait: str | None = None  # the last GangPending reason reported


@dataclass(frozen=True)
class Observed:
    job: Any
    pods: list[Any]  # the pods the job owns
    nodes: list[Any] = field(default_factory=list)
    cluster_pods: list[Any] = field(default_factory=list)  # every pod: only for the automatic resize
    lead_pod: Any = None  # the cached pod of the leader's name
    memory: Memory = Memory()
    settings: Settings = Settings()


def restart_delay(settings: Settings, restarts: int) -> float:
    if settings.restart_backoff <= 0:
        return 0.0
    return min(settings.restart_backoff * 2 ** restarts, settings.restart_backoff_max)


def decide(observed: Observed, now: Instant) -> Actions:
    job = observed.job
    if is_being_deleted(job):
        return Actions(reason="Deleting")
    managed_by = run_policy(job).managed_by
    if managed_by is not None and managed_by != TRAINING_OPERATOR:
        return Actions(reason="ManagedElsewhere")  # another controller (MultiKueue) runs this job
    return _Sync(observed, now).run()


class _Sync:
    def __init__(self, observed: Observed, now: Instant) -> None:
        self.o = observed
        self.job = observed.job
        self.now = now
        self.name = objects.name_of(self.job)
        self.ns = objects.namespace_of(self.job)
        self.status = dict(status_dict(self.job))
        self.conditions = _conditions(self.job)
        self.nodes = {objects.name_of(n): n for n in observed.nodes}
        self.shared = fleet_address(observed.nodes)
        self.a = Actions()

    # -- the vocabulary -------------------------------------------------------------------

    def fire(self, name: str, message: str, reason: str | None = None) -> bool:
        """Apply transition ``name``; ``reason`` replaces the table's for the condition and
        the Event (MoveOffHardware says which disruption it was)."""
        t = TRANSITIONS[name]
        before = phase(self.conditions)
        changed = set_job_condition(self.conditions, t.condition, t.status, reason or t.reason, message,
                                    self.now.text)
        if changed and before not in t.sources:
            log.warning("pytorchjob %s/%s: %s from phase %s, which the table does not list",
                        self.ns, self.name, name, before)
        if changed or t.always_event:
            self.a.event(t.event_type, reason or t.event, message)
        return changed

    def done(self, reason: str, requeue: float | None = None) -> Actions:
        self.a.reason = reason
        self.a.requeue(requeue)
        return self.a

    def write(self) -> None:
        status = {k: v for k, v in self.status.items() if v not in (None, [], {})}
        if self.conditions:
            status["conditions"] = self.conditions
        old = {k: v for k, v in status_dict(self.job).items() if k != "lastReconcileTime"}
        new = {k: v for k, v in status.items() if k != "lastReconcileTime"}
        if _normal(old) == _normal(new):
            return
        status["lastReconcileTime"] = self.now.text
        self.a.status = status

    def delete_pods(self, pods: list[Any]) -> None:
        for p in pods:
            self.a.deletes.append(Delete(
                Pod, objects.name_of(p), objects.namespace_of(p), uid=objects.uid_of(p),
                grace_period_seconds=0 if node_down(p, self.nodes) else None,
                expect=True, must=False, success_reason="SuccessfulDeletePod"))

    def clean(self, pods: list[Any], policy: str) -> None:
        if policy == "All":
            self.delete_pods([p for p in pods if not is_being_deleted(p)])
        elif policy == "Running":
            self.delete_pods([p for p in pods if not is_being_deleted(p) and pod_phase(p) in ("Running", "Pending")])

    def fail(self, transition: str, message: str) -> None:
        self.fire(transition, message)
        self.status["completionTime"] = self.now.text
        self.status["replicaStatuses"] = replica_statuses(self.job, self.o.pods)
        self.write()
        # Failed pods stay for their logs; the rest of the gang stops.
        self.delete_pods([p for p in self.o.pods if not is_being_deleted(p)
                          and pod_phase(p) in ("Running", "Pending")])

    def expire(self, reason: str) -> Actions:
        ttl = run_policy(self.job).ttl_seconds_after_finished
        if ttl is None:
            return self.done(reason)
        finished = [timestamp(c.get("lastTransitionTime")) for c in self.conditions
                    if c.get("type") in (SUCCEEDED, FAILED) and c.get("status") == "True"]
        at = max([t for t in finished if t is not None] or [self.now.wall])
        left = at + ttl - self.now.wall
        if left > 0:
            return self.done(reason, left + 0.001)
        self.a.deletes.append(Delete(KIND_REF, self.name, self.ns, uid=objects.uid_of(self.job),
                                     propagation_policy="Foreground", ignore_conflict=True))
        return self.done(reason)

    def bump_attempt(self, attempt: int, restarts: int | None, hardware: int | None = None) -> None:
        annotations = {ATTEMPT_ANNOTATION: str(attempt)}
        if restarts is not None:
            annotations[RESTARTS_ANNOTATION] = str(restarts)
        if hardware is not None:
            annotations[HARDWARE_RESTARTS_ANNOTATION] = str(hardware)
        self.a.patches.append(Patch(KIND_REF, self.name, self.ns, {"metadata": {"annotations": annotations}},
                                    owner=True))
        if self.shared is None:
            cm = rendezvous_name(self.job)
            self.a.deletes.append(Delete(ConfigMap, cm, self.ns, forget=("cm", self.ns, cm)))

    def ensure_around(self) -> None:
        uid = objects.uid_of(self.job)
        self.a.creates.append(Create(service_body(self.job), on_exists="ignore", memo=(("svc", self.ns, self.name), uid)))
        pg = podgroup_body(self.job)
        marker = (uid, json.dumps(pg["spec"], sort_keys=True))
        self.a.creates.append(Create(pg, on_exists="update", fields=("spec",), optional=True,
                                     memo=(("pg", self.ns, self.name), marker)))

    def ensure_rendezvous(self, attempt: int) -> None:
        if self.shared is not None:
            return
        body = rendezvous_body(self.job, attempt, self.o.lead_pod, self.nodes)
        if body is not None:
            self.a.creates.append(Create(body, on_exists="update", fields=("data",),
                                         memo=(("cm", self.ns, body["metadata"]["name"]), body["data"])))

    # -- the sync -------------------------------------------------------------------------

    def run(self) -> Actions:
        job, pods, name = self.job, self.o.pods, self.name
        rp = run_policy(job)
        if is_finished(job):
            self.clean(pods, rp.clean_pod_policy or "None")
            self.status["replicaStatuses"] = replica_statuses(job, pods)
            self.write()
            return self.expire("Finished")

        self.fire("Create", f"PyTorchJob {name} is created.")
        if rp.suspend:
            self.delete_pods([p for p in pods if not is_being_deleted(p)])
            self.fire("Suspend", f"PyTorchJob {name} is suspended.")
            for t in (RUNNING, RESTARTING):
                c = find_condition(self.conditions, t)
                if c is not None and c.get("status") == "True":
                    c.update(status="False", lastUpdateTime=self.now.text, lastTransitionTime=self.now.text)
            self.status.pop("startTime", None)
            self.status["replicaStatuses"] = replica_statuses(job, pods)
            self.write()
            return self.done("Suspended")
        self.fire("Resume", f"PyTorchJob {name} is resumed.")
        if not self.status.get("startTime"):
            self.status["startTime"] = self.now.text

        deadline_in: float | None = None
        deadline = rp.active_deadline_seconds
        started = timestamp(self.status.get("startTime"))
        if deadline and started is not None:
            left = started + deadline - self.now.wall
            if left <= 0:
                self.fail("ExceedDeadline",
                          f"PyTorchJob {name} has failed because it was active longer than specified deadline")
                return self.expire("DeadlineExceeded")
            deadline_in = left + 0.001

        attempt, restarts = gang_attempt(job), gang_restarts(job)
        self.ensure_around()

        current = [p for p in pods if pod_attempt(p) == attempt and not is_being_deleted(p)]
        stale = [p for p in pods if pod_attempt(p) != attempt]
        # An earlier gang still on its way out: new pods reuse its names, so wait.
        if stale:
            self.delete_pods([p for p in stale if not is_being_deleted(p)])
            self.status["replicaStatuses"] = replica_statuses(job, pods)
            self.write()
            return self.done("EarlierGangLeaving", 1.0)

        by_member = {pod_member(p): p for p in current}
        lead_pod = by_member.get(leader(job))
        if lead_pod is not None and pod_phase(lead_pod) == "Succeeded":
            self.fire("Succeed", f"PyTorchJob {name} is successfully completed.")
            self.status["completionTime"] = self.now.text
            self.status["replicaStatuses"] = replica_statuses(job, pods)
            self.write()
            self.clean(pods, rp.clean_pod_policy or "None")
            return self.expire("Succeeded")

        wanted = set(gang_members(job))
        broken = hardware_failed_member(job, current, wanted)
        if broken is not None:
            return self.move_off_hardware(broken, attempt, current)
        trouble = gang_trouble(job, current, wanted, pods, self.o.memory)
        if trouble is not None:
            why, retryable = trouble
            if not retryable:
                self.fail("Fail", f"PyTorchJob {name} has failed because {why}.")
                return self.expire("Failed")
            limit = rp.backoff_limit
            if limit is not None and restarts >= limit:
                self.fail("ExceedBackoffLimit", f"PyTorchJob {name} has failed because it has reached the "
                                                f"specified backoff limit ({limit}): {why}.")
                return self.expire("BackoffLimitExceeded")
            self.fire("Restart", f"PyTorchJob {name} is restarting because {why}.")
            self.bump_attempt(attempt + 1, restarts + 1)
            self.delete_pods([p for p in pods if not is_being_deleted(p)])
            self.write()
            delay = restart_delay(self.o.settings, restarts)
            self.a.memo["not_before"] = self.now.monotonic + delay
            return self.done("Restart", max(delay, 0.05))

        wait = self.o.memory.not_before - self.now.monotonic
        if wait > 0:
            return self.done("RestartBackoff", wait + 0.001)

        if self.autoscale(current):
            return self.done(self.a.reason)  # the job's own update brings us back

        # A resize re-forms the whole group at the new size from its checkpoint.
        sizes = {pod_gang_size(p) for p in current}
        if current and not resize_in_place(job) and sizes != {len(wanted)}:
            old = max((s for s in sizes if s is not None), default=len(current))
            self.fire("Resize", f"PyTorchJob {name} is restarting with {len(wanted)} members (was {old}) "
                                "from its last checkpoint.")
            self.bump_attempt(attempt + 1, None)
            self.delete_pods(current)
            self.write()
            return self.done("Resize", 0.05)

        # In place: Workers above the wanted count go, missing ones are added.
        self.delete_pods([p for p in current if pod_member(p) not in wanted])
        missing = [m for m in gang_members(job) if m not in by_member]
        self.ensure_rendezvous(attempt)
        for rtype, index in missing:
            body = pod_body(job, rtype, index, attempt, checkpoint_root=self.o.settings.checkpoint_root,
                            shared_address=self.shared)
            self.a.creates.append(Create(body, expect=True, on_exists="ignore", tag=(attempt, (rtype, index)),
                                         success_reason="SuccessfulCreatePod", failure_reason="FailedCreatePod"))
        self.status["replicaStatuses"] = replica_statuses(job, pods)
        self.report_gang_wait(current)
        if not missing and all(pod_phase(by_member[m]) == "Running" for m in wanted if m in by_member):
            self.fire("Run", f"PyTorchJob {name} is running.")
        self.write()
        requeue = deadline_in
        interval = self.o.settings.elastic_resize_interval
        if autoscale_enabled(job) and interval > 0:
            requeue = min(requeue or interval, interval)
        return self.done("CreateMissing" if missing else "InPlace", requeue)

    def move_off_hardware(self, broken: Any, attempt: int, current: list[Any]) -> Actions:
        """A member Failed because its GPU or node failed (``api.gpu.pod_failed_by_hardware``):
        the work did not fail, so neither backoffLimit nor restartPolicy nor the back-off
        applies; the count goes to ``gpufleet.io/hardware-restarts``. An elastic job replaces
        only that member when torchrun can re-form the group without it (``replace_alone``):
        the others keep running. Any other job restarts its gang from its checkpoint on
        healthy GPUs (the failed GPU is fenced off its node)."""
        cond = hardware_disruption(broken)
        reason = _field(cond, "reason") or GPU_UNHEALTHY_REASON
        detail = _field(cond, "message") or (broken.status.message if broken.status is not None else None) or reason
        node = getattr(broken.spec, "node_name", None) or "no node"
        why = f"pod {objects.name_of(broken)} on node {node} failed with its hardware: {detail}"
        moves = hardware_restarts(self.job) + 1
        if replace_alone(self.job, broken):
            self.fire("MoveOffHardware", f"PyTorchJob {self.name} replaces one member because {why}; the "
                                         "other members re-form the group through the rendezvous.", reason)
            self.a.patches.append(Patch(KIND_REF, self.name, self.ns, {"metadata": {"annotations": {
                HARDWARE_RESTARTS_ANNOTATION: str(moves)}}}, owner=True))
            self.delete_pods([broken])
            self.status["replicaStatuses"] = replica_statuses(self.job, self.o.pods)
            self.write()
            return self.done("ReplaceMember", 0.05)
        self.fire("MoveOffHardware", f"PyTorchJob {self.name} is restarting from its last checkpoint on healthy "
                                     f"GPUs because {why}.", reason)
        self.bump_attempt(attempt + 1, None, moves)
        self.delete_pods([p for p in self.o.pods if not is_being_deleted(p)])
        self.write()
        self.a.memo["not_before"] = self.now.monotonic  # no back-off: the next gang goes on healthy GPUs
        return self.done("MoveOffHardware", 0.05)

    def report_gang_wait(self, current: list[Any]) -> None:
        """Say on the job why its gang waits: the scheduler holds every member back together
        (nothing bound, no GPU held) and writes its reason into each member's PodScheduled
        condition; that reason becomes a GangPending Event on the job, once per distinct
        reason, and GangScheduled once the whole gang is placed."""
        job = self.job
        known = self.o.memory.gang_wait
        # While members are still being created, the scheduler's word is about a gang not yet whole.
        reason = gang_wait_reason(current) if len(current) >= len(gang_members(job)) else None
        if reason is not None:
            if known != reason:
                self.a.memo["gang_wait"] = reason
                self.a.event(NORMAL, GANG_PENDING, f"PyTorchJob {self.name} waits for its gang: {reason}")
            return
        if known is not None and current and all(_bound(p) for p in current):
            self.a.memo["gang_wait"] = None
            self.a.event(NORMAL, GANG_SCHEDULED,
                         f"All {len(current)} pods of pod group {self.ns}/{self.name} are placed.")

    def autoscale(self, current: list[Any]) -> bool:
        """One Worker more or fewer, as the cluster's free GPUs and waiting pods say."""
        job = self.job
        if not autoscale_enabled(job):
            return False
        last = self.o.memory.last_resize
        if last is not None and self.now.monotonic - last < self.o.settings.elastic_resize_interval:
            return False
        step = resize_step(job, current, self.o.pods, self.o.cluster_pods, self.o.nodes)
        if step is None:
            return False
        replicas, reason, why = step
        lo, hi = elastic_bounds(job)
        message = f"Workers {replicas_of(job, WORKER)} -> {replicas} (min {lo}, max {hi}): {why}"
        patch = {"metadata": {"annotations": {ELASTIC_REASON_ANNOTATION: f"{reason}: {message}"}},
                 "spec": {"pytorchReplicaSpecs": {WORKER: {"replicas": replicas}}}}
        self.a.patches.append(Patch(KIND_REF, self.name, self.ns, patch))
        self.a.event(NORMAL, reason, message)
        self.a.memo["last_resize"] = self.now.monotonic
        self.a.reason = reason
        return True


def _priority(pod_spec: Any) -> int:
    return (pod_spec.priority if pod_spec is not None else None) or 0


def resize_step(job: Any, current: list[Any], own: list[Any], cluster_pods: list[Any],
                nodes: list[Any]) -> tuple[int, str, str] | None:
    """(workers, ElasticGrow or ElasticShrink, why) for an elastic job, else None: one Worker
    fewer (never below minReplicas) when pods of higher priority wait and fit nowhere; one
    more when a node has a Worker's GPUs free, the gang runs whole, and no pod of equal or
    higher priority waits."""
    lo, hi = elastic_bounds(job)
    workers = replicas_of(job, WORKER)
    template = replica_specs(job)[WORKER].template
    need = pod_gpu_request(template) if template is not None else 0
    job_priority = max((_priority(p.spec) for p in current), default=0)
    mine = {objects.uid_of(p) for p in own}
    waiting = [p for p in cluster_pods
               if pod_phase(p) == "Pending" and not (p.spec and p.spec.node_name)
               and not is_being_deleted(p) and objects.uid_of(p) not in mine]
    free = free_gpus(nodes, cluster_pods)
    if workers > lo:
        blocked = [p for p in waiting if _priority(p.spec) > job_priority
                   and pod_gpu_request(p) > max(free.values(), default=0)]
        if blocked:
            why = (f"pod {objects.namespace_of(blocked[0])}/{objects.name_of(blocked[0])} of higher priority "
                   f"waits for GPUs")
            return workers - 1, "ElasticShrink", why
    stable = len(current) == len(gang_members(job)) and all(pod_phase(p) == "Running" for p in current)
    if workers < hi and need > 0 and stable:
        if any(_priority(p.spec) >= job_priority for p in waiting):
            return None
        fits = [n for n, g in free.items() if g >= need]
        if fits:
            return workers + 1, "ElasticGrow", f"node {sorted(fits)[0]} has {free[sorted(fits)[0]]} idle GPUs"
    return None


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def replace_alone(job: Any, broken: Any) -> bool:
    """Whether a member lost to hardware is replaced under the running torchrun group: an
    elastic job resized in place, the member not its rendezvous host (whose store the others
    use), and ``elasticPolicy.maxRestarts`` at least 1. The survivors' workers fail on the
    collective that lost a peer; their torchrun agents restart them (one of maxRestarts) and
    re-form the group through the rendezvous, which the replacement then joins. With no
    restarts left, torchrun would exit and fail the survivors' pods too."""
    ep = job.spec.elastic_policy if job.spec is not None else None
    return (resize_in_place(job) and pod_member(broken) != leader(job)
            and ep is not None and (ep.max_restarts or 0) >= 1)


def hardware_failed_member(job: Any, current: list[Any], wanted: set[tuple[str, int]]) -> Any:
    """The first member of this attempt Failed by its hardware or node, else None. It goes
    before any other failure: when a GPU dies its peers often crash on the broken collective
    too, and those crashes are not the work's fault either."""
    for p in sorted(current, key=lambda p: objects.name_of(p)):
        if pod_member(p) in wanted and hardware_disruption(p) is not None:
            return p
    return None


def gang_trouble(job: Any, current: list[Any], wanted: set[tuple[str, int]], all_pods: list[Any],
                 memory: Memory) -> tuple[str, bool] | None:
    """(why, retryable) for the first failed or lost member, else None."""
    specs = replica_specs(job)
    for p in sorted(current, key=lambda p: objects.name_of(p)):
        member = pod_member(p)
        if member is None or member not in wanted or pod_phase(p) != "Failed":
            continue
        code = exit_code(p)
        node = getattr(p.spec, "node_name", None) or "no node"
        why = f"pod {objects.name_of(p)} failed on node {node}"
        why += f" (exit code {code})" if code is not None else ""
        policy = specs[member[0]].restart_policy if member[0] in specs else None
        if policy == "Never":
            why += ", and its restartPolicy is Never"
        elif policy == "ExitCode" and not failure_is_retryable(policy, code):
            why += ", a permanent error under restartPolicy ExitCode"
        return why, failure_is_retryable(policy, code)
    # A member of this attempt that existed and is gone (deleted, evicted with its node).
    present = {pod_member(p) for p in current}
    gone = [p for p in all_pods if is_being_deleted(p) and pod_member(p) in wanted
            and pod_member(p) not in present and objects.uid_of(p) not in memory.deleting]
    if gone:
        p = gone[0]
        if not (resize_in_place(job) and pod_member(p) != leader(job)):
            node = getattr(p.spec, "node_name", None) or "no node"
            return f"pod {objects.name_of(p)} on node {node} was lost", True
    created = memory.created if memory.created is not None and memory.created[0] == gang_attempt(job) else None
    # The sync runs only once this controller's creates were seen, so a member this attempt
    # created that no longer exists was lost, with the others (still running) or without them
    # (the whole gang on one node that died, its pods deleted at once).
    if not resize_in_place(job) and (current or created is not None):
        for member in sorted(created[1] if created is not None else ()):
            if member in wanted and member not in present:
                return f"pod {pod_name(objects.name_of(job), *member)} was lost", True
    elif (current or created is not None) and leader(job) not in present and created is not None \
            and leader(job) in created[1]:
        return f"pod {pod_name(objects.name_of(job), *leader(job))} (the rendezvous host) was lost", True
    return None


def _normal(status: dict[str, Any]) -> str:
    return json.dumps(status, sort_keys=True, default=str)
