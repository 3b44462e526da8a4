"""Field-manager vocabulary: field paths, limits, errors, and the rules for manager names.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import ParamSpec, TypeVar

# The strategic-merge schema: the same merge keys decide how lists are owned.

FieldPath = tuple[str, ...]
FieldSet = frozenset[FieldPath]

LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"
BEFORE_FIRST_APPLY_MANAGER = "before-first-apply"
ANCIENT_CHANGES_MANAGER = "ancient-changes"
MAX_UPDATE_MANAGERS = 10
# Deeper than any real object; keeps client-sent fieldsV1 within what the models serialize.
MAX_FIELD_PATH_DEPTH = 100
FIELD_MANAGER_MAX_BYTES = 128

APPLY = "Apply"
UPDATE = "Update"
FIELDS_V1 = "FieldsV1"
# kubectl's own server-side apply manager: the only one allowed to take over fields that
# its client-side apply recorded (how users migrate from client-side to server-side apply).
_KUBECTL = "kubectl"


class ManagedFieldsError(ValueError):
    """A request the field manager refuses (the API server answers 400 BadRequest)."""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _bounded(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Turn the recursion limit, which a deeply nested body can reach, into a 400."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except RecursionError:
            raise ManagedFieldsError("the object or its managedFields are nested too deeply") from None

    return wrapper


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


# --------------------------------------------------------------------------- field manager names


@functools.lru_cache(maxsize=512)  # a cluster's clients send a few user agents, again and again
def manager_from_user_agent(user_agent: str | None) -> str:
    """The manager Kubernetes records when a write names no ``fieldManager``: the user
    agent up to its first ``/`` (``kubectl/v1.32.0 (linux/amd64)`` -> ``kubectl``,
    ``OpenAPI-Generator/31.0.0/python`` -> ``OpenAPI-Generator``), printable characters
    only, at most 128 bytes."""
    prefix = (user_agent or "").split("/", 1)[0]
    out: list[str] = []
    size = 0
    for ch in prefix:
        if not ch.isprintable():
            continue
        width = len(ch.encode("utf-8", "surrogatepass"))
        if size + width > FIELD_MANAGER_MAX_BYTES:
            break
        out.append(ch)
        size += width
    return "".join(out)


def field_manager_errors(manager: str, *, apply: bool) -> list[dict[str, str]]:
    """Status causes for an invalid ``fieldManager`` query parameter (422 Invalid, kind
    ``PatchOptions``/``CreateOptions``/``UpdateOptions`` of group ``meta.k8s.io``, name "")."""
    causes: list[dict[str, str]] = []
    if apply and not manager:
        causes.append(
            {
                "reason": "FieldValueRequired",
                "message": "Required value: is required for apply patch",
                "field": "fieldManager",
            }
        )
    if len(manager.encode("utf-8", "surrogatepass")) > FIELD_MANAGER_MAX_BYTES:
        causes.append(
            {
                "reason": "FieldValueTooLong",
                "message": f"Too long: may not be more than {FIELD_MANAGER_MAX_BYTES} bytes",
                "field": "fieldManager",
            }
        )
    offset = 0
    for ch in manager:
        if not ch.isprintable():
            causes.append(
                {
                    "reason": "FieldValueInvalid",
                    "message": f"Invalid value: {_quote(manager)}: invalid character U+{ord(ch):04X} (at position {offset})",
                    "field": "fieldManager",
                }
            )
        offset += len(ch.encode("utf-8", "surrogatepass"))
    return causes
