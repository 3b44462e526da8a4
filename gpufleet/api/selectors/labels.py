"""Label selectors: the ``kubectl -l`` string grammar and the structured ``LabelSelector`` form."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpufleet.api.validation.names import is_label_value, is_qualified_name


class SelectorError(ValueError):
    """An invalid label or field selector; the message names the offending part."""


# --------------------------------------------------------------------------- validation

# Label keys and values follow apimachinery's ``IsQualifiedName`` and ``IsValidLabelValue``,
# with their texts: the same functions the object validators use.
qualified_name_errors = is_qualified_name
label_value_errors = is_label_value


def _quote(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# --------------------------------------------------------------------------- label selectors


class Operator(StrEnum):
    """The operators of apimachinery's ``selection.Operator`` (same string values)."""

    IN = "in"
    NOT_IN = "notin"
    EQUALS = "="
    DOUBLE_EQUALS = "=="
    NOT_EQUALS = "!="
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    GREATER_THAN = "gt"
    LESS_THAN = "lt"


_INT64_RE = re.compile(r"[+-]?[0-9]+")


def _parse_int64(text: str) -> int | None:
    if not _INT64_RE.fullmatch(text):
        return None
    number = int(text)
    return number if -(2**63) <= number < 2**63 else None


@dataclass(frozen=True)
class Requirement:
    """One condition of a label selector. Build it with :meth:`new`, which validates."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    @classmethod
    def new(
        cls,
        key: str,
        operator: Operator | str,
        values: Iterable[str] = (),
        *,
        key_path: str = "key",
        values_path: str = "values",
    ) -> Requirement:
        """Validate like Kubernetes' ``labels.NewRequirement``; values are kept sorted and unique."""
        errors: list[str] = []
        try:
            op = Operator(operator)
        except ValueError:
            raise SelectorError(
                f"operator: Unsupported value: {_quote(str(operator))}: supported values: "
                + ", ".join(_quote(o.value) for o in Operator)
            ) from None
        vals = list(values)
        key_errors = qualified_name_errors(key)
        if key_errors:
            errors.append(f"{key_path}: Invalid value: {_quote(key)}: {'; '.join(key_errors)}")
        if op in (Operator.IN, Operator.NOT_IN):
            if not vals:
                errors.append(
                    f"{values_path}: Invalid value: []: for 'in', 'notin' operators, values set can't be empty"
                )
        elif op in (Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.NOT_EQUALS):
            if len(vals) != 1:
                errors.append(
                    f"{values_path}: Invalid value: {_quote(vals)}: "
                    "exact-match compatibility requires one single value"
                )
        elif op in (Operator.EXISTS, Operator.DOES_NOT_EXIST):
            if vals:
                errors.append(
                    f"{values_path}: Invalid value: {_quote(vals)}: "
                    "values set must be empty for exists and does not exist"
                )
        else:
            if len(vals) != 1:
                errors.append(
                    f"{values_path}: Invalid value: {_quote(vals)}: "
                    "for 'Gt', 'Lt' operators, exactly one value is required"
                )
            for i, v in enumerate(vals):
                if _parse_int64(v) is None:
                    errors.append(
                        f"{values_path}[{i}]: Invalid value: {_quote(v)}: "
                        "for 'Gt', 'Lt' operators, the value must be an integer"
                    )
        for i, v in enumerate(vals):
            value_errors = label_value_errors(v)
            if value_errors:
                errors.append(
                    f"{values_path}[{i}][{key}]: Invalid value: {_quote(v)}: {'; '.join(value_errors)}"
                )
        if errors:
            raise SelectorError("; ".join(errors))
        return cls(key, op, tuple(sorted(set(vals))))

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        present = self.key in labels
        if op in (Operator.IN, Operator.EQUALS, Operator.DOUBLE_EQUALS):
            return present and labels[self.key] in self.values
        if op in (Operator.NOT_IN, Operator.NOT_EQUALS):
            return not present or labels[self.key] not in self.values
        if op is Operator.EXISTS:
            return present
        if op is Operator.DOES_NOT_EXIST:
            return not present
        if not present or len(self.values) != 1:
            return False
        have, want = _parse_int64(labels[self.key]), _parse_int64(self.values[0])
        if have is None or want is None:
            return False
        return have > want if op is Operator.GREATER_THAN else have < want

    def __str__(self) -> str:
        op = self.operator
        if op is Operator.EXISTS:
            return self.key
        if op is Operator.DOES_NOT_EXIST:
            return f"!{self.key}"
        joined = ",".join(self.values)
        if op in (Operator.IN, Operator.NOT_IN):
            return f"{self.key} {op.value} ({joined})"
        symbol = {Operator.GREATER_THAN: ">", Operator.LESS_THAN: "<"}.get(op, op.value)
        return f"{self.key}{symbol}{joined}"


