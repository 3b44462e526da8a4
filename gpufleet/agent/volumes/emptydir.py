"""emptyDir volumes: a directory, or a tmpfs for medium Memory sized as the kubelet sizes it,
and the storage they use."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpufleet.agent import hostmount
from gpufleet.agent.volumes.common import (
    EMPTY_DIR,
    SHM_PATH,
    PodVolumes,
    VolumeInfo,
    _PodContext,
    _setup_failed,
)
from gpufleet.agent.volumes.payloads import _quiet_bytes
from gpufleet.api import podresources

log = logging.getLogger(__name__)

class EmptyDirMixin:
    """VolumeManager's emptyDir plugin (see manager.py)."""

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
