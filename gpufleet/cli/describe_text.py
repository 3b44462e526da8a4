"""Building blocks of `gpufleet describe` output: aligned `Key:  value` blocks, indented
sub-tables, quantities and selectors written the way kubectl writes them."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from gpufleet.cli.output import format_table, parse_time

INDENT = "  "


@dataclass
class Doc:
    """Lines of a description. Consecutive `Key: value` lines are aligned on their values
    (like kubectl's tabwriter); raw lines and tables break the alignment block."""

    # ("kv", level, key, value) or ("raw", text)
    items: list[tuple] = field(default_factory=list)

    def kv(self, level: int, key: str, value: Any) -> None:
        self.items.append(("kv", level, key, "" if value is None else str(value)))

    def title(self, level: int, text: str) -> None:
        self.items.append(("raw", INDENT * level + text))

    def blank(self) -> None:
        self.items.append(("raw", ""))

    def lines(self, level: int, key: str, values: Sequence[str], empty: str = "<none>") -> None:
        """A key whose value spans lines (labels, taints): the first next to the key, the
        rest aligned under it."""
        if not values:
            self.kv(level, key, empty)
            return
        self.kv(level, key, values[0])
        for v in values[1:]:
            self.items.append(("kv", level, "", v))

    def mapping(self, level: int, key: str, values: Mapping[str, Any] | None, sep: str = "=") -> None:
        items = sorted((values or {}).items())
        self.lines(level, key, [f"{k}{sep}{v}" for k, v in items])

    def table(self, level: int, headers: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
        """A sub-table with a dashed rule under the header, as kubectl prints Events."""
        rows = [list(r) for r in rows]
        rule = ["-" * len(h) for h in headers]
        for line in format_table(headers, [rule, *rows], indent=INDENT * level, padding=2):
            self.items.append(("raw", line))

    def render(self) -> str:
        out: list[str] = []
        block: list[tuple] = []

        def flush() -> None:
            if not block:
                return
            width = max(len(INDENT * lv + (k + ":" if k else "")) for _, lv, k, _ in block)
            for _, lv, k, v in block:
                left = INDENT * lv + (k + ":" if k else "")
                out.append((left.ljust(width + 2) + v).rstrip() if v else left.rstrip())
            block.clear()

        for item in self.items:
            if item[0] == "kv":
                block.append(item)
            else:
                flush()
                out.append(item[1])
        flush()
        return "\n".join(out)


def when(value: Any) -> str:
    """kubectl's describe time format (RFC 1123 with a numeric zone)."""
    dt = parse_time(value)
    if dt is None:
        return "<unset>" if not value else str(value)
    return dt.strftime("%a, %d %b %Y %H:%M:%S %z")


def smart_label(key: str) -> str:
    """'pytorchReplicaSpecs' -> 'Pytorch Replica Specs'; keys that are not identifiers
    ('nvidia.com/gpu') stay as they are."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", key):
        return key
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", " ", key).split()
    return " ".join(w[:1].upper() + w[1:] for w in words)


def selector_text(selector: Any) -> str:
    """A LabelSelector as a string (`app=web,tier in (a,b)`), or '<none>'."""
    if not isinstance(selector, Mapping):
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key", ""), expr.get("operator", "")
        values = ",".join(expr.get("values") or [])
        if op == "In":
            parts.append(f"{key} in ({values})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({values})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts) or "<none>"


# -- quantities -----------------------------------------------------------------------

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
            "P": Decimal("1e15"), "E": Decimal("1e18")}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(value: Any) -> Decimal | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return Decimal(str(value))
    m = _QUANTITY.match(str(value).strip())
    if not m:
        return None
    try:
        number = Decimal(m.group(1))
    except InvalidOperation:
        return None
    suffix = m.group(2) or ""
    return number * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])


def format_quantity(resource: str, amount: Decimal) -> str:
    """A sum of requests written back as a quantity: cpu in millicores when fractional,
    memory in the largest binary unit that divides it, others as plain numbers."""
    if resource == "cpu":
        if amount == amount.to_integral_value():
            return str(int(amount))
        return f"{int(amount * 1000)}m"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        if amount == 0:
            return "0"
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            unit = _BINARY[suffix]
            if amount >= unit and amount % unit == 0:
                return f"{int(amount / unit)}{suffix}"
        return str(int(amount))
    if amount == amount.to_integral_value():
        return str(int(amount))
    return str(amount.normalize())


def percent(part: Decimal, whole: Decimal | None) -> str:
    if not whole:
        return "0%"
    return f"{int(part * 100 / whole)}%"
