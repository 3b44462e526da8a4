"""CustomResourceDefinitions and the kinds they declare, over the API server's REST surface."""

from __future__ import annotations

import asyncio
from typing import Any

from apiserver_helpers import APPLY, JSON_PATCH, STRATEGIC, TABLE_ACCEPT, Api
from crd_fixtures import CRDS, WIDGETS, upstream_pytorchjob_crd, widget, widget_crd

from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.auth.rbac import Attributes, RbacAuthorizer
from gpufleet.apiserver.server import ApiServer

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


async def _with_widgets(api: Api) -> dict[str, Any]:
    r = await api.post(CRDS, widget_crd())
    assert r.status == 201, r
    return r.json


def _condition(crd: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in crd["status"]["conditions"] if c["type"] == type_)


async def test_a_crd_is_established_with_its_accepted_names(api: Api) -> None:
    crd = await _with_widgets(api)
    assert _condition(crd, "Established")["status"] == "True"
    assert _condition(crd, "NamesAccepted")["status"] == "True"
    assert crd["status"]["acceptedNames"] == {"plural": "widgets", "singular": "widget", "kind": "Widget",
                                              "listKind": "WidgetList", "shortNames": ["wd"]}
    assert crd["status"]["storedVersions"] == ["v1"]
    assert crd["spec"]["conversion"] == {"strategy": "None"}
    table = (await api.get(CRDS, accept=TABLE_ACCEPT)).json
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Created At"]
    assert table["rows"][0]["cells"] == ["widgets.example.com", crd["metadata"]["creationTimestamp"]]


