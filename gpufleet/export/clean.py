"""Which live objects a user wrote, and those objects as a manifest for a real cluster.

A live object carries what the system added to what the user asked for: status, the
bookkeeping fields of its metadata (uid, resourceVersion, generation, timestamps,
managedFields), annotations and labels that only controllers here read or write, and
children that a controller made from it (a Deployment's ReplicaSets and Pods, a
PyTorchJob's pods, Service and PodGroup, a Job's Kueue Workload). `exported` says whether
an object belongs in an export at all; `clean` strips one down to what re-applying it
needs. Both are pure functions of the object.

Annotations under gpufleet.io/ split in two:
- status in disguise (the scheduler's diagnosis, the GPUs and host ports a pod got, a
  gang's attempt and restart counts, the reason of the last elastic resize): dropped;
- what the user set to ask for something (gpufleet.io/checkpoint-dir, elastic-resize,
  elastic-autoscale, gpu-topology, gpu-memory-min, ...): kept, so that exporting and
  re-applying to gpufleet gives back the same objects. A real cluster ignores them; the
  renderer says so in a comment above the document.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any

# Kinds that only describe the running system; never exported.
RUNTIME_KINDS = frozenset({
    ("", "Node"), ("", "Endpoints"), ("", "Event"), ("coordination.k8s.io", "Lease"),
    ("discovery.k8s.io", "EndpointSlice"), ("events.k8s.io", "Event"), ("", "Binding"),
    ("metrics.k8s.io", "PodMetrics"), ("metrics.k8s.io", "NodeMetrics"),
})
SYSTEM_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
# Namespaces whose objects are the system's own (the "default" namespace holds users' objects).
SYSTEM_OBJECT_NAMESPACES = SYSTEM_NAMESPACES - {"default"}

# Annotations written by the system. Anything else (including other gpufleet.io/ ones) is
# taken to be the user's.
SYSTEM_ANNOTATIONS = frozenset({
    "kubectl.kubernetes.io/last-applied-configuration",
    "gpufleet.io/scheduling-diagnosis",
    "gpufleet.io/gpu-indices",
    "gpufleet.io/host-ports",
    "gpufleet.io/gpu-metrics",
    "gpufleet.io/gpus",
    "gpufleet.io/gang-attempt",
    "gpufleet.io/gang-restarts",
    "gpufleet.io/gang-size",
    "gpufleet.io/elastic-reason",
    "gpufleet.io/binding",
    "deployment.kubernetes.io/revision",
    "deployment.kubernetes.io/revision-history",
    "deployment.kubernetes.io/desired-replicas",
    "deployment.kubernetes.io/max-replicas",
    "batch.kubernetes.io/job-tracking",
    "autoscaling.alpha.kubernetes.io/metrics",
    "autoscaling.alpha.kubernetes.io/current-metrics",
    "autoscaling.alpha.kubernetes.io/conditions",
    "autoscaling.alpha.kubernetes.io/behavior",
    "rbac.authorization.kubernetes.io/autoupdate",
    # Binding and provisioning bookkeeping of claims and volumes (the PV controller's).
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    "pv.kubernetes.io/provisioned-by",
    "volume.kubernetes.io/selected-node",
    "volume.kubernetes.io/storage-provisioner",
    "volume.beta.kubernetes.io/storage-provisioner",
})
# gpufleet.io/ annotations a user sets that mean nothing on a real cluster (kept, with a note).
GPUFLEET_USER_ANNOTATIONS = frozenset({
    "gpufleet.io/checkpoint-dir",
    "gpufleet.io/elastic-resize",
    "gpufleet.io/elastic-autoscale",
    "gpufleet.io/gpu-topology",
    "gpufleet.io/gpu-memory-min",
})
# Labels the API server puts on a Job's selector and pod template.
JOB_GENERATED_LABELS = frozenset({
    "controller-uid", "job-name", "batch.kubernetes.io/controller-uid", "batch.kubernetes.io/job-name",
})
_METADATA_KEEP = ("name", "namespace", "labels", "annotations", "finalizers")
# Finalizers the system adds and removes itself; a real cluster would never remove them.
_SYSTEM_FINALIZERS = frozenset({"kubernetes", "foregroundDeletion", "orphan", "kubernetes.io/pvc-protection",
                                "kubernetes.io/pv-protection"})
_BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
# The StorageClass gpufleet makes at start: a real cluster brings its own storage.
BUILT_IN_STORAGE_CLASS = ("local-path", "gpufleet.io/local-path")
# The IngressClass of gpufleet's gateway: a real cluster has its own ingress controller, whose
# default class an exported Ingress of this one gets there.
BUILT_IN_INGRESS_CLASS = ("gpufleet", "gpufleet.io/gateway")
_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def group_of(obj: dict[str, Any]) -> str:
    api_version = obj.get("apiVersion") or ""
    return api_version.rpartition("/")[0]


def exported(obj: dict[str, Any]) -> bool:
    """Whether ``obj`` is something a user wrote (rather than the system or a controller)."""
    kind = obj.get("kind") or ""
    group = group_of(obj)
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    labels = meta.get("labels") or {}
    if (group, kind) in RUNTIME_KINDS:
        return False
    if meta.get("ownerReferences"):
        return False
    if meta.get("namespace") in SYSTEM_OBJECT_NAMESPACES:
        return False
    if kind == "Namespace" and name in SYSTEM_NAMESPACES:
        return False
    if kind == "PriorityClass" and name.startswith("system-"):
        return False
    if kind == "StorageClass" and (name, obj.get("provisioner")) == BUILT_IN_STORAGE_CLASS:
        return False
    if kind == "IngressClass" and (name, (obj.get("spec") or {}).get("controller")) == BUILT_IN_INGRESS_CLASS:
        return False
    if kind == "PersistentVolume" and group == "" and "pv.kubernetes.io/provisioned-by" in (
            meta.get("annotations") or {}):
        # Made by a provisioner for a claim: the claim gets a new one there.
        return False
    if kind in ("ClusterRole", "ClusterRoleBinding") and (
            name.startswith("system:") or labels.get("kubernetes.io/bootstrapping") == "rbac-defaults"):
        return False
    if "gpufleet.io/token-id" in labels:
        # A `gpufleet token` binding: it grants a token that lives only in this cluster.
        return False
    if kind == "ServiceAccount" and name == "default":
        return False
    if kind == "Service" and name == "kubernetes" and meta.get("namespace") == "default" and \
            labels.get("provider") == "kubernetes":
        return False
    if kind == "ConfigMap" and name == "kube-root-ca.crt":
        return False
    if kind == "Secret" and obj.get("type") in ("kubernetes.io/service-account-token", "gpufleet.io/token"):
        return False
    if kind == "Workload" and group == "kueue.x-k8s.io" and (labels.get("kueue.x-k8s.io/job-uid")):
        return False
    return True


def clean(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as a manifest: apiVersion, kind, the user's metadata and the spec (or data)."""
    out = copy.deepcopy(obj)
    out.pop("status", None)
    meta = out.get("metadata") or {}
    kept = {k: meta[k] for k in _METADATA_KEEP if meta.get(k) not in (None, {}, [])}
    annotations = {k: v for k, v in (kept.get("annotations") or {}).items() if k not in SYSTEM_ANNOTATIONS}
    _set_or_drop(kept, "annotations", annotations)
    finalizers = [f for f in kept.get("finalizers") or [] if f not in _SYSTEM_FINALIZERS
                  and not f.startswith("gpufleet.io/")]
    _set_or_drop(kept, "finalizers", finalizers)
    out["metadata"] = kept
    kind = out.get("kind")
    group = group_of(out)
    spec = out.get("spec")
    if isinstance(spec, dict):
        if kind == "Service" and group == "":
            _clean_service(spec)
        elif kind == "Job" and group == "batch":
            _clean_job(out, spec)
        elif kind == "PyTorchJob" and group == "kubeflow.org":
            _clean_queued(out, spec.get("runPolicy"))
        elif kind == "Pod" and group == "":
            # The scheduler's choice among this cluster's nodes.
            spec.pop("nodeName", None)
            _clean_service_account(spec)
        elif kind in ("PersistentVolumeClaim", "PersistentVolume") and group == "":
            _clean_storage(kind, spec, meta)
        elif kind == "StatefulSet" and group == "apps":
            for claim in spec.get("volumeClaimTemplates") or []:
                if isinstance(claim, dict):
                    claim.pop("status", None)
        elif kind == "Ingress" and group == "networking.k8s.io":
            if spec.get("ingressClassName") == BUILT_IN_INGRESS_CLASS[0]:
                spec.pop("ingressClassName")
        elif kind == "Namespace":
            _set_or_drop(spec, "finalizers", [f for f in spec.get("finalizers") or [] if f != "kubernetes"])
        if not spec and kind == "Namespace":
            out.pop("spec")
    if kind == "Namespace" and group == "":
        # Every cluster labels a namespace with its own name.
        labels = kept.get("labels") or {}
        labels.pop("kubernetes.io/metadata.name", None)
        _set_or_drop(kept, "labels", labels)
    return out


