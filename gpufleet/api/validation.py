"""Kubernetes validation for the built-in kinds, reporting every problem at once.

``validate_create(obj)`` and ``validate_update(obj, old)`` return a list of
:class:`FieldError` (empty when the object is valid) and never stop at the first problem, so
a user fixing a manifest sees everything wrong with it in one round trip. Errors carry the
JSON path of the field (``spec.template.spec.containers[0].image``) and render with
:meth:`FieldError.message` exactly as Kubernetes' ``field.Error`` does, so messages, tests and
tooling written against a real cluster read the same here.

The rules follow ``pkg/apis/*/validation`` and apimachinery's name and label rules. The API
server applies defaults (:mod:`gpufleet.api.defaults`) before validating; values that
defaulting would fill in (``None`` here) are accepted, so the functions can also check a
manifest on the client side before it is sent. Where gpufleet deliberately differs from
Kubernetes the code says so.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from pydantic import BaseModel

from gpufleet.api import k8s
from gpufleet.api.quantity import parse_quantity

# --- errors -----------------------------------------------------------------------------

REQUIRED = "FieldValueRequired"
INVALID = "FieldValueInvalid"
NOT_SUPPORTED = "FieldValueNotSupported"
DUPLICATE = "FieldValueDuplicate"
FORBIDDEN = "FieldValueForbidden"
TOO_LONG = "FieldValueTooLong"
TYPE_INVALID = "FieldValueTypeInvalid"
NOT_FOUND = "FieldValueNotFound"

_TYPE_TEXT = {
    REQUIRED: "Required value",
    INVALID: "Invalid value",
    NOT_SUPPORTED: "Unsupported value",
    DUPLICATE: "Duplicate value",
    FORBIDDEN: "Forbidden",
    TOO_LONG: "Too long",
    TYPE_INVALID: "Invalid value",
    NOT_FOUND: "Not found",
}
# Kubernetes prints no value for these: the value is either absent or too big to echo.
_VALUELESS = {REQUIRED, FORBIDDEN, TOO_LONG}


class Unquoted(str):
    """A value Kubernetes prints through its String() method, without quotes.

    Quantities and int-or-strings print that way (``Invalid value: 25%``), plain strings are
    quoted (``Invalid value: "Web_1"``).
    """


@dataclass(frozen=True)
class FieldError:
    """One problem with one field, shaped like apimachinery's ``field.Error``."""

    type: str
    field: str
    bad_value: Any = ""
    detail: str = ""

    def body(self) -> str:
        """The message without the field path (Kubernetes' ``ErrorBody``, a StatusCause message)."""
        text = _TYPE_TEXT.get(self.type, self.type)
        if self.type not in _VALUELESS:
            text = f"{text}: {go_value(self.bad_value)}"
        if self.detail:
            text += f": {self.detail}"
        return text

    def message(self) -> str:
        return f"{self.field}: {self.body()}"

    def __str__(self) -> str:
        return self.message()

    def to_cause(self) -> dict[str, str]:
        """The ``status.details.causes[]`` entry of a 422 Invalid response."""
        return {"reason": self.type, "message": self.body(), "field": self.field}


def aggregate_message(errors: Iterable[FieldError]) -> str:
    """Kubernetes' aggregate text: one message alone, several as ``[a, b]``, duplicates dropped."""
    seen: list[str] = []
    for err in errors:
        msg = err.message()
        if msg not in seen:
            seen.append(msg)
    if len(seen) == 1:
        return seen[0]
    return "[" + ", ".join(seen) + "]"


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(REQUIRED, path, "", detail)


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(INVALID, path, value, detail)


def not_supported(path: str, value: Any, valid: Iterable[str]) -> FieldError:
    detail = ", ".join(_go_quote(v) for v in valid)
    return FieldError(NOT_SUPPORTED, path, value, f"supported values: {detail}" if detail else "")


def duplicate(path: str, value: Any, detail: str = "") -> FieldError:
    return FieldError(DUPLICATE, path, value, detail)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError(FORBIDDEN, path, "", detail)


def too_long(path: str, max_bytes: int) -> FieldError:
    return FieldError(TOO_LONG, path, "", f"must have at most {max_bytes} bytes")


def type_invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(TYPE_INVALID, path, value, detail)


def not_found(path: str, value: Any, detail: str = "") -> FieldError:
    return FieldError(NOT_FOUND, path, value, detail)


# --- rendering values the way Go's fmt does ---------------------------------------------

