"""Manifests for a real cluster: gather the user's objects through the client, clean them,
order them so one `kubectl apply -f` creates them in one pass, and say in comments what
the cluster needs installed and what behaves differently there."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpufleet.api.registry import ResourceType
from gpufleet.client.api import Client
from gpufleet.client.errors import Forbidden, NotFound
from gpufleet.export.clean import (
    GPUFLEET_USER_ANNOTATIONS,
    clean,
    exported,
    gpufleet_annotations,
    group_of,
    statefulset_claims,
)

# Namespaces first, then what others refer to (priorities, config, quotas, RBAC, queues),
# then the workloads. Kinds not named here go after, by group and kind.
ORDER = [
    "Namespace", "PriorityClass", "ServiceAccount", "Secret", "ConfigMap", "ResourceQuota", "LimitRange",
    "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
    "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
    "ResourceFlavor", "ClusterQueue", "LocalQueue", "Queue",
    "PodDisruptionBudget", "Service", "PodGroup", "Deployment", "StatefulSet", "DaemonSet",
    "HorizontalPodAutoscaler",
    "Job", "PyTorchJob", "RayCluster", "RayJob", "RayService", "Pod",
]
_ORDER_INDEX = {kind: i for i, kind in enumerate(ORDER)}

# API groups that a plain Kubernetes cluster lacks: what to install there.
REQUIREMENTS = {
    "kubeflow.org": "Kubeflow training operator (kubeflow.org/v1 PyTorchJob): "
                    "kubectl apply --server-side -k "
                    "\"github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.8.1\"",
    "scheduling.x-k8s.io": "scheduler-plugins with the Coscheduling plugin (scheduling.x-k8s.io/v1alpha1 "
                           "PodGroup): https://github.com/kubernetes-sigs/scheduler-plugins",
    "batch.volcano.sh": "Volcano (batch.volcano.sh/v1alpha1 Job, scheduling.volcano.sh/v1beta1 Queue and "
                        "PodGroup): kubectl apply -f https://raw.githubusercontent.com/volcano-sh/volcano/"
                        "release-1.12/installer/volcano-development.yaml",
    "scheduling.volcano.sh": "Volcano (scheduling.volcano.sh/v1beta1 Queue and PodGroup): kubectl apply -f "
                             "https://raw.githubusercontent.com/volcano-sh/volcano/release-1.12/installer/"
                             "volcano-development.yaml",
    "ray.io": "KubeRay operator (ray.io/v1 RayCluster, RayJob, RayService): helm repo add kuberay "
              "https://ray-project.github.io/kuberay-helm/ && helm install kuberay-operator kuberay/kuberay-operator",
    "kueue.x-k8s.io": "Kueue (kueue.x-k8s.io/v1beta1 ResourceFlavor, ClusterQueue, LocalQueue): "
                      "https://kueue.sigs.k8s.io/docs/installation/",
}
_GPUFLEET_ENV = re.compile(r"\bGPUFLEET_[A-Z0-9_]+|\$\(?PORT\b|\$\{PORT\}")


@dataclass
class Document:
    obj: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.obj.get("kind") or ""

    @property
    def group(self) -> str:
        return group_of(self.obj)

    @property
    def sort_key(self) -> tuple[int, str, str, str, str]:
        meta = self.obj.get("metadata") or {}
        return (_ORDER_INDEX.get(self.kind, len(ORDER)), self.group, self.kind,
                meta.get("namespace") or "", meta.get("name") or "")


@dataclass
class Export:
    documents: list[Document]
    # Kinds left out because this user may not list them (only when every kind was asked for).
    skipped: list[str] = field(default_factory=list)

    @property
    def requirements(self) -> list[str]:
        groups = {d.group for d in self.documents}
        return [text for group, text in REQUIREMENTS.items() if group in groups]


async def gather(client: Client, kinds: Sequence[ResourceType], namespace: str | None, *,
                 skip_forbidden: bool = False) -> Export:
    """The user's objects of ``kinds`` (``namespace`` None: every namespace and the
    cluster-scoped kinds; else that namespace, its Namespace object and no other
    cluster-scoped object), cleaned and ordered. With ``skip_forbidden`` a kind the
    caller may not list is left out and named in ``skipped`` instead of failing."""
    objects: list[dict[str, Any]] = []
    skipped: list[str] = []
    for rt in kinds:
        try:
            if not rt.namespaced and namespace is not None:
                if rt.kind == "Namespace" and rt.group == "":
                    try:
                        objects.append(await client.get(rt, namespace, raw=True))
                    except NotFound:
                        pass
                continue
            objects.extend((await client.list(rt, namespace if rt.namespaced else None, raw=True)).items)
        except (Forbidden, NotFound):
            if not skip_forbidden:
                raise
            skipped.append(rt.key)
    result = build(objects)
    result.skipped = skipped
    return result


def build(objects: Iterable[dict[str, Any]]) -> Export:
    objects = list(objects)
    made = statefulset_claims(objects)
    docs = [Document(clean(o)) for o in objects if exported(o) and not _claim_in(o, made)]
    for d in docs:
        d.notes = notes_for(d.obj)
    docs.sort(key=lambda d: d.sort_key)
    return Export(docs)


def _claim_in(obj: dict[str, Any], claims: set[tuple[str, str]]) -> bool:
    meta = obj.get("metadata") or {}
    return obj.get("kind") == "PersistentVolumeClaim" and (meta.get("namespace") or "", meta.get("name") or "") \
        in claims


def notes_for(obj: dict[str, Any]) -> list[str]:
    """What to know about one object on a real cluster."""
    notes: list[str] = []
    kind, group = obj.get("kind"), group_of(obj)
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    if group in REQUIREMENTS:
        notes.append(f"needs {REQUIREMENTS[group].split(' (')[0]} on the cluster")
    if kind in ("RayCluster", "RayJob", "RayService") and group == "ray.io":
        notes.append("gang placement of head + minReplicas needs KubeRay's batch scheduler "
                     "(--batch-scheduler=scheduler-plugins); gpufleet makes the PodGroup itself")
    if kind == "PyTorchJob" and group == "kubeflow.org":
        notes.append("a failed member restarts that pod per restartPolicy there; gpufleet recreates the whole "
                     "gang and resumes it from the last checkpoint")
        notes.append("GPUFLEET_CHECKPOINT_DIR is not set there: mount a volume and pass the directory yourself")
        notes.append("gang scheduling needs the training operator's --gang-scheduler-name (e.g. "
                     "scheduler-plugins); gpufleet makes the PodGroup itself")
        if spec.get("elasticPolicy"):
            notes.append("elasticPolicy only bounds torchrun there: the job does not grow into free GPUs "
                         "between minReplicas and maxReplicas as it does on gpufleet")
    if kind == "PodGroup" and group == "scheduling.x-k8s.io":
        notes.append("its pods need the label scheduling.x-k8s.io/pod-group and the schedulerName of the "
                     "scheduler-plugins scheduler (unless it replaced the default scheduler)")
    if kind == "Job" and group == "batch.volcano.sh":
        notes.append("the svc plugin's host names resolve through the cluster's DNS there; on gpufleet they "
                     "resolve through hostAliases only where every pod shares one address")
    if kind == "Queue" and group == "scheduling.volcano.sh":
        notes.append("Volcano there also reclaims over-used resources across queues (reclaimable) and gives "
                     "each queue its weighted share; gpufleet honours capability and state, and weight only as the "
                     "order in which queues are served")
    if kind == "HorizontalPodAutoscaler":
        metrics = spec.get("metrics") or []
        custom = sorted({((m.get(m.get("type", "").lower() or "") or {}).get("metric") or {}).get("name", "")
                         for m in metrics if m.get("type") in ("Pods", "Object", "External")} - {""})
        if custom:
            notes.append(f"metrics {', '.join(custom)} need a custom metrics adapter (e.g. prometheus-adapter); "
                         "gpufleet's gateway and agents measure them here")
        if spec.get("minReplicas") == 0:
            notes.append("minReplicas 0 needs the HPAScaleToZero feature gate; gpufleet's gateway also holds "
                         "requests while a replica starts, a real cluster does not")
    if kind == "PersistentVolumeClaim" and group == "" and spec.get("storageClassName") == "local-path":
        notes.append("storageClassName local-path: k3s has a class of that name (rancher.io/local-path); elsewhere "
                     "install Rancher's local-path-provisioner or name a class the cluster has")
    if kind == "StorageClass" and obj.get("provisioner") == "gpufleet.io/local-path":
        notes.append("provisioner gpufleet.io/local-path is gpufleet's own: on Kubernetes use rancher.io/local-path "
                     "(Rancher's local-path-provisioner), which gpufleet also serves")
    kept = [a for a in gpufleet_annotations(obj) if a in GPUFLEET_USER_ANNOTATIONS]
    if kept:
        notes.append(f"{', '.join(kept)}: gpufleet-only, ignored there (kept so the export re-applies to gpufleet)")
    if (meta.get("labels") or {}).get("kueue.x-k8s.io/queue-name"):
        notes.append("queued through Kueue: the LocalQueue and Kueue must exist there, or the job stays suspended")
    if _uses_gpufleet_env(obj):
        notes.append("the command uses GPUFLEET_* or $PORT, which gpufleet's agent sets: on Kubernetes each pod has "
                     "its own network and the image's filesystem (no shared 127.0.0.1, no host paths)")
    return notes


def _has_pods(obj: dict[str, Any]) -> bool:
    spec = obj.get("spec") or {}
    return (obj.get("kind") == "Pod" or "template" in spec or "pytorchReplicaSpecs" in spec
            or "headGroupSpec" in spec or "rayClusterSpec" in spec)


def _uses_gpufleet_env(obj: dict[str, Any]) -> bool:
    found = False

    def walk(value: Any, key: str = "") -> None:
        nonlocal found
        if found:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif isinstance(value, str) and key in ("command", "args", "value") and _GPUFLEET_ENV.search(value):
            found = True

    walk(obj.get("spec"))
    return found


def to_yaml(export: Export, *, header: bool = True) -> str:
    """One multi-document YAML stream, in apply order, with its notes as comments."""
    parts: list[str] = []
    if header:
        parts.append(header_text(export))
    for d in export.documents:
        parts.append(document_text(d))
    return "".join(parts)


def header_text(export: Export) -> str:
    lines = ["# Exported by `gpufleet export`: apply with `kubectl apply -f` (or `gpufleet apply -f`).",
             "# Status, server-set metadata and objects controllers make (ReplicaSets, Pods, PodGroups,",
             "# Workloads, a training job's Service) are left out: the cluster makes them again."]
    if any(_has_pods(d.obj) for d in export.documents):
        lines += ["#",
                  "# gpufleet's process runtime runs a container's command on the server itself, on the",
                  "# host network (127.0.0.1, $PORT); on Kubernetes each pod runs its image in its own",
                  "# network namespace: the image must hold the program, the Service reaches its port."]
    if export.requirements:
        lines.append("#")
        lines.append("# Install on the cluster first:")
        lines.extend(f"#   - {r}" for r in export.requirements)
    return "\n".join(lines) + "\n"


def document_text(d: Document) -> str:
    comments = "".join(f"# NOTE: {n}\n" for n in d.notes)
    body = yaml.safe_dump(d.obj, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return f"---\n{comments}{body}"


def file_name(index: int, d: Document) -> str:
    """A file per kind for a directory export, numbered so that `apply -f DIR` keeps the order."""
    group = f".{d.group}" if d.group else ""
    return f"{index:02d}-{d.kind.lower()}{group}.yaml"


def to_files(export: Export) -> dict[str, str]:
    files: dict[str, list[Document]] = {}
    order: list[tuple[str, str]] = []
    for d in export.documents:
        key = (d.group, d.kind)
        if key not in order:
            order.append(key)
    for d in export.documents:
        index = order.index((d.group, d.kind)) + 1
        files.setdefault(file_name(index, d), []).append(d)
    out: dict[str, str] = {}
    for name, docs in files.items():
        part = Export(docs)
        out[name] = header_text(part) + "".join(document_text(d) for d in docs)
    return out
