"""Turning what the user typed ('po', 'deployments.apps', 'pytorchjobs') or what a manifest
names (apiVersion + kind) into a resource type.

The built-in registry answers first, without a request. Kinds it does not know (added to
the server by modules this process never imported) come from the server's discovery, as
kubectl finds them, so commands keep working for kinds registered after the CLI was written.
"""

from __future__ import annotations

import json
from typing import Any

from gpufleet.api.registry import REGISTRY, Registry, ResourceType
from gpufleet.cli.output import CliError
from gpufleet.client.api import Client
from gpufleet.client.errors import ApiError

_AGGREGATED_ACCEPT = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
)


class KindResolver:
    def __init__(self, client: Client, registry: Registry = REGISTRY) -> None:
        self.client = client
        self.registry = registry
        self._discovered: Registry | None = None

    async def resolve(self, name: str) -> ResourceType:
        rt = self.registry.resolve(name)
        if rt is None:
            rt = (await self.discovered()).resolve(name)
        if rt is None:
            raise CliError(f'error: the server doesn\'t have a resource type "{name}"')
        return rt

    async def for_manifest(self, api_version: str, kind: str) -> ResourceType | None:
        rt = self.registry.by_api_version_kind(api_version, kind)
        if rt is None:
            rt = (await self.discovered()).by_api_version_kind(api_version, kind)
        return rt

    async def category(self, category: str) -> list[ResourceType]:
        """Every kind in a category ('all'), built-in ones first in registry order."""
        out = [rt for rt in self.registry.all() if category in rt.categories]
        keys = {rt.key for rt in out}
        try:
            extra = (await self.discovered()).all()
        except ApiError:
            extra = []
        out += [rt for rt in extra if category in rt.categories and rt.key not in keys]
        return out

    async def discovered(self) -> Registry:
        if self._discovered is None:
            self._discovered = Registry(await self._discover())
        return self._discovered

    async def _discover(self) -> list[ResourceType]:
        types: list[ResourceType] = []
        for path in ("/api", "/apis"):
            resp = await self.client.raw_request("GET", path, headers={"accept": _AGGREGATED_ACCEPT})
            doc = json.loads(resp.body or b"{}")
            if doc.get("kind") == "APIGroupDiscoveryList":
                types += _from_aggregated(doc)
            elif doc.get("kind") == "APIVersions":
                for version in doc.get("versions") or []:
                    types += await self._from_resource_list("", version)
            elif doc.get("kind") == "APIGroupList":
                for group in doc.get("groups") or []:
                    preferred = (group.get("preferredVersion") or {}).get("version")
                    versions = [v.get("version") for v in group.get("versions") or []]
                    version = preferred or (versions[0] if versions else None)
                    if version:
                        types += await self._from_resource_list(group.get("name", ""), version)
        return types

    async def _from_resource_list(self, group: str, version: str) -> list[ResourceType]:
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            resp = await self.client.raw_request("GET", path)
        except ApiError:
            return []
        doc = json.loads(resp.body or b"{}")
        subs: dict[str, list[str]] = {}
        main: list[dict[str, Any]] = []
        for r in doc.get("resources") or []:
            name = r.get("name", "")
            if "/" in name:
                parent, _, sub = name.partition("/")
                subs.setdefault(parent, []).append(sub)
            else:
                main.append(r)
        return [
            _resource_type(group, version, r.get("kind", ""), r["name"], bool(r.get("namespaced")),
                           r.get("shortNames"), r.get("categories"), subs.get(r["name"]), r.get("verbs"))
            for r in main if r.get("kind")
        ]


def _from_aggregated(doc: dict[str, Any]) -> list[ResourceType]:
    types = []
    for item in doc.get("items") or []:
        group = (item.get("metadata") or {}).get("name") or ""
        # Versions come in preference order; the first one that has a kind wins when resolving.
        for v in item.get("versions") or []:
            for r in v.get("resources") or []:
                kind = (r.get("responseKind") or {}).get("kind")
                if not kind or not r.get("resource"):
                    continue
                subs = [s.get("subresource") for s in r.get("subresources") or [] if s.get("subresource")]
                types.append(_resource_type(
                    group, v.get("version", ""), kind, r["resource"], r.get("scope") == "Namespaced",
                    r.get("shortNames"), r.get("categories"), subs, r.get("verbs"),
                ))
    return types


def _resource_type(group: str, version: str, kind: str, plural: str, namespaced: bool,
                   short_names: Any, categories: Any, subresources: Any, verbs: Any) -> ResourceType:
    # No model: the CLI handles every object as a plain dict.
    return ResourceType(
        group, version, kind, plural, namespaced, "",
        tuple(short_names or ()), tuple(categories or ()), tuple(subresources or ()),
        tuple(verbs or ()),
    )
