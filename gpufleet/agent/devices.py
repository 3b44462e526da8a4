"""The node's GPUs behind one small device-plugin interface, shaped like Nomad's:
``fingerprint`` (what devices exist and whether they are healthy), ``reserve`` (devices ->
the environment a container needs to see exactly them) and ``stats`` (utilization).

Three plugins: ``NvmlDevices`` reads real GPUs through NVML, ``DeclaredDevices`` stands in
for GPUs that are only declared (machines without GPUs, simulated fleets), and
``NoDevices``. The rest of the agent cannot tell them apart, so a simulated node publishes,
schedules and reserves GPUs exactly as a real one does.
"""

from __future__ import annotations

import json
import logging
import re
import uuid as uuidlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from gpufleet.agent.runtime.base import GPUAssignment
from gpufleet.agent.runtime.gpuenv import gpu_env
from gpufleet.api.gpu import GPU_COUNT_LABEL, GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


# Stable namespace for the UUIDs of declared GPUs: the same node name and index always
# give the same UUID, across agent restarts and machines.
_DECLARED_NAMESPACE = uuidlib.UUID("8b7f4f3e-6a55-4c43-9d5e-0c1f6d2b9a71")

# XIDs caused by the application (illegal address, page fault in user code...) say nothing
# about the device; the Kubernetes NVIDIA device plugin ignores the same set.
_APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class NoGPUs(Exception):
    """NVML is not usable here (library missing, driver not loaded): fall back."""


@dataclass
class GPU:
    index: int
    uuid: str
    # Label-safe product name, the value of nvidia.com/gpu.product ("H100-80GB-HBM3").
    model: str
    memory_mib: int
    mig_mode: bool | None = None
    nvlink_peers: list[int] = field(default_factory=list)
    # Interconnect domain: GPUs that share a group talk over NVLink ("nvlink-N") or at
    # least share a PCIe switch ("pcie-N"). Unique within the node.
    group: str = ""
    health: Literal["Healthy", "Unhealthy"] = HEALTHY
    health_reason: str = ""
    pci_bus_id: str | None = None

    @property
    def healthy(self) -> bool:
        return self.health == HEALTHY


@dataclass(frozen=True)
class GPUStats:
    utilization_pct: float
    memory_used_mib: int
    memory_total_mib: int
    temperature_c: float | None = None
    power_w: float | None = None


class DevicePlugin(Protocol):
    name: str

    def fingerprint(self) -> list[GPU]:
        """Every GPU of the node, healthy or not, ordered by index."""

    def reserve(self, indices: Sequence[int]) -> dict[str, str]:
        """The environment that hands a container exactly these GPUs. Raises ValueError for
        an index the node does not have."""

    def stats(self) -> dict[int, GPUStats]:
        """Per-GPU utilization; a GPU that cannot be read is left out."""

    def close(self) -> None: ...


def normalize_model(name: str) -> str:
    """NVML's product name as a label value: "NVIDIA H100 80GB HBM3" -> "H100-80GB-HBM3".

    The vendor prefix is dropped because every device here is NVIDIA's and selectors read
    better without it; anything a label value cannot hold becomes a dash."""
    s = re.sub(r"^\s*NVIDIA[\s_-]+", "", name, flags=re.IGNORECASE)
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", s)
    s = re.sub(r"-{2,}", "-", s).strip("-._")
    return s[:63].rstrip("-._") or "unknown"


def _reserve(gpus: Sequence[GPU], indices: Sequence[int]) -> dict[str, str]:
    by_index = {g.index: g for g in gpus}
    missing = [i for i in indices if i not in by_index]
    if missing:
        raise ValueError(f"no GPU with index {', '.join(map(str, missing))} on this node")
    return gpu_env([GPUAssignment(i, by_index[i].uuid) for i in indices])


# --- groups ---------------------------------------------------------------------------


