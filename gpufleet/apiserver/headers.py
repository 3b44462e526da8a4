"""Response headers that can always be sent.

An HTTP header value carries visible ASCII, spaces and tabs safely; anything else (a control
character, a line break, a character past latin-1) makes the HTTP layer refuse the response,
after a write may already be stored. Every response passes through :func:`safe_headers`
(in ApiServer.handle, and again in the HTTP adapter), so no client input echoed into a header
can turn a stored write into a 500 or a dropped connection.

Warnings are built like Kubernetes' ``299 - "text"`` (k8s.io/apimachinery's NewWarningHeader
quotes the text, escaping quotes and backslashes); where Kubernetes drops a warning whose text
holds control characters, we escape them (and every other character outside printable ASCII)
as ``\\uXXXX``, so the warning still names the field. Like kube-apiserver's warning recorder,
identical warnings are sent once, and past 4096 characters in all each is cut to 256 and the
rest dropped.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger("gpufleet.apiserver")

# RFC 9110 token: what a header name may hold.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
# Everything but HTAB and visible ASCII/space.
_UNSAFE = re.compile(r"[^\t\x20-\x7e]")

WARNING_TOTAL_LIMIT = 4096
WARNING_ITEM_LIMIT = 256


def _escape_char(m: re.Match[str]) -> str:
    code = ord(m.group())
    if code == 0x0A:
        return "\\n"
    if code == 0x0D:
        return "\\r"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape(value: str) -> str:
    """``value`` with every character a header cannot carry written as an escape."""
    return _UNSAFE.sub(_escape_char, value)


def _quote(text: str) -> str:
    """Kubernetes' quoted warning text; a tab, which a header may carry but a warning's text
    may not (it holds no control characters), is escaped too."""
    return '"' + escape(text.replace("\\", "\\\\").replace('"', '\\"')).replace("\t", "\\t") + '"'


def warning_header(warnings: list[str]) -> dict[str, str]:
    """The Warning header for these warning texts ({} when there are none)."""
    texts = [w for w in dict.fromkeys(warnings) if w]
    if not texts:
        return {}
    if sum(len(t) for t in texts) > WARNING_TOTAL_LIMIT:
        cut, total = [], 0
        for t in texts:
            t = t if len(t) <= WARNING_ITEM_LIMIT else t[: WARNING_ITEM_LIMIT - 3] + "..."
            if total + len(t) > WARNING_TOTAL_LIMIT:
                break
            cut.append(t)
            total += len(t)
        texts = cut
    return {"warning": ", ".join(f"299 - {_quote(t)}" for t in texts)}


def safe_headers(headers: dict[str, str]) -> dict[str, str]:
    """Headers an HTTP/1.1 response can always carry: a value's unsendable characters are
    escaped; a name that is not a token (only server code makes names) is dropped."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not _TOKEN.match(name):
            log.warning("dropping response header with an invalid name %r", name)
            continue
        value = value if isinstance(value, str) else str(value)
        out[name] = escape(value).strip(" \t") if _UNSAFE.search(value) or value != value.strip(" \t") else value
    return out
