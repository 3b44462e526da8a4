"""cpu and memory limits for host processes through cgroups, v1 or v2, where the machine
lets us write them.

Each container attempt gets ``<root>/gpufleet/<pod-uid>/<container>/<attempt>`` (per
controller hierarchy on v1). An attempt of its own means a restarted container never
shares OOM counters or leftover processes with the one before it, and removing an old
attempt cannot touch a running one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

CFS_PERIOD_US = 100_000
# The kernel refuses quotas below 1ms.
_MIN_QUOTA_US = 1_000


def _safe(part: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]", "_", part)
    return s if s not in ("", ".", "..") else "_"


def _enabled(d: Path) -> set[str]:
    try:
        return {t.lstrip("+") for t in (d / "cgroup.subtree_control").read_text().split()}
    except FileNotFoundError:
        return set()


def _enable(d: Path, controllers: Sequence[str]) -> None:
    missing = [c for c in controllers if c not in _enabled(d)]
    if missing:
        _write(d / "cgroup.subtree_control", " ".join("+" + c for c in missing))


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class Cgroup:
    """One container attempt's cgroup (one directory per hierarchy on v1)."""

    def __init__(self, version: int, dirs: dict[str, Path], stop_at: dict[str, Path]) -> None:
        self.version = version
        # controller -> directory; on v2 every controller maps to the same one.
        self.dirs = dirs
        self._stop_at = stop_at

    @property
    def procs_files(self) -> list[str]:
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    def set_limits(self, cpu_millis: int | None, memory_bytes: int | None) -> None:
        cpu = self.dirs.get("cpu")
        mem = self.dirs.get("memory")
        if self.version == 1:
            if cpu is not None:
                _write(cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US))
                quota = -1 if not cpu_millis else max(_MIN_QUOTA_US, cpu_millis * CFS_PERIOD_US // 1000)
                _write(cpu / "cpu.cfs_quota_us", str(quota))
            if mem is not None:
                _write(mem / "memory.limit_in_bytes", str(memory_bytes) if memory_bytes else "-1")
        else:
            if cpu is not None:
                quota = (
                    "max" if not cpu_millis else str(max(_MIN_QUOTA_US, cpu_millis * CFS_PERIOD_US // 1000))
                )
                _write(cpu / "cpu.max", f"{quota} {CFS_PERIOD_US}")
            if mem is not None:
                _write(mem / "memory.max", str(memory_bytes) if memory_bytes else "max")

    def add(self, pid: int) -> None:
        for f in self.procs_files:
            _write(Path(f), str(pid))

    def oom_kills(self) -> int:
        """How many processes the OOM killer took from this cgroup."""
        mem = self.dirs.get("memory")
        if mem is None:
            return 0
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            text = (mem / name).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def pids(self) -> list[int]:
        out: set[int] = set()
        for f in self.procs_files:
            with contextlib.suppress(OSError, ValueError):
                out.update(int(x) for x in Path(f).read_text().split())
        return sorted(out)

    def memory_bytes(self) -> int | None:
        """The working set, as the kubelet reports it: usage less inactive file cache."""
        mem = self.dirs.get("memory")
        if mem is None:
            return None
        usage_file, inactive_key = (
            ("memory.usage_in_bytes", "total_inactive_file")
            if self.version == 1
            else ("memory.current", "inactive_file")
        )
        try:
            usage = int((mem / usage_file).read_text().strip())
        except (OSError, ValueError):
            return None
        inactive = 0
        with contextlib.suppress(OSError, ValueError):
            for line in (mem / "memory.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == inactive_key:
                    inactive = int(value)
                    break
        return max(0, usage - inactive)

    def remove(self) -> None:
        """rmdir the attempt's directory and the parents it leaves empty. A cgroup that still
        has processes stays (EBUSY), which is the kernel keeping us honest."""
        for controller, d in self.dirs.items():
            stop = self._stop_at[controller]
            cur = d
            while cur != stop and stop in cur.parents:
                try:
                    os.rmdir(cur)
                except FileNotFoundError:
                    pass
                except OSError:
                    break
                cur = cur.parent


class Cgroups:
    """Finds which cgroup hierarchy this machine offers and whether we may write it.

    ``supported`` names the limits that will be enforced ({"cpu", "memory"}, a part of it,
    or nothing); ``reason`` says why something is missing."""

    def __init__(self, root: str | os.PathLike[str] = "/sys/fs/cgroup", prefix: str = "gpufleet") -> None:
        self.root = Path(root)
        self.prefix = prefix
        self.version: int | None = None
        self._bases: dict[str, Path] = {}
        self.reason = ""
        problems: list[str] = []
        if (self.root / "cgroup.controllers").exists():
            self._detect_v2(problems)
        elif (self.root / "cpu").is_dir() or (self.root / "memory").is_dir():
            self._detect_v1(problems)
        else:
            problems.append(f"no cgroup hierarchy under {self.root}")
        self.supported = frozenset(self._bases)
        self.reason = "; ".join(problems)

    def _detect_v1(self, problems: list[str]) -> None:
        self.version = 1
        for controller, probe in (("cpu", "cpu.cfs_quota_us"), ("memory", "memory.limit_in_bytes")):
            hier = self.root / controller
            if not (hier / probe).exists():
                problems.append(f"{hier}/{probe} does not exist")
                continue
            base = hier / self.prefix
            try:
                base.mkdir(exist_ok=True)
            except OSError as e:
                problems.append(f"cannot create {base}: {e.strerror or e}")
                continue
            if not os.access(base, os.W_OK):
                problems.append(f"{base} is not writable")
                continue
            self._bases[controller] = base

    def _detect_v2(self, problems: list[str]) -> None:
        self.version = 2
        try:
            available = set((self.root / "cgroup.controllers").read_text().split())
        except OSError as e:
            problems.append(f"cannot read {self.root}/cgroup.controllers: {e}")
            return
        wanted = [c for c in ("cpu", "memory") if c in available]
        for c in ("cpu", "memory"):
            if c not in available:
                problems.append(f"the {c} controller is not available in {self.root}")
        if not wanted:
            return
        base = self.root / self.prefix
        try:
            base.mkdir(exist_ok=True)
            # Controllers must be enabled on every level above the leaves.
            for d in (self.root, base):
                _enable(d, wanted)
        except OSError as e:
            problems.append(f"cannot delegate {'/'.join(wanted)} to {base}: {e.strerror or e}")
            return
        for c in wanted:
            self._bases[c] = base

    def create(self, parts: Sequence[str]) -> Cgroup | None:
        if not self._bases:
            return None
        rel = Path(*[_safe(p) for p in parts])
        dirs: dict[str, Path] = {}
        stop: dict[str, Path] = {}
        for controller, base in self._bases.items():
            d = base / rel
            if self.version == 2:
                # On v2 the intermediate levels need the controllers enabled too.
                cur = base
                for p in rel.parts[:-1]:
                    cur = cur / p
                    cur.mkdir(exist_ok=True)
                    _enable(cur, list(self._bases))
            d.mkdir(parents=True, exist_ok=True)
            dirs[controller] = d
            stop[controller] = base
        return Cgroup(self.version or 0, dirs, stop)