def interconnect_groups(
    indices: Sequence[int],
    nvlink_edges: Iterable[tuple[int, int]],
    pcie_edges: Iterable[tuple[int, int]] = (),
) -> dict[int, str]:
    """Each GPU's interconnect domain: GPUs joined by NVLink (directly or through NVSwitch)
    form "nvlink-<lowest index>"; the rest are grouped by shared PCIe switch into
    "pcie-<lowest index>", a GPU alone being its own group."""
    parent = {i: i for i in indices}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    nvlinked: set[int] = set()
    for a, b in nvlink_edges:
        if a in parent and b in parent and a != b:
            union(a, b)
            nvlinked.update((a, b))
    for a, b in pcie_edges:
        # NVLink already names the domain; PCIe only groups what NVLink left alone.
        if a in parent and b in parent and a not in nvlinked and b not in nvlinked:
            union(a, b)
    return {i: (f"nvlink-{find(i)}" if i in nvlinked else f"pcie-{find(i)}") for i in indices}


# --- NVML -----------------------------------------------------------------------------


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _bus_key(bus_id: Any) -> str:
    """PCI bus ids come as "00000000:18:00.0" or "0000:18:00.0", in either case: compare
    them as (domain, bus, device, function) numbers."""
    s = _text(bus_id).strip().lower()
    m = re.match(r"^(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)$", s)
    if not m:
        return s
    dom, bus, dev, fn = (int(x, 16) for x in (m.group(1) or "0", m.group(2), m.group(3), m.group(4)))
    return f"{dom:08x}:{bus:02x}:{dev:02x}.{fn:x}"


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as e:
        raise NoGPUs(f"nvidia-ml-py is not installed ({e}); install gpufleet[gpu]") from e
    return pynvml