async def test_an_invalid_crd_is_refused_with_kubernetes_messages(api: Api) -> None:
    bad = widget_crd(group="example")
    bad["metadata"]["name"] = "widgets.example"
    r = await api.post(CRDS, bad)
    assert r.status == 422, r
    assert 'spec.group: Invalid value: "example": should be a domain with at least one dot' in r.json["message"]

    misnamed = widget_crd()
    misnamed["metadata"]["name"] = "gadgets.example.com"
    r = await api.post(CRDS, misnamed)
    assert r.status == 422
    assert 'metadata.name: Invalid value: "gadgets.example.com": must be spec.names.plural+"."+spec.group' \
        in r.json["message"]

    two_storage = widget_crd()
    two_storage["spec"]["versions"].append({**two_storage["spec"]["versions"][0], "name": "v2"})
    r = await api.post(CRDS, two_storage)
    assert r.status == 422
    assert "spec.versions: Invalid value" in r.json["message"]
    assert "must have exactly one version marked as storage version" in r.json["message"]

    untyped = widget_crd()
    untyped["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["x"] = {}
    untyped["spec"]["versions"][0]["additionalPrinterColumns"].append({"name": "X", "type": "text",
                                                                        "jsonPath": "spec.x"})
    r = await api.post(CRDS, untyped)
    assert r.status == 422
    message = r.json["message"]
    assert ("spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[x].type: Required value: "
            "must not be empty for specified object fields") in message
    assert ('spec.versions[0].additionalPrinterColumns[4].type: Invalid value: "text": must be one of '
            "boolean,date,integer,number,string") in message
    assert ('spec.versions[0].additionalPrinterColumns[4].JSONPath: Invalid value: "spec.x": must be a '
            "simple json path starting with .") in message

    protected = widget_crd(group="widgets.k8s.io")
    protected["metadata"]["name"] = "widgets.widgets.k8s.io"
    r = await api.post(CRDS, protected)
    assert r.status == 422
    assert 'protected groups must have approval annotation "api-approved.kubernetes.io"' in r.json["message"]


async def test_objects_are_pruned_defaulted_and_stored(api: Api) -> None:
    await _with_widgets(api)
    body = widget("w1", color="red", junk=1, extra={"free": {"form": True}}, port="http")
    body["status"] = {"phase": "Set-by-client"}
    r = await api.post(WIDGETS, body)
    assert r.status == 201, r
    assert r.headers.get("warning") == '299 - "unknown field \\"spec.junk\\""'
    obj = r.json
    assert obj["spec"] == {"color": "red", "extra": {"free": {"form": True}}, "port": "http", "size": 3}
    assert "status" not in obj  # the status subresource owns it
    assert obj["metadata"]["generation"] == 1
    got = await api.must_get(f"{WIDGETS}/w1")
    assert got["spec"] == obj["spec"]
    # Strict refuses what Warn drops.
    r = await api.post(WIDGETS, widget("w2", color="red", junk=1), query={"fieldValidation": "Strict"})
    assert r.status == 400, r
    assert r.json["message"] == ('Widget in version "v1" cannot be handled as a Widget: strict decoding error: '
                                 'unknown field "spec.junk"')
    listed = (await api.get("/apis/example.com/v1/widgets")).json
    assert listed["kind"] == "WidgetList" and [o["metadata"]["name"] for o in listed["items"]] == ["w1"]


async def test_invalid_objects_are_refused_with_the_schemas_messages(api: Api) -> None:
    await _with_widgets(api)
    r = await api.post(WIDGETS, widget("w1", color="pink", size="string", label="Not_OK", tags=["a", "b", "c"],
                                       port=1.5))
    assert r.status == 422, r
    causes = {c["field"]: c["message"] for c in r.json["details"]["causes"]}
    assert causes == {
        "spec.color": 'Unsupported value: "pink": supported values: "red", "blue"',
        "spec.size": 'Invalid value: "string": spec.size in body must be of type integer: "string"',
        "spec.label": "Invalid value: \"Not_OK\": spec.label in body should match '^[a-z-]+$'",
        "spec.tags": "Too many: 3: must have at most 2 items",
        "spec.port": 'Invalid value: "number": spec.port in body must be of type integer,string: "number"',
    }
    assert r.json["message"].startswith('Widget.example.com "w1" is invalid: [')
    r = await api.post(WIDGETS, widget("w2", color="red", size=11))
    assert r.status == 422
    assert r.json["message"] == ('Widget.example.com "w2" is invalid: spec.size: Invalid value: 11: spec.size in '
                                 "body should be less than or equal to 10")
    r = await api.post(WIDGETS, {**widget("w3"), "spec": {"size": 2}})
    assert r.json["message"] == 'Widget.example.com "w3" is invalid: spec.color: Required value'


async def test_patches_apply_and_status_and_scale(api: Api) -> None:
    await _with_widgets(api)
    await api.create(WIDGETS, widget("w1"))
    item = f"{WIDGETS}/w1"
    r = await api.patch(item, {"spec": {"size": 5}}, content_type=STRATEGIC)
    assert r.status == 415, r
    assert r.json["message"] == ("the body of the request was in an unknown format - accepted media types "
                                 "include: application/json-patch+json, application/merge-patch+json, "
                                 "application/apply-patch+yaml")
    r = await api.patch(item, {"spec": {"size": 5}})
    assert r.status == 200 and r.json["spec"]["size"] == 5 and r.json["metadata"]["generation"] == 2
    r = await api.patch(item, [{"op": "replace", "path": "/spec/color", "value": "blue"}], content_type=JSON_PATCH)
    assert r.status == 200 and r.json["spec"]["color"] == "blue"
    r = await api.patch(item, {"spec": {"size": "big"}})
    assert r.status == 422 and "spec.size in body must be of type integer" in r.json["message"]
    r = await api.patch(item, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"},
                               "spec": {"color": "blue", "size": 6}}, content_type=APPLY,
                        query={"fieldManager": "tester", "force": "true"})  # size was the patches'
    assert r.status == 200 and r.json["spec"]["size"] == 6, r
    # status is the status subresource's: a main-resource write keeps it, /status sets it.
    r = await api.patch(f"{item}/status", {"status": {"phase": "Ready", "replicas": 6}})
    assert r.status == 200 and r.json["status"] == {"phase": "Ready", "replicas": 6}
    generation = r.json["metadata"]["generation"]
    r = await api.patch(item, {"status": {"phase": "Ignored"}})
    assert r.json["status"]["phase"] == "Ready" and r.json["metadata"]["generation"] == generation
    scale = (await api.get(f"{item}/scale")).json
    assert scale["kind"] == "Scale" and scale["spec"] == {"replicas": 6} and scale["status"]["replicas"] == 6
    r = await api.patch(f"{item}/scale", {"spec": {"replicas": 2}}, content_type=STRATEGIC)
    assert r.status == 200, r
    assert (await api.must_get(item))["spec"]["size"] == 2
    # Server-side apply creates a missing object, defaulted.
    r = await api.patch(f"{WIDGETS}/w9", widget("w9", color="red"), content_type=APPLY,
                        query={"fieldManager": "tester"})
    assert r.status == 201 and r.json["spec"]["size"] == 3, r


