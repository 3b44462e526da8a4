"""No client input breaks the API server's answer, over real HTTP.

A control plane (API server, authentication and RBAC, no controllers) listens on TLS; one
keep-alive httpx connection with the admin token sends requests Hypothesis builds from the
whole Unicode range (control characters, line breaks, bidi overrides, lone surrogates both
as ``\\ud800`` escapes and as raw bytes, which makes the body invalid UTF-8) in field names,
field values, query parameters and header values (Content-Type, Accept, User-Agent,
Impersonate-*). Writes are creates, updates and every kind of patch (merge, strategic, JSON
patch, apply) and deletes of ConfigMaps, Deployments and Pods; reads are lists and watches
with random ListOptions, and random paths with random methods.

After every request:

- no 5xx, and the connection answered and stays open (httpx would raise on a dropped one);
- a refusal (4xx) is a Status: kind Status, apiVersion v1, status Failure, code equal to the
  HTTP status; and nothing was stored: the store's revision did not move;
- a write answered 2xx is stored: reading the object back gives what the answer said (a dry
  run moves nothing);
- a watch answered 200 streams JSON events and, with timeoutSeconds=1, ends by itself.

A longer hunt: GPUFLEET_ROBUST_EXAMPLES=2000 pytest --timeout 0 tests/apiserver/test_robustness_property.py

Nothing runs but the API server, so the store's revision moves only by the requests sent.
One control plane per test function; the examples share it (each names its target by index
so what it draws does not depend on the state it finds). Examples: GPUFLEET_ROBUST_EXAMPLES
(default sized to run the file in about a minute on two cores, SQLite and PostgreSQL).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from robust_helpers import (
    APPLY,
    CM,
    JSON,
    JSON_PATCH,
    KINDS,
    MERGE,
    NAMES,
    STRATEGIC,
    Cluster,
    Sent,
    check_status,
    pct,
    url,
)

# Watches wait for their timeoutSeconds=1, so the list and watch test runs a quarter as many.
EXAMPLES = int(os.environ.get("GPUFLEET_ROBUST_EXAMPLES", "120"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    # The examples share a server: a failure seldom replays alike, so no shrinking; the
    # assertion message carries the request.
    phases=(Phase.explicit, Phase.generate),
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)

# ----------------------------------------------------------------------------- strategies

# Every code point, surrogates included.
ANY_CHAR = st.characters(exclude_categories=())
SPECIAL = ["\u202e", "\n", "\x00", "\r\n", "\t", "\x7f", "\x85", "\u2028", "\ud800", "\udfff", "\ufeff",
           "\U0010ffff", '"', "\\", "a,b", "caf\u00e9", "\u65e5\u672c", "", " ", "$patch", "a/b", "~1", "x" * 300]
texts = st.one_of(st.text(ANY_CHAR, max_size=10), st.sampled_from(SPECIAL),
                  st.lists(st.sampled_from(SPECIAL), min_size=2, max_size=4).map("".join))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), texts)
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(texts, c, max_size=3),
                      max_leaves=6)


def header_bytes(text: str) -> bytes:
    """A header value HTTP/1.1 can carry (no NUL, CR, LF; no outer whitespace): the text's
    UTF-8 bytes (so every character past ASCII arrives as bytes 0x80-0xff)."""
    raw = text.encode("utf-8", "surrogatepass")
    for b in (b"\x00", b"\r", b"\n", b"\x0b", b"\x0c"):
        raw = raw.replace(b, b"?")
    return raw.strip(b" \t") or b"x"


def encode_json(value: Any, how: str) -> bytes:
    if how == "ascii":  # surrogates as \\ud800 escapes: valid JSON text
        return json.dumps(value, ensure_ascii=True).encode()
    # Raw UTF-8, surrogates as their (invalid) 3-byte forms.
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


encodings = st.sampled_from(["ascii", "raw", "raw"])

# Where in a manifest a random field or value goes: a path of dict keys.
SPOTS = {
    "configmaps": [(), ("metadata",), ("metadata", "labels"), ("metadata", "annotations"), ("data",),
                   ("binaryData",)],
    "deployments": [(), ("metadata",), ("metadata", "labels"), ("spec",), ("spec", "selector", "matchLabels"),
                    ("spec", "template", "metadata", "labels"), ("spec", "template", "spec")],
    "pods": [(), ("metadata",), ("metadata", "annotations"), ("spec",), ("spec", "nodeSelector")],
}


@st.composite
def edits(draw: st.DrawFn, kind: str) -> list[tuple[tuple[str, ...], str, Any]]:
    """One to three (spot, key, value): a random field (or a known key) set at a spot."""
    known = ["name", "labels", "data", "replicas", "image", "containers", "resourceVersion", "$patch", "kind"]
    return draw(st.lists(st.tuples(st.sampled_from(SPOTS[kind]),
                                   st.one_of(texts, st.sampled_from(known)), values), min_size=1, max_size=3))


def apply_edits(obj: dict[str, Any], changes: list[tuple[tuple[str, ...], str, Any]]) -> dict[str, Any]:
    obj = json.loads(json.dumps(obj))
    for spot, key, value in changes:
        cur = obj
        for p in spot:
            nxt = cur.get(p)
            if not isinstance(nxt, dict):
                nxt = cur[p] = {}
            cur = nxt
        cur[key] = value
    return obj


def opt(s: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), s)


def seldom(valid: st.SearchStrategy[Any], other: st.SearchStrategy[Any] = texts) -> st.SearchStrategy[Any]:
    """Mostly absent or valid, sometimes anything: an invalid option refuses the whole write,
    and most examples should reach the decoding and storing of the body."""
    return st.sampled_from(["none"] * 7 + ["valid"] * 4 + ["any"]).flatmap(
        lambda c: st.none() if c == "none" else valid if c == "valid" else other)


write_params = st.fixed_dictionaries({
    "dryRun": seldom(st.just("All")),
    "fieldValidation": seldom(st.sampled_from(["Strict", "Warn", "Ignore", "strict"])),
    "fieldManager": seldom(st.sampled_from(["robust", "café", "a" * 128])),
    "force": opt(st.sampled_from(["true", "false"])),
})

CONTENT_TYPES = [JSON, MERGE, STRATEGIC, JSON_PATCH, APPLY, "application/yaml", "text/plain",
                 "application/vnd.kubernetes.protobuf", "application/json; charset=utf-8", "*/*"]
header_texts = st.one_of(st.sampled_from(CONTENT_TYPES), texts).map(header_bytes)


@st.composite
def extra_headers(draw: st.DrawFn) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    if draw(st.booleans()):
        out["accept"] = draw(st.one_of(st.sampled_from([JSON, "application/json;as=Table;v=v1;g=meta.k8s.io",
                                                         "application/yaml", "*/*"]), texts).map(header_bytes))
    if draw(st.booleans()):
        out["user-agent"] = draw(texts.map(header_bytes))
    if draw(st.sampled_from([False] * 9 + [True])):  # impersonation, mostly refused: keep it to some examples
        out["impersonate-user"] = draw(st.one_of(st.just("system:admin"), texts).map(header_bytes))
        for name in draw(st.lists(st.sampled_from(["impersonate-group", "impersonate-uid",
                                                   "impersonate-extra-scopes", "impersonate-extra-%e2%80%ae"]),
                                  max_size=2, unique=True)):
            out[name] = draw(texts.map(header_bytes))
    return out


@pytest.fixture
def cluster(store_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(store_url, tmp_path / "state")
    try:
        yield c
    finally:
        c.close()


# ----------------------------------------------------------------------------- writes

kinds = st.sampled_from(sorted(KINDS))
names = st.sampled_from(NAMES)


def _query(p: dict[str, str | None]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in p.items() if v is not None]


def test_creates_and_updates(cluster: Cluster) -> None:
    @SETTINGS
    @given(kind=kinds, name=st.one_of(names, texts), changes=st.data(), how=encodings, put=st.booleans(),
           keep_rv=st.booleans(), q=write_params, ctype=seldom(st.sampled_from(CONTENT_TYPES).map(str.encode), header_texts), hdrs=extra_headers())
    def run(kind: str, name: str, changes: st.DataObject, how: str, put: bool, keep_rv: bool,
            q: dict[str, str | None], ctype: bytes | None, hdrs: dict[str, bytes]) -> None:
        collection, make = KINDS[kind]
        edit = changes.draw(edits(kind))
        headers = {**hdrs, "content-type": ctype if ctype is not None else JSON.encode()}
        if put:
            target_name = name if name in NAMES else NAMES[sum(map(ord, name)) % len(NAMES)]
            current = cluster.ensure(kind, target_name)
            if not keep_rv:
                current["metadata"].pop("resourceVersion", None)
            body = encode_json(apply_edits(current, edit), how)
            target = f"{collection}/{target_name}"
            cluster.check(Sent("PUT", target, body, _query(q), headers), target)
        else:
            manifest = make(name)
            body = encode_json(apply_edits(manifest, edit), how)
            cluster.check(Sent("POST", collection, body, _query(q), headers))

    run()


@st.composite
def json_patches(draw: st.DrawFn) -> Any:
    pointer = st.one_of(st.sampled_from(["/metadata/labels/app", "/metadata/labels/x", "/data/a", "/spec/replicas",
                                         "/metadata/annotations", "/spec/template/spec/containers/0/image",
                                         "/metadata/name", "", "/-", "/metadata/resourceVersion"]),
                        texts.map(lambda t: "/metadata/labels/" + t.replace("~", "~0").replace("/", "~1")), texts)
    op = st.fixed_dictionaries({"op": st.sampled_from(["add", "replace", "remove", "test", "move", "copy", "x"]),
                                "path": pointer}, optional={"value": values, "from": pointer})
    return draw(st.one_of(st.lists(op, max_size=3), values))


def test_patches(cluster: Cluster) -> None:
    @SETTINGS
    @given(kind=kinds, name=names, changes=st.data(), how=encodings,
           ptype=st.sampled_from([MERGE, STRATEGIC, JSON_PATCH, APPLY, APPLY]), q=write_params,
           ctype=st.sampled_from(["ptype"] * 6 + ["any"]).flatmap(lambda c: st.none() if c == "ptype" else header_texts),
           hdrs=extra_headers(), as_yaml=st.booleans())
    def run(kind: str, name: str, changes: st.DataObject, how: str, ptype: str, q: dict[str, str | None],
            ctype: bytes | None, hdrs: dict[str, bytes], as_yaml: bool) -> None:
        collection, make = KINDS[kind]
        target = f"{collection}/{name}"
        cluster.ensure(kind, name)
        if ptype == JSON_PATCH:
            body = encode_json(changes.draw(json_patches()), how)
        elif ptype == APPLY:
            applied = apply_edits(make(name), changes.draw(edits(kind)))
            if as_yaml:
                try:
                    body = yaml.safe_dump(applied, allow_unicode=True).encode("utf-8", "surrogatepass")
                except yaml.YAMLError:
                    body = encode_json(applied, how)
            else:
                body = encode_json(applied, how)
            if q["fieldManager"] is None and changes.draw(st.booleans()):
                q = {**q, "fieldManager": "robust"}
        else:
            body = encode_json(apply_edits({}, changes.draw(edits(kind))), how)
        headers = {**hdrs, "content-type": ctype if ctype is not None else ptype.encode()}
        cluster.check(Sent("PATCH", target, body, _query(q), headers), target)

    run()


def test_deletes(cluster: Cluster) -> None:
    opts = st.one_of(st.just(b""), values.map(lambda v: encode_json(v, "raw")),
                     st.fixed_dictionaries({}, optional={
                         "gracePeriodSeconds": st.one_of(st.integers(-5, 2**64), texts),
                         "propagationPolicy": st.one_of(st.sampled_from(["Orphan", "Background", "Foreground"]), texts),
                         "preconditions": st.dictionaries(st.sampled_from(["uid", "resourceVersion"]), texts),
                         "dryRun": st.lists(texts, max_size=2),
                     }).map(lambda v: encode_json(v, "ascii")))

    @SETTINGS
    @given(kind=kinds, name=names, body=opts, q=write_params,
           grace=seldom(st.integers(-3, 100).map(str)), hdrs=extra_headers())
    def run(kind: str, name: str, body: bytes, q: dict[str, str | None], grace: str | None,
            hdrs: dict[str, bytes]) -> None:
        collection, _ = KINDS[kind]
        target = f"{collection}/{name}"
        cluster.ensure(kind, name)
        params = _query({"dryRun": q["dryRun"], "gracePeriodSeconds": grace})
        headers = {**hdrs, "content-type": JSON.encode()} if body else hdrs
        cluster.check(Sent("DELETE", target, body, params, headers), target)

    run()


# ----------------------------------------------------------------------------- reads

list_params = st.lists(st.one_of(
    st.tuples(st.just("labelSelector"), st.one_of(st.sampled_from(["app=web", "app in (web)", "!app", "a,b"]), texts)),
    st.tuples(st.just("fieldSelector"), st.one_of(st.sampled_from(["metadata.name=obj-0", "metadata.namespace!=x"]),
                                                  texts)),
    st.tuples(st.just("limit"), st.one_of(st.integers(-2, 2**64).map(str), texts)),
    st.tuples(st.just("continue"), texts),
    st.tuples(st.just("resourceVersion"), st.one_of(st.integers(-2, 2**64).map(str), st.just("0"), texts)),
    st.tuples(st.just("resourceVersionMatch"), st.one_of(st.sampled_from(["Exact", "NotOlderThan"]), texts)),
    st.tuples(st.just("timeoutSeconds"), st.one_of(
        st.sampled_from(["nan", "inf", "-inf", "1.5", "1e3", "99999999999999999999", "-1", "+1", " 1", "0x1"]),
        texts)),
    st.tuples(st.just("allowWatchBookmarks"), st.sampled_from(["true", "x"])),
    st.tuples(st.just("sendInitialEvents"), st.sampled_from(["true", "false"])),
    st.tuples(st.just("includeObject"), st.one_of(st.sampled_from(["None", "Object"]), texts)),
    st.tuples(texts, texts),
), max_size=4)


def test_lists_and_watches(cluster: Cluster) -> None:
    for kind in KINDS:
        cluster.ensure(kind, NAMES[0])

    @settings(SETTINGS, max_examples=max(EXAMPLES // 4, 1))
    @given(kind=kinds, query=list_params, watch=st.booleans(), hdrs=extra_headers())
    def run(kind: str, query: list[tuple[str, str]], watch: bool, hdrs: dict[str, bytes]) -> None:
        collection, _ = KINDS[kind]
        params = list(query)
        if watch:
            params.append(("watch", "true"))
            # The watch must end by itself: a valid timeout of one second comes last unless
            # the drawn ones are all invalid (each then a 400).
            if not any(k == "timeoutSeconds" for k, _ in params):
                params.append(("timeoutSeconds", "1"))
        sent = Sent("GET", collection, b"", params, hdrs)
        timeouts = [v for k, v in params if k == "timeoutSeconds"]
        ends = timeouts and timeouts[0] in ("1", "-1", "+1")
        try:
            with cluster.http.stream("GET", url(collection, params), headers=hdrs,
                                     timeout=httpx.Timeout(30, read=15 if ends else 0.5)) as r:
                where = f"{sent!r} -> {r.status_code}"
                assert r.status_code < 500, where
                if r.status_code >= 400:
                    r.read()
                    check_status(sent, r, where + f" {r.content[:300]!r}")
                    return
                if not watch or not any(k == "watch" and v == "true" for k, v in params):
                    r.read()
                    assert isinstance(r.json(), dict), where
                    return
                try:
                    for line in r.iter_lines():
                        if line.strip():
                            ev = json.loads(line)
                            assert ev.get("type") in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"), where
                except httpx.ReadTimeout:
                    assert not ends, f"{where}: with timeoutSeconds={timeouts[0]} the watch did not end"
        except httpx.TransportError as e:
            if isinstance(e, httpx.ReadTimeout) and not ends:
                return
            raise AssertionError(f"{sent!r}: the connection failed ({type(e).__name__}: {e})") from e

    run()


# ----------------------------------------------------------------------------- any path, any method

segments = st.one_of(st.sampled_from(["api", "apis", "v1", "apps", "namespaces", "default", "configmaps", "pods",
                                      "obj-0", "status", "scale", "log", "watch", "proxy", "nodes", "..", "%"]),
                     texts)


def test_any_path_and_method(cluster: Cluster) -> None:
    cluster.ensure("configmaps", NAMES[0])

    @SETTINGS
    @given(method=st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "FOO"]),
           prefix=st.sampled_from(["/api/v1/namespaces/default/configmaps", "/apis/apps/v1", "/api", "", "/openapi/v3"]),
           parts=st.lists(segments, max_size=4), q=st.lists(st.tuples(texts, texts), max_size=3),
           body=st.one_of(st.just(b""), st.binary(max_size=40), values.map(lambda v: encode_json(v, "raw"))),
           ctype=seldom(st.sampled_from(CONTENT_TYPES).map(str.encode), header_texts), hdrs=extra_headers(),
           named=st.one_of(st.none(), st.tuples(kinds, st.one_of(texts, st.sampled_from(["obj-0", "a\x00", "\x00b", "a\nb", "\x7f"])))))
    def run(method: str, prefix: str, parts: list[str], q: list[tuple[str, str]], body: bytes,
            ctype: bytes | None, hdrs: dict[str, bytes], named: tuple[str, str] | None) -> None:
        if named is not None:  # an object of a real collection by any name, maybe a subresource
            prefix = KINDS[named[0]][0] + "/" + pct(named[1])
            parts = parts[:1]
        path = prefix + "".join("/" + pct(p) for p in parts)
        headers = {**hdrs, **({"content-type": ctype} if ctype is not None else {})}
        if method in ("GET", "HEAD"):
            # A path may name a watch (/api/v1/watch/...): it must end by itself.
            q = [(k, v) for k, v in q if k not in ("watch", "timeoutSeconds")] + [("timeoutSeconds", "1")]
        target = f"{CM}/{NAMES[0]}"
        cluster.check(Sent(method, path, body, q, headers), target if prefix == CM else None)

    run()
