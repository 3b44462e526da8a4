"""Request limits through a real ApiServer: body size (413 before the body is read), object
size (413, nothing stored), label and annotation limits (422 naming the field), and the seats
of max in-flight (429 with Retry-After for a tenant, never for nodes or system:masters); and
the seat logic of flowcontrol.Level on its own."""

from __future__ import annotations

import asyncio

import pytest
from apiserver_helpers import CONFIGMAPS, Api

from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.flowcontrol import (
    EXEMPT,
    SYSTEM,
    WORKLOAD,
    FlowControl,
    FlowControlConfig,
    Level,
    Rejected,
)
from gpufleet.apiserver.limits import DEFAULT_MAX_REQUEST_BODY_BYTES, MAX_OBJECT_BYTES
from gpufleet.apiserver.requestinfo import parse_request
from gpufleet.utils.http import BodyTooLarge, RawRequest

MASTERS = UserInfo("admin", ["system:masters", "system:authenticated"])
NODE = UserInfo("system:node:n1", ["system:nodes", "system:authenticated"])
TENANT = UserInfo("tenant", ["system:authenticated"])


def cm(name: str, **meta) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta}}


# --- body and object sizes ---------------------------------------------------------------------


async def test_a_body_over_the_limit_is_413_and_nothing_is_stored(api: Api) -> None:
    body = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big"},"data":{"k":"' + \
        b"x" * DEFAULT_MAX_REQUEST_BODY_BYTES + b'"}}'
    r = await api.post(CONFIGMAPS, body)
    assert r.status == 413
    assert r.json == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": "Request entity too large: limit is 3145728", "reason": "RequestEntityTooLarge",
                      "code": 413}
    assert (await api.get(f"{CONFIGMAPS}/big")).status == 404


async def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read(api: Api) -> None:
    read: list[int] = []

    async def reader(limit: int) -> bytes:
        read.append(limit)
        return b"{}"

    for path in (CONFIGMAPS, "/api/v1/namespaces/default/pods/p/log"):
        req = RawRequest("POST", path, headers={"content-length": str(31 * 1000 * 1000)}, reader=reader)
        resp = await api.server.handle(req)
        assert resp.status == 413 and b"RequestEntityTooLarge" in resp.body
    assert read == []


async def test_an_unauthenticated_body_is_never_read(make_api) -> None:
    read: list[int] = []

    async def authenticate(req: RawRequest) -> UserInfo | None:
        return TENANT if req.headers.get("authorization") == "Bearer good" else None

    api = await make_api(authenticator=authenticate)

    async def reader(limit: int) -> bytes:
        read.append(limit)
        return b'{"metadata": {"name": "c"}}'

    resp = await api.server.handle(RawRequest("POST", CONFIGMAPS, headers={"transfer-encoding": "chunked"},
                                              reader=reader))
    assert resp.status == 401 and read == []
    resp = await api.server.handle(RawRequest("POST", CONFIGMAPS, headers={"authorization": "Bearer good"},
                                              reader=reader))
    assert resp.status == 201, resp.body
    assert read == [DEFAULT_MAX_REQUEST_BODY_BYTES]


async def test_a_reader_past_the_limit_answers_413(api: Api) -> None:
    async def reader(limit: int) -> bytes:
        raise BodyTooLarge(limit)

    resp = await api.server.handle(RawRequest("POST", CONFIGMAPS, reader=reader))
    assert resp.status == 413 and b"limit is 3145728" in resp.body


