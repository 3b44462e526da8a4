"""HorizontalPodAutoscaler (autoscaling/v2): sets the replicas of a workload's /scale from
its pods' metrics, every ``sync_period`` seconds per HPA (Kubernetes: 15 s, the
--horizontal-pod-autoscaler-sync-period flag).

The arithmetic is ``hpa_algorithm`` (Kubernetes' replica calculator and behavior), the
decisions ``hpa_decide`` (the observed scale, pods and samples in; the rescale, conditions,
Events and status out). This module reads what they need and applies them, as horizontal.go
does:

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

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from gpufleet.api.k8s import HorizontalPodAutoscaler, Pod
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import ApiError, Conflict, NotFound, TransportError
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.controllers import hpa_algorithm as algo
from gpufleet.controllers._common import (
    find_condition,
    is_being_deleted,
    now_text,
    pod_condition,
    status_dict,
    timestamp,
)
from gpufleet.controllers.actions import apply
from gpufleet.controllers.base import QueueController
from gpufleet.controllers.hpa_decide import (
    HpaObserved,
    MetricsError,
    _milli,
    decide_hpa,
    finish_hpa,
    needs_metrics,
    scale_replicas,
    selector_of,
)
from gpufleet.utils.clock import REAL_CLOCK, Clock, parse_rfc3339
from gpufleet.utils.tasks import cancel_and_wait

log = logging.getLogger(__name__)

GPU_METRICS_ANNOTATION = "gpufleet.io/gpu-metrics"
GATEWAY_METRICS = ("requests_per_second", "concurrency")
GPU_UTILIZATION = "gpu_utilization"


class MetricsSource(Protocol):
    async def resource(self, namespace: str, selector: str, resource: str) -> dict[str, algo.Sample]:
        """pod name -> usage of ``resource`` in milli-units (cpu millicores, memory bytes * 1000)."""

    async def pods(self, namespace: str, pods: Sequence[Any], metric: str) -> dict[str, algo.Sample]:
        """pod name -> the named per-pod metric in milli-units."""


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


class HorizontalPodAutoscalerController(QueueController):
    name = "horizontalpodautoscaler"
    component = "horizontal-pod-autoscaler"

    def __init__(
        self, client: Client, informers: SharedInformerFactory, *,
        sync_period: float = 15.0,
        metrics: MetricsSource | None = None,
        gateway_url: str | None = None,
        rate_watch: float = 0.0,
        cpu_initialization_period: float = algo.CPU_INITIALIZATION_PERIOD,
        initial_readiness_delay: float = algo.INITIAL_READINESS_DELAY,
        **kwargs: Any,
    ) -> None:
        super().__init__(client, informers, **kwargs)
        self.sync_period = sync_period
        self._own_metrics = metrics is None
        self.metrics: MetricsSource = metrics or ClusterMetrics(client, gateway_url=gateway_url, clock=self.clock)
        # When a pod's cpu samples are trusted (Kubernetes' --horizontal-pod-autoscaler-cpu-
        # initialization-period and -initial-readiness-delay).
        self._readiness = {"cpu_initialization_period": cpu_initialization_period,
                           "initial_readiness_delay": initial_readiness_delay}
        self.history: dict[str, algo.History] = {}
        # The rate watch: between syncs, the gateway's request metrics are looked at every
        # ``rate_watch`` seconds; an HPA whose metric crosses above its target is queued at
        # once. What each HPA's last sync saw (namespace, metric, target in milli-units, its
        # pods), and whether the metric was above target at the last look.
        self.rate_watch = rate_watch
        self._watched: dict[str, tuple[str, str, int, frozenset[str]]] = {}
        self._above: dict[str, bool] = {}
        self._watch_task: asyncio.Task | None = None
        self.hpa_informer = informers.informer(HorizontalPodAutoscaler)
        self.pod_informer = informers.informer(Pod)
        self.hpa_informer.add_event_handler(self._hpa_added, self._hpa_updated, self._hpa_deleted)

    async def start(self) -> None:
        await super().start()
        if self.rate_watch > 0:
            self._watch_task = asyncio.create_task(self._watch_rates(), name=f"{self.name}:rate-watch")

    async def stop(self) -> None:
        if self._watch_task is not None:
            await cancel_and_wait(self._watch_task)
            self._watch_task = None
        await super().stop()
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
        key = objects.object_key(hpa)
        self.history.pop(key, None)
        self._watched.pop(key, None)
        self._above.pop(key, None)

    # -- the rate watch ----------------------------------------------------------------

    async def _watch_rates(self) -> None:
        while True:
            await self.clock.sleep(self.rate_watch)
            try:
                await self.check_rates()
            except Exception:  # the next look tries again; the periodic sync goes on regardless
                log.exception("hpa: looking at the gateway's request metrics failed")

    async def check_rates(self) -> list[str]:
        """One look at the gateway's request metrics: the HPAs whose metric went above its
        target (beyond the tolerance) since the last look are queued now, and returned. Only
        the crossing counts, so a load that stays high is left to the periodic syncs and the
        scale-up policies; nothing else changes (the sync decides, with Kubernetes' rules)."""
        fetched: dict[tuple[str, str], dict[str, algo.Sample] | None] = {}
        woken = []
        for key, (ns, metric, target, names) in list(self._watched.items()):
            if (ns, metric) not in fetched:
                try:
                    fetched[(ns, metric)] = await self.metrics.pods(ns, [], metric)
                except MetricsError:
                    fetched[(ns, metric)] = None
            samples = fetched[(ns, metric)]
            above = _above_target(samples, names, target)
            if above is None:
                continue
            was = self._above.get(key, False)
            self._above[key] = above
            if above and not was and key in self._watched:
                self.queue.add(key)
                woken.append(key)
        return woken

    def _remember(self, key: str, hpa: Any, ns: str, pods: Sequence[Any]) -> int | None:
        """What the rate watch looks at for this HPA: its first gateway metric with an
        AverageValue target, and the pods it averages over; the metric's index."""
        for i, m in enumerate(hpa.spec.metrics or []):
            target = m.pods.target if m.type == "Pods" and m.pods is not None else None
            if target is not None and m.pods.metric.name in GATEWAY_METRICS and target.type == "AverageValue" \
                    and target.average_value is not None:
                names = frozenset(objects.name_of(p) for p in pods)
                self._watched[key] = (ns, m.pods.metric.name, _milli(str(target.average_value)), names)
                return i
        self._watched.pop(key, None)
        return None

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
        obs = await self._observe(hpa)
        decision = decide_hpa(obs, self.history.get(key) or algo.History(), self._readiness)
        scale_error = None
        if decision.scale_to is not None:
            ref = hpa.spec.scale_target_ref
            try:
                await self.client.set_scale(_target_kind(ref), ref.name, decision.scale_to, objects.namespace_of(hpa))
            except ApiError as exc:
                scale_error = str(exc)
            else:
                log.info("hpa %s: %s %s/%s %d -> %d (%s)", key, ref.kind, objects.namespace_of(hpa), ref.name,
                         decision.current, decision.scale_to, decision.rescale_reason)
        actions = finish_hpa(obs, decision, scale_error)
        self.history[key] = decision.history
        await apply(self.client, actions, owner=hpa, recorder=self.recorder)

    async def _observe(self, hpa: Any) -> HpaObserved:
        """The target's scale, and when the metrics decide, its pods and their samples."""
        ns = objects.namespace_of(hpa)
        ref = hpa.spec.scale_target_ref
        now = self.clock.now()
        try:
            scale = await self.client.get_scale(_target_kind(ref), ref.name, ns, raw=True)
        except (ApiError, LookupError) as exc:
            return HpaObserved(hpa, None, now, now_text(self.clock), scale_error=str(exc))
        obs = HpaObserved(hpa, scale, now, now_text(self.clock))
        selector, _ = selector_of(scale)
        if not needs_metrics(hpa, scale) or selector is None:
            return obs
        selector_text = scale_replicas(scale)[2]
        pods = [p for p in self.pod_informer.by_index(NAMESPACE_INDEX, ns) if selector.matches(objects.labels_of(p))]
        obs.infos = [pod_info(p) for p in pods]
        key = objects.object_key(hpa)
        watched = self._remember(key, hpa, ns, pods) if self.rate_watch > 0 else None
        samples: list[dict[str, algo.Sample] | str] = []
        for m in hpa.spec.metrics or []:
            try:
                samples.append(await self._samples(m, ns, selector_text, pods))
            except MetricsError as exc:
                samples.append(str(exc))
        obs.samples = samples
        if watched is not None and isinstance(samples[watched], dict):
            # Where this sync found the metric: the watch wakes on the next crossing from here.
            above = _above_target(samples[watched], self._watched[key][3], self._watched[key][2])
            self._above[key] = bool(above)
        return obs

    async def _samples(self, m: Any, ns: str, selector_text: str, pods: Sequence[Any]) -> dict[str, algo.Sample]:
        if m.type == "Resource" and m.resource is not None:
            return await self.metrics.resource(ns, selector_text, m.resource.name)
        if m.type == "Pods" and m.pods is not None:
            return await self.metrics.pods(ns, pods, m.pods.metric.name)
        raise MetricsError(f"metric source type {m.type!r} is not supported by this controller "
                           f"(use Resource or Pods)")


def _above_target(samples: Mapping[str, algo.Sample] | None, names: frozenset[str], target: int) -> bool | None:
    """Whether the average over ``names`` is above ``target`` beyond the tolerance; None
    without samples of them."""
    values = [s.value for name, s in (samples or {}).items() if name in names]
    if not values:
        return None
    return sum(values) / len(values) > target * (1 + algo.DEFAULT_TOLERANCE)


def _target_kind(ref: Any) -> str:
    return f"{ref.api_version}/{ref.kind}" if ref.api_version else ref.kind


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

