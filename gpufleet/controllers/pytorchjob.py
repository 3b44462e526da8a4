"""PyTorchJob: a gang of pods (one Master, N Workers) that trains together, restarts together
from its last checkpoint, and resizes between elasticPolicy.minReplicas and maxReplicas.

What it does, as Kubeflow's training operator does:
- pods ``<job>-master-0`` and ``<job>-worker-<i>`` from the replica templates, labelled
  ``training.kubeflow.org/job-name``, ``replica-type`` (master/worker), ``replica-index``,
  ``operator-name`` (and ``job-role: master`` on the master); a headless Service ``<job>``
  selecting them; conditions Created, Running, Restarting, Succeeded, Failed, Suspended with
  upstream's reasons (PyTorchJobCreated, ...); ``replicaStatuses`` per type with a selector,
  which the scale subresource reads;
- the environment Kubeflow gives (into the container named ``pytorch``, else the first):
  MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, PET_NNODES, PET_NODE_RANK,
  PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT, PYTHONUNBUFFERED; in elastic mode
  instead of WORLD_SIZE/RANK: PET_NNODES (below), PET_RDZV_BACKEND, PET_RDZV_ENDPOINT,
  PET_RDZV_ID, PET_RDZV_CONF, PET_MAX_RESTARTS, PET_STANDALONE; plus
  GPUFLEET_CHECKPOINT_DIR (below). A variable the template sets itself is left alone;
- a PodGroup (scheduling.x-k8s.io/v1alpha1) named after the job, owned by it, with minMember
  the pods of the gang (runPolicy.schedulingPolicy.minAvailable when given; minReplicas plus
  the Master when Workers are resized in place, below); every pod carries
  ``scheduling.x-k8s.io/pod-group``;
- while the scheduler holds the gang back (a PodGroup is placed whole or not at all), an
  Event GangPending on the job carries the scheduler's reason (e.g. "pod group default/b:
  2 of 6 members fit, needs minMember 6; ..."), once per distinct reason; GangScheduled
  follows once every member is placed. The conditions stay Kubeflow's;
- ``runPolicy.suspend`` deletes the pods (condition Suspended); resuming creates them again;
  a job whose ``runPolicy.managedBy`` names another controller (MultiKueue) is left alone;
  ``activeDeadlineSeconds`` fails the job (DeadlineExceeded); ``cleanPodPolicy`` and
  ``ttlSecondsAfterFinished`` apply once it finished.

Where gpufleet differs, and why:
- Addresses. There is no cluster DNS, so MASTER_ADDR (and the rendezvous host) is an
  address, not the master's Service name. The leader (master-0, or worker-0 without a
  master) reads its own ``status.podIP``; the others read key ``MASTER_ADDR`` of the
  ConfigMap ``<job>-rendezvous``, which the controller writes once the leader has an
  address (its node's, when the node's pods share the host's network as with the process
  runtime; its own pod IP otherwise); until then the node agent holds those containers back
  (CreateContainerConfigError, retried). When pods share the host's network and every node
  has the same address (one server, or a test fleet on loopback), it is that address, known
  before scheduling.
- Port. Jobs whose pods share one server's network must not collide, so each gang attempt
  gets its own port (20000-39999, from the job's uid and the attempt) as the containerPort of
  the leader's ``pytorchjob-port``, pinned as the node port by the leader's annotation
  ``gpufleet.io/rendezvous-port`` (not a hostPort, which Pod Security's baseline refuses);
  the agent then refuses to start a second pod holding it. ``elasticPolicy.rdzvPort`` fixes
  it instead.
- Restarts. Member pods run with restartPolicy Never and the controller restarts the whole
  gang: when a member fails (replica restartPolicy OnFailure/Always; ExitCode only for exit
  codes above 127, i.e. signals; Never fails the job) or is lost (deleted, or evicted with its
  node), every member is deleted (members on nodes that are not Ready with
  gracePeriodSeconds=0), condition Restarting says which pod, node and exit code, and once
  the old pods are gone a new gang is created after a back-off. Each restart counts against
  ``runPolicy.backoffLimit`` (unlimited when unset, as upstream); the count is kept in the
  job's annotation ``gpufleet.io/gang-restarts``; ``gpufleet.io/gang-attempt`` numbers the
  gangs (restarts and resizes) and every pod carries the attempt it belongs to.
- Resizing. An elastic job's Workers (edit, scale subresource, automatic resize) are added
  and removed under the running torchrun group, as upstream: torchrun sees members join or
  leave, restarts its processes and re-forms the group, and the script resumes from its
  checkpoint; a lost Worker other than worker-0 (the rendezvous host) is only replaced.
  Elastic pods get TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the rendezvous store shared
  as the workers' store (torch's default), nodes joining a later round wait forever for the
  bootstrap address that the rank-0 agent only publishes in its first round.
  With the annotation ``gpufleet.io/elastic-resize: restart``, and for every job without an
  elasticPolicy, a change of the Workers restarts the whole gang at the new size from its
  checkpoint instead, not counted as a failure (condition Restarting, reason
  PyTorchJobResizing; pods carry ``gpufleet.io/gang-size``); torchrun is then told the exact
  size (PET_NNODES "n:n").
- Checkpoints. GPUFLEET_CHECKPOINT_DIR is the same for every member and every attempt:
  the job's annotation ``gpufleet.io/checkpoint-dir`` when set, else
  ``<checkpoint_root>/<namespace>/<job>-<uid[:8]>``. Across servers it must be on a shared
  filesystem (an NFS export mounted at the same path on every server).
- Automatic resize (elastic jobs with maxReplicas > minReplicas, unless the job's annotation
  ``gpufleet.io/elastic-autoscale`` is ``"false"``, and not for jobs in a Kueue queue, whose
  size the queue admitted): one more Worker when a schedulable, Ready
  node has the GPUs a Worker asks for free and no pod of equal or higher priority is waiting
  to be scheduled; one Worker fewer (never below minReplicas) when pods of higher priority
  wait and do not fit anywhere. At most one step per ``elastic_resize_interval``; each step
  is an Event (ElasticGrow/ElasticShrink) and the annotation ``gpufleet.io/elastic-reason``.

Success: the Master succeeded; without a Master, worker-0 succeeded.
"""

from __future__ import annotations

import json
import logging
import zlib
from typing import Any

