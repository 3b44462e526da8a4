"""The process runtime's constants and its facts about the host: bubblewrap, capabilities,
users, programs on PATH, /proc, and the small file helpers its parts share."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import logging
import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from gpufleet.agent.runtime.base import (
    Mount,
    RuntimeError_,
)
from gpufleet.agent.runtime.sandbox import (
    Identity,
    Passwd,
)

log = logging.getLogger(__name__)

_INHERITED_ENV = ("PATH",)
# Joins the cgroups before exec'ing the program, so not one allocation happens outside
# them. Arguments: the cgroup.procs files, "--", the program and its arguments.
_JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"'
# After SIGKILL the kernel needs a moment to reap; this bounds how long we wait for it.
_KILL_SETTLE_S = 10.0
# How long start() waits for the monitor to report the program running.
_START_TIMEOUT_S = 60.0
_GONE_MESSAGE = (
    "The container could not be located when the agent started again: its monitor ended "
    "without recording how it exited"
)
DEFAULT_HOST_IMAGES = ("host", "localhost/gpufleet/host")
DEFAULT_USER = (65534, 65534)


def _package_root() -> str:
    import gpufleet

    return str(Path(gpufleet.__file__).resolve().parent.parent)

def _probe_bwrap(name: str | None) -> tuple[str | None, str]:
    if name is None:
        return None, "sandboxing is disabled"
    path = shutil.which(name)
    if path is None:
        return None, f"{name} (bubblewrap) is not installed"
    # The probe binds the whole of / recursively, so a mount that goes away meanwhile (another
    # pod's volume being unmounted) fails it ("Can't bind mount /oldroot/ ... No such file or
    # directory"). One such failure must not leave the node running pods unsandboxed for the
    # agent's whole life: only a failure that repeats counts.
    err = ""
    for attempt in range(3):
        if attempt:
            time.sleep(0.2 * attempt)
        try:
            p = subprocess.run(
                [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--", "true"],
                capture_output=True, timeout=30, check=False,
            )
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"{path} cannot run: {e}"
        if p.returncode == 0:
            return path, ""
        err = p.stderr.decode(errors="replace").strip()
    return None, f"{path} cannot build a sandbox here: {err}"


def _hidden_in_mounts(hidden: Sequence[str], mounts: Sequence[Mount]) -> list[tuple[str, bool]]:
    """Hidden paths seen through a volume (a hostPath of a directory above the agent's
    state, say): where they appear in the container, to hide them there too."""
    out = []
    for h in hidden:
        h = os.path.normpath(h)
        if not os.path.exists(h):
            continue
        for m in mounts:
            base = os.path.normpath(m.host_path)
            if h == base or h.startswith(base.rstrip("/") + "/"):
                out.append((os.path.normpath(m.container_path + h[len(base):]), os.path.isdir(h)))
    return out


def _make_dirs_for(path: str, ident: Identity) -> None:
    """mkdir -p, the new directories owned by the container's user (on the node), so a
    working directory created for it is its own to write in."""
    new = []
    p = os.path.abspath(path)
    while not os.path.exists(p):
        new.append(p)
        p = os.path.dirname(p)
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0:
        return
    uid, gid = (ident.outer_uid, ident.outer_gid) if ident.mode == "userns" else (ident.uid, ident.gid)
    for d in new:
        os.chown(d, uid, gid)


def _make_container_dir(cdir: Path) -> None:
    try:
        cdir.mkdir(parents=True)
        os.chmod(cdir, 0o700)
        tmp = cdir / "tmp"
        tmp.mkdir()
        # The container's /tmp, as the node's own /tmp is.
        os.chmod(tmp, 0o1777)
    except OSError as e:
        raise RuntimeError_(f"cannot create the container's directory: {e.strerror or e}", "CreateContainerError") from e


def _shm_ready(record: dict) -> bool:
    """Whether the sandbox's /dev/shm is in place (a reboot takes tmpfs mounts away)."""
    d = record.get("shm_dir")
    if not d or not os.path.isdir(d):
        return False
    return not record.get("shm_mounted") or os.path.ismount(d)


