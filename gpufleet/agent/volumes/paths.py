"""Paths on the node: hostPath type checks, fsGroup ownership (the kubelet's
SetVolumeOwnership) and subPath mounts."""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path

from gpufleet.agent.envvars import expand
from gpufleet.agent.volumes.common import (
    _EXEC_MASK,
    _RO_MASK,
    _RW_MASK,
    SUBPATHS_DIR,
    VolumeInfo,
    _config_error,
    _SetUpError,
)

log = logging.getLogger(__name__)

class SubPathMixin:
    """VolumeManager's subPath preparation (see manager.py)."""

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
