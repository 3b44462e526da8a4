"""Serving the kinds that CustomResourceDefinitions declare (kube-apiserver's apiextensions part).

``CustomResources.sync`` reads the stored CRDs and keeps the server's registry in step: each
served version of each CRD becomes a resource type (kinds.py) that discovery, OpenAPI, the
verb handlers, RBAC and the tables see like a built-in one. A CRD for a kind gpufleet
implements itself (PyTorchJob, PodGroup, Kueue's kinds, any built-in resource) is stored and
reported Established, and changes nothing: the built-in kind keeps being served.

The server syncs when it starts, after each write to a CRD, before discovery and OpenAPI
documents, and when a request names a resource it does not know (so a server of an HA
fleet picks up a CRD another one stored). A deleted CRD is held by the finalizer
customresourcecleanup.apiextensions.k8s.io while its objects are deleted (each through the
generic delete, so their own finalizers are honoured), then goes, and its kind with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from gpufleet.api import apiextensions as crds
from gpufleet.apiserver.customresources.kinds import (
    CustomObject,
    CustomResourceType,
    is_custom,
    resource_types,
)
from gpufleet.apiserver.customresources.strategy import (
    CustomResourceDefinitionStrategy,
    CustomResourceStrategy,
    derive_status,
    naming_of_all,
)
from gpufleet.apiserver.errors import ApiException
from gpufleet.store import base as store_base

if TYPE_CHECKING:
    from gpufleet.apiserver.server import ApiServer

log = logging.getLogger("gpufleet.apiserver.customresources")

__all__ = [
    "CustomObject",
    "CustomResourceDefinitionStrategy",
    "CustomResourceStrategy",
    "CustomResourceType",
    "CustomResources",
    "is_custom",
]

# How often a deleted CRD whose objects wait on their own finalizers is looked at again.
CLEANUP_RETRY_SECONDS = 0.5


def _fingerprint(items: list[dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(((o.get("metadata") or {}).get("name", ""),
                         str((o.get("metadata") or {}).get("resourceVersion", ""))) for o in items))


def _same_naming(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def part(status: dict[str, Any]) -> Any:
        conds = {c.get("type"): (c.get("status"), c.get("reason"), c.get("message"))
                 for c in status.get("conditions") or [] if isinstance(c, dict)}
        return (status.get("acceptedNames") or {}, conds.get(crds.NAMES_ACCEPTED), conds.get(crds.ESTABLISHED))

    return part(a) == part(b)


class CustomResources:
    """The CRD-declared resource types of one API server, kept in its registry."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api
        # What the server serves by itself: a CRD naming one of these changes nothing.
        self._builtin = {t.key for t in api.registry.served()}
        self._types: dict[str, list[CustomResourceType]] = {}
        self._fingerprint: tuple[tuple[str, str], ...] | None = None
        self._lock = asyncio.Lock()
        self._cleaning: dict[str, asyncio.Task[None]] = {}

    def is_builtin(self, crd: dict[str, Any]) -> bool:
        names, spec = crds.names_of(crd), crds.spec_of(crd)
        return f"{names.get('plural')}.{spec.get('group')}" in self._builtin

    def _taken(self, t: CustomResourceType) -> bool:
        """Whether a built-in resource already answers at ``t``'s path."""
        there = self.api.registry.by_resource(t.group, t.version, t.plural)
        return there is not None and not is_custom(there)

    async def sync(self) -> None:
        """Brings the registry in line with the stored CRDs (nothing to do when none changed)."""
        terminating: list[dict[str, Any]] = []
        async with self._lock:
            items = (await self.api.store.list(crds.RESOURCE_KEY, None)).items
            fingerprint = _fingerprint(items)
            if fingerprint == self._fingerprint:
                return
            items = await self._name(items)
            self._fingerprint = _fingerprint(items)
            registry = self.api.registry
            seen: set[str] = set()
            for crd in items:
                name = (crd.get("metadata") or {}).get("name", "")
                seen.add(name)
                if (crd.get("metadata") or {}).get("deletionTimestamp"):
                    terminating.append(crd)
                if self.is_builtin(crd):
                    continue
                for t in self._types.pop(name, []):
                    registry.unregister(t)
                if not crds.is_established(crd):
                    continue  # its names are another's: not served
                served = {**crd, "spec": {**crds.spec_of(crd), "names": crds.accepted_names(crd)}}
                types = [t for t in resource_types(served, CustomResourceStrategy) if not self._taken(t)]
                for t in types:
                    registry.register(t)
                self._types[name] = types
            for name in set(self._types) - seen:
                for t in self._types.pop(name):
                    registry.unregister(t)
        for crd in terminating:
            name = crd["metadata"]["name"]
            if name not in self._cleaning:
                task = self._cleaning[name] = asyncio.get_running_loop().create_task(self._cleanup(name))
                # Waited for a while, so a plain delete is done by the time it answers.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(task), timeout=2.0)

    async def _name(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The CRDs with the names each may have (kube-apiserver's naming controller): a CRD
        whose accepted names or conditions change gets its status written."""
        rt = self.api.registry.by_key(crds.RESOURCE_KEY)
        assert rt is not None
        namings = naming_of_all(items)
        out = []
        for crd in items:
            name = (crd.get("metadata") or {}).get("name", "")
            naming = namings.get(name)
            status = derive_status(crd, crd.get("status"), naming) if naming is not None else None
            if status is None or _same_naming(status, crd.get("status") or {}):
                out.append(crd)
                continue
            try:
                new, _ = await self.api.generic.update(rt, "", name, {**crd, "status": status},
                                                       subresource="status", current=crd)
                out.append(new)
            except ApiException as e:  # changed meanwhile: the next sync names it again
                log.info("CustomResourceDefinition %s: status not written: %s", name, e.message)
                out.append(crd)
        return out

    async def _cleanup(self, name: str) -> None:
        """Deletes the objects of the deleted CRD ``name``, then lets the CRD go."""
        try:
            while True:
                try:
                    crd = await self.api.store.get(crds.RESOURCE_KEY, "", name)
                except store_base.NotFound:
                    break
                if await self._delete_objects(crd):
                    await self._release(crd)
                    break
                await asyncio.sleep(CLEANUP_RETRY_SECONDS)
        except Exception:
            log.exception("cleaning up the objects of CustomResourceDefinition %s", name)
            return
        finally:
            self._cleaning.pop(name, None)
        await self.sync()

    async def _delete_objects(self, crd: dict[str, Any]) -> bool:
        """Deletes what is left; True when nothing is."""
        if self.is_builtin(crd):
            return True  # the built-in kind's objects are not the CRD's to delete
        types = self._types.get(crd["metadata"]["name"]) or [
            t for t in resource_types(crd, CustomResourceStrategy) if t.is_storage]
        storage = next((t for t in types if t.is_storage), None)
        if storage is None:
            return True
        remaining = (await self.api.store.list(storage.key, None)).items
        for obj in remaining:
            meta = obj.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                continue
            with contextlib.suppress(ApiException):
                await self.api.generic.delete(storage, meta.get("namespace", ""), meta.get("name", ""))
        return not (await self.api.store.list(storage.key, None)).items

    async def _release(self, crd: dict[str, Any]) -> None:
        rt = self.api.registry.by_key(crds.RESOURCE_KEY)
        assert rt is not None
        for _ in range(10):
            try:
                current = await self.api.store.get(crds.RESOURCE_KEY, "", crd["metadata"]["name"])
            except store_base.NotFound:
                return
            meta = dict(current["metadata"])
            meta["finalizers"] = [f for f in meta.get("finalizers") or [] if f != crds.CLEANUP_FINALIZER]
            new = {**current, "metadata": meta}
            try:
                await self.api.generic.update(rt, "", meta["name"], new, current=current)
                return
            except ApiException as e:
                if e.code not in (404, 409):
                    raise
                if e.code == 404:
                    return
