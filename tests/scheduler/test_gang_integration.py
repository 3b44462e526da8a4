"""Gang scheduling and preemption against a real control plane (in-process API server on
SQLite), the real scheduler and node agents running the simulated runtime."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from test_scheduler_integration import eventually, node_object, pending_pod, priority_class

from gpufleet.agent.agent import AgentConfig, NodeAgent
from gpufleet.agent.devices import DeclaredDevices
from gpufleet.agent.runtime.simulated import SimulatedRuntime
from gpufleet.api.gpu import RACK_LABEL, SCHEDULING_DIAGNOSIS_ANNOTATION
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.controllers.manager import start_controllers
from gpufleet.scheduler import Scheduler

NS = "default"
GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


@pytest.fixture
async def cluster(tmp_path) -> AsyncIterator[Any]:
    """A control plane, a scheduler, and a function that adds simulated 8-GPU nodes."""
    cp = ControlPlane(
        store_url="sqlite:///" + str(tmp_path / "db"), port=0, state_dir=tmp_path, run_controllers=False
    )
    await cp.start()
    agents: list[NodeAgent] = []
    scheduler = Scheduler(cp.client, flush_interval=0.2)

    async def add_node(name: str, gpus: int = 8, rack: str = "r1") -> NodeAgent:
        agent = NodeAgent(
            cp.client,
            SimulatedRuntime(),
            DeclaredDevices(gpus, "NVIDIA H100 80GB HBM3", 81920, node_name=name),
            AgentConfig(
                node_name=name,
                state_dir=tmp_path / f"agent-{name}",
                heartbeat_interval=0.3,
                backoff_initial=0.4,
                backoff_cap=1.6,
                labels={RACK_LABEL: rack},
                cpus=32,
                memory_bytes=256 << 30,
            ),
        )
        await agent.start()
        assert await agent.wait_registered(10), "the agent did not register"
        agents.append(agent)
        return agent

    await scheduler.start(sync_timeout=10)
    # The PodGroups' status is the PodGroup controller's.
    manager = await start_controllers(cp.client, enabled=("podgroup",))
    cp.add_node = add_node  # type: ignore[attr-defined]
    cp.scheduler_under_test = scheduler  # type: ignore[attr-defined]
    try:
        yield cp
    finally:
        await manager.stop()
        await scheduler.stop()
        for agent in agents:
            with contextlib.suppress(Exception):
                await agent.stop()
        await cp.stop()


def pod_group(name: str, min_member: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"minMember": min_member, **spec},
    }


def member(group: str, index: int, gpus: int, **kwargs: Any) -> dict[str, Any]:
    return pending_pod(f"{group}-{index}", gpus, labels={GROUP_LABEL: group}, **kwargs)


def scheduled_condition(pod: Any) -> Any:
    return next((c for c in (pod.status.conditions or []) if c.type == "PodScheduled"), None)


async def group_pods(client: Any, group: str) -> list[Any]:
    pods = await client.list("pods", NS, label_selector=f"{GROUP_LABEL}={group}")
    return list(pods)


async def test_two_gangs_of_three_quarters_one_runs_the_other_waits_whole(cluster):
    client = cluster.client
    for i in range(4):
        await cluster.add_node(f"node-{i}")
    # Each gang needs 24 of the 32 GPUs; their members arrive interleaved, one by one, as
    # two controllers would create them.
    await client.create(pod_group("job-a", 3))
    await client.create(pod_group("job-b", 3))
    for i in range(3):
        await client.create(member("job-a", i, 8))
        await client.create(member("job-b", i, 8))

    async def both() -> dict[str, list[Any]]:
        return {g: await group_pods(client, g) for g in ("job-a", "job-b")}

    def settled(gangs: dict[str, list[Any]]) -> bool:
        running = [g for g, pods in gangs.items() if all(p.status.phase == "Running" for p in pods)]
        waiting = [
            g
            for g, pods in gangs.items()
            if all(
                scheduled_condition(p) is not None
                and f"pod group default/{g}: 1 of 3" in (scheduled_condition(p).message or "")
                # The per-node breakdown is written right after the condition.
                and SCHEDULING_DIAGNOSIS_ANNOTATION in (p.metadata.annotations or {})
                for p in pods
            )
        ]
        return len(running) == 1 and len(waiting) == 1

    gangs = await eventually(both, settled)
    winner = next(g for g, pods in gangs.items() if all(p.status.phase == "Running" for p in pods))
    loser = "job-b" if winner == "job-a" else "job-a"
    assert len({p.spec.node_name for p in gangs[winner]}) == 3
    for p in gangs[loser]:
        assert p.spec.node_name is None
        condition = scheduled_condition(p)
        assert (condition.status, condition.reason) == ("False", "Unschedulable")
        assert condition.message.startswith(
            f"pod group default/{loser}: 1 of 3 members fit, needs minMember 3; "
        )
        assert "Insufficient nvidia.com/gpu" in p.metadata.annotations[SCHEDULING_DIAGNOSIS_ANNOTATION]
    events = await client.list("events", NS)
    assert any(
        e.reason == "FailedScheduling"
        and e.involved_object.name == f"{loser}-0"
        and f"pod group default/{loser}" in e.message
        for e in events
    )
    # No member of the waiting gang was ever bound, nor holds anything now.
    assert not any(e.reason == "Scheduled" and e.involved_object.name.startswith(loser) for e in events)
    held = {p.key for n in cluster.scheduler_under_test.cache.snapshot() for p in n.pods.values()}
    assert not any(key.startswith(f"{NS}/{loser}") for key in held)
    pg_winner = await eventually(
        lambda: client.get("podgroups.scheduling.x-k8s.io", winner, NS),
        lambda pg: pg.status is not None and pg.status.phase == "Running",
    )
    assert (pg_winner.status.scheduled, pg_winner.status.running) == (3, 3)
    pg_loser = await eventually(
        lambda: client.get("podgroups.scheduling.x-k8s.io", loser, NS),
        lambda pg: pg.status is not None and pg.status.phase == "PreScheduling",
    )
    assert pg_loser.status.scheduled == 0 and pg_loser.status.schedule_start_time is not None

    # The first gang finishes: the second is placed, whole.
    for p in gangs[winner]:
        await client.delete("pods", p.metadata.name, NS)
    placed = await eventually(
        lambda: group_pods(client, loser),
        lambda pods: all(p.spec.node_name for p in pods) and all(p.status.phase == "Running" for p in pods),
        within=20,
    )
    assert len({p.spec.node_name for p in placed}) == 3


async def test_late_members_are_waited_for_and_the_wait_times_out(cluster):
    client = cluster.client
    await cluster.add_node("node-0")
    await client.create(pod_group("late", 3, scheduleTimeoutSeconds=1))
    for i in range(2):
        await client.create(member("late", i, 2))
    await eventually(
        lambda: group_pods(client, "late"),
        lambda pods: all(
            scheduled_condition(p) is not None
            and (scheduled_condition(p).message or "").startswith(
                "pod group default/late: fewer than minMember 3 members exist; waiting for the rest"
            )
            for p in pods
        ),
    )
    timeouts = await eventually(
        lambda: client.list("events", NS),
        lambda evs: any(e.reason == "ScheduleTimeout" and e.involved_object.kind == "PodGroup" for e in evs),
    )
    timeout = next(e for e in timeouts if e.reason == "ScheduleTimeout")
    assert timeout.message.startswith("pod group default/late was not placed within scheduleTimeoutSeconds 1")
    assert all(p.spec.node_name is None for p in await group_pods(client, "late"))
    pg = await client.get("podgroups.scheduling.x-k8s.io", "late", NS)
    assert (pg.status.phase, pg.status.scheduled) == ("Pending", 0)
    node = await client.get("nodes", "node-0")
    assert cluster.scheduler_under_test.cache.get_node(node.metadata.name).req_gpus == 0

    await client.create(member("late", 2, 2))
    pods = await eventually(
        lambda: group_pods(client, "late"), lambda pods: all(p.spec.node_name for p in pods)
    )
    assert {p.spec.node_name for p in pods} == {"node-0"}


async def test_a_member_waiting_for_the_rest_gets_one_event_and_one_condition_write(cluster):
    # Each arrival sends every waiting member back; the wait's message does not change with
    # the count, so a waiting member gets one Event and one PodScheduled write, not one per
    # arrival (a gang of n arriving one by one would otherwise cost n(n-1)/2 of each).
    client = cluster.client
    await cluster.add_node("node-0")
    await client.create(pod_group("slow", 4))
    waiting = "pod group default/slow: fewer than minMember 4 members exist; waiting for the rest"
    first_version = None
    for i in range(3):
        await client.create(member("slow", i, 1))
        pods = await eventually(
            lambda: group_pods(client, "slow"),
            lambda pods, n=i + 1: len(pods) == n and all(
                (scheduled_condition(p).message if scheduled_condition(p) else "").startswith(waiting)
                for p in pods),
        )
        if i == 0:
            first_version = pods[0].metadata.resource_version
    await asyncio.sleep(0.5)  # let any write queued behind the third arrival land
    first = await client.get("pods", "slow-0", NS)
    assert first.metadata.resource_version == first_version, "slow-0 was rewritten by a later arrival"
    events = [e for e in await client.list("events", NS)
              if e.reason == "FailedScheduling" and e.involved_object.name.startswith("slow-")]
    per_member = {name: sum(e.count or 1 for e in events if e.involved_object.name == name)
                  for name in {e.involved_object.name for e in events}}
    assert per_member == {"slow-0": 1, "slow-1": 1, "slow-2": 1}, per_member
    assert all(e.message.startswith(waiting) for e in events)

    await client.create(member("slow", 3, 1))
    await eventually(lambda: group_pods(client, "slow"), lambda pods: len(pods) == 4 and all(
        p.spec.node_name for p in pods))


async def test_a_high_priority_pod_preempts_a_low_one(cluster):
    client = cluster.client
    await cluster.add_node("node-0")
    await client.create(priority_class("low", 1))
    await client.create(priority_class("high", 1000))
    low = pending_pod("low", 8, priority_class="low")
    low["spec"]["terminationGracePeriodSeconds"] = 1
    await client.create(low)
    await eventually(lambda: client.get("pods", "low", NS), lambda p: p.status.phase == "Running")
    await client.create(pending_pod("urgent", 8, priority_class="high"))
    urgent = await eventually(
        lambda: client.get("pods", "urgent", NS), lambda p: p.spec.node_name == "node-0", within=20
    )
    assert urgent.status.nominated_node_name == "node-0"
    events = await client.list("events", NS)
    preempted = [e for e in events if e.reason == "Preempted"]
    assert [(e.involved_object.name, e.message) for e in preempted] == [
        ("low", "Preempted by default/urgent on node node-0")
    ]
    assert any(e.reason == "Preempting" and e.involved_object.name == "urgent" for e in events)


async def test_a_gang_preempts_whole_and_then_binds_whole(cluster):
    client = cluster.client
    for i in range(2):
        await cluster.add_node(f"node-{i}")
    await client.create(priority_class("batch", 1))
    await client.create(priority_class("training", 1000))
    for i in range(2):
        filler = pending_pod(f"filler-{i}", 8, priority_class="batch")
        filler["spec"]["terminationGracePeriodSeconds"] = 1
        await client.create(filler)
    await eventually(
        lambda: client.list("pods", NS),
        lambda pods: sum(1 for p in pods if p.status.phase == "Running") == 2,
    )
    await client.create(pod_group("urgent", 2))
    for i in range(2):
        await client.create(member("urgent", i, 8, priority_class="training"))
    pods = await eventually(
        lambda: group_pods(client, "urgent"),
        lambda pods: all(p.spec.node_name for p in pods),
        within=20,
    )
    assert {p.spec.node_name for p in pods} == {"node-0", "node-1"}
    remaining = [
        p.metadata.name for p in await client.list("pods", NS) if p.metadata.name.startswith("filler")
    ]
    assert remaining == []
    events = await client.list("events", NS)
    preempted = sorted((e.involved_object.name, e.message) for e in events if e.reason == "Preempted")
    assert [name for name, _ in preempted] == ["filler-0", "filler-1"]
    assert all(message.startswith("Preempted by default/urgent-") for _, message in preempted)


async def test_the_preemptor_waits_for_its_victims_to_terminate(cluster):
    """A node without an agent: the victim stays terminating until it is force-deleted."""
    client = cluster.client
    await client.create(node_object("quiet", gpus=8))
    await client.create(priority_class("low", 1))
    await client.create(priority_class("high", 1000))
    victim = pending_pod("victim", 8, priority_class="low", node_name="quiet")
    victim["spec"]["terminationGracePeriodSeconds"] = 30
    await client.create(victim)
    await client.create(pending_pod("urgent", 8, priority_class="high"))
    victim = await eventually(
        lambda: client.get("pods", "victim", NS),
        lambda p: (
            p.metadata.deletion_timestamp is not None
            and any(c.type == "DisruptionTarget" for c in p.status.conditions or [])
        ),
    )
    target = next(c for c in victim.status.conditions if c.type == "DisruptionTarget")
    assert (target.status, target.reason) == ("True", "PreemptionByScheduler")
    urgent = await eventually(
        lambda: client.get("pods", "urgent", NS), lambda p: p.status.nominated_node_name == "quiet"
    )
    # Still terminating: the preemptor is nominated, not bound, and preempts nothing more.
    assert urgent.spec.node_name is None
    await client.delete("pods", "victim", NS, grace_period_seconds=0)
    await eventually(lambda: client.get("pods", "urgent", NS), lambda p: p.spec.node_name == "quiet")
    assert cluster.scheduler_under_test.stats["preemptions"] == 1


async def test_a_gang_is_bound_in_one_request_and_one_transaction(cluster):
    """The members' bindings reach the API as one List (one transaction): their binding
    writes take consecutive revisions, and each member still gets its own watch event and
    its Scheduled event."""
    client = cluster.client
    await cluster.add_node("node-0")
    binder = cluster.scheduler_under_test.framework.binders[0]
    before = dict(binder.batcher().stats)
    await client.create(pod_group("gang", 4))
    members = [await client.create(member("gang", i, 2)) for i in range(4)]
    start = max(int(p.metadata.resource_version) for p in members)
    bound = await eventually(lambda: group_pods(client, "gang"),
                             lambda pods: len(pods) == 4 and all(p.spec.node_name for p in pods))
    assert {p.spec.node_name for p in bound} == {"node-0"}
    # The revision of each member's binding write, read from the history.
    first_bound: dict[str, int] = {}
    resp = await client.raw_request("GET", f"/api/v1/namespaces/{NS}/pods", params={
        "watch": "true", "resourceVersion": str(start), "timeoutSeconds": "1"})
    for line in resp.body.splitlines():
        ev = json.loads(line)
        obj = ev["object"]
        if ev["type"] == "MODIFIED" and obj["spec"].get("nodeName"):
            first_bound.setdefault(obj["metadata"]["name"], int(obj["metadata"]["resourceVersion"]))
    revisions = sorted(first_bound.values())
    assert len(revisions) == 4 and revisions == list(range(revisions[0], revisions[0] + 4)), first_bound
    stats = binder.batcher().stats
    assert stats["bulk_requests"] - before["bulk_requests"] == 1
    assert stats["fallbacks"] == before["fallbacks"]
    events = await eventually(
        lambda: client.list("events", NS),
        lambda evs: {e.involved_object.name for e in evs if e.reason == "Scheduled"} >= {p.metadata.name for p in bound})
    assert events


async def test_a_failed_batch_binds_each_pod_on_its_own(cluster):
    """One pod of a batch bound meanwhile: the List is refused whole, then every pod is sent
    alone, so the others are bound and that one gets its own Conflict."""
    from gpufleet.client.errors import Conflict
    from gpufleet.scheduler.plugins.defaultbinder import BindingBatcher, binding_body
    from gpufleet.scheduler.snapshot import PodInfo

    client = cluster.client
    pods = [await client.create(pending_pod(f"solo-{i}", 0, scheduler_name="someone-else")) for i in range(3)]
    await client.raw_request("POST", f"/api/v1/namespaces/{NS}/pods/solo-1/binding",
                             json=binding_body(PodInfo(pods[1]), "node-x"))
    batcher = BindingBatcher(client)
    results = await asyncio.gather(*(batcher.bind(NS, binding_body(PodInfo(p), "node-y")) for p in pods),
                                   return_exceptions=True)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], Conflict), results
    assert batcher.stats == {"requests": 4, "bulk_requests": 1, "fallbacks": 1}
    got = {p.metadata.name: p.spec.node_name for p in await client.list("pods", NS)}
    assert got == {"solo-0": "node-y", "solo-1": "node-x", "solo-2": "node-y"}
