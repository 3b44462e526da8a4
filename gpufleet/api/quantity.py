"""Kubernetes resource quantities ("500m", "1.5Gi", "129e6") and resource-list arithmetic.

Values are kept as exact ``Fraction``s, never floats: a request of "100m" cpu summed ten
times must be exactly one core, and "123Mi" must compare equal to "128974848". As in
Kubernetes (``resource.ParseQuantity``), a non-zero value finer than one nano-unit is rounded
away from zero to the nearest nano-unit, so "0.1n" is "1n" ("if you ask for some, you get some").

Deliberate differences from ``resource.ParseQuantity``:
- "", ".", "+" and "-" are rejected (Kubernetes reads the last three as 0);
- binary-suffixed values above 2^63-1 keep their value (Kubernetes silently caps them);
- exponents are limited to +/-``MAX_EXPONENT`` so a hostile "1e999999999" cannot exhaust memory;
- surrounding whitespace is ignored, as Kubernetes does when it decodes a quantity from JSON.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Literal

ResourceList = dict[str, str]
QuantityLike = str | int | float | Decimal | Fraction

MAX_EXPONENT = 1000

_DECIMAL_SUFFIXES: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SUFFIXES: dict[str, int] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_BINARY_BY_POWER = {power // 10: suffix for suffix, power in _BINARY_SUFFIXES.items()}
_DECIMAL_BY_EXPONENT = {exp: suffix for suffix, exp in _DECIMAL_SUFFIXES.items()}

_NUMBER_RE = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(.*)", re.DOTALL)
_EXPONENT_RE = re.compile(r"[eE]([+-]?[0-9]+)")

_NANO = Fraction(1, 10**9)

_VALID_FORM = (
    "a quantity is a number with an optional suffix, e.g. '2', '0.5', '500m', '1.5Gi', "
    "'128974848', '129e6' or '129M' (decimal suffixes n u m k M G T P E, binary suffixes "
    "Ki Mi Gi Ti Pi Ei, or an exponent such as e3 or E-3)"
)


def _invalid(value: object, why: str = "") -> ValueError:
    detail = f" ({why})" if why else ""
    return ValueError(f"invalid quantity {value!r}{detail}: {_VALID_FORM}")


def _round_to_nano(value: Fraction) -> Fraction:
    scaled = value / _NANO
    if scaled.denominator == 1:
        return value
    magnitude = math.ceil(abs(scaled))
    return Fraction(magnitude if value > 0 else -magnitude) * _NANO


@functools.lru_cache(maxsize=4096)
def _parse_string(text: str) -> Fraction:
    # Memoized: a fleet's pods repeat a few dozen quantities ("100m", "16Gi"), each parsed
    # several times per write (validation, defaults, quota, the scheduler); a Fraction is
    # immutable, and a text that fails raises again (lru_cache keeps no exception).
    stripped = text.strip()
    match = _NUMBER_RE.fullmatch(stripped)
    if match is None:
        raise _invalid(text)
    sign, whole, frac, suffix = match.groups()
    frac = frac or ""
    if not whole and not frac:
        raise _invalid(text, "no digits")
    if suffix in _DECIMAL_SUFFIXES:
        base, exponent = 10, _DECIMAL_SUFFIXES[suffix]
    elif suffix in _BINARY_SUFFIXES:
        base, exponent = 2, _BINARY_SUFFIXES[suffix]
    else:
        exp_match = _EXPONENT_RE.fullmatch(suffix)
        if exp_match is None:
            raise _invalid(text, f"unknown suffix {suffix!r}")
        try:
            exponent = int(exp_match.group(1))
        except ValueError as exc:
            raise _invalid(text, "exponent too large") from exc
        if abs(exponent) > MAX_EXPONENT:
            raise _invalid(text, f"exponent beyond +/-{MAX_EXPONENT}")
        base = 10
    try:
        mantissa = Fraction(int(whole + frac or "0"), 10 ** len(frac))
    except ValueError as exc:  # more digits than int() accepts
        raise _invalid(text, "too many digits") from exc
    value = mantissa * Fraction(base) ** exponent
    if sign == "-":
        value = -value
    return _round_to_nano(value)


def parse_quantity(value: QuantityLike) -> Fraction:
    """Parse a Kubernetes quantity into its exact value in base units (cores, bytes, items).

    Accepts the string forms of ``resource.Quantity`` and plain JSON numbers (a manifest may
    say ``cpu: 2`` or ``cpu: 0.5``). Raises ``ValueError`` saying what a valid quantity looks
    like.
    """
    if isinstance(value, bool):
        raise _invalid(value, "a boolean is not a quantity")
    if isinstance(value, Fraction):
        return _round_to_nano(value)
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise _invalid(value, "not finite")
        return _round_to_nano(Fraction(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _invalid(value, "not finite")
        # repr() gives the shortest decimal that round-trips, so 0.1 means 1/10, not the
        # binary float nearest to it.
        return _parse_string(repr(value))
    if isinstance(value, str):
        return _parse_string(value)
    raise _invalid(value, f"unsupported type {type(value).__name__}")


def cpu_millis(quantity: QuantityLike) -> int:
    """Whole millicores, rounded up, like Kubernetes' ``Quantity.MilliValue()``."""
    return math.ceil(parse_quantity(quantity) * 1000)


