"""The Node authorizer: a node agent reads only the secrets, config maps, claims and volumes
of its own pods, asks tokens only for their service accounts, and lists or watches only its
own pods and the local volumes it looks after.

As Kubernetes' (plugin/pkg/auth/authorizer/node): a member of ``system:nodes`` acting as
``system:node:<name>`` may ``get`` a Secret, ConfigMap or PersistentVolumeClaim only when a
pod bound to that node (``spec.nodeName``) references it, through a volume (also inside a
projected volume; a claim by ``persistentVolumeClaim.claimName`` or as a generic ephemeral
volume), an env ``valueFrom``, an ``envFrom`` or an ``imagePullSecrets`` entry, and a
PersistentVolume when such a claim is bound to it. A list or watch of them, which would
reveal every one in a namespace, is refused. It may ``create`` the ``token`` subresource of a
ServiceAccount only when a pod bound to it runs as that service account; NodeRestriction
(node.py) then requires the token to be bound to such a pod. Everything else a node reads or writes is left
to RBAC (the ``system:node`` role) and NodeRestriction, except listing and watching pods:
allowed only with the field selector ``spec.nodeName=<the node>``, as Kubernetes' Node
authorizer does (AuthorizeNodeWithSelectors), so a node cannot read the pods of the whole
cluster.

Volumes that live on the node (their node affinity names it: what the local-path
provisioner makes) are the node's to clean up when they are deleted: it may get and update
them (NodeRestriction lets the update only remove finalizers), list and watch them with the
label selector ``gpufleet.io/local-path-node=<the node>``, and get the StorageClass one of
them names (to learn where the class keeps its volumes).

Kubernetes keeps a graph that informers update, so a decision can lag behind a binding or a
deletion. Here each decision reads the store as of that request: the authorizer keeps, per
namespace, which objects each bound pod references, and before deciding brings it up to the
store's current revision from the store's own event history (a full read of the namespace's
pods the first time, or when that history was compacted away). bench/node_authz_bench.py
prints what a get costs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api import storage
from gpufleet.api.selectors import SelectorError, parse_field_selector, parse_label_selector
from gpufleet.apiserver.auth.rbac import Attributes, Decision
from gpufleet.store import base as store_base

# The kinds a node reaches only through its pods: resource -> what a pod calls them.
GRAPH_RESOURCES = ("secrets", "configmaps", "persistentvolumeclaims")
VOLUMES = "persistentvolumes"
CLAIMS = "persistentvolumeclaims"
CLASSES = "storageclasses.storage.k8s.io"

# Volume sources that name a Secret under a key of their own (Kubernetes' VisitPodSecretNames).
_VOLUME_SECRET_REFS: dict[str, tuple[str, str]] = {
    "azureFile": ("secretName", ""),
    "cephfs": ("secretRef", "name"),
    "cinder": ("secretRef", "name"),
    "flexVolume": ("secretRef", "name"),
    "iscsi": ("secretRef", "name"),
    "rbd": ("secretRef", "name"),
    "scaleIO": ("secretRef", "name"),
    "storageos": ("secretRef", "name"),
    "csi": ("nodePublishSecretRef", "name"),
}


def _containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(key) or []:
            if isinstance(c, dict):
                yield c


def _dicts(items: Any) -> Iterable[dict[str, Any]]:
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _sub(obj: dict[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def pod_references(pod: dict[str, Any]) -> dict[str, set[str]]:
    """The names of the secrets, config maps, volume claims and service account ``pod``
    needs, by resource."""
    secrets: set[str] = set()
    configmaps: set[str] = set()
    claims: set[str] = set()
    spec = _sub(pod, "spec")
    pod_name = _sub(pod, "metadata").get("name") or ""
    for ref in _dicts(spec.get("imagePullSecrets")):
        secrets.add(ref.get("name") or "")
    for c in _containers(spec):
        for source in _dicts(c.get("envFrom")):
            if "secretRef" in source:
                secrets.add(_sub(source, "secretRef").get("name") or "")
            if "configMapRef" in source:
                configmaps.add(_sub(source, "configMapRef").get("name") or "")
        for var in _dicts(c.get("env")):
            value_from = _sub(var, "valueFrom")
            if "secretKeyRef" in value_from:
                secrets.add(_sub(value_from, "secretKeyRef").get("name") or "")
            if "configMapKeyRef" in value_from:
                configmaps.add(_sub(value_from, "configMapKeyRef").get("name") or "")
    for vol in _dicts(spec.get("volumes")):
        if "secret" in vol:
            secrets.add(_sub(vol, "secret").get("secretName") or "")
        if "configMap" in vol:
            configmaps.add(_sub(vol, "configMap").get("name") or "")
        if "persistentVolumeClaim" in vol:
            claims.add(_sub(vol, "persistentVolumeClaim").get("claimName") or "")
        if "ephemeral" in vol and pod_name:
            # The claim an ephemeral volume makes is named <pod>-<volume>.
            claims.add(f"{pod_name}-{vol.get('name') or ''}")
        for source in _dicts(_sub(vol, "projected").get("sources")):
            if "secret" in source:
                secrets.add(_sub(source, "secret").get("name") or "")
            if "configMap" in source:
                configmaps.add(_sub(source, "configMap").get("name") or "")
        for kind, (key, inner) in _VOLUME_SECRET_REFS.items():
            ref = _sub(vol, kind).get(key)
            name = (ref.get(inner) if isinstance(ref, dict) else None) if inner else ref
            if isinstance(name, str):
                secrets.add(name)
    secrets.discard("")
    configmaps.discard("")
    claims.discard("")
    claims |= set(storage.pod_claim_names(pod))
    account = spec.get("serviceAccountName") or spec.get("serviceAccount")
    return {"secrets": secrets, "configmaps": configmaps, "persistentvolumeclaims": claims,
            "serviceaccounts": {account} if isinstance(account, str) and account else set()}


def _selects_node(field_selector: str, node: str) -> bool:
    try:
        selector = parse_field_selector(field_selector)
    except SelectorError:
        return False
    return any(r.field == "spec.nodeName" and r.operator == "=" and r.value == node
               for r in selector.requirements)


def _selects_local_volumes(label_selector: str, node: str) -> bool:
    try:
        selector = parse_label_selector(label_selector)
    except SelectorError:
        return False
    return selector.requires_exact_match(storage.LOCAL_PATH_NODE_LABEL) == node


def _no_relationship(node: str) -> Decision:
    return Decision(False, f"no relationship found between node '{node}' and this object")


@dataclass
class _Namespace:
    """What the bound pods of one namespace reference, as of store ``revision``."""

    revision: int
    node_of: dict[str, str] = field(default_factory=dict)  # pod -> node
    refs: dict[str, dict[str, dict[str, set[str]]]] = field(default_factory=dict)  # node -> pod -> refs

    def put(self, pod: dict[str, Any]) -> None:
        name = _sub(pod, "metadata").get("name") or ""
        self.remove(name)
        node = _sub(pod, "spec").get("nodeName")
        if isinstance(node, str) and node:
            self.node_of[name] = node
            self.refs.setdefault(node, {})[name] = pod_references(pod)

    def remove(self, name: str) -> None:
        node = self.node_of.pop(name, None)
        if node is not None:
            pods = self.refs.get(node, {})
            pods.pop(name, None)
            if not pods:
                self.refs.pop(node, None)

    def references(self, node: str, resource: str, name: str) -> bool:
        return any(name in refs[resource] for refs in self.refs.get(node, {}).values())


class NodeAuthorizer:
    """Decides a node's requests for secrets, config maps, claims, volumes and storage
    classes, and its lists and watches of pods; has no opinion on the rest (``decide``
    returns None), which RBAC then decides."""

    def __init__(self, store: store_base.Store) -> None:
        self.store = store
        self._namespaces: dict[str, _Namespace] = {}

    async def decide(self, node: str, attrs: Attributes) -> Decision | None:
        if not attrs.is_resource:
            return None
        if attrs.group == "storage.k8s.io" and attrs.resource == "storageclasses":
            return await self._storage_class(node, attrs)
        if attrs.group != "":
            return None
        if attrs.resource == VOLUMES:
            return await self._volume(node, attrs)
        if attrs.resource == "pods" and not attrs.subresource and attrs.verb in ("list", "watch"):
            if _selects_node(attrs.field_selector, node):
                return Decision(True, f"node '{node}' lists its own pods")
            return Decision(False, "can only list/watch pods with spec.nodeName field selector")
        if attrs.resource == "serviceaccounts":
            return await self._create_token(node, attrs)
        if attrs.resource not in GRAPH_RESOURCES:
            return None
        if attrs.verb != "get" or not attrs.name:
            return Decision(False, "can only get individual resources of this type")
        if attrs.subresource:
            return Decision(False, "cannot get subresource")
        if not attrs.namespace:
            return Decision(False, "can only read namespaced object of this type")
        if await self.references(node, attrs.resource, attrs.namespace, attrs.name):
            return Decision(True, f"node '{node}' runs a pod that references this object")
        return _no_relationship(node)

    async def _create_token(self, node: str, attrs: Attributes) -> Decision:
        if attrs.verb != "create" or not attrs.name:
            return Decision(False, "can only create tokens for individual service accounts")
        if attrs.subresource != "token":
            return Decision(False, "can only create token subresource of serviceaccount")
        if attrs.namespace and await self.references(node, "serviceaccounts", attrs.namespace, attrs.name):
            return Decision(True, f"node '{node}' runs a pod as this service account")
        return _no_relationship(node)

    async def _volume(self, node: str, attrs: Attributes) -> Decision:
        if attrs.subresource:
            return Decision(False, "cannot get subresource")
        if attrs.verb in ("list", "watch"):
            if _selects_local_volumes(attrs.label_selector, node):
                return Decision(True, f"node '{node}' lists the local volumes it cleans up")
            return Decision(False, f"can only list/watch persistentvolumes with the label selector "
                                   f"{storage.LOCAL_PATH_NODE_LABEL}={node}")
        if attrs.verb not in ("get", "update") or not attrs.name:
            return Decision(False, "can only get individual persistentvolumes, or update the ones on this node")
        try:
            pv = await self.store.get(VOLUMES, "", attrs.name)
        except store_base.NotFound:
            return _no_relationship(node)
        if storage.pinned_to(pv, node):
            return Decision(True, f"persistentvolume '{attrs.name}' lives on node '{node}'")
        if attrs.verb == "get" and await self._claimed_here(node, pv):
            return Decision(True, f"node '{node}' runs a pod whose claim is bound to this volume")
        return _no_relationship(node)

    async def _claimed_here(self, node: str, pv: dict[str, Any]) -> bool:
        ref = _sub(_sub(pv, "spec"), "claimRef")
        namespace, claim = ref.get("namespace") or "", ref.get("name") or ""
        if not namespace or not claim or not await self.references(node, CLAIMS, namespace, claim):
            return False
        try:
            pvc = await self.store.get(CLAIMS, namespace, claim)
        except store_base.NotFound:
            return False
        return _sub(pvc, "spec").get("volumeName") == _sub(pv, "metadata").get("name")

    async def _storage_class(self, node: str, attrs: Attributes) -> Decision:
        if attrs.verb != "get" or not attrs.name or attrs.subresource:
            return Decision(False, "can only get individual storageclasses")
        for pv in (await self.store.list(VOLUMES, None)).items:
            if storage.volume_class(pv) == attrs.name and storage.pinned_to(pv, node):
                return Decision(True, f"a volume on node '{node}' is of this class")
        return _no_relationship(node)

    async def references(self, node: str, resource: str, namespace: str, name: str) -> bool:
        """Whether a pod bound to ``node`` in ``namespace`` references ``resource``/``name``
        now (a pod reaches only objects of its own namespace)."""
        return (await self._current(namespace)).references(node, resource, name)

    async def _current(self, namespace: str) -> _Namespace:
        known = self._namespaces.get(namespace)
        if known is not None:
            now = await self.store.revision()
            if now <= known.revision:
                return known
            try:
                events = await self.store.history("pods", namespace, known.revision, now)
            except store_base.Expired:
                events = None
            if events is not None:
                # Another request may have moved it on meanwhile: apply only what is newer.
                for ev in events:
                    if ev.revision <= known.revision:
                        continue
                    if ev.type == "DELETED":
                        known.remove(ev.name)
                    else:
                        known.put(ev.object)
                known.revision = max(known.revision, now)
                return known
        listed = await self.store.list("pods", namespace)
        fresh = _Namespace(listed.revision)
        for pod in listed.items:
            fresh.put(pod)
        known = self._namespaces.get(namespace)
        if known is None or known.revision < fresh.revision:
            self._namespaces[namespace] = fresh
            return fresh
        return known
