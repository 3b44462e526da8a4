"""A DaemonSet's facts as plain functions: which nodes should run its pod, the pod made for a
node (pinned there by node affinity, with the tolerations every daemon gets), which node a pod
is for, whether it is up to date, and the status."""

from __future__ import annotations

import copy
from typing import Any

from gpufleet.api.storage import node_selector_term_matches
from gpufleet.api.taints import NO_EXECUTE, NO_SCHEDULE, find_untolerated_taint
from gpufleet.client import objects
from gpufleet.controllers._common import (
    is_being_deleted,
    owner_reference,
    pod_is_available,
    pod_is_ready,
    timestamp,
)
from gpufleet.controllers.history import REVISION_LABEL

API_VERSION = "apps/v1"
KIND = "DaemonSet"
NAME_FIELD = "metadata.name"

# What Kubernetes' DaemonSet controller adds to every daemon pod: a daemon stays on a node that
# is not ready, unreachable, under pressure or cordoned.
DEFAULT_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": NO_EXECUTE},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": NO_EXECUTE},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": NO_SCHEDULE},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": NO_SCHEDULE},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": NO_SCHEDULE},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": NO_SCHEDULE},
]
HOST_NETWORK_TOLERATION = {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists",
                           "effect": NO_SCHEDULE}


def template_dict(ds: Any) -> dict[str, Any]:
    t = ds.spec.template
    return t.to_dict() if hasattr(t, "to_dict") else copy.deepcopy(dict(t or {}))


