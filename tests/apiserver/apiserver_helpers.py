"""Wire-level helpers for the API server tests: a thin caller over ApiServer.handle, manifest
factories and assertions on Kubernetes Status bodies.

Requests are built as RawRequest, the same pair the HTTP adapter hands the server, so what
these tests see is what kubectl and the Python client see, minus the socket.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpufleet.utils.http import RawRequest, RawResponse

JSON = "application/json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"
TABLE_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
    "application/json"
)

PODS = "/api/v1/namespaces/default/pods"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
SERVICES = "/api/v1/namespaces/default/services"
EVENTS = "/api/v1/namespaces/default/events"
NAMESPACES = "/api/v1/namespaces"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    raw: RawResponse = field(repr=False)

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)

    def __repr__(self) -> str:  # pytest prints this on a failed assertion
        return f"Reply({self.status}, {self.body[:2000]!r})"


class Api:
    """Calls ApiServer.handle with RawRequests; bodies given as dicts/lists are sent as JSON."""

    def __init__(self, server: Any) -> None:
        self.server = server

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Iterable[tuple[str, str]] | dict[str, str] = (),
        content_type: str | None = JSON,
        accept: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        if isinstance(body, bytes | bytearray):
            data = bytes(body)
        elif isinstance(body, str):
            data = body.encode()
        elif body is None:
            data = b""
        else:
            data = orjson.dumps(body)
        h: dict[str, str] = {}
        if content_type and data:
            h["content-type"] = content_type
        if accept:
            h["accept"] = accept
        h.update(headers or {})
        q = list(query.items()) if isinstance(query, dict) else list(query)
        resp = await self.server.handle(RawRequest(method, path, q, h, data))
        return Reply(resp.status, resp.headers, resp.body, resp)

    async def get(self, path: str, **kw: Any) -> Reply:
        return await self.call("GET", path, **kw)

    async def post(self, path: str, body: Any, **kw: Any) -> Reply:
        return await self.call("POST", path, body, **kw)

    async def put(self, path: str, body: Any, **kw: Any) -> Reply:
        return await self.call("PUT", path, body, **kw)

    async def patch(self, path: str, body: Any, content_type: str = MERGE, **kw: Any) -> Reply:
        return await self.call("PATCH", path, body, content_type=content_type, **kw)

    async def delete(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return await self.call("DELETE", path, body, **kw)

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        r = await self.post(path, body)
        assert r.status == 201, r
        return r.json

    async def must_get(self, path: str) -> dict[str, Any]:
        r = await self.get(path)
        assert r.status == 200, r
        return r.json

    async def watch(self, path: str, query: dict[str, str] | None = None, **kw: Any) -> WatchStream:
        q = {"watch": "true", **(query or {})}
        r = await self.get(path, query=q, **kw)
        assert r.status == 200, r
        assert r.raw.stream is not None, "a watch must answer with a stream"
        return WatchStream(r.raw.stream)


class WatchStream:
    """Reads newline-delimited watch events off a streaming RawResponse.

    A pump task drains the stream into a queue: cancelling a pending ``__anext__`` of the
    server's generator (as a timeout around it would) ends the generator, which a real HTTP
    connection never does.
    """

    def __init__(self, stream: AsyncIterator[bytes]) -> None:
        self._stream = stream
        self._queue: asyncio.Queue[bytes | None | BaseException] = asyncio.Queue()
        self._task = asyncio.create_task(self._pump())
        self.ended = False
        self.raw_lines: list[bytes] = []

    async def _pump(self) -> None:
        buf = b""
        try:
            async for chunk in self._stream:
                buf += chunk
                while b"\n" in buf:
                    line, _, buf = buf.partition(b"\n")
                    await self._queue.put(line)
            if buf.strip():
                raise AssertionError(f"the stream ended in the middle of a line: {buf!r}")
            await self._queue.put(None)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # surfaced to the reader
            await self._queue.put(e)

    async def next(self, within: float = 5.0) -> dict[str, Any] | None:
        """The next event, or None when the server closed the stream."""
        if self.ended:
            return None
        async with asyncio.timeout(within):
            item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        if item is None:
            self.ended = True
            return None
        self.raw_lines.append(item)
        return orjson.loads(item)

    async def take(self, n: int, within: float = 5.0) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            ev = await self.next(within)
            assert ev is not None, f"the stream ended after {out}"
            out.append(ev)
        return out

    async def quiet(self, within: float = 0.3) -> None:
        """Asserts that no event arrives (and the stream stays open) for a while."""
        try:
            ev = await self.next(within)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected watch event or end of stream: {ev}")

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        aclose = getattr(self._stream, "aclose", None)
        if aclose is not None:
            await aclose()


# -- Status assertions --------------------------------------------------------------------


def assert_status(
    r: Reply,
    code: int,
    reason: str,
    *,
    name: str | None = None,
    kind: str | None = None,
    group: str | None = None,
    fields: Iterable[str] | None = None,
) -> dict[str, Any]:
    """The reply is a Kubernetes Status error with this code and reason (and details)."""
    assert r.status == code, r
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    s = r.json
    assert s.get("kind") == "Status", s
    assert s.get("apiVersion") == "v1", s
    assert s.get("status") == "Failure", s
    assert s.get("code") == code, s
    assert s.get("reason") == reason, s
    assert isinstance(s.get("message"), str) and s["message"], s
    details = s.get("details") or {}
    if name is not None:
        assert details.get("name") == name, s
    if kind is not None:
        assert details.get("kind") == kind, s
    if group is not None:
        assert details.get("group") == group, s
    if fields is not None:
        got = {c.get("field") for c in details.get("causes") or []}
        missing = set(fields) - got
        assert not missing, f"causes lack fields {missing}: {s}"
    return s


def rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


# -- manifests ----------------------------------------------------------------------------


def pod(name: str, *, ns: str | None = "default", labels: dict[str, str] | None = None, **spec: Any) -> dict:
    meta: dict[str, Any] = {"name": name, "labels": labels if labels is not None else {"app": "web"}}
    if ns:
        meta["namespace"] = ns
    body_spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox:1.36"}]}
    body_spec.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body_spec}


def deployment(name: str = "web", replicas: int = 2, app: str = "web") -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {
                    "containers": [
                        {"name": "nginx", "image": "nginx:1.25", "ports": [{"containerPort": 80, "name": "http"}]}
                    ]
                },
            },
        },
    }


def configmap(name: str, *, labels: dict[str, str] | None = None, data: dict[str, str] | None = None,
              finalizers: list[str] | None = None, ns: str = "default") -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if labels:
        meta["labels"] = labels
    if finalizers:
        meta["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data or {"k": "v"}}


def service(name: str = "web") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
    }


def namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def event(name: str, about: str = "web-0") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": about, "namespace": "default", "apiVersion": "v1"},
        "reason": "Scheduled",
        "message": f"assigned default/{about}",
        "type": "Normal",
        "count": 1,
    }


def binding(pod_name: str, node: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod_name, "namespace": "default"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def clone(obj: Any) -> Any:
    return copy.deepcopy(obj)
