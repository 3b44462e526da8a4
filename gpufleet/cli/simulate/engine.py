"""Trace replay: the real API server, scheduler, Job and queue controllers in one process,
on a VirtualClock that jumps from event to event.

What is simulated is only what a node would do: the nodes are Node objects (Ready, N GPUs
each), and ``SimulatedNodes`` plays their agents: a pod bound to a node starts at once and
reports Running; it succeeds when its job's work is done. Work is counted per job, as a
checkpointing trainer keeps it: a preempted job (its pods stopped) keeps the work done so
far, and every restart first spends ``restart_overhead`` seconds (loading the checkpoint)
before making progress again. Everything else, from the Job to the Workload, its admission,
preemption, the pods and their binding, is the code that runs a live cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api.gpu import GPU_RESOURCE
from gpufleet.api.kueue import QUEUE_NAME_LABEL
from gpufleet.cli.simulate.trace import TraceJob
from gpufleet.client import Conflict, NotFound
from gpufleet.client.informer import Informer
from gpufleet.queueing import policies
from gpufleet.utils.clock import VirtualClock, rfc3339

log = logging.getLogger(__name__)

NAMESPACE = "default"
KUEUE = "kueue.x-k8s.io/v1beta1"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
FLAVOR = "default-flavor"
POLICIES = ("fifo", "priority", "fair-share", policies.ATTAINED_SERVICE, policies.SHORTEST_REMAINING)
# A job reports its steps when a run has made progress and again this much later (the speed
# admission measures from the two), and when it is stopped (its checkpoint).
PROGRESS_PROBE_SECONDS = 60.0


@dataclass(frozen=True)
class Progress:
    """Where a replay stands: jobs finished of all, the virtual seconds since the trace's
    start, jobs submitted, jobs running now and preemptions so far."""

    done: int
    total: int
    now: float
    submitted: int
    running: int
    preemptions: int


# A replay reports its progress at every finished job, and at least this often (wall seconds)
# while none finishes.
PROGRESS_EVERY = 5.0


@dataclass
class JobRecord:
    trace: TraceJob
    pods: int
    submitted: float | None = None
    first_start: float | None = None
    finished: float | None = None
    work_done: float = 0.0  # seconds of progress kept (checkpointed)
    runs: int = 0  # how many times its pods were started
    preemptions: int = 0
    gpu_seconds: float = 0.0  # GPU-time held, overhead included
    # The run in progress: when it started, its overhead, the job's pods running in it.
    run_start: float | None = None
    run_overhead: float = 0.0
    running: set[str] = field(default_factory=set)
    succeeded: set[str] = field(default_factory=set)


@dataclass
class Result:
    policy: str
    nodes: int
    gpus_per_node: int
    restart_overhead: float
    jobs: list[JobRecord]
    wall_seconds: float
    clock_jumps: int
    levels: str | None = None  # the attained-service levels given (None: the policy's own)
    starvation: str | None = None  # the starvation guard's factor given (None: the policy's own)
    # Stopped before every job finished (`stop`, Ctrl-C): the figures are those of the jobs
    # finished by then, a prefix biased to the short ones, not comparable with a whole replay.
    interrupted: bool = False
    replayed_seconds: float = 0.0  # virtual time from the trace's start to the replay's end
    order: str | None = None  # the order within a level given (None: the policy's own)

    @property
    def done(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.finished is not None]

    def figures(self) -> dict[str, Any]:
        done = self.done
        jct = sorted(j.finished - j.trace.submit for j in done)  # type: ignore[operator]
        waits = [j.first_start - j.trace.submit for j in done if j.first_start is not None]
        start = min((j.trace.submit for j in self.jobs), default=0.0)
        end = max((j.finished for j in done), default=start)  # type: ignore[type-var]
        makespan = end - start
        gpus = self.nodes * self.gpus_per_node
        busy = sum(j.gpu_seconds for j in self.jobs)
        return {
            "policy": self.policy,
            "cluster": f"{self.nodes}x{self.gpus_per_node}",
            "restartOverheadSeconds": self.restart_overhead,
            **({"attainedServiceLevels": self.levels or ",".join(f"{v:g}" for v in policies.LEVELS)}
               if self.policy == policies.ATTAINED_SERVICE else {}),
            **({"starvationFactor": float(self.starvation if self.starvation is not None
                                          else policies.STARVATION_FACTOR)}
               if self.policy == policies.ATTAINED_SERVICE else {}),
            **({"attainedServiceOrder": self.order or policies.FEWEST_GPUS}
               if self.policy == policies.ATTAINED_SERVICE else {}),
            "jobs": len(self.jobs),
            "finished": len(done),
            "avgJCTSeconds": sum(jct) / len(jct) if jct else None,
            "p99JCTSeconds": _percentile(jct, 0.99),
            "makespanSeconds": makespan,
            "gpuUtilization": busy / (gpus * makespan) if makespan > 0 else None,
            "avgQueueingDelaySeconds": sum(waits) / len(waits) if waits else None,
            "preemptions": sum(j.preemptions for j in self.jobs),
            "wallSeconds": self.wall_seconds,
            "clockJumps": self.clock_jumps,
            **({"interrupted": True, "virtualSecondsReplayed": self.replayed_seconds}
               if self.interrupted else {}),
        }


def _percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted ``values``."""
    if not values:
        return None
    return values[max(0, math.ceil(q * len(values)) - 1)]


