"""The node's pod network, for runtimes that give each pod a network namespace (podman).

Each node's pods live on a bridge with the node's pod CIDR (spec.podCIDR, handed out by the
node IPAM controller), so pod IPs are unique across the fleet. Between servers, pod traffic
is routed host-gw style, as flannel's host-gw backend does: every agent adds a route to each
other node's pod CIDR via that node's InternalIP (the servers must share a layer-2 network,
or their routers must carry those routes). Nodes that share this host (several agents on one
machine) need no route: their bridges are local.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import psutil

log = logging.getLogger(__name__)


def network_name(node_name: str) -> str:
    return f"gpufleet-{node_name}"[:60]


def local_addresses() -> set[str]:
    out: set[str] = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.address:
                out.add(a.address.split("%", 1)[0])
    return out


def desired_routes(nodes: Iterable[Mapping[str, Any]], own: str, local: set[str]) -> dict[str, str]:
    """pod CIDR -> the InternalIP to route it through, for every other node on another host."""
    routes: dict[str, str] = {}
    for node in nodes:
        name = (node.get("metadata") or {}).get("name")
        if name == own:
            continue
        spec = node.get("spec") or {}
        cidrs = spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else [])
        ip = next((a.get("address") for a in (node.get("status") or {}).get("addresses") or []
                   if a.get("type") == "InternalIP" and a.get("address")), None)
        if not ip or ip in local:
            continue
        try:
            if ipaddress.ip_address(ip).is_loopback:
                continue
        except ValueError:
            continue
        for cidr in cidrs:
            if ":" not in cidr:
                routes[cidr] = ip
    return routes


class RouteTable:
    """The routes this agent installed; only those are ever changed or removed."""

    def __init__(self) -> None:
        self.installed: dict[str, str] = {}
        self.failed = ""

    async def sync(self, wanted: Mapping[str, str]) -> None:
        for cidr in [c for c in self.installed if c not in wanted]:
            if await _ip("route", "del", cidr, "via", self.installed[cidr]):
                del self.installed[cidr]
        for cidr, via in wanted.items():
            if self.installed.get(cidr) == via:
                continue
            if await _ip("route", "replace", cidr, "via", via):
                self.installed[cidr] = via
                self.failed = ""
            else:
                self.failed = f"cannot add the route to {cidr} via {via}"


async def _ip(*args: str) -> bool:
    try:
        proc = await asyncio.create_subprocess_exec("ip", *args, stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        log.warning("ip %s: %s", " ".join(args), exc)
        return False
    _, err = await proc.communicate()
    if proc.returncode != 0:
        log.warning("ip %s: %s", " ".join(args), err.decode(errors="replace").strip())
        return False
    return True
