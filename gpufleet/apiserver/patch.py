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
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jsonpatch
import yaml

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_CONTENT_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH)

# The limit kube-apiserver puts on one JSON patch, so a request cannot make it loop forever.
MAX_JSON_PATCH_OPERATIONS = 10_000
# Bounds what a YAML body full of aliases may expand to (a "billion laughs" document).
MAX_YAML_NODES = 1_000_000

_DIRECTIVE = "$patch"
_RETAIN_KEYS = "$retainKeys"
_SET_ORDER = "$setElementOrder/"
_DELETE_PRIMITIVES = "$deleteFromPrimitiveList/"


class PatchError(ValueError):
    """A patch that cannot be applied. ``status_code`` is what the API server should answer:
    400 for a body that cannot be decoded, 415 for an unknown patch type, 422 otherwise."""

    def __init__(self, message: str, status_code: int = 422) -> None:
        super().__init__(message)
        self.status_code = status_code


class UnsupportedPatchType(PatchError):
    def __init__(self, message: str) -> None:
        super().__init__(message, status_code=415)


# --------------------------------------------------------------------------- JSON helpers


def _copy_json(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_json(v) for v in value]
    return value


def _canon(value: Any) -> Hashable:
    """A hashable identity with JSON equality: 1 == 1.0, but true is neither 1 nor "true"."""
    if value is None:
        return ("null",)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    return ("json", json.dumps(value, sort_keys=True, default=repr))


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping | list) or isinstance(b, Mapping | list):
        return False
    return _canon(a) == _canon(b)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _at(path: str) -> str:
    return f"{path}: " if path else ""


@contextmanager
def _depth_guard() -> Iterator[None]:
    try:
        yield
    except RecursionError:
        raise PatchError("the patch or the object is nested too deeply") from None


# --------------------------------------------------------------------------- JSON merge patch


