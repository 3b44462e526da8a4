"""Two PyTorchJobs that each need 75% of the fleet's GPUs, end to end: a real control plane
(in-process API server on SQLite), the real scheduler, the PyTorchJob controller, and node
agents running the simulated runtime.

One job runs; the other waits whole (no member bound, no GPU held) with a reason that
names its pod group and how many members fit, visible on its pods, on the job (Events)
and in `describe`; when the first job succeeds, the second is placed and runs to the end.

The simulated containers run on a clock that only the test moves, so "the first job still
runs" holds for exactly as long as the test needs it to, however slow the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
from ctrl_helpers import NS, eventually

from gpufleet.agent.agent import AgentConfig, NodeAgent
from gpufleet.agent.devices import DeclaredDevices
from gpufleet.agent.runtime.simulated import DURATION, SimulatedRuntime
from gpufleet.api.k8s import Pod
from gpufleet.api.registry import REGISTRY
from gpufleet.cli.commands.describe import describe_object
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.cli.output import Session
from gpufleet.client.api import Client
from gpufleet.controllers.pytorchjob import GANG_PENDING, GANG_SCHEDULED, gang_wait_reason
from gpufleet.scheduler import Scheduler

JOB_LABEL = "training.kubeflow.org/job-name"
GPU_INDICES = "gpufleet.io/gpu-indices"
RUN_SECONDS = 60  # of the test's clock: the jobs end only when the test moves it


class HeldClock:
    """Wall time standing still until ``advance``: what the simulated containers run on."""

    def __init__(self) -> None:
        self._now = time.time()
        self._mono = 0.0
        self._moved = asyncio.Event()

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._mono += seconds
        self._moved.set()
        self._moved = asyncio.Event()

    def sleep(self, seconds: float) -> Coroutine[Any, Any, None]:
        # The end is fixed when sleep() is called, not when the coroutine first runs: the
        # runtime computes ``seconds`` from now() and may start the sleep as a task later.
        return self._until(self._mono + seconds)

    async def _until(self, mono: float) -> None:
        while self._mono < mono:
            await self._moved.wait()


@dataclass(frozen=True)
class Shape:
    """A fleet and two identical jobs of Master 1 + ``workers`` Workers."""

    nodes: int
    gpus_per_node: int
    workers: int
    gpus_per_pod: int
    # Members of the waiting gang that would fit next to the running one.
    fit: int

    @property
    def members(self) -> int:
        return 1 + self.workers

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


SHAPES = {
    # 6 of 8 GPUs each (75%), one GPU per pod: 2 members of the second job would fit.
    "three-quarters": Shape(nodes=2, gpus_per_node=4, workers=5, gpus_per_pod=1, fit=2),
    # Whole-node pods, each job the whole fleet: nothing of the second job fits anywhere.
    "whole-nodes": Shape(nodes=4, gpus_per_node=2, workers=3, gpus_per_pod=2, fit=0),
}


@dataclass
class Fleet:
    shape: Shape
    client: Client
    scheduler: Scheduler
    clock: HeldClock
    # Every pod event from before the jobs were submitted: (type, pod, job, node, phase, when).
    log: list[tuple[str, str, str, str | None, str, float]] = field(default_factory=list)


@pytest.fixture(params=list(SHAPES), ids=list(SHAPES))
async def fleet(request, cp: ControlPlane, controllers, tmp_path) -> AsyncIterator[Fleet]:
    """Nodes with simulated GPUs, the scheduler and the PyTorchJob and PodGroup controllers."""
    shape = SHAPES[request.param]
    client = cp.client
    assert client is not None
    clock = HeldClock()
    agents: list[NodeAgent] = []
    scheduler = Scheduler(client, flush_interval=0.2)
    try:
        for i in range(shape.nodes):
            name = f"node-{i}"
            agent = NodeAgent(
                client,
                SimulatedRuntime(clock),
                DeclaredDevices(shape.gpus_per_node, "NVIDIA H100 80GB HBM3", 81920, node_name=name),
                AgentConfig(node_name=name, state_dir=tmp_path / f"agent-{name}", heartbeat_interval=0.3,
                            backoff_initial=0.2, backoff_cap=0.8, cpus=32, memory_bytes=256 << 30),
            )
            await agent.start()
            agents.append(agent)
            assert await agent.wait_registered(10), f"agent {name} did not register"
        await scheduler.start(sync_timeout=10)
        await controllers(enabled=("pytorchjob", "podgroup"), pytorchjob_restart_backoff=0.0,
                          pytorchjob_checkpoint_root=str(tmp_path / "checkpoints"))
        yield Fleet(shape, client, scheduler, clock)
    finally:
        await scheduler.stop()
        for agent in agents:
            with contextlib.suppress(Exception):
                await agent.stop()


def training_job(name: str, workers: int, gpus: int) -> dict[str, Any]:
    def replica(replicas: int) -> dict[str, Any]:
        return {
            "replicas": replicas,
            "restartPolicy": "OnFailure",
            "template": {
                "metadata": {"annotations": {DURATION: str(RUN_SECONDS)}},
                "spec": {"containers": [{"name": "pytorch", "image": "train:v1", "command": ["python", "train.py"],
                                         "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            },
        }

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(workers)}},
    }


async def record_pods(client: Client, since: str, log: list[tuple[str, str, str, str | None, str, float]]) -> None:
    async for ev in client.watch("pods", NS, resource_version=since):
        if ev.type == "BOOKMARK":
            continue
        p = ev.object
        job = (p.metadata.labels or {}).get(JOB_LABEL, "")
        phase = (p.status.phase if p.status else None) or ""
        log.append((ev.type, p.metadata.name, job, p.spec.node_name, phase, time.monotonic()))


async def job_pods(client: Client, job: str) -> list[Any]:
    return [p for p in await client.list("pods", NS, label_selector=f"{JOB_LABEL}={job}")
            if p.metadata.deletion_timestamp is None]


def scheduled_condition(pod: Any) -> Any:
    return next((c for c in (pod.status.conditions or []) if c.type == "PodScheduled"), None)


async def job_condition(client: Client, job: str, type_: str) -> dict[str, Any] | None:
    body = await client.get("pytorchjobs", job, NS, raw=True)
    return next((c for c in (body.get("status") or {}).get("conditions") or []
                 if c["type"] == type_ and c["status"] == "True"), None)


async def job_events(client: Client, job: str, reason: str) -> list[Any]:
    return [e for e in await client.list("events", NS)
            if e.involved_object.kind == "PyTorchJob" and e.involved_object.name == job and e.reason == reason]


async def test_two_jobs_that_each_need_most_of_the_gpus_run_one_after_the_other(fleet: Fleet) -> None:
    client = fleet.client
    since = (await client.list("pods", NS)).resource_version
    watcher = asyncio.create_task(record_pods(client, since, fleet.log))
    try:
        await _run_both(fleet)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _run_both(fleet: Fleet) -> None:
    client, shape = fleet.client, fleet.shape
    n, fit = shape.members, shape.fit
    waits = f"pod group {NS}/{{job}}: {fit} of {n} members fit, needs minMember {n}"
    submitted = time.monotonic()
    await asyncio.gather(*(client.create(training_job(j, shape.workers, shape.gpus_per_pod), raw=True)
                           for j in ("job-a", "job-b")))

    async def split() -> tuple[str, str] | None:
        pods = {j: await job_pods(client, j) for j in ("job-a", "job-b")}
        running = [j for j, ps in pods.items() if len(ps) == n and all(p.status.phase == "Running" for p in ps)]
        waiting = [j for j, ps in pods.items() if len(ps) == n and all(
            ((scheduled_condition(p) or _NO).message or "").startswith(waits.format(job=j)) for p in ps)]
        return (running[0], waiting[0]) if running and waiting else None

    winner, loser = await eventually(split, timeout=20, what="one job running and the other waiting")
    reason = waits.format(job=loser)

    # The waiting gang holds nothing: no member bound, no GPU, nothing assumed by the scheduler.
    for p in await job_pods(client, loser):
        assert p.spec.node_name is None
        assert GPU_INDICES not in (p.metadata.annotations or {})
        condition = scheduled_condition(p)
        assert (condition.status, condition.reason) == ("False", "Unschedulable")
        assert condition.message.startswith(reason + "; ")
        assert "Insufficient nvidia.com/gpu" in condition.message
    held = {p.key for node in fleet.scheduler.cache.snapshot() for p in node.pods.values()}
    assert not any(key.startswith(f"{NS}/{loser}-") for key in held)
    assert len([k for k in held if k.startswith(f"{NS}/{winner}-")]) == n
    assert {p.spec.node_name for p in await job_pods(client, winner)} == {f"node-{i}" for i in range(shape.nodes)}

    # The job says why it waits: a GangPending Event with the scheduler's reason, once per
    # distinct reason however often the job is synced.
    pending = await eventually(lambda: _pending_with(client, loser, reason), what="a GangPending Event")
    assert pending.message == f"PyTorchJob {loser} waits for its gang: {condition.message}"
    all_pending = await job_events(client, loser, GANG_PENDING)
    assert len({e.message for e in all_pending}) == len(all_pending)
    assert all((e.count or 1) == 1 for e in all_pending)
    assert await job_condition(client, loser, "Running") is None
    assert await job_condition(client, loser, "Created") is not None

    # The PodGroups as the scheduler keeps them.
    pg = await eventually(lambda: _podgroup_in(client, loser, "PreScheduling"), what=f"{loser} PreScheduling")
    assert (pg["status"].get("scheduled", 0), pg["spec"]["minMember"]) == (0, n)
    await eventually(lambda: _podgroup_in(client, winner, "Running"), what=f"{winner} Running")

    # describe: on the job (its Events and its gang) and on its pod group.
    session = Session(client=client, namespace=NS, namespace_explicit=False, server="")
    job = await client.get("pytorchjobs", loser, NS, raw=True)
    text = await describe_object(session, REGISTRY.by_key("pytorchjobs.kubeflow.org"), job)
    assert re.search(rf"Normal\s+{GANG_PENDING}\s+.*{re.escape(reason)}", text)
    assert re.search(r"Gang:\n\s+Pod Group:\s+" + loser + r"\n\s+Phase:\s+PreScheduling", text)
    assert re.search(r"Waiting:\s+" + re.escape(reason), text)
    assert re.search(rf"Occupied By:\s+{NS}/{loser}\n", text)
    group = await client.get("podgroups", loser, NS, raw=True)
    text = await describe_object(session, REGISTRY.by_key("podgroups.scheduling.x-k8s.io"), group)
    assert re.search(r"Phase:\s+PreScheduling", text)
    assert re.search(rf"Min Member:\s+{n}\n", text)
    assert re.search(r"Scheduled:\s+0\n", text)
    assert re.search(r"Waiting:\s+" + re.escape(reason), text)
    assert re.search(rf"{loser}-master-0\s+Pending\s+<none>", text)

    # The first job finishes: its containers exit 0.
    still_waiting = len(fleet.log)
    fleet.clock.advance(RUN_SECONDS + 1)
    done = await eventually(lambda: job_condition(client, winner, "Succeeded"), timeout=20,
                            what=f"{winner} Succeeded")
    assert done["reason"] == "PyTorchJobSucceeded"
    # Its gang has ended: the PodGroup says so, and describe no longer calls it occupied.
    await eventually(lambda: _podgroup_in(client, winner, "Finished"), what=f"{winner} Finished")
    text = await describe_object(session, REGISTRY.by_key("pytorchjobs.kubeflow.org"),
                                 await client.get("pytorchjobs", winner, NS, raw=True))
    assert re.search(r"Gang:\n\s+Pod Group:\s+" + winner + r"\n\s+Phase:\s+Finished", text)
    assert "Occupied By" not in text
    await eventually(lambda: _all_running(client, loser, n), timeout=20, what=f"{loser} placed and running")
    assert await eventually(lambda: job_events(client, loser, GANG_SCHEDULED), what="GangScheduled")

    # Never a bind of the waiting job while the first job held its GPUs: none before the
    # clock moved, and at each of its binds the GPUs in use stay within those there are.
    assert not [e for e in fleet.log[:still_waiting] if e[2] == loser and e[3]]
    bound: dict[str, set[str]] = {winner: set(), loser: set()}
    freed = placed = 0.0
    for _, name, job_name, node, phase, at in fleet.log:
        if job_name not in bound:
            continue
        before = len(bound[job_name])
        if node and phase not in ("Succeeded", "Failed"):
            bound[job_name].add(name)
        else:
            bound[job_name].discard(name)
        in_use = (len(bound[winner]) + len(bound[loser])) * shape.gpus_per_pod
        assert in_use <= shape.gpus, f"GPUs oversubscribed at {name}"
        if job_name == winner and len(bound[winner]) < before and not freed:
            freed = at
        if job_name == loser and len(bound[loser]) == n and not placed:
            placed = at

    fleet.clock.advance(RUN_SECONDS + 1)
    done = await eventually(lambda: job_condition(client, loser, "Succeeded"), timeout=20,
                            what=f"{loser} Succeeded")
    assert done["reason"] == "PyTorchJobSucceeded"
    # Most of the wait is this test looking around before it lets the first job end.
    print(f"\n{loser} waited {placed - submitted:.2f}s from submission until its whole gang was bound; "
          f"bound {placed - freed:.3f}s after the first pod of {winner} ended")


class _NoCondition:
    message = ""


_NO = _NoCondition()


async def _pending_with(client: Client, job: str, reason: str) -> Any:
    return next((e for e in await job_events(client, job, GANG_PENDING) if reason in e.message), None)


async def _podgroup_in(client: Client, name: str, phase: str) -> dict[str, Any] | None:
    pg = await client.get("podgroups", name, NS, raw=True)
    return pg if (pg.get("status") or {}).get("phase") == phase else None


async def _all_running(client: Client, job: str, n: int) -> list[Any] | None:
    pods = await job_pods(client, job)
    ok = len(pods) == n and all(p.spec.node_name and p.status.phase == "Running" for p in pods)
    return pods if ok else None


def test_the_wait_reason_is_the_one_the_whole_gang_carries() -> None:
    def pod(name: str, message: str | None, node: str | None = None) -> Pod:
        conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]
        spec = {"nodeName": node, "containers": [{"name": "pytorch", "image": "train:v1"}]}
        return Pod.from_dict({"metadata": {"name": name, "namespace": NS}, "spec": spec,
                              "status": {"phase": "Pending", "conditions": conditions if message else []}})

    gang = "pod group default/j: 2 of 3 members fit, needs minMember 3"
    assert gang_wait_reason([pod("j-0", gang), pod("j-1", gang), pod("j-2", gang)]) == gang
    # A cycle under way (members disagree, or one not yet looked at): nothing to report yet.
    assert gang_wait_reason([pod("j-0", gang), pod("j-1", "pod group default/j: fewer than minMember 3 members exist")]) \
        is None
    assert gang_wait_reason([pod("j-0", gang), pod("j-1", None)]) is None
    # Placed members do not wait.
    assert gang_wait_reason([pod("j-0", None, node="n1"), pod("j-1", gang)]) == gang
    assert gang_wait_reason([pod("j-0", None, node="n1")]) is None
