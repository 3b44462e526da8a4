"""Ingress rules the gateway serves: which Service (and port) a request's host and path go to.

The gateway is the controller ``gpufleet.io/gateway``: it serves the Ingresses whose class
(``spec.ingressClassName``, else the ``kubernetes.io/ingress.class`` annotation) is an
IngressClass of that controller, and those with no class at all (the API gives a new one the
default class, ``gpufleet``); Ingresses of other classes are left alone.

Matching follows the Ingress API:
- a rule's ``host`` matches the request's Host (without its port) exactly, or as a wildcard
  ``*.example.com`` that stands for exactly one label (``a.example.com``, not
  ``a.b.example.com`` nor ``example.com``); a rule without a host matches every host;
- ``Exact`` matches the path as is; ``Prefix`` matches whole path elements (``/foo`` matches
  ``/foo``, ``/foo/`` and ``/foo/bar``, not ``/foobar``; a trailing ``/`` in the rule is
  ignored); ``ImplementationSpecific`` is treated here as ``Prefix``;
- of the rules that match, an exact host beats a wildcard host beats no host; then the
  longest path; then ``Exact`` over ``Prefix``; then the oldest Ingress;
- with no rule matching, the ``defaultBackend`` of the oldest Ingress that has one.

The request goes to the backend Service's port (by number or name) unchanged: path and query
as sent.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gpufleet.client import objects
from gpufleet.client.errors import ApiError

log = logging.getLogger(__name__)

CONTROLLER = "gpufleet.io/gateway"
LEGACY_CLASS_ANNOTATION = "kubernetes.io/ingress.class"


@dataclass(frozen=True)
class Backend:
    namespace: str
    service: str
    port: str | None  # a Service port's number or name (None: the Service's first port)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.service}"


@dataclass(frozen=True)
class Match:
    backend: Backend
    host_specific: bool  # the rule named a host (exactly or by wildcard)
    ingress: str  # namespace/name


def host_rank(rule_host: str | None, host: str) -> int:
    """2: the rule names this host; 1: a wildcard that covers it; 0: the rule names no host;
    -1: no match."""
    if not rule_host:
        return 0
    if rule_host.startswith("*."):
        first, dot, rest = host.partition(".")
        return 1 if dot and first and rest == rule_host[2:] else -1
    return 2 if rule_host == host else -1


def path_rank(path_type: str | None, rule_path: str | None, path: str) -> int:
    """The length of the rule's path when it matches ``path``, else -1."""
    rule_path = rule_path or "/"
    if path_type == "Exact":
        return len(rule_path) if path == rule_path else -1
    wanted = [p for p in rule_path.split("/") if p]
    given = [p for p in path.split("/") if p]
    if given[:len(wanted)] != wanted:
        return -1
    return len(rule_path.rstrip("/"))


def _backend(namespace: str, backend: Any) -> Backend | None:
    svc = objects.field(backend, "service") if backend is not None else None
    if svc is None or not svc.name:
        return None
    port = svc.port
    number = port.number if port is not None else None
    name = port.name if port is not None else None
    return Backend(namespace, svc.name, str(number) if number else (name or None))


def ingress_class(ing: Any) -> str:
    spec = objects.field(ing, "spec")
    name = spec.ingress_class_name if spec is not None else None
    return name or (objects.meta(ing, "annotations") or {}).get(LEGACY_CLASS_ANNOTATION) or ""


def _age(ing: Any) -> tuple[str, str]:
    created = objects.meta(ing, "creation_timestamp")
    return (str(created or ""), objects.object_key(ing))


def match(ingresses: list[Any], host: str, path: str) -> Match | None:
    """The backend for a request to ``host`` and ``path`` among ``ingresses`` (all served by
    the gateway), or None."""
    host = host.lower()
    best: tuple[tuple[int, int, int], Match] | None = None
    ordered = sorted(ingresses, key=_age)
    for ing in ordered:
        ns = objects.namespace_of(ing)
        spec = objects.field(ing, "spec")
        for rule in (spec.rules or []) if spec is not None else []:
            hr = host_rank(rule.host, host)
            if hr < 0 or rule.http is None:
                continue
            for p in rule.http.paths or []:
                pr = path_rank(p.path_type, p.path, path)
                backend = _backend(ns, p.backend)
                if pr < 0 or backend is None:
                    continue
                rank = (hr, pr, 1 if p.path_type == "Exact" else 0)
                if best is None or rank > best[0]:  # ties: the older Ingress, seen first
                    best = (rank, Match(backend, hr > 0, objects.object_key(ing)))
    if best is not None:
        return best[1]
    for ing in ordered:
        spec = objects.field(ing, "spec")
        backend = _backend(objects.namespace_of(ing), spec.default_backend if spec is not None else None)
        if backend is not None:
            return Match(backend, False, objects.object_key(ing))
    return None


def load_balancer_status(address: str, port: int) -> dict[str, Any]:
    """status.loadBalancer of an Ingress the gateway serves at ``address``:``port``."""
    entry: dict[str, Any] = {"ports": [{"port": port, "protocol": "TCP"}]}
    try:
        ipaddress.ip_address(address)
        entry["ip"] = address
    except ValueError:
        entry["hostname"] = address
    return {"loadBalancer": {"ingress": [entry]}}


class IngressRouting:
    """The Gateway's Ingress routes (it holds the informers, the client and the address)."""

    def _served_ingresses(self) -> list[Any]:
        ours = {objects.name_of(c) for c in self.ingress_class_informer.list()
                if c.spec is not None and c.spec.controller == CONTROLLER}
        return [i for i in self.ingress_informer.list()
                if (ingress_class(i) or None) in (None, *ours) and not objects.meta(i, "deletion_timestamp")]

    def ingress_match(self, request: web.Request) -> Match | None:
        host = request.host.rsplit(":", 1)[0] if not request.host.endswith("]") else request.host
        return match(self._served_ingresses(), host.strip("[]"), request.path)

    async def ingress_proxy(self, request: web.Request, found: Match) -> web.StreamResponse:
        return await self._proxy(request, found.backend.key, found.backend.port, request.raw_path)

    # -- status ---------------------------------------------------------------------------

    def ingress_address(self) -> str:
        try:
            unspecified = ipaddress.ip_address(self.host).is_unspecified
        except ValueError:
            return self.host
        if not unspecified:
            return self.host
        others = sorted(a for a in self._local_addresses if not ipaddress.ip_address(a).is_loopback
                        and not ipaddress.ip_address(a).is_link_local and ":" not in a)
        return others[0] if others else "127.0.0.1"

    def _ingress_changed(self, _ing: Any = None) -> None:
        self._status_dirty = True
        if self.port and (self._status_task is None or self._status_task.done()):
            self._status_task = asyncio.ensure_future(self._publish_while_dirty())

    async def _publish_while_dirty(self) -> None:
        while getattr(self, "_status_dirty", False):
            self._status_dirty = False
            await self._publish_ingress_status()

    async def _publish_ingress_status(self) -> None:
        """status.loadBalancer of every Ingress the gateway serves: its address and port."""
        want = load_balancer_status(self.ingress_address(), self.port)
        for ing in self._served_ingresses():
            have = objects.to_dict(ing.status) if ing.status is not None else {}
            if have == want:
                continue
            try:
                await self.client.patch("Ingress", objects.name_of(ing), {"status": want},
                                        objects.namespace_of(ing), subresource="status", raw=True)
            except ApiError as exc:
                log.info("gateway: cannot set the status of ingress %s: %s", objects.object_key(ing), exc)
