"""Size limits on what a request may carry and what may be stored, as kube-apiserver and etcd.

- The body: ``--max-request-body-bytes`` (kube-apiserver's default 3 MiB). A declared
  Content-Length over it is refused before anything is read, even before authentication;
  a body without one is read as it arrives, after authentication, and refused the moment it
  passes the limit. Either way the answer is 413 RequestEntityTooLarge, as Kubernetes words it.
- A stored object: at most 1.5 MiB encoded (etcd's ``--max-request-bytes`` default, which
  every Kubernetes object meets), else 413 and nothing is stored.
- Work on a body past ``OFF_LOOP_BYTES`` (decoding, validation, patching) runs in a worker
  thread, so one large request does not hold the event loop that answers everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from gpufleet.apiserver.errors import ApiException, bad_request
from gpufleet.utils.http import BodyIncomplete, BodyTooLarge, RawRequest

DEFAULT_MAX_REQUEST_BODY_BYTES = 3 * 1024 * 1024
# etcd's default --max-request-bytes: the largest value one write may carry.
MAX_OBJECT_BYTES = 1536 * 1024
# Bodies past this are decoded and validated off the event loop.
OFF_LOOP_BYTES = 256 * 1024

T = TypeVar("T")

# Set while a request whose body is past OFF_LOOP_BYTES is served.
_large_request: contextvars.ContextVar[bool] = contextvars.ContextVar("gpufleet_large_request", default=False)


@dataclass
class RequestLimits:
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    max_object_bytes: int = MAX_OBJECT_BYTES
    off_loop_bytes: int = OFF_LOOP_BYTES


def body_too_large(limit: int) -> ApiException:
    """Kubernetes' NewRequestEntityTooLargeError for a body past --max-request-body-bytes."""
    return ApiException(413, "RequestEntityTooLarge", f"Request entity too large: limit is {limit}")


async def read_body(req: RawRequest, limit: int) -> bytes:
    """The request's body, read within ``limit`` bytes (0: none): 413 past it, 400 when the
    client goes away before its end."""
    try:
        return await req.read_body(limit)
    except BodyTooLarge as e:
        raise body_too_large(e.limit) from None
    except BodyIncomplete:
        raise bad_request("the request body ended before its end: the client went away") from None


def object_too_large(kind: str, name: str, size: int, limit: int) -> ApiException:
    return ApiException(
        413, "RequestEntityTooLarge",
        f"Request entity too large: the {kind} {name!r} is {size} bytes stored, over the limit of {limit} bytes "
        "an object may have (keep large data in a volume, not in an object)",
        {"name": name, "kind": kind},
    )


def check_object_size(kind: str, name: str, obj: dict[str, Any], limit: int) -> None:
    if not limit:
        return
    try:
        size = len(orjson.dumps(obj))
    except TypeError:  # not encodable as stored: the store's own error says why
        return
    if size > limit:
        raise object_too_large(kind, name, size, limit)


@contextlib.contextmanager
def serving(body_size: int, threshold: int) -> Iterator[None]:
    """Marks, while a request is served, whether its body is large."""
    token = _large_request.set(bool(threshold) and body_size > threshold)
    try:
        yield
    finally:
        _large_request.reset(token)


def is_large() -> bool:
    return _large_request.get()


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args)`` in a worker thread for a large request, inline otherwise (a thread hop
    costs more than small work). The thread still shares the GIL, but the loop gets it back
    every switch interval instead of waiting for the whole call."""
    if _large_request.get():
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)
