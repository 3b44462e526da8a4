"""networking.k8s.io admission: the default IngressClass, and what NetworkPolicy means here.

- DefaultIngressClass (mutating, as Kubernetes' plugin of that name): an Ingress created
  with neither ``spec.ingressClassName`` nor the ``kubernetes.io/ingress.class`` annotation
  gets the class marked default (annotation ``ingressclass.kubernetes.io/is-default-class:
  "true"``; of several, the newest). At server start the IngressClass ``gpufleet``
  (controller ``gpufleet.io/gateway``: the service gateway serves its Ingresses) is created
  as the default when absent.
- NetworkPolicyNotEnforced (validating): a NetworkPolicy is stored and validated, but no
  part of gpufleet restricts pods' traffic by it; a create or update says so in a Warning.
"""

from __future__ import annotations

from typing import Any

from gpufleet.apiserver.admission import AdmissionContext
from gpufleet.apiserver.errors import ApiException

INGRESS_CLASSES = "ingressclasses.networking.k8s.io"
INGRESSES = "ingresses.networking.k8s.io"
NETWORK_POLICIES = "networkpolicies.networking.k8s.io"
DEFAULT_CLASS_ANNOTATION = "ingressclass.kubernetes.io/is-default-class"
LEGACY_CLASS_ANNOTATION = "kubernetes.io/ingress.class"
GATEWAY_CLASS = "gpufleet"
GATEWAY_CONTROLLER = "gpufleet.io/gateway"
NOT_ENFORCED_WARNING = ("NetworkPolicy is stored but not enforced by gpufleet: pods' traffic is not restricted "
                        "by it (every pod can reach every other pod and be reached through its Services)")


def gateway_ingress_class() -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": GATEWAY_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
            "spec": {"controller": GATEWAY_CONTROLLER}}


class DefaultIngressClass:
    name = "DefaultIngressClass"

    async def start(self, server: Any) -> None:
        rt = server.registry.by_key(INGRESS_CLASSES)
        if rt is None:
            return
        try:
            await server.create_object(rt, "", gateway_ingress_class())
        except ApiException as e:
            if e.code != 409:
                raise

    async def admit(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if ctx.operation != "CREATE" or ctx.subresource or ctx.rt.key != INGRESSES:
            return
        spec = obj.setdefault("spec", {})
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if spec.get("ingressClassName") or annotations.get(LEGACY_CLASS_ANNOTATION):
            return
        defaults = [ic for ic in (await ctx.server.store.list(INGRESS_CLASSES, None)).items
                    if ((ic.get("metadata") or {}).get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true"]
        if defaults:
            newest = max(defaults, key=lambda ic: (ic["metadata"].get("creationTimestamp") or "",
                                                   ic["metadata"]["name"]))
            spec["ingressClassName"] = newest["metadata"]["name"]


class NetworkPolicyNotEnforced:
    name = "NetworkPolicyNotEnforced"

    async def validate(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if ctx.rt.key == NETWORK_POLICIES and ctx.operation in ("CREATE", "UPDATE") and not ctx.subresource:
            ctx.warnings.append(NOT_ENFORCED_WARNING)
