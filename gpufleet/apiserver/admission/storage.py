"""Storage admission, as kube-apiserver's plugins of the same names do it:

- DefaultStorageClass (mutating): a PersistentVolumeClaim created without any class (no
  ``spec.storageClassName``, no beta annotation) gets the class annotated
  ``storageclass.kubernetes.io/is-default-class: "true"``; of several such classes the
  newest. An explicit ``storageClassName: ""`` asks for no class and is left alone.
- StorageObjectInUseProtection (mutating): new claims get the ``kubernetes.io/pvc-protection``
  finalizer and new volumes ``kubernetes.io/pv-protection``, which the PV controller removes
  once nothing uses them.
- PersistentVolumeClaimResize (validating): a claim may ask for more storage only once it
  is Bound, and only when its class sets ``allowVolumeExpansion: true``.
"""

from __future__ import annotations

from typing import Any

from gpufleet.api import storage
from gpufleet.api.quantity import parse_quantity
from gpufleet.apiserver.admission import AdmissionContext
from gpufleet.apiserver.errors import forbidden
from gpufleet.store import base as store_base

CLAIMS = "persistentvolumeclaims"
VOLUMES = "persistentvolumes"
CLASSES = "storageclasses.storage.k8s.io"


def _is(ctx: AdmissionContext, key: str, *operations: str) -> bool:
    return ctx.rt.key == key and not ctx.subresource and ctx.operation in operations


class DefaultStorageClass:
    name = "DefaultStorageClass"

    async def admit(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if not _is(ctx, CLAIMS, "CREATE") or not storage.claim_class_unset(obj):
            return
        classes = (await ctx.server.store.list(CLASSES, None)).items
        chosen = storage.default_class(classes)
        if chosen is not None:
            obj.setdefault("spec", {})["storageClassName"] = chosen["metadata"]["name"]


class StorageObjectInUseProtection:
    name = "StorageObjectInUseProtection"

    async def admit(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if _is(ctx, CLAIMS, "CREATE"):
            finalizer = storage.PVC_PROTECTION_FINALIZER
        elif _is(ctx, VOLUMES, "CREATE"):
            finalizer = storage.PV_PROTECTION_FINALIZER
        else:
            return
        meta = obj.setdefault("metadata", {})
        finalizers = list(meta.get("finalizers") or [])
        if finalizer not in finalizers:
            meta["finalizers"] = [*finalizers, finalizer]


def _requested(pvc: dict[str, Any] | None) -> Any:
    raw = (((pvc or {}).get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
    try:
        return parse_quantity(raw) if raw is not None else None
    except ValueError:
        return None


class PersistentVolumeClaimResize:
    name = "PersistentVolumeClaimResize"

    async def validate(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if not _is(ctx, CLAIMS, "UPDATE") or old is None:
            return
        before, after = _requested(old), _requested(obj)
        if before is None or after is None or after <= before:
            return
        if ((old.get("status") or {}).get("phase")) != storage.CLAIM_BOUND:
            raise forbidden(f'{ctx.rt.key} "{ctx.name}" is forbidden: Only bound persistent volume claims can be '
                            "expanded", ctx.rt, ctx.name)
        if not await self._allows_resize(ctx, obj, old):
            raise forbidden(f'{ctx.rt.key} "{ctx.name}" is forbidden: only dynamically provisioned pvc can be '
                            "resized and the storageclass that provisions the pvc must support resize",
                            ctx.rt, ctx.name)

    @staticmethod
    async def _allows_resize(ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any]) -> bool:
        name = storage.claim_class(obj)
        if not name or name != storage.claim_class(old):
            return False
        try:
            sc = await ctx.server.store.get(CLASSES, "", name)
        except store_base.NotFound:
            return False
        return bool(sc.get("allowVolumeExpansion"))
