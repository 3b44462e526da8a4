"""The node agent's volume manager: a pod's volumes made real on the node, as the kubelet's
volume manager and in-tree volume plugins make them.

Every volume of a pod gets a directory (or a host path) before its containers start:

    <root>/<pod uid>/volumes/kubernetes.io~<plugin>/<volume name>

- emptyDir: a directory (0777); medium Memory is a tmpfs of its own sized by sizeLimit (or,
  where the agent may not mount, a directory under /dev/shm, which the pod is told of).
- configMap, secret, downwardAPI, projected: files written by the atomic writer (see
  atomicwriter.py) and rewritten on every ``setup()`` whose content changed, so a pod sees a
  ConfigMap edit within the agent's resync period, whole. Secrets and projected volumes sit
  on a tmpfs, as on a kubelet, so their content never touches the disk.
- hostPath: the host's own path, checked against its ``type`` (created for *OrCreate).
- persistentVolumeClaim (and generic ephemeral volumes through their claims): the bound
  PersistentVolume's hostPath or local path on this node.

Then ``mounts()`` turns one container's volumeMounts into the runtime's Mount list (subPath
and subPathExpr included; a subPath of an atomically written volume is pinned under its
``..subpaths`` directory, so the container keeps the version it started with), and
``teardown()`` removes what setup made once the pod is gone.
Ownership for securityContext.fsGroup is applied as the kubelet's SetVolumeOwnership does.

Errors carry the kubelet's wording (``MountVolume.SetUp failed for volume "cfg" : configmap
"app-config" not found``); the pod's containers wait until a later ``setup()`` succeeds.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import math
import os
import shutil
import stat
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from gpufleet.agent import hostmount
from gpufleet.agent.atomicwriter import AtomicWriter, FileProjection, PayloadError
from gpufleet.agent.envvars import EnvError, expand, field_ref_value, resource_field_value
from gpufleet.agent.runtime.base import Mount
from gpufleet.agent.tokens import DEFAULT_EXPIRATION, TokenError, TokenManager, TokenSource
from gpufleet.api import podresources
from gpufleet.api.quantity import to_int_bytes
from gpufleet.api.selectors import Operator, Requirement, SelectorError
from gpufleet.client import NotFound
from gpufleet.utils.clock import Clock

log = logging.getLogger(__name__)

# (kind, namespace, name) -> the object as a dict, or None when it does not exist.
ObjectGetter = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]

DEFAULT_MODE = 0o644
# In a ConfigMap, Secret, downward API or projected volume: what subPath mounts pinned.
SUBPATHS_DIR = "..subpaths"
SHM_PATH = "/dev/shm"

EMPTY_DIR = "kubernetes.io~empty-dir"
CONFIG_MAP = "kubernetes.io~configmap"
SECRET = "kubernetes.io~secret"
DOWNWARD_API = "kubernetes.io~downward-api"
PROJECTED = "kubernetes.io~projected"
HOST_PATH = "kubernetes.io~host-path"
LOCAL_VOLUME = "kubernetes.io~local-volume"

# SetVolumeOwnership's masks.
_RW_MASK, _RO_MASK, _EXEC_MASK = 0o660, 0o440, 0o110

# Volume sources of the pod API this node cannot serve, by the kubelet plugin they need.
_PLUGINS = {
    "awsElasticBlockStore": "kubernetes.io/aws-ebs", "azureDisk": "kubernetes.io/azure-disk",
    "azureFile": "kubernetes.io/azure-file", "cephfs": "kubernetes.io/cephfs", "cinder": "kubernetes.io/cinder",
    "csi": "kubernetes.io/csi", "fc": "kubernetes.io/fc", "flexVolume": "kubernetes.io/flexvolume",
    "flocker": "kubernetes.io/flocker", "gcePersistentDisk": "kubernetes.io/gce-pd",
    "gitRepo": "kubernetes.io/git-repo", "glusterfs": "kubernetes.io/glusterfs", "image": "kubernetes.io/image",
    "iscsi": "kubernetes.io/iscsi", "nfs": "kubernetes.io/nfs", "photonPersistentDisk": "kubernetes.io/photon-pd",
    "portworxVolume": "kubernetes.io/portworx-volume", "quobyte": "kubernetes.io/quobyte",
    "rbd": "kubernetes.io/rbd", "scaleIO": "kubernetes.io/scaleio", "storageos": "kubernetes.io/storageos",
    "vsphereVolume": "kubernetes.io/vsphere-volume",
}

# PersistentVolumeSpec fields that are not its volume source.
_PV_NON_SOURCE_FIELDS = frozenset({
    "accessModes", "capacity", "claimRef", "mountOptions", "nodeAffinity", "persistentVolumeReclaimPolicy",
    "storageClassName", "volumeMode", "volumeAttributesClassName",
})

_NODE_SELECTOR_OPERATORS = {
    "In": Operator.IN, "NotIn": Operator.NOT_IN, "Exists": Operator.EXISTS,
    "DoesNotExist": Operator.DOES_NOT_EXIST, "Gt": Operator.GREATER_THAN, "Lt": Operator.LESS_THAN,
}


class VolumeError(Exception):
    """A volume could not be made ready. The pod's containers wait (ContainerCreating) and the
    agent records an Event with ``reason`` and ``message``; the next setup() tries again.
    From mounts() the reason is CreateContainerConfigError: the kubelet reports those as the
    container's waiting reason, with a "Failed" event reading "Error: <message>"."""

    def __init__(self, volume: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.volume = volume
        self.reason = reason
        self.message = message
        # Every volume that failed in the same setup() (this one first).
        self.errors: list[VolumeError] = [self]


def _setup_failed(volume: str, err: str) -> VolumeError:
    return VolumeError(volume, "FailedMount", f'MountVolume.SetUp failed for volume "{volume}" : {err}')


@dataclass(frozen=True)
class VolumeInfo:
    name: str
    # The pod API's source field: emptyDir, configMap, secret, downwardAPI, projected,
    # hostPath, persistentVolumeClaim, ephemeral.
    kind: str
    # The volume's root on the node, what a volumeMount without subPath shows.
    path: str
    # Mounted read-only in every container (ConfigMaps, Secrets, ...; a claim's readOnly).
    read_only: bool = False
    # Written by the atomic writer: a subPath of it is a snapshot, not updated.
    atomic: bool = False
    tmpfs: bool = False
    medium: str = ""
    size_limit: int | None = None


@dataclass
class PodVolumes:
    pod_uid: str
    volumes: dict[str, VolumeInfo] = field(default_factory=dict)
    # What was not done as the pod asked, for a Warning event (stable across calls).
    notices: list[str] = field(default_factory=list)
    # fsGroup was set but the agent may not chown: ownership was left as it was.
    fs_group_skipped: bool = False

    def path(self, name: str) -> str:
        return self.volumes[name].path


class EmptyDirUsage(NamedTuple):
    volume: str
    used: int
    limit: int
    # The sizeLimit as the pod spec writes it (the API server keeps quantities canonical).
    limit_text: str

    @property
    def message(self) -> str:
        """The kubelet eviction manager's message. Its trailing space is the kubelet's too:
        it joins several of these into one status message."""
        return f'Usage of EmptyDir volume "{self.volume}" exceeds the limit "{self.limit_text}". '


class _SetUpError(Exception):
    """A plugin's own error text, wrapped into the kubelet's message by the caller."""


class VolumeManager:
    def __init__(self, client: Any, node_name: str, root: Path, clock: Clock, *,
                 get_object: ObjectGetter | None = None, can_mount: bool | None = None,
                 can_chown: bool | None = None, token_source: TokenSource | None = None,
                 node_allocatable: Callable[[], Mapping[str, Any]] | None = None,
                 shm_root: Path | None = None, dir_mode: int = 0o750) -> None:
        self.client = client
        self.node_name = node_name
        self.root = Path(root)
        self.clock = clock
        self._injected_get = get_object
        self.can_mount = hostmount.may_mount() if can_mount is None else can_mount
        self.can_chown = hostmount.may_chown() if can_chown is None else can_chown
        self.tokens = TokenManager(token_source or self._request_token, clock)
        self._node_allocatable = node_allocatable or _host_allocatable
        # Where Memory emptyDirs live when the agent may not mount tmpfs.
        self.shm_root = Path(shm_root) if shm_root is not None else Path(SHM_PATH) / "gpufleet-volumes"
        # The kubelet keeps pod directories 0750: only root (and the runtime) walks into them.
        self.dir_mode = dir_mode
        self._pods: dict[str, PodVolumes] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # (pod uid, volume) whose one-time ownership change was done by this process.
        self._owned: set[tuple[str, str]] = set()
        self._mounted: set[str] = set()
        # Per pod: volumes fsGroup was not applied to (reported on every setup).
        self._ownership_skipped: dict[str, list[str]] = {}

    # -- the interface ------------------------------------------------------------------

    async def setup(self, pod: dict[str, Any]) -> PodVolumes:
        """Make every volume of the pod ready; safe to call again and again (each call also
        brings ConfigMap, Secret, downward API and token content up to date). Raises the
        first VolumeError (with all of them in ``errors``) while any volume is not ready."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid") or ""
        if not uid:
            raise VolumeError("", "FailedMount", "the pod has no metadata.uid")
        lock = self._locks.setdefault(uid, asyncio.Lock())
        async with lock:
            result = PodVolumes(pod_uid=uid)
            errors: list[VolumeError] = []
            ctx = _PodContext(pod)
            for volume in (pod.get("spec") or {}).get("volumes") or []:
                name = volume.get("name") or ""
                try:
                    result.volumes[name] = await self._setup_volume(ctx, volume, result)
                except VolumeError as exc:
                    errors.append(exc)
                except OSError as exc:
                    errors.append(_setup_failed(name, str(exc)))
            skipped = self._ownership_skipped.get(uid)
            if ctx.fs_group is not None and skipped:
                result.fs_group_skipped = True
                names = ", ".join(f'"{n}"' for n in skipped)
                result.notices.append(
                    f"fsGroup {ctx.fs_group} was not applied to volume(s) {names}: the agent may not change "
                    "file ownership (it needs root or CAP_CHOWN)")
            self._pods[uid] = result
            if errors:
                first = errors[0]
                first.errors = errors
                raise first
            return result

    def mounts(self, pod: dict[str, Any], container: dict[str, Any], volumes: PodVolumes,
               env: Mapping[str, str] | None = None) -> list[Mount]:
        """The container's volumeMounts as the runtime's mounts. ``env`` is the container's
        environment, for subPathExpr. A subPath of a ConfigMap, Secret, downward API or
        projected volume is a snapshot taken now (the kubelet bind-mounts the file, so the
        container keeps the version it started with)."""
        cname = container.get("name") or ""
        shm_volume = self._shm_volume(pod)
        out: list[Mount] = []
        for index, vm in enumerate(container.get("volumeMounts") or []):
            name = vm.get("name") or ""
            info = volumes.volumes.get(name)
            if info is None:
                raise _config_error(name, f'cannot find volume "{name}" to mount into container "{cname}"')
            mount_path = vm.get("mountPath") or ""
            if not mount_path:
                raise _config_error(name, f'volumeMount "{name}" of container "{cname}" has no mountPath')
            if not mount_path.startswith("/"):
                # The kubelet makes a relative mountPath absolute rather than refusing it.
                mount_path = "/" + mount_path
            sub_path = vm.get("subPath") or ""
            if vm.get("subPathExpr"):
                sub_path = _expand_sub_path(name, vm["subPathExpr"], env or {})
            if name == shm_volume and not sub_path and os.path.normpath(mount_path) == SHM_PATH:
                # This volume sizes the sandbox's own /dev/shm (see shm_size) instead.
                continue
            host_path = info.path
            if sub_path:
                host_path = self._prepare_sub_path(info, sub_path, cname, name, index)
            out.append(Mount(host_path=host_path, container_path=mount_path,
                             read_only=bool(vm.get("readOnly")) or info.read_only))
        return out

    def shm_size(self, pod: dict[str, Any]) -> int | None:
        """The size for the sandbox's /dev/shm when an emptyDir of medium Memory is mounted
        there: its sizeLimit, bounded as the kubelet bounds a memory-backed emptyDir (by the
        pod's memory limit and the node's allocatable memory). None: no such volume."""
        name = self._shm_volume(pod)
        if name is None:
            return None
        volume = next(v for v in (pod.get("spec") or {}).get("volumes") or [] if v.get("name") == name)
        return self._memory_size(pod, (volume.get("emptyDir") or {}).get("sizeLimit"))

    def over_limit(self, pod: dict[str, Any]) -> list[EmptyDirUsage]:
        """The emptyDir volumes whose usage is over their sizeLimit: the kubelet evicts the
        pod for them (with ``EmptyDirUsage.message``). Walks the volumes: run it off the
        event loop for pods with large ones."""
        uid = (pod.get("metadata") or {}).get("uid") or ""
        known = self._pods.get(uid)
        out: list[EmptyDirUsage] = []
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            source = volume.get("emptyDir")
            if source is None or not source.get("sizeLimit"):
                continue
            limit = to_int_bytes(source["sizeLimit"])
            if limit <= 0:
                continue
            name = volume.get("name") or ""
            info = known.volumes.get(name) if known else None
            path = Path(info.path) if info else self._volume_dir(uid, EMPTY_DIR, name)
            if not path.exists():
                continue
            used = disk_usage(path)
            if used > limit:
                out.append(EmptyDirUsage(name, used, limit, str(source["sizeLimit"])))
        return out

    async def teardown(self, pod_uid: str) -> None:
        """The pod is gone from the node: unmount its tmpfs volumes and remove its volume
        directories. Host paths and PersistentVolume data are never touched (they are not
        under the pod's directory, and nothing mounted there is walked into)."""
        lock = self._locks.setdefault(pod_uid, asyncio.Lock())
        async with lock:
            self.tokens.forget_pod(pod_uid)
            self._pods.pop(pod_uid, None)
            self._owned = {k for k in self._owned if k[0] != pod_uid}
            self._ownership_skipped.pop(pod_uid, None)
            await asyncio.to_thread(self._remove_pod_dirs, pod_uid)
        self._locks.pop(pod_uid, None)

    async def cleanup_orphans(self, live_uids: set[str]) -> None:
        """After a restart of the agent: tear down what pods no longer on this node left."""
        orphans = await asyncio.to_thread(self._orphans, live_uids)
        for uid in sorted(orphans):
            try:
                await self.teardown(uid)
            except OSError as exc:
                log.warning("removing the volumes of gone pod %s failed: %s", uid, exc)
        self.tokens.cleanup()

    def _orphans(self, live_uids: set[str]) -> set[str]:
        orphans: set[str] = set()
        for base in (self.root, self.shm_root / self.node_name):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for entry in os.scandir(base):
                    if entry.name in live_uids or not entry.is_dir(follow_symlinks=False):
                        continue
                    if base == self.root and not os.path.lexists(os.path.join(entry.path, "volumes")):
                        # Not a pod directory this manager made: leave it alone.
                        continue
                    orphans.add(entry.name)
        return orphans

    def known(self, pod_uid: str) -> PodVolumes | None:
        """What the last setup() of the pod made (possibly partial)."""
        return self._pods.get(pod_uid)

    # -- dispatch -----------------------------------------------------------------------

    async def _setup_volume(self, ctx: _PodContext, volume: dict[str, Any], result: PodVolumes) -> VolumeInfo:
        name = volume.get("name") or ""
        sources = [k for k, v in volume.items() if k != "name" and v is not None]
        if not sources:
            # The API defaults a volume without a source to an emptyDir.
            sources = ["emptyDir"]
            volume = {**volume, "emptyDir": {}}
        kind = sources[0]
        source = volume[kind]
        if kind == "emptyDir":
            return await asyncio.to_thread(self._empty_dir, ctx, name, source, result)
        if kind == "configMap":
            payload = await self._config_map_payload(ctx, name, source, source.get("defaultMode"))
            return await self._write_atomic(ctx, name, kind, CONFIG_MAP, payload, tmpfs=False)
        if kind == "secret":
            payload = await self._secret_payload(ctx, name, source, source.get("defaultMode"))
            return await self._write_atomic(ctx, name, kind, SECRET, payload, tmpfs=True)
        if kind == "downwardAPI":
            try:
                payload = self._downward_payload(ctx, source.get("items") or [], _mode(source.get("defaultMode")))
            except (EnvError, PayloadError) as exc:
                raise _setup_failed(name, str(exc)) from None
            return await self._write_atomic(ctx, name, kind, DOWNWARD_API, payload, tmpfs=False)
        if kind == "projected":
            payload = await self._projected_payload(ctx, name, source)
            return await self._write_atomic(ctx, name, kind, PROJECTED, payload, tmpfs=True)
        if kind == "hostPath":
            path = source.get("path") or ""
            try:
                await asyncio.to_thread(check_host_path, path, source.get("type") or "")
            except _SetUpError as exc:
                raise _setup_failed(name, str(exc)) from None
            return VolumeInfo(name, kind, path, read_only=False)
        if kind == "persistentVolumeClaim":
            return await self._claim(ctx, name, source.get("claimName") or "", bool(source.get("readOnly")))
        if kind == "ephemeral":
            claim_name = f"{ctx.name}-{name}"
            return await self._claim(ctx, name, claim_name, False, ephemeral=True)
        plugin = _PLUGINS.get(kind)
        what = f'volume plugin "{plugin}"' if plugin else f'volume type "{kind}"'
        raise _setup_failed(name, f"{what} is not supported on this node (supported: emptyDir, configMap, secret, "
                                  "downwardAPI, projected, hostPath, persistentVolumeClaim, ephemeral)")

    # -- emptyDir -----------------------------------------------------------------------

    def _empty_dir(self, ctx: _PodContext, name: str, source: dict[str, Any], result: PodVolumes) -> VolumeInfo:
        medium = source.get("medium") or ""
        limit = _quiet_bytes(source.get("sizeLimit"))
        if medium not in ("", "Memory"):
            raise _setup_failed(name, f'emptyDir medium "{medium}" is not supported on this node '
                                      '(supported: "" for the node\'s disk, "Memory")')
        if medium == "Memory":
            size = self._memory_size(ctx.pod, source.get("sizeLimit"))
            path = self._volume_dir(ctx.uid, EMPTY_DIR, name)
            if self.can_mount:
                created = self._ensure_tmpfs(path, size)
                if created is not None:
                    if created:
                        self._own_once(ctx, name, path, read_only=False)
                    return VolumeInfo(name, "emptyDir", str(path), tmpfs=True, medium=medium, size_limit=limit)
            shm = self.shm_root / self.node_name / ctx.uid / name
            created = self._make_dir(shm, 0o777)
            if created:
                self._own_once(ctx, name, shm, read_only=False)
            result.notices.append(
                f'emptyDir volume "{name}" (medium: Memory) is a directory under {SHM_PATH}, not a tmpfs of its own: '
                "the agent may not mount file systems (it needs root or CAP_SYS_ADMIN), so its size is bounded "
                "only by eviction")
            return VolumeInfo(name, "emptyDir", str(shm), medium=medium, size_limit=limit)
        path = self._volume_dir(ctx.uid, EMPTY_DIR, name)
        if self._make_dir(path, 0o777):
            self._own_once(ctx, name, path, read_only=False)
        return VolumeInfo(name, "emptyDir", str(path), size_limit=limit)

    def _memory_size(self, pod: dict[str, Any], size_limit: Any) -> int:
        """The kubelet's size for a memory-backed emptyDir: the node's allocatable memory,
        lowered to the pod's memory limit, lowered to the volume's sizeLimit."""
        size = _quiet_bytes((self._node_allocatable() or {}).get("memory")) or 0
        pod_limit = pod_memory_limit(pod)
        if pod_limit and pod_limit > 0 and (size == 0 or pod_limit <= size):
            size = pod_limit
        limit = _quiet_bytes(size_limit)
        if limit and limit > 0 and (size == 0 or limit <= size):
            size = limit
        return size

    def _ensure_tmpfs(self, path: Path, size: int | None) -> bool | None:
        """Mount a tmpfs at ``path`` unless one is there. True: mounted now; False: it
        already was; None: the agent may not mount after all (and will not try again)."""
        key = str(path)
        if key in self._mounted or hostmount.is_mount_point(path, "tmpfs"):
            self._mounted.add(key)
            return False
        self._make_parents(path)
        path.mkdir(exist_ok=True)
        try:
            hostmount.mount_tmpfs(path, size or None)
        except OSError as exc:
            if hostmount.not_permitted(exc):
                log.warning("mounting tmpfs at %s is not permitted (%s): memory-backed volumes fall back to "
                            "directories", path, exc)
                self.can_mount = False
                return None
            raise _setup_failed(path.name, f"mount of tmpfs failed: {exc}") from None
        self._mounted.add(key)
        return True

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

    # -- claims -------------------------------------------------------------------------

    async def _claim(self, ctx: _PodContext, name: str, claim_name: str, read_only: bool, *,
                     ephemeral: bool = False) -> VolumeInfo:
        ns = ctx.namespace
        pvc = await self._fetch(name, "persistentvolumeclaims", ns, claim_name)
        if pvc is None:
            if ephemeral:
                raise VolumeError(name, "FailedMount", "waiting for ephemeral volume controller to create the "
                                                       f'persistentvolumeclaim "{claim_name}"')
            raise VolumeError(name, "FailedMount", f'persistentvolumeclaim "{claim_name}" not found')
        meta = pvc.get("metadata") or {}
        if ephemeral and not any(ref.get("uid") == ctx.uid and ref.get("controller")
                                 for ref in meta.get("ownerReferences") or []):
            raise VolumeError(name, "FailedMount",
                              f"PVC {ns}/{claim_name} was not created for pod {ns}/{ctx.name} (pod is not owner)")
        if meta.get("deletionTimestamp"):
            raise VolumeError(name, "FailedMount", f"can't start pod because PVC {ns}/{claim_name} is being deleted")
        phase = (pvc.get("status") or {}).get("phase") or ""
        pv_name = (pvc.get("spec") or {}).get("volumeName") or ""
        if phase != "Bound" or not pv_name:
            raise VolumeError(name, "FailedMount", f'PVC {ns}/{claim_name} has non-bound phase ("{phase}") or empty '
                                                   f'pvc.Spec.VolumeName ("{pv_name}")')
        pv = await self._fetch(name, "persistentvolumes", "", pv_name)
        if pv is None:
            raise VolumeError(name, "FailedMount",
                              f'failed to fetch PV {pv_name} from API server: persistentvolumes "{pv_name}" not found')
        spec = pv.get("spec") or {}
        claim_ref = spec.get("claimRef")
        if not claim_ref:
            raise VolumeError(name, "FailedMount", f'found PV object "{pv_name}" but it has a nil pv.Spec.ClaimRef '
                                                   "indicating it is not yet bound to the claim")
        claim_uid = meta.get("uid") or ""
        if claim_ref.get("uid") and claim_uid and claim_ref["uid"] != claim_uid:
            raise VolumeError(name, "FailedMount", f'found PV object "{pv_name}" but its pv.Spec.ClaimRef.UID '
                                                   f'("{claim_ref["uid"]}") does not point to claim.UID ("{claim_uid}")')
        if (spec.get("volumeMode") or "Filesystem") != "Filesystem":
            raise VolumeError(name, "FailedMount", f'Volume "{name}" has volumeMode "{spec["volumeMode"]}", but is '
                                                   f'specified in volumeMounts for pod "{ns}"/"{ctx.name}"')
        if not await self._node_matches(spec.get("nodeAffinity")):
            raise VolumeError(name, "FailedMount", f'MountVolume.NodeAffinity check failed for volume "{pv_name}" : '
                                                   "no matching NodeSelectorTerms")
        kind = "ephemeral" if ephemeral else "persistentVolumeClaim"
        if spec.get("hostPath") is not None:
            host = spec["hostPath"]
            provisioner = ((pv.get("metadata") or {}).get("annotations") or {}).get("pv.kubernetes.io/provisioned-by")
            try:
                if provisioner in _LOCAL_PATH_PROVISIONERS:
                    # As the local-path provisioner's own helper does (mkdir -m 0777): any
                    # container user may write its new volume.
                    await asyncio.to_thread(_make_open_dir, host.get("path") or "")
                await asyncio.to_thread(check_host_path, host.get("path") or "", host.get("type") or "")
            except _SetUpError as exc:
                raise VolumeError(name, "FailedMount",
                                  f'MountVolume.SetUp failed for volume "{pv_name}" : {exc}') from None
            # The kubelet's hostPath plugin manages no ownership: fsGroup does not apply.
            return VolumeInfo(name, kind, host.get("path") or "", read_only=read_only)
        if spec.get("local") is not None:
            path = spec["local"].get("path") or ""
            if not os.path.isabs(path) or not await asyncio.to_thread(os.path.exists, path):
                raise VolumeError(name, "FailedMount", f'MountVolume.NewMounter initialization failed for volume '
                                                       f'"{pv_name}" : path "{path}" does not exist')
            if not read_only:
                policy = ((ctx.pod.get("spec") or {}).get("securityContext") or {}).get("fsGroupChangePolicy")
                key = (ctx.uid, name)
                if key not in self._owned:
                    await asyncio.to_thread(self._own, ctx, name, Path(path), False, policy)
                    self._owned.add(key)
            return VolumeInfo(name, kind, path, read_only=read_only)
        sources = [k for k, v in spec.items() if v is not None and k not in _PV_NON_SOURCE_FIELDS]
        what = sources[0] if sources else ""
        plugin = f'volume plugin "{_PLUGINS.get(what, what)}"' if what else "a volume without a source"
        if what == "csi":
            plugin += f' (driver "{(spec.get("csi") or {}).get("driver") or ""}")'
        raise VolumeError(name, "FailedMount", f'MountVolume.SetUp failed for volume "{pv_name}" : {plugin} is not '
                                               "supported on this node (PersistentVolumes here: hostPath, local)")

    async def _node_matches(self, affinity: dict[str, Any] | None) -> bool:
        if not affinity or not affinity.get("required"):
            return True
        terms = affinity["required"].get("nodeSelectorTerms") or []
        node = None
        with contextlib.suppress(VolumeError):
            node = await self._fetch("", "nodes", "", self.node_name)
        labels = dict(((node or {}).get("metadata") or {}).get("labels") or {})
        labels.setdefault("kubernetes.io/hostname", self.node_name)
        return any(_term_matches(term, labels, self.node_name) for term in terms)

    # -- subPath ------------------------------------------------------------------------

    def _prepare_sub_path(self, info: VolumeInfo, sub_path: str, container: str, volume: str, index: int) -> str:
        if os.path.isabs(sub_path):
            raise _config_error(volume, f"error SubPath `{sub_path}` must not be an absolute path")
        if ".." in sub_path.split("/"):
            raise _config_error(volume, f"unable to provision SubPath `{sub_path}`: must not contain '..'")
        base = os.path.realpath(info.path)
        target = os.path.join(base, sub_path)
        if not os.path.lexists(target):
            try:
                safe_make_dir(base, sub_path, stat.S_IMODE(os.stat(base).st_mode))
            except OSError as exc:
                log.warning("subPath %s of volume %s: %s", sub_path, volume, exc)
                raise _config_error(volume, f'failed to create subPath directory for volumeMount "{volume}" of '
                                            f'container "{container}"') from None
        resolved = os.path.realpath(target)
        if not _within(resolved, base) or not os.path.exists(resolved):
            log.warning("subPath %s of volume %s resolves to %s, outside the volume", sub_path, volume, resolved)
            raise _config_error(volume, f'failed to prepare subPath for volumeMount "{volume}" of container '
                                        f'"{container}"')
        if not info.atomic:
            return resolved
        # The atomic writer removes old versions: the container keeps this one, as it would
        # through the kubelet's bind mount of it. Hard links inside the volume itself stay
        # on its file system (a Secret's tmpfs) and outlive the old version's directory.
        pin = Path(base) / SUBPATHS_DIR / container / str(index)
        try:
            pin.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            _snapshot(resolved, pin)
        except OSError as exc:
            log.warning("subPath %s of volume %s: snapshot failed: %s", sub_path, volume, exc)
            raise _config_error(volume, f'failed to prepare subPath for volumeMount "{volume}" of container '
                                        f'"{container}"') from None
        return str(pin)

    def _shm_volume(self, pod: dict[str, Any]) -> str | None:
        spec = pod.get("spec") or {}
        memory = {v.get("name") for v in spec.get("volumes") or []
                  if (v.get("emptyDir") or {}).get("medium") == "Memory"}
        if not memory:
            return None
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            for vm in c.get("volumeMounts") or []:
                if (vm.get("name") in memory and not vm.get("subPath") and not vm.get("subPathExpr")
                        and os.path.normpath("/" + (vm.get("mountPath") or "").lstrip("/")) == SHM_PATH):
                    return vm["name"]
        return None

    # -- ownership ----------------------------------------------------------------------

    def _own_once(self, ctx: _PodContext, name: str, path: Path, read_only: bool) -> None:
        if ctx.fs_group is None:
            return
        self._own(ctx, name, path, read_only, None)
        self._owned.add((ctx.uid, name))

    def _own(self, ctx: _PodContext, name: str, path: Path, read_only: bool, policy: str | None) -> None:
        if ctx.fs_group is None:
            return
        if not self.can_chown:
            skipped = self._ownership_skipped.setdefault(ctx.uid, [])
            if name not in skipped:
                skipped.append(name)
            return
        set_volume_ownership(path, ctx.fs_group, read_only, policy)

    # -- files --------------------------------------------------------------------------

    def _volume_dir(self, uid: str, plugin: str, name: str) -> Path:
        return self.root / uid / "volumes" / plugin / name

    def _make_parents(self, path: Path) -> None:
        """The directories above a volume, made with the kubelet's mode for pod directories."""
        missing: list[Path] = []
        parent = path.parent
        while not parent.is_dir():
            missing.append(parent)
            parent = parent.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                d.mkdir(mode=self.dir_mode)
            os.chmod(d, self.dir_mode)

    def _make_dir(self, path: Path, mode: int) -> bool:
        """Create the volume's directory with ``mode`` (not narrowed by the umask); True when
        it was created now."""
        if path.is_dir():
            return False
        self._make_parents(path)
        try:
            path.mkdir(mode=mode)
        except FileExistsError:
            return False
        os.chmod(path, mode)
        return True

    def _remove_pod_dirs(self, uid: str) -> None:
        for base in (self.root / uid, self.shm_root / self.node_name / uid):
            if not base.exists():
                continue
            for point, _fstype in hostmount.mounts_under(base):
                try:
                    hostmount.unmount(point)
                except OSError:
                    with contextlib.suppress(OSError):
                        hostmount.unmount(point, detach=True)
                self._mounted.discard(point)
            left = hostmount.mounts_under(base)
            if left:
                # Removing files under a mount would reach into what it shows.
                raise OSError(f"pod {uid}: {left[0][0]} is still mounted; its directory is kept")
            if os.path.lexists(base / "volumes"):
                shutil.rmtree(base / "volumes")
            if base.parent == self.shm_root / self.node_name:
                shutil.rmtree(base, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    base.rmdir()

    # -- API access ---------------------------------------------------------------------

    async def _fetch(self, volume: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            if self._injected_get is not None:
                try:
                    return await self._injected_get(kind, namespace, name)
                except LookupError:
                    # The getter's client does not know the kind: ask by its REST path.
                    pass
            return await self._get_raw(kind, namespace, name)
        except VolumeError:
            raise
        except Exception as exc:
            singular = kind[:-1] if kind.endswith("s") else kind
            raise _setup_failed(volume, f'cannot get {singular} "{name}": {exc}') from None

    async def _get_raw(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if self.client is None:
            raise LookupError("no API client")
        path = f"/api/v1/namespaces/{namespace}/{kind}/{name}" if namespace else f"/api/v1/{kind}/{name}"
        try:
            resp = await self.client.raw_request("GET", path)
        except NotFound:
            return None
        return json.loads(resp.body) if resp.body else None

    async def _request_token(self, namespace: str, service_account: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.client is None:
            raise LookupError("no API client")
        return await self.client.create_subresource("serviceaccounts", service_account, "token", body, namespace,
                                                    raw=True)


# -- the pod, read once per setup ------------------------------------------------------------


class _PodContext:
    def __init__(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        self.uid: str = meta.get("uid") or ""
        self.name: str = meta.get("name") or ""
        self.namespace: str = meta.get("namespace") or "default"
        self.service_account: str = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        fs_group = (spec.get("securityContext") or {}).get("fsGroup")
        self.fs_group: int | None = int(fs_group) if fs_group is not None else None

    def container(self, name: str) -> dict[str, Any] | None:
        spec = self.pod.get("spec") or {}
        return next((c for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
                     if c.get("name") == name), None)


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


def pod_memory_limit(pod: Mapping[str, Any]) -> int | None:
    """The pod's memory limit as the kubelet gives its cgroup: set only when every container
    declares a non-zero one; then Kubernetes' PodLimits (sidecars add up, an init container
    runs beside the sidecars started before it, overhead on top)."""
    spec = pod.get("spec") or {}
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        if not _quiet_bytes(((c.get("resources") or {}).get("limits") or {}).get("memory")):
            return None
    total = podresources.pod_limits(pod).get("memory")
    return math.ceil(total) if total is not None else None


def _host_allocatable() -> dict[str, Any]:
    out: dict[str, Any] = {"cpu": os.cpu_count() or 1}
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                out["memory"] = int(line.split()[1]) * 1024
                break
    return out


# -- host paths ------------------------------------------------------------------------------


def check_host_path(path: str, type_: str) -> None:
    """The kubelet's hostPath type check, creating the path for the *OrCreate types."""
    if not path or not os.path.isabs(path):
        raise _SetUpError(f"hostPath {path!r} must be an absolute path")
    if type_ == "":
        if not os.path.lexists(path):
            # What the container runtime does with a missing bind source: a new directory.
            os.makedirs(path, 0o755, exist_ok=True)
        return
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _SetUpError(str(exc)) from None
    if type_ == "DirectoryOrCreate" and st is None:
        try:
            os.makedirs(path, 0o755, exist_ok=True)
        except OSError as exc:
            raise _SetUpError(str(exc)) from None
        return
    if type_ == "FileOrCreate" and st is None:
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDONLY, 0o644)
        except OSError as exc:
            raise _SetUpError(f"open {path}: {exc.strerror.lower() if exc.strerror else exc}") from None
        os.close(fd)
        return
    checks = {
        "DirectoryOrCreate": (stat.S_ISDIR, "is not a directory"),
        "Directory": (stat.S_ISDIR, "is not a directory"),
        "FileOrCreate": (stat.S_ISREG, "is not a file"),
        "File": (stat.S_ISREG, "is not a file"),
        "Socket": (stat.S_ISSOCK, "is not a socket file"),
        "CharDevice": (stat.S_ISCHR, "is not a character device"),
        "BlockDevice": (stat.S_ISBLK, "is not a block device"),
    }
    if type_ not in checks:
        raise _SetUpError(f"{type_} is an invalid volume type")
    test, what = checks[type_]
    if st is None or not test(st.st_mode):
        raise _SetUpError(f"hostPath type check failed: {path} {what}")


# -- ownership -------------------------------------------------------------------------------


def set_volume_ownership(path: Path, fs_group: int, read_only: bool, policy: str | None = None) -> bool:
    """SetVolumeOwnership: every file group-owned by fsGroup with group read (and write,
    unless read-only), directories also group-executable and setgid so new files inherit
    the group. With fsGroupChangePolicy OnRootMismatch a root already right is left as is.
    Returns whether it walked the volume."""
    if policy == "OnRootMismatch" and not _requires_permission_change(path, fs_group, read_only):
        return False
    mask = _RO_MASK if read_only else _RW_MASK
    for dirpath, dirnames, filenames in os.walk(path):
        for entry in [dirpath, *(os.path.join(dirpath, n) for n in (*dirnames, *filenames))]:
            if entry != dirpath and os.path.isdir(entry) and not os.path.islink(entry):
                # Visited as its own dirpath.
                continue
            try:
                st = os.lstat(entry)
                os.lchown(entry, -1, fs_group)
            except OSError as exc:
                log.warning("lchown %s: %s", entry, exc)
                continue
            if stat.S_ISLNK(st.st_mode):
                # chmod would follow the link and change the file's mode the volume chose.
                continue
            mode = stat.S_IMODE(st.st_mode) | mask
            if stat.S_ISDIR(st.st_mode):
                mode |= _EXEC_MASK | stat.S_ISGID
            try:
                os.chmod(entry, mode)
            except OSError as exc:
                log.warning("chmod %s: %s", entry, exc)
    return True


def _requires_permission_change(path: Path, fs_group: int, read_only: bool) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return True
    if st.st_gid != fs_group or not stat.S_ISDIR(st.st_mode):
        return True
    want = (_RO_MASK if read_only else _RW_MASK) | _EXEC_MASK
    return (stat.S_IMODE(st.st_mode) & want) != want or not st.st_mode & stat.S_ISGID


# -- subPath helpers -------------------------------------------------------------------------


def _within(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def safe_make_dir(base: str, sub_path: str, perm: int) -> None:
    """Create ``base/sub_path`` as directories with ``perm``, refusing to follow a symlink in
    the existing part out of ``base`` (the kubelet's SafeMakeDir)."""
    parts = [p for p in sub_path.split("/") if p and p != "."]
    cur = base
    i = 0
    while i < len(parts) and os.path.lexists(os.path.join(cur, parts[i])):
        cur = os.path.join(cur, parts[i])
        i += 1
    real = os.path.realpath(cur)
    if not _within(real, base):
        raise OSError(f"path {cur} is outside of allowed base {base}")
    if i < len(parts) and not os.path.isdir(real):
        raise OSError(f"{cur} is not a directory")
    for part in parts[i:]:
        real = os.path.join(real, part)
        fd = os.open(os.path.dirname(real), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.mkdir(part, perm, dir_fd=fd)
        finally:
            os.close(fd)
        os.chmod(real, perm)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _snapshot(source: str, dest: Path) -> None:
    """``source`` at ``dest`` by hard links (one file system), replacing what was there."""
    tmp = dest.with_name(dest.name + ".tmp")
    _remove(tmp)
    if os.path.isdir(source):
        shutil.copytree(source, tmp, symlinks=True, copy_function=os.link)
    else:
        os.link(source, tmp)
    if dest.is_dir() and not dest.is_symlink():
        old = dest.with_name(dest.name + ".old")
        _remove(old)
        os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dest)


def _expand_sub_path(volume: str, expr: str, env: Mapping[str, str]) -> str:
    """subPathExpr's $(VAR) expansion; an unset or empty variable is an error, as in the
    kubelet (a path must not silently collapse onto the volume's root)."""
    missing: set[str] = set()

    class _Env(dict):
        def __contains__(self, key: object) -> bool:
            return True

        def __getitem__(self, key: str) -> str:
            value = env.get(key, "")
            if not value:
                missing.add(key)
            return value

    expanded = expand(expr, _Env())
    if missing:
        raise _config_error(volume, f"missing value for {', '.join(sorted(missing))}")
    return expanded


def _config_error(volume: str, message: str) -> VolumeError:
    return VolumeError(volume, "CreateContainerConfigError", message)


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str], node_name: str) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    for expr in expressions:
        op = _NODE_SELECTOR_OPERATORS.get(expr.get("operator") or "")
        if op is None:
            return False
        try:
            requirement = Requirement.new(expr.get("key") or "", op, expr.get("values") or [])
        except SelectorError:
            return False
        if not requirement.matches(labels):
            return False
    for f in fields:
        if f.get("key") != "metadata.name":
            return False
        inside = node_name in (f.get("values") or [])
        if f.get("operator") == "In" and not inside:
            return False
        if f.get("operator") == "NotIn" and inside:
            return False
        if f.get("operator") not in ("In", "NotIn"):
            return False
    return True


def disk_usage(path: Path) -> int:
    """Bytes of storage used below ``path`` (allocated blocks, each inode once), as du does."""
    seen: set[tuple[int, int]] = set()
    total = 0
    try:
        root_dev = os.lstat(path).st_dev
    except OSError:
        return 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [*dirnames, *filenames, ""]:
            entry = os.path.join(dirpath, name) if name else dirpath
            try:
                st = os.lstat(entry)
            except OSError:
                continue
            if st.st_dev != root_dev or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
        # Do not walk into other file systems mounted below.
        dirnames[:] = [d for d in dirnames if _same_dev(os.path.join(dirpath, d), root_dev)]
    return total


def _same_dev(path: str, dev: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_dev == dev and not stat.S_ISLNK(st.st_mode)


_LOCAL_PATH_PROVISIONERS = ("gpufleet.io/local-path", "rancher.io/local-path")


def _make_open_dir(path: str) -> None:
    if not path or not os.path.isabs(path) or os.path.lexists(path):
        return
    try:
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o777)
    except OSError as exc:
        raise _SetUpError(str(exc)) from None
