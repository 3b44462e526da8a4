"""Kubernetes' Status error shape, raised inside the server and rendered by the adapters."""

from __future__ import annotations

from typing import Any

from gpufleet.api.registry import ResourceType


class ApiException(Exception):
    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            out["details"] = self.details
        return out


def qualified(rt: ResourceType) -> str:
    """'pods', 'deployments.apps' — how Kubernetes names a resource in messages."""
    return rt.key


def _details(rt: ResourceType, name: str, kind: str | None = None, **more: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "kind": kind or rt.plural}
    if rt.group:
        d["group"] = rt.group
    d.update(more)
    return d


def not_found(rt: ResourceType, name: str) -> ApiException:
    return ApiException(404, "NotFound", f'{qualified(rt)} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiException:
    return ApiException(409, "AlreadyExists", f'{qualified(rt)} "{name}" already exists', _details(rt, name))


def conflict(rt: ResourceType, name: str, why: str | None = None) -> ApiException:
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiException(
        409, "Conflict", f'Operation cannot be fulfilled on {qualified(rt)} "{name}": {why}', _details(rt, name)
    )


def bad_request(message: str, causes: list[dict[str, Any]] | None = None) -> ApiException:
    return ApiException(400, "BadRequest", message, {"causes": causes} if causes else None)


def forbidden(message: str, rt: ResourceType | None = None, name: str = "") -> ApiException:
    return ApiException(403, "Forbidden", message, _details(rt, name) if rt else None)


def method_not_allowed(message: str = "the server does not allow this method on the requested resource"):
    return ApiException(405, "MethodNotAllowed", message)


def gone(message: str) -> ApiException:
    return ApiException(410, "Expired", message)


def invalid(rt: ResourceType, name: str, causes: list[dict[str, Any]]) -> ApiException:
    """422 Invalid, message built like Kubernetes' NewInvalid (kubectl rebuilds it from causes)."""
    kind_group = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    parts = [f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes]
    if len(parts) == 1:
        msg = f'{kind_group} "{name}" is invalid: {parts[0]}'
    else:
        msg = f'{kind_group} "{name}" is invalid: [{", ".join(parts)}]'
    return ApiException(422, "Invalid", msg, _details(rt, name, kind=rt.kind, causes=causes))


def internal(message: str) -> ApiException:
    return ApiException(500, "InternalError", f"Internal error occurred: {message}")
