"""pods/{name}/binding: the scheduler's assignment of a pod to a node; and the namespace's
bindings collection (POST /api/v1/namespaces/{ns}/bindings), which takes one Binding, as in
Kubernetes, or a List of them bound in one store transaction (a gang's members at once)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gpufleet.api.registry import ResourceType
from gpufleet.api.validation.names import is_dns1123_subdomain
from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.decoding import parse_body
from gpufleet.apiserver.errors import ApiException, bad_request, conflict, invalid
from gpufleet.apiserver.genericregistry import GenericRegistry, rv
from gpufleet.apiserver.subresources.base import Subresource
from gpufleet.store import base as store_base
from gpufleet.utils.clock import rfc3339

if TYPE_CHECKING:
    from gpufleet.apiserver.handlers.scope import Scope
    from gpufleet.utils.http import RawResponse


_SUCCESS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
# Compare-and-swap retries when a pod changes between the read and the write.
_ATTEMPTS = 10


@dataclass(frozen=True)
class _Request:
    """A checked Binding: the node, the pod UID it expects (if any) and its annotations."""

    name: str
    node: str
    uid: str | None
    annotations: dict[str, str]


def _check(rt: ResourceType, name: str, binding: Any) -> _Request:
    """The Binding's shape, as kube-apiserver's binding REST checks it."""
    if not isinstance(binding, dict) or not isinstance(binding.get("target"), dict):
        raise bad_request("a Binding needs target.name: the node to bind the pod to")
    node = binding["target"].get("name")
    if node is not None and not isinstance(node, str):
        raise bad_request(f"target.name: Invalid value: {node!r}: must be a node name")
    if not node:
        raise invalid(rt, name, [{"reason": "FieldValueRequired", "field": "target.name",
                                  "message": "Required value"}])
    bad_name = is_dns1123_subdomain(node)
    if bad_name:  # it becomes the pod's spec.nodeName, which must be a node's name
        raise invalid(rt, name, [{"reason": "FieldValueInvalid", "field": "target.name",
                                  "message": f"Invalid value: {json.dumps(node)}: {'; '.join(bad_name)}"}])
    kind = binding["target"].get("kind")
    if kind not in (None, "", "Node"):
        raise invalid(rt, name, [{"reason": "FieldValueNotSupported", "field": "target.kind",
                                  "message": f'Unsupported value: {json.dumps(kind)}: supported values: "Node"'}])
    bmeta = binding.get("metadata")
    if bmeta is not None and not isinstance(bmeta, dict):
        raise bad_request("metadata: must be an object")
    uid = (bmeta or {}).get("uid")
    if uid is not None and not isinstance(uid, str):
        raise bad_request(f"metadata.uid: Invalid value: {uid!r}: must be a string")
    annotations = (bmeta or {}).get("annotations") or {}
    if not isinstance(annotations, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
        raise bad_request("metadata.annotations: must be a map of strings to strings")
    return _Request(name, node, uid or None, annotations)


def _bound(generic: GenericRegistry, rt: ResourceType, pod: dict[str, Any], req: _Request) -> dict[str, Any]:
    """The pod with the binding applied: spec.nodeName (once), PodScheduled, and the
    Binding's annotations in the same write; a conflict when it cannot be bound."""
    meta = pod["metadata"]
    if req.uid and req.uid != meta.get("uid"):
        raise conflict(rt, req.name, "the pod was replaced since the binding was made")
    if meta.get("deletionTimestamp"):
        raise conflict(rt, req.name, "pod is being deleted, cannot be assigned to a host")
    if (pod.get("spec") or {}).get("nodeName"):
        raise conflict(rt, req.name, f"pod {req.name} is already assigned to node "
                                     f"\"{pod['spec']['nodeName']}\"")
    new = orjson.loads(orjson.dumps(pod))
    new["spec"]["nodeName"] = req.node
    # As kube-apiserver's binding REST: the Binding's annotations land on the pod
    # (the scheduler hands the GPU indices over this way, in the same write).
    if req.annotations:
        new["metadata"].setdefault("annotations", {}).update(req.annotations)
    status = new.setdefault("status", {})
    conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
    conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                  "lastTransitionTime": rfc3339(generic.api.clock.now())})
    status["conditions"] = conds
    return new