def to_int_bytes(quantity: QuantityLike) -> int:
    """Whole bytes (or items), rounded up, like Kubernetes' ``Quantity.Value()``."""
    return math.ceil(parse_quantity(quantity))


def whole_amount(resource: str, quantity: QuantityLike) -> int:
    """A quantity as the scheduler compares it: cpu in whole millicores, anything else in
    whole units, both rounded up (``MilliValue()`` / ``Value()``). A ``Fraction`` (a sum of
    parsed quantities) is taken as it is."""
    value = quantity if isinstance(quantity, Fraction) else parse_quantity(quantity)
    scale = 1000 if resource == "cpu" else 1
    return -(-value.numerator * scale // value.denominator)


def compare(a: QuantityLike, b: QuantityLike) -> int:
    """-1, 0 or 1 as quantity ``a`` is less than, equal to or greater than ``b``."""
    qa, qb = parse_quantity(a), parse_quantity(b)
    return (qa > qb) - (qa < qb)


def _format_decimal_si(value: Fraction, max_exponent: int) -> str:
    """The largest suffix (a multiple of 3, at most ``max_exponent``) leaving an integer."""
    value = _round_to_nano(value)
    if value == 0:
        return "0"
    for exponent in range(max_exponent, -12, -3):
        scaled = value / Fraction(10) ** exponent
        if scaled.denominator == 1:
            return f"{scaled.numerator}{_DECIMAL_BY_EXPONENT[exponent]}"
    raise AssertionError("a value rounded to nano always has an integral nano mantissa")


def _format_bytes(value: Fraction) -> str:
    whole = math.ceil(value)
    if whole == 0:
        return "0"
    for power in range(6, 0, -1):
        unit = 1024**power
        if abs(whole) >= unit and whole % unit == 0:
            return f"{whole // unit}{_BINARY_BY_POWER[power]}"
    return str(whole)


def format_quantity(value: QuantityLike, kind: Literal["cpu", "memory", "plain"] = "plain") -> str:
    """Render a quantity (in base units: cores, bytes, items) for display and for manifests.

    - ``cpu``: whole cores as "2", otherwise millicores "1500m" (finer values "u"/"n").
    - ``memory``: bytes with the largest exact binary suffix ("1Gi", "1536Mi"), otherwise the
      plain byte count rounded up ("1073741825").
    - ``plain``: Kubernetes' canonical decimal form, as ``kubectl`` prints a quantity that
      was written without a binary suffix ("1k", "1500m", "4").
    Every result parses back to the same value (memory: to the value rounded up to a byte).
    """
    number = parse_quantity(value)
    if kind == "cpu":
        return _format_decimal_si(number, 0)
    if kind == "memory":
        return _format_bytes(number)
    if kind == "plain":
        return _format_decimal_si(number, 18)
    raise ValueError(f"unknown quantity kind {kind!r}: expected 'cpu', 'memory' or 'plain'")


def _parse_list(resources: Mapping[str, QuantityLike] | None) -> dict[str, Fraction]:
    parsed: dict[str, Fraction] = {}
    for name, raw in (resources or {}).items():
        try:
            parsed[name] = parse_quantity(raw)
        except ValueError as exc:
            raise ValueError(f"resource {name!r}: {exc}") from None
    return parsed


def sum_resources(lists: Iterable[Mapping[str, QuantityLike] | None]) -> dict[str, Fraction]:
    """Per-resource totals of several resource lists (containers of a pod, pods on a node)."""
    total: dict[str, Fraction] = {}
    for resources in lists:
        for name, amount in _parse_list(resources).items():
            total[name] = total.get(name, Fraction(0)) + amount
    return total


def add(a: Mapping[str, QuantityLike] | None, b: Mapping[str, QuantityLike] | None) -> dict[str, Fraction]:
    """``a + b`` per resource; a resource missing on one side counts as zero."""
    return sum_resources([a, b])


def sub(a: Mapping[str, QuantityLike] | None, b: Mapping[str, QuantityLike] | None) -> dict[str, Fraction]:
    """``a - b`` per resource; may go negative (the caller decides what over-commit means)."""
    result = _parse_list(a)
    for name, amount in _parse_list(b).items():
        result[name] = result.get(name, Fraction(0)) - amount
    return result


def fits(request: Mapping[str, QuantityLike] | None, free: Mapping[str, QuantityLike] | None) -> list[str]:
    """Names of the requested resources that ``free`` cannot cover, in request order.

    An empty list means the request fits. A resource absent from ``free`` has nothing free,
    so any positive request of it is insufficient; a zero request always fits. Returning
    names rather than a bool lets the scheduler say *why* ("Insufficient nvidia.com/gpu").
    """
    available = _parse_list(free)
    return [
        name
        for name, amount in _parse_list(request).items()
        if amount > 0 and amount > available.get(name, Fraction(0))
    ]