async def test_an_object_over_the_stored_limit_is_413_and_not_stored(api: Api) -> None:
    # Labels have no total limit (the 2-million-label ConfigMap): the object one has.
    labels = {f"label-{i:07d}": "value-0123456789" for i in range(MAX_OBJECT_BYTES // 30)}
    r = await api.post(CONFIGMAPS, cm("big", labels=labels))
    assert r.status == 413 and r.json["reason"] == "RequestEntityTooLarge", r
    assert "over the limit of 1572864 bytes" in r.json["message"]
    assert (await api.get(f"{CONFIGMAPS}/big")).status == 404
    made = await api.create(CONFIGMAPS, cm("small"))
    made["metadata"]["labels"] = labels
    r = await api.put(f"{CONFIGMAPS}/small", made)
    assert r.status == 413, r
    after = await api.must_get(f"{CONFIGMAPS}/small")
    assert after["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"]
    assert "labels" not in after["metadata"]


async def test_large_bodies_are_decoded_off_the_loop_and_stored(api: Api) -> None:
    labels = {f"k{i:06d}": "v" for i in range(20000)}  # ~400 KiB: past the off-loop threshold
    r = await api.post(CONFIGMAPS, cm("many", labels=labels))
    assert r.status == 201, r
    assert len(r.json["metadata"]["labels"]) == 20000


# --- metadata limits ---------------------------------------------------------------------------


async def test_label_and_annotation_limits_are_422_naming_the_field(api: Api) -> None:
    r = await api.post(CONFIGMAPS, cm("a", labels={"app": "v" * 64}))
    assert r.status == 422 and r.json["reason"] == "Invalid", r
    cause = r.json["details"]["causes"][0]
    assert cause["field"] == "metadata.labels"
    assert "must be no more than 63 characters" in cause["message"]
    r = await api.post(CONFIGMAPS, cm("b", labels={"bad key!": "v"}))
    assert r.status == 422 and r.json["details"]["causes"][0]["field"] == "metadata.labels", r
    r = await api.post(CONFIGMAPS, cm("c", labels={"k" * 64: "v"}))
    assert r.status == 422 and "name part must be no more than 63 characters" in r.json["message"], r
    r = await api.post(CONFIGMAPS, cm("d", annotations={"note": "x" * (256 * 1024)}))
    assert r.status == 422, r
    assert r.json["details"]["causes"] == [{"reason": "FieldValueTooLong", "field": "metadata.annotations",
                                            "message": "Too long: must have at most 262144 bytes"}]
    for name in "abcd":
        assert (await api.get(f"{CONFIGMAPS}/{name}")).status == 404
    assert (await api.post(CONFIGMAPS, cm("e", annotations={"note": "x" * (255 * 1024)}))).status == 201


# --- max in-flight through the server ----------------------------------------------------------


async def test_a_tenant_past_its_seats_gets_429_while_nodes_and_masters_pass(make_api) -> None:
    users = {"tenant": TENANT, "node": NODE, "admin": MASTERS}

    async def authenticate(req: RawRequest) -> UserInfo | None:
        return users.get(req.headers.get("authorization", "").removeprefix("Bearer "))

    api = await make_api(authenticator=authenticate)
    api.server.flow = FlowControl(FlowControlConfig(max_requests_inflight=8, max_mutating_requests_inflight=4,
                                                    queue_wait=0))
    level = api.server.flow.levels[(WORKLOAD, False)]
    assert (level.seats, level.per_user) == (6, 1)
    await level.acquire("tenant")  # the tenant's one seat is taken by a request in progress

    def get(who: str) -> RawRequest:
        return RawRequest("GET", CONFIGMAPS, headers={"authorization": f"Bearer {who}"})

    resp = await api.server.handle(get("tenant"))
    assert resp.status == 429 and resp.headers["retry-after"] == "1"
    assert b'"reason":"TooManyRequests"' in resp.body and b'"retryAfterSeconds":1' in resp.body
    assert (await api.server.handle(get("node"))).status == 200
    assert (await api.server.handle(get("admin"))).status == 200
    # Writes have seats of their own.
    resp = await api.server.handle(RawRequest("POST", CONFIGMAPS, headers={"authorization": "Bearer tenant"},
                                              body=b'{"metadata": {"name": "w"}}'))
    assert resp.status == 201, resp.body
    level.release("tenant")
    assert (await api.server.handle(get("tenant"))).status == 200
    assert level.in_use == 0


async def test_health_probes_are_never_seated(make_api) -> None:
    api = await make_api(authenticator=lambda req: asyncio.sleep(0, None))
    api.server.flow = FlowControl(FlowControlConfig(max_requests_inflight=1, queue_wait=0))
    for path in ("/readyz", "/livez", "/healthz"):
        assert (await api.server.handle(RawRequest("GET", path))).status == 200


# --- the seat logic ----------------------------------------------------------------------------


async def test_a_user_holds_at_most_its_share_and_waits_in_a_bounded_queue() -> None:
    level = Level("workload", seats=4, per_user=2, queue_length=1, queue_wait=30)
    await level.acquire("a")
    await level.acquire("a")
    waiting = asyncio.ensure_future(level.acquire("a"))
    await asyncio.sleep(0)
    assert level.waiting("a") == 1 and not waiting.done()
    with pytest.raises(Rejected):
        await level.acquire("a")  # its queue is full
    await level.acquire("b")  # others are not held back by a's queue
    assert level.in_use == 3
    level.release("a")
    await waiting
    assert level.by_user == {"a": 2, "b": 1}


async def test_a_freed_seat_goes_to_the_waiting_user_holding_the_fewest() -> None:
    level = Level("workload", seats=2, per_user=2, queue_length=10, queue_wait=30)
    await level.acquire("a")
    await level.acquire("a")
    order: list[str] = []

    async def wait(user: str) -> None:
        await level.acquire(user)
        order.append(user)

    a2 = asyncio.ensure_future(wait("a"))
    await asyncio.sleep(0)
    b1 = asyncio.ensure_future(wait("b"))
    await asyncio.sleep(0)
    level.release("a")  # a waited first, but b holds none
    await b1
    assert order == ["b"] and not a2.done()
    level.release("a")
    await a2
    assert order == ["b", "a"] and level.by_user == {"a": 1, "b": 1}


async def test_a_wait_past_queue_wait_is_rejected_and_leaves_no_trace() -> None:
    level = Level("workload", seats=1, per_user=1, queue_length=5, queue_wait=0.01)
    await level.acquire("a")
    with pytest.raises(Rejected):
        await level.acquire("b")
    assert level.waiting() == 0 and level.rejected == 1
    cancelled = asyncio.ensure_future(level.acquire("c"))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    level.release("a")
    assert level.in_use == 0 and level.waiting() == 0 and level.by_user == {}


async def test_a_granted_seat_whose_request_went_away_is_given_back() -> None:
    level = Level("workload", seats=1, per_user=1, queue_length=5, queue_wait=30)
    await level.acquire("a")
    waiter = asyncio.ensure_future(level.acquire("b"))
    await asyncio.sleep(0)
    level.release("a")  # granted to b ...
    waiter.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert level.in_use == 0 and level.by_user == {}


def test_requests_are_sorted_into_levels() -> None:
    flow = FlowControl()
    assert flow.priority(MASTERS) == EXEMPT
    assert flow.priority(NODE) == SYSTEM
    assert flow.priority(UserInfo("system:kube-scheduler", [])) == SYSTEM
    assert flow.priority(UserInfo("system:serviceaccount:kube-system:gc", [])) == SYSTEM
    assert flow.priority(UserInfo("system:serviceaccount:team-a:default", [])) == WORKLOAD
    assert flow.priority(TENANT) == WORKLOAD

    def info(method: str, path: str, watch: bool = False):
        return parse_request(method, path, watch)

    assert flow.level_for(TENANT, info("GET", CONFIGMAPS)).name == "workload"
    assert flow.level_for(TENANT, info("POST", CONFIGMAPS)).name == "workload-mutating"
    assert flow.level_for(NODE, info("PATCH", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1")
                          ).name == "system-mutating"
    assert flow.level_for(MASTERS, info("GET", CONFIGMAPS)) is None
    # Long-running requests take no seat at all; a watch holds one only until it streams.
    assert flow.level_for(TENANT, info("GET", "/api/v1/namespaces/default/pods/p/log")) is None
    assert flow.level_for(TENANT, info("GET", "/api/v1/nodes/n1/proxy/stats")) is None
    assert flow.level_for(TENANT, info("GET", CONFIGMAPS, watch=True)).name == "workload"
    sizes = {name: (lv.seats, lv.per_user) for (name, _), lv in flow.levels.items() if not _}
    assert sizes == {"system": (100, 100), "workload": (300, 75)}
    unlimited = FlowControl(FlowControlConfig(max_requests_inflight=0, max_mutating_requests_inflight=0))
    assert unlimited.level_for(TENANT, info("GET", CONFIGMAPS)) is None
