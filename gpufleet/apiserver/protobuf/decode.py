"""The protobuf wire reader and the decoder that turns a message into kubectl's JSON, following
the per-message schema in `schema` (see the package docstring for the rules).
"""

from __future__ import annotations

import base64
import datetime as _dt
from typing import Any

import orjson

from gpufleet.apiserver.errors import ApiException, bad_request
from gpufleet.apiserver.protobuf.schema import (
    _SCALARS,
    _SPECIAL,
    _ZERO,
    KINDS,
    SUBRESOURCE_KINDS,
    _compiled,
    _Field,
)

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5

# Go's zero time.Time, in Unix seconds; Kubernetes writes it as an empty Time message, but a
# writer that encodes the value literally must still decode to null.
_GO_ZERO_TIME = -62135596800


class ProtobufDecodeError(ApiException):
    """A body that is not valid Kubernetes protobuf, or uses a field this server cannot map."""

    def __init__(self, message: str) -> None:
        err = bad_request(f"the body of the request could not be decoded as protobuf: {message}")
        super().__init__(err.code, err.reason, err.message)


# ---------------------------------------------------------------------------- wire reader


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise ProtobufDecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProtobufDecodeError("varint longer than 10 bytes")


def _fields(buf: bytes, message: str):
    """Yields (field number, wire type, value): an int for varint/fixed, bytes for length-delimited."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos, end)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise ProtobufDecodeError(f"field number 0 in {message}")
        if wt == _VARINT:
            val, pos = _varint(buf, pos, end)
            yield num, wt, val
        elif wt == _LEN:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise ProtobufDecodeError(f"field {num} of {message} runs past the end of its message")
            yield num, wt, buf[pos : pos + n]
            pos += n
        elif wt == _FIXED64:
            if pos + 8 > end:
                raise ProtobufDecodeError(f"truncated 64-bit field {num} in {message}")
            yield num, wt, int.from_bytes(buf[pos : pos + 8], "little")
            pos += 8
        elif wt == _FIXED32:
            if pos + 4 > end:
                raise ProtobufDecodeError(f"truncated 32-bit field {num} in {message}")
            yield num, wt, int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4
        else:
            raise ProtobufDecodeError(f"unsupported wire type {wt} for field {num} in {message}")


def _signed(v: int, bits: int) -> int:
    # Negative int32/int64 values travel as 64-bit two's complement varints.
    v &= (1 << 64) - 1
    if v >= 1 << 63:
        v -= 1 << 64
    if bits == 32 and not -(1 << 31) <= v < (1 << 31):
        raise ProtobufDecodeError(f"value {v} does not fit in int32")
    return v


# ------------------------------------------------------------------------------- decoding


def _where(message: str, num: int, f: _Field | None = None) -> str:
    return f'field {num} ("{f.name}") of {message}' if f and f.name else f"field {num} of {message}"


def _scalar(elem: str, wt: int, val: Any, message: str, num: int, f: _Field) -> Any:
    if elem in ("int32", "int64", "bool"):
        if wt != _VARINT:
            raise ProtobufDecodeError(f"{_where(message, num, f)} should be a varint, got wire type {wt}")
        if elem == "bool":
            return val != 0
        return _signed(val, 32 if elem == "int32" else 64)
    if wt != _LEN:
        raise ProtobufDecodeError(f"{_where(message, num, f)} should be length-delimited, got wire type {wt}")
    if elem == "bytes":
        return base64.b64encode(val).decode("ascii")
    try:
        return val.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtobufDecodeError(f"{_where(message, num, f)} is not valid UTF-8") from None


def _time(buf: bytes, micro: bool) -> str | None:
    seconds = nanos = 0
    for num, wt, val in _fields(buf, "Time"):
        if wt != _VARINT or num not in (1, 2):
            raise ProtobufDecodeError(f"unexpected field {num} (wire type {wt}) in Time")
        if num == 1:
            seconds = _signed(val, 64)
        else:
            nanos = _signed(val, 32)
    if not buf or (seconds == _GO_ZERO_TIME and nanos == 0):
        return None  # Go's zero time, which JSON renders as null
    try:
        t = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC) + _dt.timedelta(seconds=seconds)
    except OverflowError:
        raise ProtobufDecodeError(f"time {seconds}s is out of range") from None
    # Same layouts as metav1.Time (RFC 3339, seconds) and metav1.MicroTime (microseconds).
    text = f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
    if micro:
        text += f".{nanos // 1000:06d}"
    return text + "Z"


def _quantity(buf: bytes) -> str:
    out = ""
    for num, wt, val in _fields(buf, "Quantity"):
        if num != 1 or wt != _LEN:
            raise ProtobufDecodeError(f"unexpected field {num} (wire type {wt}) in Quantity")
        out = val.decode("utf-8", errors="strict")
    return out or "0"  # a zero Quantity marshals as "0" in JSON


def _int_or_string(buf: bytes) -> int | str:
    kind, int_val, str_val = 0, 0, ""
    for num, wt, val in _fields(buf, "IntOrString"):
        if num in (1, 2) and wt == _VARINT:
            if num == 1:
                kind = _signed(val, 64)
            else:
                int_val = _signed(val, 32)
        elif num == 3 and wt == _LEN:
            str_val = val.decode("utf-8")
        else:
            raise ProtobufDecodeError(f"unexpected field {num} (wire type {wt}) in IntOrString")
    return str_val if kind == 1 else int_val


def _fields_v1(buf: bytes) -> Any:
    raw = b""
    for num, wt, val in _fields(buf, "FieldsV1"):
        if num != 1 or wt != _LEN:
            raise ProtobufDecodeError(f"unexpected field {num} (wire type {wt}) in FieldsV1")
        raw = val
    try:
        return orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        raise ProtobufDecodeError("managedFields fieldsV1 is not JSON") from None


def _special(elem: str, buf: bytes) -> Any:
    if elem == "Time":
        return _time(buf, micro=False)
    if elem == "MicroTime":
        return _time(buf, micro=True)
    if elem == "Quantity":
        return _quantity(buf)
    if elem == "IntOrString":
        return _int_or_string(buf)
    return _fields_v1(buf)


def _element(elem: str, wt: int, val: Any, message: str, num: int, f: _Field) -> Any:
    if elem in _SCALARS:
        return _scalar(elem, wt, val, message, num, f)
    if wt != _LEN:
        raise ProtobufDecodeError(f"{_where(message, num, f)} should be a message, got wire type {wt}")
    if elem in _SPECIAL:
        return _special(elem, val)
    return _decode_message(val, elem)


def _map_entry(buf: bytes, elem: str, message: str, num: int, f: _Field) -> tuple[str, Any]:
    key: str = ""
    value: Any = None
    for n, wt, val in _fields(buf, f"{message}.{f.name} entry"):
        if n == 1:
            if wt != _LEN:
                raise ProtobufDecodeError(f"map key of {_where(message, num, f)} is not a string")
            key = val.decode("utf-8")
        elif n == 2:
            value = _element(elem, wt, val, message, num, f)
        else:
            raise ProtobufDecodeError(f"unexpected field {n} in a map entry of {_where(message, num, f)}")
    if value is None:
        value = _default_element(elem)
    return key, value


def _default_element(elem: str) -> Any:
    if elem in _SCALARS:
        return _ZERO[elem]
    if elem in _SPECIAL:
        return _special(elem, b"")
    return _decode_message(b"", elem)


def _decode_message(buf: bytes, message: str) -> dict[str, Any]:
    fields = _compiled(message)
    out: dict[str, Any] = {}
    inline: list[dict[str, Any]] = []
    seen: set[int] = set()
    for num, wt, val in _fields(buf, message):
        f = fields.get(num)
        if f is None:
            raise ProtobufDecodeError(f"unknown field {num} (wire type {wt}) in {message}")
        if f.mode == "unsupported":
            raise ProtobufDecodeError(
                f"{_where(message, num, f)} ({f.raw_type}) is not supported in protobuf bodies by this "
                "server; send the object as application/json"
            )
        seen.add(num)
        if f.mode == "inline":
            if wt != _LEN:
                raise ProtobufDecodeError(
                    f"{_where(message, num, f)} should be a message, got wire type {wt}"
                )
            inline.append(_decode_message(val, f.elem))
        elif f.shape == "map":
            if wt != _LEN:
                raise ProtobufDecodeError(
                    f"{_where(message, num, f)} should be a map entry, got wire type {wt}"
                )
            k, v = _map_entry(val, f.elem, message, num, f)
            out.setdefault(f.name, {})[k] = v
        elif f.shape == "list":
            items = out.setdefault(f.name, [])
            if wt == _LEN and f.elem in ("int32", "int64", "bool"):
                # Packed encoding: a run of varints in one length-delimited field.
                pos = 0
                while pos < len(val):
                    v, pos = _varint(val, pos, len(val))
                    items.append(_scalar(f.elem, _VARINT, v, message, num, f))
            else:
                items.append(_element(f.elem, wt, val, message, num, f))
        else:
            out[f.name] = _element(f.elem, wt, val, message, num, f)

    # Go's JSON encoder decides what a JSON client would have written; apply its rules.
    result: dict[str, Any] = {}
    for num, f in fields.items():
        if f.mode in ("inline", "unsupported"):
            continue
        present = num in seen
        if f.shape in ("list", "map"):
            if present:
                result[f.name] = out[f.name]
            elif f.mode == "always":
                result[f.name] = None  # a nil slice/map without omitempty is null
        elif f.mode == "ptr":
            if present:
                result[f.name] = out[f.name]
        elif f.elem in _SCALARS:
            value = out[f.name] if present else _ZERO[f.elem]
            if f.mode == "always" or value != _ZERO[f.elem]:
                result[f.name] = value
        else:
            # Structs held by value are always written, including Time (null when zero),
            # Quantity ("0") and IntOrString (0).
            result[f.name] = out[f.name] if present else _default_element(f.elem)
    for extra in inline:
        result.update(extra)
    return result


# ---------------------------------------------------------------------------------- entry


def _envelope(body: bytes) -> tuple[str, str, bytes, str, str]:
    api_version = kind = content_encoding = content_type = ""
    raw = b""
    for num, wt, val in _fields(body[len(MAGIC) :], "runtime.Unknown"):
        if wt != _LEN:
            raise ProtobufDecodeError(f"unexpected wire type {wt} for field {num} of runtime.Unknown")
        if num == 1:
            for n, w, v in _fields(val, "runtime.TypeMeta"):
                if w != _LEN:
                    raise ProtobufDecodeError(f"unexpected wire type {w} for field {n} of runtime.TypeMeta")
                if n == 1:
                    api_version = v.decode("utf-8")
                elif n == 2:
                    kind = v.decode("utf-8")
        elif num == 2:
            raw = val
        elif num == 3:
            content_encoding = val.decode("utf-8")
        elif num == 4:
            content_type = val.decode("utf-8")
    return api_version, kind, raw, content_encoding, content_type


def decode_k8s_protobuf(body: bytes, registry: Any) -> dict[str, Any]:
    """A Kubernetes protobuf body -> the JSON dict a JSON client would have sent for it."""
    if not body.startswith(MAGIC):
        raise ProtobufDecodeError('the body does not start with the Kubernetes protobuf prefix "k8s\\x00"')
    try:
        api_version, kind, raw, encoding, inner_type = _envelope(body)
    except UnicodeDecodeError:
        raise ProtobufDecodeError("runtime.Unknown carries a string that is not valid UTF-8") from None
    if encoding:
        raise ApiException(
            415,
            "UnsupportedMediaType",
            f"protobuf bodies with content encoding {encoding!r} are not supported",
        )
    if inner_type not in ("", CONTENT_TYPE):
        raise ApiException(
            415,
            "UnsupportedMediaType",
            f"the protobuf envelope carries an unsupported content type {inner_type!r}",
        )
    if not kind or not api_version:
        raise ProtobufDecodeError("runtime.Unknown has no apiVersion/kind")
    if registry.by_api_version_kind(api_version, kind) is None and (api_version, kind) not in SUBRESOURCE_KINDS:
        raise bad_request(f'no kind "{kind}" is registered for version "{api_version}"')
    message = KINDS.get((api_version, kind))
    if message is None:
        raise ApiException(
            415,
            "UnsupportedMediaType",
            f"this server cannot decode {kind} ({api_version}) from protobuf; send it as application/json",
        )
    try:
        decoded = _decode_message(raw, message)
    except UnicodeDecodeError:
        raise ProtobufDecodeError(f"a string in the {kind} is not valid UTF-8") from None
    return {"kind": kind, "apiVersion": api_version, **decoded}