async def test_tables_show_the_printer_columns(api: Api) -> None:
    await _with_widgets(api)
    await api.create(WIDGETS, widget("w1", color="blue", size=4))
    await api.patch(f"{WIDGETS}/w1/status", {"status": {"phase": "Ready"}})
    await api.create(WIDGETS, widget("w2"))
    table = (await api.get(WIDGETS, accept=TABLE_ACCEPT)).json
    assert [(c["name"], c["type"]) for c in table["columnDefinitions"]] == [
        ("Name", "string"), ("Size", "integer"), ("Color", "string"), ("Phase", "string"), ("Age", "date")]
    rows = [r["cells"][:4] for r in table["rows"]]
    assert rows == [["w1", 4, "blue", "Ready"], ["w2", 3, "red", None]]
    one = (await api.get(f"{WIDGETS}/w2", accept=TABLE_ACCEPT)).json
    assert one["rows"][0]["cells"][:3] == ["w2", 3, "red"]


async def test_list_and_watch_with_selectors(api: Api) -> None:
    await _with_widgets(api)
    labelled = widget("a")
    labelled["metadata"]["labels"] = {"tier": "gold"}
    await api.create(WIDGETS, labelled)
    await api.create(WIDGETS, widget("b"))
    by_label = (await api.get(WIDGETS, query={"labelSelector": "tier=gold"})).json["items"]
    assert [o["metadata"]["name"] for o in by_label] == ["a"]
    by_name = (await api.get(WIDGETS, query={"fieldSelector": "metadata.name=b"})).json["items"]
    assert [o["metadata"]["name"] for o in by_name] == ["b"]
    r = await api.get(WIDGETS, query={"fieldSelector": "spec.color=red"})
    assert r.status == 400 and "field label not supported: spec.color" in r.json["message"]
    rv = (await api.get(WIDGETS)).json["metadata"]["resourceVersion"]
    stream = await api.watch(WIDGETS, {"resourceVersion": rv, "fieldSelector": "metadata.name=b"})
    try:
        await api.patch(f"{WIDGETS}/a", {"spec": {"size": 9}})
        await api.patch(f"{WIDGETS}/b", {"spec": {"size": 8}})
        event = await stream.next()
        assert event is not None and event["type"] == "MODIFIED"
        assert event["object"]["metadata"]["name"] == "b" and event["object"]["spec"]["size"] == 8
    finally:
        await stream.close()


async def test_discovery_and_openapi_publish_the_kind(api: Api) -> None:
    await _with_widgets(api)
    groups = (await api.get("/apis")).json["groups"]
    assert {"name": "example.com", "versions": [{"groupVersion": "example.com/v1", "version": "v1"}],
            "preferredVersion": {"groupVersion": "example.com/v1", "version": "v1"}} in groups
    resources = (await api.get("/apis/example.com/v1")).json["resources"]
    assert [(r["name"], r["kind"], r["namespaced"]) for r in resources] == [
        ("widgets", "Widget", True), ("widgets/status", "Widget", True), ("widgets/scale", "Scale", True)]
    assert resources[0]["shortNames"] == ["wd"] and resources[0]["singularName"] == "widget"
    agg = (await api.get("/apis", accept=AGGREGATED)).json
    entry = next(i for i in agg["items"] if i["metadata"]["name"] == "example.com")
    assert entry["versions"][0]["resources"][0]["resource"] == "widgets"
    index = (await api.get("/openapi/v3")).json["paths"]
    assert "apis/example.com/v1" in index and "apis/apiextensions.k8s.io/v1" in index
    doc = (await api.get("/openapi/v3/apis/example.com/v1")).json
    schema = doc["components"]["schemas"]["com.example.v1.Widget"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": "example.com", "kind": "Widget", "version": "v1"}]
    assert schema["properties"]["spec"]["properties"]["color"]["enum"] == ["red", "blue"]
    assert schema["properties"]["metadata"]["$ref"] == "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in doc["components"]["schemas"]
    patch_op = doc["paths"]["/apis/example.com/v1/namespaces/{namespace}/widgets/{name}"]["patch"]
    assert "fieldValidation" in [p["name"] for p in patch_op["parameters"]]


async def test_deleting_the_crd_deletes_its_objects_and_its_kind(api: Api) -> None:
    await _with_widgets(api)
    await api.create(WIDGETS, widget("w1"))
    held = widget("w2")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    await api.create(WIDGETS, held)
    r = await api.delete(f"{CRDS}/widgets.example.com")
    assert r.status in (200, 202), r
    crd = await api.must_get(f"{CRDS}/widgets.example.com")  # held: w2 waits on its finalizer
    assert _condition(crd, "Terminating")["status"] == "True"
    assert (await api.get(f"{WIDGETS}/w1")).status == 404
    r = await api.post(WIDGETS, widget("w3"))
    assert r.status == 405 and "terminating" in r.json["message"], r
    r = await api.patch(f"{WIDGETS}/w2", {"metadata": {"finalizers": None}})
    assert r.status == 200, r
    for _ in range(100):  # the clean-up looks again every CLEANUP_RETRY_SECONDS
        if (await api.get(f"{CRDS}/widgets.example.com")).status == 404:
            break
        await asyncio.sleep(0.05)
    assert (await api.get(f"{CRDS}/widgets.example.com")).status == 404
    assert (await api.get(WIDGETS)).status == 404
    assert (await api.get("/apis/example.com/v1")).status == 404


async def test_the_upstream_pytorchjob_crd_changes_nothing(api: Api) -> None:
    before = (await api.get("/apis/kubeflow.org/v1")).json
    r = await api.post(CRDS, upstream_pytorchjob_crd())
    assert r.status == 201, r
    assert _condition(r.json, "Established")["status"] == "True"
    assert r.json["status"]["acceptedNames"]["kind"] == "PyTorchJob"
    assert (await api.get("/apis/kubeflow.org/v1")).json == before
    jobs = "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs"
    # Still the built-in kind: its own validation (the CRD's schema would take any spec).
    r = await api.post(jobs, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j"},
                              "spec": {"pytorchReplicaSpecs": {}}})
    assert r.status == 422, r
    r = await api.delete(f"{CRDS}/pytorchjobs.kubeflow.org")
    assert r.status in (200, 202)
    assert (await api.get(f"{CRDS}/pytorchjobs.kubeflow.org")).status == 404
    assert (await api.get(jobs)).status == 200


