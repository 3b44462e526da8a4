"""A StatefulSet's facts as plain functions: ordinals and stable names, a pod's identity
and storage, the claims made from ``volumeClaimTemplates`` and who owns them, health and
the status."""

from __future__ import annotations

import copy
import re
from typing import Any

from gpufleet.client import objects
from gpufleet.controllers._common import (
    is_being_deleted,
    owner_reference,
    pod_is_available,
    pod_is_ready,
    pod_is_terminal,
    pod_phase,
)
from gpufleet.controllers.history import REVISION_LABEL

API_VERSION = "apps/v1"
KIND = "StatefulSet"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
_ORDINAL = re.compile(r"^(.*)-([0-9]+)$")


def start_ordinal(sts: Any) -> int:
    ordinals = sts.spec.ordinals
    return (ordinals.start or 0) if ordinals is not None else 0


def replicas(sts: Any) -> int:
    return sts.spec.replicas if sts.spec.replicas is not None else 1


def ordinal_of(sts: Any, pod: Any) -> int | None:
    """The ordinal in ``<set>-<ordinal>``; None for a pod whose name is not of the set."""
    m = _ORDINAL.match(objects.name_of(pod))
    if m is None or m.group(1) != objects.name_of(sts):
        return None
    return int(m.group(2))


def in_range(sts: Any, ordinal: int) -> bool:
    start = start_ordinal(sts)
    return start <= ordinal < start + replicas(sts)


def pod_name(sts: Any, ordinal: int) -> str:
    return f"{objects.name_of(sts)}-{ordinal}"


def claim_name(template_name: str, sts: Any, ordinal: int) -> str:
    return f"{template_name}-{objects.name_of(sts)}-{ordinal}"


def revision_of(pod: Any) -> str:
    return (objects.labels_of(pod) or {}).get(REVISION_LABEL, "")


def _template_name(claim: Any) -> str:
    return (claim.metadata.name if claim.metadata is not None else None) or ""


def claim_body(sts: Any, template: Any, ordinal: int) -> dict[str, Any]:
    """The claim for one replica: the template's metadata and spec, the set's selector labels."""
    data = template.to_dict() if hasattr(template, "to_dict") else copy.deepcopy(template)
    tmeta = data.get("metadata") or {}
    selector = sts.spec.selector.match_labels if sts.spec.selector is not None else None
    labels = {**(tmeta.get("labels") or {}), **(selector or {})}
    meta: dict[str, Any] = {"name": claim_name(tmeta.get("name", ""), sts, ordinal),
                            "namespace": objects.namespace_of(sts)}
    if labels:
        meta["labels"] = labels
    if tmeta.get("annotations"):
        meta["annotations"] = dict(tmeta["annotations"])
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": data.get("spec") or {}}


