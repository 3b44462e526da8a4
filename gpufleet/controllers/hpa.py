"""HorizontalPodAutoscaler (autoscaling/v2): sets the replicas of a workload's /scale from
its pods' metrics, every ``sync_period`` seconds per HPA (Kubernetes: 15 s, the
--horizontal-pod-autoscaler-sync-period flag).

The arithmetic is ``hpa_algorithm`` (Kubernetes' replica calculator and behavior). This
module is the I/O around it, as horizontal.go does:

- the target's Scale gives the current replicas and the pods' selector; the pods come
  from an informer;
- metrics (``MetricsSource``):
  * Resource cpu / memory: metrics.k8s.io PodMetrics through the API (the node agents'
    summaries); utilization is relative to the pods' requests;
  * Pods ``gpu_utilization``: the per-pod GPU utilization (percent, NVML through the agent)
    that PodMetrics carries in its ``gpufleet.io/gpu-metrics`` annotation;
  * Pods ``requests_per_second`` and ``concurrency``: the gateway's custom.metrics.k8s.io
    endpoint (over HTTP, so the gateway may run in another process);
  * any other Pods metric: what the workload exposes on its own Prometheus endpoint,
    scraped by the node agent, read through the API from ``nodes/{node}/proxy/stats/workload``
    (the API server reaches the agent with its credentials; agents answer nobody else);
- each metric proposes a replica count, the largest wins; if some metric failed and the
  others propose a scale down, nothing changes;
- outside [minReplicas, maxReplicas] the count is brought back first; a target at zero
  replicas with minReplicas > 0 is left alone (scaling disabled), as Kubernetes does;
- conditions AbleToScale, ScalingActive, ScalingLimited and Events (SuccessfulRescale with
  the reason, FailedGetScale, FailedGet*Metric, FailedRescale) say what happened.

Deliberate differences: ``minReplicas: 0`` is accepted without a feature gate (Kubernetes'
HPAScaleToZero). At zero replicas there are no pods to measure, so the HPA waits
(ScalingActive False, ScaledToZero); the gateway brings the first replica when a request
arrives. A recommendation the target's spec already has is not written again (no second
SuccessfulRescale while the target's status catches up).

Not done: Object, External and ContainerResource metric sources (reported as a failed
metric, FailedGet<type>Metric).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from gpufleet.api.k8s import HorizontalPodAutoscaler, Pod
from gpufleet.api.quantity import parse_quantity
from gpufleet.api.selectors import SelectorError, parse_label_selector
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Controller, Requeue
from gpufleet.client.errors import ApiError, Conflict, NotFound, TransportError
from gpufleet.client.events import NORMAL, WARNING, EventRecorder
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.client.workqueue import WorkQueue
from gpufleet.controllers import hpa_algorithm as algo
from gpufleet.controllers._common import (
    find_condition,
    is_being_deleted,
    now_text,
    pod_condition,
    set_condition,
    status_dict,
    timestamp,
    write_status,
)
from gpufleet.utils.clock import REAL_CLOCK, Clock, parse_rfc3339

log = logging.getLogger(__name__)

GPU_METRICS_ANNOTATION = "gpufleet.io/gpu-metrics"
GATEWAY_METRICS = ("requests_per_second", "concurrency")
GPU_UTILIZATION = "gpu_utilization"


class MetricsError(Exception):
    """A metric could not be read."""


class MetricsSource(Protocol):
    async def resource(self, namespace: str, selector: str, resource: str) -> dict[str, algo.Sample]:
        """pod name -> usage of ``resource`` in milli-units (cpu millicores, memory bytes * 1000)."""

    async def pods(self, namespace: str, pods: Sequence[Any], metric: str) -> dict[str, algo.Sample]:
        """pod name -> the named per-pod metric in milli-units."""


def _milli(q: Any) -> int:
    return int(parse_quantity(q) * 1000)


class ClusterMetrics:
    """Reads metrics through the API (metrics.k8s.io and the nodes' proxy) and from the gateway."""

    def __init__(self, client: Client, *, gateway_url: str | None = None, clock: Clock = REAL_CLOCK,
                 timeout: float = 3.0) -> None:
        self.client = client
        self.gateway_url = gateway_url.rstrip("/") if gateway_url else None
        self.clock = clock
        self._http = httpx.AsyncClient(timeout=timeout, trust_env=False)

    async def close(self) -> None:
        await self._http.aclose()

    async def _pod_metrics(self, namespace: str, selector: str | None) -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else None
        try:
            resp = await self.client.raw_request(
                "GET", f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods", params=params)
            return json.loads(resp.body).get("items") or []
        except (ApiError, ValueError) as exc:
            raise MetricsError(f"unable to get metrics from resource metrics API: {exc}") from exc

    async def resource(self, namespace: str, selector: str, resource: str) -> dict[str, algo.Sample]:
        out = {}
        for item in await self._pod_metrics(namespace, selector):
            name = item["metadata"]["name"]
            total = 0
            for c in item.get("containers") or []:
                usage = (c.get("usage") or {}).get(resource)
                if usage is None:
                    break
                total += _milli(usage)
            else:
                ts = item.get("timestamp")
                window = _window(item.get("window"))
                out[name] = algo.Sample(total, parse_rfc3339(ts) if ts else self.clock.now(), window)
        return out

    async def pods(self, namespace: str, pods: Sequence[Any], metric: str) -> dict[str, algo.Sample]:
        if metric in GATEWAY_METRICS:
            return await self._gateway(namespace, metric)
        if metric == GPU_UTILIZATION:
            return await self._gpu(namespace, pods)
        return await self._workload(namespace, pods, metric)

    async def _gateway(self, namespace: str, metric: str) -> dict[str, algo.Sample]:
        if self.gateway_url is None:
            raise MetricsError(f"{metric} comes from the gateway and none is configured")
        url = f"{self.gateway_url}/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/{metric}"
        try:
            resp = await self._http.get(url)
            resp.raise_for_status()
            items = resp.json().get("items") or []
        except (httpx.HTTPError, ValueError) as exc:
            raise MetricsError(f"unable to get {metric} from the gateway: {exc}") from exc
        out = {}
        for item in items:
            ts = item.get("timestamp")
            out[item["describedObject"]["name"]] = algo.Sample(
                _milli(item["value"]), parse_rfc3339(ts) if ts else self.clock.now(),
                float(item.get("windowSeconds") or 0))
        return out

    async def _gpu(self, namespace: str, pods: Sequence[Any]) -> dict[str, algo.Sample]:
        names = {objects.name_of(p) for p in pods}
        out = {}
        for item in await self._pod_metrics(namespace, None):
            name = item["metadata"]["name"]
            if name not in names:
                continue
            raw = (item["metadata"].get("annotations") or {}).get(GPU_METRICS_ANNOTATION)
            if not raw:
                continue
            try:
                gpus = json.loads(raw)
            except ValueError:
                continue
            if gpus:
                average = sum(float(g.get("utilization") or 0) for g in gpus) / len(gpus)
                out[name] = algo.Sample(round(average * 1000), self.clock.now(), 10.0)
        return out

    async def _workload(self, namespace: str, pods: Sequence[Any], metric: str) -> dict[str, algo.Sample]:
        """A metric the workload exposes itself: each pod's agent scraped it; read through the
        API server's node proxy (``/api/v1/nodes/{node}/proxy/stats/workload``)."""
        nodes = {objects.field(p.spec, "node_name") for p in pods if p.spec is not None and p.spec.node_name}
        wanted = {objects.name_of(p) for p in pods}
        out: dict[str, algo.Sample] = {}
        for node_name in sorted(n for n in nodes if n):
            path = f"/api/v1/nodes/{quote(node_name, safe='')}/proxy/stats/workload"
            try:
                resp = await self.client.raw_request("GET", path, params={"namespace": namespace})
                data = json.loads(resp.body)
            except NotFound:
                continue  # the node is gone; its pods will be too
            except ApiError as exc:
                if exc.code == 503:
                    continue  # the node publishes no agent endpoint (yet)
                raise MetricsError(f"unable to get {metric} from node {node_name}: {exc}") from exc
            except (TransportError, ValueError) as exc:
                raise MetricsError(f"unable to get {metric} from node {node_name}: {exc}") from exc
            if not isinstance(data, dict):
                raise MetricsError(f"unable to get {metric} from node {node_name}: not a JSON object")
            for entry in data.get("pods") or []:
                if entry.get("name") not in wanted:
                    continue
                value = (entry.get("metrics") or {}).get(metric)
                if value is None:
                    continue
                ts = entry.get("time")
                out[entry["name"]] = algo.Sample(round(float(value) * 1000),
                                                 parse_rfc3339(ts) if ts else self.clock.now(), 0.0)
        return out


def _window(text: Any) -> float:
    if isinstance(text, str) and text.endswith("s"):
        try:
            return float(text[:-1])
        except ValueError:
            return 0.0
    return 0.0


# --- pods as the calculator sees them ----------------------------------------------------


def _requests(pod: Any) -> dict[str, int]:
    totals: dict[str, int] = {}
    missing: set[str] = set()
    containers = (pod.spec.containers if pod.spec is not None else None) or []
    for c in containers:
        req = (c.resources.requests if c.resources is not None else None) or {}
        for res in ("cpu", "memory"):
            if res in req:
                totals[res] = totals.get(res, 0) + _milli(req[res])
            else:
                missing.add(res)
    return {k: v for k, v in totals.items() if k not in missing}


def pod_info(pod: Any) -> algo.PodInfo:
    cond = pod_condition(pod, "Ready")
    ready = None if cond is None else cond.status == "True"
    status = pod.status
    return algo.PodInfo(
        name=objects.name_of(pod),
        phase=(status.phase if status is not None else None) or "Pending",
        ready=ready,
        ready_transition=timestamp(cond.last_transition_time) if cond is not None else None,
        start_time=timestamp(status.start_time) if status is not None else None,
        deleting=is_being_deleted(pod),
        requests=_requests(pod),
    )


def _rules(r: Any, default: algo.Rules) -> algo.Rules:
    if r is None:
        return default
    policies = tuple(algo.Policy(p.type, p.value, p.period_seconds) for p in (r.policies or [])) \
        if r.policies is not None else default.policies
    tolerance = float(parse_quantity(r.tolerance)) if r.tolerance is not None else default.tolerance
    return algo.Rules(
        r.stabilization_window_seconds if r.stabilization_window_seconds is not None
        else default.stabilization_window_seconds,
        r.select_policy or default.select_policy, policies, tolerance)


def _quantity_text(milli: int) -> str:
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"


@dataclass
class _Proposal:
    replicas: int
    name: str
    status: dict[str, Any]


class HorizontalPodAutoscalerController:
    name = "horizontalpodautoscaler"

    def __init__(
        self,
        client: Client,
        informers: SharedInformerFactory,
        *,
        clock: Clock = REAL_CLOCK,
        recorder: EventRecorder | None = None,
        workers: int = 2,
        sync_period: float = 15.0,
        metrics: MetricsSource | None = None,
        gateway_url: str | None = None,
        cpu_initialization_period: float = algo.CPU_INITIALIZATION_PERIOD,
        initial_readiness_delay: float = algo.INITIAL_READINESS_DELAY,
    ) -> None:
        self.client = client
        self.clock = clock
        self.recorder = recorder or EventRecorder(client, "horizontal-pod-autoscaler", clock=clock)
        self.sync_period = sync_period
        self._own_metrics = metrics is None
        self.metrics: MetricsSource = metrics or ClusterMetrics(client, gateway_url=gateway_url, clock=clock)
        # When a pod's cpu samples are trusted (Kubernetes' --horizontal-pod-autoscaler-cpu-
        # initialization-period and -initial-readiness-delay).
        self._readiness = {"cpu_initialization_period": cpu_initialization_period,
                           "initial_readiness_delay": initial_readiness_delay}
        self.history: dict[str, algo.History] = {}
        self.hpa_informer = informers.informer(HorizontalPodAutoscaler)
        self.pod_informer = informers.informer(Pod)
        self.queue = WorkQueue(self.name, clock=clock)
        self.controller = Controller(self.name, self.reconcile, self.queue, workers=workers)
        self.hpa_informer.add_event_handler(self._hpa_added, self._hpa_updated, self._hpa_deleted)

    async def start(self) -> None:
        await self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()
        if self._own_metrics and isinstance(self.metrics, ClusterMetrics):
            await self.metrics.close()

    def _hpa_added(self, hpa: Any) -> None:
        self.queue.add(objects.object_key(hpa))

    def _hpa_updated(self, old: Any, new: Any) -> None:
        # Our own status writes come back here; only a spec change needs a sync before the
        # next period.
        if objects.meta(old, "generation") != objects.meta(new, "generation"):
            self.queue.add(objects.object_key(new))

    def _hpa_deleted(self, hpa: Any) -> None:
        self.history.pop(objects.object_key(hpa), None)

    # -- reconcile ---------------------------------------------------------------------

    async def reconcile(self, key: str) -> Requeue | None:
        hpa = self.hpa_informer.get(key)
        if hpa is None:
            self.history.pop(key, None)
            return None
        try:
            await self._sync(key, hpa)
        except Conflict:
            return Requeue(after=0.1)
        except ApiError as exc:
            log.info("hpa %s: %s", key, exc)
        return Requeue(after=self.sync_period)

    async def _sync(self, key: str, hpa: Any) -> None:
        ns = objects.namespace_of(hpa)
        spec = hpa.spec
        ref = spec.scale_target_ref
        kind = f"{ref.api_version}/{ref.kind}" if ref.api_version else ref.kind
        now = self.clock.now()
        now_str = now_text(self.clock)
        status = status_dict(hpa)
        conditions = [dict(c) for c in status.get("conditions") or []]
        min_replicas = spec.min_replicas if spec.min_replicas is not None else 1
        behavior = spec.behavior
        up = _rules(behavior.scale_up if behavior is not None else None, algo.DEFAULT_SCALE_UP)
        down = _rules(behavior.scale_down if behavior is not None else None, algo.DEFAULT_SCALE_DOWN)
        history = self.history.setdefault(key, algo.History())

        try:
            scale = await self.client.get_scale(kind, ref.name, ns, raw=True)
        except (ApiError, LookupError) as exc:
            msg = f"the HPA controller was unable to get the target's current scale: {exc}"
            set_condition(conditions, "AbleToScale", "False", "FailedGetScale", msg, now_str)
            await self.recorder.record(hpa, WARNING, "FailedGetScale", str(exc))
            await self._write(hpa, status, conditions, status.get("currentReplicas") or 0,
                              status.get("desiredReplicas") or 0, status.get("currentMetrics"), None)
            return
        set_condition(conditions, "AbleToScale", "True", "SucceededGetScale",
                      "the HPA controller was able to get the target's current scale", now_str)
        spec_replicas = (scale.get("spec") or {}).get("replicas") or 0
        current = (scale.get("status") or {}).get("replicas") or 0
        selector_text = (scale.get("status") or {}).get("selector") or ""

        desired = 0
        rescale_reason = ""
        metric_statuses: list[dict[str, Any]] | None = status.get("currentMetrics")
        if spec_replicas == 0 and min_replicas != 0:
            set_condition(conditions, "ScalingActive", "False", "ScalingDisabled",
                          "scaling is disabled since the replica count of the target is zero", now_str)
            await self._write(hpa, status, conditions, current, 0, metric_statuses, None)
            return
        if spec_replicas == 0 and current == 0:
            # Scaled to zero (minReplicas 0): no pod to measure. The gateway brings the first
            # replica back when a request comes (Kubernetes would need an Object or External
            # metric here).
            set_condition(conditions, "ScalingActive", "False", "ScaledToZero",
                          "the target has no replicas; a request through the gateway scales it up", now_str)
            await self._write(hpa, status, conditions, 0, 0, None, None)
            return
        if current > spec.max_replicas:
            desired, rescale_reason = spec.max_replicas, "Current number of replicas above Spec.MaxReplicas"
        elif current < min_replicas:
            desired, rescale_reason = min_replicas, "Current number of replicas below Spec.MinReplicas"
        else:
            proposal, metric_statuses, invalid, error = await self._replicas_for_metrics(
                hpa, ns, selector_text, current, spec_replicas, spec.metrics or [], conditions, now, now_str,
                up, down)
            if proposal is None:
                await self.recorder.record(hpa, WARNING, "FailedComputeMetricsReplicas",
                                           f"invalid metrics ({invalid}), first error is: {error}")
                await self._write(hpa, status, conditions, current, status.get("desiredReplicas") or current,
                                  metric_statuses, None)
                return
            desired = proposal.replicas
            if desired > current:
                rescale_reason = f"{proposal.name} above target"
            elif desired < current:
                rescale_reason = "All metrics below target"
            desired, conds = algo.normalize(history, now, current, desired, min_replicas, spec.max_replicas, up, down)
            for c in conds:
                set_condition(conditions, c.type, c.status, c.reason, c.message, now_str)

        last_scale = None
        if desired != current and desired != spec_replicas:
            try:
                await self.client.set_scale(kind, ref.name, desired, ns)
            except ApiError as exc:
                set_condition(conditions, "AbleToScale", "False", "FailedUpdateScale",
                              f"the HPA controller was unable to update the target scale: {exc}", now_str)
                await self.recorder.record(hpa, WARNING, "FailedRescale",
                                           f"New size: {desired}; reason: {rescale_reason}; error: {exc}")
                await self._write(hpa, status, conditions, current, desired, metric_statuses, None)
                return
            set_condition(conditions, "AbleToScale", "True", "SucceededRescale",
                          f"the HPA controller was able to update the target scale to {desired}", now_str)
            await self.recorder.record(hpa, NORMAL, "SuccessfulRescale",
                                       f"New size: {desired}; reason: {rescale_reason}")
            algo.record_scale(history, now, current, desired, up, down)
            last_scale = now_str
            log.info("hpa %s: %s %s/%s %d -> %d (%s)", key, ref.kind, ns, ref.name, current, desired, rescale_reason)
        await self._write(hpa, status, conditions, current, desired, metric_statuses, last_scale)

    async def _replicas_for_metrics(
        self, hpa: Any, ns: str, selector_text: str, current: int, spec_replicas: int, metrics: Sequence[Any],
        conditions: list[dict[str, Any]], now: float, now_str: str, up: algo.Rules, down: algo.Rules,
    ) -> tuple[_Proposal | None, list[dict[str, Any]], str, str]:
        """The largest proposal of the metrics; or None, the metric statuses, and what failed."""
        if not selector_text:
            set_condition(conditions, "ScalingActive", "False", "InvalidSelector",
                          "the HPA target's scale is missing a selector", now_str)
            return None, [], "invalid selector", "the target's scale has no selector"
        try:
            selector = parse_label_selector(selector_text)
        except SelectorError as exc:
            set_condition(conditions, "ScalingActive", "False", "InvalidSelector",
                          f"couldn't convert selector into a corresponding internal selector object: {exc}", now_str)
            return None, [], "invalid selector", str(exc)
        pods = [p for p in self.pod_informer.by_index(NAMESPACE_INDEX, ns) if selector.matches(objects.labels_of(p))]
        infos = [pod_info(p) for p in pods]
        tolerance = algo.Tolerance(down=down.tolerance, up=up.tolerance)
        best: _Proposal | None = None
        statuses: list[dict[str, Any]] = []
        errors: list[str] = []
        first_failure: tuple[str, str] | None = None
        for m in metrics:
            try:
                proposal = await self._one_metric(m, ns, selector_text, current, pods, infos, now, tolerance)
            except (MetricsError, algo.ReplicaCalcError) as exc:
                reason = f"FailedGet{m.type}Metric"
                errors.append(str(exc))
                first_failure = first_failure or (reason, f"the HPA was unable to compute the replica count: {exc}")
                await self.recorder.record(hpa, WARNING, reason, str(exc))
                # Kept in place (empty, as Kubernetes leaves it) so statuses line up with metrics.
                statuses.append({"type": ""})
                continue
            statuses.append(proposal.status)
            if best is None or proposal.replicas > best.replicas:
                best = proposal
        # As Kubernetes: all metrics failed, or some failed and the others say scale down
        # (below the target's spec): nothing is changed.
        if best is None or (errors and best.replicas < spec_replicas):
            assert first_failure is not None
            set_condition(conditions, "ScalingActive", "False", first_failure[0], first_failure[1], now_str)
            return None, statuses, f"{len(errors)} invalid out of {len(metrics)}", errors[0]
        set_condition(conditions, "ScalingActive", "True", "ValidMetricFound",
                      f"the HPA was able to successfully calculate a replica count from {best.name}", now_str)
        return best, statuses, "", ""

    async def _one_metric(self, m: Any, ns: str, selector_text: str, current: int, pods: Sequence[Any],
                          infos: Sequence[algo.PodInfo], now: float, tolerance: algo.Tolerance) -> _Proposal:
        if m.type == "Resource" and m.resource is not None:
            res = m.resource.name
            target = m.resource.target
            samples = await self.metrics.resource(ns, selector_text, res)
            if target.type == "Utilization" and target.average_utilization is not None:
                replicas, percent, average = algo.utilization_replicas(
                    current, target.average_utilization, res, infos, samples, now, tolerance=tolerance,
                    **self._readiness)
                st = {"type": "Resource", "resource": {"name": res, "current": {
                    "averageUtilization": percent, "averageValue": _quantity_text(average)}}}
                return _Proposal(replicas, f"{res} resource utilization (percentage of request)", st)
            replicas, average = algo.plain_metric_replicas(
                current, _milli(target.average_value), infos, samples, now, resource=res, tolerance=tolerance,
                **self._readiness)
            st = {"type": "Resource", "resource": {"name": res, "current": {"averageValue": _quantity_text(average)}}}
            return _Proposal(replicas, f"{res} resource", st)
        if m.type == "Pods" and m.pods is not None:
            name = m.pods.metric.name
            target = m.pods.target
            samples = await self.metrics.pods(ns, pods, name)
            replicas, average = algo.plain_metric_replicas(
                current, _milli(target.average_value), infos, samples, now, tolerance=tolerance)
            st = {"type": "Pods", "pods": {"metric": {"name": name},
                                           "current": {"averageValue": _quantity_text(average)}}}
            return _Proposal(replicas, f"pods metric {name}", st)
        raise MetricsError(f"metric source type {m.type!r} is not supported by this controller "
                           f"(use Resource or Pods)")

    async def _write(self, hpa: Any, status: dict[str, Any], conditions: list[dict[str, Any]], current: int,
                     desired: int, metric_statuses: Any, last_scale: str | None) -> None:
        new: dict[str, Any] = {}
        if conditions:
            order = {"AbleToScale": 0, "ScalingActive": 1, "ScalingLimited": 2}
            new["conditions"] = sorted(conditions, key=lambda c: order.get(c.get("type", ""), 9))
        if metric_statuses:
            new["currentMetrics"] = metric_statuses
        new["currentReplicas"] = current
        new["desiredReplicas"] = desired
        last = last_scale or status.get("lastScaleTime")
        if last:
            new["lastScaleTime"] = last
        new["observedGeneration"] = objects.meta(hpa, "generation") or 1
        await write_status(self.client, hpa, new)


def condition_of(hpa: Any, type_: str) -> Mapping[str, Any] | None:
    """The HPA's condition of ``type_`` (a dict), for tests and describe."""
    return find_condition(status_dict(hpa).get("conditions") or [], type_)


__all__ = [
    "ClusterMetrics",
    "HorizontalPodAutoscalerController",
    "MetricsError",
    "MetricsSource",
    "condition_of",
    "pod_info",
]

