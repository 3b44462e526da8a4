"""pods/{name}/binding: the scheduler's assignment of a pod to a node."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import orjson

from gpufleet.api.registry import ResourceType
from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.decoding import parse_body
from gpufleet.apiserver.errors import bad_request, conflict, invalid
from gpufleet.apiserver.genericregistry import GenericRegistry, rv
from gpufleet.apiserver.subresources.base import Subresource
from gpufleet.store import base as store_base
from gpufleet.utils.clock import rfc3339

if TYPE_CHECKING:
    from gpufleet.apiserver.handlers.scope import Scope
    from gpufleet.utils.http import RawResponse


async def bind(generic: GenericRegistry, rt: ResourceType, ns: str, name: str, binding: Any,
               user: UserInfo) -> dict[str, Any]:
    """Sets the pod's spec.nodeName (once) and PodScheduled; the Binding's annotations land
    on the pod in the same write. Answers a Success Status."""
    if not isinstance(binding, dict) or not isinstance(binding.get("target"), dict):
        raise bad_request("a Binding needs target.name: the node to bind the pod to")
    node = binding["target"].get("name")
    if node is not None and not isinstance(node, str):
        raise bad_request(f"target.name: Invalid value: {node!r}: must be a node name")
    if not node:
        raise invalid(rt, name, [{"reason": "FieldValueRequired", "field": "target.name",
                                  "message": "Required value"}])
    kind = binding["target"].get("kind")
    if kind not in (None, "", "Node"):
        raise invalid(rt, name, [{"reason": "FieldValueNotSupported", "field": "target.kind",
                                  "message": f'Unsupported value: {json.dumps(kind)}: supported values: "Node"'}])
    bmeta = binding.get("metadata")
    if bmeta is not None and not isinstance(bmeta, dict):
        raise bad_request("metadata: must be an object")
    for _ in range(10):
        pod = await generic.get(rt, ns, name)
        meta = pod["metadata"]
        uid = (binding.get("metadata") or {}).get("uid")
        if uid is not None and not isinstance(uid, str):
            raise bad_request(f"metadata.uid: Invalid value: {uid!r}: must be a string")
        if uid and uid != meta.get("uid"):
            raise conflict(rt, name, "the pod was replaced since the binding was made")
        if meta.get("deletionTimestamp"):
            raise conflict(rt, name, "pod is being deleted, cannot be assigned to a host")
        if (pod.get("spec") or {}).get("nodeName"):
            raise conflict(rt, name, f"pod {name} is already assigned to node "
                                     f"\"{pod['spec']['nodeName']}\"")
        new = orjson.loads(orjson.dumps(pod))
        new["spec"]["nodeName"] = node
        # As kube-apiserver's binding REST: the Binding's annotations land on the pod
        # (the scheduler hands the GPU indices over this way, in the same write).
        annotations = (bmeta or {}).get("annotations")
        if annotations:
            if not isinstance(annotations, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
                raise bad_request("metadata.annotations: must be a map of strings to strings")
            new["metadata"].setdefault("annotations", {}).update(annotations)
        status = new.setdefault("status", {})
        conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                      "lastTransitionTime": rfc3339(generic.api.clock.now())})
        status["conditions"] = conds
        try:
            await generic.store.update(rt.key, ns, name, new, expected_revision=rv(pod))
        except store_base.Conflict:
            continue
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    raise conflict(rt, name)


class Binding(Subresource):
    name = "binding"
    verbs = frozenset({"create"})

    async def serve(self, scope: Scope) -> RawResponse:
        from gpufleet.apiserver.handlers.scope import json_response

        self.check_verb(scope)
        body = await parse_body(scope.req)
        return json_response(201, await scope.api.bind_pod(scope.rt, scope.ns, scope.name, body, scope.user))