def pod_body(sts: Any, template: dict[str, Any], revision: str, ordinal: int) -> dict[str, Any]:
    """Pod ``<set>-<ordinal>`` from ``template`` (a wire dict): its identity (labels,
    hostname, subdomain), its claims in place of the templates' volumes, its revision."""
    name = pod_name(sts, ordinal)
    tmeta = template.get("metadata") or {}
    spec = copy.deepcopy(template.get("spec") or {})
    labels = {**(tmeta.get("labels") or {}), POD_NAME_LABEL: name, POD_INDEX_LABEL: str(ordinal),
              REVISION_LABEL: revision}
    meta: dict[str, Any] = {"name": name, "namespace": objects.namespace_of(sts), "labels": labels,
                            "ownerReferences": [owner_reference(sts, API_VERSION, KIND)]}
    if tmeta.get("annotations"):
        meta["annotations"] = dict(tmeta["annotations"])
    if tmeta.get("finalizers"):
        meta["finalizers"] = list(tmeta["finalizers"])
    claims = {_template_name(c): claim_name(_template_name(c), sts, ordinal)
              for c in sts.spec.volume_claim_templates or []}
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") not in claims]
    volumes += [{"name": tpl, "persistentVolumeClaim": {"claimName": claim}} for tpl, claim in claims.items()]
    if volumes:
        spec["volumes"] = volumes
    spec["hostname"] = name
    if sts.spec.service_name:
        spec["subdomain"] = sts.spec.service_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def claim_owner_references(sts: Any, claim: Any, pod: Any | None, condemned: bool) -> list[dict[str, Any]]:
    """The owner references a replica's claim should have under the retention policy: the set
    when ``whenDeleted`` is Delete, the pod when it is being scaled away and ``whenScaled`` is
    Delete; references to anything else are kept."""
    policy = sts.spec.persistent_volume_claim_retention_policy
    when_deleted = (policy.when_deleted if policy is not None else None) or "Retain"
    when_scaled = (policy.when_scaled if policy is not None else None) or "Retain"
    set_uid = objects.uid_of(sts)
    refs = [r.to_dict() if hasattr(r, "to_dict") else dict(r) for r in objects.meta(claim, "ownerReferences") or []]
    pod_ref_name = objects.name_of(pod) if pod is not None else None
    kept = [r for r in refs if r.get("uid") != set_uid
            and not (r.get("kind") == "Pod" and r.get("name") == pod_ref_name)]
    if when_deleted == "Delete":
        kept.append({"apiVersion": API_VERSION, "kind": KIND, "name": objects.name_of(sts), "uid": set_uid})
    if when_scaled == "Delete" and condemned and pod is not None:
        kept.append({"apiVersion": "v1", "kind": "Pod", "name": objects.name_of(pod), "uid": objects.uid_of(pod)})
    return kept


def is_running_and_ready(pod: Any) -> bool:
    return pod_phase(pod) == "Running" and pod_is_ready(pod)


def is_healthy(pod: Any, min_ready: int, now: float) -> bool:
    """Running and available (ready for minReadySeconds), and not on its way out."""
    return pod_phase(pod) == "Running" and pod_is_available(pod, min_ready, now) and not is_being_deleted(pod)


def is_finished(pod: Any) -> bool:
    return pod_is_terminal(pod)


def set_status(sts: Any, pods: list[Any], current: str, update: str, collision_count: int,
               min_ready: int, now: float) -> dict[str, Any]:
    """Kubernetes' computeReplicaStatus, then completeRollingUpdate: every pod counts as a
    replica (and as ready when it is), pods on their way out count for no revision."""
    staying = [p for p in pods if not is_being_deleted(p)]
    status: dict[str, Any] = {
        "observedGeneration": objects.meta(sts, "generation") or 1,
        "replicas": len(pods),
        "readyReplicas": sum(1 for p in pods if is_running_and_ready(p)),
        "currentReplicas": sum(1 for p in staying if revision_of(p) == current),
        "updatedReplicas": sum(1 for p in staying if revision_of(p) == update),
        "currentRevision": current,
        "updateRevision": update,
        "collisionCount": collision_count,
        "availableReplicas": sum(1 for p in pods if is_running_and_ready(p)
                                 and pod_is_available(p, min_ready, now)),
    }
    strategy = sts.spec.update_strategy
    rolling = strategy is None or (strategy.type or "RollingUpdate") == "RollingUpdate"
    if rolling and status["updatedReplicas"] == status["replicas"] == status["readyReplicas"]:
        status["currentReplicas"] = status["updatedReplicas"]
        status["currentRevision"] = update
    # As the Go type has it: these are omitted when zero (collisionCount, a pointer, is not).
    for key in ("readyReplicas", "currentReplicas", "updatedReplicas", "availableReplicas"):
        if not status[key]:
            del status[key]
    conditions = getattr(sts.status, "conditions", None) if sts.status is not None else None
    if conditions:
        status["conditions"] = [c.to_dict() for c in conditions]
    return status
