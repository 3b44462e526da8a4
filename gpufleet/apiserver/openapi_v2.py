"""The protobuf OpenAPI v2 document kubectl 1.27 and 1.28 download (operations only).
"""

from __future__ import annotations

import json

from gpufleet.api.registry import ResourceType
from gpufleet.apiserver.openapi_common import (
    _QUERY_DESCRIPTIONS,
    _QUERY_TYPES,
    _WRITE_PARAMS,
    _operation_prefix,
)

# --- v2 protobuf ---------------------------------------------------------------------------
#
# A hand-written encoder for the few messages of gnostic's openapi_v2.Document that kubectl
# reads (github.com/google/gnostic, openapiv2/OpenAPIv2.proto). Field numbers:
#   Document: swagger 1, info 2, paths 8          Info: title 1, version 2
#   Paths: path 2 (NamedPathItem: name 1, value 2) PathItem: patch 8, parameters 9
#   Operation: operation_id 5, parameters 8, responses 9, vendor_extension 13
#   ParametersItem: parameter 1   Parameter: non_body_parameter 2
#   NonBodyParameter: query_parameter_sub_schema 3, path_parameter_sub_schema 4
#   QueryParameterSubSchema: required 1, in 2, description 3, name 4, type 6
#   PathParameterSubSchema: required 1, in 2, description 3, name 4, type 5
#   Responses: response_code 1 (NamedResponseValue: name 1, value 2)
#   ResponseValue: response 1      Response: description 1
#   NamedAny: name 1, value 2      Any: yaml 2

_VARINT = 0
_LEN = 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field_bytes(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | _LEN) + _varint(len(data)) + data


def _field_str(number: int, text: str) -> bytes:
    # proto3 leaves empty strings off the wire
    return _field_bytes(number, text.encode()) if text else b""


def _field_bool(number: int, value: bool) -> bytes:
    return _varint(number << 3 | _VARINT) + _varint(1) if value else b""


def _field_msg(number: int, *parts: bytes) -> bytes:
    return _field_bytes(number, b"".join(parts))


def _yaml_scalar(text: str) -> str:
    plain = text and all(c.isalnum() or c in ".-_/" for c in text) and text[0].isalpha()
    return text if plain else json.dumps(text)


def gvk_yaml(group: str, version: str, kind: str) -> str:
    """The GVK extension as gnostic carries it: YAML with sorted keys, `group: ""` for core."""
    return f"group: {_yaml_scalar(group)}\nkind: {_yaml_scalar(kind)}\nversion: {_yaml_scalar(version)}\n"


def _v2_query_param(name: str) -> bytes:
    sub = _field_str(2, "query") + _field_str(3, _QUERY_DESCRIPTIONS.get(name, "")) + _field_str(4, name)
    sub += _field_str(6, _QUERY_TYPES.get(name, "string"))
    return _field_msg(1, _field_msg(2, _field_msg(3, sub)))


def _v2_path_param(name: str) -> bytes:
    sub = _field_bool(1, True) + _field_str(2, "path") + _field_str(4, name) + _field_str(5, "string")
    return _field_msg(1, _field_msg(2, _field_msg(4, sub)))


def _v2_named_any(name: str, yaml_text: str) -> bytes:
    return _field_str(1, name) + _field_msg(2, _field_str(2, yaml_text))


def _v2_path(rt: ResourceType) -> bytes:
    operation = _field_str(5, f"patch{_operation_prefix(rt)}{'Namespaced' if rt.namespaced else ''}{rt.kind}")
    for name in (*_WRITE_PARAMS, "force"):
        operation += _field_msg(8, _v2_query_param(name))
    ok = _field_str(1, "200") + _field_msg(2, _field_msg(1, _field_str(1, "OK")))
    operation += _field_msg(9, _field_msg(1, ok))
    # The GVK goes first: kubectl's check gives up at the first GVK extension that differs.
    operation += _field_msg(13, _v2_named_any("x-kubernetes-group-version-kind", gvk_yaml(*rt.gvk)))
    operation += _field_msg(13, _v2_named_any("x-kubernetes-action", "patch\n"))
    path_item = _field_msg(8, operation)
    path_item += _field_msg(9, _v2_path_param("name"))
    if rt.namespaced:
        path_item += _field_msg(9, _v2_path_param("namespace"))
    named = _field_str(1, rt.path(namespace="{namespace}", name="{name}")) + _field_msg(2, path_item)
    return _field_msg(2, named)


def v2_document(types: tuple[ResourceType, ...], info_version: str) -> bytes:
    """The openapi_v2.Document of `types`: per kind, the item path's PATCH declaring `fieldValidation`."""
    info = _field_str(1, "Kubernetes") + _field_str(2, info_version)
    paths = b"".join(_v2_path(rt) for rt in types if "patch" in rt.verbs)
    return _field_str(1, "2.0") + _field_msg(2, info) + _field_msg(8, paths)
