"""ConfigMap, Secret, downward API and projected volumes: their payloads, written atomically
as the kubelet's AtomicWriter does."""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpufleet.agent.atomicwriter import AtomicWriter, FileProjection, PayloadError
from gpufleet.agent.envvars import EnvError, field_ref_value, resource_field_value
from gpufleet.agent.tokens import DEFAULT_EXPIRATION, TokenError
from gpufleet.agent.volumes.common import (
    DEFAULT_MODE,
    SUBPATHS_DIR,
    VolumeError,
    VolumeInfo,
    _PodContext,
    _setup_failed,
    _SetUpError,
)
from gpufleet.api.quantity import to_int_bytes

log = logging.getLogger(__name__)

class PayloadsMixin:
    """VolumeManager's ConfigMap, Secret, downward API and projected plugins (see manager.py)."""

    # -- ConfigMaps, Secrets, the downward API, projections --------------------------------

    async def _config_map_payload(self, ctx: _PodContext, volume: str, source: dict[str, Any],
                                  default_mode: int | None) -> dict[str, FileProjection]:
        cm_name = source.get("name") or ""
        optional = bool(source.get("optional"))
        obj = await self._fetch(volume, "configmaps", ctx.namespace, cm_name)
        if obj is None:
            if not optional:
                raise _setup_failed(volume, f'configmap "{cm_name}" not found')
            obj = {}
        try:
            return config_map_payload(source.get("items") or [], obj, _mode(default_mode), optional)
        except (_SetUpError, PayloadError) as exc:
            raise _setup_failed(volume, str(exc)) from None

    async def _secret_payload(self, ctx: _PodContext, volume: str, source: dict[str, Any],
                              default_mode: int | None) -> dict[str, FileProjection]:
        # A secret volume names its object secretName; a projection's secret source, name.
        secret_name = source.get("secretName") or source.get("name") or ""
        optional = bool(source.get("optional"))
        obj = await self._fetch(volume, "secrets", ctx.namespace, secret_name)
        if obj is None:
            if not optional:
                raise _setup_failed(volume, f'secret "{secret_name}" not found')
            obj = {}
        try:
            return secret_payload(source.get("items") or [], obj, _mode(default_mode), optional)
        except (_SetUpError, PayloadError) as exc:
            raise _setup_failed(volume, str(exc)) from None

    def _downward_payload(self, ctx: _PodContext, items: Iterable[dict[str, Any]],
                          default_mode: int) -> dict[str, FileProjection]:
        payload: dict[str, FileProjection] = {}
        allocatable = self._node_allocatable() or {}
        for item in items:
            path = item.get("path") or ""
            mode = _mode(item.get("mode"), default_mode)
            if item.get("fieldRef"):
                value = field_ref_value(ctx.pod, item["fieldRef"].get("fieldPath") or "")
            elif item.get("resourceFieldRef"):
                ref = item["resourceFieldRef"]
                target = ctx.container(ref.get("containerName") or "")
                if target is None:
                    raise EnvError(f'resourceFieldRef: no container named "{ref.get("containerName") or ""}"')
                value = resource_field_value(target, ref, allocatable)
            else:
                raise EnvError(f'downwardAPI item "{path}" has neither fieldRef nor resourceFieldRef')
            payload[path] = FileProjection(value.encode(), mode)
        return payload

    async def _projected_payload(self, ctx: _PodContext, volume: str, source: dict[str, Any]) -> dict[str, FileProjection]:
        default_mode = _mode(source.get("defaultMode"))
        payload: dict[str, FileProjection] = {}
        errors: list[str] = []
        for src in source.get("sources") or []:
            try:
                if src.get("configMap") is not None:
                    payload.update(await self._config_map_payload(ctx, volume, src["configMap"], default_mode))
                elif src.get("secret") is not None:
                    payload.update(await self._secret_payload(ctx, volume, src["secret"], default_mode))
                elif src.get("downwardAPI") is not None:
                    payload.update(self._downward_payload(ctx, src["downwardAPI"].get("items") or [], default_mode))
                elif src.get("serviceAccountToken") is not None:
                    path, projection = await self._token_file(ctx, src["serviceAccountToken"], default_mode)
                    payload[path] = projection
                else:
                    kinds = ", ".join(sorted(k for k, v in src.items() if v is not None)) or "none"
                    errors.append(f"projected volume source {kinds} is not supported on this node "
                                  "(supported: configMap, secret, downwardAPI, serviceAccountToken)")
            except VolumeError as exc:
                errors.append(exc.message.split(" : ", 1)[-1])
            except (EnvError, TokenError, PayloadError) as exc:
                errors.append(str(exc))
        if errors:
            # utilerrors.NewAggregate's text: one error as itself, several in brackets.
            raise _setup_failed(volume, errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]")
        return payload

    async def _token_file(self, ctx: _PodContext, source: dict[str, Any], default_mode: int) -> tuple[str, FileProjection]:
        audience = source.get("audience") or ""
        expiration = int(source.get("expirationSeconds") or DEFAULT_EXPIRATION)
        token = await self.tokens.get(ctx.namespace, ctx.service_account,
                                      audiences=[audience] if audience else [],
                                      expiration_seconds=expiration, pod_name=ctx.name, pod_uid=ctx.uid)
        # With fsGroup the kubelet writes the token 0600 and lets ownership make it 0640,
        # so only the pod's group, not everyone, can read it.
        mode = 0o600 if ctx.fs_group is not None else default_mode
        return source.get("path") or "token", FileProjection(token.token.encode(), mode)

    async def _write_atomic(self, ctx: _PodContext, name: str, kind: str, plugin: str,
                            payload: dict[str, FileProjection], *, tmpfs: bool) -> VolumeInfo:
        path = self._volume_dir(ctx.uid, plugin, name)

        def write() -> bool:
            on_tmpfs = False
            if tmpfs and self.can_mount:
                on_tmpfs = self._ensure_tmpfs(path, self._memory_size(ctx.pod, None)) is not None
            if not on_tmpfs:
                self._make_dir(path, 0o777)

            def perms(_new: Path) -> None:
                self._own(ctx, name, path, read_only=True, policy=None)

            try:
                AtomicWriter(path, self.clock.now, reserved=(SUBPATHS_DIR,)).write(payload, perms if ctx.fs_group is not None else None)
            except PayloadError as exc:
                raise _setup_failed(name, str(exc)) from None
            return on_tmpfs

        on_tmpfs = await asyncio.to_thread(write)
        return VolumeInfo(name, kind, str(path), read_only=True, atomic=True, tmpfs=on_tmpfs)

