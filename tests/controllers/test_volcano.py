"""Volcano's Job, Queue and PodGroup end to end: a real control plane (in-process API server
on SQLite), the real scheduler, the Volcano job and queue controllers, node agents running
the simulated runtime, and the real kubectl applying a manifest as Volcano's docs write it.

- a Job with minAvailable 3 over two tasks (master, worker) is placed whole: its PodGroup
  goes Pending -> Inqueue -> Running, the job Pending -> Running, all three pods bound;
- a second such Job in the same Queue (capability 3 GPUs) stays Pending: its PodGroup is not
  admitted (the Unschedulable condition says why) and none of its pods exists;
- a Job whose 3 pods cannot all fit (1 GPU free) has no pod bound at all (whole or none);
- a pod deleted from under a job is PodEvicted -> RestartJob;
- a worker that fails triggers PodFailed -> RestartJob: every pod is deleted, the job goes
  Restarting with retryCount 1 and comes back as version 1; at maxRetry it is Failed;
- plain pods (schedulerName volcano, the group annotation) of a Volcano PodGroup without a
  Job are placed together, or wait whole while a member is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml
from ctrl_helpers import NS, eventually

from gpufleet.agent.agent import AgentConfig, NodeAgent
from gpufleet.agent.devices import DeclaredDevices
from gpufleet.agent.runtime.simulated import DURATION, EXIT_CODE, SimulatedRuntime
from gpufleet.api.registry import REGISTRY
from gpufleet.cli.commands.describe import describe_object
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.cli.output import Session
from gpufleet.client.api import Client
from gpufleet.scheduler import Scheduler

KUBECTL = "/usr/bin/kubectl"
JOB_LABEL = "volcano.sh/job-name"

QUEUE = """apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata:
  name: research
spec:
  weight: 1
  reclaimable: false
  capability:
    nvidia.com/gpu: 3
"""


def job_manifest(name: str, queue: str = "research", *, worker_fails: bool = False, max_retry: int = 3,
                 master_gpus: int = 1) -> str:
    """A PyTorch Volcano Job as Volcano's docs write it: master and worker tasks, the pytorch
    plugin (which brings svc) and env, PodEvicted/PodFailed -> RestartJob, TaskCompleted ->
    CompleteJob."""
    worker_annotations = {DURATION: "0.5", EXIT_CODE: "1"} if worker_fails else {DURATION: "600"}
    return f"""apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: {name}
  namespace: {NS}
spec:
  minAvailable: 3
  schedulerName: volcano
  queue: {queue}
  maxRetry: {max_retry}
  plugins:
    pytorch: ["--master=master", "--worker=worker", "--port=23456"]
    env: []
  policies:
  - event: PodEvicted
    action: RestartJob
  - event: PodFailed
    action: RestartJob
  tasks:
  - replicas: 1
    name: master
    policies:
    - event: TaskCompleted
      action: CompleteJob
    template:
      metadata:
        annotations: {{"{DURATION}": "600"}}
      spec:
        restartPolicy: OnFailure
        containers:
        - name: master
          image: volcanosh/pytorch-mnist:v1
          command: ["python", "/opt/mnist/src/mnist.py"]
          ports:
          - containerPort: 23456
            name: job-port
          resources:
            limits:
              nvidia.com/gpu: {master_gpus}
  - replicas: 2
    name: worker
    template:
      metadata:
        annotations: {yaml.safe_dump(worker_annotations, default_flow_style=True).strip()}
      spec:
        restartPolicy: Never
        containers:
        - name: worker
          image: volcanosh/pytorch-mnist:v1
          command: ["python", "/opt/mnist/src/mnist.py"]
          resources:
            limits:
              nvidia.com/gpu: 1
