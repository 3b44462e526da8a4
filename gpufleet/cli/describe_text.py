"""Building blocks of `gpufleet describe` output: aligned `Key:  value` blocks, indented
sub-tables, quantities and selectors written the way kubectl writes them."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from gpufleet.api import quantity as api_quantity
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


def parse_quantity(value: Any) -> Fraction | None:
    """A quantity's exact value (gpufleet.api.quantity), or None when it is not one."""
    if value is None:
        return None
    try:
        return api_quantity.parse_quantity(value)
    except (ValueError, TypeError):
        return None


def format_quantity(resource: str, amount: Fraction) -> str:
    """A sum of requests written back as a quantity: cpu in millicores when fractional,
    memory in the largest binary unit that divides it, others as plain numbers."""
    if resource == "cpu":
        if amount.denominator == 1:
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
    if amount.denominator == 1:
        return str(int(amount))
    return str((Decimal(amount.numerator) / Decimal(amount.denominator)).normalize())


def percent(part: Fraction, whole: Fraction | None) -> str:
    if not whole:
        return "0%"
    return f"{int(part * 100 / whole)}%"
