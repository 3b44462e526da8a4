"""The HPA controller against a real API server: it reads the target's /scale and its pods,
writes the new scale, status conditions and Events. Metrics come from a stand-in source
(the gateway and metrics.k8s.io are exercised in tests/gateway and tests/e2e/test_serving.py);
time is a FakeClock and each sync is one direct reconcile, so windows are exact."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from ctrl_helpers import NS, deployment, events_for, eventually, pod, set_pod_status

from gpufleet.client.api import Client
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.controllers import hpa_algorithm as algo
from gpufleet.controllers.hpa import HorizontalPodAutoscalerController, MetricsError, pod_info
from gpufleet.utils.clock import FakeClock, rfc3339


class FakeMetrics:
    def __init__(self) -> None:
        self.pods_values: dict[str, float] = {}
        self.cpu_millis: dict[str, int] = {}
        self.fail: str | None = None

    async def resource(self, namespace: str, selector: str, resource: str) -> dict[str, algo.Sample]:
        if self.fail:
            raise MetricsError(self.fail)
        return {n: algo.Sample(v, 0.0, 0.0) for n, v in self.cpu_millis.items()}

    async def pods(self, namespace: str, pods: Any, metric: str) -> dict[str, algo.Sample]:
        if self.fail:
            raise MetricsError(self.fail)
        return {n: algo.Sample(round(v * 1000)) for n, v in self.pods_values.items()}


class World:
    def __init__(self, client: Client, clock: FakeClock, metrics: FakeMetrics, ctrl: HorizontalPodAutoscalerController):
        self.client, self.clock, self.metrics, self.ctrl = client, clock, metrics, ctrl

    async def pods(self, n: int, cpu: str | None = None) -> None:
        for i in range(n):
            body = pod(f"web-{i}", {"app": "web"})
            if cpu:
                body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
            await self.client.create(body, NS, raw=True)
            current = await set_pod_status(self.client, f"web-{i}", ready=True, now=self.clock.now() - 600)
            current["status"]["startTime"] = rfc3339(self.clock.now() - 600)
            await self.client.update_status(current, raw=True)
        await eventually(lambda: sum(1 for p in self.ctrl.pod_informer.list() if pod_info(p).ready) == n)

    async def target(self, replicas: int) -> None:
        """The Deployment with ``replicas`` in spec and status, as its controller would leave it."""
        try:
            dep = await self.client.get("deployments", "web", NS, raw=True)
        except Exception:
            dep = await self.client.create(deployment("web", replicas), NS, raw=True)
        dep["spec"]["replicas"] = replicas
        dep = await self.client.update(dep, raw=True)
        dep["status"] = {"replicas": replicas, "readyReplicas": replicas, "observedGeneration":
                         dep["metadata"]["generation"]}
        await self.client.update_status(dep, raw=True)

    async def hpa(self, **spec: Any) -> None:
        body = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "web", "namespace": NS},
                "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                         "minReplicas": 1, "maxReplicas": 10,
                         "metrics": [{"type": "Pods", "pods": {"metric": {"name": "requests_per_second"},
                                                               "target": {"type": "AverageValue",
                                                                          "averageValue": "5"}}}],
                         **spec}}
        await self.client.create(body, NS, raw=True)
        await eventually(lambda: self.ctrl.hpa_informer.get(f"{NS}/web"))

    async def sync(self) -> dict[str, Any]:
        """One evaluation; returns the HPA as written."""
        before = self.ctrl.hpa_informer.get(f"{NS}/web")
        await self.ctrl.reconcile(f"{NS}/web")
        hpa = await self.client.get("horizontalpodautoscalers", "web", NS, raw=True)
        # The next sync must see this status in the cache, as a real one would.
        await eventually(lambda: self.ctrl.hpa_informer.get(f"{NS}/web").metadata.resource_version
                         == hpa["metadata"]["resourceVersion"] or before is None)
        return hpa

    async def spec_replicas(self) -> int:
        return (await self.client.get("deployments", "web", NS, raw=True))["spec"]["replicas"]


@pytest.fixture
async def world(client: Client) -> AsyncIterator[World]:
    clock = FakeClock(start=2_000_000_000.0)
    metrics = FakeMetrics()
    informers = SharedInformerFactory(client)
    ctrl = HorizontalPodAutoscalerController(client, informers, clock=clock, metrics=metrics, sync_period=1.0)
    await informers.start()
    await informers.wait_for_sync(10)
    yield World(client, clock, metrics, ctrl)
    await ctrl.recorder.flush()
    await informers.stop()


def cond(hpa: dict[str, Any], type_: str) -> tuple[str, str]:
    c = next(c for c in hpa["status"]["conditions"] if c["type"] == type_)
    return c["status"], c["reason"]


async def test_scales_up_on_a_pods_metric_with_status_and_event(world: World) -> None:
    await world.target(2)
    await world.pods(2)
    await world.hpa()
    world.metrics.pods_values = {"web-0": 12, "web-1": 8}  # average 10 against a target of 5
    hpa = await world.sync()
    assert await world.spec_replicas() == 4
    st = hpa["status"]
    assert st["currentReplicas"] == 2 and st["desiredReplicas"] == 4
    assert st["currentMetrics"] == [{"type": "Pods", "pods": {"metric": {"name": "requests_per_second"},
                                                              "current": {"averageValue": "10"}}}]
    assert cond(hpa, "AbleToScale") == ("True", "SucceededRescale")
    assert cond(hpa, "ScalingActive") == ("True", "ValidMetricFound")
    assert cond(hpa, "ScalingLimited") == ("False", "DesiredWithinRange")
    assert "lastScaleTime" in st
    await world.ctrl.recorder.flush()
    events = await events_for(world.client, "web", "SuccessfulRescale")
    assert [e["message"] for e in events] == ["New size: 4; reason: pods metric requests_per_second above target"]


async def test_max_replicas_and_scale_up_policy_limit(world: World) -> None:
    await world.target(2)
    await world.pods(2)
    await world.hpa(maxReplicas=5)
    world.metrics.pods_values = {"web-0": 100, "web-1": 100}
    hpa = await world.sync()
    assert await world.spec_replicas() == 5
    assert cond(hpa, "ScalingLimited") == ("True", "TooManyReplicas")


async def test_scale_down_waits_for_the_stabilization_window(world: World) -> None:
    await world.target(2)
    await world.pods(2)
    await world.hpa(behavior={"scaleDown": {"stabilizationWindowSeconds": 60}})
    world.metrics.pods_values = {"web-0": 5, "web-1": 5}
    await world.sync()
    assert await world.spec_replicas() == 2
    world.metrics.pods_values = {"web-0": 1, "web-1": 1}
    world.clock.advance(30)
    hpa = await world.sync()
    assert await world.spec_replicas() == 2  # the recommendation of 30 s ago (2) still holds
    assert cond(hpa, "AbleToScale") == ("True", "ScaleDownStabilized")
    world.clock.advance(31)
    await world.sync()
    assert await world.spec_replicas() == 1
    await world.ctrl.recorder.flush()
    events = await events_for(world.client, "web", "SuccessfulRescale")
    assert any(e["message"] == "New size: 1; reason: All metrics below target" for e in events)


async def test_cpu_utilization_from_requests(world: World) -> None:
    await world.target(2)
    await world.pods(2, cpu="500m")
    await world.hpa(metrics=[{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}])
    world.metrics.cpu_millis = {"web-0": 500, "web-1": 500}  # 100% of requests, target 50%
    hpa = await world.sync()
    assert await world.spec_replicas() == 4
    assert hpa["status"]["currentMetrics"][0]["resource"]["current"] == {"averageUtilization": 100,
                                                                         "averageValue": "500m"}


async def test_failed_metrics_do_not_scale(world: World) -> None:
    await world.target(2)
    await world.pods(2)
    await world.hpa()
    world.metrics.fail = "the gateway is unreachable"
    hpa = await world.sync()
    assert await world.spec_replicas() == 2
    assert cond(hpa, "ScalingActive") == ("False", "FailedGetPodsMetric")
    await world.ctrl.recorder.flush()
    assert await events_for(world.client, "web", "FailedGetPodsMetric")


async def test_target_at_zero_with_min_above_zero_is_left_alone(world: World) -> None:
    await world.target(0)
    await world.hpa()
    hpa = await world.sync()
    assert await world.spec_replicas() == 0
    assert cond(hpa, "ScalingActive") == ("False", "ScalingDisabled")


async def test_below_min_replicas_is_raised(world: World) -> None:
    await world.target(1)
    await world.pods(1)
    await world.hpa(minReplicas=3)
    await world.sync()
    assert await world.spec_replicas() == 3


async def test_scale_to_zero_when_min_is_zero(world: World) -> None:
    await world.target(2)
    await world.pods(2)
    await world.hpa(minReplicas=0, behavior={"scaleDown": {"stabilizationWindowSeconds": 0}})
    world.metrics.pods_values = {"web-0": 0, "web-1": 0}
    await world.sync()
    assert await world.spec_replicas() == 0
    # Its pods gone, there is nothing to measure: the HPA waits for the gateway.
    await world.target(0)
    world.metrics.fail = "no pods"
    world.clock.advance(5)
    hpa = await world.sync()
    assert cond(hpa, "ScalingActive") == ("False", "ScaledToZero")
    assert await world.spec_replicas() == 0
    await world.ctrl.recorder.flush()
    assert not await events_for(world.client, "web", "FailedGetPodsMetric")


async def test_the_rate_watch_wakes_the_hpa_when_its_metric_crosses_the_target(world: World) -> None:
    """Between syncs the gateway's metric is looked at: a rise above the target queues the HPA
    at once (not at its next sync), once per crossing; the sync then decides as usual."""
    world.ctrl.rate_watch = 1.0  # the watch's loop is not started here: each look is explicit
    await world.target(2)
    await world.pods(2)
    await world.hpa()
    world.metrics.pods_values = {"web-0": 4, "web-1": 5}  # average 4.5 against a target of 5
    await world.sync()
    assert await world.spec_replicas() == 2
    while len(world.ctrl.queue):  # what the informer queued (the HPA's creation): taken
        world.ctrl.queue.done(await world.ctrl.queue.get())
    assert await world.ctrl.check_rates() == [] and len(world.ctrl.queue) == 0
    world.metrics.pods_values = {"web-0": 5.4, "web-1": 5.4}  # above, but within the tolerance
    assert await world.ctrl.check_rates() == []
    world.metrics.pods_values = {"web-0": 12, "web-1": 10}
    assert await world.ctrl.check_rates() == [f"{NS}/web"] and len(world.ctrl.queue) == 1
    assert await world.ctrl.check_rates() == []  # still above: no second wake-up
    await world.sync()
    assert await world.spec_replicas() == 5  # ceil(2 * 11 / 5), as a periodic sync would
    # Down and up again: woken again; a pod the HPA did not count (another workload's) is not read.
    world.metrics.pods_values = {"web-0": 2, "web-1": 2, "other-0": 90}
    assert await world.ctrl.check_rates() == []
    world.metrics.pods_values = {"web-0": 9, "web-1": 9}
    assert await world.ctrl.check_rates() == [f"{NS}/web"]