"""


async def kubectl(cp: ControlPlane, *args: str, stdin: str = "") -> tuple[int, str, str]:
    # The server runs on this event loop: kubectl must not block it.
    assert cp.state_dir is not None
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cp.state_dir),
           "KUBECONFIG": str(cp.state_dir / "kubeconfig"), "TERM": "dumb"}
    proc = await asyncio.create_subprocess_exec(KUBECTL, *args, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                env=env)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.fixture
async def fleet(cp: ControlPlane, controllers, tmp_path) -> AsyncIterator[Client]:
    """Two nodes of 2 simulated GPUs, the scheduler and the Volcano controllers."""
    client = cp.client
    assert client is not None
    agents: list[NodeAgent] = []
    scheduler = Scheduler(client, flush_interval=0.2)
    try:
        for i in range(2):
            name = f"node-{i}"
            agent = NodeAgent(
                client, SimulatedRuntime(),
                DeclaredDevices(2, "NVIDIA H100 80GB HBM3", 81920, node_name=name),
                AgentConfig(node_name=name, state_dir=tmp_path / f"agent-{name}", heartbeat_interval=0.3,
                            backoff_initial=0.2, backoff_cap=0.8, cpus=32, memory_bytes=256 << 30),
            )
            await agent.start()
            agents.append(agent)
            assert await agent.wait_registered(10), f"agent {name} did not register"
        await scheduler.start(sync_timeout=10)
        await controllers(enabled=("volcanojob", "volcanoqueue", "garbagecollector"))
        yield client
    finally:
        await scheduler.stop()
        for agent in agents:
            with contextlib.suppress(Exception):
                await agent.stop()


async def job(client: Client, name: str) -> dict[str, Any]:
    return await client.get("jobs.batch.volcano.sh", name, NS, raw=True)


async def phase(client: Client, name: str) -> str:
    return ((await job(client, name)).get("status") or {}).get("state", {}).get("phase", "")


async def podgroup(client: Client, name: str) -> dict[str, Any]:
    uid = (await job(client, name))["metadata"]["uid"]
    return await client.get("podgroups.scheduling.volcano.sh", f"{name}-{uid}", NS, raw=True)


async def pods(client: Client, name: str) -> list[Any]:
    return [p for p in await client.list("pods", NS, label_selector=f"{JOB_LABEL}={name}")
            if p.metadata.deletion_timestamp is None]


async def test_volcano_job_runs_gang_scheduled_within_its_queue(fleet: Client, cp: ControlPlane) -> None:
    client = fleet
    code, _, err = await kubectl(cp, "apply", "-f", "-", stdin=QUEUE + "---\n" + job_manifest("mnist"))
    assert code == 0, err

    # Whole: the PodGroup is admitted, every pod bound, the job Running.
    await eventually(lambda: phase(client, "mnist"), timeout=20, what="a phase")
    assert await eventually(lambda: _eq(phase(client, "mnist"), "Running"), timeout=20, what="mnist Running")
    members = await pods(client, "mnist")
    assert sorted(p.metadata.name for p in members) == ["mnist-master-0", "mnist-worker-0", "mnist-worker-1"]
    assert all(p.spec.node_name for p in members)
    assert {p.metadata.annotations["scheduling.k8s.io/group-name"] for p in members} == {
        f"mnist-{(await job(client, 'mnist'))['metadata']['uid']}"}
    env = {e.name: e.value for e in next(p for p in members if p.metadata.name == "mnist-worker-1")
           .spec.containers[0].env}
    assert env["VC_TASK_INDEX"] == "1"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["RANK"]) == (
        "mnist-master-0.mnist", "23456", "3", "2")
    assert env["VC_WORKER_HOSTS"] == "mnist-worker-0.mnist,mnist-worker-1.mnist"
    assert await eventually(lambda: _eq(_field(podgroup(client, "mnist"), "status", "phase"), "Running"), timeout=10)
    svc = await client.get("services", "mnist", NS)
    assert svc.spec.cluster_ip == "None"
    cm = await client.get("configmaps", "mnist-svc", NS)
    assert cm.data["worker.host"] == "mnist-worker-0.mnist\nmnist-worker-1.mnist"

    # Volcano's columns.
    code, out, err = await kubectl(cp, "get", "vcjob", "-o", "wide")
    assert code == 0, err
    header, line = out.splitlines()[:2]
    assert header.split() == ["NAME", "STATUS", "MINAVAILABLE", "RUNNINGS", "AGE", "QUEUE"]
    assert line.split()[:4] == ["mnist", "Running", "3", "3"] and line.split()[-1] == "research"
    # The Queue's status follows its PodGroups' in the same pass, written after them.
    await eventually(lambda: _eq(_field(client.get("queues.scheduling.volcano.sh", "research", raw=True),
                                        "status", "running"), 1), timeout=10, what="queue running 1")
    code, out, err = await kubectl(cp, "get", "queue.scheduling.volcano.sh", "research", "-o", "yaml")
    assert code == 0, err
    status = yaml.safe_load(out)["status"]
    assert status["state"] == "Open" and status["running"] == 1 and status["allocated"]["nvidia.com/gpu"] == "3"

    # The queue's capability (3 GPUs) is held: a second job waits, its PodGroup Pending, no pod made.
    code, _, err = await kubectl(cp, "apply", "-f", "-", stdin=job_manifest("second"))
    assert code == 0, err
    pg = await eventually(lambda: _conditioned(podgroup(client, "second")), timeout=10, what="Unschedulable")
    assert pg["status"]["phase"] == "Pending"
    message = pg["status"]["conditions"][0]["message"]
    assert "queue resource quota insufficient: queue research capability nvidia.com/gpu 3" in message
    assert await phase(client, "second") == "Pending"
    assert await pods(client, "second") == []
    session = Session(client=client, namespace=NS, namespace_explicit=False, server="")
    text = await describe_object(session, REGISTRY.by_key("jobs.batch.volcano.sh"), await job(client, "second"))
    assert "Gang:" in text and "queue resource quota insufficient" in text
    events = await eventually(lambda: _events(client, "second", "PodGroupPending"), what="PodGroupPending")
    assert "queue resource quota insufficient" in events[-1].message

    # Whole or none: 1 GPU is free, a job of 3 one-GPU pods in the default queue gets no pod bound.
    code, _, err = await kubectl(cp, "apply", "-f", "-", stdin=job_manifest("toobig", queue="default"))
    assert code == 0, err
    waiting = await eventually(lambda: _n_pods_with_reason(client, "toobig", 3), timeout=15, what="gang reason")
    assert all(not p.spec.node_name for p in waiting)
    reason = next(c.message for c in waiting[0].status.conditions if c.type == "PodScheduled")
    assert "needs minMember 3" in reason

    # The first job leaves: the second is admitted by its queue and placed.
    code, _, err = await kubectl(cp, "delete", "vcjob", "mnist", "toobig", "--wait=false")
    assert code == 0, err
    assert await eventually(lambda: _eq(phase(client, "second"), "Running"), timeout=30, what="second Running")

    # A pod deleted from under the job is PodEvicted: its policy restarts the whole job.
    code, _, err = await kubectl(cp, "delete", "pod", "second-worker-1", "--wait=false")
    assert code == 0, err
    status = await eventually(lambda: _retried(client, "second"), timeout=20, what="second restarted")
    assert status["state"]["reason"] == "PodEvicted" and status["version"] == 1


async def test_a_failed_pod_restarts_the_whole_job_until_max_retry(fleet: Client, cp: ControlPlane) -> None:
    client = fleet
    code, _, err = await kubectl(cp, "apply", "-f", "-",
                                 stdin=job_manifest("flaky", queue="default", worker_fails=True, max_retry=2))
    assert code == 0, err
    seen: set[str] = set()

    async def restarted() -> Any:
        body = await job(client, "flaky")
        status = body.get("status") or {}
        seen.add(status.get("state", {}).get("phase", ""))
        return status if status.get("retryCount") == 1 and status.get("version") == 1 else None

    await eventually(restarted, timeout=30, interval=0.02, what="retryCount 1")
    # The restart takes every pod, the master included, and makes a new version of them.
    await eventually(lambda: _all_version(client, "flaky", "1"), timeout=20, what="pods of version 1")

    async def failed() -> Any:
        body = await job(client, "flaky")
        status = body.get("status") or {}
        seen.add(status.get("state", {}).get("phase", ""))
        return status if status.get("state", {}).get("phase") == "Failed" else None

    status = await eventually(failed, timeout=30, interval=0.02, what="Failed at maxRetry")
    assert status["retryCount"] == 2
    assert "Restarting" in seen
    phases = [c["status"] for c in status["conditions"]]
    assert phases[0] == "Pending" and phases[-1] == "Failed" and phases.count("Restarting") == 2
    events = await _events(client, "flaky", "ExecuteAction")
    assert any("RestartJob" in e.message and "(PodFailed)" in e.message for e in events)
    # The last restart took every pod and nothing was made again.
    await eventually(lambda: _none_active(client, "flaky"), timeout=20, what="no active pod")


async def _eq(value: Any, want: Any) -> bool:
    return (await value) == want


async def _field(obj: Any, *path: str) -> Any:
    value = await obj
    for p in path:
        value = (value or {}).get(p)
    return value


async def _events(client: Client, name: str, reason: str) -> list[Any]:
    return [e for e in await client.list("events", NS) if e.involved_object.name == name and e.reason == reason]


async def _retried(client: Client, name: str) -> Any:
    status = (await job(client, name)).get("status") or {}
    return status if status.get("retryCount") == 1 else None


async def _conditioned(pg: Any) -> Any:
    body = await pg
    conds = (body.get("status") or {}).get("conditions") or []
    return body if any(c.get("type") == "Unschedulable" for c in conds) else None


async def _n_pods_with_reason(client: Client, name: str, n: int) -> list[Any] | None:
    mine = await pods(client, name)
    with_reason = [p for p in mine if any(c.type == "PodScheduled" and c.status == "False" and c.message
                                          for c in (p.status.conditions if p.status else None) or [])]
    return with_reason if len(with_reason) == n else None


async def _all_version(client: Client, name: str, version: str) -> bool:
    mine = await pods(client, name)
    return len(mine) == 3 and all(p.metadata.annotations.get("volcano.sh/job-version") == version for p in mine)


async def _none_active(client: Client, name: str) -> bool:
    mine = await pods(client, name)
    return all(p.status and p.status.phase in ("Succeeded", "Failed") for p in mine)


async def test_plain_pods_with_a_volcano_podgroup_are_placed_together(fleet: Client) -> None:
    client = fleet

    async def group(name: str, min_member: int, members: int) -> None:
        await client.create({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                             "metadata": {"name": name, "namespace": NS}, "spec": {"minMember": min_member}})
        for i in range(members):
            await client.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": f"{name}-{i}", "namespace": NS, "annotations": {
                    "scheduling.k8s.io/group-name": name, DURATION: "600"}},
                "spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "x", "resources": {
                    "limits": {"nvidia.com/gpu": "1"}}}]}})

    await group("pair", 2, 2)
    await group("short", 3, 2)  # a member missing: nothing of it is placed
    bound = await eventually(lambda: _bound(client, ["pair-0", "pair-1"]), timeout=15, what="the pair bound")
    assert len(bound) == 2
    # Running once minMember are placed (bound), as Volcano's; then both members run.
    await eventually(lambda: _phase_is(client, "pair", "Running"), timeout=10, what="pair Running")
    await eventually(lambda: _eq(_field(client.get("podgroups.scheduling.volcano.sh", "pair", NS, raw=True),
                                        "status", "running"), 2), timeout=10, what="2 running")
    waiting = await eventually(lambda: _n_reasons(client, ["short-0", "short-1"], "fewer than minMember 3 members exist"),
                               timeout=10, what="short waits")
    assert all(not p.spec.node_name for p in waiting)


async def _bound(client: Client, names: list[str]) -> list[Any] | None:
    got = [await client.get("pods", n, NS) for n in names]
    return got if all(p.spec.node_name for p in got) else None


async def _phase_is(client: Client, name: str, want: str) -> Any:
    body = await client.get("podgroups.scheduling.volcano.sh", name, NS, raw=True)
    return body if (body.get("status") or {}).get("phase") == want else None


async def _n_reasons(client: Client, names: list[str], says: str) -> list[Any] | None:
    got = [await client.get("pods", n, NS) for n in names]
    ok = all(any(c.type == "PodScheduled" and c.status == "False" and says in (c.message or "")
                 for c in (p.status.conditions if p.status else None) or []) for p in got)
    return got if ok else None
