"""Field selectors as apimachinery's ``fields.ParseSelector`` reads them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from gpufleet.api.selectors.labels import SelectorError


class FieldRequirement(NamedTuple):
    field: str
    operator: str  # "=" or "!="; "==" is read as "="
    value: str


_FIELD_OPERATORS = ("!=", "==", "=")


def _split_terms(text: str) -> list[str]:
    terms, start, escaped = [], 0, False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _unescape_field_value(raw: str) -> str:
    out: list[str] = []
    escaped = False
    for ch in raw:
        if escaped:
            if ch not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":
            raise SelectorError(f"invalid field selector: unescaped character in value: {ch}")
        else:
            out.append(ch)
    if escaped:
        raise SelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def escape_field_value(value: str) -> str:
    """Escape ``\\``, ``,`` and ``=`` so that ``value`` can sit on the right of a field term."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def _scalar_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return ""  # objects and lists have no field-selector value


def field_value(obj: Mapping[str, Any] | None, path: str) -> str:
    """The text a field selector compares for the dotted ``path`` of a JSON object.

    A missing field reads as "" (so ``spec.nodeName=`` finds unscheduled pods), booleans as
    "true"/"false", whole numbers without a decimal point.
    """
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return ""
        current = current[part]
    return _scalar_text(current)


class FieldSelector:
    """A conjunction of field equalities and inequalities."""

    __slots__ = ("_requirements",)

    def __init__(self, requirements: Iterable[FieldRequirement] = ()) -> None:
        self._requirements = tuple(requirements)

    @classmethod
    def everything(cls) -> FieldSelector:
        return cls()

    @property
    def requirements(self) -> list[FieldRequirement]:
        return list(self._requirements)

    def fields(self) -> list[str]:
        """The distinct field paths used, in order (to check them against a kind's field labels)."""
        return list(dict.fromkeys(r.field for r in self._requirements))

    def matches(self, obj: Mapping[str, Any] | None) -> bool:
        for field, operator, value in self._requirements:
            equal = field_value(obj, field) == value
            if equal != (operator == "="):
                return False
        return True

    def empty(self) -> bool:
        return not self._requirements

    def requires_exact_match(self, field: str) -> str | None:
        for r in self._requirements:
            if r.field == field and r.operator == "=":
                return r.value
        return None

    def only_name(self) -> str | None:
        """The name when the selector is exactly ``metadata.name=X``, so a list can be
        answered with a single get (what kubectl's wait/rollout/delete informers send)."""
        if len(self._requirements) == 1:
            field, operator, value = self._requirements[0]
            if field == "metadata.name" and operator == "=":
                return value
        return None

    def __str__(self) -> str:
        return ",".join(f"{r.field}{r.operator}{escape_field_value(r.value)}" for r in self._requirements)

    def __repr__(self) -> str:
        return f"FieldSelector({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FieldSelector):
            return NotImplemented
        return self._requirements == other._requirements

    def __hash__(self) -> int:
        return hash(self._requirements)


def parse_field_selector(text: str) -> FieldSelector:
    """Parse ``?fieldSelector=``: ``field=value``, ``field==value`` or ``field!=value`` terms
    joined by commas. Values may contain ``\\,`` ``\\=`` and ``\\\\``; field names are not
    escaped and end at the first operator. Nothing is trimmed, as in Kubernetes. Terms are
    sorted, as Kubernetes does, so equal selectors compare and print equal.
    """
    if not isinstance(text, str):
        raise SelectorError(f"a field selector must be a string, not {type(text).__name__}")
    requirements: list[FieldRequirement] = []
    for term in sorted(_split_terms(text)):
        if term == "":
            continue
        for i in range(len(term)):
            op = next((o for o in _FIELD_OPERATORS if term.startswith(o, i)), None)
            if op is not None:
                break
        else:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        field = term[:i]
        if not field:
            raise SelectorError(f"invalid selector: '{text}'; '{term}' has no field name")
        value = _unescape_field_value(term[i + len(op) :])
        requirements.append(FieldRequirement(field, "!=" if op == "!=" else "=", value))
    return FieldSelector(requirements)
