"""PodNodeName: a pod created with ``spec.nodeName`` set needs the right to bind pods.

A pod that names its node on create is never seen by the scheduler: it goes straight to
that node's agent, past GPU accounting, gang scheduling, quotas of the queueing layer,
taints and node selection. Kubernetes lets anyone who may create pods do that; here, as
binding is what the scheduler does, the requester must be allowed to ``create``
``pods/binding`` in the pod's namespace (RBAC, as for ``POST .../pods/<name>/binding``).
``system:masters`` and the control plane's own components may; the default ``edit`` and
``admin`` roles may not. Refused with 403 naming the field and what to do instead
(leave spec.nodeName empty; choose nodes with nodeSelector or affinity). A node agent's
mirror pods of itself (its GPU validation pods, see NodeRestriction) are the exception.

The same holds for the annotation ``gpufleet.io/rendezvous-port``, with which the PyTorchJob
controller pins its leader's port on the node (a hostPort by another name): only the
control plane sets it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from gpufleet.api.kubeflow import RENDEZVOUS_PORT_ANNOTATION
from gpufleet.apiserver.admission import AdmissionContext, UserInfo
from gpufleet.apiserver.admission.serviceaccount import MIRROR_POD_ANNOTATION
from gpufleet.apiserver.auth.rbac import Attributes, Decision
from gpufleet.apiserver.auth.tokens import node_name_of
from gpufleet.apiserver.errors import ApiException

Decide = Callable[[UserInfo, Attributes], Awaitable[Decision]]


class PodNodeNameRestriction:
    name = "PodNodeName"

    def __init__(self, decide: Decide) -> None:
        self.decide = decide

    async def validate(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if ctx.rt.key != "pods" or ctx.operation != "CREATE" or ctx.subresource:
            return
        node = (obj.get("spec") or {}).get("nodeName")
        pinned = RENDEZVOUS_PORT_ANNOTATION in ((obj.get("metadata") or {}).get("annotations") or {})
        if not node and not pinned:
            return
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if node and not pinned and node_name_of(ctx.user) == node and MIRROR_POD_ANNOTATION in annotations:
            return  # a node's mirror pod of itself (NodeRestriction allows nothing else)
        attrs = Attributes(verb="create", group="", resource="pods", subresource="binding",
                           namespace=ctx.namespace, name=ctx.name)
        if (await self.decide(ctx.user, attrs)).allowed:
            return
        if not node:
            why = (f'the annotation {RENDEZVOUS_PORT_ANNOTATION} is set by the PyTorchJob controller only: User '
                   f'"{ctx.user.name}" cannot create resource "pods/binding" in the namespace "{ctx.namespace}"; '
                   "remove the annotation (a PyTorchJob's leader gets it from the controller)")
            raise ApiException(403, "Forbidden", f'pods "{ctx.name}" is forbidden: {why}', {
                "name": ctx.name, "kind": "pods",
                "causes": [{"reason": "FieldValueForbidden", "message": f"Forbidden: {why}",
                            "field": f"metadata.annotations[{RENDEZVOUS_PORT_ANNOTATION}]"}]})
        why = (f"spec.nodeName is set to {json.dumps(node)}, which skips the scheduler: only a user allowed to "
               f'create resource "pods/binding" in the namespace "{ctx.namespace}" may choose a pod\'s node, and '
               f'User "{ctx.user.name}" cannot; leave spec.nodeName empty and choose nodes with spec.nodeSelector '
               "or spec.affinity.nodeAffinity")
        raise ApiException(403, "Forbidden", f'pods "{ctx.name}" is forbidden: {why}', {
            "name": ctx.name, "kind": "pods",
            "causes": [{"reason": "FieldValueForbidden", "field": "spec.nodeName", "message": f"Forbidden: {why}"}]})