def _set_or_drop(mapping: dict[str, Any], key: str, value: Any) -> None:
    if value:
        mapping[key] = value
    else:
        mapping.pop(key, None)


def _clean_service(spec: dict[str, Any]) -> None:
    # Addresses come from the cluster's own ranges; a headless service stays headless.
    if spec.get("clusterIP") != "None":
        spec.pop("clusterIP", None)
        spec.pop("clusterIPs", None)
    else:
        spec.pop("clusterIPs", None)
    for key in ("ipFamilies", "ipFamilyPolicy"):
        spec.pop(key, None)


def _clean_service_account(spec: dict[str, Any]) -> None:
    """What the ServiceAccount admission plugin added: the kube-api-access volume (every
    cluster adds its own) and its mounts, the deprecated copy of the service account's name,
    and the name itself when it is the default."""
    added = {v.get("name") for v in spec.get("volumes") or []
             if isinstance(v, dict) and str(v.get("name", "")).startswith("kube-api-access-")
             and v.get("projected") is not None}
    if added:
        _set_or_drop(spec, "volumes", [v for v in spec["volumes"] if v.get("name") not in added])
        for key in ("initContainers", "containers"):
            for c in spec.get(key) or []:
                if isinstance(c, dict) and c.get("volumeMounts"):
                    _set_or_drop(c, "volumeMounts", [m for m in c["volumeMounts"] if m.get("name") not in added])
    spec.pop("serviceAccount", None)
    if spec.get("serviceAccountName") == "default":
        spec.pop("serviceAccountName")


