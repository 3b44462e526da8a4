"""{resource}/{name}/scale: the autoscaling/v1 Scale view of a workload's replicas.

A kind may keep its replicas elsewhere, as a CRD's scale subresource declares
(rt.extra["scale"]: specReplicasPath, statusReplicasPath, labelSelectorPath).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import orjson

from gpufleet.api.registry import ResourceType
from gpufleet.api.selectors import LabelSelector, SelectorError
from gpufleet.apiserver.decoding import parse_body
from gpufleet.apiserver.errors import bad_request, conflict, invalid, method_not_allowed
from gpufleet.apiserver.subresources.base import Subresource

if TYPE_CHECKING:
    from gpufleet.apiserver.handlers.scope import Scope
    from gpufleet.utils.http import RawResponse


def _dotted(obj: dict[str, Any], path: str) -> Any:
    """The value at a dotted path ('spec.replicas'), or None where the path runs out."""
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _selector_string(obj: dict[str, Any]) -> str:
    sel = (obj.get("spec") or {}).get("selector")
    if isinstance(sel, dict):
        try:
            return str(LabelSelector.from_dict(sel))
        except (SelectorError, TypeError, ValueError):
            return ""
    return ""


def scale_view(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    """The Scale of ``obj``."""
    meta = obj.get("metadata", {})
    paths = rt.extra.get("scale") or {}
    spec_path = paths.get("specReplicasPath", "spec.replicas")
    status_path = paths.get("statusReplicasPath", "status.replicas")
    selector_path = paths.get("labelSelectorPath")
    selector = _dotted(obj, selector_path) if selector_path else _selector_string(obj)
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                     if k in meta},
        "spec": {"replicas": _dotted(obj, spec_path) or 0},
        "status": {"replicas": _dotted(obj, status_path) or 0, "selector": selector or ""},
    }


class Scale(Subresource):
    name = "scale"
    verbs = frozenset({"get", "update", "patch"})

    async def serve(self, scope: Scope) -> RawResponse:
        from gpufleet.apiserver.handlers.patch import patch
        from gpufleet.apiserver.handlers.scope import json_response

        rt = scope.rt
        current = await scope.generic.get(rt, scope.ns, scope.name)
        self.check_verb(scope)
        # As before the write options were read here: dryRun=All alone makes a dry run.
        scope = dataclasses.replace(scope, dry_run=scope.req.param("dryRun") == "All")
        if scope.info.verb == "get":
            return json_response(200, scale_view(rt, current))
        if scope.info.verb == "update":
            body = await parse_body(scope.req)
            if not isinstance(body, dict):
                raise bad_request("the request body must be a Scale object")
            return json_response(200, await self.write(scope, body, current))
        if scope.info.verb == "patch":
            return await patch(scope, view=lambda obj: scale_view(rt, obj), write=self.write)
        raise method_not_allowed()

    async def write(self, scope: Scope, scale: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
        """Stores the replicas of ``scale`` in the object; the Scale as stored."""
        rt, name = scope.rt, scope.name
        if not isinstance(scale.get("spec"), dict) or not isinstance(scale.get("metadata") or {}, dict):
            raise bad_request("a Scale needs spec.replicas and, if given, an object for metadata")
        replicas = scale["spec"].get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise invalid(rt, name, [{"reason": "FieldValueInvalid", "field": "spec.replicas",
                                      "message": f"Invalid value: {replicas!r}: must be greater than or equal to 0"}])
        want_rv = (scale.get("metadata") or {}).get("resourceVersion")
        if want_rv and want_rv != current["metadata"].get("resourceVersion"):
            raise conflict(rt, name)
        new = orjson.loads(orjson.dumps(current))
        *parents, leaf = ((rt.extra.get("scale") or {}).get("specReplicasPath") or "spec.replicas").split(".")
        target = new
        for part in parents:
            if not isinstance(target.get(part), dict):
                raise invalid(rt, name, [{"reason": "FieldValueRequired", "field": ".".join(parents),
                                          "message": "Required value: the object has nothing to scale there"}])
            target = target[part]
        target[leaf] = replicas
        updated, _ = await scope.generic.update(rt, scope.ns, name, new, user=scope.user, dry_run=scope.dry_run,
                                                current=current)
        return scale_view(rt, updated)
