"""The JSONPath of a CRD's additionalPrinterColumns, as client-go's jsonpath reads it.

A column names ``.spec.replicas``, ``.status.conditions[?(@.type=="Ready")].status``,
``.spec.containers[0].image``, ``.status.conditions[-1:].type``,
``.metadata.labels['app\\.kubernetes\\.io/name']`` or ``.items[*].name``; ``find`` gives
every value it reaches, in order (the printer shows the first). What the grammar does not
cover finds nothing, rather than failing a whole table.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

_FILTER = re.compile(r"""^\?\(@((?:\.[\w-]+|\[['"][^'"]+['"]\])*)\s*(==|!=)\s*(.+?)\s*\)$""")


class JSONPathError(ValueError):
    pass


def _strip_braces(expr: str) -> str:
    expr = expr.strip()
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1].strip()
    return expr


@lru_cache(maxsize=512)
def parse(expr: str) -> tuple[tuple[str, Any], ...]:
    """The steps of ``expr``: ("field", name), ("index", n), ("all", None) or
    ("filter", (steps, operator, value))."""
    text = _strip_braces(expr)
    if text.startswith("$"):
        text = text[1:]
    steps: list[tuple[str, Any]] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == ".":
            j = i + 1
            while j < len(text) and text[j] not in ".[":
                j += 1
            name = text[i + 1:j]
            if name == "*":
                steps.append(("all", None))
            elif name:
                steps.append(("field", name))
            i = j
        elif ch == "[":
            j = _closing(text, i)
            inner = text[i + 1:j].strip()
            i = j + 1
            if inner in ("*", ":"):
                steps.append(("all", None))
            elif inner.startswith("?"):
                m = _FILTER.match(inner)
                if m is None:
                    raise JSONPathError(f"unsupported filter {inner!r}")
                value_text = m.group(3)
                try:
                    value = json.loads(value_text.replace("'", '"'))
                except ValueError:
                    value = value_text
                steps.append(("filter", (parse("." + m.group(1).lstrip(".")) if m.group(1) else (),
                                         m.group(2), value)))
            elif ":" in inner:
                start, _, end = inner.partition(":")
                try:
                    steps.append(("slice", (int(start) if start.strip() else None,
                                            int(end) if end.strip() else None)))
                except ValueError:
                    raise JSONPathError(f"unsupported slice [{inner}]") from None
            elif inner[:1] in ("'", '"'):
                steps.append(("field", inner[1:-1].replace("\\.", ".")))
            else:
                try:
                    steps.append(("index", int(inner)))
                except ValueError:
                    raise JSONPathError(f"unsupported subscript [{inner}]") from None
        else:
            raise JSONPathError(f"unexpected {ch!r} at {i} in {expr!r}")
    return tuple(steps)


def _closing(text: str, start: int) -> int:
    depth = 0
    quote = ""
    for j in range(start, len(text)):
        c = text[j]
        if quote:
            if c == quote and text[j - 1] != "\\":
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return j
    raise JSONPathError(f"unclosed [ in {text!r}")


def _walk(values: list[Any], steps: tuple[tuple[str, Any], ...]) -> list[Any]:
    for kind, arg in steps:
        out: list[Any] = []
        for v in values:
            if kind == "field":
                if isinstance(v, dict) and arg in v:
                    out.append(v[arg])
            elif kind == "index":
                if isinstance(v, list) and -len(v) <= arg < len(v):
                    out.append(v[arg])
            elif kind == "slice":
                if isinstance(v, list):
                    out.extend(v[arg[0]:arg[1]])
            elif kind == "all":
                if isinstance(v, list):
                    out.extend(v)
                elif isinstance(v, dict):
                    out.extend(v.values())
            elif kind == "filter" and isinstance(v, list):
                sub_steps, op, want = arg
                for item in v:
                    got = _walk([item], sub_steps)
                    hit = bool(got) and got[0] == want
                    if hit == (op == "=="):
                        out.append(item)
        values = out
    return values


def find(obj: Any, expr: str) -> list[Any]:
    """Every value ``expr`` reaches in ``obj`` (none for a path it cannot follow)."""
    try:
        steps = parse(expr)
    except JSONPathError:
        return []
    return _walk([obj], steps)
