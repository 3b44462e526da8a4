"""POST /api/v1/namespaces/{ns}/bindings: one Binding (Kubernetes' form, the pod named in
metadata.name) or a List of them, bound in one store transaction: every pod or none, one
watch event per pod as if bound one by one. Runs on both store backends."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from apiserver_helpers import PODS, Api, assert_status, binding, pod, rv

BINDINGS = "/api/v1/namespaces/default/bindings"


def bindings(*pairs: tuple[str, str], annotate: bool = False) -> dict[str, Any]:
    items = []
    for i, (name, node) in enumerate(pairs):
        b = binding(name, node)
        if annotate:
            b["metadata"]["annotations"] = {"gpufleet.io/gpu-indices": str(i)}
        items.append(b)
    return {"apiVersion": "v1", "kind": "List", "items": items}


async def test_a_list_binds_every_pod_with_one_event_each(api: Api) -> None:
    created = [await api.create(PODS, pod(f"m-{i}")) for i in range(4)]
    w = await api.watch(PODS, {"resourceVersion": str(rv(created[-1]))})
    try:
        pairs = [(f"m-{i}", f"node-{i % 2}") for i in range(4)]
        r = await api.post(BINDINGS, bindings(*pairs, annotate=True))
        assert r.status == 201, r
        assert (r.json["kind"], r.json["status"]) == ("Status", "Success")
        events = await w.take(4)
        assert [e["type"] for e in events] == ["MODIFIED"] * 4
        assert [e["object"]["metadata"]["name"] for e in events] == [n for n, _ in pairs]
        revisions = [rv(e["object"]) for e in events]
        assert revisions == list(range(revisions[0], revisions[0] + 4))  # one transaction, in order
        await w.quiet()
    finally:
        await w.close()
    for i, (name, node) in enumerate(pairs):
        got = await api.must_get(f"{PODS}/{name}")
        assert got["spec"]["nodeName"] == node
        assert got["metadata"]["annotations"]["gpufleet.io/gpu-indices"] == str(i)
        scheduled = [c for c in got["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert [c["status"] for c in scheduled] == ["True"]
        # As the pods/{name}/binding path leaves it: only the binding changed.
        assert got["metadata"]["uid"] == created[i]["metadata"]["uid"]


async def test_a_watch_sends_the_events_of_one_transaction_in_one_chunk(api: Api) -> None:
    """The events a watch has ready go out together: the four of one bulk binding are one
    write to the connection, each still a line of its own, in order; a later event is sent as
    soon as it comes, in a chunk of its own (nothing waits for more)."""
    created = [await api.create(PODS, pod(f"c-{i}")) for i in range(4)]
    r = await api.get(PODS, query={"watch": "1", "resourceVersion": str(rv(created[-1]))})
    assert r.status == 200 and r.raw.stream is not None
    chunks = r.raw.stream.__aiter__()
    try:
        first = asyncio.ensure_future(chunks.__anext__())
        await asyncio.sleep(0.05)
        assert not first.done()  # nothing to send yet
        r = await api.post(BINDINGS, bindings(*[(f"c-{i}", "node-1") for i in range(4)]))
        assert r.status == 201, r
        chunk = await asyncio.wait_for(first, 5)
        lines = chunk.split(b"\n")
        assert lines[-1] == b"" and len(lines) == 5, chunk
        events = [orjson.loads(line) for line in lines[:-1]]
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
            ("MODIFIED", f"c-{i}") for i in range(4)]
        assert all(e["object"]["spec"]["nodeName"] == "node-1" for e in events)
        await api.create(PODS, pod("late"))
        late = await asyncio.wait_for(chunks.__anext__(), 5)
        assert late.count(b"\n") == 1 and orjson.loads(late)["object"]["metadata"]["name"] == "late"
    finally:
        await chunks.aclose()


async def test_one_binding_that_fails_stores_none(api: Api) -> None:
    for name in ("a", "b", "c"):
        await api.create(PODS, pod(name))
    await api.post(f"{PODS}/b/binding", binding("b", "node-9"))
    before = {n: await api.must_get(f"{PODS}/{n}") for n in ("a", "b", "c")}
    # Already bound: a Conflict naming the pod and the item.
    r = await api.post(BINDINGS, bindings(("a", "n1"), ("b", "n1"), ("c", "n1")))
    s = assert_status(r, 409, "Conflict", name="b", kind="pods")
    assert s["message"].startswith("items[1]: ") and "already assigned" in s["message"]
    # Missing: NotFound.
    assert_status(await api.post(BINDINGS, bindings(("a", "n1"), ("ghost", "n1"))), 404, "NotFound", name="ghost")
    # Invalid target: 422 with the item's field path.
    bad = bindings(("a", "n1"), ("c", "n1"))
    bad["items"][1]["target"]["name"] = ""
    assert_status(await api.post(BINDINGS, bad), 422, "Invalid", fields=["items[1].target.name"])
    # A stale UID: the pod was replaced since the binding was made.
    stale = bindings(("a", "n1"), ("c", "n1"))
    stale["items"][0]["metadata"]["uid"] = "not-the-uid"
    assert_status(await api.post(BINDINGS, stale), 409, "Conflict", name="a")
    # The same pod twice, another namespace, another kind, an empty list: BadRequest.
    assert_status(await api.post(BINDINGS, bindings(("a", "n1"), ("a", "n2"))), 400, "BadRequest")
    other_ns = bindings(("a", "n1"), ("c", "n1"))
    other_ns["items"][1]["metadata"]["namespace"] = "elsewhere"
    assert_status(await api.post(BINDINGS, other_ns), 400, "BadRequest")
    wrong_kind = bindings(("a", "n1"))
    wrong_kind["items"][0]["kind"] = "Pod"
    assert_status(await api.post(BINDINGS, wrong_kind), 400, "BadRequest")
    assert_status(await api.post(BINDINGS, {"apiVersion": "v1", "kind": "List", "items": []}), 400, "BadRequest")
    # Nothing of any of these was stored.
    for n, obj in before.items():
        assert await api.must_get(f"{PODS}/{n}") == obj


async def test_a_single_binding_to_the_collection_binds_the_pod_it_names(api: Api) -> None:
    """Kubernetes' own POST .../bindings (before pods/{name}/binding): the same answers."""
    await api.create(PODS, pod("p"))
    r = await api.post(BINDINGS, binding("p", "node-1"))
    assert r.status == 201, r
    assert (await api.must_get(f"{PODS}/p"))["spec"]["nodeName"] == "node-1"
    r = await api.post(BINDINGS, binding("p", "node-2"))
    assert_status(r, 409, "Conflict", name="p")
    assert not r.json["message"].startswith("items[")
    nameless = binding("p", "node-1")
    del nameless["metadata"]["name"]
    assert_status(await api.post(BINDINGS, nameless), 400, "BadRequest")
    # Only create: the collection has nothing to read.
    assert (await api.get(BINDINGS)).status in (404, 405)
