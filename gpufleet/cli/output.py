"""What every client command shares: connecting through a kubeconfig, reporting errors the
way kubectl does (one line on stderr, never a traceback), and printing tables.

Tables come from the API server (`meta.k8s.io/v1` Table): the server defines each kind's
columns once and every client (this CLI, kubectl, the dashboard) shows the same ones.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from gpufleet.api.registry import ResourceType
from gpufleet.client.api import Client
from gpufleet.client.errors import ApiError, TransportError
from gpufleet.client.kubeconfig import KubeConfigError, load_kubeconfig, transport_from_config

TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

# Shared option declarations, so every command spells and documents them the same way.
KubeconfigOpt = Annotated[
    Path | None,
    typer.Option("--kubeconfig", help="Kubeconfig file (default: $KUBECONFIG, then ~/.gpufleet/kubeconfig)."),
]
ContextOpt = Annotated[str | None, typer.Option("--context", help="Kubeconfig context to use.")]
NamespaceOpt = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="Namespace (default: the kubeconfig context's, else \"default\")."),
]


class CliError(Exception):
    """A failure already worded for the user; `run` prints it (unless it is empty: already
    reported) and exits with `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def out(message: str = "") -> None:
    print(message, flush=True)


# -- connecting -----------------------------------------------------------------------


@dataclass
class Session:
    client: Client
    namespace: str
    # True when -n was given: apply then refuses manifests that name another namespace.
    namespace_explicit: bool
    server: str
    kinds: Any = field(default=None)


# The URL of the server the command is talking to, for the connection-refused message
# (the error surfaces in `run`, outside the session that knows it).
_current_server: list[str] = []


@asynccontextmanager
async def connect(kubeconfig: Path | None, namespace: str | None, context: str | None = None):
    from gpufleet.cli.kinds import KindResolver

    config = load_kubeconfig(kubeconfig, context=context)
    _current_server[:] = [config.server]
    ns = namespace or config.namespace or "default"
    client = Client(transport_from_config(config), default_namespace=ns)
    session = Session(client, ns, bool(namespace), config.server)
    session.kinds = KindResolver(client)
    try:
        yield session
    finally:
        await client.close()


def run(main: Callable[[], Awaitable[int | None]]) -> None:
    """Run a command's coroutine and turn every expected failure into a message and an exit code."""
    try:
        code = asyncio.run(main())
    except CliError as e:
        if e.message:
            err(e.message)
        raise typer.Exit(e.code) from None
    except ApiError as e:
        err(api_error_message(e))
        raise typer.Exit(1) from None
    except TransportError as e:
        err(transport_error_message(e))
        raise typer.Exit(1) from None
    except KubeConfigError as e:
        err(f"error: {e}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise typer.Exit(code or 0)


def api_error_message(e: ApiError) -> str:
    """kubectl's wording: `Error from server (NotFound): pods "x" not found`, and for 422 the
    message rebuilt from the Status causes."""
    causes = e.causes
    if e.code == 422 and causes and e.details.get("kind"):
        parts = [_cause_text(c) for c in causes]
        head = f'The {e.details["kind"]} "{e.details.get("name", "")}" is invalid: '
        if len(parts) == 1:
            return head + parts[0]
        return head + "".join(f"\n* {p}" for p in parts)
    return f"Error from server ({e.reason}): {e.message}"


def _cause_text(cause: Mapping[str, Any]) -> str:
    fld, msg = cause.get("field") or "", str(cause.get("message") or cause.get("reason") or "")
    return f"{fld}: {msg}" if fld else msg


def problem_text(e: ApiError) -> str:
    """Just what was wrong (no "Error from server" framing), for messages that already say
    which object was being written."""
    if e.code in (400, 422) and e.causes:
        return "; ".join(_cause_text(c) for c in e.causes)
    if e.code in (400, 422):
        return e.message
    return f"Error from server ({e.reason}): {e.message}"


def transport_error_message(e: TransportError) -> str:
    server = _current_server[0] if _current_server else "the API server"
    cause = e.__cause__
    if isinstance(cause, httpx.ConnectError | httpx.ConnectTimeout):
        return (
            f"error: cannot connect to the API server at {server} (connection refused): "
            'is it running? Start a local cluster with "gpufleet up".'
        )
    if isinstance(cause, httpx.TimeoutException):
        return f"error: the API server at {server} did not answer in time"
    return f"error: lost the connection to the API server at {server}: {e}"


def print_warnings(headers: Mapping[str, str]) -> None:
    """Print the server's `Warning: 299 - "..."` headers the way kubectl does."""
    raw = headers.get("warning")
    if not raw:
        return
    for text in _split_warnings(raw):
        err(f"Warning: {text}")


def _split_warnings(raw: str) -> list[str]:
    out: list[str] = []
    i = 0
    while True:
        start = raw.find('"', i)
        if start < 0:
            break
        j, buf = start + 1, []
        while j < len(raw) and raw[j] != '"':
            if raw[j] == "\\" and j + 1 < len(raw):
                j += 1
            buf.append(raw[j])
            j += 1
        out.append("".join(buf))
        i = j + 1
    return out or [raw]


# -- naming ---------------------------------------------------------------------------


def kind_ref(rt: ResourceType) -> str:
    """'pod', 'deployment.apps': how kubectl names a kind in its messages (`deployment.apps/web
    created`, `deployment.apps "web" deleted`)."""
    return f"{rt.singular}.{rt.group}" if rt.group else rt.singular


def meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    m = obj.get("metadata") if isinstance(obj, Mapping) else None
    return m if isinstance(m, dict) else {}


# -- time -----------------------------------------------------------------------------


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def human_duration(seconds: float) -> str:
    """kubectl's HumanDuration: precise while small, coarser as it grows ('90s', '5m3s', '3d4h')."""
    if seconds < -1:
        return "<invalid>"
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        rem = s % 60
        return f"{m}m{rem}s" if rem else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        rem = m % 60
        return f"{h}h{rem}m" if rem else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        rem = h % 24
        return f"{h // 24}d{rem}h" if rem else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    if h < 24 * 365 * 8:
        days = (h // 24) % 365
        return f"{h // 24 // 365}y{days}d" if days else f"{h // 24 // 365}y"
    return f"{h // 24 // 365}y"


def age(timestamp: Any, now: datetime | None = None) -> str:
    dt = parse_time(timestamp)
    if dt is None:
        return "<unknown>"
    now = now or datetime.now(UTC)
    return human_duration((now - dt).total_seconds())


# -- tables ---------------------------------------------------------------------------


def cell_text(value: Any) -> str:
    if value is None:
        return "<none>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return ",".join(cell_text(v) for v in value) or "<none>"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def format_table(
    headers: Sequence[str] | None,
    rows: Iterable[Sequence[str]],
    *,
    indent: str = "",
    padding: int = 3,
    min_width: int = 0,
) -> list[str]:
    """Aligned columns without borders, like kubectl's tabwriter: each column as wide as its
    widest cell plus padding, the last one unpadded (no trailing blanks)."""
    all_rows = [list(headers)] if headers is not None else []
    all_rows += [list(r) for r in rows]
    if not all_rows:
        return []
    ncols = max(len(r) for r in all_rows)
    widths = [0] * ncols
    for r in all_rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    return [_join_row(r, widths, indent, padding, min_width) for r in all_rows]


def _join_row(row: Sequence[str], widths: Sequence[int], indent: str, padding: int, min_width: int) -> str:
    parts = []
    for i, c in enumerate(row):
        if i == len(row) - 1:
            parts.append(c)
        else:
            parts.append(c.ljust(max(widths[i] + padding, min_width)))
    return (indent + "".join(parts)).rstrip()


@dataclass
class TableView:
    """A server Table (or a plain list shown as one): column definitions and rows, each row
    with its cells and the object's metadata."""

    columns: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    resource_version: str = ""

    @classmethod
    def from_response(cls, data: Mapping[str, Any]) -> TableView:
        if data.get("kind") == "Table":
            return cls(
                [c for c in data.get("columnDefinitions") or [] if isinstance(c, dict)],
                [r for r in data.get("rows") or [] if isinstance(r, dict)],
                str(meta(data).get("resourceVersion") or ""),
            )
        # A server that answers a Table request with the plain list or object still gets
        # kubectl's fallback: name and age.
        items = data.get("items") if "items" in data else [data]
        columns = [
            {"name": "Name", "type": "string", "format": "name", "priority": 0},
            {"name": "Age", "type": "string", "format": "", "priority": 0},
        ]
        rows = []
        for item in items or []:
            m = meta(item)
            rows.append({"cells": [m.get("name", ""), age(m.get("creationTimestamp"))],
                         "object": {"metadata": m}})
        return cls(columns, rows, str(meta(data).get("resourceVersion") or ""))


@dataclass
class TablePrinter:
    """Turns server Tables into lines: picks columns (priority > 0 only with -o wide), adds
    NAMESPACE first for -A, LABELS last for --show-labels, and a kind prefix on names when
    several kinds are printed. Column widths persist so rows printed later by a watch stay
    aligned under the header."""

    wide: bool = False
    with_namespace: bool = False
    show_labels: bool = False
    name_prefix: str = ""
    no_headers: bool = False
    widths: list[int] = field(default_factory=list)

    def _visible(self, columns: Sequence[Mapping[str, Any]]) -> list[int]:
        return [i for i, c in enumerate(columns) if self.wide or int(c.get("priority") or 0) == 0]

    def header(self, columns: Sequence[Mapping[str, Any]]) -> list[str]:
        names = [str(columns[i].get("name", "")).upper() for i in self._visible(columns)]
        if self.with_namespace:
            names.insert(0, "NAMESPACE")
        if self.show_labels:
            names.append("LABELS")
        return names

    def cells(self, columns: Sequence[Mapping[str, Any]], row: Mapping[str, Any]) -> list[str]:
        raw = list(row.get("cells") or [])
        name_col = next((i for i, c in enumerate(columns) if c.get("format") == "name"), 0)
        out = []
        for i in self._visible(columns):
            value = raw[i] if i < len(raw) else ""
            text = cell_text(value) if i < len(raw) else ""
            if i == name_col and self.name_prefix:
                text = self.name_prefix + text
            out.append(text)
        obj_meta = meta(row.get("object") or {})
        if self.with_namespace:
            out.insert(0, str(obj_meta.get("namespace") or ""))
        if self.show_labels:
            out.append(format_labels(obj_meta.get("labels")))
        return out

    def lines(self, view: TableView, *, header: bool = True) -> list[str]:
        rows = [self.cells(view.columns, r) for r in view.rows]
        head = self.header(view.columns) if header and not self.no_headers else None
        table = ([head] if head else []) + rows
        if not table:
            return []
        ncols = max(len(r) for r in table)
        widths = list(self.widths) + [0] * max(0, ncols - len(self.widths))
        for r in table:
            for i, c in enumerate(r):
                widths[i] = max(widths[i], len(c))
        self.widths = widths
        return [_join_row(r, widths, "", 3, 0) for r in table]


def format_labels(labels: Any) -> str:
    if not isinstance(labels, Mapping) or not labels:
        return "<none>"
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def strip_managed_fields(obj: Any) -> Any:
    """What -o yaml/json shows: kubectl hides managedFields unless asked."""
    if isinstance(obj, dict):
        m = obj.get("metadata")
        if isinstance(m, dict):
            m.pop("managedFields", None)
        items = obj.get("items")
        for item in items if isinstance(items, list) else []:
            strip_managed_fields(item)
    return obj


def dump(obj: Any, fmt: str) -> str:
    """An object as kubectl's -o yaml / -o json prints it."""
    import yaml

    if fmt == "json":
        return json.dumps(obj, indent=4, ensure_ascii=False)
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, allow_unicode=True).rstrip("\n")


def parse_duration(text: str) -> float:
    """'30s', '2m', '1h30m', '45' (seconds) -> seconds; raises ValueError."""
    import re

    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"invalid duration {text!r} (use e.g. 30s, 2m, 1h)")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * scale[u] for n, u in parts)