class LabelSelector:
    """A conjunction of requirements, or the selector that matches nothing."""

    __slots__ = ("_requirements", "_nothing")

    def __init__(self, requirements: Iterable[Requirement] = (), *, nothing: bool = False) -> None:
        # Sorted by key like Kubernetes so that str() is deterministic (Scale.status.selector).
        self._requirements = tuple(sorted(requirements, key=lambda r: r.key)) if not nothing else ()
        self._nothing = nothing

    @classmethod
    def everything(cls) -> LabelSelector:
        """Matches every object (no requirements)."""
        return cls()

    @classmethod
    def nothing(cls) -> LabelSelector:
        """Matches no object: what a missing (nil) structured selector means."""
        return cls(nothing=True)

    @classmethod
    def from_set(cls, labels: Mapping[str, str] | None) -> LabelSelector:
        """Equality on every pair of ``labels`` (``Service.spec.selector``, ``nodeSelector``).

        Like Kubernetes' ``SelectorFromSet``, ``None`` and ``{}`` give ``everything()`` and
        nothing is validated: a Service without a selector must be special-cased by its
        caller (Kubernetes manages no endpoints for it).
        """
        return cls(Requirement(k, Operator.EQUALS, (v,)) for k, v in (labels or {}).items())

    @classmethod
    def from_dict(cls, selector: Mapping[str, Any] | None) -> LabelSelector:
        """Convert the structured form (``matchLabels`` + ``matchExpressions``).

        ``None`` gives ``nothing()``; ``{}`` (or both parts empty) gives ``everything()``.
        """
        if selector is None:
            return cls.nothing()
        if not isinstance(selector, Mapping):
            raise SelectorError(
                "a label selector must be an object with 'matchLabels' and/or 'matchExpressions'"
            )
        requirements: list[Requirement] = []
        expressions = selector.get("matchExpressions") or []
        if not isinstance(expressions, list):
            raise SelectorError("matchExpressions: must be a list")
        for i, expr in enumerate(expressions):
            path = f"matchExpressions[{i}]"
            if not isinstance(expr, Mapping):
                raise SelectorError(f"{path}: must be an object with key, operator and values")
            key, operator, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
            if not isinstance(key, str):
                raise SelectorError(f"{path}.key: Required value: must be a string")
            op = _STRUCTURED_OPERATORS.get(operator) if isinstance(operator, str) else None
            if op is None:
                raise SelectorError(f"{_quote(operator)} is not a valid label selector operator")
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise SelectorError(f"{path}.values: must be a list of strings")
            requirements.append(
                Requirement.new(key, op, values, key_path=f"{path}.key", values_path=f"{path}.values")
            )
        match_labels = selector.get("matchLabels") or {}
        if not isinstance(match_labels, Mapping):
            raise SelectorError("matchLabels: must be an object of label keys to values")
        for key, value in match_labels.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise SelectorError(f"matchLabels[{key}]: Invalid value: {_quote(value)}: must be a string")
            value_errors = label_value_errors(value)
            if value_errors:
                raise SelectorError(
                    f"matchLabels[{key}]: Invalid value: {_quote(value)}: {'; '.join(value_errors)}"
                )
            requirements.append(Requirement.new(key, Operator.EQUALS, [value], key_path="matchLabels"))
        return cls(requirements)

    @property
    def requirements(self) -> tuple[Requirement, ...]:
        return self._requirements

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self._nothing:
            return False
        labels = labels or {}
        return all(r.matches(labels) for r in self._requirements)

    def empty(self) -> bool:
        """True when the selector restricts nothing (Kubernetes ``Selector.Empty()``)."""
        return not self._nothing and not self._requirements

    def matches_nothing(self) -> bool:
        return self._nothing

    def requires_exact_match(self, key: str) -> str | None:
        """The single value ``key`` must have, if the selector pins it (``a=b``, ``a in (b)``)."""
        for r in self._requirements:
            if r.key == key:
                exact = r.operator in (Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.IN)
                return r.values[0] if exact and len(r.values) == 1 else None
        return None

    def add(self, *requirements: Requirement) -> LabelSelector:
        if self._nothing:
            return self
        return LabelSelector([*self._requirements, *requirements])

    def __str__(self) -> str:
        return ",".join(str(r) for r in self._requirements)

    def __repr__(self) -> str:
        if self._nothing:
            return "LabelSelector.nothing()"
        return f"LabelSelector({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LabelSelector):
            return NotImplemented
        return self._nothing == other._nothing and self._requirements == other._requirements

    def __hash__(self) -> int:
        return hash((self._nothing, self._requirements))


