"""Bad input is rejected with a Kubernetes Status naming the field, and the stored objects are
unchanged.

Hypothesis sends malformed manifests, random bytes, random patches of every content type,
PUTs with random resourceVersions, DELETEs with random options, random Bindings and Evictions
and lists with random query strings at a server seeded with a Deployment, a Pod, a Service, a
ConfigMap and a Namespace.
After every request:

- no 5xx;
- every 4xx body is a Status (kind Status, status Failure, a message, code == HTTP status),
  and a 422 lists its causes, each naming a field (kubectl rebuilds its message from them);
- an object a successful write stored decodes with its kind's model and passes
  validate_create;
- a rejected request left its target byte-for-byte as it was, and no request changed an
  object it did not address.

One store per test function, reused across examples; every example re-reads the state first
(and re-creates a seed that a successful DELETE removed).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import yaml
from apiserver_helpers import (
    APPLY,
    CONFIGMAPS,
    DEPLOYMENTS,
    JSON,
    JSON_PATCH,
    MERGE,
    NAMESPACES,
    PODS,
    SERVICES,
    STRATEGIC,
    Api,
    Reply,
    configmap,
    deployment,
    namespace,
    pod,
    service,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gpufleet.api.registry import REGISTRY
from gpufleet.api.validation import validate_create
from gpufleet.apiserver.server import ApiServer
from gpufleet.store.base import open_store

# A longer hunt: GPUFLEET_FUZZ_EXAMPLES=5000 pytest tests/apiserver/test_fuzz.py
EXAMPLES = int(os.environ.get("GPUFLEET_FUZZ_EXAMPLES", "200"))
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    # No shrinking: with a store shared by the examples a failure rarely replays alike, and
    # shrinking one could take minutes. The assertion message carries the failing request.
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


@dataclass(frozen=True)
class Seed:
    collection: str
    manifest: dict[str, Any]
    subresources: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.manifest["metadata"]["name"]

    @property
    def url(self) -> str:
        return f"{self.collection}/{self.name}"


SEEDS: dict[str, Seed] = {
    "deployment": Seed(DEPLOYMENTS, deployment(), ("status", "scale")),
    "pod": Seed(PODS, pod("web-0", labels={"app": "web"}), ("status",)),
    "service": Seed(SERVICES, service(), ("status",)),
    "configmap": Seed(CONFIGMAPS, configmap("cfg", labels={"app": "web"}, data={"a": "1", "b": "2"})),
    "namespace": Seed(NAMESPACES, namespace("fuzz"), ("status",)),
}

CONTENT_TYPES = [JSON, MERGE, JSON_PATCH, STRATEGIC, APPLY, "application/yaml",
                 "application/vnd.kubernetes.protobuf", "text/plain", "application/json; charset=utf-8",
                 "", "garbage/\u00e9", "application/merge-patch+json;;;"]


# ----------------------------------------------------------------------------- value strategies

FIELD_NAMES = [
    "metadata", "spec", "status", "name", "namespace", "labels", "annotations", "replicas", "containers",
    "image", "ports", "containerPort", "selector", "matchLabels", "matchExpressions", "template", "data",
    "finalizers", "resourceVersion", "uid", "generation", "generateName", "apiVersion", "kind", "type",
    "port", "targetPort", "protocol", "nodeName", "phase", "conditions", "deletionTimestamp",
    "ownerReferences", "strategy", "env", "value", "resources", "limits", "requests", "nvidia.com/gpu",
    "cpu", "memory", "restartPolicy", "clusterIP", "binaryData", "immutable",
    "$patch", "$retainKeys", "$setElementOrder/containers", "$deleteFromPrimitiveList/finalizers",
]

SPECIAL_STRINGS = [
    "", " ", "a" * 63, "a" * 64, "x" * 254, "y" * 70_000, "\u00fcn\u00efc\u00f8d\u00e9", "\u202etxet", "\u65e5\u672c",
    "\x00", "\ud7ff", "-1", "1e9", "null", "true", "app=web", "$patch", "delete", "replace", "merge",
    "../..", "a/b", "UPPER", "web", "web-0", "default", "kube-system", "fuzz", "100m", "1Gi", "-5Gi",
    "2024-01-01T00:00:00Z", "not-a-time", "TCP", "UDP", "Always", "Never", "Running", "0x1F", "1.5",
]

SPECIAL_NUMBERS = [0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 10**30,
                   0.5, -0.0, 1e308, -1e308, 65535, 65536, 3.0]

DEEP = "__deep__"

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(SPECIAL_NUMBERS),
    st.text(max_size=12),
    st.sampled_from(SPECIAL_STRINGS),
    st.integers(min_value=30, max_value=3000).map(lambda depth: f"{DEEP}{depth}"),
)
keys = st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=10))
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=10,
)


def _deep(depth: int, kind: int) -> str:
    if kind == 0:
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


_DEEP_MARKER = re.compile(f'"{DEEP}([0-9]+)"')


def to_json(value: Any, ensure_ascii: bool = False) -> bytes:
    """JSON text of a generated value; a DEEP marker string becomes nesting that deep (too deep
    for any recursive encoder to build)."""
    text = json.dumps(value, ensure_ascii=ensure_ascii)
    text = _DEEP_MARKER.sub(lambda m: _deep(int(m.group(1)), int(m.group(1)) % 2), text)
    return text.encode("utf-8", "surrogatepass")


# ----------------------------------------------------------------------------- mutations

Path = tuple[Any, ...]


def all_paths(obj: Any, prefix: Path = ()) -> Iterator[Path]:
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from all_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from all_paths(v, (*prefix, i))


def _parent(obj: Any, path: Path) -> Any:
    cur = obj
    for p in path[:-1]:
        cur = cur[p]
    return cur


# The store is shared by the examples of a test, so what an example draws must not depend on
# the state it finds (Hypothesis replays examples and checks they draw alike): paths are drawn
# as indices into whatever the object holds, and every draw is made whether it is used or not.
INDEX = st.integers(0, 2**16)


def pick(items: list[Any], index: int) -> Any:
    return items[index % len(items)]


def mutate(data: st.DataObject, obj: dict[str, Any], max_mutations: int = 3) -> dict[str, Any]:
    """One to three random edits of a manifest: a wrong value, a missing field, an unknown field."""
    obj = json.loads(json.dumps(obj))
    for _ in range(data.draw(st.integers(1, max_mutations), label="mutations")):
        index = data.draw(INDEX, label="path")
        action = data.draw(st.sampled_from(["set", "set", "delete", "unknown"]), label="action")
        value = data.draw(json_values, label="value")
        unknown_key = data.draw(keys, label="unknown key")
        paths = [p for p in all_paths(obj) if p]
        if not paths:
            continue
        path = pick(paths, index)
        parent = _parent(obj, path)
        if action == "set":
            parent[path[-1]] = value
        elif action == "delete":
            del parent[path[-1]]
        else:
            target = parent[path[-1]] if isinstance(parent[path[-1]], dict) else parent
            if isinstance(target, dict):
                target[unknown_key] = value
    return obj


def json_pointer(path: Path) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


FIXED_POINTERS = ["", "/", "/spec/-", "/metadata/labels/a~1b", "/nope/deeper", "spec", "/spec/~2",
                  "/metadata/finalizers/-", "/spec/template/spec/containers/0/ports/-"]


def json_patch_ops(data: st.DataObject, current: dict[str, Any]) -> Any:
    paths = [json_pointer(p) for p in all_paths(current)]
    pointer = st.one_of(INDEX.map(lambda i: ("real", i)), st.sampled_from(FIXED_POINTERS), st.text(max_size=10))

    def resolve(p: Any) -> str:
        return pick(paths, p[1]) if isinstance(p, tuple) else p

    op = st.fixed_dictionaries(
        {"op": st.sampled_from(["add", "remove", "replace", "move", "copy", "test", "bogus", ""]), "path": pointer},
        optional={"value": json_values, "from": pointer, "extra": json_values},
    )
    shape = data.draw(st.one_of(st.lists(op, max_size=4), st.lists(json_values, max_size=3), json_values),
                      label="json patch")
    if isinstance(shape, list):
        return [{k: resolve(v) if k in ("path", "from") else v for k, v in o.items()}
                if isinstance(o, dict) and "op" in o and "path" in o else o for o in shape]
    return shape


DIRECTIVE_KEYS = ["$patch", "$retainKeys", "$setElementOrder/containers", "$deleteFromPrimitiveList/finalizers",
                  "$setElementOrder/ports"]


def partial_patch(data: st.DataObject, current: dict[str, Any], directives: bool) -> Any:
    """A patch shaped like the object: values at some of its real paths, nulls, and (for
    strategic merge) $patch directives and the other special keys in random places."""
    patch: dict[str, Any] = {}
    paths = [p for p in all_paths(current) if p and all(isinstance(x, str) for x in p)]
    for _ in range(data.draw(st.integers(1, 3), label="patch entries")):
        index = data.draw(INDEX, label="patch path")
        value: Any = data.draw(st.one_of(st.none(), json_values), label="patch value")
        use_directive = data.draw(st.booleans(), label="directive")
        directive_key = data.draw(st.sampled_from(DIRECTIVE_KEYS), label="directive key")
        directive_value = data.draw(st.one_of(st.sampled_from(["replace", "delete", "merge", "bogus"]),
                                              json_values), label="directive value")
        list_directive = data.draw(st.booleans(), label="list directive")
        item_name = data.draw(st.sampled_from(["nginx", "main", "x"]), label="item name")
        if not paths:
            continue
        path = pick(paths, index)
        cur = patch
        for p in path[:-1]:
            nxt = cur.get(p)
            if not isinstance(nxt, dict):
                nxt = cur[p] = {}
            cur = nxt
        if directives and use_directive:
            if isinstance(value, dict):
                value[directive_key] = directive_value
            else:
                cur[directive_key] = directive_value
        if directives and isinstance(value, list) and list_directive:
            value.append({"name": item_name, "$patch": "delete"})
        cur[path[-1]] = value
    return patch


# ----------------------------------------------------------------------------- the harness


@dataclass
class Sent:
    method: str
    path: str
    body: bytes = b""
    content_type: str | None = None
    query: list[tuple[str, str]] = field(default_factory=list)
    target: str | None = None  # the seed addressed, if any
    accept: str | None = None

    def __repr__(self) -> str:
        return (f"{self.method} {self.path}?{self.query} content-type={self.content_type!r} "
                f"body={self.body[:600]!r}")


class Harness:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = open_store("sqlite://:memory:", housekeeping_interval=None)
        self.server = ApiServer(self.store)
        self.api = Api(self.server)
        self.run(self._start())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _start(self) -> None:
        await self.store.start()
        await self.server.start()
        await self.snapshot()

    def close(self) -> None:
        self.run(self.store.close())
        self.loop.close()

    async def snapshot(self, reseed: bool = True) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}
        for key, seed in SEEDS.items():
            r = await self.api.get(seed.url)
            if r.status == 404 and reseed:
                created = await self.api.post(seed.collection, seed.manifest)
                assert created.status == 201, created
                r = await self.api.get(seed.url)
            assert r.status in (200, 404), r
            out[key] = r.body if r.status == 200 else None
        return out

    async def current(self, key: str) -> dict[str, Any]:
        return orjson.loads((await self.api.get(SEEDS[key].url)).body)

    def check(self, build: Callable[[Harness], Any]) -> None:
        self.run(self._check(build))

    async def _check(self, build: Callable[[Harness], Any]) -> None:
        await self.snapshot()
        sent: Sent = await build(self)
        # After build: it may prepare the target (bind a pod) before the request under test.
        before = await self.snapshot(reseed=False)
        headers = {}
        if sent.content_type is not None:
            headers["content-type"] = sent.content_type
        try:
            reply = await self.api.call(sent.method, sent.path, sent.body, query=sent.query, content_type=None,
                                        headers=headers, accept=sent.accept)
        except Exception as e:
            # ApiServer.handle must answer every request; an exception escaping it is a dropped
            # connection over HTTP and a crash of the in-process client.
            raise AssertionError(f"{sent!r} made ApiServer.handle raise {type(e).__name__}: {e}") from e
        try:
            await self._verify(sent, reply, before)
        finally:
            await self._drain(reply)

    async def _drain(self, reply: Reply) -> None:
        stream = reply.raw.stream
        if stream is None:
            return
        # Cancelling the first read runs the generator's cleanup (closing the store watch).
        task = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.005)
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, StopAsyncIteration):
            pass

    async def _verify(self, sent: Sent, reply: Reply, before: dict[str, bytes | None]) -> None:
        assert reply.status < 500, f"{sent!r} -> {reply!r}"
        if reply.status >= 400:
            check_status_body(sent, reply)
        after = await self.snapshot(reseed=False)
        for key in SEEDS:
            if key != sent.target:
                assert after[key] == before[key], f"{sent!r} changed {key}, which it did not address"
        if sent.target is not None and reply.status >= 400:
            assert after[sent.target] == before[sent.target], f"{sent!r} -> {reply!r} changed its target"
        if 200 <= reply.status < 300 and sent.method in ("POST", "PUT", "PATCH", "DELETE"):
            if sent.target is not None and after[sent.target] is not None:
                check_valid(sent, orjson.loads(after[sent.target]))
            elif sent.target is None and reply.raw.stream is None:
                await self._check_and_drop_new(sent, reply)

    async def _check_and_drop_new(self, sent: Sent, reply: Reply) -> None:
        obj = orjson.loads(reply.body)
        if not isinstance(obj, dict) or obj.get("kind") in ("Status", None) or obj["kind"].endswith("List"):
            return
        rt = REGISTRY.by_api_version_kind(obj.get("apiVersion", ""), obj["kind"])
        assert rt is not None, f"{sent!r} answered an unknown kind: {reply!r}"
        meta = obj.get("metadata") or {}
        try:
            stored = await self.store.get(rt.key, meta.get("namespace", ""), meta["name"])
        except Exception:  # a dry run, or not stored
            return
        check_valid(sent, stored)
        await self.store.delete(rt.key, meta.get("namespace", ""), meta["name"])


def check_status_body(sent: Sent, reply: Reply) -> None:
    try:
        s = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        raise AssertionError(f"{sent!r} -> {reply.status} without a JSON Status body: {reply.body[:300]!r}") from None
    assert isinstance(s, dict), f"{sent!r} -> {reply!r}"
    assert s.get("kind") == "Status", f"{sent!r} -> {reply!r}"
    assert s.get("apiVersion") == "v1", f"{sent!r} -> {reply!r}"
    assert s.get("status") == "Failure", f"{sent!r} -> {reply!r}"
    assert s.get("code") == reply.status, f"{sent!r} -> {reply!r}"
    assert isinstance(s.get("reason"), str) and s["reason"], f"{sent!r} -> {reply!r}"
    assert isinstance(s.get("message"), str) and s["message"].strip(), f"{sent!r} -> {reply!r}"
    if reply.status == 422:
        causes = (s.get("details") or {}).get("causes")
        assert isinstance(causes, list) and causes, f"422 without causes: {sent!r} -> {reply!r}"
        for c in causes:
            assert isinstance(c.get("field"), str) and c["field"], f"422 cause without a field: {sent!r} -> {reply!r}"


def check_valid(sent: Sent, obj: dict[str, Any]) -> None:
    rt = REGISTRY.by_api_version_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
    assert rt is not None, f"{sent!r} stored an object of unknown kind: {obj}"
    try:
        model = rt.model.model_validate(obj)
    except Exception as e:
        raise AssertionError(f"{sent!r} stored an object its model rejects: {e}\n{obj}") from None
    errors = validate_create(model)
    assert not errors, f"{sent!r} stored an invalid object: {[str(e) for e in errors]}\n{obj}"


@pytest.fixture
def harness() -> Iterator[Harness]:
    # The server logs every 5xx with its traceback; the assertion already reports it.
    logger = logging.getLogger("gpufleet.apiserver")
    was = logger.disabled
    logger.disabled = True
    h = Harness()
    try:
        yield h
    finally:
        h.close()
        logger.disabled = was


seed_keys = st.sampled_from(sorted(SEEDS))


# ----------------------------------------------------------------------------- properties


def test_malformed_creates_are_rejected_cleanly(harness: Harness) -> None:
    @FUZZ_SETTINGS
    @given(key=seed_keys, data=st.data(), ensure_ascii=st.booleans(),
           same_name=st.booleans(), as_yaml=st.booleans())
    def run(key: str, data: st.DataObject, ensure_ascii: bool, same_name: bool, as_yaml: bool) -> None:
        seed = SEEDS[key]

        async def build(h: Harness) -> Sent:
            manifest = json.loads(json.dumps(seed.manifest))
            if not same_name:
                manifest["metadata"]["name"] = "fresh"
            body = mutate(data, manifest)
            meta = body.get("metadata") if isinstance(body, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            target = key if name == seed.name else None
            if as_yaml:
                try:
                    raw = yaml.safe_dump(body).encode()
                    ctype = "application/yaml"
                except (yaml.YAMLError, RecursionError, UnicodeEncodeError):
                    raw, ctype = to_json(body, ensure_ascii), JSON
            else:
                raw, ctype = to_json(body, ensure_ascii), JSON
            query = [("fieldValidation", data.draw(st.sampled_from(["Strict", "Warn", "Ignore", "bogus"])))]
            return Sent("POST", seed.collection, raw, ctype, query, target)

        harness.check(build)

    run()


def test_malformed_updates_are_rejected_cleanly(harness: Harness) -> None:
    rvs = st.one_of(st.just("keep"), st.just("drop"), st.just("stale"), st.integers(-5, 10**20).map(str),
                    st.text(max_size=8), st.integers(0, 50), st.none(), st.sampled_from([{"a": 1}, [1], 1.5, True]))

    @FUZZ_SETTINGS
    @given(key=seed_keys, data=st.data(), rv=rvs)
    def run(key: str, data: st.DataObject, rv: Any) -> None:
        seed = SEEDS[key]

        async def build(h: Harness) -> Sent:
            do_mutate = data.draw(st.booleans(), label="mutate")
            sub = data.draw(st.sampled_from(("", *seed.subresources)), label="subresource")
            current = await h.current(key)
            body = mutate(data, current, max_mutations=2)
            if not do_mutate:
                body = current
            meta = body.get("metadata") if isinstance(body, dict) else None
            if isinstance(meta, dict):
                if rv == "drop":
                    meta.pop("resourceVersion", None)
                elif rv == "stale":
                    meta["resourceVersion"] = "1"
                elif rv != "keep":
                    meta["resourceVersion"] = rv
            path = seed.url + (f"/{sub}" if sub else "")
            if sub == "scale":
                scale = orjson.loads((await h.api.get(path)).body)
                scale_body = mutate(data, scale, max_mutations=2)
                body = scale_body if do_mutate else scale
            return Sent("PUT", path, to_json(body), JSON, [], key)

        harness.check(build)

    run()


def test_random_patches_are_rejected_cleanly(harness: Harness) -> None:
    @FUZZ_SETTINGS
    @given(key=seed_keys, data=st.data(), ctype=st.sampled_from([MERGE, JSON_PATCH, STRATEGIC, APPLY]))
    def run(key: str, data: st.DataObject, ctype: str) -> None:
        seed = SEEDS[key]

        async def build(h: Harness) -> Sent:
            sub = data.draw(st.sampled_from(("", *seed.subresources)), label="subresource")
            path = seed.url + (f"/{sub}" if sub else "")
            current = orjson.loads((await h.api.get(path)).body)
            strict = data.draw(st.booleans(), label="strict")
            if ctype == JSON_PATCH:
                patch = json_patch_ops(data, current)
            elif ctype == APPLY:
                config = {k: v for k, v in current.items() if k != "status"}
                config["metadata"] = {k: v for k, v in (current.get("metadata") or {}).items()
                                      if k in ("name", "namespace", "labels", "annotations")}
                patch = mutate(data, config, max_mutations=2)
            else:
                shape = data.draw(st.sampled_from(["partial", "partial", "random"]), label="shape")
                patch = (partial_patch(data, current, directives=ctype == STRATEGIC) if shape == "partial"
                         else data.draw(json_values, label="random patch"))
            query = [("fieldValidation", "Strict")] if strict else []
            return Sent("PATCH", path, to_json(patch), ctype, query, key)

        harness.check(build)

    run()


def test_random_deletes_are_rejected_cleanly(harness: Harness) -> None:
    options = st.fixed_dictionaries({}, optional={
        "gracePeriodSeconds": json_values,
        "propagationPolicy": st.one_of(st.sampled_from(["Foreground", "Background", "Orphan", "bogus"]), json_values),
        "preconditions": st.one_of(st.fixed_dictionaries({}, optional={"uid": json_values,
                                                                       "resourceVersion": json_values}),
                                   json_values),
        "orphanDependents": json_values,
        "dryRun": st.one_of(st.just(["All"]), json_values),
        "kind": st.sampled_from(["DeleteOptions", "Pod", ""]),
        "apiVersion": st.sampled_from(["v1", "meta.k8s.io/v1", "bogus"]),
    })
    query = st.lists(st.tuples(st.sampled_from(["gracePeriodSeconds", "propagationPolicy", "dryRun"]),
                               st.one_of(st.sampled_from(["0", "-1", "30", "All", "Foreground", "x"]),
                                         st.text(max_size=6))), max_size=2)

    @FUZZ_SETTINGS
    @given(key=seed_keys, body=st.one_of(options, json_values), query=query, bind=st.booleans())
    def run(key: str, body: Any, query: list[tuple[str, str]], bind: bool) -> None:
        seed = SEEDS[key]

        async def build(h: Harness) -> Sent:
            if key == "pod" and bind:
                # A bound pod goes through graceful deletion, which reads gracePeriodSeconds.
                await h.api.post(f"{seed.url}/binding", {"target": {"name": "node-1"}})
            return Sent("DELETE", seed.url, to_json(body), JSON, list(query), key)

        harness.check(build)

    run()


def test_random_bytes_are_rejected_cleanly(harness: Harness) -> None:
    bodies = st.one_of(
        st.binary(max_size=64),
        st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
        json_values.map(to_json),
        st.sampled_from([b"{", b"[", b"null", b"{}", b"[]", b'"x"', b"1", b"NaN", b"\xff\xfe", b'{"a":1e999}',
                         b'{"metadata":{"name":"\\ud800"}}', b"\xef\xbb\xbf{}", b"a: [1, *x]", b"!!python/none x",
                         b"- a\n- b", b"---\na: 1\n---\nb: 2", b"&a [*a]", _deep(3000, 0).encode(),
                         b"a: " + b"[" * 3000]),
    )

    @FUZZ_SETTINGS
    @given(key=seed_keys, data=st.data(), body=bodies, ctype=st.sampled_from(CONTENT_TYPES),
           method=st.sampled_from(["POST", "PUT", "PATCH", "DELETE"]))
    def run(key: str, data: st.DataObject, body: bytes, ctype: str, method: str) -> None:
        seed = SEEDS[key]

        async def build(h: Harness) -> Sent:
            if method == "POST":
                where = data.draw(st.sampled_from([seed.collection, f"{seed.url}/binding"] if key == "pod"
                                                  else [seed.collection]), label="where")
                target = key if where != seed.collection else None
            else:
                sub = data.draw(st.sampled_from(("", *seed.subresources)), label="subresource")
                where = seed.url + (f"/{sub}" if sub else "")
                target = key
            return Sent(method, where, body, ctype or None, [], target)

        harness.check(build)

    run()


def test_random_list_queries_are_rejected_cleanly(harness: Harness) -> None:
    selector_text = st.text(alphabet="abc=!,() in notin-./_ xyz9", max_size=24)
    field_text = st.one_of(
        st.lists(st.tuples(st.sampled_from(["metadata.name", "metadata.namespace", "spec.nodeName", "status.phase",
                                            "spec.bogus", "", "a.b"]),
                           st.sampled_from(["=", "==", "!=", "", "=~"]),
                           st.text(alphabet="ab\\,=-x", max_size=6)), max_size=3)
        .map(lambda parts: ",".join(f"{k}{op}{v}" for k, op, v in parts)),
        st.text(max_size=16),
    )
    tokens = st.one_of(
        st.text(max_size=24),
        json_values.map(lambda v: base64.urlsafe_b64encode(to_json(v)).decode()),
        st.fixed_dictionaries({"rv": json_values, "ns": json_values, "name": json_values})
        .map(lambda v: base64.urlsafe_b64encode(to_json(v)).decode()),
    )
    params = st.lists(st.one_of(
        st.tuples(st.just("labelSelector"), st.one_of(selector_text, st.text(max_size=12))),
        st.tuples(st.just("fieldSelector"), field_text),
        st.tuples(st.just("limit"), st.one_of(st.integers(-10, 10**20).map(str), st.text(max_size=5))),
        st.tuples(st.just("continue"), tokens),
        st.tuples(st.just("resourceVersion"), st.one_of(st.integers(-3, 10**20).map(str), st.text(max_size=5))),
        st.tuples(st.just("resourceVersionMatch"), st.sampled_from(["Exact", "NotOlderThan", "x"])),
        st.tuples(st.just("watch"), st.sampled_from(["true", "True", "1", "false", "x"])),
        st.tuples(st.just("timeoutSeconds"), st.sampled_from(["0", "-1", "1", "x", "1e400", "nan", "inf"])),
        st.tuples(st.just("includeObject"), st.sampled_from(["None", "Metadata", "Object", "x"])),
        st.tuples(st.just("allowWatchBookmarks"), st.sampled_from(["true", "x"])),
        st.tuples(st.just("sendInitialEvents"), st.sampled_from(["true", "false", "x"])),
    ), max_size=4)

    @FUZZ_SETTINGS
    @given(key=seed_keys, query=params, table=st.booleans(), all_namespaces=st.booleans())
    def run(key: str, query: list[tuple[str, str]], table: bool, all_namespaces: bool) -> None:
        seed = SEEDS[key]

        async def build(h: Harness) -> Sent:
            path = seed.collection
            if all_namespaces and "/namespaces/default/" in path:
                path = path.replace("/namespaces/default", "")
            # Table rendering runs on every listed object: the same queries exercise it too.
            accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json" if table else None
            return Sent("GET", path, b"", None, list(query), None, accept)

        harness.check(build)

    run()


def test_random_bindings_and_evictions_are_rejected_cleanly(harness: Harness) -> None:
    seed = SEEDS["pod"]
    bindings = st.fixed_dictionaries(
        {},
        optional={
            "apiVersion": st.sampled_from(["v1", "bogus"]),
            "kind": st.sampled_from(["Binding", "Eviction", ""]),
            "metadata": st.one_of(st.fixed_dictionaries({}, optional={"name": json_values, "uid": json_values}),
                                  json_values),
            "target": st.one_of(st.fixed_dictionaries({}, optional={"name": json_values, "kind": json_values,
                                                                    "apiVersion": json_values}),
                                json_values),
            "deleteOptions": st.one_of(st.fixed_dictionaries({}, optional={
                "gracePeriodSeconds": json_values, "preconditions": json_values,
                "propagationPolicy": json_values}), json_values),
        },
    )

    @FUZZ_SETTINGS
    @given(body=st.one_of(bindings, json_values), sub=st.sampled_from(["binding", "eviction"]))
    def run(body: Any, sub: str) -> None:
        async def build(h: Harness) -> Sent:
            current = await h.current("pod")
            if (current.get("spec") or {}).get("nodeName") or current["metadata"].get("deletionTimestamp"):
                # Start each example from an unbound, live pod: only those can be bound.
                await h.store.delete("pods", "default", seed.name)
                await h.snapshot()
            return Sent("POST", f"{seed.url}/{sub}", to_json(body), JSON, [], "pod")

        harness.check(build)

    run()
