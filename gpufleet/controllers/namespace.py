"""Namespace lifecycle: a deleted namespace is emptied, then released.

The API server marks a deleted Namespace Terminating (its spec.finalizers hold "kubernetes").
This controller deletes every namespaced object in it; once nothing is left it removes its
finalizer through the /finalize subresource and the API server deletes the Namespace.

What "every namespaced object" is comes from the API's discovery, as kube-controller-manager's
namespace controller finds it: the built-in kinds and those CustomResourceDefinitions declare,
each in its preferred version. If discovery fails, the kinds this client knows are emptied
and the namespace is not released. While it is emptied, its status conditions say what is
left, as Kubernetes' namespace deleter reports it: NamespaceDeletionDiscoveryFailure,
NamespaceDeletionContentFailure, NamespaceContentRemaining and NamespaceFinalizersRemaining
(``True`` with the failure's reason and what remains, ``False`` once resolved).

The decisions are ``decide_contents`` (the namespace and what it still holds in; the deletes
and when to look again out), ``tally`` and ``decide_conditions`` (what is left, and the status
conditions it makes), and ``decide_finalize`` (the body of the /finalize write).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.api.k8s import Namespace
from gpufleet.api.registry import ResourceType
from gpufleet.client import discovery
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import ApiError, NotFound
from gpufleet.controllers.actions import Actions, Delete
from gpufleet.controllers.base import KeyedController

log = logging.getLogger(__name__)

FINALIZER = "kubernetes"
# Graceful pod deletions and finalizers take their time: how soon to look again.
RECHECK_SECONDS = 1.0

DISCOVERY_FAILURE = "NamespaceDeletionDiscoveryFailure"
CONTENT_FAILURE = "NamespaceDeletionContentFailure"
CONTENT_REMAINING = "NamespaceContentRemaining"
FINALIZERS_REMAINING = "NamespaceFinalizersRemaining"
# The conditions this controller keeps, and what each says when nothing is wrong.
_OK = {
    DISCOVERY_FAILURE: ("ResourcesDiscovered", "All resources successfully discovered"),
    CONTENT_FAILURE: ("ContentDeleted", "All content successfully deleted, may be waiting on finalization"),
    CONTENT_REMAINING: ("ContentRemoved", "All content successfully removed"),
    FINALIZERS_REMAINING: ("ContentHasNoFinalizers", "All content-preserving finalizers finished"),
}


def decide_contents(namespace: str, contents: Sequence[tuple[Any, dict[str, Any]]]) -> Actions:
    """Every object (resource type, object) still in the terminating ``namespace`` deleted in
    the background, but those being deleted already; looked at again while any is left."""
    actions = Actions(reason="Empty" if not contents else "Emptying")
    for rt, obj in contents:
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        actions.deletes.append(Delete(rt, meta["name"], namespace, propagation_policy="Background"))
    if contents:
        actions.requeue(RECHECK_SECONDS)
    return actions


def _resource_name(rt: Any) -> str:
    # Kubernetes writes "<resource>.<group>", so "pods." for the core group.
    return f"{rt.plural}.{rt.group}" if isinstance(rt, ResourceType) else str(rt)


def tally(remaining: Sequence[tuple[Any, dict[str, Any]]]) -> tuple[dict[str, int], dict[str, int]]:
    """What is left: objects per resource ("widgets.example.com") and per finalizer."""
    by_resource: dict[str, int] = {}
    by_finalizer: dict[str, int] = {}
    for rt, obj in remaining:
        name = _resource_name(rt)
        by_resource[name] = by_resource.get(name, 0) + 1
        for f in (obj.get("metadata") or {}).get("finalizers") or []:
            by_finalizer[f] = by_finalizer.get(f, 0) + 1
    return by_resource, by_finalizer


def decide_conditions(previous: Sequence[Mapping[str, Any]], *, now: str, discovery_error: str | None = None,
                      errors: Sequence[str] = (), remaining: Mapping[str, int] | None = None,
                      finalizers: Mapping[str, int] | None = None) -> list[dict[str, Any]] | None:
    """The namespace's conditions once this look is recorded (None when they stay as they are):
    each of the four this controller keeps True with what went wrong or remains, else False."""
    failing: dict[str, tuple[str, str]] = {}
    if discovery_error:
        failing[DISCOVERY_FAILURE] = ("DiscoveryFailed", discovery_error)
    if errors:
        msgs = sorted(errors)
        failing[CONTENT_FAILURE] = ("ContentDeletionFailed",
                                    f"Failed to delete all resource types, {len(msgs)} remaining: {', '.join(msgs)}")
    left = sorted(f"{r} has {n} resource instances" for r, n in (remaining or {}).items() if n)
    if left:
        failing[CONTENT_REMAINING] = ("SomeResourcesRemain", f"Some resources are remaining: {', '.join(left)}")
    held = sorted(f"{f} in {n} resource instances" for f, n in (finalizers or {}).items() if n)
    if held:
        failing[FINALIZERS_REMAINING] = ("SomeFinalizersRemain",
                                         f"Some content in the namespace has finalizers remaining: {', '.join(held)}")
    out = [dict(c) for c in previous]
    changed = False
    for type_, ok in _OK.items():
        status, (reason, message) = ("True", failing[type_]) if type_ in failing else ("False", ok)
        old = next((c for c in out if c.get("type") == type_), None)
        if old is None:
            out.append({"type": type_, "status": status, "lastTransitionTime": now, "reason": reason,
                        "message": message})
            changed = True
        elif (old.get("status"), old.get("reason"), old.get("message")) != (status, reason, message):
            if old.get("status") != status:
                old["lastTransitionTime"] = now
            old.update(status=status, reason=reason, message=message)
            changed = True
    return out if changed else None


def decide_finalize(ns: Any) -> dict[str, Any] | None:
    """The Namespace without this controller's finalizer (the body of its /finalize write),
    None when it does not hold it."""
    if ns.spec is None or FINALIZER not in (ns.spec.finalizers or []):
        return None
    body = ns.to_dict()
    body["spec"]["finalizers"] = [f for f in ns.spec.finalizers if f != FINALIZER]
    return body


def _deletable(rt: ResourceType) -> bool:
    return rt.namespaced and "list" in rt.verbs and "delete" in rt.verbs


class NamespaceController(KeyedController):
    name = "namespace"
    model = Namespace

    async def _resource_types(self) -> tuple[list[ResourceType], str | None]:
        """The namespaced kinds to empty, from discovery (the client's own on failure)."""
        try:
            types = await discovery.preferred_resources(self.client)
        except discovery.DiscoveryError as e:
            return [rt for rt in self.client.registry.all() if _deletable(rt)], str(e)
        discovery.learn(self.client, types)
        return [rt for rt in types if _deletable(rt)], None

    async def _contents(self, namespace: str, types: Sequence[ResourceType],
                        errors: list[str]) -> list[tuple[ResourceType, dict[str, Any]]]:
        out = []
        for rt in types:
            try:
                out.extend((rt, obj) for obj in await self.client.list(rt, namespace, raw=True))
            except NotFound:
                continue  # its kind went away meanwhile
            except ApiError as e:
                errors.append(f"failed to list {_resource_name(rt)}: {e}")
        return out

    async def sync(self, key: str, ns: Any | None) -> Requeue | None:
        if ns is None or ns.metadata.deletion_timestamp is None:
            return None
        name = ns.metadata.name
        types, discovery_error = await self._resource_types()
        errors: list[str] = []
        contents = await self._contents(name, types, errors)
        actions = decide_contents(name, contents)
        outcome = await self.act(key, None, actions, raise_errors=False)
        errors.extend(f"failed to delete {_resource_name(d.kind)} {d.name}" for d in outcome.failed)
        remaining: list[tuple[ResourceType, dict[str, Any]]] = []
        if contents:  # what the deletes left (objects held by finalizers or graceful deletion)
            remaining = await self._contents(name, list({rt.key: rt for rt, _ in contents}.values()), errors)
        by_resource, by_finalizer = tally(remaining)
        body = ns.to_dict()
        conditions = decide_conditions((body.get("status") or {}).get("conditions") or [], now=self.now().text,
                                       discovery_error=discovery_error, errors=errors, remaining=by_resource,
                                       finalizers=by_finalizer)
        try:
            if conditions is not None:
                body = {**body, "status": {**(body.get("status") or {}), "conditions": conditions}}
                body = await self.client.update_status(body, raw=True)
            if remaining or errors or discovery_error:
                return Requeue(after=RECHECK_SECONDS)
            final = decide_finalize(Namespace.from_dict(body))
            if final is not None:
                await self.client.raw_request("PUT", f"/api/v1/namespaces/{name}/finalize", json=final)
        except NotFound:
            return None
        except ApiError as e:  # a Conflict: the informer brings the namespace as it is now
            log.info("namespace %s: %s", name, e)
            return Requeue(after=RECHECK_SECONDS)
        return None
