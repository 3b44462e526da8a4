"""{resource}/{name}/status and namespaces/{name}/finalize: parts of the object that a PUT or a
PATCH through them changes alone (kube-apiserver's StatusREST and FinalizeREST)."""

from __future__ import annotations

from typing import Any

from gpufleet.apiserver.subresources.base import Subresource


class Status(Subresource):
    """An update changes status only; the rest, metadata included, stays as stored."""

    name = "status"
    owns_part = True

    def merge_for_update(self, obj: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
        new = {k: v for k, v in current.items() if k != "status"}
        if "status" in obj:
            new["status"] = obj["status"]
        new["metadata"] = dict(current.get("metadata", {}))
        return new


class Finalize(Subresource):
    """namespaces/{name}/finalize: an update may change spec.finalizers only."""

    name = "finalize"
    owns_part = True

    def merge_for_update(self, obj: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
        new = dict(current)
        spec = dict(current.get("spec") or {})
        spec["finalizers"] = (obj.get("spec") or {}).get("finalizers") or []
        new["spec"] = spec
        new["metadata"] = dict(current.get("metadata", {}))
        return new