_STRUCTURED_OPERATORS = {
    "In": Operator.IN,
    "NotIn": Operator.NOT_IN,
    "Exists": Operator.EXISTS,
    "DoesNotExist": Operator.DOES_NOT_EXIST,
}

# Token kinds of the label-selector lexer.
_END, _IDENT, _COMMA, _LPAREN, _RPAREN, _BANG = "end", "ident", ",", "(", ")", "!"
_KEYWORDS = {"in": Operator.IN, "notin": Operator.NOT_IN}
_SYMBOLS = {
    "==": Operator.DOUBLE_EQUALS,
    "!=": Operator.NOT_EQUALS,
    "=": Operator.EQUALS,
    ">": Operator.GREATER_THAN,
    "<": Operator.LESS_THAN,
}
_SPECIAL = set("=!(),><")
_WHITESPACE = set(" \t\r\n")
_BINARY_OPERATORS = "in, notin, =, ==, !=, gt, lt"


def _lex(text: str) -> list[tuple[str, str]]:
    """Tokens as (kind, literal); operators and keywords use their literal as kind."""
    tokens: list[tuple[str, str]] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos] in _WHITESPACE:
            pos += 1
        if pos >= end:
            tokens.append((_END, ""))
            return tokens
        if text[pos] in _SPECIAL:
            two = text[pos : pos + 2]
            literal = two if two in ("==", "!=") else text[pos]
            tokens.append((literal, literal))
            pos += len(literal)
            continue
        start = pos
        while pos < end and text[pos] not in _SPECIAL and text[pos] not in _WHITESPACE:
            pos += 1
        word = text[start:pos]
        tokens.append((word if word in _KEYWORDS else _IDENT, word))


