"""The few mount(2) operations the volume manager needs, and what is mounted where.

Called through libc rather than the mount(8) binary, so a node needs nothing installed and
errors come back as errno values.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

MNT_DETACH = 2
_CAP_CHOWN = 0
_CAP_SYS_ADMIN = 21

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return _libc


def mount_tmpfs(path: str | Path, size_bytes: int | None = None) -> None:
    options = f"size={int(size_bytes)}" if size_bytes else ""
    rc = _lib().mount(b"tmpfs", os.fsencode(str(path)), b"tmpfs", 0, options.encode() or None)
    if rc != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(path))


def unmount(path: str | Path, detach: bool = False) -> None:
    rc = _lib().umount2(os.fsencode(str(path)), MNT_DETACH if detach else 0)
    if rc != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(path))


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount this process sees."""
    try:
        text = Path(mountinfo).read_text()
    except OSError:
        return []
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 10 or "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        out.append((_unescape(fields[4]), fields[sep + 1]))
    return out


def mounts_under(path: str | Path) -> list[tuple[str, str]]:
    """Mounts at or below ``path``, deepest first (the order to unmount them in)."""
    base = os.path.realpath(str(path))
    found = [(p, t) for p, t in mounts() if p == base or p.startswith(base.rstrip("/") + "/")]
    # The same point may be mounted over more than once: keep each occurrence.
    return sorted(found, key=lambda m: m[0].count("/"), reverse=True)


def is_mount_point(path: str | Path, fstype: str | None = None) -> bool:
    real = os.path.realpath(str(path))
    return any(p == real and (fstype is None or t == fstype) for p, t in mounts())


def _effective_caps() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def may_mount() -> bool:
    return os.geteuid() == 0 or bool(_effective_caps() & (1 << _CAP_SYS_ADMIN))


def may_chown() -> bool:
    return os.geteuid() == 0 or bool(_effective_caps() & (1 << _CAP_CHOWN))


def not_permitted(exc: OSError) -> bool:
    return exc.errno in (errno.EPERM, errno.EACCES)
