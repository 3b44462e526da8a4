"""Kubernetes REST semantics of the API server, as kubectl, client-go informers and the official
Python client rely on them. Every test runs on both store backends (see `store_url`).

Status codes, reasons and details are asserted exactly: kubectl builds its messages from
them (`Error from server (AlreadyExists)`, `The Deployment "web" is invalid: spec.replicas: ...`)
and clients branch on the code (409 -> re-read and retry, 410 -> relist).
"""

from __future__ import annotations

import asyncio
import base64
import re
import uuid

import httpx
import orjson
import pytest
from apiserver_helpers import (
    APPLY,
    CONFIGMAPS,
    DEPLOYMENTS,
    EVENTS,
    JSON_PATCH,
    MERGE,
    NAMESPACES,
    PODS,
    SERVICES,
    STRATEGIC,
    TABLE_ACCEPT,
    Api,
    assert_status,
    binding,
    clone,
    configmap,
    deployment,
    event,
    namespace,
    pod,
    rv,
    service,
)

from gpufleet.apiserver.app import HttpServer
from gpufleet.utils.clock import FakeClock, parse_rfc3339

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


# ============================================================================ create


async def test_create_sets_system_fields_and_ignores_client_ones(api: Api) -> None:
    body = deployment()
    body["metadata"].update(uid="client-uid", resourceVersion="999", generation=7,
                            creationTimestamp="2001-01-01T00:00:00Z")
    r = await api.post(DEPLOYMENTS, body)
    assert r.status == 201, r
    obj = r.json
    meta = obj["metadata"]
    assert obj["kind"] == "Deployment" and obj["apiVersion"] == "apps/v1"
    assert meta["name"] == "web" and meta["namespace"] == "default"
    assert str(uuid.UUID(meta["uid"])) == meta["uid"] and meta["uid"] != "client-uid"
    assert RFC3339.match(meta["creationTimestamp"]) and not meta["creationTimestamp"].startswith("2001")
    assert meta["resourceVersion"].isdigit() and meta["resourceVersion"] != "999"
    assert meta["generation"] == 1
    assert "status" not in obj or not obj["status"].get("replicas")
    got = await api.must_get(f"{DEPLOYMENTS}/web")
    assert got == obj


async def test_create_namespace_comes_from_the_url(api: Api) -> None:
    r = await api.post(PODS, pod("nons", ns=None))
    assert r.status == 201, r
    assert r.json["metadata"]["namespace"] == "default"


async def test_generate_name(api: Api) -> None:
    body = pod("", labels={"app": "gen"})
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = "web-"
    a = await api.create(PODS, body)
    b = await api.create(PODS, body)
    for obj in (a, b):
        name = obj["metadata"]["name"]
        assert name.startswith("web-") and len(name) == len("web-") + 5, name
        assert obj["metadata"]["generateName"] == "web-"
    assert a["metadata"]["name"] != b["metadata"]["name"]
    await api.must_get(f"{PODS}/{a['metadata']['name']}")


async def test_generated_names_and_uids_come_from_the_servers_random_source(make_api) -> None:
    # A replay (`gpufleet simulate --seed`) gives its server a seeded source: the same seed,
    # the same names and uids. A generated name already taken is generated again.
    import random
    import uuid

    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "cfg-"}}

    async def made(api: Api) -> list[tuple[str, str]]:
        out = []
        for _ in range(3):
            meta = (await api.create(CONFIGMAPS, body))["metadata"]
            assert meta["name"].startswith("cfg-") and len(meta["name"]) == len("cfg-") + 5
            assert uuid.UUID(meta["uid"]).version == 4
            out.append((meta["name"], meta["uid"]))
        return out

    first = await made(await make_api(rng=random.Random(7)))
    assert len({name for name, _ in first}) == 3
    other = await make_api(rng=random.Random(8))
    assert not set(first) & set(await made(other))
    for name, _ in first:
        assert (await other.delete(f"{CONFIGMAPS}/{name}")).status == 200
    # The same seed on a server of its own: the same three, names and uids.
    third = await make_api(rng=random.Random(7))
    assert await made(third) == first
    # Once more while they exist: each first pick is taken, so it is generated again.
    third.server.set_rng(random.Random(7))
    again = await made(third)
    assert not {name for name, _ in again} & {name for name, _ in first}
    for name, uid in again:  # stored under the name it was given
        assert (await third.must_get(f"{CONFIGMAPS}/{name}"))["metadata"]["uid"] == uid
    # Each resource draws from its own stream: objects of another kind made in between
    # change no ConfigMap's name or uid (compared by the random part, under a new prefix).
    fourth = await make_api(rng=random.Random(7))
    for _ in range(5):
        made_pod = {**pod("x"), "metadata": {"generateName": "p-", "namespace": "default"}}
        assert (await fourth.post(PODS, made_pod)).status == 201
    fresh = [(await fourth.create(CONFIGMAPS, {**body, "metadata": {"generateName": "new-"}}))["metadata"]
             for _ in range(3)]
    assert [(m["name"][len("new-"):], m["uid"]) for m in fresh] == [(n[len("cfg-"):], u) for n, u in first]


async def test_create_without_name_or_generate_name_is_invalid(api: Api) -> None:
    body = pod("x")
    del body["metadata"]["name"]
    r = await api.post(PODS, body)
    assert_status(r, 422, "Invalid", kind="Pod", fields=["metadata.name"])


async def test_create_namespace_mismatch_is_400(api: Api) -> None:
    r = await api.post(PODS, pod("x", ns="kube-system"))
    assert_status(r, 400, "BadRequest")
    assert (await api.get(f"{PODS}/x")).status == 404
    assert (await api.get("/api/v1/namespaces/kube-system/pods/x")).status == 404


async def test_create_in_missing_namespace_is_404(api: Api) -> None:
    r = await api.post("/api/v1/namespaces/nope/pods", pod("x", ns="nope"))
    assert_status(r, 404, "NotFound", name="nope", kind="namespaces")
    assert r.json["message"] == 'namespaces "nope" not found'


async def test_create_twice_is_409_already_exists(api: Api) -> None:
    await api.create(DEPLOYMENTS, deployment())
    r = await api.post(DEPLOYMENTS, deployment())
    assert_status(r, 409, "AlreadyExists", name="web", kind="deployments", group="apps")
    assert r.json["message"] == 'deployments.apps "web" already exists'
    r = await api.post(PODS, pod("p"))
    r = await api.post(PODS, pod("p"))
    s = assert_status(r, 409, "AlreadyExists", name="p", kind="pods")
    assert "group" not in s["details"]


