"""OpenAPI for kubectl's validation probe.

The checks replay what kubectl does with the documents: cli-runtime's
`supportsQueryParamV3` (1.29+) and `supportsQueryParam` over gnostic's protobuf
`openapi_v2.Document` (1.27, 1.28), decoded here by a small independent protobuf reader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.api.registry import REGISTRY, Registry, ResourceType
from gpufleet.apiserver import openapi
from gpufleet.apiserver.openapi import (
    OPENAPI_V2_CONTENT_TYPE,
    gvk_yaml,
    openapi_v2_protobuf,
    openapi_v3_document,
    openapi_v3_document_bytes,
    openapi_v3_hash,
    openapi_v3_index,
    schema_package,
)

GVS = [(g, v) for g, vs in REGISTRY.groups().items() for v in vs]


def broken_registry(*extra: ResourceType) -> Registry:
    """The built-in kinds with models that cannot be imported (k8s.py missing or broken)."""
    types = [
        ResourceType(
            t.group, t.version, t.kind, t.plural, t.namespaced, "gpufleet.api.not_there:Nope", verbs=t.verbs,
            storage_version=t.storage_version,
        )
        for t in REGISTRY.served()
    ]
    return Registry([*types, *extra])


# --- kubectl's v3 check -------------------------------------------------------------------


def supports_field_validation_v3(doc: dict[str, Any], group: str, version: str, kind: str) -> bool:
    """cli-runtime's supportsQueryParamV3: the first PATCH tagged with the GVK decides."""
    for item in doc["paths"].values():
        op = item.get("patch")
        if op is None:
            continue
        gvk = op.get("x-kubernetes-group-version-kind")
        if gvk != {"group": group, "version": version, "kind": kind}:
            continue
        return any(p["name"] == "fieldValidation" for p in op.get("parameters", []))
    return False


def test_index_lists_every_group_version_with_its_hash() -> None:
    index = openapi_v3_index(REGISTRY)
    assert set(index["paths"]) == {openapi.gv_path(g, v) for g, v in GVS}
    assert "api/v1" in index["paths"]
    assert "apis/apps/v1" in index["paths"]
    for (g, v), key in zip(GVS, [openapi.gv_path(g, v) for g, v in GVS], strict=True):
        url = index["paths"][key]["serverRelativeURL"]
        m = re.fullmatch(r"/openapi/v3/(.+)\?hash=([0-9A-F]{128})", url)
        assert m, url
        assert m.group(1) == key
        assert m.group(2) == openapi_v3_hash(REGISTRY, g, v)
    assert openapi_v3_index(REGISTRY) == index


@pytest.mark.parametrize(("group", "version"), GVS)
def test_every_kind_delegates_validation_to_the_server(group: str, version: str) -> None:
    doc = openapi_v3_document(REGISTRY, group, version)
    assert doc is not None
    assert doc["openapi"].startswith("3.0")
    assert doc["info"] == {"title": "Kubernetes", "version": "v1.32.4"}
    for rt in REGISTRY.served():
        if (rt.group, rt.version) == (group, version):
            assert supports_field_validation_v3(doc, rt.group, rt.version, rt.kind), rt.kind


@pytest.mark.parametrize(("group", "version"), GVS)
def test_every_patch_operation_declares_field_validation(group: str, version: str) -> None:
    # kubectl reads the paths as a Go map, in random order: any PATCH tagged with a kind may
    # be the one it looks at.
    doc = openapi_v3_document(REGISTRY, group, version)
    assert doc is not None
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            assert op["x-kubernetes-group-version-kind"]["version"] == version, path
            if method in ("patch", "put", "post"):
                assert "fieldValidation" in {p["name"] for p in op["parameters"]}, (path, method)


