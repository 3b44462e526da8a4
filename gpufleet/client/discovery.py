"""What the server serves, read from its discovery documents (client-go's discovery client).

``preferred_resources(client)`` reads aggregated discovery (``/api`` and ``/apis``, one request
each) and answers one ResourceType per served resource, in its group's preferred version, as
client-go's ``ServerPreferredResources`` does. A kind the client's registry knows (a built-in
one) comes back as the registry's own type, with its model; any other (a custom resource)
as a ``DiscoveredType``, whose objects stay plain dicts. ``learn(client, types)`` makes the
client's writes resolve those kinds by apiVersion and kind: it gives the client its own copy
of its registry (once) and keeps the discovered kinds in it, dropping those no longer served.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpufleet.api.registry import Registry, ResourceType
from gpufleet.client.api import Client
from gpufleet.client.errors import ApiError, TransportError

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
_OWN = "_discovery_copy"


@dataclass(frozen=True)
class DiscoveredType(ResourceType):
    """A resource the server announced that has no model here: its objects are dicts."""

    @property
    def model(self) -> Any:  # type: ignore[override]
        return None

    @property
    def singular(self) -> str:
        return self.extra.get("singular") or self.kind.lower()


class DiscoveryError(Exception):
    """Discovery could not be read (the server's error, or an answer that is not a document)."""


def parse_aggregated(doc: dict[str, Any], registry: Registry) -> list[ResourceType]:
    """The resources of an APIGroupDiscoveryList, each in the first (preferred) version of its
    group that serves it; a resource the registry knows at that version is the registry's."""
    out: list[ResourceType] = []
    for group_doc in doc.get("items") or []:
        group = ((group_doc or {}).get("metadata") or {}).get("name") or ""
        seen: set[str] = set()
        for version_doc in group_doc.get("versions") or []:
            version = version_doc.get("version") or ""
            for res in version_doc.get("resources") or []:
                plural = res.get("resource") or ""
                if not plural or "/" in plural or plural in seen:
                    continue
                seen.add(plural)
                known = registry.by_resource(group, version, plural)
                if known is not None and not isinstance(known, DiscoveredType):
                    out.append(known)
                    continue
                kind = (res.get("responseKind") or {}).get("kind") or ""
                out.append(DiscoveredType(
                    group, version, kind, plural, res.get("scope") == "Namespaced", "",
                    short_names=tuple(res.get("shortNames") or ()), categories=tuple(res.get("categories") or ()),
                    subresources=tuple(s.get("subresource") for s in res.get("subresources") or []
                                       if s.get("subresource")),
                    verbs=tuple(res.get("verbs") or ()),
                    extra={"singular": res.get("singularResource") or ""},
                ))
    return out


async def preferred_resources(client: Client) -> list[ResourceType]:
    """Every resource the server serves, in its preferred version (DiscoveryError when the
    server could not tell)."""
    out: list[ResourceType] = []
    for path in ("/api", "/apis"):
        try:
            resp = await client.raw_request("GET", path, headers={"accept": AGGREGATED})
            doc = json.loads(resp.body)
        except (ApiError, TransportError, ValueError) as e:
            raise DiscoveryError(f"{path}: {e}") from e
        if not isinstance(doc, dict) or doc.get("kind") != "APIGroupDiscoveryList":
            raise DiscoveryError(f"{path}: the server did not answer aggregated discovery")
        out.extend(parse_aggregated(doc, client.registry))
    return out


def learn(client: Client, types: Iterable[ResourceType]) -> None:
    """Keeps the discovered (model-less) kinds among ``types`` in the client's own registry,
    so that a write of such an object resolves its kind; drops those no longer served."""
    registry = client.registry
    if not getattr(registry, _OWN, False):
        registry = registry.copy()
        setattr(registry, _OWN, True)
        client.registry = registry
    current = [t for t in registry.served() if isinstance(t, DiscoveredType)]
    wanted = {t.gvk: t for t in types if isinstance(t, DiscoveredType)}
    for t in current:
        if wanted.get(t.gvk) != t:
            registry.unregister(t)
    present = {t.gvk for t in registry.served()}
    for gvk, t in wanted.items():
        if gvk not in present:
            registry.register(t)
