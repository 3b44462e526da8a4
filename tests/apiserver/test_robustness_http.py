"""The inputs that once broke an answer, over real HTTPS: a stored write answered 500 or with a
dropped connection (an unknown field whose name a Warning header could not carry), a watch
that never ended (timeoutSeconds=nan), plain-text errors where clients expect a Status, and
write options Kubernetes refuses but that were taken as "not set"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from robust_helpers import CM, Cluster, configmap, url

from gpufleet.apiserver.headers import WARNING_TOTAL_LIMIT, escape, safe_headers, warning_header


@pytest.fixture
def cluster(store_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(store_url, tmp_path / "state")
    try:
        yield c
    finally:
        c.close()


def assert_status(r: httpx.Response, code: int, reason: str) -> dict:
    assert r.status_code == code, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    s = r.json()
    assert (s["kind"], s["apiVersion"], s["status"], s["code"], s["reason"]) == ("Status", "v1", "Failure", code,
                                                                                 reason), s
    return s


@pytest.mark.parametrize("field", ["\u202e", "\n", "\x00", "\r\n\t", "\x7f\x85", "caf\u00e9", '"\\', "\U0001f600"])
def test_update_with_an_unknown_field_of_any_name_answers_its_success(cluster: Cluster, field: str) -> None:
    """The update is stored and answered 200 with a Warning naming the field, escaped; the
    same connection serves the next request."""
    current = cluster.ensure("configmaps", "cm")
    body = {**current, "data": {"a": "changed"}, field: 1}
    raw = json.dumps(body, ensure_ascii=True).encode()
    r = cluster.http.put(f"{CM}/cm", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    stored = cluster.get(f"{CM}/cm").json()
    assert stored["data"] == {"a": "changed"}
    assert stored == r.json()
    assert int(stored["metadata"]["resourceVersion"]) > int(current["metadata"]["resourceVersion"])
    warning = r.headers["warning"]
    assert warning.isascii() and warning.isprintable(), warning
    assert warning.startswith('299 - "unknown field \\"'), warning
    assert escape(field.replace("\\", "\\\\").replace('"', '\\"')).replace("\t", "\\t") in warning


def test_a_huge_unknown_field_name_gets_a_warning_cut_to_size(cluster: Cluster) -> None:
    body = {**configmap("big"), "x" * 70_000: 1, "y": 2}
    r = cluster.http.post(CM, json=body)
    assert r.status_code == 201, r.text
    assert len(r.headers["warning"]) < WARNING_TOTAL_LIMIT + 100
    assert 'unknown field \\"y\\"' in r.headers["warning"]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1.5", "1e3", "99999999999999999999", "0x10", " 1", "\x00"])
def test_watch_timeout_seconds_must_be_an_integer(cluster: Cluster, value: str) -> None:
    r = cluster.http.get(url(CM, [("watch", "true"), ("timeoutSeconds", value)]), timeout=10)
    s = assert_status(r, 400, "BadRequest")
    assert s["message"].startswith("timeoutSeconds: Invalid value"), s


def test_watch_with_negative_timeout_ends_at_once(cluster: Cluster) -> None:
    cluster.ensure("configmaps", "cm")
    with cluster.http.stream("GET", CM, params={"watch": "true", "timeoutSeconds": "-1"},
                             timeout=httpx.Timeout(10)) as r:
        assert r.status_code == 200
        events = [json.loads(line) for line in r.iter_lines() if line.strip()]
    assert [e["type"] for e in events] == ["ADDED"]


def test_list_refuses_a_resource_version_or_timeout_that_is_not_an_integer(cluster: Cluster) -> None:
    s = assert_status(cluster.http.get(CM, params={"resourceVersion": "abc"}), 400, "BadRequest")
    assert "resourceVersion" in s["message"]
    s = assert_status(cluster.http.get(CM, params={"timeoutSeconds": "nan"}), 400, "BadRequest")
    assert "timeoutSeconds" in s["message"]


@pytest.mark.parametrize("name", ["a%0Ab", "%00", "a%01b", "%0D", "%E2%80%AE", "%ED%A0%80"])
def test_not_found_for_a_name_with_control_characters_is_a_status(cluster: Cluster, name: str) -> None:
    s = assert_status(cluster.http.get(f"{CM}/{name}"), 404, "NotFound")
    assert s["details"]["kind"] == "configmaps"


def test_unknown_methods_and_writes_to_documents_are_statuses(cluster: Cluster) -> None:
    assert_status(cluster.http.request("FOO", f"{CM}/cm"), 405, "MethodNotAllowed")
    assert_status(cluster.http.post("/api", json={}), 405, "MethodNotAllowed")
    assert_status(cluster.http.request("TRACE", "/apis/apps/v1"), 405, "MethodNotAllowed")
    assert_status(cluster.http.post("/no/such/path", json={}), 404, "NotFound")


@pytest.mark.parametrize("param,value,kind", [
    ("dryRun", "true", "CreateOptions"),
    ("dryRun", "", "CreateOptions"),
    ("fieldValidation", "Loose", "CreateOptions"),
    ("fieldManager", "a\nb", "CreateOptions"),
    ("fieldManager", "m" * 129, "CreateOptions"),
])
def test_write_options_outside_the_supported_values_refuse_the_write(cluster: Cluster, param: str, value: str,
                                                                      kind: str) -> None:
    before = cluster.revision()
    r = cluster.http.post(url(CM, [(param, value)]), json=configmap("opts"))
    s = assert_status(r, 422, "Invalid")
    assert s["details"]["kind"] == kind and s["details"]["group"] == "meta.k8s.io", s
    assert s["details"]["causes"][0]["field"] == param, s
    assert cluster.revision() == before
    assert cluster.get(f"{CM}/opts").status_code == 404


def test_delete_refuses_an_unsupported_dry_run(cluster: Cluster) -> None:
    cluster.ensure("configmaps", "cm")
    s = assert_status(cluster.http.delete(f"{CM}/cm", params={"dryRun": "yes"}), 422, "Invalid")
    assert s["details"]["kind"] == "DeleteOptions"
    assert cluster.get(f"{CM}/cm").status_code == 200
    assert cluster.http.delete(f"{CM}/cm", params={"dryRun": "All"}).status_code == 200
    assert cluster.get(f"{CM}/cm").status_code == 200


def test_impersonated_user_names_are_read_as_utf8(cluster: Cluster) -> None:
    r = cluster.http.get(CM, headers={"impersonate-user": "caf\u00e9".encode()})
    s = assert_status(r, 403, "Forbidden")
    assert 'User "caf\u00e9"' in s["message"], s


# -- the header functions themselves


def test_escape_leaves_visible_ascii_and_escapes_the_rest() -> None:
    assert escape("application/json; charset=utf-8") == "application/json; charset=utf-8"
    assert escape("a\nb\x00\u202e\U0001f600\ud800\x7f") == "a\\nb\\u0000\\u202e\\U0001f600\\ud800\\u007f"


def test_warning_header_quotes_dedupes_and_cuts() -> None:
    assert warning_header([]) == {}
    assert warning_header(['unknown field "a\\b"', 'unknown field "a\\b"']) == {
        "warning": '299 - "unknown field \\"a\\\\b\\""'}
    many = warning_header([f"w{i} " + "z" * 1000 for i in range(50)])["warning"]
    assert len(many) < WARNING_TOTAL_LIMIT + 50 * 10
    assert many.count("299 - ") < 50


def test_safe_headers_makes_every_value_sendable() -> None:
    out = safe_headers({"warning": "x\ny", "retry-after": "1", "bad name": "v", "x-a": " padded\u00e9 "})
    assert out == {"warning": "x\\ny", "retry-after": "1", "x-a": "padded\\u00e9"}
