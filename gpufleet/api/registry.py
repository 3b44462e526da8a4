"""The kind registry: group/version/kind <-> resource (plural), scope, model and subresources.

Every layer that needs to turn a URL, a manifest's apiVersion/kind or a short name into a
resource type asks this module. Models are resolved lazily by dotted path so that this table
stays importable (and cheap) on its own.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    model_path: str
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ("status",)
    verbs: tuple[str, ...] = (
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    )
    # Field labels a fieldSelector may use besides metadata.name / metadata.namespace.
    field_labels: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # Set on a version served from another version's storage: the stored objects are of
    # `storage_version`, and `conversion_path` ("module:attr") names the
    # gpufleet.api.conversion.Conversion between the two.
    storage_version: str = ""
    conversion_path: str = ""
    # Set on a version served from another group's storage (events.k8s.io/v1 Events are core
    # v1 Events): that group ("" is the core group); None: this one.
    storage_group: str | None = None

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def key(self) -> str:
        """The group-resource string ('pods', 'deployments.apps'): the store's resource key."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def storage_key(self) -> str:
        """The store's resource key of the objects this version serves."""
        group = self.group if self.storage_group is None else self.storage_group
        return f"{self.plural}.{group}" if group else self.plural

    @property
    def storage_api_version(self) -> str:
        group = self.group if self.storage_group is None else self.storage_group
        version = self.storage_version or self.version
        return f"{group}/{version}" if group else version

    @property
    def gvk(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.kind)

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """The REST path of the collection, or of one object (and its subresource)."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            prefix += f"/namespaces/{namespace}"
        out = f"{prefix}/{self.plural}"
        if name is not None:
            out += f"/{name}"
            if subresource:
                out += f"/{subresource}"
        return out

    @cached_property
    def model(self) -> type:
        module, _, attr = self.model_path.partition(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def is_storage(self) -> bool:
        return not self.storage_version

    @cached_property
    def conversion(self) -> Any:
        """The Conversion to and from the storage version (None for a storage version)."""
        if not self.conversion_path:
            return None
        module, _, attr = self.conversion_path.partition(":")
        return getattr(importlib.import_module(module), attr)


_K8S = "gpufleet.api.k8s"
_RBAC = "gpufleet.api.rbac"  # the k8s.py models, with their validation registered

_BUILTIN: list[ResourceType] = [
    # core/v1
    ResourceType("", "v1", "Namespace", "namespaces", False, f"{_K8S}:Namespace", ("ns",),
                 field_labels=("status.phase",), subresources=("status", "finalize")),
    ResourceType("", "v1", "Node", "nodes", False, f"{_K8S}:Node", ("no",),
                 field_labels=("spec.unschedulable",), subresources=("status", "proxy")),
    ResourceType("", "v1", "Pod", "pods", True, f"{_K8S}:Pod", ("po",), ("all",),
                 subresources=("status", "log", "binding", "eviction", "exec", "attach", "portforward", "proxy"),
                 field_labels=("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                               "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
                               "status.podIP", "status.nominatedNodeName")),
    ResourceType("", "v1", "Service", "services", True, f"{_K8S}:Service", ("svc",), ("all",),
                 subresources=("status", "proxy")),
    ResourceType("", "v1", "Endpoints", "endpoints", True, f"{_K8S}:Endpoints", ("ep",), subresources=()),
    ResourceType("", "v1", "Event", "events", True, f"{_K8S}:Event", ("ev",), subresources=(),
                 field_labels=("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                               "involvedObject.uid", "involvedObject.apiVersion",
                               "involvedObject.resourceVersion", "involvedObject.fieldPath",
                               "reason", "reportingComponent", "source", "type")),
    ResourceType("", "v1", "ResourceQuota", "resourcequotas", True, f"{_K8S}:ResourceQuota", ("quota",)),
    ResourceType("", "v1", "LimitRange", "limitranges", True, f"{_K8S}:LimitRange", ("limits",),
                 subresources=()),
    ResourceType("", "v1", "ConfigMap", "configmaps", True, f"{_K8S}:ConfigMap", ("cm",), subresources=()),
    ResourceType("", "v1", "Secret", "secrets", True, f"{_K8S}:Secret", (), subresources=(),
                 field_labels=("type",)),
    ResourceType("", "v1", "ServiceAccount", "serviceaccounts", True, f"{_K8S}:ServiceAccount", ("sa",),
                 subresources=("token",)),
    ResourceType("", "v1", "PersistentVolume", "persistentvolumes", False, f"{_K8S}:PersistentVolume", ("pv",)),
    ResourceType("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True,
                 f"{_K8S}:PersistentVolumeClaim", ("pvc",)),
    # apps/v1
    ResourceType("apps", "v1", "Deployment", "deployments", True, f"{_K8S}:Deployment", ("deploy",),
                 ("all",), subresources=("status", "scale")),
    ResourceType("apps", "v1", "ReplicaSet", "replicasets", True, f"{_K8S}:ReplicaSet", ("rs",), ("all",),
                 subresources=("status", "scale")),
    ResourceType("apps", "v1", "StatefulSet", "statefulsets", True, f"{_K8S}:StatefulSet", ("sts",), ("all",),
                 subresources=("status", "scale")),
    ResourceType("apps", "v1", "DaemonSet", "daemonsets", True, f"{_K8S}:DaemonSet", ("ds",), ("all",)),
    ResourceType("apps", "v1", "ControllerRevision", "controllerrevisions", True, f"{_K8S}:ControllerRevision",
                 subresources=()),
    # batch/v1
    ResourceType("batch", "v1", "Job", "jobs", True, f"{_K8S}:Job", (), ("all",)),
    ResourceType("batch", "v1", "CronJob", "cronjobs", True, f"{_K8S}:CronJob", ("cj",), ("all",)),
    # autoscaling/v2
    ResourceType("autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", True,
                 f"{_K8S}:HorizontalPodAutoscaler", ("hpa",), ("all",)),
    # autoscaling/v1: the same objects, one cpu target (kubectl 1.27-1.32 `autoscale` writes it)
    ResourceType("autoscaling", "v1", "HorizontalPodAutoscaler", "horizontalpodautoscalers", True,
                 "gpufleet.api.autoscaling_v1:HorizontalPodAutoscalerV1", ("hpa",), ("all",),
                 storage_version="v2", conversion_path="gpufleet.api.conversion:HPA_V1"),
    # events.k8s.io/v1: the core v1 Events, in that group's shape (`kubectl events`, `kubectl get
    # events.events.k8s.io`)
    ResourceType("events.k8s.io", "v1", "Event", "events", True, "gpufleet.api.events_v1:EventV1",
                 subresources=(), storage_version="v1", storage_group="",
                 conversion_path="gpufleet.api.events_v1:EVENT_V1"),
    # storage.k8s.io/v1
    ResourceType("storage.k8s.io", "v1", "StorageClass", "storageclasses", False, f"{_K8S}:StorageClass",
                 ("sc",), subresources=()),
    # scheduling.k8s.io/v1
    ResourceType("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", False,
                 f"{_K8S}:PriorityClass", ("pc",), subresources=()),
    # coordination.k8s.io/v1
    ResourceType("coordination.k8s.io", "v1", "Lease", "leases", True, f"{_K8S}:Lease", subresources=()),
    # policy/v1
    ResourceType("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True,
                 f"{_K8S}:PodDisruptionBudget", ("pdb",)),
    # networking.k8s.io/v1 (NetworkPolicy is stored, not enforced: the API warns so)
    ResourceType("networking.k8s.io", "v1", "Ingress", "ingresses", True, f"{_K8S}:Ingress", ("ing",)),
    ResourceType("networking.k8s.io", "v1", "IngressClass", "ingressclasses", False, f"{_K8S}:IngressClass",
                 subresources=()),
    ResourceType("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", True, f"{_K8S}:NetworkPolicy",
                 ("netpol",), subresources=()),
    # discovery.k8s.io/v1 (written by the EndpointSlice controller for Services with a selector)
    ResourceType("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", True, f"{_K8S}:EndpointSlice",
                 subresources=()),
    # rbac.authorization.k8s.io/v1
    ResourceType("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False, f"{_RBAC}:ClusterRole",
                 subresources=()),
    ResourceType("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False,
                 f"{_RBAC}:ClusterRoleBinding", subresources=()),
    ResourceType("rbac.authorization.k8s.io", "v1", "Role", "roles", True, f"{_RBAC}:Role", subresources=()),
    ResourceType("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True, f"{_RBAC}:RoleBinding",
                 subresources=()),
    # kueue.x-k8s.io/v1beta1: team queues
    ResourceType("kueue.x-k8s.io", "v1beta1", "ResourceFlavor", "resourceflavors", False,
                 "gpufleet.api.kueue:ResourceFlavor", ("flavor", "flavors", "rf"), subresources=()),
    ResourceType("kueue.x-k8s.io", "v1beta1", "ClusterQueue", "clusterqueues", False,
                 "gpufleet.api.kueue:ClusterQueue", ("cq",)),
    ResourceType("kueue.x-k8s.io", "v1beta1", "LocalQueue", "localqueues", True,
                 "gpufleet.api.kueue:LocalQueue", ("queue", "queues", "lq")),
    ResourceType("kueue.x-k8s.io", "v1beta1", "Workload", "workloads", True,
                 "gpufleet.api.kueue:Workload", ("wl",)),
    # scheduling.x-k8s.io/v1alpha1 (scheduler-plugins coscheduling)
    ResourceType("scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups", True,
                 "gpufleet.api.podgroup:PodGroup", ("pg", "pgs")),
    # kubeflow.org/v1: distributed training; /scale moves the Workers (upstream's CRD paths)
    ResourceType("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs", True,
                 "gpufleet.api.kubeflow:PyTorchJob", subresources=("status", "scale"),
                 extra={"scale": {"specReplicasPath": "spec.pytorchReplicaSpecs.Worker.replicas",
                                  "statusReplicasPath": "status.replicaStatuses.Worker.active",
                                  "labelSelectorPath": "status.replicaStatuses.Worker.selector"}}),
    # batch.volcano.sh/v1alpha1 and scheduling.volcano.sh/v1beta1: Volcano's Job, Queue and
    # PodGroup (Volcano's short names, less its "pg", which names scheduling.x-k8s.io's here)
    ResourceType("batch.volcano.sh", "v1alpha1", "Job", "jobs", True, "gpufleet.api.volcano:VolcanoJob",
                 ("vcjob", "vj")),
    ResourceType("scheduling.volcano.sh", "v1beta1", "Queue", "queues", False, "gpufleet.api.volcano:Queue",
                 ("q", "queue-v1beta1")),
    ResourceType("scheduling.volcano.sh", "v1beta1", "PodGroup", "podgroups", True,
                 "gpufleet.api.volcano:VolcanoPodGroup", ("podgroup-v1beta1",)),
    # ray.io/v1 (KubeRay): Ray clusters and the jobs run on them
    ResourceType("ray.io", "v1", "RayCluster", "rayclusters", True, "gpufleet.api.ray:RayCluster",
                 categories=("all",)),
    ResourceType("ray.io", "v1", "RayJob", "rayjobs", True, "gpufleet.api.ray:RayJob", categories=("all",)),
    ResourceType("ray.io", "v1", "RayService", "rayservices", True, "gpufleet.api.rayservice:RayService",
                 categories=("all",)),
    # apiextensions.k8s.io/v1: the kinds declared at run time (apiserver/customresources)
    ResourceType("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False,
                 "gpufleet.api.apiextensions:CustomResourceDefinition", ("crd", "crds"), ("api-extensions",)),
]


class Registry:
    """Lookup tables over a set of ResourceTypes; an API server adds its custom resources to its own copy."""

    def __init__(self, types: list[ResourceType] | None = None) -> None:
        self._types: list[ResourceType] = []
        self._served: list[ResourceType] = []  # storage versions, then the versions converted from them
        self._by_gvk: dict[tuple[str, str, str], ResourceType] = {}
        self._by_gvr: dict[tuple[str, str, str], ResourceType] = {}
        self._by_key: dict[str, ResourceType] = {}
        for t in types or []:
            self.register(t)

    def register(self, t: ResourceType) -> None:
        self._by_gvk[t.gvk] = t
        self._by_gvr[(t.group, t.version, t.plural)] = t
        if not t.is_storage:
            self._served.append(t)
            return
        self._types.append(t)
        self._by_key[t.key] = t

    def unregister(self, t: ResourceType) -> None:
        """Stops serving ``t`` (a custom resource's version whose definition changed or went)."""
        if self._by_gvk.get(t.gvk) is t:
            del self._by_gvk[t.gvk]
        if self._by_gvr.get((t.group, t.version, t.plural)) is t:
            del self._by_gvr[(t.group, t.version, t.plural)]
        self._served = [x for x in self._served if x is not t]
        self._types = [x for x in self._types if x is not t]
        if self._by_key.get(t.key) is t:
            del self._by_key[t.key]

    def copy(self) -> Registry:
        """A registry of the same types, to which a server adds its own (custom resources)."""
        return Registry(self.served())

    def all(self) -> list[ResourceType]:
        """One entry per stored resource: its storage version."""
        return list(self._types)

    def served(self) -> list[ResourceType]:
        """Every served group-version-resource: the storage versions, then the converted ones."""
        return self._types + self._served

    def storage_of(self, t: ResourceType) -> ResourceType:
        """The storage version of ``t`` (``t`` itself when it is one)."""
        return self._by_key[t.storage_key] if not t.is_storage else t

    def groups(self) -> dict[str, list[str]]:
        """group -> versions, the storage version of each group first; the core group is ''."""
        out: dict[str, list[str]] = {}
        for t in self.served():
            versions = out.setdefault(t.group, [])
            if t.version not in versions:
                versions.append(t.version)
        return out

    def by_gvk(self, group: str, version: str, kind: str) -> ResourceType | None:
        return self._by_gvk.get((group, version, kind))

    def by_api_version_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        return self._by_gvk.get((group, version, kind))

    def by_resource(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_gvr.get((group, version, plural))

    def by_key(self, key: str) -> ResourceType | None:
        return self._by_key.get(key)

    def for_model(self, model: type) -> ResourceType | None:
        for t in self._types:
            if t.model is model:
                return t
        return None

    def resolve(self, name: str) -> ResourceType | None:
        """What a user types on the command line: 'pods', 'pod', 'po', 'deployments.apps', 'Deployment'."""
        name = name.strip()
        plain, _, group = name.partition(".")
        lowered = plain.lower()
        for t in self._types:
            if group and t.group != group and not t.group.startswith(group):
                continue
            if lowered in (t.plural, t.singular, *t.short_names) or plain == t.kind:
                return t
        return None


REGISTRY = Registry(_BUILTIN)
