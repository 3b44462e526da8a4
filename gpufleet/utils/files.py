"""Files only their owner may read: state dirs, databases, tokens, keys.

Modes are tightened, never widened: group and other lose every bit, the owner keeps what it
had, so a file made read-only on purpose stays so. Files left by an earlier run (or made
under a loose umask) are tightened the same way on the next start.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def tighten(path: Path) -> None:
    """Take group and other permissions off ``path`` if it exists (a missing file is fine)."""
    with contextlib.suppress(FileNotFoundError):
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            os.chmod(path, mode & ~0o077)


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner can enter (made with its parents if missing)."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    tighten(path)
    return path


def tighten_dir_files(path: Path) -> None:
    """Tighten ``path`` (a directory, if it exists) and the regular files directly in it;
    what lies deeper (pods' volumes and logs, with the modes their specs ask for) is left."""
    if not path.is_dir() or path.is_symlink():
        return
    tighten(path)
    for entry in path.iterdir():
        if entry.is_file() and not entry.is_symlink():
            tighten(entry)


def private_file(path: Path) -> Path:
    """``path`` as a file only its owner can read: created empty with mode 0600 if missing
    (so it never exists with a looser mode), tightened otherwise."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
    except FileExistsError:
        tighten(path)
    return path


def write_private(path: Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` atomically (a temporary file, renamed over it) as a 0600
    file whatever the umask: it never exists, even for a moment, with a looser mode."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)  # a leftover temporary file keeps its old mode otherwise
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.replace(tmp, path)
    return path
