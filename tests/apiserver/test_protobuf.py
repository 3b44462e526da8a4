"""Decoding of `application/vnd.kubernetes.protobuf` bodies (kubectl 1.32+ imperative creates).

The fixtures are real request bodies from kubectl 1.32 and 1.33; the expected dicts are the
JSON bodies kubectl 1.31 sent for the same commands (see protobuf_fixtures/README.txt), so a
decoded body must equal, key for key, what a JSON client would have sent.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from apiserver_helpers import CONFIGMAPS, DEPLOYMENTS, NAMESPACES, Api

from gpufleet.api.registry import REGISTRY, Registry
from gpufleet.apiserver import protobuf
from gpufleet.apiserver.errors import ApiException
from gpufleet.apiserver.protobuf import KINDS, MAGIC, SCHEMA, SUBRESOURCE_KINDS, decode_k8s_protobuf

FIXTURES = Path(__file__).parent / "protobuf_fixtures"
NAMES = sorted(p.name.removesuffix(".expected.json") for p in FIXTURES.glob("*.expected.json"))
PROTOBUF = "application/vnd.kubernetes.protobuf"

# A registry without CronJob: a kind the server does not serve is refused by name.
WITHOUT_CRONJOB = Registry([rt for rt in REGISTRY.served() if rt.kind != "CronJob"])


def fixture(name: str, version: str) -> bytes:
    return (FIXTURES / f"{name}.{version}.pb").read_bytes()


def expected(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.expected.json").read_text())


# --- a small encoder, to build bodies the fixtures do not contain


def varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def vi(num: int, v: int) -> bytes:
    return varint(num << 3) + varint(v)


def ld(num: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(num << 3 | 2) + varint(len(data)) + data


def envelope(api_version: str, kind: str, raw: bytes, encoding: str = "", content_type: str = "") -> bytes:
    type_meta = ld(1, api_version) + ld(2, kind)
    return MAGIC + ld(1, type_meta) + ld(2, raw) + ld(3, encoding) + ld(4, content_type)


def meta(name: str) -> bytes:
    return ld(1, ld(1, name))


def decode_error(body: bytes, registry: Registry = REGISTRY) -> ApiException:
    with pytest.raises(ApiException) as e:
        decode_k8s_protobuf(body, registry)
    return e.value


# --- fixtures from real kubectl


def test_every_capture_has_both_versions() -> None:
    assert len(NAMES) >= 15
    for name in NAMES:
        assert (FIXTURES / f"{name}.1.32.pb").exists() and (FIXTURES / f"{name}.1.33.pb").exists(), name


@pytest.mark.parametrize("version", ["1.32", "1.33"])
@pytest.mark.parametrize("name", NAMES)
def test_kubectl_body_decodes_to_the_json_kubectl_would_send(name: str, version: str) -> None:
    assert decode_k8s_protobuf(fixture(name, version), REGISTRY) == expected(name)


def test_decoded_deployment_shape() -> None:
    # The details the JSON path relies on, spelled out.
    got = decode_k8s_protobuf(fixture("deployment", "1.33"), REGISTRY)
    assert got["metadata"] == {"name": "web", "creationTimestamp": None, "labels": {"app": "web"}}
    assert got["spec"]["replicas"] == 2
    assert got["spec"]["strategy"] == {} and got["status"] == {}
    container = got["spec"]["template"]["spec"]["containers"][0]
    assert container == {"name": "nginx", "image": "nginx:1.25", "resources": {}}


def test_secret_data_and_binary_configmap_are_base64() -> None:
    secret = decode_k8s_protobuf(fixture("secret", "1.32"), REGISTRY)
    assert secret["data"] == {"user": "YWRtaW4=", "password": "czNjcjN0"}
    blob = decode_k8s_protobuf(fixture("configmap-binary", "1.32"), REGISTRY)
    assert blob["binaryData"] == {"bin.dat": "aGVsbG8A//5iaW4="}


def test_a_kind_the_server_does_not_serve_is_refused_by_name() -> None:
    err = decode_error(fixture("cronjob", "1.32"), WITHOUT_CRONJOB)
    assert err.code == 400 and 'no kind "CronJob" is registered for version "batch/v1"' in err.message


# --- the schema table itself


def test_schema_references_resolve() -> None:
    for message, fields in SCHEMA.items():
        for num, (name, t) in fields.items():
            assert num > 0, (message, num)
            base = re.sub(r"^[*!^?]", "", t).removeprefix("[]")
            if base.startswith("map["):
                base = base[4:-1]
            if t.startswith("?"):
                continue
            known = (
                base in SCHEMA
                or base in {"string", "int32", "int64", "bool", "bytes"}
                or base
                in {
                    "Time",
                    "MicroTime",
                    "Quantity",
                    "IntOrString",
                    "FieldsV1",
                }
            )
            assert known, f"{message}.{name} refers to {base}, which the schema does not define"
            assert (name == "") == t.startswith("^"), (message, num)
    for message in KINDS.values():
        assert message in SCHEMA


def test_every_modelled_kind_is_a_registered_kind() -> None:
    for api_version, kind in KINDS:
        if (api_version, kind) in SUBRESOURCE_KINDS:
            continue
        assert REGISTRY.by_api_version_kind(api_version, kind) is not None, kind


def test_a_token_request_decodes_as_kubectl_create_token_sends_it() -> None:
    """`kubectl create token bot --duration 20m --audience a --bound-object-kind Pod ...`."""
    spec = ld(1, "a") + ld(3, ld(1, "Pod") + ld(2, "v1") + ld(3, "p1") + ld(4, "u1")) + vi(4, 1200)
    body = envelope("authentication.k8s.io/v1", "TokenRequest", ld(1, b"") + ld(2, spec) + ld(3, b""))
    assert decode_k8s_protobuf(body, REGISTRY) == {
        "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": {"audiences": ["a"], "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p1", "uid": "u1"},
                 "expirationSeconds": 1200},
        "status": {"token": "", "expirationTimestamp": None},
    }


# --- values the fixtures do not exercise


def test_scalars_times_quantities_and_int_or_string() -> None:
    container = (
        ld(1, "c")
        + ld(8, ld(1, ld(1, "nvidia.com/gpu") + ld(2, ld(1, "2"))))  # resources.limits
        + ld(15, b"")  # securityContext: present but empty
        + ld(7, ld(1, "A") + ld(3, ld(3, ld(1, ld(1, "cm")) + ld(2, "key"))))  # env valueFrom.configMapKeyRef
    )
    spec = ld(2, container) + vi(4, (1 << 64) - 1)  # terminationGracePeriodSeconds = -1
    template = ld(1, ld(1, "") + ld(8, vi(1, 1700000000) + vi(2, 5))) + ld(2, spec)
    rolling = ld(1, vi(1, 1) + ld(3, "25%")) + ld(2, vi(1, 0) + vi(2, 3))
    raw = meta("d") + ld(2, vi(1, 0) + ld(3, template) + ld(4, ld(1, "RollingUpdate") + ld(2, rolling)))
    got = decode_k8s_protobuf(envelope("apps/v1", "Deployment", raw), REGISTRY)
    spec_out = got["spec"]
    assert spec_out["replicas"] == 0  # a pointer: present, so written even though zero
    assert spec_out["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 3},
    }
    tmpl = spec_out["template"]
    assert tmpl["metadata"] == {"creationTimestamp": "2023-11-14T22:13:20Z"}
    assert tmpl["spec"]["terminationGracePeriodSeconds"] == -1
    c = tmpl["spec"]["containers"][0]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert c["securityContext"] == {}
    assert c["env"] == [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "key"}}}]


def test_packed_and_unpacked_repeated_ints() -> None:
    unpacked = vi(4, 1000) + vi(4, 2000)
    packed = ld(4, varint(1000) + varint(2000))
    for encoded in (unpacked, packed):
        spec = ld(2, ld(1, "c")) + ld(14, encoded)  # securityContext.supplementalGroups
        raw = meta("p") + ld(2, spec)
        got = decode_k8s_protobuf(envelope("v1", "Pod", raw), REGISTRY)
        assert got["spec"]["securityContext"] == {"supplementalGroups": [1000, 2000]}
        assert got["status"] == {}


def test_containers_is_null_when_absent_like_go_json() -> None:
    got = decode_k8s_protobuf(envelope("v1", "Pod", meta("p")), REGISTRY)
    assert got["spec"] == {"containers": None}


# --- errors


def test_unknown_field_is_a_400_naming_message_and_number() -> None:
    err = decode_error(envelope("v1", "ConfigMap", meta("c") + vi(99, 1)))
    assert (err.code, err.reason) == (400, "BadRequest")
    assert "unknown field 99" in err.message and "ConfigMap" in err.message


def test_unknown_field_in_a_nested_message() -> None:
    raw = meta("d") + ld(2, ld(3, ld(2, ld(2, ld(1, "c") + vi(77, 1)))))
    err = decode_error(envelope("apps/v1", "Deployment", raw))
    assert err.code == 400 and "unknown field 77" in err.message and "Container" in err.message


def test_unmodelled_field_type_is_a_400_asking_for_json() -> None:
    probe = ld(10, ld(1, ld(1, ld(1, "true"))))
    raw = meta("p") + ld(2, ld(2, ld(1, "c") + probe))
    err = decode_error(envelope("v1", "Pod", raw))
    assert err.code == 400 and "livenessProbe" in err.message and "application/json" in err.message


def test_registered_but_unmodelled_kind_is_415() -> None:
    err = decode_error(envelope("v1", "Node", meta("n")))
    assert (err.code, err.reason) == (415, "UnsupportedMediaType")


@pytest.mark.parametrize(
    "body",
    [
        b'{"kind":"Namespace"}',  # no magic
        MAGIC + b"\x0a\xff",  # truncated length
        MAGIC + b"\x0a\x05\x0a\x02v1",  # length past the end
        envelope("v1", "Namespace", b"\x0a"),  # truncated inner message
        envelope("v1", "Namespace", vi(1, 5)),  # metadata with the wrong wire type
        envelope("", "", b""),  # no type
        envelope("v1", "Namespace", meta("x") + b"\x0b"),  # group wire type
        envelope("v1", "ConfigMap", meta("x") + ld(2, ld(1, b"\xff") + ld(2, "v"))),  # invalid UTF-8 key
    ],
)
def test_malformed_bodies_are_400(body: bytes) -> None:
    err = decode_error(body)
    assert (err.code, err.reason) == (400, "BadRequest"), err.message


def test_corrupted_kubectl_bodies_never_crash() -> None:
    # Flipped, dropped and inserted bytes must end in a dict or a 400/415, never another error.
    rnd = random.Random(20250601)
    bodies = [fixture(name, "1.32") for name in NAMES]
    for _ in range(3000):
        body = bytearray(rnd.choice(bodies))
        for _ in range(rnd.randint(1, 3)):
            i = rnd.randrange(len(body))
            op = rnd.random()
            if op < 0.5:
                body[i] = rnd.randrange(256)
            elif op < 0.75:
                del body[i : i + rnd.randint(1, 4)]
            else:
                body[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 4)))
        try:
            assert isinstance(decode_k8s_protobuf(bytes(body), REGISTRY), dict)
        except ApiException as e:
            assert e.code in (400, 415), (e.code, e.message, bytes(body))


def test_content_encoding_is_415() -> None:
    err = decode_error(envelope("v1", "Namespace", meta("x"), encoding="gzip"))
    assert err.code == 415


def test_protobuf_decode_error_is_an_api_exception() -> None:
    assert issubclass(protobuf.ProtobufDecodeError, ApiException)


# --- through the server


async def test_server_creates_from_kubectl_protobuf_bodies(api: Api) -> None:
    query = {"fieldManager": "kubectl-create", "fieldValidation": "Strict"}
    r = await api.post(NAMESPACES, fixture("namespace", "1.32"), content_type=PROTOBUF, query=query)
    assert r.status == 201, r
    assert r.headers.get("content-type", "").startswith("application/json")
    assert r.json["metadata"]["name"] == "team-a"

    r = await api.post(CONFIGMAPS, fixture("configmap", "1.33"), content_type=PROTOBUF, query=query)
    assert r.status == 201, r
    assert (await api.must_get(f"{CONFIGMAPS}/settings"))["data"] == {"k": "v", "mode": "fast"}

    r = await api.post(DEPLOYMENTS, fixture("deployment", "1.33"), content_type=PROTOBUF, query=query)
    assert r.status == 201, r
    got = await api.must_get(f"{DEPLOYMENTS}/web")
    assert got["spec"]["replicas"] == 2
    assert got["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.25"


async def test_server_reports_decode_errors_as_status(api: Api) -> None:
    r = await api.post(CONFIGMAPS, envelope("v1", "ConfigMap", meta("c") + vi(99, 1)), content_type=PROTOBUF)
    assert r.status == 400, r
    assert r.json["kind"] == "Status" and "unknown field 99" in r.json["message"]


async def test_other_protobuf_types_stay_415(api: Api) -> None:
    r = await api.post(CONFIGMAPS, fixture("configmap", "1.32"), content_type="application/x-protobuf")
    assert r.status == 415, r