def daemon_tolerations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The template's tolerations with the daemon defaults added (Kubernetes'
    AddOrUpdateTolerationInPodSpec: an equal one is not added twice)."""
    tolerations = [dict(t) for t in spec.get("tolerations") or []]
    extra = [*DEFAULT_TOLERATIONS, *([HOST_NETWORK_TOLERATION] if spec.get("hostNetwork") else [])]

    def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return all((a.get(k) or "") == (b.get(k) or "") for k in ("key", "operator", "value", "effect"))

    for t in extra:
        if not any(same(t, have) for have in tolerations):
            tolerations.append(dict(t))
    return tolerations


def _node_labels(node: Any) -> dict[str, str]:
    return dict(objects.labels_of(node) or {})


def _fits_affinity(spec: dict[str, Any], node: Any) -> bool:
    name, labels = objects.name_of(node), _node_labels(node)
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is not None:
        return any(node_selector_term_matches(t, name, labels) for t in required.get("nodeSelectorTerms") or [])
    return True


def node_taints(node: Any) -> list[Any]:
    spec = getattr(node, "spec", None)
    return list((spec.taints if spec is not None else None) or [])


def should_run(ds: Any, node: Any) -> tuple[bool, bool]:
    """(should run, should keep running): Kubernetes' NodeShouldRunDaemonPod. A node whose
    untolerated taints are only NoSchedule keeps a daemon already there."""
    spec = template_dict(ds).get("spec") or {}
    if spec.get("nodeName") and spec["nodeName"] != objects.name_of(node):
        return False, False
    if not _fits_affinity(spec, node):
        return False, False
    tolerations = daemon_tolerations(spec)
    taints = node_taints(node)
    if find_untolerated_taint(taints, tolerations, (NO_SCHEDULE, NO_EXECUTE)) is None:
        return True, True
    return False, find_untolerated_taint(taints, tolerations, (NO_EXECUTE,)) is None


def pinned_affinity(affinity: dict[str, Any] | None, node_name: str) -> dict[str, Any]:
    """Kubernetes' ReplaceDaemonSetPodNodeNameNodeAffinity: the required node affinity becomes
    the one term ``metadata.name In [node]``; the rest of the affinity is kept."""
    out = copy.deepcopy(affinity or {})
    node_affinity = out.setdefault("nodeAffinity", {})
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [
        {"matchFields": [{"key": NAME_FIELD, "operator": "In", "values": [node_name]}]}]}
    return out


def pod_body(ds: Any, template: dict[str, Any], node_name: str, hash_: str) -> dict[str, Any]:
    tmeta = template.get("metadata") or {}
    spec = copy.deepcopy(template.get("spec") or {})
    spec["affinity"] = pinned_affinity(spec.get("affinity"), node_name)
    spec["tolerations"] = daemon_tolerations(spec)
    meta: dict[str, Any] = {
        "generateName": f"{objects.name_of(ds)}-",
        "namespace": objects.namespace_of(ds),
        "labels": {**(tmeta.get("labels") or {}), REVISION_LABEL: hash_},
        "ownerReferences": [owner_reference(ds, API_VERSION, KIND)],
    }
    if tmeta.get("annotations"):
        meta["annotations"] = dict(tmeta["annotations"])
    if tmeta.get("finalizers"):
        meta["finalizers"] = list(tmeta["finalizers"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def target_node(pod: Any) -> str | None:
    """The node a daemon pod is for: where it runs, else the node its affinity names."""
    spec = getattr(pod, "spec", None)
    if spec is None:
        return None
    if spec.node_name:
        return spec.node_name
    affinity = spec.affinity.node_affinity if spec.affinity is not None else None
    required = affinity.required_during_scheduling_ignored_during_execution if affinity is not None else None
    for term in (required.node_selector_terms if required is not None else None) or []:
        for req in term.match_fields or []:
            if req.key == NAME_FIELD and req.operator == "In" and len(req.values or []) == 1:
                return req.values[0]
    return None


def is_updated(pod: Any, hash_: str) -> bool:
    return bool(hash_) and (objects.labels_of(pod) or {}).get(REVISION_LABEL) == hash_


def oldest_first(pods: list[Any]) -> list[Any]:
    """podByCreationTimestampAndPhase: older first; of equal age, a scheduled one first."""
    def key(p: Any) -> tuple:
        return (timestamp(objects.meta(p, "creationTimestamp")) or 0.0,
                0 if getattr(p.spec, "node_name", None) else 1, objects.name_of(p))
    return sorted(pods, key=key)


def available(pod: Any, min_ready: int, now: float) -> bool:
    return pod_is_available(pod, min_ready, now)


def daemon_status(ds: Any, nodes: list[Any], by_node: dict[str, list[Any]], hash_: str, collision_count: int,
                  now: float) -> dict[str, Any]:
    """Kubernetes' updateDaemonSetStatus: counted per node, the oldest pod of a node speaking for it."""
    min_ready = ds.spec.min_ready_seconds or 0
    desired = current = misscheduled = ready = avail = updated = 0
    for node in nodes:
        run, _ = should_run(ds, node)
        pods = [p for p in by_node.get(objects.name_of(node), []) if not is_being_deleted(p)]
        if run:
            desired += 1
            if not pods:
                continue
            current += 1
            pod = oldest_first(pods)[0]
            if pod_is_ready(pod):
                ready += 1
                if available(pod, min_ready, now):
                    avail += 1
            if is_updated(pod, hash_):
                updated += 1
        elif pods:
            misscheduled += 1
    status: dict[str, Any] = {
        "currentNumberScheduled": current,
        "numberMisscheduled": misscheduled,
        "desiredNumberScheduled": desired,
        "numberReady": ready,
        "observedGeneration": objects.meta(ds, "generation") or 1,
        "updatedNumberScheduled": updated,
        "numberAvailable": avail,
    }
    # As the Go type has it: these three are omitted when zero.
    for key in ("updatedNumberScheduled", "numberAvailable"):
        if not status[key]:
            del status[key]
    if desired - avail:
        status["numberUnavailable"] = desired - avail
    if collision_count:
        status["collisionCount"] = collision_count
    conditions = ds.status.conditions if ds.status is not None else None
    if conditions:
        status["conditions"] = [c.to_dict() for c in conditions]
    return status
