"""GPUs that are only declared (--gpus, --gpu-inventory, simulated fleets): a plugin that
schedules and reserves them exactly as a real one does, with stable UUIDs."""

from __future__ import annotations

import logging
import os
import re
import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.agent.devices.plugin import (
    _DECLARED_NAMESPACE,
    GPU,
    HEALTHY,
    UNHEALTHY,
    GPUStats,
    _reserve,
    normalize_model,
)
from gpufleet.api.gpuhealth import (
    DECLARED_UNHEALTHY,
    ECC_AGGREGATE,
    ECC_VOLATILE,
    NVLINK_ERRORS,
    REMAPPED_ROWS_FAILED,
    XID,
    Signal,
    throttle_signal,
)

log = logging.getLogger(__name__)

# --- declared -------------------------------------------------------------------------


@dataclass
class _Declared:
    model: str
    memory_mib: int
    group: str
    # What the inventory says is wrong with it (health, xid, ecc, ... fields).
    signals: tuple[Signal, ...] = ()


def _count(value: Any, where: str, problems: list[str]) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and value >= 0:
        return value
    problems.append(f"{where} must be a non-negative integer (got {value!r})")
    return 0


def health_signals_of(e: Mapping[str, Any], where: str, problems: list[str]) -> tuple[Signal, ...]:
    """The health fields of one inventory entry as signals: ``health`` (healthy/unhealthy),
    ``xid`` (a number or a list), ``ecc`` ({volatile, aggregate} uncorrected counts, or one
    number: volatile), ``remappedRowsFailed``, ``nvlinkErrors``, ``throttle`` (a reason, a list
    of reasons, or true: thermal)."""
    out: list[Signal] = []
    health = e.get("health")
    if health is not None:
        if not isinstance(health, str) or health.lower() not in ("healthy", "unhealthy"):
            problems.append(f"{where}.health must be healthy or unhealthy (got {health!r})")
        elif health.lower() == "unhealthy":
            out.append(Signal(DECLARED_UNHEALTHY, 1, str(e.get("reason") or "")))
    xids = e.get("xid")
    for x in xids if isinstance(xids, list) else ([] if xids is None else [xids]):
        if isinstance(x, bool) or not isinstance(x, int) or x <= 0:
            problems.append(f"{where}.xid must be a positive integer or a list of them (got {xids!r})")
            break
        out.append(Signal(XID, x))
    ecc = e.get("ecc")
    if ecc is not None:
        if isinstance(ecc, Mapping):
            vol = _count(ecc.get("volatile", 0), f"{where}.ecc.volatile", problems)
            agg = _count(ecc.get("aggregate", 0), f"{where}.ecc.aggregate", problems)
        else:
            vol, agg = _count(ecc, f"{where}.ecc", problems), 0
        if vol:
            out.append(Signal(ECC_VOLATILE, vol))
        if agg:
            out.append(Signal(ECC_AGGREGATE, agg))
    if e.get("remappedRowsFailed") is not None and _count(e["remappedRowsFailed"], f"{where}.remappedRowsFailed",
                                                        problems):
        out.append(Signal(REMAPPED_ROWS_FAILED, 1))
    if e.get("nvlinkErrors") is not None:
        n = _count(e["nvlinkErrors"], f"{where}.nvlinkErrors", problems)
        if n:
            out.append(Signal(NVLINK_ERRORS, n))
    throttle = e.get("throttle")
    if throttle:
        reasons = ["thermal"] if throttle is True else throttle if isinstance(throttle, list) else [throttle]
        s = throttle_signal(str(r) for r in reasons)
        if s is not None:
            out.append(s)
    return tuple(out)


def _memory_from_model(model: str) -> int | None:
    m = re.search(r"(\d+)\s*GB", model, flags=re.IGNORECASE)
    return int(m.group(1)) * 1024 if m else None


