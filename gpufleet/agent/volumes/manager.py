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
import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpufleet.agent import hostmount
from gpufleet.agent.atomicwriter import PayloadError
from gpufleet.agent.envvars import EnvError
from gpufleet.agent.runtime.base import Mount
from gpufleet.agent.tokens import TokenManager, TokenSource
from gpufleet.agent.volumes.claims import ClaimsMixin
from gpufleet.agent.volumes.common import (
    _PLUGINS,
    CONFIG_MAP,
    DOWNWARD_API,
    EMPTY_DIR,
    PROJECTED,
    SECRET,
    SHM_PATH,
    EmptyDirUsage,
    ObjectGetter,
    PodVolumes,
    VolumeError,
    VolumeInfo,
    _config_error,
    _PodContext,
    _setup_failed,
    _SetUpError,
)
from gpufleet.agent.volumes.emptydir import EmptyDirMixin, _host_allocatable, disk_usage
from gpufleet.agent.volumes.paths import SubPathMixin, _expand_sub_path, check_host_path, set_volume_ownership
from gpufleet.agent.volumes.payloads import PayloadsMixin, _mode
from gpufleet.api.quantity import to_int_bytes
from gpufleet.client import NotFound
from gpufleet.utils.clock import Clock

log = logging.getLogger(__name__)


class VolumeManager(EmptyDirMixin, PayloadsMixin, ClaimsMixin, SubPathMixin):
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