def test_paths_follow_kubernetes_layout() -> None:
    core = openapi_v3_document(REGISTRY, "", "v1")
    assert core is not None
    pod = core["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]
    assert set(pod) >= {"get", "put", "patch", "delete", "parameters"}
    assert {p["name"] for p in pod["parameters"]} == {"name", "namespace"}
    assert all(p["in"] == "path" and p["required"] for p in pod["parameters"])
    assert pod["patch"]["x-kubernetes-action"] == "patch"
    assert pod["patch"]["operationId"] == "patchCoreV1NamespacedPod"
    pods = core["paths"]["/api/v1/namespaces/{namespace}/pods"]
    assert pods["post"]["x-kubernetes-action"] == "post"
    assert pods["get"]["x-kubernetes-action"] == "list"
    assert pods["delete"]["x-kubernetes-action"] == "deletecollection"
    assert "fieldValidation" in {p["name"] for p in pods["post"]["parameters"]}
    assert "/api/v1/pods" in core["paths"]
    node = core["paths"]["/api/v1/nodes/{name}"]
    assert [p["name"] for p in node["parameters"]] == ["name"]
    assert "/api/v1/namespaces/{namespace}/nodes/{name}" not in core["paths"]

    apps = openapi_v3_document(REGISTRY, "apps", "v1")
    assert apps is not None
    dep = apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert dep["x-kubernetes-group-version-kind"] == {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert dep["operationId"] == "patchAppsV1NamespacedDeployment"
    pc = openapi_v3_document(REGISTRY, "scheduling.k8s.io", "v1")
    assert pc is not None
    assert pc["paths"]["/apis/scheduling.k8s.io/v1/priorityclasses/{name}"]["patch"]["operationId"] == (
        "patchSchedulingV1PriorityClass"
    )


def test_patch_declares_no_request_body() -> None:
    # With `application/strategic-merge-patch+json` listed, kubectl apply would compute its
    # patch from our schemas instead of its compiled-in Kubernetes types.
    for g, v in GVS:
        doc = openapi_v3_document(REGISTRY, g, v)
        assert doc is not None
        for item in doc["paths"].values():
            if "patch" in item:
                assert "requestBody" not in item["patch"]


def test_unknown_group_version() -> None:
    assert openapi_v3_document(REGISTRY, "apps", "v1beta1") is None
    assert openapi_v3_document(REGISTRY, "nope.example.com", "v1") is None
    assert openapi_v3_hash(REGISTRY, "nope.example.com", "v1") is None
    assert openapi_v3_document_bytes(REGISTRY, "nope.example.com", "v1") is None


def test_bytes_are_the_document_and_match_the_hash() -> None:
    import hashlib

    body, digest = openapi_v3_document_bytes(REGISTRY, "apps", "v1") or (b"", "")
    assert json.loads(body) == openapi_v3_document(REGISTRY, "apps", "v1")
    assert hashlib.sha512(body).hexdigest().upper() == digest


def test_documents_are_cached() -> None:
    first = openapi_v3_document(REGISTRY, "", "v1")
    assert openapi_v3_document(REGISTRY, "", "v1") is first
    assert openapi_v2_protobuf(REGISTRY) is openapi_v2_protobuf(REGISTRY)


def test_hash_changes_with_the_document_and_only_then() -> None:
    base = broken_registry()
    before = {gv: openapi_v3_hash(base, *gv) for gv in GVS}
    rollout = ResourceType(
        "apps", "v1", "Rollout", "rollouts", True, "gpufleet.api.not_there:Nope"
    )
    grown = broken_registry(rollout)
    after = {gv: openapi_v3_hash(grown, *gv) for gv in GVS}
    assert after[("apps", "v1")] != before[("apps", "v1")]
    assert {gv: h for gv, h in after.items() if gv != ("apps", "v1")} == {
        gv: h for gv, h in before.items() if gv != ("apps", "v1")
    }
    doc = openapi_v3_document(grown, "apps", "v1")
    assert doc is not None
    assert supports_field_validation_v3(doc, "apps", "v1", "Rollout")
    assert openapi_v3_hash(broken_registry(), "apps", "v1") == before[("apps", "v1")]


def test_custom_group_gets_its_own_document() -> None:
    job = ResourceType("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs", True, "gpufleet.api.not_there:Nope")
    reg = broken_registry(job)
    index = openapi_v3_index(reg)
    assert "apis/kubeflow.org/v1" in index["paths"]
    doc = openapi_v3_document(reg, "kubeflow.org", "v1")
    assert doc is not None
    assert supports_field_validation_v3(doc, "kubeflow.org", "v1", "PyTorchJob")
    assert "/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{name}" in doc["paths"]


# --- schemas ------------------------------------------------------------------------------


def refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                found.add(v)
            else:
                found |= refs(v)
    elif isinstance(node, list):
        for v in node:
            found |= refs(v)
    return found


def test_schemas_have_kubernetes_names_and_resolve() -> None:
    doc = openapi_v3_document(REGISTRY, "apps", "v1")
    assert doc is not None
    schemas = doc["components"]["schemas"]
    dep = schemas["io.k8s.api.apps.v1.Deployment"]
    assert dep["x-kubernetes-group-version-kind"] == [
        {"group": "apps", "kind": "Deployment", "version": "v1"}
    ]
    assert "io.k8s.api.core.v1.PodSpec" in schemas
    assert "io.k8s.api.core.v1.PodTemplateSpec" in schemas
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in schemas
    for ref in refs(doc):
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.removeprefix("#/components/schemas/") in schemas, ref
    text = json.dumps(doc)
    assert "$defs" not in text
    assert '{"type": "null"}' not in text


def test_schemas_carry_patch_strategies() -> None:
    core = openapi_v3_document(REGISTRY, "", "v1")
    assert core is not None
    schemas = core["components"]["schemas"]
    containers = schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
    assert containers["x-kubernetes-patch-strategy"] == "merge"
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    ports = schemas["io.k8s.api.core.v1.Container"]["properties"]["ports"]
    assert ports["x-kubernetes-patch-merge-key"] == "containerPort"
    svc_ports = schemas["io.k8s.api.core.v1.ServiceSpec"]["properties"]["ports"]
    assert svc_ports["x-kubernetes-patch-merge-key"] == "port"
    assert "x-kubernetes-patch-merge-key" not in schemas["io.k8s.api.core.v1.Container"]["properties"]["args"]


def test_schemas_carry_descriptions_for_kubectl_explain() -> None:
    apps = openapi_v3_document(REGISTRY, "apps", "v1")
    assert apps is not None
    schemas = apps["components"]["schemas"]
    replicas = schemas["io.k8s.api.apps.v1.DeploymentSpec"]["properties"]["replicas"]
    assert replicas["type"] == "integer"
    assert replicas["description"].startswith("Number of desired pods.")
    assert schemas["io.k8s.api.apps.v1.Deployment"]["description"] == (
        "Deployment enables declarative updates for Pods and ReplicaSets."
    )
    # The whole class description, not just the docstring's first sentence.
    selector = schemas["io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"]["description"]
    assert (
        selector.startswith("A label selector is") and "A null label selector matches no objects." in selector
    )
    meta = schemas["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"]
    assert "unique within a namespace" in meta["name"]["description"]
    core = openapi_v3_document(REGISTRY, "", "v1")
    assert core is not None
    image = core["components"]["schemas"]["io.k8s.api.core.v1.Container"]["properties"]["image"]
    assert image["description"].startswith("Container image name.")


def test_a_described_ref_is_wrapped_in_all_of(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = {"Thing": "A thing. It does things.", "Thing.part": "The part.", "Thing.size": "How big."}
    monkeypatch.setattr(openapi, "_descriptions", lambda: texts)
    schema = {
        "type": "object",
        "description": "A thing.",  # pydantic's, from the one-sentence class docstring
        "properties": {
            "part": {"$ref": "#/components/schemas/x.Part"},
            "size": {"type": "integer"},
            "other": {"type": "string"},
        },
    }
    out = openapi._describe("Thing", schema)
    assert out["description"] == "A thing. It does things."
    assert out["properties"]["part"] == {
        "allOf": [{"$ref": "#/components/schemas/x.Part"}],
        "description": "The part.",
    }
    assert out["properties"]["size"] == {"type": "integer", "description": "How big."}
    assert out["properties"]["other"] == {"type": "string"}
    assert schema["description"] == "A thing." and "description" not in schema["properties"]["size"]


def test_without_descriptions_the_schemas_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openapi, "_descriptions", dict)
    schema = {"type": "object", "properties": {"replicas": {"type": "integer"}}}
    assert openapi._describe("DeploymentSpec", schema) == schema


def test_descriptions_are_not_loaded_by_the_models() -> None:
    # k8s.py is imported by everything; the descriptions must cost nothing there.
    source = (Path(openapi.__file__).parents[1] / "api" / "k8s.py").read_text()
    assert "k8s_descriptions" not in source
    assert "description=" not in source


def test_operations_point_at_the_kind_schema() -> None:
    doc = openapi_v3_document(REGISTRY, "", "v1")
    assert doc is not None
    get = doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["get"]
    schema = get["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/io.k8s.api.core.v1.Pod"}


def test_without_models_the_document_still_serves_kubectl() -> None:
    reg = broken_registry()
    for g, v in GVS:
        doc = openapi_v3_document(reg, g, v)
        assert doc is not None
        assert doc["components"] == {"schemas": {}}
        assert not refs(doc)
        for rt in reg.served():
            if (rt.group, rt.version) == (g, v):
                assert supports_field_validation_v3(doc, rt.group, rt.version, rt.kind)
    assert "api/v1" in openapi_v3_index(reg)["paths"]


def test_a_model_that_fails_to_build_its_schema_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    class Exploding:
        @staticmethod
        def model_json_schema(by_alias: bool = True) -> dict:
            raise RuntimeError("generator half way through")

    pod = next(t for t in REGISTRY.all() if t.kind == "Pod")
    odd = ResourceType("", "v1", "Pod", "pods", True, "x:y")
    monkeypatch.setitem(odd.__dict__, "model", Exploding)
    reg = Registry([odd, *[t for t in REGISTRY.all() if t is not pod]])
    doc = openapi_v3_document(reg, "", "v1")
    assert doc is not None
    assert "io.k8s.api.core.v1.Pod" not in doc["components"]["schemas"]
    assert "io.k8s.api.core.v1.Node" in doc["components"]["schemas"]
    assert supports_field_validation_v3(doc, "", "v1", "Pod")


@pytest.mark.parametrize(
    ("group", "version", "package"),
    [
        ("", "v1", "io.k8s.api.core.v1"),
        ("apps", "v1", "io.k8s.api.apps.v1"),
        ("scheduling.k8s.io", "v1", "io.k8s.api.scheduling.v1"),
        ("kubeflow.org", "v1", "org.kubeflow.v1"),
        ("kueue.x-k8s.io", "v1beta1", "io.x-k8s.kueue.v1beta1"),
        ("scheduling.x-k8s.io", "v1alpha1", "io.x-k8s.scheduling.v1alpha1"),
    ],
)
def test_schema_package(group: str, version: str, package: str) -> None:
    assert schema_package(group, version) == package


# --- v2 protobuf --------------------------------------------------------------------------
#
# Field numbers of the messages read below, from github.com/google/gnostic
# openapiv2/OpenAPIv2.proto (package openapi.v2). They are written out again here, apart from
# the encoder, so that a wrong number on either side fails the test.
PROTO: dict[str, dict[int, tuple[str, str | None]]] = {
    "Document": {1: ("swagger", None), 2: ("info", "Info"), 8: ("paths", "Paths")},
    "Info": {1: ("title", None), 2: ("version", None)},
    "Paths": {1: ("vendor_extension", "NamedAny"), 2: ("path", "NamedPathItem")},
    "NamedPathItem": {1: ("name", None), 2: ("value", "PathItem")},
    "PathItem": {
        2: ("get", "Operation"),
        3: ("put", "Operation"),
        4: ("post", "Operation"),
        5: ("delete", "Operation"),
        8: ("patch", "Operation"),
        9: ("parameters", "ParametersItem"),
        10: ("vendor_extension", "NamedAny"),
    },
    "Operation": {
        1: ("tags", None),
        5: ("operation_id", None),
        8: ("parameters", "ParametersItem"),
        9: ("responses", "Responses"),
        13: ("vendor_extension", "NamedAny"),
    },
    "ParametersItem": {1: ("parameter", "Parameter"), 2: ("json_reference", None)},
    "Parameter": {1: ("body_parameter", None), 2: ("non_body_parameter", "NonBodyParameter")},
    "NonBodyParameter": {
        3: ("query_parameter_sub_schema", "QueryParameterSubSchema"),
        4: ("path_parameter_sub_schema", "PathParameterSubSchema"),
    },
    "QueryParameterSubSchema": {
        1: ("required", "bool"),
        2: ("in", None),
        3: ("description", None),
        4: ("name", None),
        6: ("type", None),
    },
    "PathParameterSubSchema": {
        1: ("required", "bool"),
        2: ("in", None),
        3: ("description", None),
        4: ("name", None),
        5: ("type", None),
    },
    "Responses": {1: ("response_code", "NamedResponseValue")},
    "NamedResponseValue": {1: ("name", None), 2: ("value", "ResponseValue")},
    "ResponseValue": {1: ("response", "Response")},
    "Response": {1: ("description", None)},
    "NamedAny": {1: ("name", None), 2: ("value", "Any")},
    "Any": {2: ("yaml", None)},
}


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def decode(data: bytes, message: str) -> dict[str, list[Any]]:
    """Every field of `message` as name -> values; nested messages decoded by the table above."""
    fields = PROTO[message]
    out: dict[str, list[Any]] = {}
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        assert number in fields, f"{message} has no field {number}"
        name, sub = fields[number]
        if wire == 0:
            assert sub == "bool", f"{message}.{name} is not a varint field"
            value, pos = read_varint(data, pos)
            out.setdefault(name, []).append(bool(value))
        elif wire == 2:
            assert sub != "bool", f"{message}.{name} is a varint field"
            length, pos = read_varint(data, pos)
            chunk = data[pos : pos + length]
            assert len(chunk) == length, "truncated"
            pos += length
            out.setdefault(name, []).append(decode(chunk, sub) if sub else chunk.decode())
        else:
            raise AssertionError(f"unexpected wire type {wire} in {message}.{name}")
    assert pos == len(data)
    return out


def one(msg: dict[str, list[Any]], name: str, default: Any = None) -> Any:
    values = msg.get(name, [])
    assert len(values) <= 1, name
    return values[0] if values else default


def supports_field_validation_v2(doc: dict[str, list[Any]], group: str, version: str, kind: str) -> bool:
    """cli-runtime's supportsQueryParam over the decoded Document."""
    for path in one(doc, "paths", {}).get("path", []):
        patch = one(one(path, "value", {}), "patch", {})
        ext = [
            e
            for e in patch.get("vendor_extension", [])
            if one(e, "name") == "x-kubernetes-group-version-kind"
        ]
        if not ext:
            continue
        gvk = yaml.safe_load(one(one(ext[0], "value", {}), "yaml", ""))
        if gvk != {"group": group, "version": version, "kind": kind}:
            continue
        for param in patch.get("parameters", []):
            query = one(
                one(
                    one(one(param, "parameter", {}), "non_body_parameter", {}),
                    "query_parameter_sub_schema",
                    {},
                ),
                "name",
            )
            if query == "fieldValidation":
                return True
        return False
    return False


def test_varint() -> None:
    assert openapi._varint(0) == b"\x00"
    assert openapi._varint(1) == b"\x01"
    assert openapi._varint(127) == b"\x7f"
    assert openapi._varint(128) == b"\x80\x01"
    assert openapi._varint(300) == b"\xac\x02"
    for n in (0, 1, 127, 128, 16383, 16384, 2**21, 2**35 + 7):
        assert read_varint(openapi._varint(n), 0) == (n, len(openapi._varint(n)))


def test_gvk_yaml() -> None:
    assert gvk_yaml("apps", "v1", "Deployment") == "group: apps\nkind: Deployment\nversion: v1\n"
    assert gvk_yaml("", "v1", "Pod") == 'group: ""\nkind: Pod\nversion: v1\n'
    assert yaml.safe_load(gvk_yaml("", "v1", "Pod")) == {"group": "", "kind": "Pod", "version": "v1"}
    assert yaml.safe_load(gvk_yaml("kueue.x-k8s.io", "v1beta1", "ClusterQueue"))["group"] == "kueue.x-k8s.io"


def test_v2_document_decodes() -> None:
    doc = decode(openapi_v2_protobuf(REGISTRY), "Document")
    assert one(doc, "swagger") == "2.0"
    info = one(doc, "info")
    assert (one(info, "title"), one(info, "version")) == ("Kubernetes", "v1.32.4")
    names = [one(p, "name") for p in one(doc, "paths")["path"]]
    assert "/apis/apps/v1/namespaces/{namespace}/deployments/{name}" in names
    assert "/api/v1/namespaces/{namespace}/pods/{name}" in names
    assert "/api/v1/nodes/{name}" in names
    assert len(names) == len(set(names)) == sum("patch" in t.verbs for t in REGISTRY.served())


@pytest.mark.parametrize("rt", REGISTRY.served(), ids=lambda t: f"{t.kind}.{t.version}")
def test_v2_every_kind_delegates_validation_to_the_server(rt: ResourceType) -> None:
    doc = decode(openapi_v2_protobuf(REGISTRY), "Document")
    assert supports_field_validation_v2(doc, rt.group, rt.version, rt.kind)


def test_v2_patch_operation_in_detail() -> None:
    doc = decode(openapi_v2_protobuf(REGISTRY), "Document")
    path = next(
        p
        for p in one(doc, "paths")["path"]
        if one(p, "name") == "/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
    )
    item = one(path, "value")
    patch = one(item, "patch")
    assert one(patch, "operation_id") == "patchAppsV1NamespacedDeployment"
    query = {
        one(sub, "name"): sub
        for p in patch["parameters"]
        for sub in [one(one(one(p, "parameter"), "non_body_parameter"), "query_parameter_sub_schema")]
    }
    assert set(query) == {"dryRun", "fieldManager", "fieldValidation", "force"}
    assert (one(query["fieldValidation"], "in"), one(query["fieldValidation"], "type")) == ("query", "string")
    assert one(query["force"], "type") == "boolean"
    ext = {one(e, "name"): one(one(e, "value"), "yaml") for e in patch["vendor_extension"]}
    assert ext["x-kubernetes-group-version-kind"] == "group: apps\nkind: Deployment\nversion: v1\n"
    assert ext["x-kubernetes-action"].strip() == "patch"
    assert one(patch["vendor_extension"][0], "name") == "x-kubernetes-group-version-kind"
    code = one(one(patch, "responses"), "response_code")
    assert one(code, "name") == "200"
    path_params = [
        one(one(one(one(p, "parameter"), "non_body_parameter"), "path_parameter_sub_schema"), "name")
        for p in item["parameters"]
    ]
    assert path_params == ["name", "namespace"]


def test_v2_kinds_it_does_not_know_are_not_claimed() -> None:
    doc = decode(openapi_v2_protobuf(REGISTRY), "Document")
    assert not supports_field_validation_v2(doc, "apps", "v1", "Rollout")
    assert not supports_field_validation_v2(doc, "", "v1", "Deployment")


def test_v2_follows_the_registry() -> None:
    job = ResourceType("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs", True, "gpufleet.api.not_there:Nope")
    doc = decode(openapi_v2_protobuf(broken_registry(job)), "Document")
    assert supports_field_validation_v2(doc, "kubeflow.org", "v1", "PyTorchJob")
    assert supports_field_validation_v2(doc, "", "v1", "Pod")


def test_v2_content_type_is_one_go_can_parse() -> None:
    # kubectl's Accept carries "…spec.v2@v1.0+protobuf"; Go's mime parser rejects the '@'.
    assert "@" not in OPENAPI_V2_CONTENT_TYPE
    assert re.fullmatch(r"application/[A-Za-z0-9.+-]+", OPENAPI_V2_CONTENT_TYPE)
