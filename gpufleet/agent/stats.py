"""One sample of what the node is using, and its two renderings: the kubelet's
/stats/summary JSON (which metrics.k8s.io reads) and Prometheus text (with DCGM-exporter
names for GPUs, so dashboards and adapters written for them work unchanged)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpufleet.utils.clock import rfc3339


@dataclass
class ContainerSample:
    name: str
    start_time: str | None
    cpu_millis: float
    memory_bytes: int
    restart_count: int
    gpus: list[int] = field(default_factory=list)


@dataclass
class PodSample:
    name: str
    namespace: str
    uid: str
    start_time: str | None
    containers: list[ContainerSample]
    restart_count: int = 0


@dataclass
class GPUSample:
    index: int
    uuid: str
    model: str
    health: str
    group: str
    utilization_pct: float
    memory_used_mib: int
    memory_total_mib: int
    temperature_c: float | None = None
    power_w: float | None = None
    pod: str = ""  # namespace/name of the pod holding it
    container: str = ""


@dataclass
class NodeSample:
    node_name: str
    time: float
    start_time: float
    cpu_millis: float
    memory_used_bytes: int
    memory_total_bytes: int
    memory_available_bytes: int
    pods: list[PodSample] = field(default_factory=list)
    gpus: list[GPUSample] = field(default_factory=list)


def _cpu(millis: float, stamp: str) -> dict[str, Any]:
    return {"time": stamp, "usageNanoCores": int(millis * 1_000_000)}


def _memory(used: int, stamp: str, available: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"time": stamp, "workingSetBytes": used, "usageBytes": used}
    if available is not None:
        out["availableBytes"] = available
    return out


def _accelerator(g: GPUSample) -> dict[str, Any]:
    return {"make": "nvidia", "model": g.model, "id": g.uuid, "memoryTotal": g.memory_total_mib * 1024 * 1024,
            "memoryUsed": g.memory_used_mib * 1024 * 1024, "dutyCycle": int(round(g.utilization_pct))}


def summary(sample: NodeSample) -> dict[str, Any]:
    stamp = rfc3339(sample.time)
    gpu_by_index = {g.index: g for g in sample.gpus}
    pods = []
    for p in sample.pods:
        containers = []
        for c in p.containers:
            entry: dict[str, Any] = {"name": c.name, "cpu": _cpu(c.cpu_millis, stamp),
                                     "memory": _memory(c.memory_bytes, stamp)}
            if c.start_time:
                entry["startTime"] = c.start_time
            accel = [_accelerator(gpu_by_index[i]) for i in c.gpus if i in gpu_by_index]
            if accel:
                entry["accelerators"] = accel
            containers.append(entry)
        pods.append({
            "podRef": {"name": p.name, "namespace": p.namespace, "uid": p.uid},
            "startTime": p.start_time,
            "containers": containers,
            "cpu": _cpu(sum(c.cpu_millis for c in p.containers), stamp),
            "memory": _memory(sum(c.memory_bytes for c in p.containers), stamp),
        })
    gpus = [{
        "index": g.index, "uuid": g.uuid, "model": g.model, "health": g.health, "group": g.group,
        "utilizationPercent": g.utilization_pct, "memoryUsedMiB": g.memory_used_mib,
        "memoryTotalMiB": g.memory_total_mib, "temperatureC": g.temperature_c, "powerW": g.power_w,
        **({"pod": g.pod} if g.pod else {}),
    } for g in sample.gpus]
    return {
        "node": {
            "nodeName": sample.node_name,
            "startTime": rfc3339(sample.start_time),
            "cpu": _cpu(sample.cpu_millis, stamp),
            "memory": _memory(sample.memory_used_bytes, stamp, sample.memory_available_bytes),
            "accelerators": [_accelerator(g) for g in sample.gpus],
            "gpus": gpus,
        },
        "pods": pods,
    }


class _SampleCollector(Collector):
    def __init__(self, sample: NodeSample) -> None:
        self.sample = sample

    def collect(self):
        s = self.sample
        node = GaugeMetricFamily("gpufleet_node_cpu_usage_cores", "CPU in use on the node, in cores.",
                                 labels=["node"])
        node.add_metric([s.node_name], s.cpu_millis / 1000)
        yield node
        mem = GaugeMetricFamily("gpufleet_node_memory_working_set_bytes", "Memory in use on the node.",
                                labels=["node"])
        mem.add_metric([s.node_name], s.memory_used_bytes)
        yield mem
        total = GaugeMetricFamily("gpufleet_node_memory_total_bytes", "Memory of the node.", labels=["node"])
        total.add_metric([s.node_name], s.memory_total_bytes)
        yield total

        labels = ["namespace", "pod", "container"]
        ccpu = GaugeMetricFamily("gpufleet_container_cpu_usage_cores", "CPU a container uses, in cores.",
                                 labels=labels)
        cmem = GaugeMetricFamily("container_memory_working_set_bytes", "Memory a container uses.", labels=labels)
        restarts = GaugeMetricFamily("kube_pod_container_status_restarts_total",
                                     "How many times a container was restarted.", labels=labels)
        pcpu = GaugeMetricFamily("gpufleet_pod_cpu_usage_cores", "CPU a pod uses, in cores.",
                                 labels=["namespace", "pod"])
        pmem = GaugeMetricFamily("pod_memory_working_set_bytes", "Memory a pod uses.", labels=["namespace", "pod"])
        for p in s.pods:
            for c in p.containers:
                ccpu.add_metric([p.namespace, p.name, c.name], c.cpu_millis / 1000)
                cmem.add_metric([p.namespace, p.name, c.name], c.memory_bytes)
                restarts.add_metric([p.namespace, p.name, c.name], c.restart_count)
            pcpu.add_metric([p.namespace, p.name], sum(c.cpu_millis for c in p.containers) / 1000)
            pmem.add_metric([p.namespace, p.name], sum(c.memory_bytes for c in p.containers))
        yield from (ccpu, cmem, restarts, pcpu, pmem)

        glabels = ["gpu", "UUID", "modelName", "Hostname", "namespace", "pod", "container"]
        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=glabels)
        used = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=glabels)
        free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=glabels)
        temp = GaugeMetricFamily("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", labels=glabels)
        power = GaugeMetricFamily("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", labels=glabels)
        healthy = GaugeMetricFamily("gpufleet_gpu_healthy", "1 when the GPU is healthy.", labels=glabels)
        for g in s.gpus:
            ns, _, pod = g.pod.partition("/")
            values = [str(g.index), g.uuid, g.model, s.node_name, ns, pod, g.container]
            util.add_metric(values, g.utilization_pct)
            used.add_metric(values, g.memory_used_mib)
            free.add_metric(values, max(g.memory_total_mib - g.memory_used_mib, 0))
            if g.temperature_c is not None:
                temp.add_metric(values, g.temperature_c)
            if g.power_w is not None:
                power.add_metric(values, g.power_w)
            healthy.add_metric(values, 1.0 if g.health == "Healthy" else 0.0)
        yield from (util, used, free, temp, power, healthy)


def prometheus_text(sample: NodeSample, extra: Sequence[Any] = ()) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SampleCollector(sample))
    for collector in extra:
        registry.register(collector)
    return generate_latest(registry)