async def test_invalid_object_is_422_with_causes(api: Api) -> None:
    body = deployment()
    body["spec"]["replicas"] = -1
    body["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    r = await api.post(DEPLOYMENTS, body)
    s = assert_status(r, 422, "Invalid", name="web", kind="Deployment", group="apps",
                      fields=["spec.replicas", "spec.template.metadata.labels"])
    assert s["message"].startswith('Deployment.apps "web" is invalid: ')
    assert (await api.get(f"{DEPLOYMENTS}/web")).status == 404


async def test_wrong_kind_in_body_is_400(api: Api) -> None:
    body = pod("x")
    body["kind"] = "Service"
    assert_status(await api.post(PODS, body), 400, "BadRequest")


async def test_strict_field_validation_names_the_unknown_field(api: Api) -> None:
    body = pod("strict")
    body["spec"]["bogus"] = 1
    r = await api.post(PODS, body, query={"fieldValidation": "Strict"})
    assert_status(r, 400, "BadRequest", fields=["spec.bogus"])
    r = await api.post(PODS, body, query={"fieldValidation": "Warn"})
    assert r.status == 201, r
    assert "spec.bogus" in r.headers.get("warning", "")
    assert "bogus" not in r.json["spec"]


# ============================================================================ get / list


async def test_get_missing_is_404_with_details(api: Api) -> None:
    r = await api.get(f"{PODS}/nope")
    assert_status(r, 404, "NotFound", name="nope", kind="pods")
    assert r.json["message"] == 'pods "nope" not found'
    r = await api.get(f"{DEPLOYMENTS}/nope")
    assert_status(r, 404, "NotFound", name="nope", kind="deployments", group="apps")


async def test_unknown_resource_is_404_status(api: Api) -> None:
    assert_status(await api.get("/api/v1/namespaces/default/foos"), 404, "NotFound")
    assert_status(await api.get("/apis/nope.example.com/v1/things"), 404, "NotFound")


async def _names(api: Api, path: str, **query: str) -> list[str]:
    r = await api.get(path, query=query)
    assert r.status == 200, r
    return sorted(i["metadata"]["name"] for i in r.json["items"])


async def test_label_selectors_equality_and_set_based(api: Api) -> None:
    labels = {
        "a": {"app": "web", "tier": "fe"},
        "b": {"app": "web", "tier": "be"},
        "c": {"app": "db", "tier": "be", "canary": "true"},
        "d": {"app": "batch"},
        "e": {},
    }
    for name, lab in labels.items():
        await api.create(PODS, pod(name, labels=lab))
    cases = {
        "app=web": ["a", "b"],
        "app==web": ["a", "b"],
        "app!=web": ["c", "d", "e"],
        "app=web,tier=be": ["b"],
        "tier in (fe,be)": ["a", "b", "c"],
        "tier notin (fe)": ["b", "c", "d", "e"],
        "tier": ["a", "b", "c"],
        "!tier": ["d", "e"],
        "!canary,tier in (be)": ["b"],
        "app in (web, db),tier notin (fe)": ["b", "c"],
        "app": ["a", "b", "c", "d"],
        "": ["a", "b", "c", "d", "e"],
    }
    for sel, want in cases.items():
        assert await _names(api, PODS, labelSelector=sel) == want, sel


async def test_bad_label_selector_is_400(api: Api) -> None:
    for sel in ("app in (", "a=b=c", "!", "app notin web", "Bad Key=1", "x=" + "v" * 70):
        assert_status(await api.get(PODS, query={"labelSelector": sel}), 400, "BadRequest")


async def test_field_selectors(api: Api) -> None:
    await api.create("/api/v1/namespaces", namespace("other"))
    for name in ("p1", "p2", "p3"):
        await api.create(PODS, pod(name))
    await api.create("/api/v1/namespaces/other/pods", pod("p1", ns="other"))
    r = await api.post(f"{PODS}/p1/binding", binding("p1", "node-a"))
    assert r.status == 201, r
    r = await api.post(f"{PODS}/p2/binding", binding("p2", "node-b"))
    assert r.status == 201, r
    running = await api.must_get(f"{PODS}/p2")
    running["status"] = {"phase": "Running"}
    r = await api.put(f"{PODS}/p2/status", running)
    assert r.status == 200, r

    assert await _names(api, PODS, fieldSelector="metadata.name=p1") == ["p1"]
    assert await _names(api, PODS, fieldSelector="metadata.name!=p1") == ["p2", "p3"]
    assert await _names(api, "/api/v1/pods", fieldSelector="metadata.name=p1") == ["p1", "p1"]
    assert await _names(api, "/api/v1/pods", fieldSelector="metadata.namespace=other") == ["p1"]
    assert await _names(api, "/api/v1/pods", fieldSelector="metadata.namespace!=other") == ["p1", "p2", "p3"]
    assert await _names(api, PODS, fieldSelector="spec.nodeName=node-a") == ["p1"]
    # The scheduler's query for pods that still need a node.
    assert await _names(api, "/api/v1/pods", fieldSelector="spec.nodeName=") == ["p1", "p3"]
    assert await _names(api, PODS, fieldSelector="status.phase=Running") == ["p2"]
    assert await _names(api, PODS, fieldSelector="status.phase!=Running,spec.nodeName!=") == ["p1"]
    assert await _names(api, PODS, fieldSelector="status.phase=Pending", labelSelector="app=web") == ["p1", "p3"]
    assert await _names(api, PODS, fieldSelector="metadata.name=nope") == []


async def test_unsupported_field_label_is_400(api: Api) -> None:
    await api.create(PODS, pod("p1"))
    r = await api.get(PODS, query={"fieldSelector": "spec.containers=x"})
    s = assert_status(r, 400, "BadRequest")
    assert "spec.containers" in s["message"]
    r = await api.get(CONFIGMAPS, query={"fieldSelector": "status.phase=Running"})
    assert_status(r, 400, "BadRequest")
    r = await api.get(PODS, query={"fieldSelector": "status.phase"})
    assert_status(r, 400, "BadRequest")


async def test_list_all_namespaces(api: Api) -> None:
    await api.create(NAMESPACES, namespace("team-a"))
    await api.create(PODS, pod("x"))
    await api.create("/api/v1/namespaces/team-a/pods", pod("y", ns="team-a"))
    r = await api.get("/api/v1/pods")
    assert r.status == 200, r
    got = sorted((i["metadata"]["namespace"], i["metadata"]["name"]) for i in r.json["items"])
    assert got == [("default", "x"), ("team-a", "y")]
    assert r.json["kind"] == "PodList" and r.json["apiVersion"] == "v1"
    assert await _names(api, "/api/v1/namespaces/team-a/pods") == ["y"]
    names = await _names(api, NAMESPACES)
    assert {"default", "kube-system", "kube-public", "kube-node-lease", "team-a"} <= set(names)


@pytest.mark.parametrize("selector", [None, "keep=yes"])
async def test_pagination_walks_every_item_exactly_once(api: Api, selector: str | None) -> None:
    want = []
    for i in range(11):
        keep = i % 3 != 1
        await api.create(CONFIGMAPS, configmap(f"cm-{i:02d}", labels={"keep": "yes" if keep else "no"}))
        if keep or selector is None:
            want.append(f"cm-{i:02d}")
    seen: list[str] = []
    token = None
    list_rvs = set()
    pages = 0
    while True:
        q = {"limit": "3"}
        if selector:
            q["labelSelector"] = selector
        if token:
            q["continue"] = token
        r = await api.get(CONFIGMAPS, query=q)
        assert r.status == 200, r
        body = r.json
        pages += 1
        assert len(body["items"]) <= 3
        seen += [i["metadata"]["name"] for i in body["items"]]
        list_rvs.add(body["metadata"]["resourceVersion"])
        token = body["metadata"].get("continue")
        if not token:
            break
        assert pages < 20, "the continue tokens never end"
    assert seen == want
    assert pages >= len(want) // 3
    # Every page of one list is read at the revision of its first page.
    assert len(list_rvs) == 1


async def test_continued_pages_are_a_snapshot_of_the_first(api: Api) -> None:
    # Kubernetes serves every page of a paginated list at the first page's resourceVersion,
    # so `kubectl get --chunk-size` prints one consistent state.
    for i in range(6):
        await api.create(CONFIGMAPS, configmap(f"cm-{i}"))
    r = await api.get(CONFIGMAPS, query={"limit": "3"})
    first = r.json
    token = first["metadata"]["continue"]
    old_cm4 = await api.must_get(f"{CONFIGMAPS}/cm-4")
    await api.create(CONFIGMAPS, configmap("cm-9"))
    await api.delete(f"{CONFIGMAPS}/cm-5")
    await api.patch(f"{CONFIGMAPS}/cm-4", {"data": {"k": "new"}})
    r = await api.get(CONFIGMAPS, query={"limit": "3", "continue": token})
    assert r.status == 200, r
    rest = r.json
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert [i["metadata"]["name"] for i in rest["items"]] == ["cm-3", "cm-4", "cm-5"]
    assert rest["items"][1] == old_cm4


async def test_malformed_continue_and_limit_are_400(api: Api) -> None:
    await api.create(CONFIGMAPS, configmap("a"))
    assert_status(await api.get(CONFIGMAPS, query={"continue": "!!garbage!!"}), 400, "BadRequest")
    assert_status(await api.get(CONFIGMAPS, query={"limit": "ten"}), 400, "BadRequest")
    # limit is an int64 on the wire.
    assert_status(await api.get(CONFIGMAPS, query={"limit": "99999999999999999999"}), 400, "BadRequest")
    # A token that decodes but holds the wrong types is as malformed as one that does not decode.
    for token in ({"rv": 1, "ns": {"a": 1}, "name": "x"}, {"rv": 1, "ns": "default", "name": [1]},
                  {"rv": "x", "ns": "default", "name": "a"}, [1, 2]):
        q = {"limit": "1", "continue": base64.urlsafe_b64encode(orjson.dumps(token)).decode()}
        assert_status(await api.get(CONFIGMAPS, query=q), 400, "BadRequest")


async def test_list_resource_version(api: Api) -> None:
    a = await api.create(CONFIGMAPS, configmap("a"))
    b = await api.create(CONFIGMAPS, configmap("b"))
    first = (await api.get(CONFIGMAPS)).json
    list_rv = int(first["metadata"]["resourceVersion"])
    assert list_rv >= max(rv(a), rv(b))
    assert [rv(i) for i in first["items"]] == [rv(a), rv(b)]
    c = await api.create(CONFIGMAPS, configmap("c"))
    assert rv(c) > list_rv
    second = (await api.get(CONFIGMAPS)).json
    assert int(second["metadata"]["resourceVersion"]) >= rv(c)
    # resourceVersion=0 ("any cached state") is what informers send: still a full list.
    r = await api.get(CONFIGMAPS, query={"resourceVersion": "0"})
    assert [i["metadata"]["name"] for i in r.json["items"]] == ["a", "b", "c"]


# ============================================================================ update


async def test_update_with_stale_resource_version_is_409(api: Api) -> None:
    obj = await api.create(DEPLOYMENTS, deployment())
    fresh = clone(obj)
    fresh["spec"]["replicas"] = 3
    r = await api.put(f"{DEPLOYMENTS}/web", fresh)
    assert r.status == 200, r
    stale = clone(obj)
    stale["spec"]["replicas"] = 4
    r = await api.put(f"{DEPLOYMENTS}/web", stale)
    assert_status(r, 409, "Conflict", name="web", kind="deployments", group="apps")
    assert r.json["message"].startswith('Operation cannot be fulfilled on deployments.apps "web"')
    now = await api.must_get(f"{DEPLOYMENTS}/web")
    assert now["spec"]["replicas"] == 3


async def test_update_without_resource_version_succeeds(api: Api) -> None:
    obj = await api.create(DEPLOYMENTS, deployment())
    body = clone(obj)
    del body["metadata"]["resourceVersion"]
    body["spec"]["replicas"] = 5
    r = await api.put(f"{DEPLOYMENTS}/web", body)
    assert r.status == 200, r
    assert r.json["spec"]["replicas"] == 5
    assert rv(r.json) > rv(obj)
    assert r.json["metadata"]["uid"] == obj["metadata"]["uid"]


async def test_update_with_a_malformed_resource_version_is_400(api: Api) -> None:
    obj = await api.create(CONFIGMAPS, configmap("c"))
    for bad in ({"a": 1}, [1], "abc", 1.5):
        body = clone(obj)
        body["metadata"]["resourceVersion"] = bad
        assert_status(await api.put(f"{CONFIGMAPS}/c", body), 400, "BadRequest")
        r = await api.patch(f"{CONFIGMAPS}/c", {"metadata": {"resourceVersion": bad}, "data": {"k": "x"}})
        assert_status(r, 400, "BadRequest")
    assert await api.must_get(f"{CONFIGMAPS}/c") == obj


async def test_update_missing_object_is_404_and_name_mismatch_400(api: Api) -> None:
    r = await api.put(f"{DEPLOYMENTS}/ghost", deployment("ghost"))
    assert_status(r, 404, "NotFound", name="ghost", kind="deployments", group="apps")
    await api.create(DEPLOYMENTS, deployment())
    r = await api.put(f"{DEPLOYMENTS}/web", deployment("other"))
    assert_status(r, 400, "BadRequest")


async def test_status_is_ignored_on_the_main_resource_and_spec_on_status(api: Api) -> None:
    obj = await api.create(DEPLOYMENTS, deployment())
    body = clone(obj)
    body["status"] = {"replicas": 7, "readyReplicas": 7}
    r = await api.put(f"{DEPLOYMENTS}/web", body)
    assert r.status == 200, r
    assert not (r.json.get("status") or {}).get("replicas")
    cur = await api.must_get(f"{DEPLOYMENTS}/web")
    assert not (cur.get("status") or {}).get("replicas")

    body = clone(cur)
    body["spec"]["replicas"] = 9
    body["metadata"]["labels"] = {"app": "web", "changed": "yes"}
    body["status"] = {"replicas": 2, "observedGeneration": 1}
    r = await api.put(f"{DEPLOYMENTS}/web/status", body)
    assert r.status == 200, r
    after = await api.must_get(f"{DEPLOYMENTS}/web")
    assert after["status"]["replicas"] == 2
    assert after["spec"]["replicas"] == 2
    assert after["metadata"]["labels"] == {"app": "web"}
    assert after["metadata"]["generation"] == cur["metadata"]["generation"]

    r = await api.patch(f"{DEPLOYMENTS}/web/status", {"status": {"availableReplicas": 1}, "spec": {"replicas": 8}})
    assert r.status == 200, r
    after = await api.must_get(f"{DEPLOYMENTS}/web")
    assert after["status"]["availableReplicas"] == 1 and after["status"]["replicas"] == 2
    assert after["spec"]["replicas"] == 2


async def test_generation_bumps_on_spec_changes_only(api: Api) -> None:
    obj = await api.create(DEPLOYMENTS, deployment())
    assert obj["metadata"]["generation"] == 1
    r = await api.patch(f"{DEPLOYMENTS}/web", {"metadata": {"labels": {"extra": "1"}}})
    assert r.status == 200 and r.json["metadata"]["generation"] == 1, r
    r = await api.patch(f"{DEPLOYMENTS}/web", {"metadata": {"annotations": {"note": "x"}}})
    assert r.status == 200 and r.json["metadata"]["generation"] == 1, r
    r = await api.patch(f"{DEPLOYMENTS}/web/status", {"status": {"replicas": 1}})
    assert r.status == 200 and r.json["metadata"]["generation"] == 1, r
    r = await api.patch(f"{DEPLOYMENTS}/web", {"spec": {"replicas": 4}})
    assert r.status == 200 and r.json["metadata"]["generation"] == 2, r
    body = r.json
    body["spec"]["template"]["spec"]["containers"][0]["image"] = "nginx:1.26"
    r = await api.put(f"{DEPLOYMENTS}/web", body)
    assert r.status == 200 and r.json["metadata"]["generation"] == 3, r
    body = r.json
    body["metadata"]["generation"] = 99
    body["metadata"]["labels"]["again"] = "1"
    r = await api.put(f"{DEPLOYMENTS}/web", body)
    assert r.status == 200 and r.json["metadata"]["generation"] == 3, r


async def test_noop_update_keeps_the_resource_version(api: Api) -> None:
    obj = await api.create(DEPLOYMENTS, deployment())
    r = await api.put(f"{DEPLOYMENTS}/web", obj)
    assert r.status == 200, r
    assert r.json["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    r = await api.patch(f"{DEPLOYMENTS}/web", {"spec": {"replicas": 2}})
    assert r.status == 200, r
    assert r.json["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    r = await api.patch(f"{DEPLOYMENTS}/web", {"metadata": {"labels": {"app": "web"}}}, STRATEGIC)
    assert r.status == 200, r
    assert r.json["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    assert await api.must_get(f"{DEPLOYMENTS}/web") == obj


async def test_update_with_another_uid_is_409(api: Api) -> None:
    # The uid in a PUT body is a precondition (rest.DefaultUpdatedObjectInfo): an object read
    # before it was deleted and recreated must not overwrite the new one, even without a
    # resourceVersion.
    obj = await api.create(CONFIGMAPS, configmap("c"))
    body = clone(obj)
    del body["metadata"]["resourceVersion"]
    body["metadata"]["uid"] = str(uuid.uuid4())
    body["data"] = {"k": "clobbered"}
    r = await api.put(f"{CONFIGMAPS}/c", body)
    assert_status(r, 409, "Conflict", name="c", kind="configmaps")
    assert await api.must_get(f"{CONFIGMAPS}/c") == obj


async def test_immutable_fields_are_422(api: Api) -> None:
    await api.create(DEPLOYMENTS, deployment())
    r = await api.patch(f"{DEPLOYMENTS}/web", {"spec": {"selector": {"matchLabels": {"app": "web", "v": "2"}},
                                                        "template": {"metadata": {"labels": {"v": "2"}}}}})
    assert_status(r, 422, "Invalid", name="web", kind="Deployment", fields=["spec.selector"])
    await api.create(PODS, pod("p"))
    r = await api.patch(f"{PODS}/p", {"spec": {"restartPolicy": "Never"}})
    assert_status(r, 422, "Invalid", name="p", kind="Pod", fields=["spec"])
    # The image is one of the few mutable pod fields.
    r = await api.patch(f"{PODS}/p", {"spec": {"containers": [{"name": "main", "image": "busybox:1.37"}]}},
                        STRATEGIC)
    assert r.status == 200 and r.json["spec"]["containers"][0]["image"] == "busybox:1.37", r


async def test_dry_run_writes_nothing(api: Api) -> None:
    r = await api.post(CONFIGMAPS, configmap("dry"), query={"dryRun": "All"})
    assert r.status == 201 and r.json["metadata"]["name"] == "dry", r
    assert (await api.get(f"{CONFIGMAPS}/dry")).status == 404
    obj = await api.create(CONFIGMAPS, configmap("wet"))
    r = await api.patch(f"{CONFIGMAPS}/wet", {"data": {"k": "dry"}}, query={"dryRun": "All"})
    assert r.status == 200 and r.json["data"] == {"k": "dry"}, r
    r = await api.delete(f"{CONFIGMAPS}/wet", query={"dryRun": "All"})
    assert r.status == 200, r
    assert await api.must_get(f"{CONFIGMAPS}/wet") == obj


async def test_strict_field_validation_on_update_and_patch(api: Api) -> None:
    obj = await api.create(CONFIGMAPS, configmap("c"))
    body = clone(obj)
    body["bogus"] = True
    r = await api.put(f"{CONFIGMAPS}/c", body, query={"fieldValidation": "Strict"})
    assert_status(r, 400, "BadRequest", fields=["bogus"])
    r = await api.patch(f"{CONFIGMAPS}/c", {"metadata": {"bogus": 1}}, query={"fieldValidation": "Strict"})
    assert_status(r, 400, "BadRequest", fields=["metadata.bogus"])
    assert await api.must_get(f"{CONFIGMAPS}/c") == obj


# ============================================================================ patch


async def test_merge_patch(api: Api) -> None:
    await api.create(DEPLOYMENTS, deployment())
    r = await api.patch(f"{DEPLOYMENTS}/web", {"metadata": {"labels": {"tier": "fe"}}, "spec": {"replicas": 3}})
    assert r.status == 200, r
    assert r.json["metadata"]["labels"] == {"app": "web", "tier": "fe"}
    assert r.json["spec"]["replicas"] == 3
    # kubectl label app- sends a null.
    r = await api.patch(f"{DEPLOYMENTS}/web", {"metadata": {"labels": {"tier": None}}})
    assert r.json["metadata"]["labels"] == {"app": "web"}
    # RFC 7386 replaces lists: the container loses its ports.
    r = await api.patch(f"{DEPLOYMENTS}/web", {"spec": {"template": {"spec": {
        "containers": [{"name": "nginx", "image": "nginx:1.26"}]}}}})
    assert r.status == 200, r
    c = r.json["spec"]["template"]["spec"]["containers"]
    assert len(c) == 1 and c[0]["image"] == "nginx:1.26" and "ports" not in c[0]


async def test_patch_missing_object_is_404(api: Api) -> None:
    for ctype, body in ((MERGE, {}), (STRATEGIC, {}), (JSON_PATCH, [])):
        r = await api.patch(f"{DEPLOYMENTS}/ghost", body, ctype)
        assert_status(r, 404, "NotFound", name="ghost", kind="deployments", group="apps")


async def test_patch_with_stale_resource_version_is_409(api: Api) -> None:
    obj = await api.create(CONFIGMAPS, configmap("c"))
    await api.patch(f"{CONFIGMAPS}/c", {"data": {"k": "v2"}})
    r = await api.patch(f"{CONFIGMAPS}/c", {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                                            "data": {"k": "v3"}})
    assert_status(r, 409, "Conflict", name="c", kind="configmaps")
    assert (await api.must_get(f"{CONFIGMAPS}/c"))["data"] == {"k": "v2"}


async def test_json_patch(api: Api) -> None:
    obj = await api.create(DEPLOYMENTS, deployment())
    ops = [
        {"op": "test", "path": "/spec/replicas", "value": 2},
        {"op": "replace", "path": "/spec/replicas", "value": 6},
        {"op": "add", "path": "/metadata/labels/tier", "value": "fe"},
        {"op": "add", "path": "/spec/template/spec/containers/0/env", "value": [{"name": "A", "value": "1"}]},
    ]
    r = await api.patch(f"{DEPLOYMENTS}/web", ops, JSON_PATCH)
    assert r.status == 200, r
    assert r.json["spec"]["replicas"] == 6
    assert r.json["metadata"]["labels"]["tier"] == "fe"
    assert r.json["spec"]["template"]["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]
    assert rv(r.json) > rv(obj)


async def test_json_patch_failing_test_op_changes_nothing(api: Api) -> None:
    await api.create(DEPLOYMENTS, deployment())
    before = await api.must_get(f"{DEPLOYMENTS}/web")
    ops = [
        {"op": "replace", "path": "/spec/replicas", "value": 9},
        {"op": "test", "path": "/spec/replicas", "value": 2},
    ]
    r = await api.patch(f"{DEPLOYMENTS}/web", ops, JSON_PATCH)
    assert_status(r, 422, "Invalid")
    r = await api.patch(f"{DEPLOYMENTS}/web", [{"op": "remove", "path": "/spec/nothere"}], JSON_PATCH)
    assert_status(r, 422, "Invalid")
    # A body that is not a list of operations cannot be decoded: 400, as kube-apiserver's
    # jsonpatch.DecodePatch failure.
    assert_status(await api.patch(f"{DEPLOYMENTS}/web", {"op": "remove"}, JSON_PATCH), 400, "BadRequest")
    assert_status(await api.patch(f"{DEPLOYMENTS}/web", b"[{", JSON_PATCH), 400, "BadRequest")
    assert await api.must_get(f"{DEPLOYMENTS}/web") == before


async def test_strategic_merge_patch_merges_containers_by_name(api: Api) -> None:
    await api.create(DEPLOYMENTS, deployment())
    patch = {"spec": {"template": {"spec": {
        "$setElementOrder/containers": [{"name": "nginx"}, {"name": "sidecar"}],
        "containers": [{"name": "nginx", "image": "nginx:1.26"}, {"name": "sidecar", "image": "envoy:1"}]}}}}
    r = await api.patch(f"{DEPLOYMENTS}/web", patch, STRATEGIC)
    assert r.status == 200, r
    cs = r.json["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in cs] == ["nginx", "sidecar"]
    assert cs[0]["image"] == "nginx:1.26"
    assert cs[0]["ports"] == [{"containerPort": 80, "name": "http", "protocol": "TCP"}]
    assert cs[1]["image"] == "envoy:1"
    assert r.json["metadata"]["generation"] == 2
    r = await api.patch(f"{DEPLOYMENTS}/web", {"spec": {"template": {"spec": {
        "containers": [{"name": "sidecar", "$patch": "delete"}]}}}}, STRATEGIC)
    assert r.status == 200, r
    cs = r.json["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in cs] == ["nginx"] and cs[0]["ports"][0]["containerPort"] == 80


async def test_strategic_merge_patch_on_service_merges_ports_by_port(api: Api) -> None:
    await api.create(SERVICES, service())
    r = await api.patch(f"{SERVICES}/web", {"spec": {"ports": [{"port": 443, "targetPort": 8443,
                                                                 "name": "https"}]}}, STRATEGIC)
    assert r.status == 200, r
    # Without $setElementOrder, apimachinery puts the patch's new items before the live ones
    # (mergeSortedSlice cannot place an item the live list lacks).
    assert [(p["name"], p["port"]) for p in r.json["spec"]["ports"]] == [("https", 443), ("http", 80)]
    r = await api.patch(f"{SERVICES}/web", {"spec": {
        "$setElementOrder/ports": [{"port": 80}, {"port": 443}],
        "ports": [{"port": 443, "targetPort": 9443}]}}, STRATEGIC)
    assert r.status == 200, r
    assert [(p["name"], p["port"], p["targetPort"]) for p in r.json["spec"]["ports"]] == [
        ("http", 80, 8080), ("https", 443, 9443)]


async def test_strategic_merge_patch_on_pod_status_merges_conditions_by_type(api: Api) -> None:
    await api.create(PODS, pod("p"))
    await api.post(f"{PODS}/p/binding", binding("p", "node-1"))
    r = await api.patch(f"{PODS}/p/status", {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}]}}, STRATEGIC)
    assert r.status == 200, r
    types = sorted(c["type"] for c in r.json["status"]["conditions"])
    assert types == ["PodScheduled", "Ready"]
    assert r.json["status"]["phase"] == "Running"


async def test_apply_patch_creates_then_updates(api: Api) -> None:
    body = deployment("applied")
    r = await api.patch(f"{DEPLOYMENTS}/applied", orjson.dumps(body), APPLY,
                        query={"fieldManager": "kubectl", "force": "false"})
    assert r.status == 201, r
    assert r.json["metadata"]["name"] == "applied" and r.json["metadata"]["uid"]
    yaml_body = (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: applied\n  namespace: default\n"
        "spec:\n  replicas: 4\n  selector:\n    matchLabels:\n      app: web\n  template:\n"
        "    metadata:\n      labels:\n        app: web\n    spec:\n      containers:\n"
        "      - name: nginx\n        image: nginx:1.27\n"
    )
    r = await api.patch(f"{DEPLOYMENTS}/applied", yaml_body, APPLY, query={"fieldManager": "kubectl"})
    assert r.status == 200, r
    assert r.json["spec"]["replicas"] == 4
    c = r.json["spec"]["template"]["spec"]["containers"][0]
    # The same manager stopped applying the container's ports and nobody else owns them, so
    # server-side apply removes them, as Kubernetes does.
    assert c["image"] == "nginx:1.27" and "ports" not in c
    # An apply must name its field manager.
    assert_status(await api.patch(f"{PODS}/pp", orjson.dumps(pod("pp")), APPLY), 400, "BadRequest")
    r = await api.patch(f"{PODS}/pp", orjson.dumps(pod("pp")), APPLY, query={"fieldManager": "tests"})
    assert r.status == 201, r
    assert r.json["kind"] == "Pod" and r.json["status"]["phase"] == "Pending"


async def test_unsupported_patch_content_type_is_415(api: Api) -> None:
    await api.create(DEPLOYMENTS, deployment())
    for ctype in ("application/json", "text/plain", "application/yaml"):
        r = await api.patch(f"{DEPLOYMENTS}/web", {"spec": {"replicas": 1}}, ctype)
        assert_status(r, 415, "UnsupportedMediaType")
    r = await api.call("PATCH", f"{DEPLOYMENTS}/web", b'{"spec":{}}', content_type=None)
    assert_status(r, 415, "UnsupportedMediaType")
    assert (await api.must_get(f"{DEPLOYMENTS}/web"))["spec"]["replicas"] == 2


# ============================================================================ scale


async def test_scale_get_put_patch(api: Api) -> None:
    dep = await api.create(DEPLOYMENTS, deployment())
    r = await api.get(f"{DEPLOYMENTS}/web/scale")
    assert r.status == 200, r
    scale = r.json
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    m = scale["metadata"]
    assert (m["name"], m["namespace"], m["uid"], m["resourceVersion"]) == (
        "web", "default", dep["metadata"]["uid"], dep["metadata"]["resourceVersion"])
    assert scale["spec"] == {"replicas": 2}
    assert scale["status"]["selector"] == "app=web"
    assert scale["status"]["replicas"] == 0

    scale["spec"]["replicas"] = 5
    r = await api.put(f"{DEPLOYMENTS}/web/scale", scale)
    assert r.status == 200, r
    assert r.json["kind"] == "Scale" and r.json["spec"]["replicas"] == 5
    assert rv(r.json) > rv(dep)
    d = await api.must_get(f"{DEPLOYMENTS}/web")
    assert d["spec"]["replicas"] == 5 and d["metadata"]["generation"] == 2

    # A Scale read before that write is stale now.
    r = await api.put(f"{DEPLOYMENTS}/web/scale", {**scale, "spec": {"replicas": 6}})
    assert_status(r, 409, "Conflict", name="web")

    r = await api.patch(f"{DEPLOYMENTS}/web/scale", {"spec": {"replicas": 3}}, MERGE)
    assert r.status == 200, r
    assert r.json["kind"] == "Scale" and r.json["spec"]["replicas"] == 3
    assert r.json["status"]["selector"] == "app=web"
    r = await api.patch(f"{DEPLOYMENTS}/web/scale", {"spec": {"replicas": 1}}, STRATEGIC)
    assert r.status == 200 and r.json["spec"]["replicas"] == 1, r
    r = await api.patch(f"{DEPLOYMENTS}/web/scale", [{"op": "replace", "path": "/spec/replicas", "value": 0}],
                        JSON_PATCH)
    assert r.status == 200 and r.json["spec"]["replicas"] == 0, r
    assert (await api.must_get(f"{DEPLOYMENTS}/web"))["spec"]["replicas"] == 0

    r = await api.patch(f"{DEPLOYMENTS}/web/scale", {"spec": {"replicas": -1}}, MERGE)
    assert_status(r, 422, "Invalid", fields=["spec.replicas"])
    r = await api.patch(f"{DEPLOYMENTS}/web/scale", {"spec": {"replicas": "many"}}, MERGE)
    assert_status(r, 422, "Invalid", fields=["spec.replicas"])
    assert (await api.must_get(f"{DEPLOYMENTS}/web"))["spec"]["replicas"] == 0


async def test_scale_of_missing_or_unscalable_is_404(api: Api) -> None:
    assert_status(await api.get(f"{DEPLOYMENTS}/ghost/scale"), 404, "NotFound", name="ghost")
    await api.create(PODS, pod("p"))
    assert_status(await api.get(f"{PODS}/p/scale"), 404, "NotFound")


# ============================================================================ delete


async def test_delete_returns_the_object_and_it_is_gone(api: Api) -> None:
    await api.create(PODS, pod("p"))
    r = await api.delete(f"{PODS}/p")
    assert r.status == 200, r
    # The Python client decodes a pod delete's answer as a V1Pod.
    assert r.json["kind"] == "Pod" and r.json["metadata"]["name"] == "p"
    assert_status(await api.get(f"{PODS}/p"), 404, "NotFound", name="p")
    assert_status(await api.delete(f"{PODS}/p"), 404, "NotFound", name="p", kind="pods")


async def test_finalizers_hold_the_object_until_removed(api: Api) -> None:
    await api.create(CONFIGMAPS, configmap("held", finalizers=["example.com/hold"]))
    r = await api.delete(f"{CONFIGMAPS}/held", {"propagationPolicy": "Background"})
    assert r.status == 202, r
    assert r.json["metadata"]["deletionTimestamp"]
    held = await api.must_get(f"{CONFIGMAPS}/held")
    assert held["metadata"]["deletionTimestamp"] and held["metadata"]["finalizers"] == ["example.com/hold"]
    # Deleting again changes nothing.
    r = await api.delete(f"{CONFIGMAPS}/held")
    assert r.status == 202, r
    again = await api.must_get(f"{CONFIGMAPS}/held")
    assert again["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]
    # No new finalizers on an object that is going away.
    body = clone(held)
    body["metadata"]["finalizers"].append("example.com/late")
    assert_status(await api.put(f"{CONFIGMAPS}/held", body), 422, "Invalid", fields=["metadata.finalizers"])
    # Other updates still work while it waits.
    body = clone(held)
    body["data"] = {"k": "changed"}
    r = await api.put(f"{CONFIGMAPS}/held", body)
    assert r.status == 200, r
    body = r.json
    w = await api.watch(CONFIGMAPS, {"resourceVersion": body["metadata"]["resourceVersion"]})
    try:
        body["metadata"]["finalizers"] = []
        r = await api.put(f"{CONFIGMAPS}/held", body)
        assert r.status == 200, r
        assert_status(await api.get(f"{CONFIGMAPS}/held"), 404, "NotFound")
        ev = await w.next()
        assert ev["type"] == "DELETED" and ev["object"]["metadata"]["name"] == "held"
    finally:
        await w.close()


async def test_finalizer_removed_by_patch_deletes(api: Api) -> None:
    await api.create(CONFIGMAPS, configmap("held", finalizers=["a/b", "c/d"]))
    await api.delete(f"{CONFIGMAPS}/held")
    r = await api.patch(f"{CONFIGMAPS}/held", [{"op": "remove", "path": "/metadata/finalizers/0"}], JSON_PATCH)
    assert r.status == 200, r
    assert (await api.must_get(f"{CONFIGMAPS}/held"))["metadata"]["finalizers"] == ["c/d"]
    r = await api.patch(f"{CONFIGMAPS}/held", {"metadata": {"finalizers": None}})
    assert r.status == 200, r
    assert (await api.get(f"{CONFIGMAPS}/held")).status == 404


async def test_foreground_deletion_adds_the_finalizer(api: Api) -> None:
    await api.create(DEPLOYMENTS, deployment())
    r = await api.delete(f"{DEPLOYMENTS}/web", query={"propagationPolicy": "Foreground"})
    assert r.status == 202, r
    obj = await api.must_get(f"{DEPLOYMENTS}/web")
    assert obj["metadata"]["deletionTimestamp"]
    assert "foregroundDeletion" in obj["metadata"]["finalizers"]
    await api.create(DEPLOYMENTS, deployment("web2"))
    r = await api.delete(f"{DEPLOYMENTS}/web2", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                 "propagationPolicy": "Foreground"})
    assert r.status == 202, r
    assert "foregroundDeletion" in (await api.must_get(f"{DEPLOYMENTS}/web2"))["metadata"]["finalizers"]
    r = await api.delete(f"{DEPLOYMENTS}/web2", query={"propagationPolicy": "Sideways"})
    assert_status(r, 400, "BadRequest")


async def test_bound_pod_is_deleted_gracefully(api: Api) -> None:
    await api.create(PODS, pod("p"))
    r = await api.post(f"{PODS}/p/binding", binding("p", "node-1"))
    assert r.status == 201, r
    bound = await api.must_get(f"{PODS}/p")
    assert bound["spec"]["nodeName"] == "node-1"
    r = await api.post(f"{PODS}/p/binding", binding("p", "node-2"))
    assert_status(r, 409, "Conflict", name="p")

    r = await api.delete(f"{PODS}/p")
    assert r.status == 202, r
    assert r.json["kind"] == "Pod"
    meta = r.json["metadata"]
    assert meta["deletionTimestamp"] and meta["deletionGracePeriodSeconds"] == 30
    created = parse_rfc3339(bound["metadata"]["creationTimestamp"])
    assert parse_rfc3339(meta["deletionTimestamp"]) >= created + 29
    still = await api.must_get(f"{PODS}/p")
    assert still["metadata"]["deletionTimestamp"] == meta["deletionTimestamp"]

    r = await api.delete(f"{PODS}/p", query={"gracePeriodSeconds": "0"})
    assert r.status == 200, r
    assert_status(await api.get(f"{PODS}/p"), 404, "NotFound", name="p")


async def test_malformed_delete_options_are_400(api: Api) -> None:
    await api.create(PODS, pod("p"))
    await api.post(f"{PODS}/p/binding", binding("p", "node-1"))
    obj = await api.must_get(f"{PODS}/p")
    for opts in ({"gracePeriodSeconds": "30"}, {"gracePeriodSeconds": [1]}, {"preconditions": 5},
                 {"preconditions": {"uid": 7}}, {"propagationPolicy": ["Foreground"]}):
        assert_status(await api.delete(f"{PODS}/p", opts), 400, "BadRequest")
    r = await api.post(f"{PODS}/p/eviction", {"apiVersion": "policy/v1", "kind": "Eviction",
                                              "metadata": {"name": "p"}, "deleteOptions": 1.5})
    assert_status(r, 400, "BadRequest")
    assert await api.must_get(f"{PODS}/p") == obj


async def test_a_later_propagation_policy_replaces_the_earlier_one(api: Api) -> None:
    # The garbage collector's two finalizers exclude each other (validation rejects both);
    # apimachinery's deletionFinalizersForGarbageCollection drops one when a DELETE asks for
    # the other.
    await api.create(CONFIGMAPS, configmap("c", finalizers=["example.com/hold"]))
    r = await api.delete(f"{CONFIGMAPS}/c", {"propagationPolicy": "Orphan"})
    assert r.status == 202, r
    assert r.json["metadata"]["finalizers"] == ["example.com/hold", "orphan"]
    r = await api.delete(f"{CONFIGMAPS}/c", {"propagationPolicy": "Foreground"})
    assert r.status == 202, r
    assert r.json["metadata"]["finalizers"] == ["example.com/hold", "foregroundDeletion"]
    # No policy keeps what the object already asks for.
    r = await api.delete(f"{CONFIGMAPS}/c")
    assert r.json["metadata"]["finalizers"] == ["example.com/hold", "foregroundDeletion"]
    r = await api.delete(f"{CONFIGMAPS}/c", {"propagationPolicy": "Background"})
    assert r.json["metadata"]["finalizers"] == ["example.com/hold"]


async def test_delete_preconditions(api: Api) -> None:
    obj = await api.create(CONFIGMAPS, configmap("c"))
    r = await api.delete(f"{CONFIGMAPS}/c", {"preconditions": {"uid": str(uuid.uuid4())}})
    assert_status(r, 409, "Conflict", name="c", kind="configmaps")
    r = await api.delete(f"{CONFIGMAPS}/c", {"preconditions": {"resourceVersion": "1"}})
    assert_status(r, 409, "Conflict", name="c")
    assert await api.must_get(f"{CONFIGMAPS}/c") == obj
    r = await api.delete(f"{CONFIGMAPS}/c", {"preconditions": {"uid": obj["metadata"]["uid"],
                                                              "resourceVersion": obj["metadata"]["resourceVersion"]}})
    assert r.status == 200, r
    assert (await api.get(f"{CONFIGMAPS}/c")).status == 404


async def test_binding_annotations_are_copied_onto_the_pod(api: Api) -> None:
    """As kube-apiserver does: the scheduler's GPU indices travel in the Binding itself."""
    await api.create(PODS, pod("p"))
    body = binding("p", "node-1")
    body.setdefault("metadata", {})["annotations"] = {"gpufleet.io/gpu-indices": "0,3"}
    r = await api.post(f"{PODS}/p/binding", body)
    assert r.status == 201, r
    bound = await api.must_get(f"{PODS}/p")
    assert bound["spec"]["nodeName"] == "node-1"
    assert bound["metadata"]["annotations"]["gpufleet.io/gpu-indices"] == "0,3"
    await api.create(PODS, pod("q"))
    bad = binding("q", "node-1")
    bad.setdefault("metadata", {})["annotations"] = {"a": 1}
    assert_status(await api.post(f"{PODS}/q/binding", bad), 400, "BadRequest")
    assert not (await api.must_get(f"{PODS}/q"))["spec"].get("nodeName")


async def test_binding_is_validated(api: Api) -> None:
    await api.create(PODS, pod("p"))
    obj = await api.must_get(f"{PODS}/p")
    for target in ({"name": 123}, {"name": {"a": 1}}, {"name": True}):
        assert_status(await api.post(f"{PODS}/p/binding", {"target": target}), 400, "BadRequest")
    r = await api.post(f"{PODS}/p/binding", {"target": {"kind": "Service", "name": "node-1"}})
    assert_status(r, 422, "Invalid", fields=["target.kind"])
    r = await api.post(f"{PODS}/p/binding", {"target": {"name": ""}})
    assert_status(r, 422, "Invalid", fields=["target.name"])
    for not_a_node in ("\u00c1", "Node-1", "node_1", "-n"):  # would become an invalid spec.nodeName
        r = await api.post(f"{PODS}/p/binding", {"target": {"name": not_a_node}})
        assert_status(r, 422, "Invalid", fields=["target.name"])
    assert await api.must_get(f"{PODS}/p") == obj
    assert_status(await api.post(f"{PODS}/ghost/binding", binding("ghost", "n")), 404, "NotFound", name="ghost")


async def test_delete_collection_with_label_selector(api: Api) -> None:
    for i in range(4):
        await api.create(CONFIGMAPS, configmap(f"web-{i}", labels={"app": "web"}))
    await api.create(CONFIGMAPS, configmap("db-0", labels={"app": "db"}))
    await api.create(CONFIGMAPS, configmap("plain"))
    r = await api.delete(CONFIGMAPS, query={"labelSelector": "app=web"})
    assert r.status == 200, r
    assert r.json["kind"] == "ConfigMapList"
    assert sorted(i["metadata"]["name"] for i in r.json["items"]) == [f"web-{i}" for i in range(4)]
    assert await _names(api, CONFIGMAPS) == ["db-0", "plain"]
    r = await api.delete(CONFIGMAPS, query={"labelSelector": "app in ("})
    assert_status(r, 400, "BadRequest")
    assert await _names(api, CONFIGMAPS) == ["db-0", "plain"]


# ============================================================================ watch


async def test_watch_from_resource_version_sends_later_events_in_order(api: Api) -> None:
    a = await api.create(PODS, pod("a"))
    start = rv(a)
    await api.patch(f"{PODS}/a", {"metadata": {"labels": {"x": "1"}}})
    await api.create(PODS, pod("b"))
    await api.delete(f"{PODS}/a")
    w = await api.watch(PODS, {"resourceVersion": str(start)})
    try:
        evs = await w.take(3)
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in evs] == [
            ("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
        rvs = [rv(e["object"]) for e in evs]
        assert rvs == sorted(rvs) and len(set(rvs)) == 3 and rvs[0] > start
        assert all(e["object"]["kind"] == "Pod" for e in evs)
        await w.quiet()
        c = await api.create(PODS, pod("c"))
        ev = await w.next()
        assert ev["type"] == "ADDED" and ev["object"] == c
    finally:
        await w.close()


async def test_watch_with_field_selector_turns_transitions_into_added_and_deleted(api: Api) -> None:
    for name in ("leaves", "joins", "other"):
        await api.create(PODS, pod(name))
    for name in ("leaves", "other"):
        await api.post(f"{PODS}/{name}/binding", binding(name, "node-1"))
        await api.patch(f"{PODS}/{name}/status", {"status": {"phase": "Running"}})
    start = (await api.get(PODS)).json["metadata"]["resourceVersion"]
    w = await api.watch(PODS, {"resourceVersion": start, "fieldSelector": "status.phase=Running"})
    try:
        await api.patch(f"{PODS}/leaves/status", {"status": {"phase": "Succeeded"}})
        ev = await w.next()
        assert ev["type"] == "DELETED" and ev["object"]["metadata"]["name"] == "leaves"
        assert ev["object"]["status"]["phase"] == "Succeeded"
        await api.post(f"{PODS}/joins/binding", binding("joins", "node-2"))
        await w.quiet(0.2)
        await api.patch(f"{PODS}/joins/status", {"status": {"phase": "Running"}})
        ev = await w.next()
        assert ev["type"] == "ADDED" and ev["object"]["metadata"]["name"] == "joins"
        await api.patch(f"{PODS}/joins", {"metadata": {"labels": {"seen": "yes"}}})
        ev = await w.next()
        assert ev["type"] == "MODIFIED" and ev["object"]["metadata"]["labels"]["seen"] == "yes"
        await api.delete(f"{PODS}/other", query={"gracePeriodSeconds": "0"})
        ev = await w.next()
        assert ev["type"] == "DELETED" and ev["object"]["metadata"]["name"] == "other"
        await w.quiet(0.2)
    finally:
        await w.close()


async def test_watch_one_object_by_name_with_label_selector(api: Api) -> None:
    await api.create(PODS, pod("one"))
    await api.create(PODS, pod("two"))
    start = (await api.get(PODS)).json["metadata"]["resourceVersion"]
    w = await api.watch(PODS, {"resourceVersion": start, "fieldSelector": "metadata.name=one",
                               "labelSelector": "app=web"})
    try:
        await api.patch(f"{PODS}/two", {"metadata": {"labels": {"x": "1"}}})
        await api.patch(f"{PODS}/one", {"metadata": {"labels": {"x": "1"}}})
        ev = await w.next()
        assert ev["type"] == "MODIFIED" and ev["object"]["metadata"]["name"] == "one"
        await api.patch(f"{PODS}/one", {"metadata": {"labels": {"app": "gone"}}})
        ev = await w.next()
        assert ev["type"] == "DELETED" and ev["object"]["metadata"]["labels"]["app"] == "gone"
    finally:
        await w.close()


async def test_watch_without_resource_version_starts_with_synthetic_added(api: Api) -> None:
    await api.create(CONFIGMAPS, configmap("a"))
    await api.create(CONFIGMAPS, configmap("b"))
    for query in ({}, {"resourceVersion": "0"}):
        w = await api.watch(CONFIGMAPS, query)
        try:
            evs = await w.take(2)
            assert sorted((e["type"], e["object"]["metadata"]["name"]) for e in evs) == [
                ("ADDED", "a"), ("ADDED", "b")]
            await w.quiet(0.2)
        finally:
            await w.close()
    w = await api.watch(CONFIGMAPS)
    try:
        await w.take(2)
        await api.patch(f"{CONFIGMAPS}/a", {"data": {"k": "2"}})
        ev = await w.next()
        assert ev["type"] == "MODIFIED" and ev["object"]["data"] == {"k": "2"}
    finally:
        await w.close()


async def test_watch_all_namespaces(api: Api) -> None:
    await api.create(NAMESPACES, namespace("team-a"))
    start = (await api.get("/api/v1/pods")).json["metadata"]["resourceVersion"]
    w = await api.watch("/api/v1/pods", {"resourceVersion": start})
    try:
        await api.create("/api/v1/namespaces/team-a/pods", pod("x", ns="team-a"))
        await api.create(CONFIGMAPS, configmap("not-a-pod"))
        await api.create(PODS, pod("y"))
        evs = await w.take(2)
        assert [(e["object"]["metadata"]["namespace"], e["object"]["metadata"]["name"]) for e in evs] == [
            ("team-a", "x"), ("default", "y")]
    finally:
        await w.close()


async def test_watch_from_a_compacted_revision_is_410_expired(make_api) -> None:
    api = await make_api(store_options={"history": 3, "housekeeping_interval": None})
    first = await api.create(CONFIGMAPS, configmap("c"))
    for i in range(8):
        await api.patch(f"{CONFIGMAPS}/c", {"data": {"k": str(i)}})
    await api.server.store.compact_history()
    w = await api.watch(CONFIGMAPS, {"resourceVersion": str(rv(first))})
    try:
        ev = await w.next()
        assert ev["type"] == "ERROR", ev
        st = ev["object"]
        assert st["kind"] == "Status" and st["apiVersion"] == "v1" and st["status"] == "Failure"
        assert st["code"] == 410 and st["reason"] == "Expired" and st["message"]
        assert await w.next() is None
    finally:
        await w.close()
    # A watch from a revision still held works.
    latest = (await api.get(CONFIGMAPS)).json["metadata"]["resourceVersion"]
    w = await api.watch(CONFIGMAPS, {"resourceVersion": latest})
    try:
        await api.patch(f"{CONFIGMAPS}/c", {"data": {"k": "last"}})
        assert (await w.next())["type"] == "MODIFIED"
    finally:
        await w.close()


async def test_watch_timeout_seconds_ends_the_stream(api: Api) -> None:
    start = (await api.get(PODS)).json["metadata"]["resourceVersion"]
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    w = await api.watch(PODS, {"resourceVersion": start, "timeoutSeconds": "1"})
    try:
        await api.create(PODS, pod("p"))
        assert (await w.next())["type"] == "ADDED"
        # Without allowWatchBookmarks nothing else comes, not even a bookmark at the end.
        assert await w.next(within=5) is None
    finally:
        await w.close()
    assert 0.8 <= loop.time() - t0 < 4


async def test_watch_bookmarks(api: Api) -> None:
    a = await api.create(PODS, pod("a"))
    w = await api.watch(PODS, {"resourceVersion": str(rv(a)), "allowWatchBookmarks": "true",
                               "timeoutSeconds": "1"})
    try:
        b = await api.create(PODS, pod("b"))
        assert (await w.next())["type"] == "ADDED"
        rest = []
        while (ev := await w.next(within=5)) is not None:
            rest.append(ev)
    finally:
        await w.close()
    assert rest and all(e["type"] == "BOOKMARK" for e in rest), rest
    bm = rest[-1]["object"]
    assert bm["kind"] == "Pod" and bm["apiVersion"] == "v1"
    assert int(bm["metadata"]["resourceVersion"]) >= rv(b)

    # The watch-list form informers use: initial state, then a bookmark marking its end.
    w = await api.watch(PODS, {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
                               "allowWatchBookmarks": "true"})
    try:
        evs = await w.take(3)
        assert [e["type"] for e in evs] == ["ADDED", "ADDED", "BOOKMARK"]
        assert evs[2]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
        assert int(evs[2]["object"]["metadata"]["resourceVersion"]) >= rv(b)
    finally:
        await w.close()


async def test_watch_bad_resource_version_is_400(api: Api) -> None:
    r = await api.get(PODS, query={"watch": "true", "resourceVersion": "abc"})
    assert_status(r, 400, "BadRequest")
    r = await api.get(PODS, query={"watch": "True", "fieldSelector": "spec.bogus=1"})
    assert_status(r, 400, "BadRequest")


# ============================================================================ tables


async def test_table_for_list_and_get(api: Api) -> None:
    await api.create(PODS, pod("web-0", labels={"app": "web"}))
    await api.create(PODS, pod("web-1", labels={"app": "web"}))
    r = await api.get(PODS, accept=TABLE_ACCEPT)
    assert r.status == 200, r
    t = r.json
    assert t["kind"] == "Table" and t["apiVersion"] == "meta.k8s.io/v1"
    assert t["metadata"]["resourceVersion"]
    cols = [c["name"] for c in t["columnDefinitions"]]
    assert cols[0] == "Name" and "Age" in cols and "Status" in cols
    assert all({"name", "type", "format", "description", "priority"} <= set(c) for c in t["columnDefinitions"])
    assert [row["cells"][0] for row in t["rows"]] == ["web-0", "web-1"]
    for row in t["rows"]:
        assert len(row["cells"]) == len(cols)
        obj = row["object"]
        assert obj["kind"] == "PartialObjectMetadata" and obj["apiVersion"] == "meta.k8s.io/v1"
        assert obj["metadata"]["namespace"] == "default" and obj["metadata"]["labels"] == {"app": "web"}
    r = await api.get(f"{PODS}/web-0", accept=TABLE_ACCEPT)
    assert r.status == 200 and r.json["kind"] == "Table" and len(r.json["rows"]) == 1, r
    assert r.json["rows"][0]["cells"][0] == "web-0"
    # -o yaml / -o json ask for plain JSON.
    r = await api.get(PODS, accept="application/json")
    assert r.json["kind"] == "PodList"
    r = await api.get(f"{PODS}/web-0", accept="application/json")
    assert r.json["kind"] == "Pod"
    r = await api.get(PODS, accept=TABLE_ACCEPT, query={"labelSelector": "app=none"})
    assert r.json["kind"] == "Table" and r.json["rows"] == []
    r = await api.get(f"{PODS}/nope", accept=TABLE_ACCEPT)
    assert_status(r, 404, "NotFound", name="nope")


async def test_table_for_deployments_and_paging(api: Api) -> None:
    for i in range(3):
        await api.create(DEPLOYMENTS, deployment(f"d{i}"))
    r = await api.get(DEPLOYMENTS, accept=TABLE_ACCEPT, query={"limit": "2"})
    t = r.json
    assert t["kind"] == "Table" and len(t["rows"]) == 2
    cols = [c["name"] for c in t["columnDefinitions"]]
    assert cols[:2] == ["Name", "Ready"]
    assert t["metadata"].get("continue")
    r = await api.get(DEPLOYMENTS, accept=TABLE_ACCEPT, query={"limit": "2", "continue": t["metadata"]["continue"]})
    assert [row["cells"][0] for row in r.json["rows"]] == ["d2"]


async def test_table_watch_sends_one_row_tables(api: Api) -> None:
    start = (await api.get(PODS, accept=TABLE_ACCEPT)).json["metadata"]["resourceVersion"]
    w = await api.watch(PODS, {"resourceVersion": start}, accept=TABLE_ACCEPT)
    try:
        await api.create(PODS, pod("web-0"))
        ev = await w.next()
        assert ev["type"] == "ADDED"
        t = ev["object"]
        assert t["kind"] == "Table" and len(t["rows"]) == 1
        assert t["rows"][0]["cells"][0] == "web-0"
        assert t["rows"][0]["object"]["metadata"]["name"] == "web-0"
    finally:
        await w.close()


# ============================================================================ discovery


AGG_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGG_V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"


def _resource(doc: dict, group: str, plural: str) -> dict:
    for item in doc["items"]:
        if item["metadata"]["name"] == group:
            for v in item["versions"]:
                for res in v["resources"]:
                    if res["resource"] == plural:
                        return res
    raise AssertionError(f"{group}/{plural} missing from discovery")


async def test_aggregated_discovery_echoes_the_negotiated_type(api: Api) -> None:
    kubectl_132 = f"{AGG_V2},{AGG_V2BETA1},application/json"
    r = await api.get("/api", accept=kubectl_132, query={"timeout": "32s"})
    assert r.status == 200, r
    assert r.headers["content-type"] == AGG_V2
    doc = r.json
    assert doc["kind"] == "APIGroupDiscoveryList" and doc["apiVersion"] == "apidiscovery.k8s.io/v2"
    assert [i["metadata"]["name"] for i in doc["items"]] == [""]
    pods = _resource(doc, "", "pods")
    assert pods["responseKind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert pods["scope"] == "Namespaced" and "po" in pods["shortNames"]
    assert _resource(doc, "", "nodes")["scope"] == "Cluster"

    r = await api.get("/apis", accept=kubectl_132)
    assert r.headers["content-type"] == AGG_V2
    deploy = _resource(r.json, "apps", "deployments")
    assert deploy["responseKind"]["kind"] == "Deployment"
    assert {"subresource": "scale", "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
            "verbs": ["get", "patch", "update"]} in deploy["subresources"]
    assert "" not in [i["metadata"]["name"] for i in r.json["items"]]

    kubectl_127 = f"{AGG_V2BETA1},application/json"
    for path in ("/api", "/apis"):
        r = await api.get(path, accept=kubectl_127)
        assert r.headers["content-type"] == AGG_V2BETA1, r.headers
        assert r.json["apiVersion"] == "apidiscovery.k8s.io/v2beta1"


async def test_legacy_discovery(api: Api) -> None:
    r = await api.get("/api", accept="application/json, */*")
    assert r.headers["content-type"].startswith("application/json")
    assert r.json["kind"] == "APIVersions" and r.json["versions"] == ["v1"]
    r = await api.get("/apis")
    groups = {g["name"]: g for g in r.json["groups"]}
    assert r.json["kind"] == "APIGroupList"
    assert groups["apps"]["preferredVersion"]["groupVersion"] == "apps/v1"
    r = await api.get("/api/v1")
    assert r.json["kind"] == "APIResourceList" and r.json["groupVersion"] == "v1"
    res = {x["name"]: x for x in r.json["resources"]}
    assert res["pods"]["namespaced"] is True and res["pods"]["kind"] == "Pod"
    assert res["namespaces"]["namespaced"] is False
    r = await api.get("/apis/apps/v1")
    assert {x["name"] for x in r.json["resources"]} >= {"deployments", "replicasets"}
    r = await api.get("/version")
    assert r.json["major"] == "1" and r.json["gitVersion"].startswith("v1.")
    assert_status(await api.get("/apis/nope.example.com/v1"), 404, "NotFound")


# ============================================================================ namespaces


async def test_namespace_deletion_terminates_and_forbids_new_content(api: Api) -> None:
    await api.create(NAMESPACES, namespace("team-a"))
    await api.create("/api/v1/namespaces/team-a/configmaps", configmap("c", ns="team-a"))
    r = await api.delete(f"{NAMESPACES}/team-a")
    assert r.status == 202, r
    assert r.json["kind"] == "Namespace" and r.json["status"]["phase"] == "Terminating"
    ns = await api.must_get(f"{NAMESPACES}/team-a")
    assert ns["status"]["phase"] == "Terminating" and ns["metadata"]["deletionTimestamp"]
    r = await api.post("/api/v1/namespaces/team-a/pods", pod("p", ns="team-a"))
    s = assert_status(r, 403, "Forbidden")
    assert "team-a" in s["message"] and "terminat" in s["message"]
    r = await api.post("/api/v1/namespaces/team-a/configmaps", configmap("d", ns="team-a"))
    assert_status(r, 403, "Forbidden")
    # What was there can still be read and changed (the namespace controller empties it).
    r = await api.patch("/api/v1/namespaces/team-a/configmaps/c", {"data": {"k": "x"}})
    assert r.status == 200, r
    terminating = await api.get(NAMESPACES, query={"fieldSelector": "status.phase=Terminating"})
    assert [i["metadata"]["name"] for i in terminating.json["items"]] == ["team-a"]


# ============================================================================ events


async def test_events_expire_after_their_ttl(make_api) -> None:
    clock = FakeClock()
    api = await make_api(store_options={"clock": clock, "housekeeping_interval": 0.05}, clock=clock,
                         event_ttl=60.0)
    await api.create(EVENTS, event("e1"))
    await api.create(CONFIGMAPS, configmap("keeps"))
    await asyncio.sleep(0.2)
    assert (await api.get(f"{EVENTS}/e1")).status == 200
    clock.advance(30)
    await asyncio.sleep(0.2)
    assert (await api.get(f"{EVENTS}/e1")).status == 200
    clock.advance(31)
    for _ in range(100):
        if (await api.get(f"{EVENTS}/e1")).status == 404:
            break
        await asyncio.sleep(0.05)
    assert_status(await api.get(f"{EVENTS}/e1"), 404, "NotFound", name="e1", kind="events")
    assert (await api.get(f"{CONFIGMAPS}/keeps")).status == 200


async def test_events_field_selectors_for_describe(api: Api) -> None:
    await api.create(EVENTS, event("e1", about="web-0"))
    await api.create(EVENTS, event("e2", about="web-1"))
    names = await _names(api, EVENTS, fieldSelector="involvedObject.name=web-0,involvedObject.namespace=default")
    assert names == ["e1"]


# ============================================================================ over real HTTP


async def test_over_http(api: Api) -> None:
    server = HttpServer(api.server, port=0)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as http:
            r = await http.post(PODS, content=orjson.dumps(pod("h")))  # no content-type, like client 37
            assert r.status_code == 201, r.text
            r = await http.get(f"{PODS}/nope")
            assert r.status_code == 404 and r.json()["reason"] == "NotFound"
            r = await http.get("/apis", headers={"accept": AGG_V2})
            assert r.headers["content-type"] == AGG_V2
            start = (await http.get(PODS)).json()["metadata"]["resourceVersion"]
            async with http.stream("GET", PODS, params={"watch": "True", "resourceVersion": start,
                                                        "timeoutSeconds": "2"}) as resp:
                assert resp.status_code == 200
                await api.create(PODS, pod("h2"))
                lines = resp.aiter_lines()
                ev = orjson.loads(await asyncio.wait_for(lines.__anext__(), 5))
                assert ev["type"] == "ADDED" and ev["object"]["metadata"]["name"] == "h2"
    finally:
        await server.stop()
