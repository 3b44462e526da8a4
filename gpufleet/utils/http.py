"""The request/response pair shared by the API server and the in-process client transport.

The API server's core handler takes a RawRequest and gives a RawResponse; the HTTP adapter
(Starlette) and the client's in-process transport both speak this pair, so a component cannot
tell whether it runs in the same process as the server or across the network.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class RawRequest:
    method: str
    path: str
    # Query parameters in order; a key may repeat.
    query: list[tuple[str, str]] = field(default_factory=list)
    # Header names in lower case.
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    # The peer's address, as the HTTP server saw it ("" in-process): the audit log's sourceIPs.
    remote_addr: str = ""

    def param(self, name: str, default: str | None = None) -> str | None:
        for k, v in self.query:
            if k == name:
                return v
        return default


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    # Set for streaming answers (watch, log -f): chunks to send as they come; body is then empty.
    stream: AsyncIterator[bytes] | None = None


class Handler(Protocol):
    async def handle(self, request: RawRequest) -> RawResponse: ...