from gpufleet.api.gpu import GPU_RESOURCE
from gpufleet.api.k8s import ConfigMap, Node, Pod
from gpufleet.api.kubeflow import (
    CREATED,
    DEFAULT_CONTAINER_NAME,
    DEFAULT_PORT_NAME,
    FAILED,
    MASTER,
    RENDEZVOUS_PORT_ANNOTATION,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    TRAINING_OPERATOR,
    WORKER,
    PyTorchJob,
    elastic_bounds,
    is_elastic,
    replica_specs,
    replicas_of,
    run_policy,
)
from gpufleet.api.podresources import container_gpu_request, pod_gpu_request
from gpufleet.api.quantity import parse_quantity
from gpufleet.api.taints import NO_EXECUTE, NO_SCHEDULE, taint_tuples
from gpufleet.client import objects
from gpufleet.client.api import Client, retry_on_conflict
from gpufleet.client.controller import Controller, Requeue
from gpufleet.client.errors import AlreadyExists, ApiError, Conflict, NotFound
from gpufleet.client.events import NORMAL, WARNING, EventRecorder
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.client.workqueue import WorkQueue
from gpufleet.controllers._common import (
    CONTROLLER_UID_INDEX,
    Expectations,
    error_text,
    find_condition,
    index_by_controller,
    is_being_deleted,
    now_text,
    owner_reference,
    pod_from_template,
    pod_phase,
    resolve_controller,
    slow_start_batch,
    status_dict,
    timestamp,
)
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
OPERATOR_NAME = "pytorchjob-controller"

JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"

ATTEMPT_ANNOTATION = "gpufleet.io/gang-attempt"
RESTARTS_ANNOTATION = "gpufleet.io/gang-restarts"
GANG_SIZE_ANNOTATION = "gpufleet.io/gang-size"
RESIZE_ANNOTATION = "gpufleet.io/elastic-resize"
CHECKPOINT_ANNOTATION = "gpufleet.io/checkpoint-dir"
AUTOSCALE_ANNOTATION = "gpufleet.io/elastic-autoscale"
ELASTIC_REASON_ANNOTATION = "gpufleet.io/elastic-reason"
CHECKPOINT_ENV = "GPUFLEET_CHECKPOINT_DIR"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PODGROUP_API_VERSION = "scheduling.x-k8s.io/v1alpha1"
DEFAULT_CHECKPOINT_ROOT = "/var/tmp/gpufleet/checkpoints"
GANG_PENDING = "GangPending"
GANG_SCHEDULED = "GangScheduled"
PORT_BASE = 20000
PORT_SPAN = 20000


# -- pure helpers -----------------------------------------------------------------------------


def pod_name(job_name: str, rtype: str, index: int) -> str:
    return f"{job_name}-{rtype.lower()}-{index}"


def gang_members(job: PyTorchJob) -> list[tuple[str, int]]:
    """(replica type, index) of every pod the job wants now, the leader first."""
    out: list[tuple[str, int]] = []
    if MASTER in replica_specs(job):
        out.append((MASTER, 0))
    out.extend((WORKER, i) for i in range(replicas_of(job, WORKER)))
    return out


def _pods_share_host_network(node: Any) -> bool:
    """Whether the node's pods share its network (the process and simulated runtimes), as
    its agent reports in nodeInfo.containerRuntimeVersion; podman gives each pod its own."""
    status = getattr(node, "status", None)
    info = getattr(status, "node_info", None) if status is not None else None
    version = (getattr(info, "container_runtime_version", "") or "") if info is not None else ""
    return not version.startswith("podman://")


def leader(job: PyTorchJob) -> tuple[str, int]:
    return (MASTER, 0) if MASTER in replica_specs(job) else (WORKER, 0)


def node_rank(job: PyTorchJob, rtype: str, index: int) -> int:
    return index + 1 if rtype == WORKER and MASTER in replica_specs(job) else index


def job_port(job: PyTorchJob, attempt: int) -> int:
    ep = job.spec.elastic_policy if job.spec is not None else None
    if ep is not None and ep.rdzv_port:
        return ep.rdzv_port
    seed = f"{objects.uid_of(job)}/{attempt}".encode()
    return PORT_BASE + zlib.crc32(seed) % PORT_SPAN


def nproc_per_node(job: PyTorchJob, container: dict[str, Any]) -> str:
    ep = job.spec.elastic_policy if job.spec is not None else None
    if ep is not None and ep.n_proc_per_node:
        return str(ep.n_proc_per_node)
    if job.spec is not None and job.spec.nproc_per_node:
        return job.spec.nproc_per_node
    gpus = container_gpu_request(container)
    return str(gpus) if gpus > 0 else "1"


def checkpoint_dir(job: PyTorchJob, root: str) -> str:
    annotations = objects.meta(job, "annotations") or {}
    if annotations.get(CHECKPOINT_ANNOTATION):
        return annotations[CHECKPOINT_ANNOTATION]
    return f"{root.rstrip('/')}/{objects.namespace_of(job)}/{objects.name_of(job)}-{objects.uid_of(job)[:8]}"


def gang_restarts(job: PyTorchJob) -> int:
    try:
        return int((objects.meta(job, "annotations") or {}).get(RESTARTS_ANNOTATION, 0))
    except ValueError:
        return 0


def gang_attempt(job: PyTorchJob) -> int:
    """The gang's generation: moves on with every restart, for a failure or a resize."""
    try:
        return int((objects.meta(job, "annotations") or {}).get(ATTEMPT_ANNOTATION, gang_restarts(job)))
    except ValueError:
        return gang_restarts(job)


def resize_in_place(job: PyTorchJob) -> bool:
    """Whether Workers are added and removed under a running torchrun group (elastic jobs)
    rather than by restarting the gang at the new size from its checkpoint (jobs without an
    elasticPolicy, and elastic ones annotated ``gpufleet.io/elastic-resize: restart``)."""
    return is_elastic(job) and (objects.meta(job, "annotations") or {}).get(RESIZE_ANNOTATION) != "restart"


def pod_gang_size(pod: Any) -> int | None:
    try:
        return int((objects.meta(pod, "annotations") or {}).get(GANG_SIZE_ANNOTATION, ""))
    except ValueError:
        return None


def pod_attempt(pod: Any) -> int:
    try:
        return int((objects.meta(pod, "annotations") or {}).get(ATTEMPT_ANNOTATION, 0))
    except ValueError:
        return 0


def pod_member(pod: Any) -> tuple[str, int] | None:
    labels = objects.labels_of(pod)
    rtype = {"master": MASTER, "worker": WORKER}.get(labels.get(REPLICA_TYPE_LABEL, ""))
    try:
        index = int(labels.get(REPLICA_INDEX_LABEL, ""))
    except ValueError:
        return None
    return (rtype, index) if rtype else None


def exit_code(pod: Any) -> int | None:
    status = getattr(pod, "status", None)
    for cs in (status.container_statuses if status is not None else None) or []:
        term = cs.state.terminated if cs.state is not None else None
        if term is not None and term.exit_code:
            return term.exit_code
    return None


def failure_is_retryable(restart_policy: str | None, code: int | None) -> bool:
    """Upstream's rule: Never does not restart; ExitCode restarts only on codes above 127
    (killed by a signal: preemption, OOM, a lost node); OnFailure and Always restart."""
    if restart_policy == "Never":
        return False
    if restart_policy == "ExitCode":
        return code is None or code > 127
    return True


