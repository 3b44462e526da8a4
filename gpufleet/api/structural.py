"""A custom resource's structural schema at work: pruning, defaulting and validation.

These are apiextensions-apiserver's rules for the objects of a CustomResourceDefinition
(pkg/apiserver/schema/pruning, schema/defaulting and apiserver/validation over kube-openapi):

- ``prune`` drops the fields the schema does not specify (unless a node says
  ``x-kubernetes-preserve-unknown-fields: true``) and names them, so the API server can warn
  about them or, under ``fieldValidation=Strict``, refuse them;
- ``apply_defaults`` fills ``default`` values in, and drops a ``null`` where the schema neither
  allows one (``nullable``) nor has a default to put in its place;
- ``validate`` checks the values against the schema, each problem a FieldError worded as
  Kubernetes words it: ``spec.replicas: Invalid value: "string": spec.replicas in body must
  be of type integer: "string"``.

A schema is the CRD's ``openAPIV3Schema`` as plain JSON. ``apiVersion``, ``kind`` and
``metadata`` at the root (and in an ``x-kubernetes-embedded-resource``) are the API server's,
not the schema's: they are never pruned here.
"""

from __future__ import annotations

import base64
import copy
import datetime
import ipaddress
import json
import re
import uuid
from functools import lru_cache
from typing import Any

from gpufleet.api.validation.errors import (
    REQUIRED,
    TOO_MANY,
    FieldError,
    go_quote,
    invalid,
    not_supported,
    too_long,
    type_invalid,
)

Schema = dict[str, Any]