class _LabelParser:
    """Recursive descent over the token list, mirroring apimachinery's parser so that the
    same inputs are accepted and the same error texts come back."""

    def __init__(self, text: str) -> None:
        self.tokens = _lex(text)
        self.pos = 0

    def _token(self, values_context: bool, advance: bool) -> tuple[str, str]:
        kind, literal = self.tokens[min(self.pos, len(self.tokens) - 1)]
        if advance:
            self.pos += 1
        # Where a value is expected, "in" and "notin" are ordinary words: "x in (in)".
        if values_context and kind in _KEYWORDS:
            kind = _IDENT
        return kind, literal

    def peek(self, values_context: bool = True) -> tuple[str, str]:
        return self._token(values_context, advance=False)

    def take(self, values_context: bool = True) -> tuple[str, str]:
        return self._token(values_context, advance=True)

    def parse(self) -> list[Requirement]:
        requirements: list[Requirement] = []
        while True:
            kind, literal = self.peek()
            if kind in (_IDENT, _BANG):
                try:
                    requirements.append(self.requirement())
                except SelectorError as exc:
                    raise SelectorError(f"unable to parse requirement: {exc}") from None
                kind, literal = self.take()
                if kind == _END:
                    return requirements
                if kind == _COMMA:
                    next_kind, next_literal = self.peek()
                    if next_kind not in (_IDENT, _BANG):
                        raise SelectorError(f"found '{next_literal}', expected: identifier after ','")
                    continue
                raise SelectorError(f"found '{literal}', expected: ',' or 'end of string'")
            if kind == _END:
                return requirements
            raise SelectorError(f"found '{literal}', expected: !, identifier, or 'end of string'")

    def requirement(self) -> Requirement:
        key, operator = self.key_and_inferred_operator()
        if operator is not None:
            return Requirement.new(key, operator, [])
        operator = self.operator()
        if operator in (Operator.IN, Operator.NOT_IN):
            values = self.value_set()
        else:
            values = self.exact_value()
        return Requirement.new(key, operator, sorted(values))

    def key_and_inferred_operator(self) -> tuple[str, Operator | None]:
        operator: Operator | None = None
        kind, literal = self.take()
        if kind == _BANG:
            operator = Operator.DOES_NOT_EXIST
            kind, literal = self.take()
        if kind != _IDENT:
            raise SelectorError(f"found '{literal}', expected: identifier")
        errors = qualified_name_errors(literal)
        if errors:
            raise SelectorError(f"key: Invalid value: {_quote(literal)}: {'; '.join(errors)}")
        if self.peek()[0] in (_END, _COMMA) and operator is None:
            operator = Operator.EXISTS
        return literal, operator

    def operator(self) -> Operator:
        kind, literal = self.take(values_context=False)
        if kind in _KEYWORDS:
            return _KEYWORDS[kind]
        if kind in _SYMBOLS:
            return _SYMBOLS[kind]
        raise SelectorError(f"found '{literal}', expected: {_BINARY_OPERATORS}")

    def value_set(self) -> set[str]:
        kind, literal = self.take()
        if kind != _LPAREN:
            raise SelectorError(f"found '{literal}', expected: '('")
        kind, literal = self.peek()
        if kind in (_IDENT, _COMMA):
            values = self.identifiers()
            kind, literal = self.take()
            if kind != _RPAREN:
                raise SelectorError(f"found '{literal}', expected: ')'")
            return values
        if kind == _RPAREN:
            # Kubernetes reads "()" as the set holding the empty string.
            self.take()
            return {""}
        raise SelectorError(f"found '{literal}', expected: ',', ')' or identifier")

    def identifiers(self) -> set[str]:
        values: set[str] = set()
        while True:
            kind, literal = self.take()
            if kind == _IDENT:
                values.add(literal)
                next_kind, next_literal = self.peek()
                if next_kind == _COMMA:
                    continue
                if next_kind == _RPAREN:
                    return values
                raise SelectorError(f"found '{next_literal}', expected: ',' or ')'")
            if kind == _COMMA:
                # An empty slot between commas, or next to a parenthesis, is the empty value.
                if not values:
                    values.add("")
                next_kind, _ = self.peek()
                if next_kind == _RPAREN:
                    values.add("")
                    return values
                if next_kind == _COMMA:
                    self.take()
                    values.add("")
                continue
            raise SelectorError(f"found '{literal}', expected: ',', or identifier")

    def exact_value(self) -> set[str]:
        if self.peek()[0] in (_END, _COMMA):
            return {""}
        kind, literal = self.take()
        if kind == _IDENT:
            return {literal}
        raise SelectorError(f"found '{literal}', expected: identifier")


def parse_label_selector(text: str) -> LabelSelector:
    """Parse the string form used by ``kubectl -l`` and ``?labelSelector=``.

    ``"app=web"``, ``"app==web"``, ``"app!=web"``, ``"tier in (fe, be)"``, ``"tier notin (db)"``,
    ``"gpu"`` (exists), ``"!gpu"`` (does not exist), ``"replicas>2"``; commas mean AND. An
    empty or blank string matches everything. Raises :class:`SelectorError`.
    """
    if not isinstance(text, str):
        raise SelectorError(f"a label selector must be a string, not {type(text).__name__}")
    return LabelSelector(_LabelParser(text).parse())