async def test_a_cluster_scoped_kind_with_another_version(api: Api) -> None:
    crd = widget_crd(scope="Cluster")
    v1 = crd["spec"]["versions"][0]
    crd["spec"]["versions"].append({**v1, "name": "v1beta1", "storage": False})
    r = await api.post(CRDS, crd)
    assert r.status == 201, r
    r = await api.post("/apis/example.com/v1beta1/widgets", {**widget("c1"), "apiVersion": "example.com/v1beta1"})
    assert r.status == 201, r
    assert r.json["apiVersion"] == "example.com/v1beta1" and "namespace" not in r.json["metadata"]
    got = await api.must_get("/apis/example.com/v1/widgets/c1")
    assert got["apiVersion"] == "example.com/v1" and got["spec"]["size"] == 3
    assert (await api.get("/apis/example.com/v1/namespaces/default/widgets/c1")).status == 404
    r = await api.patch("/apis/example.com/v1beta1/widgets/c1", {"spec": {"size": 4}}, content_type=STRATEGIC)
    assert r.status == 415, r
    r = await api.patch("/apis/example.com/v1beta1/widgets/c1", {"spec": {"size": 4}})
    assert r.status == 200 and r.json["apiVersion"] == "example.com/v1beta1" and r.json["spec"]["size"] == 4


async def test_rbac_grants_custom_resources_like_any_resource(make_api: Any) -> None:
    holder: dict[str, ApiServer] = {}

    async def authenticate(req: Any) -> UserInfo:
        name = req.headers.get("x-user", "admin")
        return UserInfo(name, ["system:masters"] if name == "admin" else ["system:authenticated"])

    async def authorize(user: UserInfo, info: Any) -> bool:
        return (await RbacAuthorizer(holder["server"].store).decide(user, Attributes.from_request(info))).allowed

    api = await make_api(authenticator=authenticate, authorizer=authorize)
    holder["server"] = api.server
    await _with_widgets(api)
    await api.create("/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles", {
        "metadata": {"name": "widget-reader"},
        "rules": [{"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get", "list"]}]})
    await api.create("/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", {
        "metadata": {"name": "alice-reads"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                         "name": "widget-reader"},
        "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]})
    await api.create(WIDGETS, widget("w1"))
    alice = {"x-user": "alice"}
    assert (await api.get(f"{WIDGETS}/w1", headers=alice)).status == 200
    r = await api.post(WIDGETS, widget("w2"), headers=alice)
    assert r.status == 403, r
    assert r.json["message"] == ('widgets.example.com is forbidden: User "alice" cannot create resource "widgets" '
                                 'in API group "example.com" in the namespace "default"')
    assert (await api.get(f"{WIDGETS}/w1/status", headers=alice)).status == 403


async def test_cel_rules_are_accepted_with_a_warning(api: Api) -> None:
    crd = widget_crd()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"] = [
        {"rule": "self.size <= 5", "message": "small widgets only"}]
    r = await api.post(CRDS, crd)
    assert r.status == 201, r
    assert "x-kubernetes-validations rules are not evaluated by this server" in r.headers["warning"]
    assert "spec.versions[0].schema.openAPIV3Schema" in r.headers["warning"]
    assert (await api.post(WIDGETS, widget("w1", color="red", size=7))).status == 201
