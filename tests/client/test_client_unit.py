"""Client and LocalTransport behaviour that needs no API server: a handler that answers
from a script and records what it was asked."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest
from client_helpers import ManualClock

from gpufleet.api.registry import REGISTRY
from gpufleet.client.api import Client, retry_on_conflict
from gpufleet.client.errors import Conflict, Gone, NotFound, TransportError
from gpufleet.client.informer import Indexer
from gpufleet.client.transport import LocalTransport, encode_params
from gpufleet.utils.http import RawRequest, RawResponse


class ScriptedHandler:
    def __init__(self, answer: Callable[[RawRequest], RawResponse]) -> None:
        self.answer = answer
        self.requests: list[RawRequest] = []

    async def handle(self, request: RawRequest) -> RawResponse:
        self.requests.append(request)
        return self.answer(request)


def json_response(status: int, body: object) -> RawResponse:
    return RawResponse(status, {"Content-Type": "application/json"}, json.dumps(body).encode())


def streaming(chunks: list[bytes], closed: list[bool] | None = None) -> RawResponse:
    async def gen() -> AsyncIterator[bytes]:
        try:
            for c in chunks:
                yield c
        finally:
            if closed is not None:
                closed.append(True)

    return RawResponse(200, {"content-type": "application/json"}, stream=gen())


def test_encode_params() -> None:
    assert encode_params({"a": None, "b": True, "c": False, "d": 3, "e": "x"}) == [
        ("b", "true"),
        ("c", "false"),
        ("d", "3"),
        ("e", "x"),
    ]
    assert encode_params([("k", "1"), ("k", "2")]) == [("k", "1"), ("k", "2")]


async def test_local_transport_builds_raw_requests() -> None:
    handler = ScriptedHandler(lambda r: json_response(200, {"ok": True}))
    t = LocalTransport(handler)
    resp = await t.request(
        "post",
        "/api/v1/namespaces/x/pods?dryRun=All",
        params={"fieldManager": "me"},
        json={"a": 1},
        headers={"X-Thing": "1"},
    )
    req = handler.requests[0]
    assert req.method == "POST" and req.path == "/api/v1/namespaces/x/pods"
    assert req.query == [("dryRun", "All"), ("fieldManager", "me")]
    assert req.headers["content-type"] == "application/json" and req.headers["x-thing"] == "1"
    assert json.loads(req.body) == {"a": 1}
    assert resp.status == 200 and resp.headers["content-type"] == "application/json"


async def test_local_stream_splits_lines_across_chunks_and_closes_source() -> None:
    closed: list[bool] = []
    handler = ScriptedHandler(lambda r: streaming([b'{"a":', b'1}\n{"b"', b":2}\r\n", b"tail"], closed))
    lines = [line async for line in LocalTransport(handler).stream("GET", "/x")]
    assert lines == [b'{"a":1}', b'{"b":2}', b"tail"]
    assert closed == [True]

    closed.clear()
    handler = ScriptedHandler(lambda r: streaming([b"1\n", b"2\n", b"3\n"], closed))
    it = LocalTransport(handler).stream("GET", "/x")
    assert await it.__anext__() == b"1"
    await it.aclose()
    assert closed == [True]


async def test_stream_lines_of_chunks_holding_many_lines_or_parts_of_one() -> None:
    """A watch sends the events it has ready in one chunk: every line of it, in order, and a
    line cut across chunks (or empty chunks between) is put back together."""
    chunks = [b"1\n2\r\n3\n{\"par", b"", b"t\":", b"1}\n4\n", b"5", b"\n\n6\n7"]
    handler = ScriptedHandler(lambda r: streaming(chunks))
    lines = [line async for line in LocalTransport(handler).stream("GET", "/x")]
    assert lines == [b"1", b"2", b"3", b'{"part":1}', b"4", b"5", b"", b"6", b"7"]


async def test_local_stream_error_status_raises() -> None:
    handler = ScriptedHandler(
        lambda r: json_response(
            404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": 'pods "x" not found'}
        )
    )
    with pytest.raises(NotFound, match='pods "x" not found'):
        async for _ in LocalTransport(handler).stream("GET", "/x"):
            pass


def test_kinds_resolve_from_classes_names_and_types() -> None:
    k8s = pytest.importorskip("gpufleet.api.k8s")
    client = Client(LocalTransport(ScriptedHandler(lambda r: json_response(200, {}))))
    deploy = REGISTRY.by_key("deployments.apps")
    for kind in (
        k8s.Deployment,
        deploy,
        "deployments",
        "deployments.apps",
        "Deployment",
        "deploy",
        "apps/v1/Deployment",
    ):
        assert client.resource_type(kind) is deploy
    with pytest.raises(LookupError):
        client.resource_type("flux-capacitors")


async def test_list_follows_continue_and_keeps_the_first_resource_version() -> None:
    def answer(req: RawRequest) -> RawResponse:
        token = req.param("continue")
        if token is None:
            return json_response(
                200,
                {
                    "kind": "PodList",
                    "metadata": {"resourceVersion": "7", "continue": "p2"},
                    "items": [{"metadata": {"name": "a", "namespace": "d"}}],
                },
            )
        return json_response(
            200,
            {
                "kind": "PodList",
                "metadata": {"resourceVersion": "7"},
                "items": [{"metadata": {"name": "b", "namespace": "d"}}],
            },
        )

    handler = ScriptedHandler(answer)
    client = Client(LocalTransport(handler))
    result = await client.list("pods", label_selector={"app": "web"}, raw=True)
    assert [p["metadata"]["name"] for p in result] == ["a", "b"]
    assert result.resource_version == "7" and result.continue_ == ""
    assert handler.requests[0].path == "/api/v1/pods"
    assert handler.requests[0].param("labelSelector") == "app=web"
    assert handler.requests[1].param("continue") == "p2"

    one_page = await client.list("pods", "d", limit=1, raw=True)
    assert len(one_page) == 1 and one_page.continue_ == "p2"
    assert handler.requests[-1].path == "/api/v1/namespaces/d/pods"


async def test_list_returns_models_when_available() -> None:
    k8s = pytest.importorskip("gpufleet.api.k8s")
    body = {
        "kind": "PodList",
        "metadata": {"resourceVersion": "3"},
        "items": [{"metadata": {"name": "a", "namespace": "d"}, "spec": {"containers": []}}],
    }
    client = Client(LocalTransport(ScriptedHandler(lambda r: json_response(200, body))))
    result = await client.list(k8s.Pod)
    assert isinstance(result.items[0], k8s.Pod)
    assert result.items[0].metadata.name == "a"


async def test_watch_decodes_events_bookmarks_and_raises_gone() -> None:
    events = [
        {
            "type": "ADDED",
            "object": {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"name": "a", "namespace": "d", "resourceVersion": "5"},
            },
        },
        {
            "type": "BOOKMARK",
            "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}},
        },
        {
            "type": "ERROR",
            "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
        },
    ]
    body = [json.dumps(e).encode() + b"\n" for e in events]
    handler = ScriptedHandler(lambda r: streaming(list(body)))
    client = Client(LocalTransport(handler))
    seen = []
    with pytest.raises(Gone, match="too old"):
        async for ev in client.watch("pods", "d", resource_version="4", raw=True):
            seen.append((ev.type, ev.resource_version))
    assert seen == [("ADDED", "5"), ("BOOKMARK", "9")]
    req = handler.requests[0]
    assert req.param("watch") == "true" and req.param("resourceVersion") == "4"
    assert req.param("allowWatchBookmarks") == "true"


async def test_reads_retry_connection_errors_but_writes_do_not(clock: ManualClock) -> None:
    class Flaky:
        def __init__(self) -> None:
            self.calls = 0

        async def request(self, method, path, **kw):
            self.calls += 1
            if self.calls < 3:
                raise TransportError("refused")
            return json_response(200, {"kind": "Pod", "metadata": {"name": "a"}})

        async def close(self) -> None:
            pass

    class Sleepless(ManualClock):
        async def sleep(self, seconds: float) -> None:
            self.advance(seconds)

    flaky = Flaky()
    client = Client(flaky, clock=Sleepless())
    assert (await client.get("pods", "a", "d", raw=True))["metadata"]["name"] == "a"
    assert flaky.calls == 3
    flaky.calls = 0
    with pytest.raises(TransportError):
        await client.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}}, "d")
    assert flaky.calls == 1


async def test_retry_on_conflict(clock: ManualClock) -> None:
    attempts = 0

    async def update() -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise Conflict(409, "Conflict", "modified")
        return "done"

    class Sleepless(ManualClock):
        async def sleep(self, seconds: float) -> None:
            self.advance(seconds)

    assert await retry_on_conflict(update, clock=Sleepless()) == "done"
    attempts = -10
    with pytest.raises(Conflict):
        await retry_on_conflict(update, attempts=2, clock=Sleepless())
    assert attempts == -8


def test_indexer_keeps_indices_current() -> None:
    idx = Indexer()

    def p(name: str, node: str | None, ns: str = "d") -> dict:
        return {"metadata": {"name": name, "namespace": ns}, "spec": {"nodeName": node} if node else {}}

    idx.put("d/a", p("a", "n1"))
    idx.add_indexer("node", lambda o: o["spec"].get("nodeName"))
    idx.put("d/b", p("b", "n1"))
    idx.put("x/c", p("c", None, "x"))
    assert [o["metadata"]["name"] for o in idx.by_index("node", "n1")] == ["a", "b"]
    idx.put("d/a", p("a", "n2"))
    assert [o["metadata"]["name"] for o in idx.by_index("node", "n1")] == ["b"]
    assert [o["metadata"]["name"] for o in idx.by_index("node", "n2")] == ["a"]
    assert [o["metadata"]["name"] for o in idx.by_index("namespace", "x")] == ["c"]
    idx.pop("d/b")
    assert idx.by_index("node", "n1") == []
    assert len(idx) == 2 and "d/a" in idx and idx.get("d/b") is None
    with pytest.raises(KeyError):
        idx.by_index("nope", "v")