class NvmlDevices:
    """Real GPUs through NVML (the nvidia-ml-py package, imported only when used).

    Calls are synchronous and take milliseconds; an agent on an event loop runs them in a
    thread. Fingerprints are cached per index so a GPU that falls off the bus keeps its
    UUID and model and is reported Unhealthy instead of disappearing."""

    name = "nvml"

    def __init__(self) -> None:
        nv = _import_pynvml()
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise NoGPUs(f"NVML is not usable: {e}") from e
        self._nv = nv
        self._known: dict[int, GPU] = {}
        self._xid_unhealthy: dict[str, str] = {}
        self._events: Any = None
        try:
            self._count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            nv.nvmlShutdown()
            raise NoGPUs(f"NVML cannot count devices: {e}") from e
        self._register_xid_events()

    def _register_xid_events(self) -> None:
        nv = self._nv
        try:
            self._events = nv.nvmlEventSetCreate()
        except (nv.NVMLError, AttributeError):
            self._events = None
            return
        for i in range(self._count):
            try:
                nv.nvmlDeviceRegisterEvents(
                    nv.nvmlDeviceGetHandleByIndex(i), nv.nvmlEventTypeXidCriticalError, self._events
                )
            except nv.NVMLError:
                # Not every board or driver supports XID events; handle errors remain.
                pass

    def _drain_xid_events(self) -> None:
        nv = self._nv
        if self._events is None:
            return
        for _ in range(1024):
            try:
                data = nv.nvmlEventSetWait(self._events, 0)
            except nv.NVMLError:
                return  # Timeout: nothing pending (or events unsupported).
            xid = int(getattr(data, "eventData", 0))
            if xid in _APPLICATION_XIDS:
                continue
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(data.device))
            except nv.NVMLError:
                continue
            self._xid_unhealthy[uuid] = f"XID {xid}"

    def fingerprint(self) -> list[GPU]:
        nv = self._nv
        self._drain_xid_events()
        handles: dict[int, Any] = {}
        gpus: dict[int, GPU] = {}
        for i in range(self._count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                gpu = GPU(
                    index=i,
                    uuid=_text(nv.nvmlDeviceGetUUID(h)),
                    model=normalize_model(_text(nv.nvmlDeviceGetName(h))),
                    memory_mib=int(nv.nvmlDeviceGetMemoryInfo(h).total) // (1 << 20),
                    mig_mode=self._mig_mode(h),
                    pci_bus_id=self._bus_id(h),
                )
            except nv.NVMLError as e:
                prev = self._known.get(i)
                gpus[i] = GPU(
                    index=i,
                    uuid=prev.uuid if prev else f"unknown-{i}",
                    model=prev.model if prev else "unknown",
                    memory_mib=prev.memory_mib if prev else 0,
                    mig_mode=prev.mig_mode if prev else None,
                    pci_bus_id=prev.pci_bus_id if prev else None,
                    health=UNHEALTHY,
                    health_reason=f"NVML: {e}",
                )
                continue
            if gpu.uuid in self._xid_unhealthy:
                gpu.health, gpu.health_reason = UNHEALTHY, self._xid_unhealthy[gpu.uuid]
            handles[i] = h
            gpus[i] = gpu

        by_bus = {g.pci_bus_id: g.index for g in gpus.values() if g.pci_bus_id}
        nvlink_edges: list[tuple[int, int]] = []
        on_switch: list[int] = []
        for i, h in handles.items():
            peers, switch = self._nvlink(h, by_bus)
            nvlink_edges += [(i, p) for p in peers]
            if switch:
                on_switch.append(i)
        # NVSwitch connects every GPU attached to it: all of them are NVLink peers.
        nvlink_edges += [(a, b) for a in on_switch for b in on_switch if a < b]
        pcie_edges = self._pcie_edges(handles)

        groups = interconnect_groups(sorted(gpus), nvlink_edges, pcie_edges)
        peers_of: dict[int, set[int]] = {i: set() for i in gpus}
        for a, b in nvlink_edges:
            if a != b and a in peers_of and b in peers_of:
                peers_of[a].add(b)
                peers_of[b].add(a)
        for i, g in gpus.items():
            g.group = groups[i]
            g.nvlink_peers = sorted(peers_of[i])
            if i in handles:
                self._known[i] = g
        return [gpus[i] for i in sorted(gpus)]

    def _mig_mode(self, h: Any) -> bool | None:
        nv = self._nv
        try:
            current = nv.nvmlDeviceGetMigMode(h)[0]
        except nv.NVMLError:
            return None
        return current == nv.NVML_DEVICE_MIG_ENABLE

    def _bus_id(self, h: Any) -> str | None:
        nv = self._nv
        try:
            return _bus_key(nv.nvmlDeviceGetPciInfo(h).busId)
        except nv.NVMLError:
            return None

    def _nvlink(self, h: Any, by_bus: Mapping[str, int]) -> tuple[set[int], bool]:
        """The GPUs this one reaches over an active NVLink, and whether a link ends in a
        switch rather than a GPU."""
        nv = self._nv
        peers: set[int] = set()
        switch = False
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                active = nv.nvmlDeviceGetNvLinkState(h, link)
            except nv.NVMLError:
                if link == 0:
                    break  # No NVLink on this board.
                continue
            if active != nv.NVML_FEATURE_ENABLED:
                continue
            try:
                remote = _bus_key(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
            except nv.NVMLError:
                continue
            if remote in by_bus:
                peers.add(by_bus[remote])
            else:
                switch = True
        return peers, switch

    def _pcie_edges(self, handles: Mapping[int, Any]) -> list[tuple[int, int]]:
        nv = self._nv
        limit = getattr(nv, "NVML_TOPOLOGY_MULTIPLE", 20)
        edges = []
        idx = sorted(handles)
        for n, a in enumerate(idx):
            for b in idx[n + 1 :]:
                try:
                    level = nv.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
                except nv.NVMLError:
                    continue
                if level <= limit:
                    edges.append((a, b))
        return edges

    def reserve(self, indices: Sequence[int]) -> dict[str, str]:
        if any(i not in self._known for i in indices):
            self.fingerprint()
        return _reserve(list(self._known.values()), indices)

    def stats(self) -> dict[int, GPUStats]:
        nv = self._nv
        out: dict[int, GPUStats] = {}
        for i in range(self._count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
            except nv.NVMLError:
                continue
            try:
                temp: float | None = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
            except nv.NVMLError:
                temp = None
            try:
                power: float | None = nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # milliwatts
            except nv.NVMLError:
                power = None
            out[i] = GPUStats(
                utilization_pct=float(util.gpu),
                memory_used_mib=int(mem.used) // (1 << 20),
                memory_total_mib=int(mem.total) // (1 << 20),
                temperature_c=temp,
                power_w=power,
            )
        return out

    def close(self) -> None:
        nv = self._nv
        try:
            if self._events is not None:
                nv.nvmlEventSetFree(self._events)
        except (nv.NVMLError, AttributeError):
            pass
        self._events = None
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass


# --- declared -------------------------------------------------------------------------


@dataclass
class _Declared:
    model: str
    memory_mib: int
    group: str


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
                problems.append(f"memoryMiB is required: it cannot be read from the model name {model!r}")
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
            out.append(_Declared(label, mem, str(e.get("group") or f"pcie-{i}")))
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

    def set_busy(self, indices: Iterable[int], pct: float, memory_used_mib: int | None = None) -> None:
        """What the simulated GPUs report as utilization (0 frees them again)."""
        for i in indices:
            if 0 <= i < len(self._entries):
                if pct <= 0 and not memory_used_mib:
                    self._busy.pop(i, None)
                else:
                    self._busy[i] = (min(max(pct, 0.0), 100.0), memory_used_mib)

    def set_health(self, index: int, healthy: bool, reason: str = "") -> None:
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


class NoDevices:
    name = "none"

    def fingerprint(self) -> list[GPU]:
        return []

    def reserve(self, indices: Sequence[int]) -> dict[str, str]:
        return _reserve([], indices)

    def stats(self) -> dict[int, GPUStats]:
        return {}

    def close(self) -> None:
        pass


def discover(node_name: str, declared: DeclaredDevices | None = None) -> DevicePlugin:
    """An explicit declaration wins; then NVML; then no GPUs."""
    if declared is not None:
        if not declared.node_name:
            declared.node_name = node_name
        return declared
    try:
        return NvmlDevices()
    except NoGPUs as e:
        log.info("no GPUs on %s: %s", node_name, e)
        return NoDevices()


# --- what the node publishes ----------------------------------------------------------


def node_gpu_annotation(gpus: Sequence[GPU]) -> str:
    """The value of the Node annotation gpufleet.io/gpus, which the scheduler reads."""
    out = []
    for g in sorted(gpus, key=lambda g: g.index):
        d: dict[str, Any] = {
            "index": g.index,
            "uuid": g.uuid,
            "model": g.model,
            "memoryMiB": g.memory_mib,
            "health": g.health,
            "group": g.group,
        }
        if g.nvlink_peers:
            d["nvlinkPeers"] = list(g.nvlink_peers)
        if g.health_reason:
            d["reason"] = g.health_reason
        out.append(d)
    return json.dumps(out, separators=(",", ":"))


def parse_node_gpu_annotation(value: str) -> list[dict[str, Any]]:
    return json.loads(value) if value else []


def node_gpu_labels(gpus: Sequence[GPU]) -> dict[str, str]:
    """nvidia.com/gpu.* labels as GPU feature discovery sets them. A node with mixed models
    is labelled with its most common one."""
    if not gpus:
        return {}
    model = Counter(g.model for g in gpus).most_common(1)[0][0]
    memory = min(g.memory_mib for g in gpus if g.model == model)
    return {GPU_PRODUCT_LABEL: model, GPU_MEMORY_LABEL: str(memory), GPU_COUNT_LABEL: str(len(gpus))}
