"""What the gateway routes to: a Service's Ready endpoints by port name, the proxy's constants,
and the small helpers it answers with (a Kubernetes Status, canonical addresses)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from dataclasses import dataclass, field

from aiohttp import web

log = logging.getLogger(__name__)

CUSTOM_METRICS_PREFIX = "/apis/custom.metrics.k8s.io/v1beta2"
# Answers up to this size with a Content-Length are read whole and sent in one piece.
SMALL_BODY = 64 * 1024
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
# Hop-by-hop headers (RFC 9110 7.6.1) are not forwarded.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length",
})


@dataclass(eq=False)
class Endpoint:
    pod: str  # namespace/name
    host: str
    port: int
    in_flight: int = 0
    # Monotonic time until which a connection failure keeps it out of rotation.
    failed_until: float = 0.0
    # Whether the Endpoints named a Pod as this address's target.
    pod_backed: bool = True

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass
class Route:
    """The Ready endpoints of one Service, by port name ('' for an unnamed port)."""

    ports: dict[str, list[Endpoint]] = field(default_factory=dict)
    # Port names in the order the Service lists them (the first one is the default).
    order: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def endpoints(self, port: str | None) -> list[Endpoint]:
        if port is None:
            for name in self.order:
                if self.ports.get(name):
                    return self.ports[name]
            return next(iter(self.ports.values()), [])
        return self.ports.get(port, [])


class _NotSent(Exception):
    """The connection to the endpoint failed before any byte of the request went out."""


class _FailedInTransit(Exception):
    """The request went out (or may have) and no response came back."""


def _canonical(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address.split("%")[0]))
    except ValueError:
        return address


def _host_addresses() -> set[str]:
    """Every address of this host's interfaces."""
    import socket

    import psutil

    out = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                out.add(_canonical(a.address))
    return out


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
    return web.Response(status=code, text=json.dumps(body), content_type="application/json")