def _merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return _copy_json(patch)
    result = target if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` removes a key, anything else replaces."""
    with _depth_guard():
        return _merge_patch(_copy_json(target), patch)


def create_merge_patch(original: Mapping[str, Any], modified: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 patch that turns ``original`` into ``modified`` (empty when they are equal).

    A merge patch cannot set a key to ``null``: an object in ``modified`` holding null values
    comes out without those keys.
    """
    if not isinstance(original, Mapping) or not isinstance(modified, Mapping):
        raise PatchError("a merge patch can only be computed between two JSON objects")
    with _depth_guard():
        return _diff(original, modified)


def _diff(original: Mapping[str, Any], modified: Mapping[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {key: None for key in original if key not in modified}
    for key, new in modified.items():
        if key not in original:
            patch[key] = _copy_json(new)
            continue
        old = original[key]
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            nested = _diff(old, new)
            if nested:
                patch[key] = nested
        elif not _json_equal(old, new):
            patch[key] = _copy_json(new)
    return patch


# --------------------------------------------------------------------------- JSON patch


def _describe_op(op: Mapping[str, Any]) -> str:
    return f"{op.get('op')!r} at {op.get('path')!r}"


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902: apply ``ops`` (test/add/remove/replace/move/copy) in order, all or nothing."""
    if not isinstance(ops, list):
        raise PatchError('a JSON patch must be a list of operations, e.g. [{"op": "add", ...}]', status_code=400)
    if len(ops) > MAX_JSON_PATCH_OPERATIONS:
        raise PatchError(
            f"the JSON patch has {len(ops)} operations; at most {MAX_JSON_PATCH_OPERATIONS} are allowed"
        )
    with _depth_guard():
        document = _copy_json(target)
    for index, op in enumerate(ops):
        if not isinstance(op, Mapping):
            raise PatchError(f"JSON patch operation {index} must be an object with 'op' and 'path'", status_code=400)
        # Operations are applied one at a time so that an error can name the one that failed.
        # The operation is copied so the values it adds are not shared with the caller's list.
        try:
            document = jsonpatch.apply_patch(document, [_copy_json(op)], in_place=True)
        except jsonpatch.JsonPatchTestFailed as exc:
            raise PatchError(f"JSON patch operation {index} ({_describe_op(op)}) failed: {exc}") from None
        except Exception as exc:  # the library reports bad operations with assorted exception types
            reason = str(exc) or type(exc).__name__
            raise PatchError(
                f"JSON patch operation {index} ({_describe_op(op)}) is invalid: {reason}"
            ) from None
    return document


# --------------------------------------------------------------------------- strategic merge patch


@dataclass(frozen=True, slots=True)
class _Field:
    merge_key: str | None = None  # a list of objects merged item by item on this key
    merge_set: bool = False  # a list of scalars merged as a set
    struct: str | None = None  # schema of the value, or of each list item

    @property
    def merges_list(self) -> bool:
        return self.merge_key is not None or self.merge_set


def _keyed(key: str, struct: str | None = None) -> _Field:
    return _Field(merge_key=key, struct=struct)


def _nested(struct: str) -> _Field:
    return _Field(struct=struct)


_SET = _Field(merge_set=True)
_META = _nested("ObjectMeta")

# The patchStrategy:"merge" tags of k8s.io/api (core/v1, apps/v1, batch/v1, autoscaling/v2,
# policy/v1) and of ObjectMeta, for the kinds this project serves.
_STRUCTS: dict[str, dict[str, _Field]] = {
    "ObjectMeta": {"finalizers": _SET, "ownerReferences": _keyed("uid")},
    "PodTemplateSpec": {"metadata": _META, "spec": _nested("PodSpec")},
    "PodSpec": {
        "containers": _keyed("name", "Container"),
        "initContainers": _keyed("name", "Container"),
        "ephemeralContainers": _keyed("name", "Container"),
        "volumes": _keyed("name"),
        "imagePullSecrets": _keyed("name"),
        "hostAliases": _keyed("ip"),
        "topologySpreadConstraints": _keyed("topologyKey"),
        "resourceClaims": _keyed("name"),
        "schedulingGates": _keyed("name"),
        # tolerations, readinessGates, overhead: no tag, replaced whole.
    },
    "Container": {
        "ports": _keyed("containerPort"),
        "env": _keyed("name"),
        "volumeMounts": _keyed("mountPath"),
        "volumeDevices": _keyed("devicePath"),
        # envFrom, args, command, resizePolicy, resources.claims: no tag, replaced whole.
    },
    "PodStatus": {
        "conditions": _keyed("type"),
        "podIPs": _keyed("ip"),
        "hostIPs": _keyed("ip"),
        "resourceClaimStatuses": _keyed("name"),
    },
    "ConditionsStatus": {"conditions": _keyed("type")},
    "TemplatedSpec": {"template": _nested("PodTemplateSpec")},
    "JobTemplateSpec": {"metadata": _META, "spec": _nested("TemplatedSpec")},
    "CronJobSpec": {"jobTemplate": _nested("JobTemplateSpec")},
    "NodeSpec": {"podCIDRs": _SET},  # taints carry no tag: replaced whole
    "NodeStatus": {"conditions": _keyed("type"), "addresses": _keyed("type")},
    "ServiceSpec": {"ports": _keyed("port")},
    # Roots of the kinds, one per shape.
    "Pod": {"metadata": _META, "spec": _nested("PodSpec"), "status": _nested("PodStatus")},
    "PodTemplate": {"metadata": _META, "template": _nested("PodTemplateSpec")},
    "Workload": {"metadata": _META, "spec": _nested("TemplatedSpec"), "status": _nested("ConditionsStatus")},
    "CronJob": {"metadata": _META, "spec": _nested("CronJobSpec")},
    "Node": {"metadata": _META, "spec": _nested("NodeSpec"), "status": _nested("NodeStatus")},
    "Service": {"metadata": _META, "spec": _nested("ServiceSpec"), "status": _nested("ConditionsStatus")},
    "WithConditions": {"metadata": _META, "status": _nested("ConditionsStatus")},
    "ServiceAccount": {"metadata": _META, "secrets": _keyed("name")},
    "MetadataOnly": {"metadata": _META},
}

_KIND_ROOTS: dict[str, str] = {
    "Pod": "Pod",
    "PodTemplate": "PodTemplate",
    "Deployment": "Workload",
    "ReplicaSet": "Workload",
    "StatefulSet": "Workload",
    "DaemonSet": "Workload",
    "ReplicationController": "Workload",
    "Job": "Workload",
    "CronJob": "CronJob",
    "Node": "Node",
    "Service": "Service",
    "Namespace": "WithConditions",
    "HorizontalPodAutoscaler": "WithConditions",
    "PodDisruptionBudget": "WithConditions",
    "PersistentVolumeClaim": "WithConditions",
    "ServiceAccount": "ServiceAccount",
    **{
        kind: "MetadataOnly"
        for kind in (
            "ConfigMap",
            "Secret",
            "Endpoints",
            "EndpointSlice",
            "Event",
            "ResourceQuota",
            "LimitRange",
            "PriorityClass",
            "Lease",
            "PersistentVolume",
            "Binding",
            "Scale",
        )
    },
}

_NO_FIELDS: dict[str, _Field] = {}


def supports_strategic_merge(kind: str) -> bool:
    """Whether ``kind`` is a built-in kind with a strategic merge schema (else merge patch)."""
    return kind in _KIND_ROOTS


def _item_key(merge_key: str) -> Callable[[Any], Hashable]:
    def key(item: Any) -> Hashable:
        if isinstance(item, Mapping) and merge_key in item:
            return _canon(item[merge_key])
        # A live item without its merge key matches no patch item, but must keep its place:
        # the merged list holds the very same object as the live list, so its identity works.
        return ("unmatched", id(item))

    return key


def _positions(items: list[Any], key: Callable[[Any], Hashable]) -> dict[Hashable, int]:
    positions: dict[Hashable, int] = {}
    for index, item in enumerate(items):
        positions.setdefault(key(item), index)
    return positions


def _normalize_order(
    merged: list[Any], order: list[Any], server: list[Any], key: Callable[[Any], Hashable]
) -> list[Any]:
    """Kubernetes' element order after a merge: items named by ``order`` (the patch list or
    ``$setElementOrder``) keep that relative order, the other (server-only) items keep their
    live order, and the two runs are interleaved by live position. An item new to the live
    list is placed before the server-only items still pending, which is why a container
    added without ``$setElementOrder`` lands first.
    """
    order_at = _positions(order, key)
    server_at = _positions(server, key)
    keys = [key(item) for item in merged]
    from_patch = sorted((i for i, k in enumerate(keys) if k in order_at), key=lambda i: order_at[keys[i]])
    server_only = sorted(
        (i for i, k in enumerate(keys) if k not in order_at),
        key=lambda i: server_at.get(keys[i], len(server)),
    )
    result: list[Any] = []
    left = right = 0
    while left < len(server_only) and right < len(from_patch):
        live_left = server_at.get(keys[server_only[left]])
        live_right = server_at.get(keys[from_patch[right]])
        if live_left is not None and live_right is not None and live_left < live_right:
            result.append(merged[server_only[left]])
            left += 1
        else:
            result.append(merged[from_patch[right]])
            right += 1
    result.extend(merged[i] for i in server_only[left:])
    result.extend(merged[i] for i in from_patch[right:])
    return result


def _merge_scalar_set(original: list[Any], patch: list[Any], path: str) -> list[Any]:
    for item in (*original, *patch):
        if isinstance(item, Mapping | list):
            raise PatchError(f"{_at(path)}this list merges as a set of scalars and cannot hold {item!r}")
    seen: set[Hashable] = set()
    merged: list[Any] = []
    for item in (*original, *patch):
        identity = _canon(item)
        if identity not in seen:
            seen.add(identity)
            merged.append(item)
    return _normalize_order(merged, patch, original, _canon)


def _merge_keyed_list(original: list[Any], patch: list[Any], field: _Field, path: str) -> list[Any]:
    merge_key = field.merge_key
    assert merge_key is not None
    for item in original:
        if not isinstance(item, dict):
            raise PatchError(f"{_at(path)}the live list holds {item!r}, not an object with {merge_key!r}")
    plain: list[Mapping[str, Any]] = []
    replace = False
    for item in patch:
        if not isinstance(item, Mapping):
            raise PatchError(
                f"{_at(path)}list items must be objects with the merge key {merge_key!r}, got {item!r}"
            )
        if _DIRECTIVE not in item:
            if merge_key not in item:
                raise PatchError(f"{_at(path)}{item!r} does not contain declared merge key {merge_key!r}")
            plain.append(item)
            continue
        directive = item[_DIRECTIVE]
        if directive == "delete":
            if merge_key not in item:
                raise PatchError(f"{_at(path)}$patch: delete needs the merge key {merge_key!r}: {item!r}")
            doomed = _canon(item[merge_key])
            original = [o for o in original if not (merge_key in o and _canon(o[merge_key]) == doomed)]
        elif directive == "replace":
            # The remaining items become the whole list (the directive item itself is dropped).
            replace = True
        elif directive == "merge":
            rest = {k: v for k, v in item.items() if k != _DIRECTIVE}
            if rest:
                if merge_key not in rest:
                    raise PatchError(f"{_at(path)}{item!r} does not contain declared merge key {merge_key!r}")
                plain.append(rest)
        else:
            raise PatchError(
                f"{_at(path)}unknown $patch directive {directive!r} in a list item (expected delete or replace)"
            )
    merged: list[Any] = [] if replace else list(original)
    index = _positions(merged, _item_key(merge_key))
    for item in plain:
        identity = _canon(item[merge_key])
        item_path = f"{path}[{merge_key}={item[merge_key]!r}]"
        at = index.get(identity)
        if at is None:
            index[identity] = len(merged)
            merged.append(_merge_map({}, item, field.struct, item_path))
        else:
            merged[at] = _merge_map(merged[at], item, field.struct, item_path)
    if replace:
        return merged
    return _normalize_order(merged, plain, original, _item_key(merge_key))


def _merge_list(original: list[Any], patch: list[Any], field: _Field, path: str) -> list[Any]:
    if not original and not patch:
        return []
    if field.merge_set:
        return _merge_scalar_set(original, patch, path)
    return _merge_keyed_list(original, patch, field, path)


def _merge_value(current: Any, value: Any, field: _Field | None, path: str) -> Any:
    if isinstance(value, Mapping):
        base = current if isinstance(current, dict) else {}
        return _merge_map(base, value, field.struct if field else None, path)
    if isinstance(value, list):
        if field is not None and field.merges_list:
            return _merge_list(current if isinstance(current, list) else [], value, field, path)
        return _copy_json(value)
    return value


def _apply_retain_keys(original: dict[str, Any], patch: Mapping[str, Any], path: str) -> None:
    keys = patch[_RETAIN_KEYS]
    if not isinstance(keys, list):
        raise PatchError(f"{_at(path)}$retainKeys must be a list of field names")
    keep = {k for k in keys if isinstance(k, str)}
    for key, value in patch.items():
        if (
            value is None
            or key in (_RETAIN_KEYS, _DIRECTIVE)
            or key.startswith((_SET_ORDER, _DELETE_PRIMITIVES))
        ):
            continue
        if key not in keep:
            raise PatchError(f"{_at(path)}the patch sets {key!r}, which its $retainKeys list {keys!r} omits")
    for key in [k for k in original if k not in keep]:
        del original[key]


def _apply_element_order(
    original: dict[str, Any], patch: Mapping[str, Any], name: str, order: Any, field: _Field | None, path: str
) -> bool:
    """Merge the list ``name`` and put it in the ``$setElementOrder`` order. Returns whether
    the patch's own value for ``name`` was consumed."""
    if not name:
        raise PatchError(f"{_at(path)}{_SET_ORDER} needs a field name after the '/'")
    if not isinstance(order, list):
        raise PatchError(f"{_at(path)}{_SET_ORDER}{name} must be a list")
    if field is None or not field.merges_list or patch.get(name, ()) is None:
        # A replaced list carries its own order; a null deletes the list anyway.
        return False
    value = patch.get(name)
    if value is not None and not isinstance(value, list):
        raise PatchError(f"{_at(_join(path, name))}expected a list, got {value!r}")
    current = original.get(name)
    live = current if isinstance(current, list) else None
    if live is None and value is None:
        return False
    merged = _merge_list(live or [], value or [], field, _join(path, name))
    if field.merge_key is not None:
        for entry in order:
            if not isinstance(entry, Mapping) or field.merge_key not in entry:
                raise PatchError(
                    f"{_at(path)}{_SET_ORDER}{name} entries must be objects with {field.merge_key!r}, got {entry!r}"
                )
        key = _item_key(field.merge_key)
    else:
        key = _canon
    original[name] = _normalize_order(merged, order, live or [], key)
    return True


def _merge_map(
    original: dict[str, Any], patch: Mapping[str, Any], struct: str | None, path: str
) -> dict[str, Any]:
    """Apply ``patch`` to ``original``, which the caller owns and which is updated in place;
    ``patch`` is only read."""
    if _DIRECTIVE in patch:
        directive = patch[_DIRECTIVE]
        rest = {k: v for k, v in patch.items() if k != _DIRECTIVE}
        if directive == "replace":
            return _merge_map({}, rest, struct, path)
        if directive == "delete":
            return {}
        if directive != "merge":
            raise PatchError(
                f"{_at(path)}unknown $patch directive {directive!r} (expected replace, delete or merge)"
            )
        patch = rest
    fields = _STRUCTS.get(struct, _NO_FIELDS) if struct else _NO_FIELDS
    if _RETAIN_KEYS in patch:
        _apply_retain_keys(original, patch, path)
    consumed: set[str] = {_RETAIN_KEYS}
    for key, order in patch.items():
        if key.startswith(_SET_ORDER):
            consumed.add(key)
            name = key[len(_SET_ORDER) :]
            if _apply_element_order(original, patch, name, order, fields.get(name), path):
                consumed.add(name)
    deletions: list[tuple[str, Any]] = []
    for key, value in patch.items():
        if key in consumed:
            continue
        if key.startswith(_DELETE_PRIMITIVES):
            deletions.append((key[len(_DELETE_PRIMITIVES) :], value))
        elif value is None:
            original.pop(key, None)
        else:
            original[key] = _merge_value(original.get(key), value, fields.get(key), _join(path, key))
    for name, values in deletions:
        if not name or not isinstance(values, list):
            raise PatchError(f"{_at(path)}{_DELETE_PRIMITIVES}<field> must name a field and hold a list")
        current = original.get(name)
        if isinstance(current, list):
            doomed = {_canon(v) for v in values}
            original[name] = [item for item in current if _canon(item) not in doomed]
    return original


def strategic_merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """Kubernetes strategic merge patch of an object of ``kind`` (see the module notes).

    Honours ``$patch: replace|delete|merge`` in objects and list items,
    ``$setElementOrder/<list>``, ``$retainKeys``, ``$deleteFromPrimitiveList/<list>`` and
    ``null`` as delete. Kinds without a schema get :func:`json_merge_patch`.
    """
    if not isinstance(target, Mapping):
        raise PatchError("the object to patch must be a JSON object")
    if not isinstance(patch, Mapping):
        raise PatchError("a strategic merge patch must be a JSON object")
    root = _KIND_ROOTS.get(kind)
    with _depth_guard():
        if root is None:
            return json_merge_patch(target, patch)
        return _merge_map(_copy_json(target), patch, root, "")


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
