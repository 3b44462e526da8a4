"""Errors the API answers with, as exception types that say what happened.

Every non-2xx answer from a Kubernetes-style API server carries a ``Status`` body (reason,
code, message, details); callers branch on the type (``except NotFound``) the way client-go
callers use ``apierrors.IsNotFound``. A body that is not a Status (a proxy's HTML page, a
plain-text 500) still becomes the right type, chosen by the HTTP code.
"""

from __future__ import annotations

import json
from typing import Any


class ClientError(Exception):
    """Base of everything the client raises on purpose."""


class TransportError(ClientError):
    """The request never got an answer: connection refused or reset, TLS failure, timeout,
    or a stream cut off in the middle. Unlike ApiError, the server may not have seen it."""


class ApiError(ClientError):
    """The server answered with an error Status."""

    # The reason Kubernetes uses for the class when the body does not name one.
    default_reason = "Unknown"

    def __init__(
        self,
        code: int,
        reason: str | None = None,
        message: str | None = None,
        details: dict[str, Any] | None = None,
        *,
        status: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.code = code
        self.reason = reason or self.default_reason
        self.details: dict[str, Any] = details or {}
        self.message = message or _default_message(code, self.details)
        # The whole Status body when there was one, for callers that want more than we parse.
        self.status = status
        self.headers = headers or {}
        super().__init__(self.message)

    @property
    def causes(self) -> list[dict[str, Any]]:
        causes = self.details.get("causes") or []
        return [c for c in causes if isinstance(c, dict)]

    @property
    def retry_after_seconds(self) -> int | None:
        value = self.details.get("retryAfterSeconds")
        if isinstance(value, int) and value > 0:
            return value
        header = self.headers.get("retry-after", "")
        return int(header) if header.isdigit() else None

    def __str__(self) -> str:
        return f"({self.reason}) {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code}, reason={self.reason!r}, message={self.message!r})"


class BadRequest(ApiError):
    default_reason = "BadRequest"


class Unauthorized(ApiError):
    default_reason = "Unauthorized"


class Forbidden(ApiError):
    default_reason = "Forbidden"


class NotFound(ApiError):
    default_reason = "NotFound"


class MethodNotAllowed(ApiError):
    default_reason = "MethodNotAllowed"


class Conflict(ApiError):
    """An update named a resourceVersion that is no longer current: re-read and try again
    (see api.retry_on_conflict)."""

    default_reason = "Conflict"


class AlreadyExists(ApiError):
    # Not a Conflict subclass even though both are 409: retrying a create never helps, and
    # client-go's IsConflict is false for it too.
    default_reason = "AlreadyExists"


class Gone(ApiError):
    """410: the resourceVersion asked for is older than the history the server keeps; list again."""

    default_reason = "Gone"


class Expired(Gone):
    """410 with reason Expired, what a watch from a compacted resourceVersion answers."""

    default_reason = "Expired"


class UnsupportedMediaType(ApiError):
    default_reason = "UnsupportedMediaType"


class Invalid(ApiError):
    """422: the object failed validation; ``causes`` lists each problem as {field, message, reason}."""

    default_reason = "Invalid"


class TooManyRequests(ApiError):
    default_reason = "TooManyRequests"


class ServerError(ApiError):
    """5xx: the server failed; whether a retry helps depends on the verb."""

    default_reason = "InternalError"


_BY_REASON: dict[str, type[ApiError]] = {
    "BadRequest": BadRequest,
    "Unauthorized": Unauthorized,
    "Forbidden": Forbidden,
    "NotFound": NotFound,
    "MethodNotAllowed": MethodNotAllowed,
    "AlreadyExists": AlreadyExists,
    "Conflict": Conflict,
    "Gone": Gone,
    "Expired": Expired,
    "UnsupportedMediaType": UnsupportedMediaType,
    "Invalid": Invalid,
    "TooManyRequests": TooManyRequests,
    "InternalError": ServerError,
    "ServiceUnavailable": ServerError,
    "Timeout": ServerError,
    "ServerTimeout": ServerError,
}

_BY_CODE: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: Gone,
    415: UnsupportedMediaType,
    422: Invalid,
    429: TooManyRequests,
}

# The reason a code stands for when the body names none (mirrors apimachinery's
# reasonForCode), so `str(err)` reads the same whether or not the body was a Status.
_REASON_FOR_CODE: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Gone",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def _class_for(code: int, reason: str | None) -> type[ApiError]:
    # The reason is more precise than the code (409 is AlreadyExists or Conflict, 410 is
    # Gone or Expired), so it decides whenever the server named one we know.
    cls = _BY_REASON.get(reason or "")
    if cls is not None:
        return cls
    if code in _BY_CODE:
        return _BY_CODE[code]
    if code >= 500:
        return ServerError
    return ApiError


def _default_message(code: int, details: dict[str, Any]) -> str:
    if code == 404:
        return "the server could not find the requested resource"
    if code == 422 and details.get("causes"):
        return _invalid_message(details)
    return f"the server responded with status {code}" if code else "unknown error"


def _invalid_message(details: dict[str, Any]) -> str:
    # kubectl rebuilds a 422 message from details the same way, so users see one wording.
    parts = []
    for cause in details.get("causes") or []:
        if not isinstance(cause, dict):
            continue
        field_ = cause.get("field") or ""
        parts.append(f"{field_}: {cause.get('message', '')}" if field_ else str(cause.get("message", "")))
    what = f'{details.get("kind", "")} "{details.get("name", "")}" is invalid'
    if len(parts) == 1:
        return f"{what}: {parts[0]}"
    return f"{what}: [{', '.join(parts)}]"


def error_from_status(
    status: dict[str, Any], code: int | None = None, headers: dict[str, str] | None = None
) -> ApiError:
    """Build the typed error for a Status object (e.g. the object of a watch ERROR event)."""
    raw_code = status.get("code")
    status_code = raw_code if isinstance(raw_code, int) else 0
    code = status_code or code or 500
    reason = status.get("reason") if isinstance(status.get("reason"), str) else None
    details = status.get("details") if isinstance(status.get("details"), dict) else None
    message = status.get("message") if isinstance(status.get("message"), str) else None
    cls = _class_for(code, reason)
    return cls(
        code,
        reason or _REASON_FOR_CODE.get(code) or cls.default_reason,
        message,
        details,
        status=status,
        headers=headers,
    )


def error_from_response(
    status: int, body: bytes | str | None, headers: dict[str, str] | None = None
) -> ApiError:
    """The typed error for an HTTP answer with code ``status`` and body ``body``.

    The body is usually a Status; anything else (empty, plain text, HTML, JSON of another
    shape) is kept as the message so nothing the server said is lost.
    """
    text = body.decode("utf-8", "replace") if isinstance(body, bytes | bytearray) else (body or "")
    parsed: Any = None
    if text.strip():
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
    if isinstance(parsed, dict) and (
        parsed.get("kind") == "Status" or "reason" in parsed or "code" in parsed
    ):
        return error_from_status(parsed, status, headers)
    cls = _class_for(status, None)
    message = text.strip() or None
    if message and len(message) > 2000:
        message = message[:2000] + "..."
    return cls(status, _REASON_FOR_CODE.get(status) or cls.default_reason, message, None, headers=headers)
