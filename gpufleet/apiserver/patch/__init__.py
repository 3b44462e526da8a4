"""The PATCH bodies Kubernetes accepts, applied to objects held as JSON dicts.

- ``application/json-patch+json``: RFC 6902 operations (through the ``jsonpatch`` library).
- ``application/merge-patch+json``: RFC 7386 (objects merge, lists are replaced, null deletes).
- ``application/strategic-merge-patch+json``: Kubernetes' strategic merge patch, which is what
  ``kubectl apply`` (client side), ``kubectl patch`` and ``kubectl edit`` send for built-in kinds.
- ``application/apply-patch+yaml``: server-side apply, simplified (see :func:`apply_patch`).

Every function returns a new object: inputs are never mutated, and the result shares no
mutable structure with them. Results are deterministic. Failures raise :class:`PatchError`,
never a library's exception, so the API server can turn them into a ``Status``.

How the strategic merge knows which lists to merge
--------------------------------------------------
Kubernetes reads ``patchStrategy``/``patchMergeKey`` tags from its Go structs. Here a small
schema mirrors those tags: ``_STRUCTS`` maps a struct name to the fields that carry a merge
tag, and to the struct of fields we need to descend into. Each built-in kind names its root
struct in ``_KIND_ROOTS``. Walking the patch alongside that schema resolves the context of a
field, so ``containers`` is merged by ``name`` both at ``spec.containers`` of a Pod and at
``spec.template.spec.containers`` of a Deployment, ReplicaSet, StatefulSet, DaemonSet or Job,
while container ``ports`` merge by ``containerPort`` and Service ``ports`` by ``port``.
Fields the schema does not mention behave as Kubernetes does for untagged fields: objects
merge key by key, lists are replaced whole. Only tags that change merging are listed; the
``retainKeys`` strategy needs no entry because the server honours a ``$retainKeys``
directive wherever a patch carries one.

Kinds without a schema (custom resources such as PyTorchJob or ClusterQueue) get JSON merge
patch semantics. Kubernetes itself refuses a strategic merge patch for a custom resource
(415), and kubectl therefore sends merge patches for them; accepting and downgrading is the
friendlier answer for other clients.

Deliberate differences from apimachinery's ``strategicpatch``
-------------------------------------------------------------
- Directives are processed in values that are new to the object too (Kubernetes copies such
  values verbatim and relies on decoding into Go structs to drop stray ``$`` keys; these
  objects are stored as JSON, so nothing would drop them).
- ``$patch: merge`` is accepted as an explicit no-op, in maps and list items (Kubernetes
  rejects it in maps and in lists).
- ``$deleteFromPrimitiveList/<field>`` is applied after the other keys of its map, so a patch
  that both adds and deletes the same value has a defined result (Go's map order decides in
  Kubernetes), and it is honoured on any list.
- ``$setElementOrder`` is not cross-checked against the patch list; an item the order list
  omits is placed after those it names.

Layout: `common` (content types, errors, JSON helpers), `json_patches` (JSON merge patch and
JSON patch), `strategic` (strategic merge patch and its schema); this module decodes request
bodies and dispatches on the content type.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import yaml

from gpufleet.apiserver.patch.common import (
    APPLY_PATCH,
    JSON_PATCH,
    MAX_JSON_PATCH_OPERATIONS,
    MERGE_PATCH,
    PATCH_CONTENT_TYPES,
    STRATEGIC_MERGE_PATCH,
    PatchError,
    UnsupportedPatchType,
    _depth_guard,
)
from gpufleet.apiserver.patch.json_patches import create_merge_patch, json_merge_patch, json_patch
from gpufleet.apiserver.patch.strategic import (
    _KIND_ROOTS,
    _STRUCTS,
    _Field,
    strategic_merge_patch,
    supports_strategic_merge,
)

__all__ = [
    "APPLY_PATCH",
    "JSON_PATCH",
    "MAX_JSON_PATCH_OPERATIONS",
    "MAX_YAML_NODES",
    "MERGE_PATCH",
    "PATCH_CONTENT_TYPES",
    "STRATEGIC_MERGE_PATCH",
    "PatchError",
    "UnsupportedPatchType",
    "_KIND_ROOTS",
    "_STRUCTS",
    "_Field",
    "apply_patch",
    "create_merge_patch",
    "decode_json",
    "decode_yaml",
    "json_merge_patch",
    "json_patch",
    "strategic_merge_patch",
    "supports_strategic_merge",
]

# Bounds what a YAML body full of aliases may expand to (a "billion laughs" document).
MAX_YAML_NODES = 1_000_000


# --------------------------------------------------------------------------- request bodies


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"number {text} is out of range")
    return number


def _body_text(body: bytes | bytearray | memoryview | str) -> str:
    if isinstance(body, str):
        return body
    if isinstance(body, bytes | bytearray | memoryview):
        try:
            return bytes(body).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PatchError(f"the patch body is not UTF-8: {exc}", status_code=400) from None
    raise PatchError(f"the patch body must be bytes, not {type(body).__name__}", status_code=400)


# A \uXXXX escape naming half of a UTF-16 surrogate pair.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _encodable(text: str) -> str:
    """``text`` if UTF-8 can hold it. JSON and YAML escapes can name half of a surrogate pair
    (``"\\ud800"``); such a string can be neither stored nor echoed back in a response."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PatchError(
            f"the patch body holds a string with an unpaired surrogate: {ascii(text[:64])}", status_code=400
        ) from None
    return text


