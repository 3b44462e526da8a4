"""Query parameters decoded as kube-apiserver decodes its ListOptions and write options.

kube-apiserver parses integer options with Go's strconv.ParseInt (base 10, 64 bits): ``nan``,
``inf``, ``1.5`` and ``1e3`` are not integers, and a value past int64 is out of range; either
is a 400 BadRequest Status. The write options (``dryRun``, ``fieldValidation``,
``fieldManager``) are validated like its ValidateCreateOptions/UpdateOptions/PatchOptions:
a value outside the supported ones is a 422 Invalid Status of kind ``CreateOptions`` (etc.) in
group ``meta.k8s.io``, and the write is not made.
"""

from __future__ import annotations

import re
from typing import Any

from gpufleet.apiserver import managedfields
from gpufleet.apiserver.errors import ApiException, bad_request
from gpufleet.utils.http import RawRequest

_INT = re.compile(r"[+-]?[0-9]+\Z")
_INT64_MAX = 2**63 - 1

DRY_RUN_VALUES = ("All",)
FIELD_VALIDATION_VALUES = ("Ignore", "Warn", "Strict")

_OPTIONS_KIND = {"create": "CreateOptions", "update": "UpdateOptions", "patch": "PatchOptions",
                 "delete": "DeleteOptions", "deletecollection": "DeleteOptions"}


def _show(value: str) -> str:
    return '"' + value.encode("unicode_escape", "backslashreplace").decode("ascii").replace('"', '\\"') + '"'


def int64_param(req: RawRequest, name: str) -> int | None:
    """The parameter as a 64-bit integer (None when absent or empty), or a 400 naming it."""
    value = req.param(name)
    if value is None or value == "":
        return None
    if not _INT.match(value):
        raise bad_request(f"{name}: Invalid value: {_show(value)}: must be an integer "
                          f"(e.g. {name}=30)")
    n = int(value)
    if not -_INT64_MAX - 1 <= n <= _INT64_MAX:
        raise bad_request(f"{name}: Invalid value: {_show(value)}: out of range of a 64-bit integer")
    return n


def watch_timeout(req: RawRequest, default: float) -> float:
    """``timeoutSeconds`` of a watch: absent or 0 means the server's default; a negative one
    ends the watch at once, as in Kubernetes."""
    n = int64_param(req, "timeoutSeconds")
    if not n:
        return default
    return float(max(n, 0))


def _values(req: RawRequest, name: str) -> list[str]:
    return [v for k, v in req.query if k == name]


def write_options(req: RawRequest, verb: str) -> dict[str, Any]:
    """Validates the write options of a create/update/patch/delete; returns
    ``{"dry_run": bool}``. Raises 422 Invalid (kind CreateOptions, ...) listing each bad one."""
    causes: list[dict[str, str]] = []
    dry = _values(req, "dryRun")
    for v in dry:
        if v not in DRY_RUN_VALUES:
            causes.append({"reason": "FieldValueNotSupported", "field": "dryRun",
                           "message": f'Unsupported value: {_show(v)}: supported values: "All"'})
    if verb in ("create", "update", "patch"):
        fv = req.param("fieldValidation")
        if fv and fv.capitalize() not in FIELD_VALIDATION_VALUES:
            causes.append({"reason": "FieldValueNotSupported", "field": "fieldValidation",
                           "message": f'Unsupported value: {_show(fv)}: supported values: '
                                      '"Ignore", "Strict", "Warn"'})
        manager = req.param("fieldManager")
        if manager:
            causes += managedfields.field_manager_errors(manager, apply=False)
    if causes:
        kind = _OPTIONS_KIND.get(verb, "CreateOptions")
        parts = [f"{c['field']}: {c['message']}" for c in causes]
        msg = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
        raise ApiException(422, "Invalid", f'{kind}.meta.k8s.io "" is invalid: {msg}',
                           {"group": "meta.k8s.io", "kind": kind, "causes": causes})
    return {"dry_run": bool(dry)}
