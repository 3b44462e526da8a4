"""Reading the few metadata fields the client layer needs from either shape of object.

Callers hand the client typed models (gpufleet.api.k8s, snake_case attributes) or plain
wire dicts (camelCase keys); the informer, the queue helpers and the event recorder must
work with both without converting every object.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_ABSENT = object()


@functools.lru_cache(maxsize=4096)
def _snake(name: str) -> str:
    # Field names are a small fixed set (the API's), read millions of times by a busy
    # controller: each is converted once.
    return _CAMEL.sub("_", name).lower()


def field(obj: Any, name: str, default: Any = None) -> Any:
    """``obj[name]`` for a dict, else the model attribute (snake_case of the wire name)."""
    if obj is None:
        return default
    if isinstance(obj, dict):
        value = obj.get(name, default)
    else:
        snake = _snake(name)
        value = getattr(obj, snake, _ABSENT)
        if value is _ABSENT:
            # Not a field of the model: the wire name, for objects that keep it (an absent
            # attribute of a pydantic model is a slow miss, so this is only tried then).
            value = getattr(obj, name, default) if snake != name else default
    return default if value is None else value


def meta(obj: Any, name: str, default: Any = None) -> Any:
    return field(field(obj, "metadata"), name, default)


def name_of(obj: Any) -> str:
    return meta(obj, "name", "") or ""


def namespace_of(obj: Any) -> str:
    return meta(obj, "namespace", "") or ""


def resource_version_of(obj: Any) -> str:
    return meta(obj, "resourceVersion", "") or ""


def uid_of(obj: Any) -> str:
    return meta(obj, "uid", "") or ""


def labels_of(obj: Any) -> dict[str, str]:
    return dict(meta(obj, "labels", {}) or {})


def object_key(obj: Any) -> str:
    """'namespace/name', or 'name' for cluster-scoped objects (client-go's MetaNamespaceKeyFunc)."""
    ns, name = namespace_of(obj), name_of(obj)
    return f"{ns}/{name}" if ns else name


def split_key(key: str) -> tuple[str, str]:
    """The inverse of object_key: ('', name) for a cluster-scoped key."""
    ns, sep, name = key.partition("/")
    return (ns, name) if sep else ("", ns)


def to_dict(obj: Any) -> dict[str, Any]:
    """The wire form of an object; a dict is deep-copied so the caller's stays untouched."""
    if isinstance(obj, dict):
        return copy.deepcopy(obj)
    to_dict_ = getattr(obj, "to_dict", None)
    if callable(to_dict_):
        return to_dict_()
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(by_alias=True, exclude_none=True, mode="json")
    raise TypeError(f"cannot send a {type(obj).__name__}: expected a dict or a K8sModel")


def controller_ref(obj: Any) -> Any | None:
    """The ownerReference with controller=true, if any (at most one is allowed)."""
    for ref in meta(obj, "ownerReferences", []) or []:
        if field(ref, "controller", False):
            return ref
    return None