def pods_of(gpus: int, per_node: int) -> tuple[int, int]:
    """(pods, GPUs per pod) for a job of ``gpus`` GPUs: one pod when it fits a node, else
    whole nodes."""
    if gpus <= per_node:
        return 1, gpus
    return math.ceil(gpus / per_node), per_node


class SimulatedNodes:
    """The agents of the simulated nodes: start bound pods, finish them when their job's
    work is done, and finish off pods being deleted (a preemption), keeping the progress."""

    def __init__(self, client: Any, clock: VirtualClock, jobs: dict[str, JobRecord], restart_overhead: float,
                 on_finish: Callable[[JobRecord], None], *, report_progress: bool = False) -> None:
        self.client = client
        self.report_progress = report_progress
        self._reporters: dict[str, asyncio.Task[None]] = {}
        self.clock = clock
        self.jobs = jobs
        self.restart_overhead = restart_overhead
        self.on_finish = on_finish
        self._timers: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.informer = Informer(client, "pods", namespace=NAMESPACE, raw=True, clock=clock)
        self.informer.add_event_handler(on_add=self._seen, on_update=lambda _o, n: self._seen(n))

    async def start(self) -> None:
        await self.informer.start()

    async def stop(self) -> None:
        for t in [*self._timers.values(), *self._reporters.values(), *self._tasks]:
            t.cancel()
        await self.informer.stop()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _seen(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        name = meta["name"]
        job = self.jobs.get((meta.get("labels") or {}).get(JOB_NAME_LABEL, ""))
        if job is None:
            return
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if meta.get("deletionTimestamp"):
            if name in job.running:
                self._stop(job, name)
            self._spawn(self._delete(name))
            return
        if phase == "Pending" and (pod.get("spec") or {}).get("nodeName") and name not in job.running \
                and name not in job.succeeded:
            self._run(job, name)

    def _run(self, job: JobRecord, pod: str) -> None:
        now = self.clock.now()
        if not job.running:
            job.run_start = now
            job.run_overhead = self.restart_overhead if job.runs else 0.0
            job.runs += 1
            if job.first_start is None:
                job.first_start = now
        job.running.add(pod)
        assert job.run_start is not None
        end = job.run_start + job.run_overhead + max(0.0, job.trace.duration - job.work_done)
        self._spawn(self._report(pod, "Running"))
        self._timers[pod] = asyncio.ensure_future(self._finish_at(job, pod, end))
        if self.report_progress and job.trace.steps and job.trace.name not in self._reporters:
            self._reporters[job.trace.name] = asyncio.ensure_future(self._progress_reports(job))

    def _steps(self, job: JobRecord) -> int:
        """The steps the job has done (checkpointed and in the run in progress)."""
        work = job.work_done
        if job.run_start is not None:
            work += max(0.0, self.clock.now() - job.run_start - job.run_overhead)
        step = job.trace.step_time or 1.0
        return min(job.trace.steps or 0, int(work / step + 1e-9))

    async def _progress_reports(self, job: JobRecord) -> None:
        """What the job's trainer reports while a run goes on: its step once past the restart
        overhead with a first step done, and again ``PROGRESS_PROBE_SECONDS`` later."""
        assert job.run_start is not None
        step = job.trace.step_time or 1.0
        first = job.run_start + job.run_overhead + step
        await self.clock.sleep(first - self.clock.now())
        await self._report_steps(job)
        await self.clock.sleep(PROGRESS_PROBE_SECONDS)
        await self._report_steps(job)

    async def _report_steps(self, job: JobRecord) -> None:
        steps = str(self._steps(job))
        for _ in range(10):
            try:
                body = await self.client.get("jobs", job.trace.name, NAMESPACE, raw=True)
            except NotFound:
                return
            annotations = body["metadata"].setdefault("annotations", {})
            if annotations.get(policies.STEPS_DONE_ANNOTATION) == steps:
                return
            annotations[policies.STEPS_DONE_ANNOTATION] = steps
            try:
                await self.client.update(body)
                return
            except Conflict:
                continue

    def _held(self, job: JobRecord, pod: str) -> None:
        """Count the GPU-time the pod held in this run."""
        assert job.run_start is not None
        job.gpu_seconds += (self.clock.now() - job.run_start) * pods_gpus(job, pod)

    def _stop(self, job: JobRecord, pod: str) -> None:
        timer = self._timers.pop(pod, None)
        if timer is not None:
            timer.cancel()
        self._held(job, pod)
        job.running.discard(pod)
        if not job.running and job.run_start is not None:
            # The run is over: the work it did beyond its overhead is checkpointed.
            job.work_done += max(0.0, self.clock.now() - job.run_start - job.run_overhead)
            job.work_done = min(job.work_done, job.trace.duration)
            job.preemptions += 1
            job.run_start = None
            reporter = self._reporters.pop(job.trace.name, None)
            if reporter is not None:
                reporter.cancel()
            if self.report_progress and job.trace.steps:
                self._spawn(self._report_steps(job))

    async def _finish_at(self, job: JobRecord, pod: str, end: float) -> None:
        await self.clock.sleep(end - self.clock.now())
        self._timers.pop(pod, None)
        self._held(job, pod)
        job.running.discard(pod)
        job.succeeded.add(pod)
        if len(job.succeeded) >= job.pods and job.finished is None:
            job.finished = self.clock.now()
            reporter = self._reporters.pop(job.trace.name, None)
            if reporter is not None:
                reporter.cancel()
            job.work_done = job.trace.duration
            self.on_finish(job)
        await self._report(pod, "Succeeded")

    async def _report(self, name: str, phase: str) -> None:
        now = rfc3339(self.clock.now())
        # First from the watch cache, as a kubelet writes its pods' status; the server's copy
        # after a conflict (the cache behind a write not seen yet).
        cached = self.informer.get(f"{NAMESPACE}/{name}")
        for attempt in range(10):
            if attempt == 0 and cached is not None:
                pod = dict(cached)
            else:
                try:
                    pod = await self.client.get("pods", name, NAMESPACE, raw=True)
                except NotFound:
                    return
            if pod["metadata"].get("deletionTimestamp"):
                return
            status = dict(pod.get("status") or {})
            running = phase == "Running"
            status["phase"] = phase
            status.setdefault("startTime", now)
            ready = "True" if running else "False"
            status["conditions"] = [
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": ready, "lastTransitionTime": now},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            ]
            state = {"running": {"startedAt": now}} if running else {
                "terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}}
            status["containerStatuses"] = [{"name": "main", "ready": running, "restartCount": 0,
                                            "image": "sim", "imageID": "", "started": running, "state": state}]
            pod["status"] = status
            try:
                await self.client.update_status(pod)
                return
            except Conflict:
                continue

    async def _delete(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            await self.client.delete("pods", name, NAMESPACE, grace_period_seconds=0)


def pods_gpus(job: JobRecord, _pod: str) -> int:
    return job.trace.gpus // job.pods if job.pods > 1 else job.trace.gpus


def node_body(name: str, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name}}}


def node_status(gpus: int, now: str) -> dict[str, Any]:
    resources = {GPU_RESOURCE: str(gpus), "cpu": "256", "memory": "2048Gi", "pods": "110"}
    return {"capacity": resources, "allocatable": resources, "conditions": [
        {"type": "Ready", "status": "True", "lastHeartbeatTime": now, "lastTransitionTime": now,
         "reason": "KubeletReady", "message": "simulated node"}]}


def queue_objects(policy: str, gpus: int, teams: list[str], levels: str | None = None,
                  starvation: str | None = None, order: str | None = None) -> list[dict[str, Any]]:
    """The ResourceFlavor, a ClusterQueue per team (one cohort sharing the cluster's GPUs),
    and their LocalQueues. ``levels``, ``starvation``, ``order``: the attained-service annotations,
    if any."""
    objs: list[dict[str, Any]] = [{"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}}]
    share = gpus // len(teams)
    for i, team in enumerate(teams):
        quota = share + (gpus - share * len(teams) if i == 0 else 0)
        spec: dict[str, Any] = {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [{"coveredResources": [GPU_RESOURCE], "flavors": [
                {"name": FLAVOR, "resources": [{"name": GPU_RESOURCE, "nominalQuota": quota}]}]}],
        }
        if len(teams) > 1:
            spec["cohort"] = "cluster"
            if policy == "fair-share":
                spec["fairSharing"] = {"weight": "1"}
                spec["preemption"] = {"reclaimWithinCohort": "Any"}
        if policy == "priority":
            spec["preemption"] = {"withinClusterQueue": "LowerPriority",
                                  **({"reclaimWithinCohort": "LowerPriority"} if len(teams) > 1 else {})}
        meta: dict[str, Any] = {"name": team}
        if policy in (policies.ATTAINED_SERVICE, policies.SHORTEST_REMAINING):
            meta["annotations"] = {policies.POLICY_ANNOTATION: policy}
            if policy == policies.ATTAINED_SERVICE and levels:
                meta["annotations"][policies.LEVELS_ANNOTATION] = levels
            if policy == policies.ATTAINED_SERVICE and starvation is not None:
                meta["annotations"][policies.STARVATION_ANNOTATION] = starvation
            if policy == policies.ATTAINED_SERVICE and order is not None:
                meta["annotations"][policies.ORDER_ANNOTATION] = order
        objs.append({"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": meta, "spec": spec})
        objs.append({"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": team, "namespace": NAMESPACE},
                     "spec": {"clusterQueue": team}})
    return objs


def job_body(job: TraceJob, queue: str, per_node: int, policy: str) -> dict[str, Any]:
    pods, gpus = pods_of(job.gpus, per_node)
    template: dict[str, Any] = {"spec": {"restartPolicy": "Never", "containers": [{
        "name": "main", "image": "sim", "resources": {"limits": {GPU_RESOURCE: str(gpus)}}}]}}
    if policy == "priority":
        template["spec"]["priorityClassName"] = f"sim-{job.priority}"
    meta: dict[str, Any] = {"name": job.name, "namespace": NAMESPACE, "labels": {QUEUE_NAME_LABEL: queue}}
    if policy == policies.SHORTEST_REMAINING and job.steps:
        meta["annotations"] = {policies.TOTAL_STEPS_ANNOTATION: str(job.steps)}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": meta,
        # Deleted once finished (its pods and Workload go with it, through the garbage
        # collector), so what every pass reads stays the size of what is live.
        "spec": {"parallelism": pods, "completions": pods, "completionMode": "NonIndexed",
                 "backoffLimit": 1000, "ttlSecondsAfterFinished": 0, "template": template},
    }


async def simulate(jobs: list[TraceJob], *, nodes: int = 8, gpus_per_node: int = 8, policy: str = "fifo",
                   restart_overhead: float = 0.0, progress: Callable[[Progress], None] | None = None,
                   batching: bool = True, levels: str | None = None, starvation: str | None = None,
                   seed: int = 0, events: bool = False, stop: Callable[[], bool] | None = None,
                   order: str | None = None) -> Result:
    """Replay ``jobs`` on ``nodes`` x ``gpus_per_node`` GPUs under ``policy``.

    ``batching``: the controllers wait their batch periods as on a live cluster (the Job
    controller's 1 s, the admission cycle's 0.1 s), so a job starts a second or so after the
    GPUs it waits for are given back; False makes them 0, so that a replay gives exact times.
    ``levels``: the attained-service thresholds in GPU-seconds ("3250,7200"), as the
    ClusterQueue's annotation gives them; None keeps the policy's defaults. ``starvation``:
    the starvation guard's factor ("0": no guard), the same way, and ``order`` the order within
    a level ("fifo", "fewest-gpus"). ``seed``: where the random
    choices come from (generated names and uids, the scheduler's ties, the informers' and
    clients' jitter), so that a replay with the same seed is the same replay. ``events``:
    record Events and refresh waiting workloads' messages as a live cluster does; off, the
    components write neither (what a user would read, not what decides), and the figures
    are the same, about 1.4 times sooner. ``stop``: asked at every clock jump; True ends the
    replay there, its figures those of the jobs finished so far (``Result.interrupted``).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: choose one of {', '.join(POLICIES)}")
    if levels is not None:
        policies.parse_levels(levels)  # raises ValueError saying what is wrong
        if policy != policies.ATTAINED_SERVICE:
            raise ValueError(f"levels are for the {policies.ATTAINED_SERVICE} policy, not {policy}")
    if starvation is not None:
        policies.parse_starvation(starvation)
        if policy != policies.ATTAINED_SERVICE:
            raise ValueError(f"the starvation factor is for the {policies.ATTAINED_SERVICE} policy, not {policy}")
    if order is not None:
        policies.parse_order(order)
        if policy != policies.ATTAINED_SERVICE:
            raise ValueError(f"the order within a level is for the {policies.ATTAINED_SERVICE} policy, not {policy}")
    for j in jobs:
        if j.gpus > nodes * gpus_per_node:
            raise ValueError(f"job {j.name} needs {j.gpus} GPUs, more than the {nodes}x{gpus_per_node} cluster has")
    saved = random.getstate()
    random.seed(seed)  # the module-level jitter (watch timeouts, retries); put back below
    try:
        return await _replay(jobs, nodes, gpus_per_node, policy, restart_overhead, progress, batching, levels,
                             starvation, seed, events, stop, order)
    finally:
        random.setstate(saved)


async def _replay(jobs: list[TraceJob], nodes: int, gpus_per_node: int, policy: str, restart_overhead: float,
                  progress: Callable[[Progress], None] | None, batching: bool, levels: str | None,
                  starvation: str | None, seed: int, events: bool,
                  stop: Callable[[], bool] | None = None, order: str | None = None) -> Result:
    from gpufleet.cli.controlplane import ControlPlane
    from gpufleet.controllers.manager import ControllerManager
    from gpufleet.scheduler import Scheduler

    wall0 = time.perf_counter()
    clock = VirtualClock()
    t0 = clock.now()
    # Trace times are relative to t0 from here on.
    records = {j.name: JobRecord(j, pods_of(j.gpus, gpus_per_node)[0]) for j in jobs}
    finished = [0]
    reported = [time.perf_counter()]

    def report() -> None:
        if progress is None:
            return
        reported[0] = time.perf_counter()
        progress(Progress(finished[0], len(records), clock.now() - t0,
                          sum(1 for r in records.values() if r.submitted is not None),
                          sum(1 for r in records.values() if r.running),
                          sum(r.preemptions for r in records.values())))

    def on_finish(_record: JobRecord) -> None:
        finished[0] += 1
        report()

    interrupted = [False]

    def replayed() -> bool:
        if time.perf_counter() - reported[0] >= PROGRESS_EVERY:
            report()
        if stop is not None and finished[0] < len(records) and stop():
            interrupted[0] = True
            return True
        return finished[0] >= len(records)

    plane = ControlPlane(store_url="sqlite://:memory:", port=0, host="127.0.0.1", secure=False,
                         run_controllers=False, leader_elect=False, kubernetes_service=False, clock=clock,
                         rng=random.Random(f"{seed}/names"))
    await plane.start()
    client = plane.client
    assert client is not None
    client.clock = clock
    client.record_events = events
    manager = scheduler = sim = None
    try:
        now = rfc3339(clock.now())
        for i in range(nodes):
            await client.create(node_body(f"node-{i}", gpus_per_node))
            node = await client.get("nodes", f"node-{i}", raw=True)
            node["status"] = node_status(gpus_per_node, now)
            await client.update_status(node)
        teams = sorted({j.team or "default" for j in jobs}) if policy == "fair-share" else ["default"]
        if policy == "priority":
            for value in sorted({j.priority for j in jobs}):
                await client.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                     "metadata": {"name": f"sim-{value}"}, "value": value})
        for obj in queue_objects(policy, nodes * gpus_per_node, teams, levels, starvation, order):
            await client.create(obj)
        # The collector's discovery resync finds no new kinds here (no CRDs): once is enough.
        manager = ControllerManager(client, clock=clock, enabled=("serviceaccount", "job", "kueue", "garbagecollector"),
                                    kueue_fair_sharing=policy == "fair-share", gc_resync_period=1e12,
                                    **({} if events else {"kueue_pending_refreshes": 0}),
                                    **({} if batching else {"job_sync_batch_period": 0.0, "kueue_batch_period": 0.0}))
        await manager.start()
        scheduler = Scheduler(client, clock=clock, flush_interval=300.0, assumed_pod_ttl=None,
                              rng=random.Random(f"{seed}/scheduler"))
        await scheduler.start()
        sim = SimulatedNodes(client, clock, records, restart_overhead, on_finish,
                             report_progress=policy == policies.SHORTEST_REMAINING)
        await sim.start()

        async def submit() -> None:
            for j in sorted(jobs, key=lambda j: j.submit):
                wait = t0 + j.submit - clock.now()
                if wait > 0:
                    await clock.sleep(wait)
                queue = (j.team or "default") if policy == "fair-share" else "default"
                await client.create(job_body(j, queue, gpus_per_node, policy))
                records[j.name].submitted = clock.now() - t0

        submitter = asyncio.ensure_future(submit())
        try:
            await clock.run(replayed)
        finally:
            submitter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await submitter
    finally:
        for component in (sim, scheduler, manager):
            if component is not None:
                await component.stop()
        await plane.stop()
    replayed_s = clock.now() - t0
    # Report times relative to the trace's start.
    for r in records.values():
        for attr in ("first_start", "finished"):
            v = getattr(r, attr)
            if v is not None:
                setattr(r, attr, v - t0)
    return Result(policy, nodes, gpus_per_node, restart_overhead, list(records.values()),
                  time.perf_counter() - wall0, clock.jumps, levels, starvation, interrupted[0], replayed_s,
                  order)