_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def _go_quote(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            cp = ord(ch)
            out.append(f"\\x{cp:02x}" if cp < 0x80 else f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}")
    out.append('"')
    return "".join(out)


def _go_number(v: int | float) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e21:
        return str(int(v))
    return str(v)


def go_value(v: Any) -> str:
    """Render a bad value as Kubernetes' error messages do (``%q`` strings, ``%v`` numbers)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Unquoted):
        return str(v)
    if isinstance(v, str):
        return _go_quote(v)
    if isinstance(v, int | float):
        return _go_number(v)
    if isinstance(v, datetime):
        utc = v.astimezone(UTC) if v.tzinfo is not None else v
        return utc.strftime("%Y-%m-%d %H:%M:%S +0000 UTC")
    if isinstance(v, BaseModel):
        # Kubernetes prints structs with Go syntax; JSON says the same to our readers.
        return json.dumps(v.model_dump(by_alias=True, exclude_none=True, mode="json"), separators=(",", ":"))
    if isinstance(v, Mapping) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        items = ", ".join(f"{_go_quote(k)}:{_go_quote(v[k])}" for k in sorted(v))
        return "map[string]string{" + items + "}"
    if isinstance(v, list | tuple) and all(isinstance(x, str) for x in v):
        return "[]string{" + ", ".join(_go_quote(x) for x in v) + "}"
    return json.dumps(v, separators=(",", ":"), sort_keys=True, default=str)


# --- apimachinery's name, label and value rules ----------------------------------------

DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_FMT = DNS1123_LABEL_FMT + "(\\." + DNS1123_LABEL_FMT + ")*"
DNS1123_SUBDOMAIN_MAX = 253
DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_FMT = "(" + QUALIFIED_NAME_FMT + ")?"
LABEL_VALUE_MAX = 63
ENV_VAR_NAME_FMT = "[-._a-zA-Z][-._a-zA-Z0-9]*"
CONFIG_MAP_KEY_FMT = "[-._a-zA-Z0-9]+"
PERCENT_FMT = "[0-9]+%"
HTTP_HEADER_NAME_FMT = "[-A-Za-z0-9]+"
QUANTITY_FMT = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024
MAX_SECRET_SIZE = 1024 * 1024
MAX_INT32 = 2**31 - 1
HIGHEST_USER_PRIORITY = 1_000_000_000
SYSTEM_PRIORITY_CLASSES = {"system-cluster-critical": 2_000_000_000, "system-node-critical": 2_000_001_000}
NODE_PORT_RANGE = (30000, 32767)

_DNS1123_LABEL_RE = re.compile(DNS1123_LABEL_FMT)
_DNS1123_SUBDOMAIN_RE = re.compile(DNS1123_SUBDOMAIN_FMT)
_DNS1035_LABEL_RE = re.compile(DNS1035_LABEL_FMT)
_QUALIFIED_NAME_RE = re.compile(QUALIFIED_NAME_FMT)
_LABEL_VALUE_RE = re.compile(LABEL_VALUE_FMT)
_ENV_VAR_NAME_RE = re.compile(ENV_VAR_NAME_FMT)
_CONFIG_MAP_KEY_RE = re.compile(CONFIG_MAP_KEY_FMT)
_PERCENT_RE = re.compile(PERCENT_FMT)
_HTTP_HEADER_NAME_RE = re.compile(HTTP_HEADER_NAME_FMT)
_PORT_NAME_CHARSET_RE = re.compile("[-a-z0-9]+")
_PORT_NAME_LETTER_RE = re.compile("[a-z]")


def regex_error(msg: str, fmt: str, *examples: str) -> str:
    # Kubernetes' own wording, including its double space before "or".
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    text = msg + " (e.g. "
    for i, example in enumerate(examples):
        if i > 0:
            text += " or "
        text += f"'{example}', "
    return text + f"regex used for validation is '{fmt}')"


def max_len_error(length: int) -> str:
    return f"must be no more than {length} characters"


def inclusive_range_error(lo: int, hi: int) -> str:
    return f"must be between {lo} and {hi}, inclusive"


def is_dns1123_label(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_LABEL_MAX:
        errs.append(max_len_error(DNS1123_LABEL_MAX))
    if not _DNS1123_LABEL_RE.fullmatch(value):
        if _DNS1123_SUBDOMAIN_RE.fullmatch(value):
            errs.append("must not contain dots")
        else:
            errs.append(
                regex_error(
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
                    "and must start and end with an alphanumeric character",
                    DNS1123_LABEL_FMT,
                    "my-name",
                    "123-abc",
                )
            )
    return errs


def is_dns1123_subdomain(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errs.append(max_len_error(DNS1123_SUBDOMAIN_MAX))
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        errs.append(
            regex_error(
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                "and must start and end with an alphanumeric character",
                DNS1123_SUBDOMAIN_FMT,
                "example.com",
            )
        )
    return errs


def is_dns1035_label(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_LABEL_MAX:
        errs.append(max_len_error(DNS1123_LABEL_MAX))
    if not _DNS1035_LABEL_RE.fullmatch(value):
        errs.append(
            regex_error(
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
                "start with an alphabetic character, and end with an alphanumeric character",
                DNS1035_LABEL_FMT,
                "my-name",
                "abc-123",
            )
        )
    return errs


_QUALIFIED_NAME_MSG = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"


def is_qualified_name(value: str) -> list[str]:
    """Label keys, annotation keys, finalizers, resource names: ``[prefix/]name``."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in is_dns1123_subdomain(prefix))
    else:
        return [
            "a qualified name "
            + regex_error(_QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        errs.append("name part " + max_len_error(QUALIFIED_NAME_MAX))
    if not _QUALIFIED_NAME_RE.fullmatch(name):
        errs.append(
            "name part "
            + regex_error(_QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errs


def is_label_value(value: str) -> list[str]:
    errs = []
    if len(value) > LABEL_VALUE_MAX:
        errs.append(max_len_error(LABEL_VALUE_MAX))
    if not _LABEL_VALUE_RE.fullmatch(value):
        errs.append(
            regex_error(
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                "and must start and end with an alphanumeric character",
                LABEL_VALUE_FMT,
                "MyValue",
                "my_value",
                "12345",
            )
        )
    return errs


def is_env_var_name(value: str) -> list[str]:
    errs = []
    if not _ENV_VAR_NAME_RE.fullmatch(value):
        errs.append(
            regex_error(
                "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', "
                "or '.', and must not start with a digit",
                ENV_VAR_NAME_FMT,
                "my.env-name",
                "MY_ENV.NAME",
                "MyEnvName1",
            )
        )
    errs.extend(_ch_dir_prefix(value))
    return errs


def is_config_map_key(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errs.append(max_len_error(DNS1123_SUBDOMAIN_MAX))
    if not _CONFIG_MAP_KEY_RE.fullmatch(value):
        errs.append(
            regex_error(
                "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                CONFIG_MAP_KEY_FMT,
                "key.name",
                "KEY_NAME",
                "key-name",
            )
        )
    errs.extend(_ch_dir_prefix(value))
    return errs


def _ch_dir_prefix(value: str) -> list[str]:
    if value == ".":
        return ["must not be '.'"]
    if value == "..":
        return ["must not be '..'"]
    if value.startswith(".."):
        return ["must not start with '..'"]
    return []


def is_valid_port_num(port: int) -> list[str]:
    return [] if 1 <= port <= 65535 else [inclusive_range_error(1, 65535)]


def is_valid_port_name(port: str) -> list[str]:
    """An IANA service name: at most 15 of [-a-z0-9], at least one letter, no '--', no edge '-'."""
    errs = []
    if len(port) > 15:
        errs.append(max_len_error(15))
    if not _PORT_NAME_CHARSET_RE.fullmatch(port):
        errs.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not _PORT_NAME_LETTER_RE.search(port):
        errs.append("must contain at least one letter (a-z)")
    if "--" in port:
        errs.append("must not contain consecutive hyphens")
    if port and (port[0] == "-" or port[-1] == "-"):
        errs.append("must not begin or end with a hyphen")
    return errs


def is_valid_percent(value: str) -> list[str]:
    if _PERCENT_RE.fullmatch(value):
        return []
    return [
        regex_error(
            "a valid percent string must be a numeric string followed by an ending '%'",
            PERCENT_FMT,
            "1%",
            "93%",
        )
    ]


def is_valid_path_segment_name(name: str) -> list[str]:
    if name in (".", ".."):
        return [f"may not be '{name}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]


def _mask_trailing_dash(name: str) -> str:
    # A generateName prefix may end in '-': the generated suffix makes the name valid.
    return name[:-1] + "a" if len(name) > 1 and name.endswith("-") else name


NameFn = Callable[[str, bool], list[str]]


def name_is_dns_subdomain(name: str, prefix: bool) -> list[str]:
    return is_dns1123_subdomain(_mask_trailing_dash(name) if prefix else name)


def name_is_dns_label(name: str, prefix: bool) -> list[str]:
    return is_dns1123_label(_mask_trailing_dash(name) if prefix else name)


def name_is_dns1035_label(name: str, prefix: bool) -> list[str]:
    return is_dns1035_label(_mask_trailing_dash(name) if prefix else name)


# --- small helpers ----------------------------------------------------------------------

Errs = list[FieldError]


def _nonneg(value: int | None, path: str, errs: Errs) -> None:
    if value is not None and value < 0:
        errs.append(invalid(path, value, "must be greater than or equal to 0"))


def _enum(value: str | None, path: str, valid: list[str], errs: Errs) -> None:
    """Unset means "will be defaulted"; an explicitly empty string is missing."""
    if value is None:
        return
    if value == "":
        errs.append(required(path))
    elif value not in valid:
        errs.append(not_supported(path, value, valid))


def _names(value: str, path: str, fn: Callable[[str], list[str]], errs: Errs) -> None:
    errs.extend(invalid(path, value, msg) for msg in fn(value))


def _int_or_string(value: Any, path: str, errs: Errs) -> int | str | None:
    """Int-or-string fields arrive untyped; anything else is a decoding error in Kubernetes."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str):
        return value
    errs.append(type_invalid(path, value, "must be an integer or a string"))
    return None


def _quantity(raw: Any, path: str, errs: Errs) -> Fraction | None:
    try:
        return parse_quantity(raw)
    except ValueError:
        errs.append(invalid(path, raw, f"quantities must match the regular expression '{QUANTITY_FMT}'"))
        return None


def _normalized(value: Any) -> Any:
    """JSON form for equality: unset, empty lists and empty maps are the same, as in Go."""
    if isinstance(value, BaseModel):
        value = value.model_dump(by_alias=True, exclude_none=True, mode="json")
    if isinstance(value, dict):
        out = {k: _normalized(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


def _semantic_equal(a: Any, b: Any) -> bool:
    return (_normalized(a) or None) == (_normalized(b) or None)


def _immutable(new: Any, old: Any, path: str, errs: Errs) -> None:
    if not _semantic_equal(new, old):
        errs.append(invalid(path, new, "field is immutable"))


def _diff(old: Any, new: Any, path: str, out: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            _diff(old.get(key), new.get(key), f"{path}.{key}" if path else key, out)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            _diff(a, b, f"{path}[{i}]", out)
    elif old != new:
        out.append(f"{path}: {_short(old)} -> {_short(new)}")


def _short(value: Any) -> str:
    text = "<unset>" if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


# --- metadata ---------------------------------------------------------------------------

STANDARD_FINALIZERS = {"kubernetes", "orphan", "foregroundDeletion"}


def validate_labels(labels: Mapping[str, str] | None, path: str, errs: Errs) -> None:
    for key, value in (labels or {}).items():
        _names(key, path, is_qualified_name, errs)
        _names(value, path, is_label_value, errs)


def validate_annotations(annotations: Mapping[str, str] | None, path: str, errs: Errs) -> None:
    total = 0
    for key, value in (annotations or {}).items():
        # Annotation keys are qualified names where case does not matter.
        errs.extend(invalid(path, key, msg) for msg in is_qualified_name(key.lower()))
        total += len(key.encode()) + len(value.encode())
    if total > TOTAL_ANNOTATION_SIZE_LIMIT:
        errs.append(too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT))


def _validate_finalizers(finalizers: list[str] | None, path: str, errs: Errs) -> None:
    for i, name in enumerate(finalizers or []):
        _names(name, path, is_qualified_name, errs)
        if "/" not in name and name not in STANDARD_FINALIZERS:
            errs.append(
                invalid(
                    f"{path}[{i}]",
                    name,
                    "name is neither a standard finalizer name nor is it fully qualified",
                )
            )
    names = set(finalizers or [])
    if {"orphan", "foregroundDeletion"} <= names:
        errs.append(invalid(path, finalizers, "finalizer orphan and foregroundDeletion cannot be both set"))


def _validate_owner_references(refs: list[k8s.OwnerReference] | None, path: str, errs: Errs) -> None:
    controller = ""
    for ref in refs or []:
        if not ref.api_version or not ref.api_version.rpartition("/")[2]:
            errs.append(invalid(f"{path}.apiVersion", ref.api_version, "version must not be empty"))
        if not ref.kind:
            errs.append(invalid(f"{path}.kind", ref.kind, "kind must not be empty"))
        if not ref.name:
            errs.append(invalid(f"{path}.name", ref.name, "name must not be empty"))
        if not ref.uid:
            errs.append(invalid(f"{path}.uid", ref.uid, "uid must not be empty"))
        if ref.controller:
            current = f"{ref.kind}/{ref.name}"
            if controller:
                errs.append(
                    invalid(
                        path,
                        [f"{r.kind}/{r.name}" for r in refs or []],
                        "Only one reference can have Controller set to true. "
                        f'Found "true" in references for {controller} and {current}',
                    )
                )
            else:
                controller = current


def validate_object_meta(
    meta: k8s.ObjectMeta | None,
    errs: Errs,
    *,
    name_fn: NameFn = name_is_dns_subdomain,
    namespaced: bool = True,
    path: str = "metadata",
) -> None:
    """Kubernetes' ValidateObjectMeta, except that a missing namespace is accepted.

    The API server puts the namespace from the URL into the object (and rejects a mismatch)
    before validating, so "namespace consistency" is its job, not this function's.
    """
    if meta is None:
        errs.append(required(f"{path}.name", "name or generateName is required"))
        return
    if meta.generate_name:
        for msg in name_fn(meta.generate_name, True):
            errs.append(invalid(f"{path}.generateName", meta.generate_name, msg))
    if not meta.name:
        if not meta.generate_name:
            errs.append(required(f"{path}.name", "name or generateName is required"))
    else:
        for msg in name_fn(meta.name, False):
            errs.append(invalid(f"{path}.name", meta.name, msg))
    if meta.namespace:
        if not namespaced:
            errs.append(forbidden(f"{path}.namespace", "not allowed on this type"))
        else:
            _names(meta.namespace, f"{path}.namespace", is_dns1123_label, errs)
    _nonneg(meta.generation, f"{path}.generation", errs)
    validate_labels(meta.labels, f"{path}.labels", errs)
    validate_annotations(meta.annotations, f"{path}.annotations", errs)
    _validate_owner_references(meta.owner_references, f"{path}.ownerReferences", errs)
    _validate_finalizers(meta.finalizers, f"{path}.finalizers", errs)


def validate_object_meta_update(new: k8s.ObjectMeta | None, old: k8s.ObjectMeta | None, errs: Errs) -> None:
    """Identity fields may not change; a field left unset in the new object is filled in by the
    server from the stored one (as Kubernetes' update path does), so only a different value is an error.
    """
    new = new or k8s.ObjectMeta()
    old = old or k8s.ObjectMeta()
    for attr, alias in (
        ("name", "name"),
        ("namespace", "namespace"),
        ("uid", "uid"),
        ("creation_timestamp", "creationTimestamp"),
    ):
        value = getattr(new, attr)
        if value not in (None, "") and value != getattr(old, attr):
            errs.append(invalid(f"metadata.{alias}", value, "field is immutable"))


# --- label selectors --------------------------------------------------------------------


def validate_label_selector(selector: k8s.LabelSelector | None, path: str, errs: Errs) -> bool:
    """Returns whether the selector is usable for matching."""
    if selector is None:
        return True
    usable = True
    validate_labels(selector.match_labels, f"{path}.matchLabels", errs)
    for i, req in enumerate(selector.match_expressions or []):
        p = f"{path}.matchExpressions[{i}]"
        if req.operator in ("In", "NotIn"):
            if not req.values:
                errs.append(required(f"{p}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
        elif req.operator in ("Exists", "DoesNotExist"):
            if req.values:
                errs.append(
                    forbidden(
                        f"{p}.values", "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                    )
                )
        else:
            errs.append(invalid(f"{p}.operator", req.operator, "not a valid selector operator"))
            usable = False
        _names(req.key, f"{p}.key", is_qualified_name, errs)
        for j, value in enumerate(req.values or []):
            _names(value, f"{p}.values[{j}]", is_label_value, errs)
    return usable


def selector_is_empty(selector: k8s.LabelSelector | None) -> bool:
    return selector is None or (not selector.match_labels and not selector.match_expressions)


def selector_matches(selector: k8s.LabelSelector | None, labels: Mapping[str, str] | None) -> bool:
    """Kubernetes' LabelSelectorAsSelector(...).Matches; an empty selector matches everything."""
    labels = labels or {}
    if selector is None:
        return True
    for key, value in (selector.match_labels or {}).items():
        if labels.get(key) != value:
            return False
    for req in selector.match_expressions or []:
        present = req.key in labels
        if req.operator == "In" and not (present and labels[req.key] in (req.values or [])):
            return False
        if req.operator == "NotIn" and present and labels[req.key] in (req.values or []):
            return False
        if req.operator == "Exists" and not present:
            return False
        if req.operator == "DoesNotExist" and present:
            return False
    return True


# --- resources --------------------------------------------------------------------------

STANDARD_CONTAINER_RESOURCES = {"cpu", "memory", "ephemeral-storage"}
INTEGER_RESOURCES = {
    "pods",
    "services",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "services.nodeports",
    "services.loadbalancers",
}
STANDARD_QUOTA_RESOURCES = INTEGER_RESOURCES | {
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.storage",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
}


def is_native_resource(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name


def is_hugepages_resource(name: str) -> bool:
    return name.startswith("hugepages-")


def is_extended_resource(name: str) -> bool:
    """Vendor resources such as ``nvidia.com/gpu``: whole units, never overcommitted."""
    if is_native_resource(name) or name.startswith("requests."):
        return False
    return not is_qualified_name("requests." + name)


def overcommit_allowed(name: str) -> bool:
    return is_native_resource(name) and not is_hugepages_resource(name)


def _validate_resource_name(name: str, path: str, errs: Errs) -> bool:
    before = len(errs)
    _names(name, path, is_qualified_name, errs)
    return len(errs) == before


def _validate_container_resource_name(name: str, path: str, errs: Errs) -> None:
    if not _validate_resource_name(name, path, errs):
        return
    if "/" not in name:
        if name not in STANDARD_CONTAINER_RESOURCES and not is_hugepages_resource(name):
            errs.append(invalid(path, name, "must be a standard resource for containers"))
    elif not is_native_resource(name) and not is_extended_resource(name):
        errs.append(invalid(path, name, "doesn't follow extended resource name standard"))


def _validate_quantity_value(name: str, raw: Any, path: str, errs: Errs) -> Fraction | None:
    value = _quantity(raw, path, errs)
    if value is None:
        return None
    if value < 0:
        errs.append(invalid(path, str(raw), "must be greater than or equal to 0"))
    if (name in INTEGER_RESOURCES or is_extended_resource(name)) and value.denominator != 1:
        errs.append(invalid(path, Unquoted(str(raw)), "must be an integer"))
    return value


def validate_resource_requirements(res: k8s.ResourceRequirements | None, path: str, errs: Errs) -> None:
    if res is None:
        return
    lim_path, req_path = f"{path}.limits", f"{path}.requests"
    limits: dict[str, Fraction | None] = {}
    for name, raw in (res.limits or {}).items():
        p = f"{lim_path}[{name}]"
        _validate_container_resource_name(name, p, errs)
        limits[name] = _validate_quantity_value(name, raw, p, errs)
    for name, raw in (res.requests or {}).items():
        p = f"{req_path}[{name}]"
        _validate_container_resource_name(name, p, errs)
        request = _validate_quantity_value(name, raw, p, errs)
        if name in limits:
            limit = limits[name]
            if request is None or limit is None:
                continue
            limit_raw = str((res.limits or {})[name])
            # Extended resources such as GPUs cannot be overcommitted: the request is the limit.
            if request != limit and not overcommit_allowed(name):
                errs.append(invalid(req_path, str(raw), f"must be equal to {name} limit of {limit_raw}"))
            elif request > limit:
                errs.append(
                    invalid(req_path, str(raw), f"must be less than or equal to {name} limit of {limit_raw}")
                )
        elif not overcommit_allowed(name):
            errs.append(required(lim_path, "Limit must be set for non overcommitable resources"))


# --- pods -------------------------------------------------------------------------------

PORT_PROTOCOLS = ["SCTP", "TCP", "UDP"]
RESTART_POLICIES = ["Always", "Never", "OnFailure"]
DNS_POLICIES = ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"]
PULL_POLICIES = ["Always", "IfNotPresent", "Never"]
TERMINATION_MESSAGE_POLICIES = ["File", "FallbackToLogsOnError"]
TAINT_EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]
TOLERATION_OPERATORS = ["Equal", "Exists"]
PREEMPTION_POLICIES = ["PreemptLowerPriority", "Never"]
HTTP_SCHEMES = ["HTTP", "HTTPS"]
UNSATISFIABLE_CONSTRAINT_ACTIONS = ["DoNotSchedule", "ScheduleAnyway"]
_VOLUME_SOURCES = [f for f in k8s.Volume.model_fields if f != "name"]


def _alias(model: type[BaseModel], attr: str) -> str:
    return model.model_fields[attr].alias or attr


def _validate_port_num_or_name(port: Any, path: str, errs: Errs) -> None:
    port = _int_or_string(port, path, errs)
    if port is None:
        errs.append(required(path))
    elif isinstance(port, int):
        errs.extend(invalid(path, port, msg) for msg in is_valid_port_num(port))
    else:
        errs.extend(invalid(path, port, msg) for msg in is_valid_port_name(port))


def _validate_handler(handler: Any, path: str, errs: Errs, grace_period: int | None) -> None:
    kinds = [
        ("exec", "exec"),
        ("http_get", "httpGet"),
        ("tcp_socket", "tcpSocket"),
        ("grpc", "grpc"),
        ("sleep", "sleep"),
    ]
    count = 0
    for attr, alias in kinds:
        action = getattr(handler, attr, None)
        if action is None:
            continue
        p = f"{path}.{alias}"
        if count:
            errs.append(forbidden(p, "may not specify more than 1 handler type"))
            continue
        count += 1
        if attr == "exec" and not action.command:
            errs.append(required(f"{p}.command"))
        elif attr == "http_get":
            if action.path == "":
                errs.append(required(f"{p}.path"))
            _validate_port_num_or_name(action.port, f"{p}.port", errs)
            if action.scheme is not None and action.scheme not in HTTP_SCHEMES:
                errs.append(not_supported(f"{p}.scheme", action.scheme, HTTP_SCHEMES))
            for header in action.http_headers or []:
                if not _HTTP_HEADER_NAME_RE.fullmatch(header.name):
                    errs.append(
                        invalid(
                            f"{p}.httpHeaders",
                            header.name,
                            regex_error(
                                "a valid HTTP header must consist of alphanumeric characters or '-'",
                                HTTP_HEADER_NAME_FMT,
                                "X-Header-Name",
                            ),
                        )
                    )
        elif attr == "tcp_socket":
            _validate_port_num_or_name(action.port, f"{p}.port", errs)
        elif attr == "grpc":
            _validate_port_num_or_name(action.port, f"{p}.port", errs)
        elif attr == "sleep" and grace_period is not None and not 0 < action.seconds <= grace_period:
            errs.append(
                invalid(
                    p,
                    action.seconds,
                    f"must be greater than 0 and less than terminationGracePeriodSeconds ({grace_period})",
                )
            )
    if count == 0:
        errs.append(required(path, "must specify a handler type"))


def _validate_probe(
    probe: k8s.Probe | None, path: str, errs: Errs, *, kind: str, grace_period: int | None
) -> None:
    if probe is None:
        return
    _validate_handler(probe, path, errs, None)
    for attr, alias in (
        ("initial_delay_seconds", "initialDelaySeconds"),
        ("timeout_seconds", "timeoutSeconds"),
        ("period_seconds", "periodSeconds"),
        ("success_threshold", "successThreshold"),
        ("failure_threshold", "failureThreshold"),
    ):
        _nonneg(getattr(probe, attr), f"{path}.{alias}", errs)
    tgps = probe.termination_grace_period_seconds
    if kind == "readiness" and tgps is not None:
        errs.append(
            invalid(f"{path}.terminationGracePeriodSeconds", tgps, "must not be set for readinessProbes")
        )
    elif tgps is not None and tgps <= 0:
        errs.append(invalid(f"{path}.terminationGracePeriodSeconds", tgps, "must be greater than 0"))
    if kind in ("liveness", "startup") and probe.success_threshold not in (None, 1):
        errs.append(invalid(f"{path}.successThreshold", probe.success_threshold, "must be 1"))


def _validate_env(env: list[k8s.EnvVar] | None, path: str, errs: Errs) -> None:
    for i, var in enumerate(env or []):
        p = f"{path}[{i}]"
        if not var.name:
            errs.append(required(f"{p}.name"))
        else:
            _names(var.name, f"{p}.name", is_env_var_name, errs)
        source = var.value_from
        if source is None:
            continue
        sources = [
            s
            for s in (
                source.field_ref,
                source.resource_field_ref,
                source.config_map_key_ref,
                source.secret_key_ref,
                source.file_key_ref,
            )
            if s is not None
        ]
        vp = f"{p}.valueFrom"
        if not sources:
            errs.append(
                invalid(
                    vp,
                    "",
                    "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
                )
            )
        elif var.value:
            errs.append(invalid(vp, "", "may not be specified when `value` is not empty"))
        elif len(sources) > 1:
            errs.append(invalid(vp, "", "may not have more than one field specified at a time"))


def _validate_local_descending_path(target: str, path: str, errs: Errs) -> None:
    if target.startswith("/"):
        errs.append(invalid(path, target, "must be a relative path"))
    if ".." in target.replace("\\", "/").split("/"):
        errs.append(invalid(path, target, "must not contain '..'"))


def _validate_volume_mounts(
    mounts: list[k8s.VolumeMount] | None, volumes: set[str], path: str, errs: Errs
) -> None:
    seen: set[str] = set()
    for i, mount in enumerate(mounts or []):
        p = f"{path}[{i}]"
        if not mount.name:
            errs.append(required(f"{p}.name"))
        if mount.name not in volumes:
            errs.append(not_found(f"{p}.name", mount.name))
        if not mount.mount_path:
            errs.append(required(f"{p}.mountPath"))
        elif mount.mount_path in seen:
            errs.append(invalid(f"{p}.mountPath", mount.mount_path, "must be unique"))
        seen.add(mount.mount_path)
        if mount.sub_path:
            _validate_local_descending_path(mount.sub_path, f"{p}.subPath", errs)


def _validate_container_ports(ports: list[k8s.ContainerPort] | None, path: str, errs: Errs) -> None:
    names: set[str] = set()
    seen: set[tuple[int, str]] = set()
    for i, port in enumerate(ports or []):
        p = f"{path}[{i}]"
        if port.name:
            msgs = is_valid_port_name(port.name)
            errs.extend(invalid(f"{p}.name", port.name, msg) for msg in msgs)
            if not msgs:
                if port.name in names:
                    errs.append(duplicate(f"{p}.name", port.name))
                names.add(port.name)
        if port.container_port == 0:
            errs.append(required(f"{p}.containerPort"))
        else:
            errs.extend(
                invalid(f"{p}.containerPort", port.container_port, m)
                for m in is_valid_port_num(port.container_port)
            )
        if port.host_port:
            errs.extend(
                invalid(f"{p}.hostPort", port.host_port, m) for m in is_valid_port_num(port.host_port)
            )
        _enum(port.protocol, f"{p}.protocol", PORT_PROTOCOLS, errs)
        # Deliberate difference: Kubernetes only warns about a repeated containerPort/protocol
        # in one container; here it is an error, since the second entry can never be served.
        key = (port.container_port, port.protocol or "TCP")
        if key in seen:
            errs.append(duplicate(p, Unquoted(f"{key[0]}/{key[1]}")))
        seen.add(key)


def _validate_host_port_conflicts(
    containers: list[k8s.Container], path: str, errs: Errs, *, first_index: int = 0
) -> None:
    seen: set[str] = set()
    for ci, c in enumerate(containers, start=first_index):
        for pi, port in enumerate(c.ports or []):
            if not port.host_port:
                continue
            key = f"{port.protocol or 'TCP'}/{port.host_ip or ''}/{port.host_port}"
            if key in seen:
                errs.append(duplicate(f"{path}[{ci}].ports[{pi}].hostPort", key))
            seen.add(key)


def _validate_container(c: k8s.Container, path: str, volumes: set[str], errs: Errs) -> None:
    if not c.name:
        errs.append(required(f"{path}.name"))
    else:
        _names(c.name, f"{path}.name", is_dns1123_label, errs)
    if not c.image:
        errs.append(required(f"{path}.image"))
    _enum(
        c.termination_message_policy, f"{path}.terminationMessagePolicy", TERMINATION_MESSAGE_POLICIES, errs
    )
    _enum(c.image_pull_policy, f"{path}.imagePullPolicy", PULL_POLICIES, errs)
    _validate_container_ports(c.ports, f"{path}.ports", errs)
    _validate_env(c.env, f"{path}.env", errs)
    _validate_volume_mounts(c.volume_mounts, volumes, f"{path}.volumeMounts", errs)
    validate_resource_requirements(c.resources, f"{path}.resources", errs)


def _validate_probes_and_lifecycle(c: k8s.Container, path: str, grace: int | None, errs: Errs) -> None:
    if c.lifecycle is not None:
        for attr, alias in (("post_start", "postStart"), ("pre_stop", "preStop")):
            handler = getattr(c.lifecycle, attr)
            if handler is not None:
                _validate_handler(handler, f"{path}.lifecycle.{alias}", errs, grace)
    _validate_probe(c.liveness_probe, f"{path}.livenessProbe", errs, kind="liveness", grace_period=grace)
    _validate_probe(c.readiness_probe, f"{path}.readinessProbe", errs, kind="readiness", grace_period=grace)
    _validate_probe(c.startup_probe, f"{path}.startupProbe", errs, kind="startup", grace_period=grace)


def _validate_volumes(volumes: list[k8s.Volume] | None, path: str, errs: Errs) -> set[str]:
    names: set[str] = set()
    for i, vol in enumerate(volumes or []):
        p = f"{path}[{i}]"
        set_sources = [attr for attr in _VOLUME_SOURCES if getattr(vol, attr) is not None]
        if not set_sources:
            errs.append(required(p, "must specify a volume type"))
        for attr in set_sources[1:]:
            errs.append(
                forbidden(f"{p}.{_alias(k8s.Volume, attr)}", "may not specify more than 1 volume type")
            )
        if vol.persistent_volume_claim is not None and not vol.persistent_volume_claim.claim_name:
            errs.append(required(f"{p}.persistentVolumeClaim.claimName"))
        if vol.host_path is not None:
            _validate_host_path(vol.host_path, f"{p}.hostPath", errs)
        if not vol.name:
            errs.append(required(f"{p}.name"))
        else:
            _names(vol.name, f"{p}.name", is_dns1123_label, errs)
        if vol.name in names:
            errs.append(duplicate(f"{p}.name", vol.name))
        names.add(vol.name)
    return names


def validate_tolerations(tolerations: list[k8s.Toleration] | None, path: str, errs: Errs) -> None:
    for i, t in enumerate(tolerations or []):
        p = f"{path}[{i}]"
        if t.key:
            _names(t.key, f"{p}.key", is_qualified_name, errs)
        if not t.key and t.operator != "Exists":
            errs.append(
                invalid(
                    f"{p}.operator",
                    t.operator or "",
                    'operator must be Exists when `key` is empty, which means "match all values and all keys"',
                )
            )
        if t.toleration_seconds is not None and t.effect != "NoExecute":
            errs.append(
                invalid(
                    f"{p}.effect",
                    t.effect or "",
                    "effect must be 'NoExecute' when `tolerationSeconds` is set",
                )
            )
        if t.operator in (None, "", "Equal"):
            msgs = is_label_value(t.value or "")
            if msgs:
                errs.append(invalid(f"{p}.operator", t.value, ";".join(msgs)))
        elif t.operator == "Exists":
            if t.value:
                errs.append(
                    invalid(f"{p}.operator", t.value, "value must be empty when `operator` is 'Exists'")
                )
        else:
            errs.append(not_supported(f"{p}.operator", t.operator, TOLERATION_OPERATORS))
        if t.effect:
            _validate_taint_effect(t.effect, f"{p}.effect", errs)


def _validate_taint_effect(effect: str | None, path: str, errs: Errs) -> None:
    if not effect:
        errs.append(required(path))
    elif effect not in TAINT_EFFECTS:
        errs.append(not_supported(path, effect, TAINT_EFFECTS))


def _validate_node_selector_requirement(req: Any, path: str, errs: Errs) -> None:
    if req.operator in ("In", "NotIn"):
        if not req.values:
            errs.append(required(f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
    elif req.operator in ("Exists", "DoesNotExist"):
        if req.values:
            errs.append(
                forbidden(
                    f"{path}.values", "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                )
            )
    elif req.operator in ("Gt", "Lt"):
        if len(req.values or []) != 1:
            errs.append(
                required(f"{path}.values", "must be specified single value when `operator` is 'Lt' or 'Gt'")
            )
    else:
        errs.append(invalid(f"{path}.operator", req.operator, "not a valid selector operator"))
    _names(req.key, f"{path}.key", is_qualified_name, errs)


def _validate_affinity(affinity: k8s.Affinity | None, path: str, errs: Errs) -> None:
    if affinity is None:
        return
    node = affinity.node_affinity
    if node is not None:
        np = f"{path}.nodeAffinity"
        req = node.required_during_scheduling_ignored_during_execution
        if req is not None:
            tp = f"{np}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
            if not req.node_selector_terms:
                errs.append(required(tp, "must have at least one node selector term"))
            for i, term in enumerate(req.node_selector_terms):
                for j, r in enumerate(term.match_expressions or []):
                    _validate_node_selector_requirement(r, f"{tp}[{i}].matchExpressions[{j}]", errs)
        for i, pref in enumerate(node.preferred_during_scheduling_ignored_during_execution or []):
            pp = f"{np}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
            if not 1 <= pref.weight <= 100:
                errs.append(invalid(f"{pp}.weight", pref.weight, "must be in the range 1-100"))
            for j, r in enumerate(pref.preference.match_expressions or []):
                _validate_node_selector_requirement(r, f"{pp}.preference.matchExpressions[{j}]", errs)
    for attr, alias in (("pod_affinity", "podAffinity"), ("pod_anti_affinity", "podAntiAffinity")):
        pa = getattr(affinity, attr)
        if pa is None:
            continue
        ap = f"{path}.{alias}"
        for i, term in enumerate(pa.required_during_scheduling_ignored_during_execution or []):
            _validate_pod_affinity_term(
                term, f"{ap}.requiredDuringSchedulingIgnoredDuringExecution[{i}]", errs
            )
        for i, weighted in enumerate(pa.preferred_during_scheduling_ignored_during_execution or []):
            wp = f"{ap}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
            if not 1 <= weighted.weight <= 100:
                errs.append(invalid(f"{wp}.weight", weighted.weight, "must be in the range 1-100"))
            _validate_pod_affinity_term(weighted.pod_affinity_term, f"{wp}.podAffinityTerm", errs)


def _validate_pod_affinity_term(term: k8s.PodAffinityTerm, path: str, errs: Errs) -> None:
    validate_label_selector(term.label_selector, f"{path}.labelSelector", errs)
    validate_label_selector(term.namespace_selector, f"{path}.namespaceSelector", errs)
    for name in term.namespaces or []:
        _names(name, f"{path}.namespace", is_dns1123_label, errs)
    if not term.topology_key:
        errs.append(required(f"{path}.topologyKey", "can not be empty"))
    _names(term.topology_key, f"{path}.topologyKey", is_qualified_name, errs)


def _validate_topology_spread(
    constraints: list[k8s.TopologySpreadConstraint] | None, path: str, errs: Errs
) -> None:
    for i, c in enumerate(constraints or []):
        p = f"{path}[{i}]"
        if c.max_skew <= 0:
            errs.append(invalid(f"{p}.maxSkew", c.max_skew, "must be greater than zero"))
        if not c.topology_key:
            errs.append(required(f"{p}.topologyKey", "can not be empty"))
        else:
            _names(c.topology_key, f"{p}.topologyKey", is_qualified_name, errs)
        if c.when_unsatisfiable not in UNSATISFIABLE_CONSTRAINT_ACTIONS:
            errs.append(
                not_supported(
                    f"{p}.whenUnsatisfiable", c.when_unsatisfiable, UNSATISFIABLE_CONSTRAINT_ACTIONS
                )
            )
        validate_label_selector(c.label_selector, f"{p}.labelSelector", errs)


def validate_pod_spec(spec: k8s.PodSpec, path: str, errs: Errs, *, is_pod: bool) -> None:
    grace = spec.termination_grace_period_seconds
    volumes = _validate_volumes(spec.volumes, f"{path}.volumes", errs)
    containers = spec.containers or []
    init_containers = spec.init_containers or []

    if not containers:
        errs.append(required(f"{path}.containers"))
    names: set[str] = set()
    for i, c in enumerate(containers):
        p = f"{path}.containers[{i}]"
        _validate_container(c, p, volumes, errs)
        if c.name in names:
            errs.append(duplicate(f"{p}.name", c.name))
        names.add(c.name)
        _validate_probes_and_lifecycle(c, p, grace, errs)
        if c.restart_policy is not None:
            errs.append(forbidden(f"{p}.restartPolicy", "may not be set for non-init containers"))
    _validate_host_port_conflicts(containers, f"{path}.containers", errs)

    for i, c in enumerate(init_containers):
        p = f"{path}.initContainers[{i}]"
        _validate_container(c, p, volumes, errs)
        # Names are unique across init and regular containers: both appear in one status.
        if c.name in names:
            errs.append(duplicate(f"{p}.name", c.name))
        elif c.name:
            names.add(c.name)
        sidecar = c.restart_policy == "Always"
        if c.restart_policy is not None and not sidecar:
            errs.append(not_supported(f"{p}.restartPolicy", c.restart_policy, ["Always"]))
        if sidecar:
            _validate_probes_and_lifecycle(c, p, grace, errs)
        else:
            for attr, alias in (
                ("lifecycle", "lifecycle"),
                ("liveness_probe", "livenessProbe"),
                ("readiness_probe", "readinessProbe"),
                ("startup_probe", "startupProbe"),
            ):
                if getattr(c, attr) is not None:
                    errs.append(
                        forbidden(
                            f"{p}.{alias}", "may not be set for init containers without restartPolicy=Always"
                        )
                    )
        # Init containers run one at a time, so each only has to agree with itself.
        _validate_host_port_conflicts([c], f"{path}.initContainers", errs, first_index=i)

    if spec.host_network:
        for i, c in enumerate(containers):
            for j, port in enumerate(c.ports or []):
                host_port = port.host_port or 0
                if (is_pod or host_port != 0) and host_port != port.container_port:
                    errs.append(
                        invalid(
                            f"{path}.containers[{i}].ports[{j}].hostPort",
                            host_port,
                            "must match `containerPort` when `hostNetwork` is true",
                        )
                    )

    _enum(spec.restart_policy, f"{path}.restartPolicy", RESTART_POLICIES, errs)
    _enum(spec.dns_policy, f"{path}.dnsPolicy", DNS_POLICIES, errs)
    if spec.dns_policy == "None" and spec.dns_config is None:
        errs.append(required(f"{path}.dnsConfig", "must provide `dnsConfig` when `dnsPolicy` is None"))
    validate_labels(spec.node_selector, f"{path}.nodeSelector", errs)
    _validate_affinity(spec.affinity, f"{path}.affinity", errs)
    _validate_topology_spread(spec.topology_spread_constraints, f"{path}.topologySpreadConstraints", errs)

    seen_gates: set[str] = set()
    for i, gate in enumerate(spec.scheduling_gates or []):
        _names(gate.name, f"{path}.schedulingGates[{i}]", is_qualified_name, errs)
        if gate.name in seen_gates:
            errs.append(duplicate(f"{path}.schedulingGates[{i}]", gate.name))
        seen_gates.add(gate.name)

    for attr, alias in (
        ("service_account_name", "serviceAccountName"),
        ("node_name", "nodeName"),
        ("priority_class_name", "priorityClassName"),
        ("scheduler_name", "schedulerName"),
    ):
        value = getattr(spec, attr)
        if value:
            _names(value, f"{path}.{alias}", is_dns1123_subdomain, errs)
    for attr in ("hostname", "subdomain"):
        value = getattr(spec, attr)
        if value:
            _names(value, f"{path}.{attr}", is_dns1123_label, errs)
    if spec.active_deadline_seconds is not None and not 1 <= spec.active_deadline_seconds <= MAX_INT32:
        errs.append(
            invalid(
                f"{path}.activeDeadlineSeconds",
                spec.active_deadline_seconds,
                inclusive_range_error(1, MAX_INT32),
            )
        )
    if spec.preemption_policy is not None:
        _enum(spec.preemption_policy, f"{path}.preemptionPolicy", PREEMPTION_POLICIES, errs)
    validate_tolerations(spec.tolerations, f"{path}.tolerations", errs)


def _validate_pod(pod: k8s.Pod, errs: Errs) -> None:
    validate_object_meta(pod.metadata, errs)
    if pod.spec is None:
        errs.append(required("spec.containers"))
        return
    validate_pod_spec(pod.spec, "spec", errs, is_pod=True)
    for attr, alias in (("containers", "containers"), ("init_containers", "initContainers")):
        for i, c in enumerate(getattr(pod.spec, attr) or []):
            if c.image and c.image != c.image.strip():
                errs.append(
                    invalid(
                        f"spec.{alias}[{i}].image", c.image, "must not have leading or trailing whitespace"
                    )
                )


def validate_pod_template(template: k8s.PodTemplateSpec | None, path: str, errs: Errs) -> None:
    if template is None:
        errs.append(required(path))
        return
    if template.metadata is not None:
        validate_labels(template.metadata.labels, f"{path}.metadata.labels", errs)
        validate_annotations(template.metadata.annotations, f"{path}.metadata.annotations", errs)
    if template.spec is None:
        errs.append(required(f"{path}.spec.containers"))
    else:
        validate_pod_spec(template.spec, f"{path}.spec", errs, is_pod=False)


UPDATABLE_POD_SPEC_FIELDS = [
    "`spec.containers[*].image`",
    "`spec.initContainers[*].image`",
    "`spec.activeDeadlineSeconds`",
    "`spec.tolerations` (only additions to existing tolerations)",
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
]


def _validate_pod_update(new: k8s.Pod, old: k8s.Pod, errs: Errs) -> None:
    if new.spec is None or old.spec is None:
        return
    for attr, alias in (("containers", "containers"), ("init_containers", "initContainers")):
        if len(getattr(new.spec, attr) or []) != len(getattr(old.spec, attr) or []):
            errs.append(forbidden(f"spec.{alias}", "pod updates may not add or remove containers"))
            return

    new_ads, old_ads = new.spec.active_deadline_seconds, old.spec.active_deadline_seconds
    if new_ads is not None:
        if old_ads is not None and new_ads > old_ads:
            errs.append(
                invalid("spec.activeDeadlineSeconds", new_ads, "must be less than or equal to previous value")
            )
    elif old_ads is not None:
        errs.append(
            invalid(
                "spec.activeDeadlineSeconds", None, "must not update from a positive integer to nil value"
            )
        )

    new_tols = [_normalized(t) for t in new.spec.tolerations or []]
    for old_tol in old.spec.tolerations or []:
        wanted = _normalized(old_tol)
        wanted.pop("tolerationSeconds", None)
        if not any({k: v for k, v in t.items() if k != "tolerationSeconds"} == wanted for t in new_tols):
            errs.append(
                forbidden(
                    "spec.tolerations", "existing toleration can not be modified except its tolerationSeconds"
                )
            )
            break

    old_gates = {g.name for g in old.spec.scheduling_gates or []}
    for i, gate in enumerate(new.spec.scheduling_gates or []):
        if gate.name not in old_gates:
            errs.append(
                forbidden(
                    f"spec.schedulingGates[{i}].name",
                    f"only deletion is allowed, but found new scheduling gate '{gate.name}'",
                )
            )

    munged = new.spec.model_copy(deep=True)
    for mine, theirs in zip(munged.containers, old.spec.containers, strict=True):
        mine.image = theirs.image
    for mine, theirs in zip(munged.init_containers or [], old.spec.init_containers or [], strict=True):
        mine.image = theirs.image
    munged.active_deadline_seconds = old_ads
    munged.scheduling_gates = old.spec.scheduling_gates
    munged.tolerations = old.spec.tolerations
    old_grace = old.spec.termination_grace_period_seconds
    if old_grace is not None and old_grace < 0 and munged.termination_grace_period_seconds == 1:
        munged.termination_grace_period_seconds = old_grace
    if old.spec.scheduling_gates:
        # A gated pod has not been scheduled, so its node selector may still grow.
        old_selector = old.spec.node_selector or {}
        new_selector = munged.node_selector or {}
        if all(new_selector.get(k) == v for k, v in old_selector.items()):
            munged.node_selector = old.spec.node_selector
        else:
            errs.append(
                invalid("spec.nodeSelector", new_selector, "only additions to spec.nodeSelector are allowed")
            )
            munged.node_selector = old.spec.node_selector

    before, after = _normalized(old.spec), _normalized(munged)
    if before != after:
        changes: list[str] = []
        _diff(before, after, "spec", changes)
        detail = "pod updates may not change fields other than " + ",".join(UPDATABLE_POD_SPEC_FIELDS)
        errs.append(forbidden("spec", detail + "\n" + "\n".join("  " + c for c in changes)))


# --- apps and batch ---------------------------------------------------------------------


def _validate_int_or_percent(value: Any, path: str, errs: Errs) -> None:
    value = _int_or_string(value, path, errs)
    if isinstance(value, str):
        errs.extend(invalid(path, Unquoted(value), msg) for msg in is_valid_percent(value))
    elif isinstance(value, int):
        _nonneg(value, path, errs)


def _percent_value(value: Any) -> int | None:
    if isinstance(value, str) and _PERCENT_RE.fullmatch(value):
        return int(value[:-1])
    return None


def _not_more_than_100_percent(value: Any, path: str, errs: Errs) -> None:
    percent = _percent_value(value)
    if percent is not None and percent > 100:
        errs.append(invalid(path, Unquoted(value), "must not be greater than 100%"))


def _is_zero(value: Any) -> bool:
    return value == 0 or _percent_value(value) == 0


def _validate_template_for_controller(
    template: k8s.PodTemplateSpec | None,
    selector: k8s.LabelSelector | None,
    selector_usable: bool,
    path: str,
    errs: Errs,
    *,
    restart_policies: list[str],
) -> None:
    if template is None:
        errs.append(required(path))
        return
    labels = template.metadata.labels if template.metadata is not None else None
    if selector_usable and not selector_is_empty(selector) and not selector_matches(selector, labels):
        errs.append(
            invalid(
                f"{path}.metadata.labels", dict(labels or {}), "`selector` does not match template `labels`"
            )
        )
    validate_pod_template(template, path, errs)
    if template.spec is None:
        return
    restart = template.spec.restart_policy
    if restart is None and "Always" not in restart_policies:
        errs.append(
            required(
                f"{path}.spec.restartPolicy",
                "valid values: " + ", ".join(_go_quote(p) for p in restart_policies),
            )
        )
    elif restart not in (None, "") and restart not in restart_policies:
        if restart in RESTART_POLICIES:  # otherwise the PodSpec check already said so
            errs.append(not_supported(f"{path}.spec.restartPolicy", restart, restart_policies))


def _validate_replicated_selector(selector: k8s.LabelSelector | None, path: str, errs: Errs) -> bool:
    if selector is None:
        errs.append(required(path))
        return False
    usable = validate_label_selector(selector, path, errs)
    if selector_is_empty(selector):
        errs.append(invalid(path, selector, "empty selector is invalid for deployment"))
    return usable


def _validate_deployment(d: k8s.Deployment, errs: Errs) -> None:
    validate_object_meta(d.metadata, errs)
    spec = d.spec
    _nonneg(spec.replicas, "spec.replicas", errs)
    usable = _validate_replicated_selector(spec.selector, "spec.selector", errs)
    _validate_template_for_controller(
        spec.template, spec.selector, usable, "spec.template", errs, restart_policies=["Always"]
    )
    if (
        spec.template is not None
        and spec.template.spec is not None
        and spec.template.spec.active_deadline_seconds is not None
    ):
        errs.append(
            invalid(
                "spec.template.spec.activeDeadlineSeconds",
                spec.template.spec.active_deadline_seconds,
                "activeDeadlineSeconds in ReplicaSet is not Supported",
            )
        )
    strategy = spec.strategy
    if strategy is not None:
        if strategy.type == "Recreate":
            if strategy.rolling_update is not None:
                errs.append(
                    forbidden(
                        "spec.strategy.rollingUpdate",
                        "may not be specified when strategy `type` is 'Recreate'",
                    )
                )
        elif strategy.type in (None, "RollingUpdate"):
            ru = strategy.rolling_update
            if ru is not None:
                _validate_int_or_percent(
                    ru.max_unavailable, "spec.strategy.rollingUpdate.maxUnavailable", errs
                )
                _validate_int_or_percent(ru.max_surge, "spec.strategy.rollingUpdate.maxSurge", errs)
                # Unset means the 25% default, which is not zero.
                if (
                    ru.max_unavailable is not None
                    and ru.max_surge is not None
                    and _is_zero(ru.max_unavailable)
                    and _is_zero(ru.max_surge)
                ):
                    errs.append(
                        invalid(
                            "spec.strategy.rollingUpdate.maxUnavailable",
                            Unquoted(str(ru.max_unavailable)),
                            "may not be 0 when `maxSurge` is 0",
                        )
                    )
                _not_more_than_100_percent(
                    ru.max_unavailable, "spec.strategy.rollingUpdate.maxUnavailable", errs
                )
        else:
            errs.append(not_supported("spec.strategy.type", strategy.type, ["Recreate", "RollingUpdate"]))
    _nonneg(spec.min_ready_seconds, "spec.minReadySeconds", errs)
    _nonneg(spec.revision_history_limit, "spec.revisionHistoryLimit", errs)
    if spec.progress_deadline_seconds is not None:
        _nonneg(spec.progress_deadline_seconds, "spec.progressDeadlineSeconds", errs)
        if spec.progress_deadline_seconds <= (spec.min_ready_seconds or 0):
            errs.append(
                invalid(
                    "spec.progressDeadlineSeconds",
                    spec.progress_deadline_seconds,
                    "must be greater than minReadySeconds",
                )
            )


def _validate_replica_set(rs: k8s.ReplicaSet, errs: Errs) -> None:
    validate_object_meta(rs.metadata, errs)
    spec = rs.spec
    _nonneg(spec.replicas, "spec.replicas", errs)
    _nonneg(spec.min_ready_seconds, "spec.minReadySeconds", errs)
    usable = _validate_replicated_selector(spec.selector, "spec.selector", errs)
    _validate_template_for_controller(
        spec.template, spec.selector, usable, "spec.template", errs, restart_policies=["Always"]
    )
    if (
        spec.template is not None
        and spec.template.spec is not None
        and spec.template.spec.active_deadline_seconds is not None
    ):
        errs.append(
            invalid(
                "spec.template.spec.activeDeadlineSeconds",
                spec.template.spec.active_deadline_seconds,
                "activeDeadlineSeconds in ReplicaSet is not Supported",
            )
        )


def _validate_selector_immutable(new: Any, old: Any, errs: Errs) -> None:
    _immutable(new.spec.selector, old.spec.selector, "spec.selector", errs)


def _validate_job(job: k8s.Job, errs: Errs) -> None:
    validate_object_meta(job.metadata, errs)
    spec = job.spec
    if spec is None:
        errs.append(required("spec.template"))
        return
    for attr, alias in (
        ("parallelism", "parallelism"),
        ("completions", "completions"),
        ("backoff_limit", "backoffLimit"),
        ("backoff_limit_per_index", "backoffLimitPerIndex"),
        ("max_failed_indexes", "maxFailedIndexes"),
        ("ttl_seconds_after_finished", "ttlSecondsAfterFinished"),
    ):
        _nonneg(getattr(spec, attr), f"spec.{alias}", errs)
    if spec.active_deadline_seconds is not None and spec.active_deadline_seconds <= 0:
        # Kubernetes accepts 0, which fails the job the moment it starts; we reject it.
        errs.append(
            invalid("spec.activeDeadlineSeconds", spec.active_deadline_seconds, "must be greater than zero")
        )
    if spec.completion_mode is not None:
        if spec.completion_mode not in ("NonIndexed", "Indexed"):
            errs.append(not_supported("spec.completionMode", spec.completion_mode, ["NonIndexed", "Indexed"]))
        elif spec.completion_mode == "Indexed" and spec.completions is None:
            errs.append(required("spec.completions", "when completion mode is Indexed"))
    if spec.backoff_limit_per_index is not None and spec.completion_mode != "Indexed":
        errs.append(
            required("spec.completionMode", "when backoffLimitPerIndex is specified, must be Indexed")
        )
    usable = True
    if spec.selector is not None:
        usable = validate_label_selector(spec.selector, "spec.selector", errs)
    _validate_template_for_controller(
        spec.template, spec.selector, usable, "spec.template", errs, restart_policies=["OnFailure", "Never"]
    )


def _without_scheduling_directives(template: k8s.PodTemplateSpec) -> k8s.PodTemplateSpec:
    meta = template.metadata.model_copy(update={"labels": None, "annotations": None}) if template.metadata else None
    spec = (template.spec.model_copy(update={"node_selector": None, "tolerations": None, "scheduling_gates": None})
            if template.spec else None)
    return template.model_copy(update={"metadata": meta, "spec": spec})


def _validate_job_update(new: k8s.Job, old: k8s.Job, errs: Errs) -> None:
    if new.spec is None or old.spec is None:
        return
    _immutable(new.spec.selector, old.spec.selector, "spec.selector", errs)
    if old.spec.suspend and new.spec.template is not None and old.spec.template is not None:
        # Kubernetes lets a queue steer a suspended Job before it starts (KEP-2926): the
        # template's node selector, tolerations, labels, annotations and scheduling gates.
        _immutable(_without_scheduling_directives(new.spec.template),
                   _without_scheduling_directives(old.spec.template), "spec.template", errs)
    else:
        _immutable(new.spec.template, old.spec.template, "spec.template", errs)
    _immutable(new.spec.completion_mode, old.spec.completion_mode, "spec.completionMode", errs)
    # An Indexed job may be resized when completions moves together with parallelism.
    elastic = new.spec.completion_mode == "Indexed" and new.spec.completions == new.spec.parallelism
    if not elastic:
        _immutable(new.spec.completions, old.spec.completions, "spec.completions", errs)


# --- services ---------------------------------------------------------------------------

SERVICE_TYPES = ["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"]
SESSION_AFFINITIES = ["ClientIP", "None"]


def _valid_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _validate_service(svc: k8s.Service, errs: Errs) -> None:
    validate_object_meta(svc.metadata, errs, name_fn=name_is_dns1035_label)
    spec = svc.spec or k8s.ServiceSpec()
    headless = spec.cluster_ip == "None"
    ports = spec.ports or []
    _enum(spec.type, "spec.type", SERVICE_TYPES, errs)
    if not ports and not headless and spec.type != "ExternalName":
        errs.append(required("spec.ports"))
    if spec.type == "ExternalName":
        cname = (spec.external_name or "").removesuffix(".")
        if cname:
            _names(cname, "spec.externalName", is_dns1123_subdomain, errs)
        else:
            errs.append(required("spec.externalName"))
    if spec.cluster_ip not in (None, "", "None") and not _valid_ip(spec.cluster_ip):
        errs.append(
            invalid(
                "spec.clusterIP",
                spec.cluster_ip,
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            )
        )
    if headless and spec.type in ("LoadBalancer", "NodePort"):
        errs.append(
            invalid("spec.clusterIP", spec.cluster_ip, f"may not be set to 'None' for {spec.type} services")
        )

    names: set[str] = set()
    seen_ports: set[tuple[str, int]] = set()
    seen_node_ports: set[tuple[str, int]] = set()
    for i, port in enumerate(ports):
        p = f"spec.ports[{i}]"
        if len(ports) > 1 and not port.name:
            errs.append(required(f"{p}.name"))
        elif port.name:
            _names(port.name, f"{p}.name", is_dns1123_label, errs)
            if port.name in names:
                errs.append(duplicate(f"{p}.name", port.name))
            names.add(port.name)
        errs.extend(invalid(f"{p}.port", port.port, m) for m in is_valid_port_num(port.port))
        _enum(port.protocol, f"{p}.protocol", PORT_PROTOCOLS, errs)
        target = _int_or_string(port.target_port, f"{p}.targetPort", errs)
        if target not in (None, 0, ""):
            _validate_port_num_or_name(target, f"{p}.targetPort", errs)
        if port.app_protocol is not None:
            _names(port.app_protocol, f"{p}.appProtocol", is_qualified_name, errs)
        protocol = port.protocol or "TCP"
        if (protocol, port.port) in seen_ports:
            errs.append(duplicate(p, Unquoted(f"{port.port}/{protocol}")))
        seen_ports.add((protocol, port.port))
        if port.node_port:
            if spec.type in (None, "ClusterIP"):
                errs.append(forbidden(f"{p}.nodePort", "may not be used when `type` is 'ClusterIP'"))
            elif not NODE_PORT_RANGE[0] <= port.node_port <= NODE_PORT_RANGE[1]:
                errs.append(
                    invalid(
                        f"{p}.nodePort",
                        port.node_port,
                        "provided port is not in the valid range. The range of valid ports is "
                        f"{NODE_PORT_RANGE[0]}-{NODE_PORT_RANGE[1]}",
                    )
                )
            if (protocol, port.node_port) in seen_node_ports:
                errs.append(duplicate(f"{p}.nodePort", port.node_port))
            seen_node_ports.add((protocol, port.node_port))

    if spec.selector is not None:
        validate_labels(spec.selector, "spec.selector", errs)
    _enum(spec.session_affinity, "spec.sessionAffinity", SESSION_AFFINITIES, errs)
    if spec.session_affinity == "None" and spec.session_affinity_config is not None:
        errs.append(forbidden("spec.sessionAffinityConfig", "must not be set when session affinity is None"))
    for i, ip in enumerate(spec.external_ips or []):
        if not _valid_ip(ip):
            errs.append(
                invalid(
                    f"spec.externalIPs[{i}]",
                    ip,
                    "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                )
            )


def _validate_service_update(new: k8s.Service, old: k8s.Service, errs: Errs) -> None:
    new_ip = new.spec.cluster_ip if new.spec else None
    old_ip = old.spec.cluster_ip if old.spec else None
    # An update that leaves clusterIP out keeps the allocated one (the server copies it over).
    if old_ip and new_ip and new_ip != old_ip:
        errs.append(invalid("spec.clusterIP", new_ip, "field is immutable"))


# --- autoscaling ------------------------------------------------------------------------

METRIC_SOURCE_TYPES = ["Object", "Pods", "Resource", "External", "ContainerResource"]
METRIC_TARGET_TYPES = ["Utilization", "Value", "AverageValue"]
SELECT_POLICIES = ["Max", "Min", "Disabled"]
SCALING_POLICY_TYPES = ["Pods", "Percent"]
MAX_PERIOD_SECONDS = 1800
MAX_STABILIZATION_WINDOW_SECONDS = 3600
_METRIC_SOURCE_ATTRS = {
    "Object": ("object", "object"),
    "Pods": ("pods", "pods"),
    "Resource": ("resource", "resource"),
    "External": ("external", "external"),
    "ContainerResource": ("container_resource", "containerResource"),
}
_TARGET_FIELD_FOR_TYPE = {
    "Utilization": ("average_utilization", "averageUtilization"),
    "Value": ("value", "value"),
    "AverageValue": ("average_value", "averageValue"),
}


def _validate_cross_version_ref(ref: Any, path: str, errs: Errs) -> None:
    if ref is None:
        errs.append(required(path))
        return
    for attr in ("kind", "name"):
        value = getattr(ref, attr)
        if not value:
            errs.append(required(f"{path}.{attr}"))
        else:
            _names(value, f"{path}.{attr}", is_valid_path_segment_name, errs)


def _validate_metric_target(target: k8s.MetricTarget, path: str, errs: Errs) -> None:
    if not target.type:
        errs.append(required(f"{path}.type", "must specify a metric target type"))
    elif target.type not in METRIC_TARGET_TYPES:
        errs.append(
            invalid(f"{path}.type", target.type, "must be either Utilization, Value, or AverageValue")
        )
    for attr, alias in (("value", "value"), ("average_value", "averageValue")):
        raw = getattr(target, attr)
        if raw is not None:
            q = _quantity(raw, f"{path}.{alias}", errs)
            if q is not None and q <= 0:
                errs.append(invalid(f"{path}.{alias}", Unquoted(raw), "must be positive"))
    if target.average_utilization is not None and target.average_utilization < 1:
        errs.append(
            invalid(f"{path}.averageUtilization", target.average_utilization, "must be greater than 0")
        )


def _target_matches_type(target: k8s.MetricTarget, path: str, errs: Errs) -> None:
    """Deliberately stricter than Kubernetes, which ignores a target value its type never reads."""
    attr_alias = _TARGET_FIELD_FOR_TYPE.get(target.type)
    if attr_alias is not None and getattr(target, attr_alias[0]) is None:
        errs.append(required(f"{path}.{attr_alias[1]}", f"must be set when `type` is '{target.type}'"))


def _validate_metric(metric: k8s.MetricSpec, path: str, errs: Errs) -> None:
    if not metric.type:
        errs.append(required(f"{path}.type", "must specify a metric source type"))
    elif metric.type not in METRIC_SOURCE_TYPES:
        errs.append(not_supported(f"{path}.type", metric.type, METRIC_SOURCE_TYPES))
    present = [
        (attr, alias) for attr, alias in _METRIC_SOURCE_ATTRS.values() if getattr(metric, attr) is not None
    ]
    expected = _METRIC_SOURCE_ATTRS.get(metric.type)
    if expected is not None and getattr(metric, expected[0]) is None:
        errs.append(
            required(f"{path}.{expected[1]}", "must populate information for the given metric source")
        )
    if len(present) > 1:
        for attr, alias in present:
            if expected is None or attr != expected[0]:
                errs.append(forbidden(f"{path}.{alias}", "must populate the given metric source only"))
    if expected is None:
        return
    source = getattr(metric, expected[0])
    if source is None:
        return
    sp = f"{path}.{expected[1]}"
    tp = f"{sp}.target"
    before = len(errs)
    target = source.target
    if metric.type in ("Resource", "ContainerResource"):
        if not source.name:
            errs.append(required(f"{sp}.name", "must specify a resource name"))
        else:
            _validate_resource_name(source.name, f"{sp}.name", errs)
        if metric.type == "ContainerResource":
            if not source.container:
                errs.append(required(f"{sp}.container", "must specify a container"))
            else:
                _names(source.container, f"{sp}.container", is_dns1123_label, errs)
        if target.average_utilization is None and target.average_value is None:
            errs.append(
                required(
                    f"{tp}.averageUtilization", "must set either a target raw value or a target utilization"
                )
            )
        elif target.average_utilization is not None and target.average_value is not None:
            errs.append(
                forbidden(
                    f"{tp}.averageValue", "may not set both a target raw value and a target utilization"
                )
            )
    else:
        if not source.metric.name:
            errs.append(required(f"{sp}.metric.name", "must specify a metric name"))
        validate_label_selector(source.metric.selector, f"{sp}.metric.selector", errs)
        if metric.type == "Pods":
            if target.average_value is None:
                errs.append(required(f"{tp}.averageValue", "must specify a positive target averageValue"))
        elif metric.type == "Object":
            _validate_cross_version_ref(source.described_object, f"{sp}.describedObject", errs)
            if target.value is None and target.average_value is None:
                errs.append(required(f"{tp}.averageValue", "must set either a target value or averageValue"))
        elif metric.type == "External":
            if target.value is None and target.average_value is None:
                errs.append(
                    required(
                        f"{tp}.averageValue", "must set either a target value for metric or a per-pod target"
                    )
                )
            elif target.value is not None and target.average_value is not None:
                errs.append(
                    forbidden(
                        f"{tp}.value", "may not set both a target value for metric and a per-pod target"
                    )
                )
    _validate_metric_target(target, tp, errs)
    if len(errs) == before:
        _target_matches_type(target, tp, errs)


def _validate_scaling_rules(rules: k8s.HPAScalingRules | None, path: str, errs: Errs) -> None:
    if rules is None:
        return
    window = rules.stabilization_window_seconds
    if window is not None and window < 0:
        errs.append(
            invalid(f"{path}.stabilizationWindowSeconds", window, "must be greater than or equal to zero")
        )
    if window is not None and window > MAX_STABILIZATION_WINDOW_SECONDS:
        errs.append(
            invalid(
                f"{path}.stabilizationWindowSeconds",
                window,
                f"must be less than or equal to {MAX_STABILIZATION_WINDOW_SECONDS}",
            )
        )
    if rules.select_policy is not None and rules.select_policy not in SELECT_POLICIES:
        errs.append(not_supported(f"{path}.selectPolicy", rules.select_policy, SELECT_POLICIES))
    if rules.policies is not None and not rules.policies:
        errs.append(required(f"{path}.policies", "must specify at least one Policy"))
    for i, policy in enumerate(rules.policies or []):
        p = f"{path}.policies[{i}]"
        if policy.type not in SCALING_POLICY_TYPES:
            errs.append(not_supported(f"{p}.type", policy.type, SCALING_POLICY_TYPES))
        if policy.value <= 0:
            errs.append(invalid(f"{p}.value", policy.value, "must be greater than zero"))
        if policy.period_seconds <= 0:
            errs.append(invalid(f"{p}.periodSeconds", policy.period_seconds, "must be greater than zero"))
        if policy.period_seconds > MAX_PERIOD_SECONDS:
            errs.append(
                invalid(
                    f"{p}.periodSeconds",
                    policy.period_seconds,
                    f"must be less than or equal to {MAX_PERIOD_SECONDS}",
                )
            )
    if rules.tolerance is not None:
        q = _quantity(rules.tolerance, f"{path}.tolerance", errs)
        if q is not None and q < 0:
            errs.append(
                invalid(f"{path}.tolerance", Unquoted(rules.tolerance), "must be greater than or equal to 0")
            )


def _validate_hpa(hpa: k8s.HorizontalPodAutoscaler, errs: Errs) -> None:
    validate_object_meta(hpa.metadata, errs)
    spec = hpa.spec
    # Deliberate difference: Kubernetes requires minReplicas >= 1 unless the alpha
    # HPAScaleToZero gate is on. gpufleet scales model servers to zero, so 0 is allowed.
    if spec.min_replicas is not None and spec.min_replicas < 0:
        errs.append(invalid("spec.minReplicas", spec.min_replicas, "must be greater than or equal to 0"))
    if spec.max_replicas < 1:
        errs.append(invalid("spec.maxReplicas", spec.max_replicas, "must be greater than 0"))
    if spec.min_replicas is not None and spec.max_replicas < spec.min_replicas:
        errs.append(
            invalid("spec.maxReplicas", spec.max_replicas, "must be greater than or equal to `minReplicas`")
        )
    # Kubernetes stops after the first failing group (ref, metrics, behavior); all are reported here.
    _validate_cross_version_ref(spec.scale_target_ref, "spec.scaleTargetRef", errs)
    for i, metric in enumerate(spec.metrics or []):
        _validate_metric(metric, f"spec.metrics[{i}]", errs)
    if spec.behavior is not None:
        _validate_scaling_rules(spec.behavior.scale_up, "spec.behavior.scaleUp", errs)
        _validate_scaling_rules(spec.behavior.scale_down, "spec.behavior.scaleDown", errs)


# --- policy -----------------------------------------------------------------------------


def _validate_pdb(pdb: k8s.PodDisruptionBudget, errs: Errs) -> None:
    validate_object_meta(pdb.metadata, errs)
    spec = pdb.spec
    if spec is None:
        return
    if spec.min_available is not None and spec.max_unavailable is not None:
        errs.append(
            invalid(
                "spec.minAvailable",
                Unquoted(str(spec.min_available)),
                "minAvailable and maxUnavailable cannot be both set",
            )
        )
    for attr, alias in (("min_available", "minAvailable"), ("max_unavailable", "maxUnavailable")):
        value = getattr(spec, attr)
        if value is not None:
            _validate_int_or_percent(value, f"spec.{alias}", errs)
            _not_more_than_100_percent(value, f"spec.{alias}", errs)
    validate_label_selector(spec.selector, "spec.selector", errs)
    if spec.unhealthy_pod_eviction_policy is not None:
        _enum(
            spec.unhealthy_pod_eviction_policy,
            "spec.unhealthyPodEvictionPolicy",
            ["AlwaysAllow", "IfHealthyBudget"],
            errs,
        )


# --- quota and limits -------------------------------------------------------------------

QUOTA_SCOPES = [
    "BestEffort",
    "CrossNamespacePodAffinity",
    "NotBestEffort",
    "NotTerminating",
    "PriorityClass",
    "Terminating",
    "VolumeAttributesClass",
]
LIMIT_TYPES = ["Container", "Pod", "PersistentVolumeClaim"]


def _is_standard_quota_resource(name: str) -> bool:
    return (
        name in STANDARD_QUOTA_RESOURCES
        or is_hugepages_resource(name)
        or name.startswith("requests.hugepages-")
    )


def _validate_resource_quota(rq: k8s.ResourceQuota, errs: Errs) -> None:
    validate_object_meta(rq.metadata, errs)
    spec = rq.spec
    if spec is None:
        return
    for name, raw in (spec.hard or {}).items():
        p = f"spec.hard[{name}]"
        if (
            _validate_resource_name(name, p, errs)
            and "/" not in name
            and not _is_standard_quota_resource(name)
        ):
            errs.append(invalid(p, name, "must be a standard resource for quota"))
        elif not name.startswith(("requests.", "count/")) and is_extended_resource(name.removeprefix("limits.")):
            # Kubernetes accepts these and then never enforces them: an extended resource
            # cannot be overcommitted, so only its requests are counted.
            bare = name.removeprefix("limits.")
            errs.append(invalid(p, name, f"quota of an extended resource must be written requests.{bare}"))
        _validate_quantity_value(name, raw, p, errs)
    scopes = spec.scopes or []
    for scope in scopes:
        if scope not in QUOTA_SCOPES:
            errs.append(invalid("spec.scopes", scopes, "unsupported scope"))
    for pair in (("BestEffort", "NotBestEffort"), ("Terminating", "NotTerminating")):
        if set(pair) <= set(scopes):
            errs.append(invalid("spec.scopes", scopes, "conflicting scopes"))


def _pick(
    parsed: dict[str, dict[str, Fraction]], raw: dict[str, dict[str, str]], attr: str, name: str
) -> tuple[Fraction | None, str]:
    return parsed.get(attr, {}).get(name), raw.get(attr, {}).get(name, "")


def _validate_limit_range(lr: k8s.LimitRange, errs: Errs) -> None:
    validate_object_meta(lr.metadata, errs)
    if lr.spec is None:
        return
    seen_types: set[str] = set()
    for i, item in enumerate(lr.spec.limits):
        p = f"spec.limits[{i}]"
        # Deliberate difference: Kubernetes also accepts any domain-prefixed type name,
        # which nothing here would ever enforce.
        if item.type not in LIMIT_TYPES:
            errs.append(not_supported(f"{p}.type", item.type, LIMIT_TYPES))
        elif item.type in seen_types:
            errs.append(duplicate(f"{p}.type", item.type))
        seen_types.add(item.type)

        parsed: dict[str, dict[str, Fraction]] = {}
        raw: dict[str, dict[str, str]] = {}
        for attr, alias in (
            ("max", "max"),
            ("min", "min"),
            ("default", "default"),
            ("default_request", "defaultRequest"),
            ("max_limit_request_ratio", "maxLimitRequestRatio"),
        ):
            values = getattr(item, attr) or {}
            if item.type == "Pod" and attr in ("default", "default_request"):
                if values:
                    errs.append(forbidden(f"{p}.{alias}", "may not be specified when `type` is 'Pod'"))
                continue
            parsed[attr], raw[attr] = {}, {}
            for name, value in values.items():
                rp = f"{p}.{alias}[{name}]"
                _validate_resource_name(name, rp, errs)
                q = _validate_quantity_value(name, value, rp, errs)
                if q is not None:
                    parsed[attr][name], raw[attr][name] = q, str(value)
        if (
            item.type == "PersistentVolumeClaim"
            and "storage" not in (item.min or {})
            and "storage" not in (item.max or {})
        ):
            errs.append(
                required(
                    f"{p}.limits",
                    "either minimum or maximum storage value is required, but neither was provided",
                )
            )

        names = sorted(set().union(*(v.keys() for v in parsed.values())))
        for name in names:
            mn, mn_s = _pick(parsed, raw, "min", name)
            mx, mx_s = _pick(parsed, raw, "max", name)
            df, df_s = _pick(parsed, raw, "default", name)
            dr, dr_s = _pick(parsed, raw, "default_request", name)
            ratio, ratio_s = _pick(parsed, raw, "max_limit_request_ratio", name)
            if mn is not None and mx is not None and mn > mx:
                errs.append(
                    invalid(
                        f"{p}.min[{name}]",
                        Unquoted(mn_s),
                        f"min value {mn_s} is greater than max value {mx_s}",
                    )
                )
            if dr is not None and mn is not None and mn > dr:
                errs.append(
                    invalid(
                        f"{p}.defaultRequest[{name}]",
                        Unquoted(dr_s),
                        f"min value {mn_s} is greater than default request value {dr_s}",
                    )
                )
            if dr is not None and mx is not None and dr > mx:
                errs.append(
                    invalid(
                        f"{p}.defaultRequest[{name}]",
                        Unquoted(dr_s),
                        f"default request value {dr_s} is greater than max value {mx_s}",
                    )
                )
            if dr is not None and df is not None and dr > df:
                errs.append(
                    invalid(
                        f"{p}.defaultRequest[{name}]",
                        Unquoted(dr_s),
                        f"default request value {dr_s} is greater than default limit value {df_s}",
                    )
                )
            if df is not None and mn is not None and mn > df:
                errs.append(
                    invalid(
                        f"{p}.default[{name}]",
                        Unquoted(mn_s),
                        f"min value {mn_s} is greater than default value {df_s}",
                    )
                )
            if df is not None and mx is not None and df > mx:
                errs.append(
                    invalid(
                        f"{p}.default[{name}]",
                        Unquoted(mx_s),
                        f"default value {df_s} is greater than max value {mx_s}",
                    )
                )
            if ratio is not None and ratio < 1:
                errs.append(
                    invalid(
                        f"{p}.maxLimitRequestRatio[{name}]",
                        Unquoted(ratio_s),
                        f"ratio {ratio_s} is less than 1",
                    )
                )
            if ratio is not None and mn is not None and mx is not None and mn > 0 and ratio > mx / mn:
                errs.append(
                    invalid(
                        f"{p}.maxLimitRequestRatio[{name}]",
                        Unquoted(ratio_s),
                        f"ratio {ratio_s} is greater than max/min = {float(mx / mn):f}",
                    )
                )


# --- cluster objects --------------------------------------------------------------------


def _validate_priority_class(pc: k8s.PriorityClass, errs: Errs) -> None:
    validate_object_meta(pc.metadata, errs, namespaced=False)
    name = pc.metadata.name if pc.metadata is not None else None
    value = pc.value or 0
    if name and name.startswith("system-"):
        known = SYSTEM_PRIORITY_CLASSES.get(name)
        if known is None:
            problem = f"{name} is not a known system priority class"
        elif known != value:
            problem = f"value of {name} PriorityClass must be {known}"
        else:
            problem = ""
        if problem:
            errs.append(
                forbidden(
                    "metadata.name",
                    f"priority class names with 'system-' prefix are reserved for system use only. error: {problem}",
                )
            )
    elif value > HIGHEST_USER_PRIORITY:
        errs.append(
            forbidden("value", f"maximum allowed value of a user defined priority is {HIGHEST_USER_PRIORITY}")
        )
    if pc.preemption_policy is not None:
        _enum(pc.preemption_policy, "preemptionPolicy", PREEMPTION_POLICIES, errs)


def _validate_priority_class_update(new: k8s.PriorityClass, old: k8s.PriorityClass, errs: Errs) -> None:
    if (new.value or 0) != (old.value or 0):
        errs.append(forbidden("value", "may not be changed in an update."))
    if new.preemption_policy is not None:
        _immutable(new.preemption_policy, old.preemption_policy, "preemptionPolicy", errs)


def _validate_namespace(ns: k8s.Namespace, errs: Errs) -> None:
    validate_object_meta(ns.metadata, errs, name_fn=name_is_dns_label, namespaced=False)
    for i, name in enumerate(ns.spec.finalizers or [] if ns.spec else []):
        p = f"spec.finalizers[{i}]"
        _names(name, p, is_qualified_name, errs)
        if "/" not in name and name not in STANDARD_FINALIZERS:
            errs.append(
                invalid(p, name, "name is neither a standard finalizer name nor is it fully qualified")
            )


def _validate_node(node: k8s.Node, errs: Errs) -> None:
    validate_object_meta(node.metadata, errs, namespaced=False)
    seen: set[tuple[str, str]] = set()
    for i, taint in enumerate(node.spec.taints or [] if node.spec else []):
        p = f"spec.taints[{i}]"
        _names(taint.key, f"{p}.key", is_qualified_name, errs)
        msgs = is_label_value(taint.value or "")
        if msgs:
            errs.append(invalid(f"{p}.value", taint.value, ";".join(msgs)))
        _validate_taint_effect(taint.effect, f"{p}.effect", errs)
        key = (taint.key, taint.effect)
        if key in seen:
            errs.append(duplicate(p, taint, "taints must be unique by key and effect pair"))
        seen.add(key)
    if node.status is not None:
        for attr in ("capacity", "allocatable"):
            for name, raw in (getattr(node.status, attr) or {}).items():
                p = f"status.{attr}[{name}]"
                _validate_resource_name(name, p, errs)
                _validate_quantity_value(name, raw, p, errs)


def validate_non_special_ip(ip: str, path: str) -> list[FieldError]:
    """Kubernetes' ValidateNonSpecialIP: an address that is not node-centric (unspecified,
    loopback, link-local unicast or multicast: the node itself, its metadata service)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return [invalid(path, ip, "must be a valid IP address")]
    out = []
    if addr.is_unspecified:
        out.append(invalid(path, ip, f"may not be unspecified ({ip})"))
    if addr.is_loopback or (addr.version == 6 and addr.ipv4_mapped is not None and addr.ipv4_mapped.is_loopback):
        out.append(invalid(path, ip, "may not be in the loopback range (127.0.0.0/8, ::1/128)"))
    if addr.is_link_local and not addr.is_multicast:
        out.append(invalid(path, ip, "may not be in the link-local range (169.254.0.0/16, fe80::/10)"))
    if addr.is_multicast and addr in (_LL_MULTICAST_V4 if addr.version == 4 else _LL_MULTICAST_V6):
        out.append(invalid(path, ip, "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"))
    return out


_LL_MULTICAST_V4 = ipaddress.ip_network("224.0.0.0/24")
_LL_MULTICAST_V6 = ipaddress.ip_network("ff02::/16")


def endpoints_addresses(ep: dict[str, Any]) -> list[tuple[str, str]]:
    """(field path, ip) of every address of an Endpoints object (ready and not ready)."""
    out = []
    for i, subset in enumerate(ep.get("subsets") or [] if isinstance(ep.get("subsets"), list) else []):
        if not isinstance(subset, dict):
            continue
        for attr in ("addresses", "notReadyAddresses"):
            for j, addr in enumerate(subset.get(attr) or [] if isinstance(subset.get(attr), list) else []):
                if isinstance(addr, dict):
                    out.append((f"subsets[{i}].{attr}[{j}].ip", str(addr.get("ip") or "")))
    return out


def _validate_endpoints(ep: k8s.Endpoints, errs: Errs) -> None:
    """As Kubernetes' validateEndpointAddress and validateEndpointPort, less the node-centric
    ranges: those the EndpointsAddresses admission plugin refuses (its docstring says why)."""
    validate_object_meta(ep.metadata, errs)
    for i, subset in enumerate(ep.subsets or []):
        for attr, addresses in (("addresses", subset.addresses), ("notReadyAddresses", subset.not_ready_addresses)):
            for j, addr in enumerate(addresses or []):
                p = f"subsets[{i}].{attr}[{j}]"
                if not _valid_ip(addr.ip):
                    errs.append(invalid(f"{p}.ip", addr.ip, "must be a valid IP address"))
                if addr.hostname:
                    for msg in is_dns1123_label(addr.hostname):
                        errs.append(invalid(f"{p}.hostname", addr.hostname, msg))
        for k, port in enumerate(subset.ports or []):
            for msg in is_valid_port_num(port.port):
                errs.append(invalid(f"subsets[{i}].ports[{k}].port", port.port, msg))


def _validate_lease(lease: k8s.Lease, errs: Errs) -> None:
    validate_object_meta(lease.metadata, errs)
    spec = lease.spec
    if spec is None:
        return
    if spec.lease_duration_seconds is not None and spec.lease_duration_seconds <= 0:
        errs.append(
            invalid("spec.leaseDurationSeconds", spec.lease_duration_seconds, "must be greater than 0")
        )
    _nonneg(spec.lease_transitions, "spec.leaseTransitions", errs)


def _validate_event(event: k8s.Event, errs: Errs) -> None:
    validate_object_meta(event.metadata, errs)
    ref = event.involved_object
    if ref is None:
        errs.append(required("involvedObject"))
    else:
        namespace = event.metadata.namespace if event.metadata is not None else None
        # An event about a cluster-scoped object lives in "default" (or nowhere), as in Kubernetes.
        if namespace:
            if ref.namespace and ref.namespace != namespace:
                errs.append(
                    invalid("involvedObject.namespace", ref.namespace, "does not match event.namespace")
                )
            if not ref.namespace and namespace != "default":
                errs.append(invalid("involvedObject.namespace", "", "does not match event.namespace"))
    if event.type is not None:
        _enum(event.type, "type", ["Normal", "Warning"], errs)
    _nonneg(event.count, "count", errs)


def _validate_config_map(cm: k8s.ConfigMap, errs: Errs) -> None:
    validate_object_meta(cm.metadata, errs)
    total = 0
    for key, value in (cm.data or {}).items():
        _names(key, f"data[{key}]", is_config_map_key, errs)
        if key in (cm.binary_data or {}):
            errs.append(invalid(f"data[{key}]", key, "duplicate of key present in binaryData"))
        total += len(value.encode())
    for key, value in (cm.binary_data or {}).items():
        _names(key, f"binaryData[{key}]", is_config_map_key, errs)
        total += len(value)
    if total > MAX_SECRET_SIZE:
        errs.append(too_long("", MAX_SECRET_SIZE))


def _validate_immutable_data(new: Any, old: Any, attrs: Iterable[tuple[str, str]], errs: Errs) -> None:
    if not old.immutable:
        return
    if not new.immutable:
        errs.append(forbidden("immutable", "field is immutable when `immutable` is set"))
    for attr, alias in attrs:
        if (getattr(new, attr) or {}) != (getattr(old, attr) or {}):
            errs.append(forbidden(alias, "field is immutable when `immutable` is set"))


_SECRET_REQUIRED_KEYS = {
    "kubernetes.io/tls": ["tls.crt", "tls.key"],
    "kubernetes.io/dockerconfigjson": [".dockerconfigjson"],
    "kubernetes.io/ssh-auth": ["ssh-privatekey"],
}


def _validate_secret(secret: k8s.Secret, errs: Errs) -> None:
    validate_object_meta(secret.metadata, errs)
    total = 0
    data = secret.data or {}
    for key, value in data.items():
        _names(key, f"data[{key}]", is_config_map_key, errs)
        try:
            total += len(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            errs.append(invalid(f"data[{key}]", "<secret contents redacted>", "must be base64-encoded"))
    for key, value in (secret.string_data or {}).items():
        _names(key, f"stringData[{key}]", is_config_map_key, errs)
        total += len(value.encode())
    if total > MAX_SECRET_SIZE:
        errs.append(too_long("data", MAX_SECRET_SIZE))
    keys = set(data) | set(secret.string_data or {})
    for needed in _SECRET_REQUIRED_KEYS.get(secret.type or "", []):
        if needed not in keys:
            errs.append(required(f"data[{needed}]"))


def _validate_secret_update(new: k8s.Secret, old: k8s.Secret, errs: Errs) -> None:
    _immutable(new.type, old.type, "type", errs)
    _validate_immutable_data(new, old, [("data", "data")], errs)


def _validate_config_map_update(new: k8s.ConfigMap, old: k8s.ConfigMap, errs: Errs) -> None:
    _validate_immutable_data(new, old, [("data", "data"), ("binary_data", "binaryData")], errs)


def _validate_service_account(sa: k8s.ServiceAccount, errs: Errs) -> None:
    validate_object_meta(sa.metadata, errs)


# --- storage ----------------------------------------------------------------------------

ACCESS_MODES = ["ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"]
VOLUME_MODES = ["Block", "Filesystem"]
PV_RECLAIM_POLICIES = ["Delete", "Recycle", "Retain"]
CLASS_RECLAIM_POLICIES = ["Delete", "Retain"]
VOLUME_BINDING_MODES = ["Immediate", "WaitForFirstConsumer"]
HOST_PATH_TYPES = ["", "BlockDevice", "CharDevice", "Directory", "DirectoryOrCreate", "File", "FileOrCreate", "Socket"]
MAX_PROVISIONER_PARAMETERS = 512
MAX_PROVISIONER_PARAMETER_BYTES = 256 * 1024
_BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"
# PersistentVolumeSpec's volume sources (everything that is not a property of the volume).
_PV_NOT_SOURCES = {
    "access_modes", "capacity", "claim_ref", "mount_options", "node_affinity",
    "persistent_volume_reclaim_policy", "storage_class_name", "volume_attributes_class_name", "volume_mode",
}
_PV_SOURCES = [f for f in k8s.PersistentVolumeSpec.model_fields if f not in _PV_NOT_SOURCES]
PVC_IMMUTABLE_DETAIL = (
    "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"
)


def _no_backsteps(target: str, path: str, errs: Errs) -> None:
    if ".." in target.replace("\\", "/").split("/"):
        errs.append(invalid(path, target, "must not contain '..'"))


def _validate_host_path(source: k8s.HostPathVolumeSource, path: str, errs: Errs) -> None:
    if not source.path:
        errs.append(required(f"{path}.path"))
        return
    _no_backsteps(source.path, f"{path}.path", errs)
    if source.type is not None and source.type not in HOST_PATH_TYPES:
        errs.append(not_supported(f"{path}.type", source.type, HOST_PATH_TYPES))


def _validate_access_modes(modes: list[str] | None, path: str, errs: Errs, required_detail: str = "") -> None:
    if not modes:
        errs.append(required(path, required_detail))
    once_pod = other = False
    for mode in modes or []:
        if mode not in ACCESS_MODES:
            errs.append(not_supported(path, mode, ACCESS_MODES))
        elif mode == "ReadWriteOncePod":
            once_pod = True
        else:
            other = True
    if once_pod and other:
        errs.append(forbidden(path, "may not use ReadWriteOncePod with other access modes"))


def _positive_quantity(raw: Any, path: str, errs: Errs) -> Fraction | None:
    q = _quantity(raw, path, errs)
    if q is not None and q <= 0:
        errs.append(invalid(path, str(raw), "must be greater than zero"))
        return None
    return q


def _validate_node_selector(selector: k8s.NodeSelector, path: str, errs: Errs) -> None:
    tp = f"{path}.nodeSelectorTerms"
    if not selector.node_selector_terms:
        errs.append(required(tp, "must have at least one node selector term"))
    for i, term in enumerate(selector.node_selector_terms or []):
        for j, r in enumerate(term.match_expressions or []):
            _validate_node_selector_requirement(r, f"{tp}[{i}].matchExpressions[{j}]", errs)
        for j, r in enumerate(term.match_fields or []):
            fp = f"{tp}[{i}].matchFields[{j}]"
            if r.key != "metadata.name":
                errs.append(not_supported(f"{fp}.key", r.key, ["metadata.name"]))
            if r.operator in ("In", "NotIn"):
                if len(r.values or []) != 1:
                    errs.append(required(f"{fp}.values", "must be only one value when `operator` is 'In' or "
                                                          "'NotIn' for node field selector"))
            elif r.operator in ("Exists", "DoesNotExist", "Gt", "Lt"):
                errs.append(not_supported(f"{fp}.operator", r.operator, ["In", "NotIn"]))
            else:
                errs.append(invalid(f"{fp}.operator", r.operator, "not a valid selector operator"))


def _validate_storage_class_name(name: str | None, path: str, errs: Errs) -> None:
    if name:
        errs.extend(invalid(path, name, msg) for msg in name_is_dns_subdomain(name, False))


def _validate_pv(pv: k8s.PersistentVolume, errs: Errs) -> None:
    validate_object_meta(pv.metadata, errs, namespaced=False)
    spec = pv.spec or k8s.PersistentVolumeSpec()
    _validate_access_modes(spec.access_modes, "spec.accessModes", errs)
    capacity = spec.capacity or {}
    if not capacity:
        errs.append(required("spec.capacity"))
    if "storage" not in capacity or len(capacity) > 1:
        errs.append(not_supported("spec.capacity", capacity, ["storage"]))
    for name, raw in capacity.items():
        _positive_quantity(raw, f"spec.capacity[{name}]", errs)
    _validate_storage_class_name(spec.storage_class_name, "spec.storageClassName", errs)
    if spec.volume_mode is not None and spec.volume_mode not in VOLUME_MODES:
        errs.append(not_supported("spec.volumeMode", spec.volume_mode, VOLUME_MODES))
    policy = spec.persistent_volume_reclaim_policy
    if policy and policy not in PV_RECLAIM_POLICIES:
        errs.append(not_supported("spec.persistentVolumeReclaimPolicy", policy, PV_RECLAIM_POLICIES))
    has_affinity = spec.node_affinity is not None
    if spec.node_affinity is not None:
        if spec.node_affinity.required is None:
            errs.append(required("spec.nodeAffinity.required", "must specify required node constraints"))
        else:
            _validate_node_selector(spec.node_affinity.required, "spec.nodeAffinity.required", errs)
    sources = [attr for attr in _PV_SOURCES if getattr(spec, attr) is not None]
    if not sources:
        errs.append(required("spec", "must specify a volume type"))
    for attr in sources[1:]:
        errs.append(forbidden(f"spec.{_alias(k8s.PersistentVolumeSpec, attr)}", "may not specify more than 1 volume type"))
    if spec.host_path is not None:
        _validate_host_path(spec.host_path, "spec.hostPath", errs)
        if spec.host_path.path and spec.host_path.path.rstrip("/") == "" and policy == "Recycle":
            errs.append(forbidden("spec.persistentVolumeReclaimPolicy", "may not be 'recycle' for a hostPath mount of '/'"))
    if spec.local is not None:
        if not spec.local.path:
            errs.append(required("spec.local.path"))
        else:
            if not spec.local.path.startswith("/"):
                errs.append(invalid("spec.local.path", spec.local.path, "must be an absolute path"))
            _no_backsteps(spec.local.path, "spec.local.path", errs)
        if not has_affinity:
            errs.append(required("spec.nodeAffinity", "Local volume requires node affinity"))


def _pv_sources(spec: k8s.PersistentVolumeSpec | None) -> dict[str, Any]:
    spec = spec or k8s.PersistentVolumeSpec()
    return {_alias(k8s.PersistentVolumeSpec, a): _normalized(getattr(spec, a)) for a in _PV_SOURCES
            if getattr(spec, a) is not None}


def _validate_pv_update(new: k8s.PersistentVolume, old: k8s.PersistentVolume, errs: Errs) -> None:
    before, after = _pv_sources(old.spec), _pv_sources(new.spec)
    if before != after:
        changes: list[str] = []
        _diff(before, after, "spec", changes)
        errs.append(forbidden("spec.persistentvolumesource", "spec.persistentvolumesource is immutable after "
                              "creation\n" + "\n".join("  " + c for c in changes)))
    new_spec, old_spec = new.spec or k8s.PersistentVolumeSpec(), old.spec or k8s.PersistentVolumeSpec()
    _immutable(new_spec.volume_mode, old_spec.volume_mode, "spec.volumeMode", errs)
    if old_spec.node_affinity is not None:
        _immutable(new_spec.node_affinity, old_spec.node_affinity, "spec.nodeAffinity", errs)


def _validate_pvc_spec(spec: k8s.PersistentVolumeClaimSpec, path: str, errs: Errs) -> None:
    _validate_access_modes(spec.access_modes, f"{path}.accessModes", errs, "at least 1 access mode is required")
    if spec.selector is not None:
        validate_label_selector(spec.selector, f"{path}.selector", errs)
    requests = (spec.resources.requests if spec.resources is not None else None) or {}
    storage_path = f"{path}.resources[storage]"
    if "storage" not in requests:
        errs.append(required(storage_path))
    else:
        _positive_quantity(requests["storage"], storage_path, errs)
    _validate_storage_class_name(spec.storage_class_name, f"{path}.storageClassName", errs)
    if spec.volume_mode is not None and spec.volume_mode not in VOLUME_MODES:
        errs.append(not_supported(f"{path}.volumeMode", spec.volume_mode, VOLUME_MODES))
    for attr, alias in (("data_source", "dataSource"), ("data_source_ref", "dataSourceRef")):
        ref = getattr(spec, attr)
        if ref is None:
            continue
        if not ref.kind:
            errs.append(required(f"{path}.{alias}.kind"))
        if not ref.name:
            errs.append(required(f"{path}.{alias}.name"))


def _validate_pvc(pvc: k8s.PersistentVolumeClaim, errs: Errs) -> None:
    validate_object_meta(pvc.metadata, errs)
    _validate_pvc_spec(pvc.spec or k8s.PersistentVolumeClaimSpec(), "spec", errs)


def _storage_request(spec: k8s.PersistentVolumeClaimSpec) -> Fraction | None:
    raw = ((spec.resources.requests if spec.resources is not None else None) or {}).get("storage")
    try:
        return parse_quantity(raw) if raw is not None else None
    except ValueError:
        return None


def _validate_pvc_update(new: k8s.PersistentVolumeClaim, old: k8s.PersistentVolumeClaim, errs: Errs) -> None:
    new_spec = new.spec or k8s.PersistentVolumeClaimSpec()
    old_spec = old.spec or k8s.PersistentVolumeClaimSpec()
    new_ann = (new.metadata.annotations if new.metadata else None) or {}
    old_ann = (old.metadata.annotations if old.metadata else None) or {}
    if new_ann.get(_BETA_STORAGE_CLASS) != old_ann.get(_BETA_STORAGE_CLASS):
        errs.append(invalid(f"metadata.annotations.{_BETA_STORAGE_CLASS}", new_ann.get(_BETA_STORAGE_CLASS, ""),
                            "field is immutable"))
    after, before = _normalized(new_spec), _normalized(old_spec)
    # The PV controller binds a claim by naming its volume, once.
    if not before.get("volumeName"):
        before.pop("volumeName", None)
        after.pop("volumeName", None)
    # A claim created without any class may be given one later (the default class, set
    # retroactively once one exists), as Kubernetes allows since 1.28.
    if old_spec.storage_class_name is None and _BETA_STORAGE_CLASS not in old_ann:
        after.pop("storageClassName", None)
    # A bound claim grows by asking for more (the PersistentVolumeClaimResize admission
    # decides whether its class allows it).
    bound = new.status is not None and new.status.phase == "Bound"
    if bound:
        for spec in (before, after):
            requests = (spec.get("resources") or {}).get("requests") or {}
            requests.pop("storage", None)
        before, after = _normalized(before), _normalized(after)
    if before != after:
        changes: list[str] = []
        _diff(before, after, "spec", changes)
        errs.append(forbidden("spec", PVC_IMMUTABLE_DETAIL + "\n" + "\n".join("  " + c for c in changes)))
    old_size, new_size = _storage_request(old_spec), _storage_request(new_spec)
    if old_size is not None and new_size is not None and new_size < old_size:
        errs.append(forbidden("spec.resources.requests.storage", "field can not be less than previous value"))


def _validate_storage_class(sc: k8s.StorageClass, errs: Errs) -> None:
    validate_object_meta(sc.metadata, errs, namespaced=False)
    if not sc.provisioner:
        errs.append(required("provisioner"))
    else:
        _names(sc.provisioner.lower(), "provisioner", is_qualified_name, errs)
    params = sc.parameters or {}
    if len(params) > MAX_PROVISIONER_PARAMETERS:
        errs.append(too_long("parameters", MAX_PROVISIONER_PARAMETERS))
    else:
        total = 0
        for key, value in params.items():
            if not key:
                errs.append(invalid("parameters", key, "field can not be empty."))
            total += len(key) + len(value)
        if total > MAX_PROVISIONER_PARAMETER_BYTES:
            errs.append(too_long("parameters", MAX_PROVISIONER_PARAMETER_BYTES))
    if sc.reclaim_policy and sc.reclaim_policy not in CLASS_RECLAIM_POLICIES:
        errs.append(not_supported("reclaimPolicy", sc.reclaim_policy, CLASS_RECLAIM_POLICIES))
    if sc.volume_binding_mode is None:
        pass  # defaulted to Immediate before validation
    elif sc.volume_binding_mode not in VOLUME_BINDING_MODES:
        errs.append(not_supported("volumeBindingMode", sc.volume_binding_mode, VOLUME_BINDING_MODES))
    for i, term in enumerate(sc.allowed_topologies or []):
        tp = f"allowedTopologies[{i}].matchLabelExpressions"
        if not term.match_label_expressions:
            errs.append(required(tp, "must have at least one label expression"))
        keys: set[str] = set()
        for j, expr in enumerate(term.match_label_expressions or []):
            ep = f"{tp}[{j}]"
            _names(expr.key, f"{ep}.key", is_qualified_name, errs)
            if expr.key in keys:
                errs.append(duplicate(f"{ep}.key", expr.key))
            keys.add(expr.key)
            if not expr.values:
                errs.append(required(f"{ep}.values", "must specify as least one value"))
            for k, value in enumerate(expr.values or []):
                _names(value, f"{ep}.values[{k}]", is_label_value, errs)


def _validate_storage_class_update(new: k8s.StorageClass, old: k8s.StorageClass, errs: Errs) -> None:
    if (new.parameters or {}) != (old.parameters or {}):
        errs.append(forbidden("parameters", "updates to parameters are forbidden."))
    if new.provisioner != old.provisioner:
        errs.append(forbidden("provisioner", "updates to provisioner are forbidden."))
    if (new.reclaim_policy or "Delete") != (old.reclaim_policy or "Delete"):
        errs.append(forbidden("reclaimPolicy", "updates to reclaimPolicy are forbidden."))
    _immutable(new.volume_binding_mode, old.volume_binding_mode, "volumeBindingMode", errs)


# --- dispatch ---------------------------------------------------------------------------

CreateFn = Callable[[Any, Errs], None]
UpdateFn = Callable[[Any, Any, Errs], None]

_CREATE: dict[type, CreateFn] = {
    k8s.Pod: _validate_pod,
    k8s.Deployment: _validate_deployment,
    k8s.ReplicaSet: _validate_replica_set,
    k8s.Job: _validate_job,
    k8s.Service: _validate_service,
    k8s.HorizontalPodAutoscaler: _validate_hpa,
    k8s.PodDisruptionBudget: _validate_pdb,
    k8s.ResourceQuota: _validate_resource_quota,
    k8s.LimitRange: _validate_limit_range,
    k8s.PriorityClass: _validate_priority_class,
    k8s.Namespace: _validate_namespace,
    k8s.Node: _validate_node,
    k8s.Lease: _validate_lease,
    k8s.Endpoints: _validate_endpoints,
    k8s.Event: _validate_event,
    k8s.ConfigMap: _validate_config_map,
    k8s.Secret: _validate_secret,
    k8s.ServiceAccount: _validate_service_account,
    k8s.PersistentVolume: _validate_pv,
    k8s.PersistentVolumeClaim: _validate_pvc,
    k8s.StorageClass: _validate_storage_class,
}
_UPDATE: dict[type, UpdateFn] = {
    k8s.Pod: _validate_pod_update,
    k8s.Deployment: _validate_selector_immutable,
    k8s.ReplicaSet: _validate_selector_immutable,
    k8s.Job: _validate_job_update,
    k8s.Service: _validate_service_update,
    k8s.PriorityClass: _validate_priority_class_update,
    k8s.Secret: _validate_secret_update,
    k8s.ConfigMap: _validate_config_map_update,
    k8s.PersistentVolume: _validate_pv_update,
    k8s.PersistentVolumeClaim: _validate_pvc_update,
    k8s.StorageClass: _validate_storage_class_update,
}


def register_validator(model: type, create: CreateFn, update: UpdateFn | None = None) -> None:
    """Let kinds defined outside this module (PyTorchJob, PodGroup, queues) plug in."""
    _CREATE[model] = create
    if update is not None:
        _UPDATE[model] = update


def _lookup(table: dict[type, Any], obj: Any) -> Any:
    for cls in type(obj).__mro__:
        if cls in table:
            return table[cls]
    return None


def validate_create(obj: Any) -> list[FieldError]:
    """Every problem with a new object; an empty list means it may be stored."""
    errs: Errs = []
    fn = _lookup(_CREATE, obj)
    if fn is not None:
        fn(obj, errs)
    elif hasattr(obj, "metadata"):
        validate_object_meta(obj.metadata, errs)
    return errs


def validate_update(obj: Any, old: Any) -> list[FieldError]:
    """The create rules plus what may not change between ``old`` and ``obj``."""
    if type(obj) is not type(old):
        raise TypeError(f"cannot validate an update from {type(old).__name__} to {type(obj).__name__}")
    errs: Errs = []
    if hasattr(obj, "metadata"):
        validate_object_meta_update(obj.metadata, old.metadata, errs)
    errs.extend(validate_create(obj))
    fn = _lookup(_UPDATE, obj)
    if fn is not None:
        fn(obj, old, errs)
    return errs


def validate(obj: Any, old: Any = None) -> list[FieldError]:
    """``validate_create`` for a new object, ``validate_update`` when the stored one is given."""
    return validate_create(obj) if old is None else validate_update(obj, old)


__all__ = [
    "DUPLICATE",
    "FORBIDDEN",
    "INVALID",
    "NOT_FOUND",
    "NOT_SUPPORTED",
    "REQUIRED",
    "TOO_LONG",
    "TYPE_INVALID",
    "FieldError",
    "Unquoted",
    "aggregate_message",
    "duplicate",
    "forbidden",
    "go_value",
    "invalid",
    "is_dns1035_label",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "is_label_value",
    "is_qualified_name",
    "not_found",
    "not_supported",
    "register_validator",
    "required",
    "selector_matches",
    "too_long",
    "type_invalid",
    "validate",
    "validate_create",
    "validate_label_selector",
    "validate_labels",
    "validate_non_special_ip",
    "validate_object_meta",
    "validate_pod_spec",
    "validate_pod_template",
    "validate_resource_requirements",
    "validate_tolerations",
    "validate_update",
]