def _check_strings(document: Any) -> None:
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            _encodable(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                _encodable(key)
                stack.append(item)
        elif isinstance(value, list):
            stack.extend(value)


def _decode_json(body: bytes | bytearray | memoryview | str) -> Any:
    text = _body_text(body)
    try:
        document = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as exc:
        raise PatchError(f"the patch body is not valid JSON: {exc}", status_code=400) from None
    if _SURROGATE_ESCAPE.search(text):
        _check_strings(document)
    return document


_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


class _ApplyYamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Safe YAML without implicit timestamps: like Kubernetes' YAML-to-JSON conversion,
    an unquoted ``2024-01-01`` stays a string instead of becoming a date."""


_ApplyYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _yaml_key(key: Any) -> str:
    if isinstance(key, str):
        return _encodable(key)
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    if isinstance(key, int | float):
        return str(key)
    if isinstance(key, datetime.date):
        return key.isoformat()
    raise PatchError(f"the YAML body has a key that is not a string: {key!r}", status_code=400)


def _yaml_to_json(value: Any, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise PatchError(f"the YAML body expands to more than {MAX_YAML_NODES} values", status_code=400)
    if isinstance(value, dict):
        return {_yaml_key(k): _yaml_to_json(v, budget) for k, v in value.items()}
    if isinstance(value, list):
        return [_yaml_to_json(v, budget) for v in value]
    if isinstance(value, str):
        return _encodable(value)
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PatchError(f"the YAML body holds {value}, which JSON cannot represent", status_code=400)
        return value
    if isinstance(value, datetime.date):
        return value.isoformat()
    raise PatchError(
        f"the YAML body holds a {type(value).__name__}, which JSON cannot represent", status_code=400
    )


def _decode_yaml(body: bytes | bytearray | memoryview | str) -> Any:
    text = _body_text(body)
    try:
        # A SafeLoader subclass: YAML tags cannot construct arbitrary Python objects.
        document = yaml.load(text, Loader=_ApplyYamlLoader)
    except Exception as exc:  # the YAML library raises several types for malformed input
        raise PatchError(f"the apply body is not valid YAML or JSON: {exc}", status_code=400) from None
    try:
        return _yaml_to_json(document, [MAX_YAML_NODES])
    except RecursionError:
        # A YAML alias can make a structure contain itself; JSON cannot express that.
        raise PatchError("the YAML body is nested too deeply or refers to itself", status_code=400) from None


def _require_object(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PatchError(f"{what} must be a JSON object, got {type(value).__name__}", status_code=400)
    return value


def apply_patch(target: Mapping[str, Any], body: bytes | str, content_type: str, kind: str) -> dict[str, Any]:
    """Apply a PATCH request body to ``target`` (``{}`` when server-side apply creates).

    ``content_type`` may carry parameters (``; charset=utf-8``). For
    ``application/apply-patch+yaml`` the body (YAML or JSON) is the full configuration the
    client wants; it is applied as a strategic merge patch onto the live object. That is a
    simplification of server-side apply: field ownership (``managedFields``) is not tracked,
    so fields the configuration no longer mentions are kept rather than removed, and there
    are no conflicts between managers.
    """
    if not isinstance(target, Mapping):
        raise PatchError("the object to patch must be a JSON object")
    media_type = content_type.split(";", 1)[0].strip().lower() if isinstance(content_type, str) else ""
    with _depth_guard():
        if media_type == JSON_PATCH:
            result = json_patch(target, _decode_json(body))
            if not isinstance(result, dict):
                raise PatchError("the JSON patch must leave a JSON object")
            return result
        if media_type == MERGE_PATCH:
            return json_merge_patch(target, _require_object(_decode_json(body), "a merge patch"))
        if media_type == STRATEGIC_MERGE_PATCH:
            patch = _require_object(_decode_json(body), "a strategic merge patch")
            return strategic_merge_patch(target, patch, kind)
        if media_type == APPLY_PATCH:
            config = _require_object(_decode_yaml(body), "an apply configuration")
            return strategic_merge_patch(target, config, kind)
    raise UnsupportedPatchType(
        f"the patch content type {content_type!r} is not supported; use one of: "
        + ", ".join(PATCH_CONTENT_TYPES)
    )


# The bounded, surrogate-safe decoders, for request bodies other than patches too.
decode_json = _decode_json
decode_yaml = _decode_yaml
