"""Projecting a set of files into a volume directory so that readers see every update whole.

The layout is the kubelet's AtomicWriter's, which programs in containers (and tools that
watch ConfigMap volumes) rely on:

    <dir>/..2024_05_01_12_00_00.123456789/   the current content, one real directory
    <dir>/..data -> ..2024_05_01_12_00_00.123456789
    <dir>/<name> -> ..data/<name>           for each top-level name of the payload

An update writes a fresh timestamped directory, then swaps ``..data`` to it with one
rename, so a reader that resolves ``<dir>/key`` sees either the old or the new set of files,
never a mix; a file already open keeps reading the old version. Names starting with ``..``
are reserved for this machinery.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = "..data"
_DATA_TMP = "..data_tmp"
_MAX_NAME = 255
_MAX_PATH = 4096


@dataclass(frozen=True)
class FileProjection:
    data: bytes
    mode: int = 0o644


class PayloadError(ValueError):
    """A payload path the writer refuses (absolute, with '..', reserved)."""


def validate_path(path: str) -> None:
    """The kubelet's rules for a projected file's path, with its wording."""
    if not path:
        raise PayloadError("invalid path: must not be empty")
    if len(path) > _MAX_PATH:
        raise PayloadError(f"invalid path: must be less than or equal to {_MAX_PATH} characters")
    if os.path.isabs(path):
        raise PayloadError(f"invalid path: must be relative path: {path}")
    for item in path.split("/"):
        if len(item) > _MAX_NAME:
            raise PayloadError(f"invalid path: filenames must be less than or equal to {_MAX_NAME} characters")
        if item == "..":
            raise PayloadError(f"invalid path: must not contain '..': {path}")
    if path.startswith(".."):
        raise PayloadError(f"invalid path: must not start with '..': {path}")


def _clean(path: str) -> str:
    return os.path.normpath(path).lstrip("/")


class AtomicWriter:
    def __init__(self, target: Path, now: Callable[[], float] = time.time, reserved: Iterable[str] = ()) -> None:
        self.target = Path(target)
        self.now = now
        # ``..`` names of the directory that belong to someone else: kept as they are.
        self.reserved = frozenset(reserved)

    def current_dir(self) -> Path | None:
        """The timestamped directory ``..data`` points to, if any."""
        try:
            name = os.readlink(self.target / DATA_DIR)
        except OSError:
            return None
        path = self.target / name
        return path if path.is_dir() else None

    def write(self, payload: Mapping[str, FileProjection],
              set_perms: Callable[[Path], None] | None = None) -> bool:
        """Make the directory show exactly ``payload``. Returns False (and writes nothing)
        when the content on disk already is the payload. ``set_perms`` runs on the new
        timestamped directory before it becomes visible (ownership for fsGroup)."""
        cleaned: dict[str, FileProjection] = {}
        for path, projection in payload.items():
            validate_path(path)
            cleaned[_clean(path)] = projection
        self.target.mkdir(parents=True, exist_ok=True)
        old = self.current_dir()
        if old is not None and self._same(old, cleaned):
            self._link_visible(cleaned)
            return False
        new = self._new_ts_dir()
        try:
            for path, projection in sorted(cleaned.items()):
                self._write_file(new / path, projection)
            if set_perms is not None:
                set_perms(new)
            tmp = self.target / _DATA_TMP
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            os.symlink(new.name, tmp)
            # One rename: readers resolve either the old directory or the new one.
            os.replace(tmp, self.target / DATA_DIR)
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)
            raise
        self._link_visible(cleaned)
        self._remove_stale(cleaned, keep=new.name)
        return True

    # -- helpers --------------------------------------------------------------------------

    def _same(self, current: Path, payload: Mapping[str, FileProjection]) -> bool:
        on_disk: set[str] = set()
        for dirpath, _dirs, files in os.walk(current):
            for f in files:
                on_disk.add(os.path.relpath(os.path.join(dirpath, f), current))
        if on_disk != set(payload):
            return False
        for path, projection in payload.items():
            try:
                if (current / path).read_bytes() != projection.data:
                    return False
            except OSError:
                return False
        return True

    def _new_ts_dir(self) -> Path:
        stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime(self.now()))
        path = Path(tempfile.mkdtemp(prefix=stamp, dir=self.target))
        os.chmod(path, 0o755)
        return path

    @staticmethod
    def _write_file(path: Path, projection: FileProjection) -> None:
        parent = path.parent
        if not parent.is_dir():
            parent.mkdir(parents=True, mode=0o755)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, projection.mode)
        try:
            _write_all(fd, projection.data)
            # The process umask must not narrow the mode the volume asks for.
            os.fchmod(fd, projection.mode)
        finally:
            os.close(fd)

    def _visible_names(self, payload: Mapping[str, FileProjection]) -> set[str]:
        return {p.split("/", 1)[0] for p in payload}

    def _link_visible(self, payload: Mapping[str, FileProjection]) -> None:
        for name in sorted(self._visible_names(payload)):
            link = self.target / name
            want = f"{DATA_DIR}/{name}"
            try:
                if os.readlink(link) == want:
                    continue
                link.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                # A real file or directory where a link belongs (an older layout): replace it.
                if link.is_dir() and not link.is_symlink():
                    shutil.rmtree(link)
                else:
                    link.unlink()
            os.symlink(want, link)

    def _remove_stale(self, payload: Mapping[str, FileProjection], keep: str) -> None:
        visible = self._visible_names(payload)
        for entry in os.scandir(self.target):
            name = entry.name
            if name in (DATA_DIR, keep) or name in visible or name in self.reserved:
                continue
            if name.startswith(".."):
                # Earlier timestamped directories (and one left by an interrupted write).
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                elif name == _DATA_TMP:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
                continue
            if entry.is_symlink():
                target = os.readlink(entry.path)
                if target.startswith(f"{DATA_DIR}/"):
                    # A name the new payload no longer has.
                    os.unlink(entry.path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
