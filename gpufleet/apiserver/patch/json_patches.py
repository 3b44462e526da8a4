"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonpatch
import jsonpointer

from gpufleet.apiserver.patch.common import (
    MAX_JSON_PATCH_OPERATIONS,
    PatchError,
    _depth_guard,
    copy_json,
    json_equal,
)

# --------------------------------------------------------------------------- JSON merge patch


def _merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy_json(patch)
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
        return _merge_patch(copy_json(target), patch)


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
            patch[key] = copy_json(new)
            continue
        old = original[key]
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            nested = _diff(old, new)
            if nested:
                patch[key] = nested
        elif not json_equal(old, new):
            patch[key] = copy_json(new)
    return patch


# --------------------------------------------------------------------------- JSON patch


def _as_kubernetes_applies(document: Any, op: Mapping[str, Any]) -> dict[str, Any]:
    """The operation as Kubernetes applies it (evanphx/json-patch v4): a ``replace`` of a key
    an object does not have sets it, as ``add`` would (Ray's autoscaler replaces
    ``/spec/workerGroupSpecs/0/scaleStrategy`` on groups that never had one). Everything
    else is RFC 6902's."""
    out = copy_json(op)
    path = out.get("path")
    if out.get("op") != "replace" or not isinstance(path, str) or not path.startswith("/"):
        return out
    try:
        pointer = jsonpointer.JsonPointer(path)
        parent = jsonpointer.JsonPointer.from_parts(pointer.parts[:-1]).resolve(document)
    except (jsonpointer.JsonPointerException, KeyError, IndexError, TypeError):
        return out
    if isinstance(parent, dict) and pointer.parts and pointer.parts[-1] not in parent:
        out["op"] = "add"
    return out


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
        document = copy_json(target)
    for index, op in enumerate(ops):
        if not isinstance(op, Mapping):
            raise PatchError(f"JSON patch operation {index} must be an object with 'op' and 'path'", status_code=400)
        # Operations are applied one at a time so that an error can name the one that failed.
        # The operation is copied so the values it adds are not shared with the caller's list.
        try:
            document = jsonpatch.apply_patch(document, [_as_kubernetes_applies(document, op)], in_place=True)
        except jsonpatch.JsonPatchTestFailed as exc:
            raise PatchError(f"JSON patch operation {index} ({_describe_op(op)}) failed: {exc}") from None
        except Exception as exc:  # the library reports bad operations with assorted exception types
            reason = str(exc) or type(exc).__name__
            raise PatchError(
                f"JSON patch operation {index} ({_describe_op(op)}) is invalid: {reason}"
            ) from None
    return document
