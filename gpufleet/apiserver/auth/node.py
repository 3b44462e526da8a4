"""NodeRestriction: a node agent writes only what is its own.

RBAC (the ``system:node`` role) lets every member of ``system:nodes`` write nodes, leases
and pods; this admission plugin narrows that to the agent's own Node (and its status), its
own Lease in kube-node-lease, and the pods bound to it (status, the annotations the agent
records, and the final delete). It creates only mirror pods bound to itself (its GPU
validation pods). A service account token it asks for
(which the Node authorizer allows only for the service accounts of its pods) must be bound
to one of its pods, named with its uid. The Node authorizer lets it update the
PersistentVolumes that live on it; here such an update may only take finalizers away (the
local-path cleanup, once the volume's directory is gone). Other users pass through untouched.
"""

from __future__ import annotations

from typing import Any

from gpufleet.api import storage
from gpufleet.apiserver.admission import AdmissionContext
from gpufleet.apiserver.admission.serviceaccount import MIRROR_POD_ANNOTATION
from gpufleet.apiserver.auth.tokens import node_name_of
from gpufleet.apiserver.errors import ApiException, not_found, qualified
from gpufleet.store import base as store_base

LEASE_NAMESPACE = "kube-node-lease"


def _name(obj: dict[str, Any] | None) -> str:
    return ((obj or {}).get("metadata") or {}).get("name", "")


def _node_of(pod: dict[str, Any] | None) -> str:
    return ((pod or {}).get("spec") or {}).get("nodeName") or ""


def _without_finalizers(obj: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k != "metadata"}
    out["metadata"] = {k: v for k, v in (obj.get("metadata") or {}).items()
                       if k not in ("finalizers", "resourceVersion", "managedFields")}
    return out


def _only_finalizers_removed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    before = set((old.get("metadata") or {}).get("finalizers") or [])
    after = set((new.get("metadata") or {}).get("finalizers") or [])
    return after <= before and _without_finalizers(old) == _without_finalizers(new)


class NodeRestriction:
    name = "NodeRestriction"

    async def validate(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        node = node_name_of(ctx.user)
        if node is None:
            return
        kind = ctx.rt.kind
        target = ctx.name or _name(obj)
        if kind == "Node":
            if target != node:
                self._deny(ctx, target, f'node "{node}" is not allowed to modify node "{target}"')
        elif kind == "Lease":
            if ctx.namespace != LEASE_NAMESPACE or target != node:
                self._deny(ctx, target, f'node "{node}" can only access leases with the name "{node}" '
                                        f'in the "{LEASE_NAMESPACE}" namespace')
        elif kind == "ServiceAccount" and ctx.subresource == "token" and ctx.operation == "CREATE":
            await self._token_request(ctx, node, obj)
        elif kind == "Pod":
            if ctx.operation == "CREATE":
                self._mirror_pod(ctx, node, target, obj)
                return
            bound = _node_of(old if old is not None else obj)
            if bound != node or (ctx.operation == "UPDATE" and _node_of(obj) != node):
                verb = "delete" if ctx.operation == "DELETE" else "update"
                self._deny(ctx, target, f'node "{node}" can only {verb} pods with spec.nodeName set to itself')
        elif kind == "PersistentVolume":
            if ctx.operation != "UPDATE" or old is None or not storage.pinned_to(old, node):
                self._deny(ctx, target, f'node "{node}" can only update persistentvolumes that live on it')
            elif not _only_finalizers_removed(old, obj):
                self._deny(ctx, target, f'node "{node}" may only remove finalizers of persistentvolumes')

    def _mirror_pod(self, ctx: AdmissionContext, node: str, target: str, obj: dict[str, Any]) -> None:
        """As Kubernetes' admitPodCreate: only mirror pods (the agent's own validation pods),
        bound to the node itself, owned by nothing but its Node. What a mirror pod may not
        reference (service accounts, secrets, config maps, claims) the ServiceAccount
        admission refuses."""
        meta = obj.get("metadata") or {}
        if MIRROR_POD_ANNOTATION not in (meta.get("annotations") or {}):
            self._deny(ctx, target, "pod does not have \"kubernetes.io/config.mirror\" annotation, "
                                    f'node "{node}" can only create mirror pods')
        if _node_of(obj) != node:
            self._deny(ctx, target, f'node "{node}" can only create pods with spec.nodeName set to itself')
        owners = meta.get("ownerReferences") or []
        if len(owners) > 1:
            self._deny(ctx, target, f'node "{node}" can only create pods with a single owner reference set to itself')
        for ref in owners:
            if ref.get("apiVersion") != "v1" or ref.get("kind") != "Node" or ref.get("name") != node:
                self._deny(ctx, target, f'node "{node}" can only create pods with an owner reference set to itself')

    async def _token_request(self, ctx: AdmissionContext, node: str, obj: dict[str, Any]) -> None:
        """As Kubernetes' admitServiceAccount: the token must be bound to a pod on this node."""
        ref = (obj.get("spec") or {}).get("boundObjectRef") or {}
        if ref.get("apiVersion") != "v1" or ref.get("kind") != "Pod" or not ref.get("name"):
            self._deny(ctx, ctx.name, "node requested token not bound to a pod")
        if not ref.get("uid"):
            self._deny(ctx, ctx.name, "node requested token with a pod binding without a uid")
        pods = ctx.server.registry.by_key("pods")
        try:
            pod = await ctx.server.store.get("pods", ctx.namespace, ref["name"])
        except store_base.NotFound:
            raise not_found(pods, ref["name"]) from None
        if (pod.get("metadata") or {}).get("uid") != ref["uid"]:
            self._deny(ctx, ctx.name, f"the UID in the bound object reference ({ref['uid']}) does not match the UID "
                                      "in record. The object might have been deleted and then recreated")
        if _node_of(pod) != node:
            self._deny(ctx, ctx.name, "node requested token bound to a pod scheduled on a different node")

    @staticmethod
    def _deny(ctx: AdmissionContext, name: str, why: str) -> None:
        details: dict[str, Any] = {"name": name, "kind": ctx.rt.plural}
        if ctx.rt.group:
            details["group"] = ctx.rt.group
        raise ApiException(403, "Forbidden", f'{qualified(ctx.rt)} "{name}" is forbidden: {why}', details)
