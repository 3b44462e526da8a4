"""Kubernetes' strategic merge patch and the schema of merge keys it walks (see the package
docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.apiserver.patch.common import (
    _DELETE_PRIMITIVES,
    _DIRECTIVE,
    _RETAIN_KEYS,
    _SET_ORDER,
    PatchError,
    _at,
    _canon,
    _depth_guard,
    _join,
    copy_json,
)
from gpufleet.apiserver.patch.json_patches import json_merge_patch

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
        return copy_json(value)
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
        return _merge_map(copy_json(target), patch, root, "")