def condition_true(job: Any, type_: str) -> bool:
    cond = find_condition(_conditions(job), type_)
    return cond is not None and cond.get("status") == "True"


def is_finished(job: Any) -> str | None:
    for t in (SUCCEEDED, FAILED):
        if condition_true(job, t):
            return t
    return None


def _conditions(job: Any) -> list[dict[str, Any]]:
    return [dict(c) for c in status_dict(job).get("conditions") or []]


def set_job_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
                      now: str) -> bool:
    """Kubeflow's setCondition: a condition with the same status and reason is left alone;
    Running and Restarting exclude each other, and Succeeded/Failed end Running."""
    current = find_condition(conditions, type_)
    if current is not None and current.get("status") == status and current.get("reason") == reason:
        return False
    if current is None and status == "False":
        return False
    new = {"type": type_, "status": status, "reason": reason, "message": message, "lastUpdateTime": now,
           "lastTransitionTime": now}
    if current is not None and current.get("status") == status:
        new["lastTransitionTime"] = current.get("lastTransitionTime", now)
    conditions[:] = [c for c in conditions if c.get("type") != type_]
    if status == "True":
        ends = {RUNNING: (RESTARTING,), RESTARTING: (RUNNING,), SUCCEEDED: (RUNNING, RESTARTING),
                FAILED: (RUNNING, RESTARTING)}.get(type_, ())
        for c in conditions:
            if c.get("type") in ends and c.get("status") == "True":
                c.update(status="False", lastUpdateTime=now, lastTransitionTime=now)
    conditions.append(new)
    return True


def _bound(pod: Any) -> bool:
    return bool(pod.spec is not None and pod.spec.node_name)


def gang_wait_reason(pods: list[Any]) -> str | None:
    """Why the scheduler holds the gang back: the message of the PodScheduled=False
    condition that the scheduler writes, the same for the whole gang, on each member it
    did not place. None when no member waits, or while the members disagree (a gang cycle
    is under way, or a member arrived after the last one)."""
    messages: set[str | None] = set()
    for p in pods:
        if _bound(p) or pod_phase(p) != "Pending" or is_being_deleted(p):
            continue
        conds = (p.status.conditions if p.status is not None else None) or []
        messages.add(next((c.message for c in conds if c.type == "PodScheduled" and c.status == "False"), None))
    if len(messages) != 1:
        return None
    return messages.pop() or None


def _reason(what: str) -> str:
    return f"PyTorchJob{what}"


# -- the controller ---------------------------------------------------------------------------


