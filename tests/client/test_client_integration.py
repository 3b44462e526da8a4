"""The client against the real API server and store, in-process and over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

server_mod = pytest.importorskip("gpufleet.apiserver.server")
store_base = pytest.importorskip("gpufleet.store.base")
k8s = pytest.importorskip("gpufleet.api.k8s")

import uvicorn  # noqa: E402
from client_helpers import ManualClock, settle  # noqa: E402

from gpufleet.client.api import Client, retry_on_conflict  # noqa: E402
from gpufleet.client.errors import (  # noqa: E402
    AlreadyExists,
    Conflict,
    Gone,
    Invalid,
    NotFound,
    TransportError,
)
from gpufleet.client.events import EventRecorder  # noqa: E402
from gpufleet.client.informer import Informer, InformerScope, SharedInformerFactory  # noqa: E402
from gpufleet.client.transport import HttpTransport, LocalTransport, Params  # noqa: E402
from gpufleet.utils.http import RawResponse  # noqa: E402

NS = "default"


# -- factories -----------------------------------------------------------------------------


def pod(name: str, *, node: str | None = None, labels: dict[str, str] | None = None, ns: str = NS) -> dict:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {"app": "test"}},
        "spec": spec,
    }


def deployment(name: str, replicas: int = 1) -> Any:
    return k8s.Deployment.from_dict(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "main", "image": "nginx:1.25"}]},
                },
            },
        }
    )


# -- server fixtures -----------------------------------------------------------------------


@pytest.fixture
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    options = getattr(request, "param", None) or {}
    s = store_base.open_store("sqlite://:memory:", **options)
    await s.start()
    yield s
    await s.close()


@pytest.fixture
async def api_server(store: Any) -> Any:
    server = server_mod.ApiServer(store)
    await server.start()
    return server


@contextlib.asynccontextmanager
async def serve_http(api_server: Any) -> AsyncIterator[str]:
    app = getattr(api_server, "asgi_app", None)
    if app is None:
        from gpufleet.apiserver.app import build_asgi_app

        app = build_asgi_app(api_server.handler)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="off",
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(task, 5)
        except TimeoutError:
            task.cancel()


@pytest.fixture(params=["local", "http"])
async def transport(request: pytest.FixtureRequest, api_server: Any) -> AsyncIterator[Any]:
    if request.param == "local":
        yield LocalTransport(api_server.handler)
        return
    async with serve_http(api_server) as url:
        t = HttpTransport(url, token="ignored-by-an-open-server", timeout=10)
        try:
            yield t
        finally:
            await t.close()


@pytest.fixture
def client(transport: Any) -> Client:
    return Client(transport)


async def until(predicate: Any, within: float = 5.0) -> None:
    # Polling, because what is awaited is another component's state, not an event we own.
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


# -- CRUD ----------------------------------------------------------------------------------


async def test_crud_with_models(client: Client) -> None:
    created = await client.create(deployment("web", replicas=1))
    assert isinstance(created, k8s.Deployment)
    assert created.metadata.uid and created.metadata.resource_version

    got = await client.get(k8s.Deployment, "web", NS)
    assert got.spec.replicas == 1 and got.metadata.uid == created.metadata.uid

    listed = await client.list("deployments.apps", NS)
    assert [d.metadata.name for d in listed] == ["web"]
    assert int(listed.resource_version) >= int(created.metadata.resource_version)

    got.spec.replicas = 3
    updated = await client.update(got)
    assert updated.spec.replicas == 3
    assert int(updated.metadata.resource_version) > int(got.metadata.resource_version)

    # The stale copy names an old resourceVersion: a compare-and-swap miss.
    got.spec.replicas = 5
    with pytest.raises(Conflict):
        await client.update(got)

    async def bump() -> Any:
        current = await client.get("Deployment", "web", NS)
        current.spec.replicas = 4
        return await client.update(current)

    assert (await retry_on_conflict(bump)).spec.replicas == 4

    patched = await client.patch("deployments", "web", {"metadata": {"labels": {"tier": "fe"}}}, NS)
    assert patched.metadata.labels == {"tier": "fe"}
    patched = await client.patch(
        k8s.Deployment,
        "web",
        {"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "nginx:1.26"}]}}}},
        NS,
        patch_type="strategic",
    )
    assert patched.spec.template.spec.containers[0].image == "nginx:1.26"
    patched = await client.patch(
        "deployments", "web", [{"op": "replace", "path": "/spec/replicas", "value": 2}], NS, patch_type="json"
    )
    assert patched.spec.replicas == 2

    with pytest.raises(AlreadyExists):
        await client.create(deployment("web"))

    deleted = await client.delete(k8s.Deployment, "web", NS, propagation_policy="Background")
    assert deleted is not None
    with pytest.raises(NotFound):
        await client.get("deployments", "web", NS)
    with pytest.raises(NotFound):
        await client.delete("deployments", "web", NS)


async def test_dicts_in_and_out_and_status(client: Client) -> None:
    created = await client.create(pod("p1", node="n1"), raw=True)
    assert isinstance(created, dict) and created["metadata"]["name"] == "p1"
    as_model = await client.get("pods", "p1", NS)
    assert isinstance(as_model, k8s.Pod)

    created["status"] = {"phase": "Running"}
    updated = await client.update_status(created, raw=True)
    assert updated["status"]["phase"] == "Running"

    await client.create(pod("p2", node="n2", labels={"app": "other"}), raw=True)
    by_label = await client.list("pods", NS, label_selector={"app": "other"}, raw=True)
    assert [p["metadata"]["name"] for p in by_label] == ["p2"]
    by_field = await client.list("pods", NS, field_selector="spec.nodeName=n1", raw=True)
    assert [p["metadata"]["name"] for p in by_field] == ["p1"]
    everywhere = await client.list("pods", raw=True)
    assert {p["metadata"]["name"] for p in everywhere} == {"p1", "p2"}


async def test_pagination_follows_continue(client: Client) -> None:
    for i in range(5):
        await client.create(pod(f"page-{i}"), raw=True)
    first = await client.list("pods", NS, limit=2, raw=True)
    assert len(first) == 2 and first.continue_
    rest = await client.list("pods", NS, limit=10, continue_=first.continue_, raw=True)
    assert len(rest) == 3 and not rest.continue_
    assert rest.resource_version == first.resource_version
    everything = await client.list("pods", NS, raw=True)
    assert len(everything) == 5


async def test_invalid_object_reports_causes(client: Client) -> None:
    bad = deployment("bad").to_dict()
    bad["spec"]["replicas"] = -1
    with pytest.raises(Invalid) as exc:
        await client.create(bad)
    assert exc.value.code == 422
    assert any("replicas" in (c.get("field") or "") for c in exc.value.causes)


async def test_scale_subresource(client: Client) -> None:
    await client.create(deployment("scaled", replicas=1))
    scale = await client.get_scale("deployments", "scaled", NS, raw=True)
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 1
    await client.set_scale("deployments", "scaled", 4, NS)
    assert (await client.get(k8s.Deployment, "scaled", NS)).spec.replicas == 4


async def test_create_subresource_posts_to_it(client: Client) -> None:
    await client.create(pod("to-bind"), raw=True)
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "to-bind"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "node-9"}}
    await client.create_subresource("pods", "to-bind", "binding", binding, NS, raw=True)
    assert (await client.get("pods", "to-bind", NS, raw=True))["spec"]["nodeName"] == "node-9"
    with pytest.raises(NotFound):
        await client.create_subresource("pods", "no-such-pod", "binding", binding, NS, raw=True)


# -- watch ---------------------------------------------------------------------------------


async def test_watch_from_a_resource_version(client: Client) -> None:
    a = await client.create(pod("wa"), raw=True)
    since = a["metadata"]["resourceVersion"]
    b = await client.create(pod("wb"), raw=True)
    b["metadata"]["labels"]["step"] = "2"
    await client.update(b, raw=True)
    await client.delete("pods", "wa", NS, grace_period_seconds=0)

    seen: list[tuple[str, str]] = []
    events = client.watch("pods", NS, resource_version=since, timeout_seconds=5)
    async with asyncio.timeout(10), contextlib.aclosing(events):
        async for event in events:
            assert isinstance(event.object, k8s.Pod) or event.type == "BOOKMARK"
            if event.type != "BOOKMARK":
                seen.append((event.type, event.object.metadata.name))
            if len(seen) == 3:
                break
    assert seen[:2] == [("ADDED", "wb"), ("MODIFIED", "wb")]
    assert seen[2][1] == "wa" and seen[2][0] in ("DELETED", "MODIFIED")


async def test_watch_without_version_starts_with_current_objects(client: Client) -> None:
    await client.create(pod("w0"), raw=True)
    events = client.watch("pods", NS, timeout_seconds=5, raw=True)
    async with asyncio.timeout(10), contextlib.aclosing(events):
        async for event in events:
            assert (event.type, event.object["metadata"]["name"]) == ("ADDED", "w0")
            break


async def test_watches_and_requests_over_http_share_a_transport_and_close_together(api_server: Any) -> None:
    """Streams have a connection pool of their own (a request's pool work no longer walks
    every open watch): requests and watches interleave on one transport, every watch sees
    every event, and closing the transport ends the watches still open."""
    async with serve_http(api_server) as url:
        t = HttpTransport(url, timeout=10)
        client = Client(t)
        since = (await client.create(pod("first"), raw=True))["metadata"]["resourceVersion"]
        names = [f"p{i}" for i in range(12)]
        seen: list[list[str]] = [[], [], []]
        ended = [asyncio.Event() for _ in seen]
        saw_all = [asyncio.Event() for _ in seen]

        async def follow(i: int) -> None:
            try:
                async for event in client.watch("pods", NS, resource_version=since, raw=True):
                    if event.type == "ADDED":
                        seen[i].append(event.object["metadata"]["name"])
                        if sorted(seen[i]) == sorted(names):
                            saw_all[i].set()
            except TransportError:
                pass
            finally:
                ended[i].set()

        watchers = [asyncio.create_task(follow(i)) for i in range(len(seen))]
        try:
            await asyncio.gather(*(client.create(pod(n), raw=True) for n in names[:6]))
            for n in names[6:]:
                await client.create(pod(n), raw=True)
                assert (await client.get("pods", n, NS, raw=True))["metadata"]["name"] == n
            async with asyncio.timeout(10):
                await asyncio.gather(*(e.wait() for e in saw_all))
            await t.close()
            async with asyncio.timeout(10):
                await asyncio.gather(*(e.wait() for e in ended))
        finally:
            for w in watchers:
                w.cancel()
            await t.close()


@pytest.mark.parametrize("store", [{"history": 5, "housekeeping_interval": 0.05}], indirect=True)
async def test_watch_from_a_compacted_version_raises_gone(client: Client, store: Any) -> None:
    first = await client.create(pod("old"), raw=True)
    for i in range(12):
        await client.create(pod(f"filler-{i}"), raw=True)
    await store.compact(await store.revision() - 2)
    with pytest.raises(Gone):
        async with asyncio.timeout(10):
            async for _ in client.watch("pods", NS, resource_version=first["metadata"]["resourceVersion"]):
                pass


# -- informers -----------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def on_add(self, obj: Any) -> None:
        self.events.append(("add", obj.metadata.name))

    async def on_update(self, old: Any, new: Any) -> None:
        self.events.append(("update", new.metadata.name))

    def on_delete(self, obj: Any) -> None:
        self.events.append(("delete", obj.metadata.name))

    def names(self, what: str) -> list[str]:
        return [name for kind, name in self.events if kind == what]


async def test_informer_syncs_and_calls_handlers(client: Client) -> None:
    await client.create(pod("i1", node="n1"), raw=True)
    await client.create(pod("i2", node="n2"), raw=True)
    informer = Informer(client, k8s.Pod, namespace=NS)
    informer.add_indexer("node", lambda p: p.spec.node_name if p.spec else None)
    rec = Recorder()
    informer.add_event_handler(rec.on_add, rec.on_update, rec.on_delete)
    await informer.start()
    try:
        assert await informer.wait_for_sync(10)
        assert informer.has_synced
        assert sorted(rec.names("add")) == ["i1", "i2"]
        assert [p.metadata.name for p in informer.by_index("node", "n1")] == ["i1"]

        await client.create(pod("i3", node="n1"), raw=True)
        await until(lambda: "i3" in rec.names("add"))
        assert [p.metadata.name for p in informer.by_index("node", "n1")] == ["i1", "i3"]

        await client.patch("pods", "i1", {"metadata": {"labels": {"changed": "yes"}}}, NS)
        await until(lambda: "i1" in rec.names("update"))
        assert informer.get(f"{NS}/i1").metadata.labels["changed"] == "yes"

        await client.delete("pods", "i2", NS, grace_period_seconds=0)
        await until(lambda: informer.get(f"{NS}/i2") is None)
        await until(lambda: "i2" in rec.names("delete"))

        # A handler that arrives late is told about what is already there.
        late = Recorder()
        informer.add_event_handler(late.on_add)
        await until(lambda: sorted(late.names("add")) == ["i1", "i3"])
        assert informer.list_count == 1
    finally:
        await informer.stop()


class LoopWatch:
    """A task that, each time it gets the event loop, records what ``probe`` reads: proof that
    the loop was free while a long operation ran."""

    def __init__(self, probe: Any) -> None:
        self.probe, self.seen = probe, []
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.seen.append(self.probe())
            await asyncio.sleep(0)

    def stop(self) -> None:
        self.task.cancel()


async def test_a_long_list_leaves_the_event_loop_free_between_chunks(client: Client) -> None:
    from gpufleet.client import api as api_mod
    from gpufleet.client import informer as informer_mod

    n = informer_mod.LIST_CHUNK * 2 + 17
    assert api_mod.DECODE_CHUNK * 2 < n
    for i in range(n):
        await client.create({"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": f"cm-{i:04d}", "namespace": NS}, "data": {"i": str(i)}}, raw=True)

    # The client decodes a typed list a chunk at a time, the loop free between chunks.
    decoded = [0]
    decode = client.decode

    def counting(data: Any, rt: Any = None, *, raw: bool = False) -> Any:
        decoded[0] += 1
        return decode(data, rt, raw=raw)

    client.decode = counting  # type: ignore[method-assign]
    watch = LoopWatch(lambda: decoded[0])
    try:
        listed = await client.list(k8s.ConfigMap, NS)
    finally:
        watch.stop()
        client.decode = decode  # type: ignore[method-assign]
    assert len(listed) == n and decoded[0] == n
    assert any(0 < d < n for d in watch.seen), "nothing ran on the loop while the list was decoded"

    # An informer's first list fills its cache a chunk at a time, and says it is synced only
    # once the whole list is in.
    informer = Informer(client, k8s.ConfigMap, namespace=NS, strip_managed_fields=True)
    watch = LoopWatch(lambda: (len(informer.indexer.keys()), informer.has_synced))
    await informer.start()
    try:
        assert await informer.wait_for_sync(30)
        watch.stop()
        partial = [seen for seen in watch.seen if 0 < seen[0] < n]
        assert partial, "nothing ran on the loop while the informer filled its cache"
        assert not any(synced for _, synced in partial), "synced before the whole list was in"
        assert len(informer.indexer.keys()) == n
        assert informer.get(f"{NS}/cm-{n - 1:04d}").data == {"i": str(n - 1)}
    finally:
        watch.stop()
        await informer.stop()


async def test_an_informer_can_cache_objects_without_their_managed_fields(client: Client) -> None:
    """As kube-scheduler's and kube-controller-manager's informers: managedFields are dropped
    before an object is decoded and cached, and a full update made from a cached object keeps
    the stored ones."""
    await client.create(pod("m1"), raw=True)
    stripped = Informer(client, k8s.Pod, namespace=NS, strip_managed_fields=True)
    whole = Informer(client, "pods", namespace=NS, raw=True)
    for informer in (stripped, whole):
        await informer.start()
    try:
        assert await stripped.wait_for_sync(10) and await whole.wait_for_sync(10)
        assert stripped.get(f"{NS}/m1").metadata.managed_fields is None
        assert whole.get(f"{NS}/m1")["metadata"]["managedFields"]
        await client.patch("pods", "m1", {"metadata": {"labels": {"a": "b"}}}, NS)
        await until(lambda: (stripped.get(f"{NS}/m1").metadata.labels or {}).get("a") == "b")
        cached = stripped.get(f"{NS}/m1")
        assert cached.metadata.managed_fields is None
        cached.metadata.labels["c"] = "d"
        await client.update(cached)
        stored = await client.get("pods", "m1", NS, raw=True)
        assert stored["metadata"]["labels"]["a"] == "b" and stored["metadata"]["labels"]["c"] == "d"
        assert stored["metadata"]["managedFields"]
    finally:
        for informer in (stripped, whole):
            await informer.stop()


async def test_informer_resync_replays_updates(client: Client) -> None:
    await client.create(pod("r1"), raw=True)
    clock = ManualClock()
    informer = Informer(client, "pods", namespace=NS, resync_period=30, clock=clock)
    rec = Recorder()
    informer.add_event_handler(rec.on_add, rec.on_update, rec.on_delete)
    await informer.start()
    try:
        assert await informer.wait_for_sync(10)
        await settle()
        assert rec.events == [("add", "r1")]
        clock.advance(30)
        await until(lambda: ("update", "r1") in rec.events)
    finally:
        await informer.stop()


class Gate:
    """Wraps a transport: cut() ends the open watch streams and holds new ones back until
    release() (lists still pass), so a watch can be made to resume from a stale version."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._open = asyncio.Event()
        self._open.set()
        self._cut = asyncio.Event()
        self.held = 0

    def cut(self) -> None:
        self._open.clear()
        self._cut.set()

    def release(self) -> None:
        self._cut = asyncio.Event()
        self._open.set()

    async def request(self, method: str, path: str, **kwargs: Any) -> RawResponse:
        return await self.inner.request(method, path, **kwargs)

    async def stream(
        self, method: str, path: str, params: Params = None, *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[bytes]:
        if not self._open.is_set():
            self.held += 1
            await self._open.wait()
        cut = self._cut
        lines: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        async def pump() -> None:
            # The inner stream is read on its own task so cutting it is a plain task cancel.
            source = self.inner.stream(method, path, params, headers=headers)
            try:
                async for line in source:
                    await lines.put(("line", line))
                await lines.put(("end", None))
            except Exception as exc:
                await lines.put(("error", exc))
            finally:
                await source.aclose()

        pumping = asyncio.create_task(pump())
        try:
            while not cut.is_set():
                got = asyncio.ensure_future(lines.get())
                stop = asyncio.ensure_future(cut.wait())
                await asyncio.wait({got, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not got.done():
                    got.cancel()
                    return
                stop.cancel()
                kind, value = got.result()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            pumping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pumping

    async def close(self) -> None:
        await self.inner.close()


@pytest.mark.parametrize("store", [{"history": 5, "housekeeping_interval": 0.05}], indirect=True)
async def test_informer_recovers_from_gone_with_the_right_callbacks(
    transport: Any, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpufleet.client.informer")
    writer = Client(transport)
    for name in ("keep", "change", "remove"):
        await writer.create(pod(name), raw=True)

    gate = Gate(transport)
    informer = Informer(Client(gate), "pods", namespace=NS, backoff_initial=0.05, backoff_max=0.2)
    rec = Recorder()
    informer.add_event_handler(rec.on_add, rec.on_update, rec.on_delete)
    await informer.start()
    try:
        assert await informer.wait_for_sync(10)
        stale_version = informer.resource_version

        gate.cut()
        await until(lambda: gate.held >= 1)
        # What happens while the informer is not watching, then more than the history keeps.
        await writer.patch("pods", "change", {"metadata": {"labels": {"v": "2"}}}, NS)
        await writer.delete("pods", "remove", NS, grace_period_seconds=0)
        await writer.create(pod("new"), raw=True)
        for i in range(10):
            await writer.create(pod(f"noise-{i}", ns="kube-system"), raw=True)
        await store.compact(await store.revision() - 2)
        with pytest.raises(Gone):
            async with asyncio.timeout(5):
                async for _ in writer.watch("pods", NS, resource_version=stale_version):
                    pass

        rec.events.clear()
        gate.release()
        await until(lambda: informer.list_count >= 2, within=10)
        await until(lambda: len(rec.events) >= 3)
        assert sorted(rec.events) == [("add", "new"), ("delete", "remove"), ("update", "change")]
        assert sorted(p.metadata.name for p in informer.list()) == ["change", "keep", "new"]
        assert informer.get(f"{NS}/change").metadata.labels["v"] == "2"
        assert "watch expired" in caplog.text

        # And it watches again afterwards.
        await writer.create(pod("after"), raw=True)
        await until(lambda: ("add", "after") in rec.events)
    finally:
        await informer.stop()


async def test_shared_informer_factory_shares(client: Client) -> None:
    factory = SharedInformerFactory(client)
    a = factory.informer("pods", namespace=NS, label_selector={"app": "x"})
    b = factory.informer(k8s.Pod, namespace=NS, label_selector="app=x")
    c = factory.informer("pods")
    assert a is b and a is not c
    await client.create(pod("shared", labels={"app": "x"}), raw=True)
    await factory.start()
    try:
        assert await factory.wait_for_sync(10)
        assert [p.metadata.name for p in a.list()] == ["shared"]
        assert "default/shared" in [f"{p.metadata.namespace}/{p.metadata.name}" for p in c.list()]
    finally:
        await factory.stop()


async def test_components_share_a_factory_and_take_only_their_own_handlers_away(client: Client) -> None:
    # The scheduler and the controller manager of one process share one cache, made afresh
    # component by component (a leadership term each); the cache is listed once.
    await client.create(pod("s1"), raw=True)
    factory = SharedInformerFactory(client, strip_managed_fields=True)
    first, other = InformerScope(factory), InformerScope(factory)
    a, b = Recorder(), Recorder()
    first.informer("pods").add_event_handler(a.on_add, a.on_update, a.on_delete)
    other.informer(k8s.Pod).add_event_handler(b.on_add, b.on_update, b.on_delete)
    await first.start()
    try:
        assert await first.wait_for_sync(10) and await other.wait_for_sync(10)
        assert a.names("add") == b.names("add") == ["s1"]
        (informer,) = factory.informers()

        await first.stop()  # the first component's term ends; the other goes on
        await client.create(pod("s2"), raw=True)
        await until(lambda: "s2" in b.names("add"))
        assert "s2" not in a.names("add")

        # The next term's component is given the whole cache before it counts as synced.
        late: list[str] = []

        async def slow_add(obj: Any) -> None:  # a handler that takes its time per object
            await asyncio.sleep(0.01)
            late.append(obj.metadata.name)

        again = InformerScope(factory)
        again.informer("pods").add_event_handler(slow_add)
        assert await again.wait_for_sync(10)
        assert sorted(late) == ["s1", "s2"]
        assert informer.list_count == 1
    finally:
        await factory.stop()


async def test_a_handler_added_during_the_first_list_is_given_all_of_it(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpufleet.client.informer.LIST_CHUNK", 2)
    for i in range(6):
        await client.create(pod(f"m{i}"), raw=True)
    informer = Informer(client, "pods", namespace=NS)
    late = Recorder()
    added: list[Any] = []

    def first(obj: Any) -> None:  # called between the list's chunks: registers another
        if not added:
            added.append(informer.add_event_handler(late.on_add))

    informer.add_event_handler(first)
    await informer.start()
    try:
        assert await informer.wait_for_sync(10)
        await until(lambda: added and added[0].synced.is_set())
        assert sorted(late.names("add")) == [f"m{i}" for i in range(6)]
    finally:
        await informer.stop()


async def test_a_removed_handler_gets_no_event_queued_before_its_removal(client: Client) -> None:
    await client.create(pod("q1"), raw=True)
    await client.create(pod("q2"), raw=True)
    informer = Informer(client, "pods", namespace=NS)
    gone = Recorder()
    registration: list[Any] = []

    def first(obj: Any) -> None:  # called before `gone` for each event: takes it away
        informer.remove_event_handler(registration[0])

    informer.add_event_handler(first)
    registration.append(informer.add_event_handler(gone.on_add))
    await informer.start()
    try:
        # Both of the list's adds were queued for both handlers before either was delivered.
        assert await informer.wait_for_sync(10)
        assert gone.names("add") == []
    finally:
        await informer.stop()


# -- events --------------------------------------------------------------------------------


async def test_event_recorder_aggregates_repeats(client: Client) -> None:
    target = await client.create(pod("ev"))
    recorder = EventRecorder(client, "test-controller", host="node-1")
    for _ in range(3):
        await recorder.record(target, "Warning", "BackOff", "restarting failed container")
    await recorder.record(target, "Normal", "Pulled", "image pulled")

    events = await client.list("events", NS, field_selector="involvedObject.name=ev", raw=True)
    by_reason = {e["reason"]: e for e in events}
    assert set(by_reason) == {"BackOff", "Pulled"}
    backoff = by_reason["BackOff"]
    assert backoff["count"] == 3
    assert backoff["type"] == "Warning"
    assert backoff["source"] == {"component": "test-controller", "host": "node-1"}
    assert backoff["reportingComponent"] == "test-controller"
    assert backoff["involvedObject"]["kind"] == "Pod"
    assert backoff["involvedObject"]["uid"] == target.metadata.uid
    assert backoff["firstTimestamp"] <= backoff["lastTimestamp"]
    assert by_reason["Pulled"]["count"] == 1


async def test_a_client_that_records_no_events_writes_none(client: Client) -> None:
    target = await client.create(pod("quiet"))
    client.record_events = False
    recorder = EventRecorder(client, "test-controller")
    await recorder.record(target, "Normal", "Started", "started")
    recorder.record_nowait(target, "Normal", "Started", "started again")
    await recorder.flush()
    assert len(await client.list("events", NS, field_selector="involvedObject.name=quiet", raw=True)) == 0
    client.record_events = True
    await recorder.record(target, "Normal", "Started", "started")
    assert len(await client.list("events", NS, field_selector="involvedObject.name=quiet", raw=True)) == 1


async def test_event_recorder_never_raises(client: Client) -> None:
    recorder = EventRecorder(client, "test-controller")
    ghost = pod("ghost", ns="no-such-namespace")
    await recorder.record(ghost, "Warning", "Oops", "nowhere to write this")
    await recorder.record({"metadata": {}}, "Warning", "Oops", "no object at all")


# -- TLS and tokens over HTTP --------------------------------------------------------------


def make_certs(where: Any) -> tuple[bytes, str, str]:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it (CA PEM, cert, key)."""
    import shutil
    import subprocess

    openssl = shutil.which("openssl")
    assert openssl is not None, "openssl makes the test certificates: run scripts/setup.sh (apt-get install openssl)"

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=where)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    )
    (where / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.crt",
    )
    return (where / "ca.crt").read_bytes(), str(where / "server.crt"), str(where / "server.key")


async def test_https_with_ca_and_bearer_token(store: Any, tmp_path: Any) -> None:
    from gpufleet.apiserver.admission import UserInfo

    ca_pem, cert, key = make_certs(tmp_path)
    seen_auth: list[str | None] = []

    async def authenticate(req: Any) -> Any:
        header = req.headers.get("authorization")
        seen_auth.append(header)
        return UserInfo(name="tester") if header == "Bearer s3cret" else None

    server = server_mod.ApiServer(store, authenticator=authenticate)
    await server.start()
    from gpufleet.apiserver.app import build_asgi_app

    config = uvicorn.Config(
        build_asgi_app(server.handler),
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="off",
        ssl_certfile=cert,
        ssl_keyfile=key,
        timeout_graceful_shutdown=1,
    )
    http = uvicorn.Server(config)
    task = asyncio.create_task(http.serve())
    try:
        async with asyncio.timeout(10):
            while not http.started:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        url = f"https://127.0.0.1:{http.servers[0].sockets[0].getsockname()[1]}"

        good = Client(HttpTransport(url, token="s3cret", ca_data=ca_pem))
        await good.create(pod("tls"), raw=True)
        assert (await good.get("pods", "tls", NS, raw=True))["metadata"]["name"] == "tls"
        assert seen_auth[-1] == "Bearer s3cret"
        await good.close()

        from gpufleet.client.errors import Unauthorized
        from gpufleet.client.kubeconfig import transport_from_kubeconfig, write_kubeconfig

        wrong_token = Client(HttpTransport(url, token="nope", insecure=True))
        with pytest.raises(Unauthorized):
            await wrong_token.get("pods", "tls", NS)
        await wrong_token.close()

        untrusted = Client(HttpTransport(url, token="s3cret"), read_retries=1)
        with pytest.raises(TransportError):
            await untrusted.get("pods", "tls", NS)
        await untrusted.close()

        path = write_kubeconfig(tmp_path / "kubeconfig", url, token="s3cret", ca_data=ca_pem)
        via_file = Client(transport_from_kubeconfig(path))
        assert len(await via_file.list("pods", NS, raw=True)) == 1
        await via_file.close()
    finally:
        http.should_exit = True
        await asyncio.wait_for(task, 5)


# -- logs ----------------------------------------------------------------------------------


async def test_pod_logs_plain_and_followed(store: Any) -> None:
    asked: list[list[tuple[str, str]]] = []

    async def logs(pod_obj: dict, req: Any) -> RawResponse:
        # Stands in for the node agent the server would forward to.
        asked.append(list(req.query))
        if req.param("follow") == "true":

            async def chunks() -> AsyncIterator[bytes]:
                yield b"line 1\nline"
                yield b" 2\n"

            return RawResponse(200, {"content-type": "text/plain"}, stream=chunks())
        return RawResponse(200, {"content-type": "text/plain"}, b"hello\nworld\n")

    server = server_mod.ApiServer(store, log_provider=logs)
    await server.start()
    for make in ("local", "http"):
        async with contextlib.AsyncExitStack() as stack:
            if make == "local":
                transport: Any = LocalTransport(server.handler)
            else:
                url = await stack.enter_async_context(serve_http(server))
                transport = HttpTransport(url)
                stack.push_async_callback(transport.close)
            client = Client(transport)
            with contextlib.suppress(AlreadyExists):
                await client.create(pod("logged", node="n1"), raw=True)
            assert await client.log("logged", NS, container="main", tail_lines=5) == "hello\nworld\n"
            assert ("tailLines", "5") in asked[-1] and ("container", "main") in asked[-1]
            lines = await client.log("logged", NS, follow=True)
            assert [line async for line in lines] == ["line 1", "line 2"]
            with pytest.raises(NotFound):
                await client.log("missing", NS)
