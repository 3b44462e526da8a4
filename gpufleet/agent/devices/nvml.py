"""Real GPUs through NVML: inventory, interconnects (NVLink, PCIe), XID health events, and
utilization."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.agent.devices.plugin import (
    GPU,
    UNHEALTHY,
    GPUStats,
    NoGPUs,
    _reserve,
    interconnect_groups,
    normalize_model,
)
from gpufleet.api.gpuhealth import Signal

log = logging.getLogger(__name__)

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
        # XIDs read from the event set since the last health poll, by GPU UUID.
        self._pending_xids: dict[str, list[int]] = {}
        self._nvlink_baseline: dict[str, int] = {}
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
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(data.device))
            except nv.NVMLError:
                continue
            # What an XID means is the health policy's to say (api/gpuhealth.py).
            self._pending_xids.setdefault(uuid, []).append(xid)

    def health_signals(self) -> dict[int, list[Signal]]:
        """One health poll (see nvmlhealth.py): XID events since the last one, ECC and row
        remapping counters, NVLink errors, throttle reasons, lost GPUs."""
        from gpufleet.agent.devices.nvmlhealth import poll_health

        self._drain_xid_events()
        pending, self._pending_xids = self._pending_xids, {}
        return poll_health(self._nv, self._count, pending, self._nvlink_baseline)

    def fingerprint(self) -> list[GPU]:
        nv = self._nv
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