class PyTorchJobController:
    name = "pytorchjob"

    def __init__(
        self,
        client: Client,
        informers: SharedInformerFactory,
        *,
        clock: Clock = REAL_CLOCK,
        recorder: EventRecorder | None = None,
        workers: int = 2,
        restart_backoff: float = 1.0,
        restart_backoff_max: float = 60.0,
        checkpoint_root: str = DEFAULT_CHECKPOINT_ROOT,
        elastic_resize_interval: float = 30.0,
    ) -> None:
        self.client = client
        self.clock = clock
        self.recorder = recorder or EventRecorder(client, "pytorchjob-controller", clock=clock)
        self.restart_backoff = restart_backoff
        self.restart_backoff_max = restart_backoff_max
        self.checkpoint_root = checkpoint_root
        self.elastic_resize_interval = elastic_resize_interval
        self.expectations = Expectations(clock)
        self._not_before: dict[str, float] = {}
        self._last_resize: dict[str, float] = {}
        self._podgroups_missing = False
        # Job key -> (attempt, members this controller created for it): a member of the
        # current attempt that vanished was lost, not merely not yet created.
        self._created: dict[str, tuple[int, set[tuple[str, int]]]] = {}
        # Uids of pods this controller deleted itself (scale-down, restarts, cleanup).
        self._deleting: set[str] = set()
        # What was last written of the objects around the pods, so a sync does not rewrite them.
        self._known: dict[tuple[str, str, str], Any] = {}
        # Job key -> the scheduler's last reason for holding its gang back, as reported in a
        # GangPending Event (one Event per distinct reason, not one per sync).
        self._gang_wait: dict[str, str] = {}
        self.job_informer = informers.informer(PyTorchJob)
        self.pod_informer = informers.informer(Pod)
        self.node_informer = informers.informer(Node)
        index_by_controller(self.pod_informer)
        self.queue = WorkQueue(self.name, clock=clock)
        self.controller = Controller(self.name, self.reconcile, self.queue, workers=workers)
        self.controller.watch(self.job_informer)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_deleted)
        self.node_informer.add_event_handler(self._node_changed, lambda old, new: self._node_changed(new),
                                             self._node_changed)

    async def start(self) -> None:
        await self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()

    # -- events ---------------------------------------------------------------------------

    def _owner_key(self, pod: Any) -> str | None:
        job = resolve_controller(self.job_informer, pod, KIND)
        return objects.object_key(job) if job is not None else None

    def _pod_added(self, pod: Any) -> None:
        key = self._owner_key(pod)
        if key:
            self.expectations.creation_observed(key)
            self.queue.add(key)
        elif pod_phase(pod) == "Pending":
            self._enqueue_autoscaled()

    def _pod_updated(self, old: Any, new: Any) -> None:
        key = self._owner_key(new)
        if key:
            self.queue.add(key)
        elif pod_phase(new) != pod_phase(old):
            self._enqueue_autoscaled()

    def _pod_deleted(self, pod: Any) -> None:
        self._deleting.discard(objects.uid_of(pod))
        key = self._owner_key(pod)
        if key:
            self.expectations.deletion_observed(key, objects.object_key(pod))
            self.queue.add(key)
        else:
            self._enqueue_autoscaled()

    def _node_changed(self, node: Any) -> None:
        self._enqueue_autoscaled()

    def _enqueue_autoscaled(self) -> None:
        # Free GPUs and waiting pods change with other workloads: elastic jobs look again.
        for job in self.job_informer.list():
            if self._autoscale_enabled(job) and not is_finished(job):
                self.queue.add(objects.object_key(job))

    # -- sync -----------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Requeue | None:
        job = self.job_informer.get(key)
        if job is None:
            self.expectations.forget(key)
            self._not_before.pop(key, None)
            self._last_resize.pop(key, None)
            self._created.pop(key, None)
            self._gang_wait.pop(key, None)
            ns, _, name = key.rpartition("/")
            for kind in ("svc", "pg", "cm"):
                self._known.pop((kind, ns, name), None)
            self._known.pop(("cm", ns, f"{name}-rendezvous"), None)
            return None
        if is_being_deleted(job):
            return None
        managed_by = run_policy(job).managed_by
        if managed_by is not None and managed_by != TRAINING_OPERATOR:
            return None  # another controller (MultiKueue) runs this job
        if not self.expectations.satisfied(key):
            return None
        try:
            return await self._sync(key, job)
        except NotFound:
            return None
        except Conflict:
            return Requeue()
        except ApiError as e:
            log.info("pytorchjob %s: %s", key, e)
            return Requeue()

    def _pods(self, job: Any) -> list[Any]:
        return self.pod_informer.by_index(CONTROLLER_UID_INDEX, objects.uid_of(job))

    async def _sync(self, key: str, job: Any) -> Requeue | None:
        now_str = now_text(self.clock)
        now = self.clock.now()
        pods = self._pods(job)
        old_status = status_dict(job)
        status = dict(old_status)
        conditions = _conditions(job)
        name = objects.name_of(job)
        rp = run_policy(job)

        finished = is_finished(job)
        if finished:
            await self._clean_pods(job, pods, rp.clean_pod_policy or "None")
            status["replicaStatuses"] = self._replica_statuses(job, pods)
            await self._write(job, status, conditions)
            return await self._expire(job, conditions)

        if set_job_condition(conditions, CREATED, "True", _reason("Created"),
                             f"PyTorchJob {name} is created.", now_str):
            await self.recorder.record(job, NORMAL, _reason("Created"), f"PyTorchJob {name} is created.")

        if rp.suspend:
            await self._delete_pods(key, job, [p for p in pods if not is_being_deleted(p)])
            if set_job_condition(conditions, SUSPENDED, "True", _reason("Suspended"),
                                 f"PyTorchJob {name} is suspended.", now_str):
                await self.recorder.record(job, NORMAL, _reason("Suspended"), f"PyTorchJob {name} is suspended.")
            for t in (RUNNING, RESTARTING):
                c = find_condition(conditions, t)
                if c is not None and c.get("status") == "True":
                    c.update(status="False", lastUpdateTime=now_str, lastTransitionTime=now_str)
            status.pop("startTime", None)
            status["replicaStatuses"] = self._replica_statuses(job, pods)
            await self._write(job, status, conditions)
            return None
        if set_job_condition(conditions, SUSPENDED, "False", _reason("Resumed"),
                             f"PyTorchJob {name} is resumed.", now_str):
            await self.recorder.record(job, NORMAL, _reason("Resumed"), f"PyTorchJob {name} is resumed.")
        if not status.get("startTime"):
            status["startTime"] = now_str

        requeue: float | None = None
        deadline = rp.active_deadline_seconds
        started = timestamp(status.get("startTime"))
        if deadline and started is not None:
            left = started + deadline - now
            if left <= 0:
                msg = f"PyTorchJob {name} has failed because it was active longer than specified deadline"
                await self._fail(key, job, pods, conditions, "DeadlineExceeded", msg, now_str, status)
                return await self._expire(job, conditions)
            requeue = left + 0.001

        attempt = gang_attempt(job)
        restarts = gang_restarts(job)
        await self._ensure_service(job)
        await self._ensure_podgroup(job)

        current = [p for p in pods if pod_attempt(p) == attempt and not is_being_deleted(p)]
        stale = [p for p in pods if pod_attempt(p) != attempt]
        # An earlier gang still on its way out: new pods reuse its names, so wait.
        if stale:
            await self._delete_pods(key, job, [p for p in stale if not is_being_deleted(p)])
            status["replicaStatuses"] = self._replica_statuses(job, pods)
            await self._write(job, status, conditions)
            return Requeue(after=1.0)

        # Success.
        lead = leader(job)
        by_member = {pod_member(p): p for p in current}
        lead_pod = by_member.get(lead)
        if lead_pod is not None and pod_phase(lead_pod) == "Succeeded":
            msg = f"PyTorchJob {name} is successfully completed."
            set_job_condition(conditions, SUCCEEDED, "True", _reason("Succeeded"), msg, now_str)
            status["completionTime"] = now_str
            status["replicaStatuses"] = self._replica_statuses(job, pods)
            await self.recorder.record(job, NORMAL, _reason("Succeeded"), msg)
            await self._write(job, status, conditions)
            await self._clean_pods(job, self._pods(job), rp.clean_pod_policy or "None")
            return await self._expire(job, conditions)

        # Failures and losses.
        wanted = set(gang_members(job))
        trouble = self._gang_trouble(job, current, wanted, pods)
        if trouble is not None:
            member_pod, reason_text, retryable = trouble
            if not retryable:
                msg = f"PyTorchJob {name} has failed because {reason_text}."
                await self._fail(key, job, pods, conditions, _reason("Failed"), msg, now_str, status)
                return await self._expire(job, conditions)
            limit = rp.backoff_limit
            if limit is not None and restarts >= limit:
                msg = f"PyTorchJob {name} has failed because it has reached the specified backoff limit ({limit})"
                msg += f": {reason_text}."
                await self._fail(key, job, pods, conditions, "BackoffLimitExceeded", msg, now_str, status)
                return await self._expire(job, conditions)
            msg = f"PyTorchJob {name} is restarting because {reason_text}."
            set_job_condition(conditions, RESTARTING, "True", _reason("Restarting"), msg, now_str)
            await self.recorder.record(job, WARNING, _reason("Restarting"), msg)
            updated = await self._bump_attempt(job, attempt + 1, restarts + 1)
            await self._delete_pods(key, job, [p for p in pods if not is_being_deleted(p)])
            await self._write(job, status, conditions, base=updated)
            delay = 0.0
            if self.restart_backoff > 0:
                delay = min(self.restart_backoff * 2 ** restarts, self.restart_backoff_max)
            self._not_before[key] = self.clock.monotonic() + delay
            return Requeue(after=max(delay, 0.05))

        wait = self._not_before.get(key, 0.0) - self.clock.monotonic()
        if wait > 0:
            return Requeue(after=wait + 0.001)

        # Elastic resize by the controller itself.
        resized = await self._autoscale(job, current)
        if resized:
            return None  # the job's own update brings us back

        # A resize re-forms the whole group at the new size from its checkpoint.
        sizes = {pod_gang_size(p) for p in current}
        if current and not resize_in_place(job) and sizes != {len(wanted)}:
            old = max((s for s in sizes if s is not None), default=len(current))
            msg = (f"PyTorchJob {name} is restarting with {len(wanted)} members (was {old}) "
                   "from its last checkpoint.")
            set_job_condition(conditions, RESTARTING, "True", _reason("Resizing"), msg, now_str)
            await self.recorder.record(job, NORMAL, "Resizing", msg)
            updated = await self._bump_attempt(job, attempt + 1, None)
            await self._delete_pods(key, job, current)
            await self._write(job, status, conditions, base=updated)
            return Requeue(after=0.05)

        # In place: Workers above the wanted count go, missing ones are added.
        extra = [p for p in current if pod_member(p) not in wanted]
        if extra:
            await self._delete_pods(key, job, extra)
        missing = [m for m in gang_members(job) if m not in by_member]
        if missing:
            await self._ensure_rendezvous(job, attempt)
            await self._create_pods(key, job, missing, attempt)

        await self._ensure_rendezvous(job, attempt)
        status["replicaStatuses"] = self._replica_statuses(job, pods)
        all_running = not missing and all(pod_phase(by_member[m]) == "Running" for m in wanted if m in by_member)
        await self._report_gang_wait(key, job, current)
        if all_running:
            msg = f"PyTorchJob {name} is running."
            if set_job_condition(conditions, RUNNING, "True", _reason("Running"), msg, now_str):
                await self.recorder.record(job, NORMAL, _reason("Running"), msg)
        await self._write(job, status, conditions)
        if self._autoscale_enabled(job) and self.elastic_resize_interval > 0:
            requeue = min(requeue or self.elastic_resize_interval, self.elastic_resize_interval)
        return Requeue(after=requeue) if requeue is not None else None

    async def _report_gang_wait(self, key: str, job: Any, current: list[Any]) -> None:
        """Say on the job why its gang waits: the scheduler holds every member back together
        (nothing bound, no GPU held) and writes its reason into each member's PodScheduled
        condition; that reason becomes a GangPending Event on the job, once per distinct
        reason, and GangScheduled once the whole gang is placed."""
        # While members are still being created, the scheduler's word is about a gang not yet whole.
        reason = gang_wait_reason(current) if len(current) >= len(gang_members(job)) else None
        if reason is not None:
            if self._gang_wait.get(key) != reason:
                self._gang_wait[key] = reason
                await self.recorder.record(job, NORMAL, GANG_PENDING,
                                           f"PyTorchJob {objects.name_of(job)} waits for its gang: {reason}")
            return
        if key in self._gang_wait and current and all(_bound(p) for p in current):
            del self._gang_wait[key]
            await self.recorder.record(job, NORMAL, GANG_SCHEDULED,
                                       f"All {len(current)} pods of pod group {objects.namespace_of(job)}/"
                                       f"{objects.name_of(job)} are placed.")

    def _gang_trouble(self, job: Any, current: list[Any], wanted: set[tuple[str, int]],
                      all_pods: list[Any]) -> tuple[Any, str, bool] | None:
        """(pod, why, retryable) for the first failed or lost member, else None."""
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
            return p, why, failure_is_retryable(policy, code)
        # A member of this attempt that existed and is gone (deleted, evicted with its node).
        present = {pod_member(p) for p in current}
        gone = [p for p in all_pods if is_being_deleted(p) and pod_member(p) in wanted
                and pod_member(p) not in present and objects.uid_of(p) not in self._deleting]
        if gone:
            p = gone[0]
            member = pod_member(p)
            if not (resize_in_place(job) and member != leader(job)):
                node = getattr(p.spec, "node_name", None) or "no node"
                return p, f"pod {objects.name_of(p)} on node {node} was lost", True
        if not resize_in_place(job) and current:
            lost = self._lost_members(job, current, wanted)
            if lost:
                return None, f"pod {lost} was lost", True
        elif current and leader(job) not in present and self._created_leader(job):
            return None, f"pod {pod_name(objects.name_of(job), *leader(job))} (the rendezvous host) was lost", True
        return None

    def _lost_members(self, job: Any, current: list[Any], wanted: set[tuple[str, int]]) -> str | None:
        """A member this attempt created that no longer exists while others still run."""
        created = self._created.get(objects.object_key(job))
        if created is None or created[0] != gang_attempt(job):
            return None
        present = {pod_member(p) for p in current}
        for member in sorted(created[1]):
            if member in wanted and member not in present:
                return pod_name(objects.name_of(job), *member)
        return None

    def _created_leader(self, job: Any) -> bool:
        created = self._created.get(objects.object_key(job))
        return created is not None and created[0] == gang_attempt(job) and leader(job) in created[1]

    # -- pods -----------------------------------------------------------------------------

    async def _create_pods(self, key: str, job: Any, members: list[tuple[str, int]], attempt: int) -> None:
        created = self._created.setdefault(key, (attempt, set()))
        if created[0] != attempt:
            created = self._created[key] = (attempt, set())
        self.expectations.expect_creations(key, len(members))
        pending = list(members)

        async def create_one() -> None:
            rtype, index = pending.pop(0)
            body = self._pod_body(job, rtype, index, attempt)
            try:
                await self.client.create(body, objects.namespace_of(job), raw=True)
            except AlreadyExists:
                self.expectations.creation_observed(key)
                return
            except ApiError as e:
                self.expectations.creation_observed(key)
                await self.recorder.record(job, WARNING, "FailedCreatePod", f"Error creating: {error_text(e)}")
                raise
            created[1].add((rtype, index))
            await self.recorder.record(job, NORMAL, "SuccessfulCreatePod",
                                       f"Created pod: {body['metadata']['name']}")

        # Doubling batches (1, 2, 4, ...) as the ReplicaSet controller does: a 64-pod gang is
        # created in 7 rounds, and a create refused for quota or admission stops after one.
        _, error = await slow_start_batch(len(members), create_one)
        # Members never sent will never be observed.
        for _ in range(len(pending)):
            self.expectations.creation_observed(key)
        if error is not None:
            raise error

    def _pod_body(self, job: Any, rtype: str, index: int, attempt: int) -> dict[str, Any]:
        name = objects.name_of(job)
        spec = replica_specs(job)[rtype]
        labels = {
            JOB_NAME_LABEL: name,
            REPLICA_TYPE_LABEL: rtype.lower(),
            REPLICA_INDEX_LABEL: str(index),
            OPERATOR_NAME_LABEL: OPERATOR_NAME,
            POD_GROUP_LABEL: name,
        }
        if rtype == MASTER:
            labels[JOB_ROLE_LABEL] = "master"
        body = pod_from_template(
            spec.template,
            namespace=objects.namespace_of(job),
            generate_name="",
            owner_ref=owner_reference(job, API_VERSION, KIND),
            labels=labels,
            annotations={ATTEMPT_ANNOTATION: str(attempt), GANG_SIZE_ANNOTATION: str(len(gang_members(job))),
                         # The node agent mounts it into the pod's containers (podman, sandbox).
                         CHECKPOINT_ANNOTATION: checkpoint_dir(job, self.checkpoint_root),
                         },
        )
        meta = body["metadata"]
        meta.pop("generateName", None)
        meta["name"] = pod_name(name, rtype, index)
        pspec = body["spec"]
        pspec["restartPolicy"] = "Never"
        pspec.setdefault("hostname", meta["name"])
        pspec.setdefault("subdomain", name)
        sp = run_policy(job).scheduling_policy
        if sp is not None and sp.priority_class and not pspec.get("priorityClassName"):
            pspec["priorityClassName"] = sp.priority_class
        # Only the controller says which pod is the leader and which port it holds.
        annotations = meta.setdefault("annotations", {})
        annotations.pop(RENDEZVOUS_PORT_ANNOTATION, None)
        containers = pspec.get("containers") or []
        if not containers:
            return body
        target = next((c for c in containers if c.get("name") == DEFAULT_CONTAINER_NAME), containers[0])
        port = job_port(job, attempt)
        is_leader = (rtype, index) == leader(job)
        if is_leader:
            ports = [p for p in target.get("ports") or [] if p.get("name") != DEFAULT_PORT_NAME]
            target["ports"] = [{"name": DEFAULT_PORT_NAME, "containerPort": port, "protocol": "TCP"}, *ports]
            annotations[RENDEZVOUS_PORT_ANNOTATION] = str(port)
        env = self._env(job, target, rtype, index, attempt, is_leader)
        shared = self._fleet_address()
        if is_elastic(job) and shared is not None:
            # Pods sharing one address (process runtime on one server or a loopback fleet) are
            # told apart by name: each member's name leads to that address.
            lo, hi = elastic_bounds(job)
            names = [pod_name(name, MASTER, 0)] if MASTER in replica_specs(job) else []
            names += [pod_name(name, WORKER, i) for i in range(max(hi, replicas_of(job, WORKER)))]
            aliases = [a for a in pspec.get("hostAliases") or [] if a.get("ip") != shared]
            pspec["hostAliases"] = [*aliases, {"ip": shared, "hostnames": names}]
        own = {e.get("name") for e in target.get("env") or []}
        target["env"] = [*(e for e in env if e["name"] not in own), *(target.get("env") or [])]
        return body

    def _env(self, job: Any, container: dict[str, Any], rtype: str, index: int, attempt: int,
             is_leader: bool) -> list[dict[str, Any]]:
        port = str(job_port(job, attempt))
        address = self._fleet_address()
        if address is not None:
            addr: dict[str, Any] = {"name": "MASTER_ADDR", "value": address}
        elif is_leader:
            addr = {"name": "MASTER_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        else:
            addr = {"name": "MASTER_ADDR", "valueFrom": {"configMapKeyRef": {
                "name": rendezvous_name(job), "key": "MASTER_ADDR"}}}
        nproc = nproc_per_node(job, container)
        env: list[dict[str, Any]] = [
            addr,
            {"name": "MASTER_PORT", "value": port},
            {"name": "PET_MASTER_ADDR", "value": "$(MASTER_ADDR)"},
            {"name": "PET_MASTER_PORT", "value": port},
            {"name": "PET_NPROC_PER_NODE", "value": nproc},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": CHECKPOINT_ENV, "value": checkpoint_dir(job, self.checkpoint_root)},
        ]
        rank = node_rank(job, rtype, index)
        if is_elastic(job):
            ep = job.spec.elastic_policy
            lo, hi = elastic_bounds(job)
            n = replicas_of(job, WORKER) + (1 if MASTER in replica_specs(job) else 0)
            host = ep.rdzv_host or "$(MASTER_ADDR)"
            conf = [f"{c.key}={c.value}" for c in ep.rdzv_conf or [] if c.key]
            if not ep.rdzv_host and not any((c.key or "") == "is_host" for c in ep.rdzv_conf or []):
                # Only the leader hosts the rendezvous store: on a shared host network every
                # member would otherwise match the endpoint's address and race to host it.
                conf.append(f"is_host={'true' if is_leader else 'false'}")
            env += [
                # Restarted at each resize, the group knows its size: torchrun then waits for
                # every member instead of starting with the first minReplicas.
                {"name": "PET_NNODES", "value": f"{lo}:{hi}" if resize_in_place(job) else f"{n}:{n}"},
                {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
                {"name": "PET_RDZV_BACKEND", "value": ep.rdzv_backend or "c10d"},
                {"name": "PET_RDZV_ENDPOINT", "value": f"{host}:{port}"},
                {"name": "PET_RDZV_ID", "value": ep.rdzv_id or objects.uid_of(job)},
                {"name": "PET_RDZV_CONF", "value": ",".join(conf)},
                # torchrun's --local-addr: how the other members reach this one (its own
                # store, once it leads a round) and what tells it apart. Its host name would
                # resolve nowhere else without cluster DNS; pods of one address (and one PID
                # namespace layout) go by their names, which the hostAliases above resolve.
                {"name": "PET_LOCAL_ADDR", **({"valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                                              if self._fleet_address() is not None else
                                              {"valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})},
            ]
            if ep.max_restarts is not None:
                env.append({"name": "PET_MAX_RESTARTS", "value": str(ep.max_restarts)})
            if ep.standalone:
                env.append({"name": "PET_STANDALONE", "value": ""})
        else:
            total = len(gang_members(job))
            per = int(nproc) if nproc.isdigit() else 1
            env += [
                {"name": "WORLD_SIZE", "value": str(total * per)},
                {"name": "RANK", "value": str(rank)},
                {"name": "PET_NNODES", "value": str(total)},
                {"name": "PET_NODE_RANK", "value": str(rank)},
            ]
        return env

    def _fleet_address(self) -> str | None:
        """The one address every node has, if they all share one and their pods share it
        too (pods then reach the leader there wherever it lands)."""
        seen: set[str] = set()
        for node in self.node_informer.list():
            status = getattr(node, "status", None)
            if not _pods_share_host_network(node):
                return None
            for a in (status.addresses if status is not None else None) or []:
                if a.type == "InternalIP" and a.address:
                    seen.add(a.address)
        return seen.pop() if len(seen) == 1 else None

    async def _delete_pods(self, key: str, job: Any, pods: list[Any]) -> None:
        if not pods:
            return
        self.expectations.expect_deletions(key, [objects.object_key(p) for p in pods])
        for p in pods:
            self._deleting.add(objects.uid_of(p))
            grace = 0 if self._node_down(p) else None
            try:
                await self.client.delete(Pod, objects.name_of(p), objects.namespace_of(p),
                                         grace_period_seconds=grace, preconditions_uid=objects.uid_of(p))
            except NotFound:
                self.expectations.deletion_observed(key, objects.object_key(p))
                continue
            except ApiError as e:
                self.expectations.deletion_observed(key, objects.object_key(p))
                log.info("pytorchjob %s: deleting pod %s: %s", key, objects.name_of(p), e)
                continue
            await self.recorder.record(job, NORMAL, "SuccessfulDeletePod", f"Deleted pod: {objects.name_of(p)}")

    def _node_down(self, pod: Any) -> bool:
        node_name = getattr(pod.spec, "node_name", None) if pod.spec is not None else None
        if not node_name:
            return False
        node = self.node_informer.get(node_name)
        if node is None:
            return True
        for c in (node.status.conditions if node.status is not None else None) or []:
            if c.type == "Ready":
                return c.status != "True"
        return False

    async def _clean_pods(self, job: Any, pods: list[Any], policy: str) -> None:
        if policy == "All":
            victims = [p for p in pods if not is_being_deleted(p)]
        elif policy == "Running":
            victims = [p for p in pods if not is_being_deleted(p) and pod_phase(p) in ("Running", "Pending")]
        else:
            return
        await self._delete_pods(objects.object_key(job), job, victims)

    async def _fail(self, key: str, job: Any, pods: list[Any], conditions: list[dict[str, Any]], reason: str,
                    message: str, now_str: str, status: dict[str, Any]) -> None:
        set_job_condition(conditions, FAILED, "True", reason, message, now_str)
        status["completionTime"] = now_str
        status["replicaStatuses"] = self._replica_statuses(job, pods)
        await self.recorder.record(job, WARNING, reason, message)
        await self._write(job, status, conditions)
        # Failed pods stay for their logs; the rest of the gang stops.
        await self._delete_pods(key, job, [p for p in pods if not is_being_deleted(p)
                                           and pod_phase(p) in ("Running", "Pending")])

    # -- the objects around the pods --------------------------------------------------------

    async def _ensure_service(self, job: Any) -> None:
        name = objects.name_of(job)
        ns = objects.namespace_of(job)
        body = {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": {JOB_NAME_LABEL: name,
                                                                   OPERATOR_NAME_LABEL: OPERATOR_NAME},
                         "ownerReferences": [owner_reference(job, API_VERSION, KIND)]},
            "spec": {"clusterIP": "None", "selector": {JOB_NAME_LABEL: name, OPERATOR_NAME_LABEL: OPERATOR_NAME},
                     "publishNotReadyAddresses": True},
        }
        if self._known.get(("svc", ns, name)) == objects.uid_of(job):
            return
        try:
            await self.client.create(body, ns, raw=True)
        except AlreadyExists:
            pass
        self._known[("svc", ns, name)] = objects.uid_of(job)

    def podgroup_body(self, job: Any) -> dict[str, Any]:
        name = objects.name_of(job)
        sp = run_policy(job).scheduling_policy
        if sp is not None and sp.min_available:
            min_member = sp.min_available
        elif resize_in_place(job):
            # torchrun starts once minReplicas joined; the rest may come later.
            min_member = elastic_bounds(job)[0] + (1 if MASTER in replica_specs(job) else 0)
        else:
            min_member = len(gang_members(job))
        spec: dict[str, Any] = {"minMember": max(min_member, 1)}
        if sp is not None and sp.schedule_timeout_seconds:
            spec["scheduleTimeoutSeconds"] = sp.schedule_timeout_seconds
        if sp is not None and sp.min_resources:
            spec["minResources"] = dict(sp.min_resources)
        return {
            "apiVersion": PODGROUP_API_VERSION, "kind": "PodGroup",
            "metadata": {"name": name, "namespace": objects.namespace_of(job),
                         "labels": {JOB_NAME_LABEL: name, OPERATOR_NAME_LABEL: OPERATOR_NAME},
                         "ownerReferences": [owner_reference(job, API_VERSION, KIND)]},
            "spec": spec,
        }

    async def _ensure_podgroup(self, job: Any) -> None:
        body = self.podgroup_body(job)
        ns, name = objects.namespace_of(job), objects.name_of(job)
        marker = (objects.uid_of(job), json.dumps(body["spec"], sort_keys=True))
        if self._known.get(("pg", ns, name)) == marker:
            return
        try:
            await self.client.create(body, ns, raw=True)
        except AlreadyExists:
            async def attempt() -> None:
                fresh = await self.client.get(PODGROUP_API_VERSION + "/PodGroup", name, ns, raw=True)
                if fresh.get("spec") != body["spec"]:
                    fresh["spec"] = body["spec"]
                    await self.client.update(fresh, raw=True)
            await retry_on_conflict(attempt)
        except LookupError as e:
            # The API does not serve PodGroups: pods are then placed one by one.
            if not self._podgroups_missing:
                log.warning("pytorchjob: PodGroups are not served (%s); gangs are not scheduled together", e)
            self._podgroups_missing = True
            return
        self._known[("pg", ns, name)] = marker

    async def _ensure_rendezvous(self, job: Any, attempt: int) -> None:
        """The ConfigMap that tells members the leader's address when nodes differ."""
        if self._fleet_address() is not None:
            return
        lead_pod = self.pod_informer.get(f"{objects.namespace_of(job)}/{pod_name(objects.name_of(job), *leader(job))}")
        if lead_pod is None or pod_attempt(lead_pod) != attempt or is_being_deleted(lead_pod):
            return
        node_name = lead_pod.spec.node_name if lead_pod.spec is not None else None
        if not node_name:
            return
        node = self.node_informer.get(node_name)
        address = None
        if node is not None and _pods_share_host_network(node):
            for a in ((node.status.addresses if node.status is not None else None) or []):
                if a.type == "InternalIP":
                    address = a.address
        else:
            # A pod with a network namespace of its own is reached at its own IP, known once
            # its node's agent made its sandbox.
            address = lead_pod.status.pod_ip if lead_pod.status is not None else None
        if not address:
            return
        data = {"MASTER_ADDR": address, "MASTER_PORT": str(job_port(job, attempt)),
                "LEADER_UID": objects.uid_of(lead_pod)}
        ns, name = objects.namespace_of(job), rendezvous_name(job)
        if self._known.get(("cm", ns, name)) == data:
            return
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns, "labels": {JOB_NAME_LABEL: objects.name_of(job)},
                             "ownerReferences": [owner_reference(job, API_VERSION, KIND)]},
                "data": data}
        try:
            await self.client.create(body, ns, raw=True)
        except AlreadyExists:
            async def attempt_update() -> None:
                fresh = await self.client.get(ConfigMap, name, ns, raw=True)
                fresh["data"] = data
                await self.client.update(fresh, raw=True)
            await retry_on_conflict(attempt_update)
        self._known[("cm", ns, name)] = data

    async def _bump_attempt(self, job: Any, attempt: int, restarts: int | None) -> dict[str, Any]:
        annotations = {ATTEMPT_ANNOTATION: str(attempt)}
        if restarts is not None:
            annotations[RESTARTS_ANNOTATION] = str(restarts)
        patch = {"metadata": {"annotations": annotations}}
        updated = await self.client.patch(KIND_REF, objects.name_of(job), patch, objects.namespace_of(job), raw=True)
        if self._fleet_address() is None:
            try:
                await self.client.delete(ConfigMap, rendezvous_name(job), objects.namespace_of(job))
            except NotFound:
                pass
            self._known.pop(("cm", objects.namespace_of(job), rendezvous_name(job)), None)
        return updated

    # -- elastic resize ----------------------------------------------------------------------

    def _autoscale_enabled(self, job: Any) -> bool:
        if not is_elastic(job):
            return False
        if (objects.meta(job, "annotations") or {}).get(AUTOSCALE_ANNOTATION, "").lower() == "false":
            return False
        if QUEUE_NAME_LABEL in objects.labels_of(job):
            return False  # its queue admitted a size; growing would go around the quota
        lo, hi = elastic_bounds(job)
        return hi > lo

    def _priority(self, pod_spec: Any) -> int:
        return (pod_spec.priority if pod_spec is not None else None) or 0

    async def _autoscale(self, job: Any, current: list[Any]) -> bool:
        if not self._autoscale_enabled(job):
            return False
        key = objects.object_key(job)
        last = self._last_resize.get(key)
        if last is not None and self.clock.monotonic() - last < self.elastic_resize_interval:
            return False
        lo, hi = elastic_bounds(job)
        workers = replicas_of(job, WORKER)
        template = replica_specs(job)[WORKER].template
        need = pod_gpu_request(template) if template is not None else 0
        job_priority = max((self._priority(p.spec) for p in current), default=0)
        mine = {objects.uid_of(p) for p in self._pods(job)}
        waiting = [p for p in self.pod_informer.list()
                   if pod_phase(p) == "Pending" and not (p.spec and p.spec.node_name)
                   and not is_being_deleted(p) and objects.uid_of(p) not in mine]
        free = self._free_gpus()
        if workers > lo:
            blocked = [p for p in waiting if self._priority(p.spec) > job_priority
                       and pod_gpu_request(p) > max(free.values(), default=0)]
            if blocked:
                why = (f"pod {objects.namespace_of(blocked[0])}/{objects.name_of(blocked[0])} of higher priority "
                       f"waits for GPUs")
                await self._resize(job, workers - 1, "ElasticShrink", why)
                return True
        stable = len(current) == len(gang_members(job)) and all(pod_phase(p) == "Running" for p in current)
        if workers < hi and need > 0 and stable:
            if any(self._priority(p.spec) >= job_priority for p in waiting):
                return False
            fits = [n for n, g in free.items() if g >= need]
            if fits:
                why = f"node {sorted(fits)[0]} has {free[sorted(fits)[0]]} idle GPUs"
                await self._resize(job, workers + 1, "ElasticGrow", why)
                return True
        return False

    def _free_gpus(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for p in self.pod_informer.list():
            node = p.spec.node_name if p.spec is not None else None
            if node and pod_phase(p) not in ("Succeeded", "Failed"):
                used[node] = used.get(node, 0) + pod_gpu_request(p)
        out: dict[str, int] = {}
        for node in self.node_informer.list():
            if node.spec is not None and node.spec.unschedulable:
                continue
            if taint_tuples(node.spec.taints if node.spec else None, (NO_SCHEDULE, NO_EXECUTE)):
                continue
            status = node.status
            ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions if status else None) or [])
            if not ready:
                continue
            try:
                total = int(parse_quantity(((status.allocatable if status else None) or {}).get(GPU_RESOURCE, "0")))
            except ValueError:
                continue
            name = objects.name_of(node)
            out[name] = total - used.get(name, 0)
        return out

    async def _resize(self, job: Any, replicas: int, reason: str, why: str) -> None:
        lo, hi = elastic_bounds(job)
        message = f"Workers {replicas_of(job, WORKER)} -> {replicas} (min {lo}, max {hi}): {why}"
        patch = {"metadata": {"annotations": {ELASTIC_REASON_ANNOTATION: f"{reason}: {message}"}},
                 "spec": {"pytorchReplicaSpecs": {WORKER: {"replicas": replicas}}}}
        await self.client.patch(KIND_REF, objects.name_of(job), patch, objects.namespace_of(job))
        self._last_resize[objects.object_key(job)] = self.clock.monotonic()
        await self.recorder.record(job, NORMAL, reason, message)

    # -- status -------------------------------------------------------------------------------

    def _replica_statuses(self, job: Any, pods: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        name = objects.name_of(job)
        for rtype in replica_specs(job):
            mine = [p for p in pods if (pod_member(p) or ("", 0))[0] == rtype]
            labels = {JOB_NAME_LABEL: name, OPERATOR_NAME_LABEL: OPERATOR_NAME, REPLICA_TYPE_LABEL: rtype.lower()}
            entry: dict[str, Any] = {
                "labelSelector": {"matchLabels": labels},
                "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
            }
            counts = {
                "active": sum(1 for p in mine if pod_phase(p) == "Running" and not is_being_deleted(p)),
                "succeeded": sum(1 for p in mine if pod_phase(p) == "Succeeded"),
                "failed": sum(1 for p in mine if pod_phase(p) == "Failed"),
            }
            entry.update({k: v for k, v in counts.items() if v})
            out[rtype] = entry
        return out

    async def _write(self, job: Any, status: dict[str, Any], conditions: list[dict[str, Any]],
                     base: dict[str, Any] | None = None) -> None:
        status = {k: v for k, v in status.items() if v not in (None, [], {})}
        if conditions:
            status["conditions"] = conditions
        old = {k: v for k, v in status_dict(job).items() if k != "lastReconcileTime"}
        new = {k: v for k, v in status.items() if k != "lastReconcileTime"}
        if _normal(old) == _normal(new):
            return
        status["lastReconcileTime"] = now_text(self.clock)
        body = base if base is not None else job.to_dict()
        body["status"] = status
        await self.client.update_status(body, raw=True)

    async def _expire(self, job: Any, conditions: list[dict[str, Any]]) -> Requeue | None:
        ttl = run_policy(job).ttl_seconds_after_finished
        if ttl is None:
            return None
        finished = [timestamp(c.get("lastTransitionTime")) for c in conditions
                    if c.get("type") in (SUCCEEDED, FAILED) and c.get("status") == "True"]
        at = max([t for t in finished if t is not None] or [self.clock.now()])
        left = at + ttl - self.clock.now()
        if left > 0:
            return Requeue(after=left + 0.001)
        try:
            await self.client.delete(KIND_REF, objects.name_of(job), objects.namespace_of(job),
                                     propagation_policy="Foreground", preconditions_uid=objects.uid_of(job))
        except (NotFound, Conflict):
            pass
        return None


KIND_REF = f"{API_VERSION}/{KIND}"


def rendezvous_name(job: Any) -> str:
    return f"{objects.name_of(job)}-rendezvous"


def _normal(status: dict[str, Any]) -> str:
    return json.dumps(status, sort_keys=True, default=str)