def _clean_job(job: dict[str, Any], spec: dict[str, Any]) -> None:
    """The selector and template labels the server generates (unless manualSelector) go:
    they name this Job's uid here, which a new cluster gives out afresh."""
    if not spec.get("manualSelector"):
        spec.pop("selector", None)
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels")
        if isinstance(labels, dict):
            for key in JOB_GENERATED_LABELS:
                labels.pop(key, None)
            if not labels:
                spec["template"]["metadata"].pop("labels")
        if spec.get("manualSelector") is False:
            spec.pop("manualSelector")
        # A Job without labels of its own shows its template's, the generated ones included.
        meta = job.get("metadata") or {}
        if isinstance(meta.get("labels"), dict):
            _set_or_drop(meta, "labels", {k: v for k, v in meta["labels"].items() if k not in JOB_GENERATED_LABELS})
    _clean_queued(job, spec)


def _clean_storage(kind: str, spec: dict[str, Any], meta: dict[str, Any]) -> None:
    """A binding the PV controller chose is made again there; one the user wrote (a claim
    naming its volume, a volume reserved for a claim) stays, without this cluster's uids."""
    chosen = _BOUND_BY_CONTROLLER in (meta.get("annotations") or {})
    if kind == "PersistentVolumeClaim":
        if chosen:
            spec.pop("volumeName", None)
        return
    ref = spec.get("claimRef")
    if chosen or not isinstance(ref, dict):
        spec.pop("claimRef", None)
    else:
        spec["claimRef"] = {k: v for k, v in ref.items() if k in ("apiVersion", "kind", "namespace", "name")}


def _clean_queued(obj: dict[str, Any], suspend_holder: Any) -> None:
    """A queued job's suspend flag is Kueue's to set (it suspends the job on creation and
    resumes it on admission), not the user's."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if _QUEUE_LABEL in labels and isinstance(suspend_holder, dict):
        suspend_holder.pop("suspend", None)


def gpufleet_annotations(obj: dict[str, Any]) -> list[str]:
    """The gpufleet-only annotations a cleaned object kept, on itself or its pod templates
    (a real cluster ignores them)."""
    spec = obj.get("spec") or {}
    templates = [spec.get("template")] + [r.get("template") for r in (spec.get("pytorchReplicaSpecs") or {}).values()
                                          if isinstance(r, dict)]
    found: set[str] = set()
    for holder in [obj, *(t for t in templates if isinstance(t, dict))]:
        annotations = (holder.get("metadata") or {}).get("annotations") or {}
        found.update(k for k in annotations if k.startswith("gpufleet.io/"))
    return sorted(found)


def statefulset_claims(objects: Iterable[dict[str, Any]]) -> set[tuple[str, str]]:
    """(namespace, name) of the claims that the StatefulSets among ``objects`` made from their
    volumeClaimTemplates (``<template>-<set>-<ordinal>``): the set makes them again there."""
    patterns: dict[str, list[re.Pattern[str]]] = {}
    for obj in objects:
        if obj.get("kind") != "StatefulSet" or group_of(obj) != "apps":
            continue
        meta = obj.get("metadata") or {}
        for claim in (obj.get("spec") or {}).get("volumeClaimTemplates") or []:
            template = ((claim or {}).get("metadata") or {}).get("name")
            if template:
                patterns.setdefault(meta.get("namespace") or "", []).append(
                    re.compile(rf"{re.escape(template)}-{re.escape(meta.get('name') or '')}-[0-9]+"))
    out: set[tuple[str, str]] = set()
    for obj in objects:
        if obj.get("kind") != "PersistentVolumeClaim" or group_of(obj):
            continue
        meta = obj.get("metadata") or {}
        ns, name = meta.get("namespace") or "", meta.get("name") or ""
        if any(p.fullmatch(name) for p in patterns.get(ns, [])):
            out.add((ns, name))
    return out