# -- payloads (pure) ---------------------------------------------------------------------------


def config_map_payload(items: list[dict[str, Any]], cm: Mapping[str, Any], default_mode: int,
                       optional: bool) -> dict[str, FileProjection]:
    data = {k: str(v).encode() for k, v in (cm.get("data") or {}).items()}
    for key, value in (cm.get("binaryData") or {}).items():
        data[key] = _b64(value, f"binaryData[{key}]")
    return _project(items, data, default_mode, optional, "configmap references non-existent config key: {}")


def secret_payload(items: list[dict[str, Any]], secret: Mapping[str, Any], default_mode: int,
                   optional: bool) -> dict[str, FileProjection]:
    data = {k: str(v).encode() for k, v in (secret.get("stringData") or {}).items()}
    for key, value in (secret.get("data") or {}).items():
        data[key] = _b64(value, f"data[{key}]")
    return _project(items, data, default_mode, optional, "references non-existent secret key: {}")


def _project(items: list[dict[str, Any]], data: Mapping[str, bytes], default_mode: int, optional: bool,
             missing: str) -> dict[str, FileProjection]:
    if not items:
        return {key: FileProjection(value, default_mode) for key, value in data.items()}
    out: dict[str, FileProjection] = {}
    for item in items:
        key = item.get("key") or ""
        if key not in data:
            if optional:
                continue
            raise _SetUpError(missing.format(key))
        out[item.get("path") or key] = FileProjection(data[key], _mode(item.get("mode"), default_mode))
    return out


def _b64(value: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise _SetUpError(f"{what} is not valid base64") from None


def _mode(value: Any, default: int = DEFAULT_MODE) -> int:
    return default if value is None else int(value) & 0o7777


def _quiet_bytes(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        return to_int_bytes(value)
    except (ValueError, TypeError):
        return None