async def bind(generic: GenericRegistry, rt: ResourceType, ns: str, name: str, binding: Any,
               user: UserInfo) -> dict[str, Any]:
    """Sets the pod's spec.nodeName (once) and PodScheduled; the Binding's annotations land
    on the pod in the same write. Answers a Success Status."""
    req = _check(rt, name, binding)
    for _ in range(_ATTEMPTS):
        pod = await generic.get(rt, ns, name)
        new = _bound(generic, rt, pod, req)
        try:
            await generic.store.update(rt.key, ns, name, new, expected_revision=rv(pod))
        except store_base.Conflict:
            continue
        return dict(_SUCCESS)
    raise conflict(rt, name)


def _at(index: int, exc: ApiException) -> ApiException:
    """An item's error, its message and field paths prefixed with ``items[index]``."""
    details = dict(exc.details or {})
    if details.get("causes"):
        details["causes"] = [{**c, "field": f"items[{index}].{c['field']}" if c.get("field") else f"items[{index}]"}
                             for c in details["causes"]]
    return ApiException(exc.code, exc.reason, f"items[{index}]: {exc.message}", details or None, exc.headers)


def _list_items(ns: str, body: Any) -> list[Any]:
    """The Bindings of a request to the namespace's bindings collection: one Binding (which
    names its pod in metadata.name, as Kubernetes' POST .../bindings), or a List of them."""
    if not isinstance(body, dict):
        raise bad_request("the body must be a Binding or a List of Bindings")
    kind = body.get("kind")
    if kind in ("List", "BindingList"):
        items = body.get("items")
        if not isinstance(items, list) or not items:
            raise bad_request("items: a List of Bindings needs at least one item")
    elif kind in (None, "", "Binding"):
        items = [body]
    else:
        raise bad_request(f"kind: Unsupported value: {json.dumps(kind)}: supported values: \"Binding\", \"List\"")
    for i, item in enumerate(items):
        where = f"items[{i}]." if len(items) > 1 or kind in ("List", "BindingList") else ""
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise bad_request(f"{where}metadata.name: Required value: the name of the pod to bind")
        if meta.get("namespace") not in (None, "", ns):
            raise bad_request(f"{where}metadata.namespace: the namespace of the provided object does not "
                              "match the namespace sent on the request")
        if isinstance(item, dict) and item.get("kind") not in (None, "", "Binding"):
            raise bad_request(f"{where}kind: Unsupported value: {json.dumps(item.get('kind'))}: "
                              'supported values: "Binding"')
    return items


async def bind_all(generic: GenericRegistry, rt: ResourceType, ns: str, body: Any,
                   user: UserInfo) -> dict[str, Any]:
    """POST /api/v1/namespaces/{ns}/bindings: every pod a Binding of the body names is bound
    as by its pods/{name}/binding, all in one store transaction, or none is (the first item
    that cannot be bound is the answer, its fields prefixed with items[i]). Each pod's write
    is its own watch event, as if bound one by one."""
    items = _list_items(ns, body)
    many = len(items) > 1 or body.get("kind") in ("List", "BindingList")
    reqs: list[_Request] = []
    for i, item in enumerate(items):
        try:
            reqs.append(_check(rt, item["metadata"]["name"], item))
        except ApiException as exc:
            raise _at(i, exc) if many else exc from None
    names = [r.name for r in reqs]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise bad_request(f"items: pod {json.dumps(twice)} is named by more than one Binding")
    for _ in range(_ATTEMPTS):
        updates = []
        for i, req in enumerate(reqs):
            try:
                pod = await generic.get(rt, ns, req.name)
                updates.append(store_base.Update(ns, req.name, _bound(generic, rt, pod, req), rv(pod)))
            except ApiException as exc:
                raise _at(i, exc) if many else exc from None
        try:
            await generic.store.update_many(rt.key, updates)
        except store_base.Conflict:
            continue  # one changed since it was read: read them all again
        except store_base.NotFound:
            continue  # one was deleted since: the next read names it
        return dict(_SUCCESS)
    raise conflict(rt, names[0])


class Binding(Subresource):
    name = "binding"
    verbs = frozenset({"create"})

    async def serve(self, scope: Scope) -> RawResponse:
        from gpufleet.apiserver.handlers.scope import json_response

        self.check_verb(scope)
        body = await parse_body(scope.req)
        return json_response(201, await scope.api.bind_pod(scope.rt, scope.ns, scope.name, body, scope.user))