PRESERVE = "x-kubernetes-preserve-unknown-fields"
EMBEDDED = "x-kubernetes-embedded-resource"
INT_OR_STRING = "x-kubernetes-int-or-string"
_RESOURCE_FIELDS = ("apiVersion", "kind", "metadata")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def json_type(value: Any) -> str:
    """The JSON type name of a decoded value, as kube-openapi names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


# --- pruning -------------------------------------------------------------------------------


def prune(obj: dict[str, Any], schema: Schema | None, *, root: bool = True) -> list[str]:
    """Drops, in place, the fields ``schema`` does not specify; returns their paths
    (``spec.foo``, ``spec.items[0].bar``) in the order found."""
    unknown: list[str] = []
    if schema is None:
        return unknown
    _prune_object(obj, schema, "", unknown, resource=root)
    return unknown


def _prune_object(obj: dict[str, Any], schema: Schema, path: str, unknown: list[str], *, resource: bool) -> None:
    props = schema.get("properties")
    additional = schema.get("additionalProperties")
    preserve = bool(schema.get(PRESERVE))
    for key in list(obj):
        if resource and key in _RESOURCE_FIELDS:
            continue  # the API server's own (metadata is checked as ObjectMeta)
        child_path = _join(path, key)
        if isinstance(props, dict) and key in props:
            _prune_value(obj[key], props[key], child_path, unknown)
        elif isinstance(additional, dict):
            _prune_value(obj[key], additional, child_path, unknown)
        elif additional is True or preserve:
            continue
        else:
            unknown.append(child_path)
            del obj[key]


def _prune_value(value: Any, schema: Any, path: str, unknown: list[str]) -> None:
    if not isinstance(schema, dict) or schema.get(INT_OR_STRING):
        return
    if isinstance(value, dict):
        if schema.get("type") in (None, "object") and ("properties" in schema or "additionalProperties" in schema
                                                        or not schema.get(PRESERVE)):
            _prune_object(value, schema, path, unknown, resource=bool(schema.get(EMBEDDED)))
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                _prune_value(item, items, f"{path}[{i}]", unknown)


# --- defaulting ----------------------------------------------------------------------------


def apply_defaults(obj: Any, schema: Schema | None) -> None:
    """Fills in, in place, every ``default`` of the schema whose field is missing (or null
    where null is not allowed), and drops the nulls that have neither."""
    if schema is None:
        return
    _default(obj, schema)


def _default(value: Any, schema: Any) -> None:
    if not isinstance(schema, dict):
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            for key, sub in props.items():
                if not isinstance(sub, dict):
                    continue
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
                elif key in value and value[key] is None and not sub.get("nullable"):
                    if "default" in sub:
                        value[key] = copy.deepcopy(sub["default"])
                    else:
                        del value[key]
                        continue
                if key in value:
                    _default(value[key], sub)
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for key in list(value):
                if isinstance(props, dict) and key in props:
                    continue
                if value[key] is None and not additional.get("nullable"):
                    if "default" in additional:
                        value[key] = copy.deepcopy(additional["default"])
                    else:
                        del value[key]
                        continue
                _default(value[key], additional)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                if item is None and "default" in items and not items.get("nullable"):
                    value[i] = copy.deepcopy(items["default"])
                _default(value[i], items)


# --- validation ----------------------------------------------------------------------------


def validate(obj: Any, schema: Schema | None, path: str = "") -> list[FieldError]:
    """Every value of ``obj`` that ``schema`` refuses, as Kubernetes reports a custom
    resource's (kube-openapi's messages, "in body")."""
    errs: list[FieldError] = []
    if schema is not None:
        _validate(obj, schema, path, errs, resource=not path)
    return errs


def _where(path: str) -> str:
    return path or "."


def _matches_type(value: Any, want: str) -> bool:
    have = json_type(value)
    if have == want:
        return True
    if want == "number" and have == "integer":
        return True
    # kube-openapi takes a whole float for an integer (JSON has one number type)
    return want == "integer" and have == "number" and float(value).is_integer()


def _validate(value: Any, schema: Any, path: str, errs: list[FieldError], *, resource: bool = False) -> None:
    if not isinstance(schema, dict):
        return
    where = _where(path)
    if value is None:
        if schema.get("nullable") or not schema.get("type"):
            return
        errs.append(type_invalid(path, "null", f"{where} in body must be of type {schema['type']}: \"null\""))
        return
    if schema.get(INT_OR_STRING):
        if not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))):
            errs.append(type_invalid(path, json_type(value),
                                     f"{where} in body must be of type integer,string: {go_quote(json_type(value))}"))
            return
    elif schema.get("type") and not _matches_type(value, schema["type"]):
        have = json_type(value)
        errs.append(type_invalid(path, have, f"{where} in body must be of type {schema['type']}: {go_quote(have)}"))
        return
    _composition(value, schema, path, errs)
    if isinstance(value, str):
        _string(value, schema, path, errs)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _number(value, schema, path, errs)
    if "enum" in schema and isinstance(schema["enum"], list) and value not in schema["enum"]:
        allowed = [v if isinstance(v, str) else json.dumps(v, separators=(",", ":")) for v in schema["enum"]]
        errs.append(not_supported(path, value, allowed))
    if isinstance(value, list):
        _array(value, schema, path, errs)
    elif isinstance(value, dict):
        _object(value, schema, path, errs, resource=resource)


def _composition(value: Any, schema: Schema, path: str, errs: list[FieldError]) -> None:
    where = _where(path)
    for sub in schema.get("allOf") or []:
        _validate(value, sub, path, errs)
    any_of = schema.get("anyOf")
    if isinstance(any_of, list) and any_of and not any(not validate(value, s, path) for s in any_of):
        errs.append(invalid(path, value, f'"{where}" must validate at least one schema (anyOf)'))
    one_of = schema.get("oneOf")
    if isinstance(one_of, list) and one_of:
        passing = sum(1 for s in one_of if not validate(value, s, path))
        if passing != 1:
            errs.append(invalid(path, value, f'"{where}" must validate one and only one schema (oneOf)'))
    if isinstance(schema.get("not"), dict) and not validate(value, schema["not"], path):
        errs.append(invalid(path, value, f'"{where}" must not validate the schema (not)'))


@lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except re.error:
        return None


def _string(value: str, schema: Schema, path: str, errs: list[FieldError]) -> None:
    where = _where(path)
    max_len = schema.get("maxLength")
    if isinstance(max_len, int) and len(value) > max_len:
        errs.append(too_long(path, max_len))
    min_len = schema.get("minLength")
    if isinstance(min_len, int) and len(value) < min_len:
        errs.append(invalid(path, value, f"{where} in body should be at least {min_len} chars long"))
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        compiled = _regex(pattern)
        if compiled is not None and compiled.search(value) is None:
            errs.append(invalid(path, value, f"{where} in body should match '{pattern}'"))
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS and not _FORMATS[fmt](value):
        errs.append(type_invalid(path, value, f"{where} in body must be of type {fmt}: {go_quote(value)}"))


def _number_text(n: Any) -> str:
    if isinstance(n, float) and n.is_integer() and abs(n) < 1e21:
        return str(int(n))
    return str(n)


def _number(value: float, schema: Schema, path: str, errs: list[FieldError]) -> None:
    where = _where(path)
    maximum = schema.get("maximum")
    if isinstance(maximum, int | float):
        if schema.get("exclusiveMaximum") and value >= maximum:
            errs.append(invalid(path, value, f"{where} in body should be less than {_number_text(maximum)}"))
        elif value > maximum:
            errs.append(invalid(path, value,
                                f"{where} in body should be less than or equal to {_number_text(maximum)}"))
    minimum = schema.get("minimum")
    if isinstance(minimum, int | float):
        if schema.get("exclusiveMinimum") and value <= minimum:
            errs.append(invalid(path, value, f"{where} in body should be greater than {_number_text(minimum)}"))
        elif value < minimum:
            errs.append(invalid(path, value,
                                f"{where} in body should be greater than or equal to {_number_text(minimum)}"))
    factor = schema.get("multipleOf")
    if isinstance(factor, int | float) and factor > 0 and (value / factor) != int(value / factor):
        errs.append(invalid(path, value, f"{where} in body should be a multiple of {_number_text(factor)}"))


def _array(value: list[Any], schema: Schema, path: str, errs: list[FieldError]) -> None:
    where = _where(path)
    max_items = schema.get("maxItems")
    if isinstance(max_items, int) and len(value) > max_items:
        errs.append(FieldError(TOO_MANY, path, len(value),
                               f"must have at most {max_items} item{'s' if max_items != 1 else ''}"))
    min_items = schema.get("minItems")
    if isinstance(min_items, int) and len(value) < min_items:
        errs.append(invalid(path, len(value), f"{where} in body should have at least {min_items} items"))
    if schema.get("uniqueItems"):
        seen: list[Any] = []
        for item in value:
            if item in seen:
                errs.append(invalid(path, "", f"{where} in body shouldn't contain duplicates"))
                break
            seen.append(item)
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            _validate(item, items, f"{path}[{i}]", errs)


def _object(value: dict[str, Any], schema: Schema, path: str, errs: list[FieldError], *, resource: bool) -> None:
    where = _where(path)
    max_props = schema.get("maxProperties")
    if isinstance(max_props, int) and len(value) > max_props:
        errs.append(FieldError(TOO_MANY, path, len(value),
                               f"must have at most {max_props} item{'s' if max_props != 1 else ''}"))
    min_props = schema.get("minProperties")
    if isinstance(min_props, int) and len(value) < min_props:
        errs.append(invalid(path, len(value), f"{where} in body should have at least {min_props} properties"))
    for key in schema.get("required") or []:
        if isinstance(key, str) and key not in value and not (resource and key in _RESOURCE_FIELDS):
            errs.append(FieldError(REQUIRED, _join(path, key)))
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    additional = schema.get("additionalProperties")
    embedded = resource or bool(schema.get(EMBEDDED))
    for key, item in value.items():
        if embedded and key in _RESOURCE_FIELDS and key not in props:
            continue
        if key in props:
            _validate(item, props[key], _join(path, key), errs)
        elif isinstance(additional, dict):
            _validate(item, additional, _join(path, key), errs)


def _is_datetime(text: str) -> bool:
    try:
        datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return "T" in text.upper() or " " in text


def _is_date(text: str) -> bool:
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        return False
    return True


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _is_byte(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except ValueError:
        return False
    return True


def _is_ip(version: int):
    def check(text: str) -> bool:
        try:
            return ipaddress.ip_address(text).version == version
        except ValueError:
            return False
    return check


# The formats Kubernetes checks on custom resources that are cheap to check here.
_FORMATS = {
    "date-time": _is_datetime,
    "datetime": _is_datetime,
    "date": _is_date,
    "uuid": _is_uuid,
    "byte": _is_byte,
    "ipv4": _is_ip(4),
    "ipv6": _is_ip(6),
}
