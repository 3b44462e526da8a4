"""JSON through orjson where it gives the same value as the standard library, which takes
the rest: integers past 64 bits, NaN and infinities (as Python writes and reads them), keys
that are not strings. What the standard library refuses is refused with its error."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# Types orjson would write that the standard library refuses: raise, as it does.
_STRICT = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


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


def dumps(obj: Any) -> bytes:
    """Compact JSON (no spaces), UTF-8."""
    try:
        text = orjson.dumps(obj, option=_STRICT)
    except TypeError:
        pass
    else:
        # orjson writes NaN and infinities as null: a null may be one of them.
        if b"null" not in text:
            return text
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