class DeclaredDevices:
    """GPUs that exist only because they are declared: a machine without GPUs standing in
    for a GPU server, or one of a thousand simulated nodes.

    UUIDs are derived from the node name and index, so they are stable across restarts and
    unique across a simulated fleet. Utilization is whatever the agent says through
    ``set_busy``; health can be flipped with ``set_health`` to rehearse failures.

    Without explicit groups every GPU shares one NVLink domain, as on an 8-GPU HGX board;
    ``group_size`` splits them into domains of that size. A group named "pcie-..." is a
    PCIe-only domain (no NVLink peers)."""

    name = "declared"

    def __init__(
        self,
        count: int,
        model: str,
        memory_mib: int | None = None,
        groups: Sequence[str] | None = None,
        *,
        group_size: int | None = None,
        node_name: str = "",
    ) -> None:
        problems: list[str] = []
        if count < 0:
            problems.append(f"count must be >= 0, got {count}")
        label = normalize_model(model)
        if memory_mib is None:
            memory_mib = _memory_from_model(label)
            if memory_mib is None and count > 0:
                problems.append(f"memoryMiB is required: it cannot be read from the model name {model!r} "
                                "(name the memory in the model, as in H100-SXM-80GB, or give it: "
                                "--gpu-memory MiB, or memoryMiB in an inventory)")
        if groups is not None and len(groups) != count:
            problems.append(f"groups has {len(groups)} entries for {count} GPUs")
        if group_size is not None and group_size <= 0:
            problems.append(f"groupSize must be > 0, got {group_size}")
        if problems:
            raise ValueError("; ".join(problems))
        if groups is None:
            size = group_size or max(count, 1)
            groups = [f"nvlink-{(i // size) * size}" for i in range(count)]
        self._init([_Declared(label, memory_mib or 0, g) for g in groups], node_name)

    def _init(self, entries: list[_Declared], node_name: str) -> None:
        self.node_name = node_name
        self._entries = entries
        self._busy: dict[int, tuple[float, int | None]] = {}
        self._health: dict[int, str] = {}
        # The inventory file this came from, and its mtime when last read (reload_if_changed).
        self.inventory_path: Path | None = None
        self._mtime: int | None = None
        # Moves whenever what fingerprint() reports may have changed.
        self.generation = 0

    @classmethod
    def from_entries(cls, entries: Sequence[Mapping[str, Any]], node_name: str = "") -> DeclaredDevices:
        """One mapping per GPU: {model, memoryMiB (optional when the model says "80GB"), group}."""
        problems: list[str] = []
        out: list[_Declared] = []
        for i, e in enumerate(entries):
            if not isinstance(e, Mapping):
                problems.append(f"gpus[{i}]: expected a mapping, got {type(e).__name__}")
                continue
            model = e.get("model")
            if not isinstance(model, str) or not model:
                problems.append(f"gpus[{i}].model is required")
                continue
            label = normalize_model(model)
            mem = e.get("memoryMiB")
            if mem is None:
                mem = _memory_from_model(label)
            if not isinstance(mem, int) or isinstance(mem, bool) or mem < 0:
                problems.append(
                    f"gpus[{i}].memoryMiB must be a non-negative integer (got {e.get('memoryMiB')!r})"
                )
                continue
            signals = health_signals_of(e, f"gpus[{i}]", problems)
            out.append(_Declared(label, mem, str(e.get("group") or f"pcie-{i}"), signals))
        if problems:
            raise ValueError("; ".join(problems))
        obj = cls.__new__(cls)
        obj._init(out, node_name)
        return obj

    @classmethod
    def from_file(cls, path: str | Path, node_name: str = "") -> DeclaredDevices:
        """A YAML inventory, either one entry per GPU::

            gpus:
              - {model: H100-80GB-HBM3, memoryMiB: 81920, group: nvlink-0}

        or a homogeneous node::

            count: 8
            model: NVIDIA H100 80GB HBM3
            memoryMiB: 81920
            groupSize: 4
        """
        obj = cls._parse_file(path, node_name)
        obj.inventory_path = Path(path)
        obj._mtime = _mtime(path)
        return obj

    @classmethod
    def _parse_file(cls, path: str | Path, node_name: str) -> DeclaredDevices:
        import yaml

        doc = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(doc, Mapping):
            raise ValueError(f"{path}: expected a mapping at the top level")
        if isinstance(doc.get("gpus"), list):
            return cls.from_entries(doc["gpus"], node_name)
        spec = doc["gpus"] if isinstance(doc.get("gpus"), Mapping) else doc
        problems = []
        count, model = spec.get("count"), spec.get("model")
        if not isinstance(count, int) or isinstance(count, bool):
            problems.append("count must be an integer")
        if not isinstance(model, str) or not model:
            problems.append("model is required")
        mem, size = spec.get("memoryMiB"), spec.get("groupSize")
        if mem is not None and (not isinstance(mem, int) or mem < 0):
            problems.append("memoryMiB must be a non-negative integer")
        if size is not None and (not isinstance(size, int) or size <= 0):
            problems.append("groupSize must be a positive integer")
        if problems:
            raise ValueError(f"{path}: " + "; ".join(problems))
        return cls(count, model, mem, group_size=size, node_name=node_name)

    def _uuid(self, index: int) -> str:
        return "GPU-" + str(uuidlib.uuid5(_DECLARED_NAMESPACE, f"{self.node_name}/{index}"))

    def fingerprint(self) -> list[GPU]:
        members: dict[str, list[int]] = {}
        for i, e in enumerate(self._entries):
            members.setdefault(e.group, []).append(i)
        out = []
        for i, e in enumerate(self._entries):
            nvlink = not e.group.startswith("pcie")
            reason = self._health.get(i)
            out.append(
                GPU(
                    index=i,
                    uuid=self._uuid(i),
                    model=e.model,
                    memory_mib=e.memory_mib,
                    mig_mode=False,
                    nvlink_peers=[p for p in members[e.group] if p != i] if nvlink else [],
                    group=e.group,
                    health=UNHEALTHY if reason is not None else HEALTHY,
                    health_reason=reason or "",
                )
            )
        return out

    def reserve(self, indices: Sequence[int]) -> dict[str, str]:
        return _reserve(self.fingerprint(), indices)

    def reload_if_changed(self) -> bool:
        """Read the inventory file again when its mtime moved; True when it did. A file that
        cannot be read or parsed keeps what was read before (and says why in the log)."""
        if self.inventory_path is None:
            return False
        mtime = _mtime(self.inventory_path)
        if mtime is None or mtime == self._mtime:
            return False
        self._mtime = mtime
        try:
            fresh = self._parse_file(self.inventory_path, self.node_name)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("inventory %s: not reloaded: %s", self.inventory_path, exc)
            return False
        except Exception as exc:  # yaml errors
            log.warning("inventory %s: not reloaded: %s", self.inventory_path, exc)
            return False
        self._entries = fresh._entries
        self.generation += 1
        return True

    def health_signals(self) -> dict[int, list[Signal]]:
        """What the inventory (and set_health) says is wrong with each GPU, re-reading the file
        when it changed."""
        self.reload_if_changed()
        out: dict[int, list[Signal]] = {}
        for i, e in enumerate(self._entries):
            sigs = list(e.signals)
            if i in self._health:
                sigs.append(Signal(DECLARED_UNHEALTHY, 1, self._health[i]))
            out[i] = sigs
        return out

    def set_busy(self, indices: Iterable[int], pct: float, memory_used_mib: int | None = None) -> None:
        """What the simulated GPUs report as utilization (0 frees them again)."""
        for i in indices:
            if 0 <= i < len(self._entries):
                if pct <= 0 and not memory_used_mib:
                    self._busy.pop(i, None)
                else:
                    self._busy[i] = (min(max(pct, 0.0), 100.0), memory_used_mib)

    def set_health(self, index: int, healthy: bool, reason: str = "") -> None:
        self.generation += 1
        if healthy:
            self._health.pop(index, None)
        else:
            self._health[index] = reason or "declared unhealthy"

    def stats(self) -> dict[int, GPUStats]:
        out = {}
        for i, e in enumerate(self._entries):
            pct, mem = self._busy.get(i, (0.0, None))
            if mem is None:
                # A busy simulated GPU holds most of its memory, as training does.
                mem = int(e.memory_mib * 0.9) if pct > 0 else 0
            out[i] = GPUStats(
                utilization_pct=pct,
                memory_used_mib=min(mem, e.memory_mib),
                memory_total_mib=e.memory_mib,
                temperature_c=30.0 + 0.5 * pct,
                power_w=70.0 + 6.3 * pct,
            )
        return out

    def close(self) -> None:
        pass


def _mtime(path: str | Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
