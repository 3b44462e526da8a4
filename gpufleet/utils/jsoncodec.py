"""JSON through orjson where it gives the same value as the standard library, which takes
the rest: integers past 64 bits, NaN and infinities (as Python writes and reads them), keys
that are not strings. What the standard library refuses is refused with its error."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# What orjson would write in its own way (datetimes and dataclasses, which the standard
# library refuses; subclasses of str, int, dict and list): left to the standard library.
_STRICT = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


# 19 digits in a row may be an integer past 64 bits, which orjson would read as a float.
_LONG_NUMBER = re.compile(rb"[0-9]{19}")


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if _LONG_NUMBER.search(raw) is None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)  # NaN, an integer past 64 bits, or not JSON: its ValueError


def orjson_exact(obj: Any) -> bytes | None:
    """orjson's text of ``obj`` when it reads back as the same value; None when the standard
    library must take it (integers past 64 bits, keys that are not strings, the types above,
    or a null that may have been NaN or an infinity, which orjson writes as null)."""
    try:
        text = orjson.dumps(obj, option=_STRICT)
    except TypeError:  # orjson.JSONEncodeError
        return None
    return None if b"null" in text else text


def dumps(obj: Any) -> bytes:
    """Compact JSON (no spaces), UTF-8."""
    text = orjson_exact(obj)
    return text if text is not None else json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
