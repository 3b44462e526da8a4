"""How many new worker pods the scheduler could place now, asked of the scheduler's own
filters: a snapshot of the nodes with the pods bound to them, this cluster's pods still
waiting placed first (they count against the room), then the new workers one by one,
each taking what it would take. What stops them is the scheduler's own message, e.g.
``0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable.``
(cordoned nodes, untolerated taints such as a GPU node's health taint, fenced GPUs and
node selectors all say no here as they do to the scheduler).

An autoscaled RayCluster's controller creates only that many workers, so a worker the
fleet cannot run is never left as a pod stuck Pending (kuberay #1108, ray #45195). The
controllers do not import the scheduler: `gpufleet up` / `gpufleet server` hand ``room`` to
the controller manager (``ControllerOptions.worker_room``), as the cluster autoscaler of
Kubernetes runs the scheduler's framework as a library."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from gpufleet.client import objects
from gpufleet.scheduler.cycle import FitError
from gpufleet.scheduler.framework import Framework
from gpufleet.scheduler.profile import Profile
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot

_FRAMEWORK: Framework | None = None


def _framework() -> Framework:
    global _FRAMEWORK
    if _FRAMEWORK is None:
        _FRAMEWORK = Framework(Profile())
    return _FRAMEWORK


def _terminal(pod: Any) -> bool:
    status = getattr(pod, "status", None)
    return status is not None and status.phase in ("Succeeded", "Failed")


def snapshot(nodes: Iterable[Any], pods: Iterable[Any]) -> Snapshot:
    """The nodes and what is bound to them (terminal pods hold nothing)."""
    by_node: dict[str, list[PodInfo]] = {}
    for pod in pods:
        node = pod.spec.node_name if pod.spec is not None else None
        if node and not _terminal(pod):
            by_node.setdefault(node, []).append(PodInfo(pod))
    return Snapshot(NodeInfo(n, by_node.get(objects.name_of(n), [])) for n in nodes)


def _place(framework: Framework, snap: Snapshot, info: PodInfo) -> str | None:
    """Place one pod on the snapshot; None when it fits, else the scheduler's reason."""
    result = framework.schedule(info, snap, post_filter=False)
    if isinstance(result, FitError):
        return result.message
    snap.add_pod(info, result.node, result.gpu_indices)
    return None


def room(body: dict[str, Any], want: int, nodes: Iterable[Any], pods: Iterable[Any],
         waiting: Iterable[Any] = ()) -> tuple[int, str | None]:
    """How many of ``want`` pods like ``body`` (a pod wire dict) fit now beside ``pods``
    (those bound count), after ``waiting`` (unbound pods ahead of them); and, when not
    all do, the scheduler's reason for the first that does not."""
    if want <= 0:
        return 0, None
    framework = _framework()
    snap = snapshot(nodes, pods)
    for pod in waiting:
        _place(framework, snap, PodInfo(pod))
    base = objects.meta(body, "generateName") or "worker-"
    placed = 0
    for i in range(want):
        trial = copy.deepcopy(body)
        trial.setdefault("metadata", {})["name"] = f"{base}trial-{i}"
        reason = _place(framework, snap, PodInfo(trial))
        if reason is not None:
            return placed, reason
        placed += 1
    return placed, None
