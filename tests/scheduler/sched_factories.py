"""Factories for scheduler tests: Nodes and Pods as the API would hold them."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime
from typing import Any

from gpufleet.api import k8s
from gpufleet.api.gpu import (
    GPU_INDICES_ANNOTATION,
    GPU_PRODUCT_LABEL,
    GPUS_ANNOTATION,
    format_gpu_indices,
)
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo

_uids = itertools.count(1)


def gpu_inventory(
    groups: list[int],
    *,
    memory_mib: int = 81920,
    unhealthy: tuple[int, ...] = (),
    model: str = "H100-SXM-80GB",
) -> str:
    """The gpufleet.io/gpus annotation for GPUs in interconnect groups of these sizes."""
    devices = []
    index = 0
    for g, size in enumerate(groups):
        for _ in range(size):
            devices.append(
                {
                    "index": index,
                    "uuid": f"GPU-{index:04d}",
                    "model": model,
                    "memoryMiB": memory_mib,
                    "health": "Unhealthy" if index in unhealthy else "Healthy",
                    "group": f"nvlink-{g}",
                }
            )
            index += 1
    return json.dumps(devices)


def make_node(
    name: str,
    cpu: str = "8",
    memory: str = "32Gi",
    gpus: int = 8,
    *,
    pods: int | None = 110,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, Any]] | None = None,
    unschedulable: bool = False,
    gpu_groups: list[int] | None = None,
    gpu_memory_mib: int = 81920,
    unhealthy: tuple[int, ...] = (),
    product: str | None = "H100-SXM-80GB",
    annotations: dict[str, str] | None = None,
    extra: dict[str, str] | None = None,
) -> k8s.Node:
    allocatable = {"cpu": cpu, "memory": memory, **(extra or {})}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    if pods is not None:
        allocatable["pods"] = str(pods)
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if gpus and product:
        all_labels.setdefault(GPU_PRODUCT_LABEL, product)
    all_annotations = dict(annotations or {})
    if gpu_groups is not None or unhealthy:
        all_annotations[GPUS_ANNOTATION] = gpu_inventory(
            gpu_groups or [gpus], memory_mib=gpu_memory_mib, unhealthy=unhealthy
        )
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return k8s.Node.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": all_labels, "annotations": all_annotations},
            "spec": spec,
            "status": {
                "capacity": dict(allocatable),
                "allocatable": allocatable,
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


def make_pod(
    name: str,
    cpu: str | None = "1",
    memory: str | None = "1Gi",
    gpus: int = 0,
    *,
    namespace: str = "default",
    uid: str | None = None,
    priority: int | None = None,
    node_name: str | None = None,
    gpu_indices: tuple[int, ...] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    node_selector: dict[str, str] | None = None,
    affinity: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    created: float | None = None,
    phase: str | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    containers: list[dict[str, Any]] | None = None,
    overhead: dict[str, str] | None = None,
    scheduling_gates: list[str] | None = None,
    scheduler_name: str | None = None,
) -> k8s.Pod:
    requests: dict[str, str] = {}
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = memory
    resources: dict[str, Any] = {"requests": requests}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {
        "containers": containers or [{"name": "main", "image": "trainer", "resources": resources}],
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if priority is not None:
        spec["priority"] = priority
    if node_name:
        spec["nodeName"] = node_name
    if tolerations:
        spec["tolerations"] = tolerations
    if node_selector:
        spec["nodeSelector"] = node_selector
    if affinity:
        spec["affinity"] = affinity
    if overhead:
        spec["overhead"] = overhead
    if scheduling_gates:
        spec["schedulingGates"] = [{"name": g} for g in scheduling_gates]
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    all_annotations = dict(annotations or {})
    if gpu_indices is not None:
        all_annotations[GPU_INDICES_ANNOTATION] = format_gpu_indices(gpu_indices)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid if uid is not None else f"uid-{next(_uids)}",
        "labels": labels or {},
        "annotations": all_annotations,
    }
    if created is not None:
        metadata["creationTimestamp"] = datetime.fromtimestamp(created, tz=UTC).isoformat()
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    if phase:
        pod["status"] = {"phase": phase}
    return k8s.Pod.model_validate(pod)


def pod_info(name: str = "p", *args: Any, **kwargs: Any) -> PodInfo:
    return PodInfo(make_pod(name, *args, **kwargs))


def node_info(node: k8s.Node, *pods: k8s.Pod | PodInfo) -> NodeInfo:
    info = NodeInfo(node)
    for p in pods:
        info.add_pod(p if isinstance(p, PodInfo) else PodInfo(p))
    return info


def taint(key: str, value: str = "", effect: str = "NoSchedule") -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "effect": effect}
    if value:
        out["value"] = value
    return out


def toleration(key: str = "", value: str = "", effect: str = "", operator: str = "Equal") -> dict[str, Any]:
    out: dict[str, Any] = {"operator": operator}
    if key:
        out["key"] = key
    if value:
        out["value"] = value
    if effect:
        out["effect"] = effect
    return out
