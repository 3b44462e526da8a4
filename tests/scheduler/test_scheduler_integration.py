"""The scheduler against a real control plane (in-process API server on SQLite)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from sched_factories import make_node, make_pod

from gpufleet.api.gpu import GPU_INDICES_ANNOTATION, SCHEDULING_DIAGNOSIS_ANNOTATION, parse_gpu_indices
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.scheduler import Profile, Scheduler

NS = "default"
HUGE_MESSAGE = (
    "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    " preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)


@pytest.fixture
async def control_plane(tmp_path) -> AsyncIterator[ControlPlane]:
    cp = ControlPlane(
        store_url="sqlite:///" + str(tmp_path / "db"), port=0, state_dir=tmp_path, run_controllers=False
    )
    await cp.start()
    try:
        yield cp
    finally:
        await cp.stop()


@contextlib.asynccontextmanager
async def running(scheduler: Scheduler) -> AsyncIterator[Scheduler]:
    await scheduler.start(sync_timeout=10)
    try:
        yield scheduler
    finally:
        await scheduler.stop()


async def eventually(fetch: Callable[[], Any], check: Callable[[Any], bool], within: float = 10.0) -> Any:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        value = await fetch()
        if check(value):
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met in {within}s; last value: {value}")
        await asyncio.sleep(0.05)


def pending_pod(name: str, gpus: int, *, priority_class: str | None = None, **kwargs: Any) -> dict:
    data = make_pod(name, cpu="500m", memory="1Gi", gpus=gpus, uid="", **kwargs).to_dict()
    data["metadata"].pop("uid", None)
    if priority_class:
        # Admission fills spec.priority from the class, as Kubernetes' Priority plugin does.
        data["spec"]["priorityClassName"] = priority_class
    return data


def priority_class(name: str, value: int) -> dict:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


def node_object(*args: Any, **kwargs: Any) -> dict:
    return make_node(*args, **kwargs).to_dict()


def condition(pod: Any, kind: str) -> Any:
    return next((c for c in (pod.status.conditions or []) if c.type == kind), None)


async def test_pods_are_bound_to_nodes_with_enough_gpus(control_plane: ControlPlane):
    client = control_plane.client
    await client.create(node_object("gpu-a", gpus=8, gpu_groups=[4, 4]))
    await client.create(node_object("gpu-b", gpus=6))
    await client.create(node_object("cpu-c", gpus=0))
    await client.create(priority_class("training", 100))
    wants = {"train-8": 8, "infer-2a": 2, "infer-2b": 2, "tiny-1": 1, "web": 0}
    for name, gpus in wants.items():
        # The 8-GPU job goes first: were a 1-GPU pod packed onto gpu-a before it, no node
        # would have 8 GPUs left for it (the queue orders by priority, then age).
        await client.create(pending_pod(name, gpus, priority_class="training" if gpus == 8 else None))
    await client.create(pending_pod("huge-16", 16))

    async with running(Scheduler(client, profile=Profile())) as scheduler:

        async def bound() -> dict[str, Any]:
            pods = await client.list("pods", NS)
            return {p.metadata.name: p for p in pods if p.spec.node_name}

        pods = await eventually(bound, lambda found: set(wants) <= set(found))
        assert pods["train-8"].spec.node_name == "gpu-a"  # the only node with 8 GPUs
        gpu_capacity = {"gpu-a": 8, "gpu-b": 6, "cpu-c": 0}
        by_node: dict[str, list[int]] = {}
        for name, gpus in wants.items():
            pod = pods[name]
            indices = parse_gpu_indices((pod.metadata.annotations or {}).get(GPU_INDICES_ANNOTATION, ""))
            assert len(indices) == gpus, name
            assert gpus <= gpu_capacity[pod.spec.node_name]
            assert condition(pod, "PodScheduled").status == "True"
            by_node.setdefault(pod.spec.node_name, []).extend(indices)
        for node, indices in by_node.items():
            assert len(indices) == len(set(indices)), f"GPU handed out twice on {node}"
            assert (
                sum(wants[n] for n, p in pods.items() if p.spec.node_name == node and n in wants)
                <= gpu_capacity[node]
            )

        # The pod that needs 16 GPUs stays pending, and says why.
        huge = await eventually(
            lambda: client.get("pods", "huge-16", NS),
            lambda p: condition(p, "PodScheduled") is not None,
        )
        scheduled = condition(huge, "PodScheduled")
        assert huge.spec.node_name is None
        assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")
        assert scheduled.message == HUGE_MESSAGE
        events = await eventually(
            lambda: client.list("events", NS),
            lambda evs: any(e.involved_object.name == "huge-16" for e in evs),
        )
        failed = [e for e in events if e.involved_object.name == "huge-16"]
        assert [(e.type, e.reason, e.message) for e in failed] == [
            ("Warning", "FailedScheduling", HUGE_MESSAGE)
        ]
        assert failed[0].source.component == "default-scheduler"
        diagnosis = await eventually(
            lambda: client.get("pods", "huge-16", NS),
            lambda p: SCHEDULING_DIAGNOSIS_ANNOTATION in (p.metadata.annotations or {}),
        )
        # Which node failed which check, with what it had free at that attempt: 6 on gpu-b
        # before the small pods' bindings were seen, 1 after (a retry once they were bound
        # writes the diagnosis again).
        lines = diagnosis.metadata.annotations[SCHEDULING_DIAGNOSIS_ANNOTATION].splitlines()
        assert "cpu-c: Insufficient nvidia.com/gpu (requested 16, free 0)" in lines
        assert ("gpu-b: Insufficient nvidia.com/gpu (requested 16, free 6)" in lines
                or "gpu-b: Insufficient nvidia.com/gpu (requested 16, free 1)" in lines), lines
        # Each bound pod gets its Scheduled Event (written after its binding, so in no set
        # order with the other pods' Events).
        events = await eventually(
            lambda: client.list("events", NS),
            lambda evs: {e.involved_object.name for e in evs if e.reason == "Scheduled"} >= set(wants),
        )
        scheduled_events = [e for e in events if e.reason == "Scheduled"]
        assert all(e.message.startswith(f"Successfully assigned {NS}/") for e in scheduled_events)

        # A node big enough arrives: the waiting pod is moved back and bound there.
        await client.create(node_object("gpu-huge", gpus=16, gpu_groups=[8, 8]))
        huge = await eventually(
            lambda: client.get("pods", "huge-16", NS), lambda p: p.spec.node_name == "gpu-huge"
        )
        annotations = huge.metadata.annotations or {}
        assert parse_gpu_indices(annotations[GPU_INDICES_ANNOTATION]) == tuple(range(16))
        await eventually(
            lambda: client.get("pods", "huge-16", NS),
            lambda p: SCHEDULING_DIAGNOSIS_ANNOTATION not in (p.metadata.annotations or {}),
        )
        assert scheduler.cache.assumed_count == 0 or scheduler.stats["bound"] >= len(wants) + 1


async def test_freed_gpus_are_reused_and_other_schedulers_pods_ignored(control_plane: ControlPlane):
    client = control_plane.client
    await client.create(node_object("gpu-a", gpus=4))
    await client.create(pending_pod("first", 4))
    await client.create(pending_pod("foreign", 1, scheduler_name="someone-else"))

    async with running(Scheduler(client)) as scheduler:
        await eventually(lambda: client.get("pods", "first", NS), lambda p: p.spec.node_name == "gpu-a")
        await client.create(pending_pod("second", 2))
        second = await eventually(
            lambda: client.get("pods", "second", NS),
            lambda p: (
                condition(p, "PodScheduled") is not None and condition(p, "PodScheduled").status == "False"
            ),
        )
        assert (
            condition(second, "PodScheduled").message
            == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
            " preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
        )

        # The first pod is gone (a bound pod's graceful deletion would wait for its node
        # agent; there is none here): its GPUs go to the second.
        await client.delete("pods", "first", NS, grace_period_seconds=0)
        second = await eventually(
            lambda: client.get("pods", "second", NS), lambda p: p.spec.node_name == "gpu-a"
        )
        assert len(parse_gpu_indices(second.metadata.annotations[GPU_INDICES_ANNOTATION])) == 2
        foreign = await client.get("pods", "foreign", NS)
        assert foreign.spec.node_name is None and condition(foreign, "PodScheduled") is None
        await scheduler.wait_idle()
        assert scheduler.stats["unschedulable"] >= 1


async def test_a_failed_binding_is_forgotten_and_retried(control_plane: ControlPlane):
    from gpufleet.scheduler.framework import SKIP, Code, Status
    from gpufleet.scheduler.plugins import in_tree_registry

    attempts: list[str] = []

    class FlakyBinder:
        """Fails the first binding it sees, then leaves binding to DefaultBinder."""

        name = "FlakyBinder"

        def __init__(self, args, handle):
            pass

        async def bind(self, state, pod_info, node_name):
            attempts.append(node_name)
            if len(attempts) == 1:
                return Status(Code.ERROR, ["the API server went away"])
            return SKIP

    client = control_plane.client
    await client.create(node_object("gpu-a", gpus=2))
    await client.create(pending_pod("job", 2))
    profile = Profile()
    profile.plugins.insert(profile.plugins.index("DefaultBinder"), "FlakyBinder")
    registry = {**in_tree_registry(), "FlakyBinder": FlakyBinder}
    async with running(Scheduler(client, profile=profile, registry=registry)) as scheduler:
        job = await eventually(lambda: client.get("pods", "job", NS), lambda p: p.spec.node_name == "gpu-a")
        assert len(attempts) == 2
        assert parse_gpu_indices(job.metadata.annotations[GPU_INDICES_ANNOTATION]) == (0, 1)
        await scheduler.wait_idle()
        assert scheduler.stats["bind_failed"] == 1 and scheduler.stats["bound"] == 1
        node = scheduler.cache.get_node("gpu-a")
        await eventually(lambda: _noop(), lambda _: scheduler.cache.assumed_count == 0)
        assert node.req_gpus == 2 and sorted(node.gpu_refs) == [0, 1]
        events = await client.list("events", NS)
        assert any(e.reason == "FailedScheduling" and "the API server went away" in e.message for e in events)


async def _noop() -> None:
    return None
