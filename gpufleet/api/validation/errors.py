"""Field errors as Kubernetes' ``field.Error`` renders them, and Go's ``%v``/``%q`` value formatting."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

REQUIRED = "FieldValueRequired"
INVALID = "FieldValueInvalid"
NOT_SUPPORTED = "FieldValueNotSupported"
DUPLICATE = "FieldValueDuplicate"
FORBIDDEN = "FieldValueForbidden"
TOO_LONG = "FieldValueTooLong"
TYPE_INVALID = "FieldValueTypeInvalid"
NOT_FOUND = "FieldValueNotFound"
TOO_MANY = "FieldValueTooMany"

_TYPE_TEXT = {
    REQUIRED: "Required value",
    INVALID: "Invalid value",
    NOT_SUPPORTED: "Unsupported value",
    DUPLICATE: "Duplicate value",
    FORBIDDEN: "Forbidden",
    TOO_LONG: "Too long",
    TYPE_INVALID: "Invalid value",
    NOT_FOUND: "Not found",
    TOO_MANY: "Too many",
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
    detail = ", ".join(go_quote(v) for v in valid)
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


def go_quote(s: str) -> str:
    """Go's %q of a string, as Kubernetes quotes values in its messages."""
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
        return go_quote(v)
    if isinstance(v, int | float):
        return _go_number(v)
    if isinstance(v, datetime):
        utc = v.astimezone(UTC) if v.tzinfo is not None else v
        return utc.strftime("%Y-%m-%d %H:%M:%S +0000 UTC")
    if isinstance(v, BaseModel):
        # Kubernetes prints structs with Go syntax; JSON says the same to our readers.
        return json.dumps(v.model_dump(by_alias=True, exclude_none=True, mode="json"), separators=(",", ":"))
    if isinstance(v, Mapping) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        items = ", ".join(f"{go_quote(k)}:{go_quote(v[k])}" for k in sorted(v))
        return "map[string]string{" + items + "}"
    if isinstance(v, list | tuple) and all(isinstance(x, str) for x in v):
        return "[]string{" + ", ".join(go_quote(x) for x in v) + "}"
    return json.dumps(v, separators=(",", ":"), sort_keys=True, default=str)