def _has_cap_sys_admin() -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << 21))
    except (OSError, ValueError):
        pass
    return False


def _node_address() -> str:
    """The node's address for the pod's own name in /etc/hosts (pods share its network)."""
    with contextlib.suppress(OSError):
        addr = socket.gethostbyname(socket.gethostname())
        if not addr.startswith("127."):
            return addr
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        # No packet is sent: connect() on UDP only picks the outgoing address.
        s.connect(("10.255.255.255", 1))
        return s.getsockname()[0]
    return "127.0.1.1"


def _passwd(uid: int) -> Passwd | None:
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return None
    try:
        groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except OSError:
        groups = tuple(g.gr_gid for g in grp.getgrall() if pw.pw_name in g.gr_mem)
    return Passwd(pw.pw_name, pw.pw_gid, pw.pw_dir, groups)


def _listing(path: str) -> list[tuple[str, str, str]]:
    out = []
    for e in os.scandir(path):
        if e.is_symlink():
            out.append((e.name, "symlink", os.readlink(e.path)))
        elif e.is_dir(follow_symlinks=False):
            out.append((e.name, "dir", ""))
        elif e.is_file(follow_symlinks=False):
            out.append((e.name, "file", ""))
    return out


def _user_may_exec(path: str, ident: Identity | None) -> bool:
    """Whether the container's user looks able to run the file at ``path`` on the node,
    from the permission bits of the file and of every directory on the way. Only a hint
    for choosing among PATH entries: ACLs, and network or VM filesystems that grant more
    than their bits say, have the last word when the program runs."""
    if ident is None or os.geteuid() != 0 or ident.mode == "agent":
        return os.access(path, os.X_OK)
    if ident.mode == "host" and ident.uid == 0:
        return os.access(path, os.X_OK)
    if ident.mode == "userns":
        uid, gids = ident.outer_uid, {ident.outer_gid}
    else:
        uid, gids = ident.uid, {ident.gid, *ident.groups}

    def allowed(st: os.stat_result) -> bool:
        if st.st_uid == uid:
            return bool(st.st_mode & 0o100)
        if st.st_gid in gids:
            return bool(st.st_mode & 0o010)
        return bool(st.st_mode & 0o001)

    try:
        for p in {os.path.abspath(path), os.path.realpath(path)}:
            d = os.path.dirname(p)
            while True:
                if not allowed(os.stat(d)):
                    return False
                if d == "/":
                    break
                d = os.path.dirname(d)
        return allowed(os.stat(path))
    except OSError:
        return False


def _resolve(exe: str, path_var: str, cwd: str, node_path, ident: Identity | None = None) -> str | None:
    """The program as the container names it, if it exists there. Of the PATH entries
    that have it, the first one its user looks able to run (as its shell would pass over
    one it may not enter), else the first."""

    def exists(p: str) -> str | None:
        n = node_path(p)
        return n if n is not None and os.path.isfile(n) and os.access(n, os.X_OK) else None

    if "/" in exe:
        p = exe if os.path.isabs(exe) else os.path.normpath(os.path.join(cwd, exe))
        return p if exists(p) else None
    first = None
    for d in path_var.split(os.pathsep):
        if d and os.path.isabs(d):
            p = os.path.join(d, exe)
            n = exists(p)
            if n is None:
                continue
            if ident is None or _user_may_exec(n, ident):
                return p
            first = first or p
    return first


def _environ(pid: int) -> dict[str, str]:
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in data.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def _descendants(pid: int) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    return []


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _write_file(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _write_json(path: Path, data: dict) -> None:
    _write_file(path, json.dumps(data, sort_keys=True), 0o600)


async def _run(*argv: str) -> tuple[int, str]:
    try:
        p = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as e:
        return 127, str(e)
    _, err = await p.communicate()
    assert p.returncode is not None
    return p.returncode, err.decode(errors="replace")
