from __future__ import annotations

import json

import pytest

from gpufleet.client.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Expired,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
    error_from_response,
    error_from_status,
)


def status(code: int, reason: str, message: str = "msg", **details) -> bytes:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    if details:
        body["details"] = details
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("code", "reason", "cls"),
    [
        (400, "BadRequest", BadRequest),
        (401, "Unauthorized", Unauthorized),
        (403, "Forbidden", Forbidden),
        (404, "NotFound", NotFound),
        (409, "AlreadyExists", AlreadyExists),
        (409, "Conflict", Conflict),
        (410, "Expired", Expired),
        (410, "Gone", Gone),
        (422, "Invalid", Invalid),
        (429, "TooManyRequests", TooManyRequests),
        (500, "InternalError", ServerError),
        (503, "ServiceUnavailable", ServerError),
        (418, "Teapot", ApiError),
    ],
)
def test_status_bodies_map_to_types(code: int, reason: str, cls: type) -> None:
    err = error_from_response(code, status(code, reason, "it broke"))
    assert type(err) is cls
    assert err.code == code and err.reason == reason and err.message == "it broke"
    assert "it broke" in str(err) and reason in str(err)


def test_409_types_are_distinct_and_expired_is_gone() -> None:
    assert not issubclass(AlreadyExists, Conflict)
    assert issubclass(Expired, Gone)
    assert isinstance(error_from_response(410, status(410, "Expired")), Gone)


@pytest.mark.parametrize(
    ("code", "cls", "reason"),
    [
        (404, NotFound, "NotFound"),
        (409, Conflict, "Conflict"),
        (403, Forbidden, "Forbidden"),
        (502, ServerError, "InternalError"),
        (500, ServerError, "InternalError"),
        (422, Invalid, "Invalid"),
    ],
)
def test_non_json_bodies_are_typed_by_code(code: int, cls: type, reason: str) -> None:
    err = error_from_response(code, b"<html>upstream said no</html>")
    assert type(err) is cls
    assert err.reason == reason
    assert "upstream said no" in err.message


def test_empty_404_gets_kubernetes_wording() -> None:
    err = error_from_response(404, b"")
    assert isinstance(err, NotFound)
    assert err.message == "the server could not find the requested resource"
    assert err.status is None


def test_json_that_is_not_a_status_is_kept_as_text() -> None:
    err = error_from_response(400, b'["a", "b"]')
    assert isinstance(err, BadRequest)
    assert '["a", "b"]' in err.message


def test_invalid_exposes_causes() -> None:
    causes = [
        {"field": "spec.replicas", "message": "must be >= 0", "reason": "FieldValueInvalid"},
        {"field": "metadata.name", "message": "Required value", "reason": "FieldValueRequired"},
    ]
    err = error_from_response(
        422,
        status(422, "Invalid", 'Deployment "web" is invalid', kind="Deployment", name="web", causes=causes),
    )
    assert isinstance(err, Invalid)
    assert err.causes == causes
    assert err.details["name"] == "web"
    # Without a message the text is rebuilt from the causes, as kubectl does.
    bare = error_from_status(
        {
            "code": 422,
            "reason": "Invalid",
            "details": {"kind": "Deployment", "name": "web", "causes": causes[:1]},
        }
    )
    assert bare.message == 'Deployment "web" is invalid: spec.replicas: must be >= 0'


def test_retry_after_from_details_or_header() -> None:
    err = error_from_response(429, status(429, "TooManyRequests", retryAfterSeconds=3))
    assert isinstance(err, TooManyRequests) and err.retry_after_seconds == 3
    err = error_from_response(429, b"slow down", {"retry-after": "7"})
    assert err.retry_after_seconds == 7


def test_status_from_a_watch_error_event() -> None:
    obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": "Expired",
        "code": 410,
        "message": "too old resource version: 104 (200)",
    }
    err = error_from_status(obj)
    assert isinstance(err, Gone) and err.code == 410 and err.status == obj


def test_code_missing_from_status_falls_back_to_http_code() -> None:
    err = error_from_response(404, json.dumps({"kind": "Status", "message": "nope"}).encode())
    assert isinstance(err, NotFound) and err.code == 404 and err.reason == "NotFound"
