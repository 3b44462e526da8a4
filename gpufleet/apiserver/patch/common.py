"""Patch content types, errors and the JSON helpers every patch flavour uses.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import orjson

from gpufleet.utils import jsoncodec

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_CONTENT_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH)

# The limit kube-apiserver puts on one JSON patch, so a request cannot make it loop forever.
MAX_JSON_PATCH_OPERATIONS = 10_000


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


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value. Through orjson (an object's managedFields are most of a
    Node, copied at each status heartbeat), by hand for what orjson would not give back as it
    was (jsoncodec.orjson_exact): mappings other than dicts, keys that are not strings,
    integers past 64 bits, NaN."""
    if isinstance(value, dict | list):
        text = jsoncodec.orjson_exact(value)
        if text is not None:
            return orjson.loads(text)
    return _copy_json(value)


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


def json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
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
