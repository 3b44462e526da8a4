"""One NVML health poll: the signals (api/gpuhealth.py) each GPU shows now.

Read per GPU, each call on its own (a board or driver that lacks one still reports the rest):
uncorrected ECC errors, volatile and aggregate (nvmlDeviceGetTotalEccErrors); row remapping
(nvmlDeviceGetRemappedRows: failure, pending) and, on older boards, page retirement pending
(nvmlDeviceGetRetiredPagesPendingStatus); NVLink error counters summed over the links
(replay, recovery, CRC; nvmlDeviceGetNvLinkErrorCounter); clock throttle reasons (thermal and
hardware slowdown); and a GPU NVML calls lost (NVML_ERROR_GPU_IS_LOST). XIDs come from the
event set the plugin drains (nvmlEventSetWait) and are passed in by UUID.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.api.gpuhealth import (
    ECC_AGGREGATE,
    ECC_VOLATILE,
    GPU_LOST,
    NVLINK_ERRORS,
    REMAPPED_ROWS_FAILED,
    REMAPPED_ROWS_PENDING,
    RETIRED_PAGES_PENDING,
    XID,
    Signal,
    throttle_signal,
)

# nvml.h's values, for a pynvml that lacks a name.
_GPU_IS_LOST = 15
_THROTTLE_BITS = {
    "sw-thermal": ("nvmlClocksThrottleReasonSwThermalSlowdown", 0x20),
    "hw-thermal": ("nvmlClocksThrottleReasonHwThermalSlowdown", 0x40),
    "hw-slowdown": ("nvmlClocksThrottleReasonHwSlowdown", 0x08),
    "hw-power-brake": ("nvmlClocksThrottleReasonHwPowerBrakeSlowdown", 0x80),
}
_NVLINK_COUNTERS = ("NVML_NVLINK_ERROR_DL_REPLAY", "NVML_NVLINK_ERROR_DL_RECOVERY",
                    "NVML_NVLINK_ERROR_DL_CRC_FLIT", "NVML_NVLINK_ERROR_DL_CRC_DATA")


def _lost(nv: Any, exc: BaseException) -> bool:
    code = getattr(nv, "NVML_ERROR_GPU_IS_LOST", _GPU_IS_LOST)
    lost_cls = getattr(nv, "NVMLError_GpuIsLost", None)
    return getattr(exc, "value", None) == code or (lost_cls is not None and isinstance(exc, lost_cls))


def poll_health(nv: Any, count: int, xids_by_uuid: Mapping[str, Sequence[int]],
                nvlink_baseline: dict[str, int] | None = None) -> dict[int, list[Signal]]:
    """``nvlink_baseline``: each GPU's NVLink error total at its first poll, by UUID (filled in
    here): the counters only grow, so errors count from when the agent started watching,
    and a board that collected a few replays a month is not drained for its age."""
    out: dict[int, list[Signal]] = {}
    baseline = nvlink_baseline if nvlink_baseline is not None else {}
    for i in range(count):
        sigs: list[Signal] = []
        out[i] = sigs
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
            uuid = nv.nvmlDeviceGetUUID(h)
        except nv.NVMLError as exc:
            if _lost(nv, exc):
                sigs.append(Signal(GPU_LOST, 1, str(exc)))
            continue
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        sigs += [Signal(XID, int(x)) for x in xids_by_uuid.get(uuid, ())]
        try:
            sigs += _ecc(nv, h) + _remapping(nv, h) + _nvlink(nv, h, uuid, baseline) + _throttle(nv, h)
        except nv.NVMLError as exc:
            if _lost(nv, exc):
                sigs.append(Signal(GPU_LOST, 1, str(exc)))
    return out


def _call(nv: Any, name: str, *args: Any) -> Any:
    """The NVML call's answer; None when this pynvml, board or driver lacks it. A lost GPU
    raises, for the caller to report."""
    fn = getattr(nv, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nv.NVMLError as exc:
        if _lost(nv, exc):
            raise
        return None


def _ecc(nv: Any, h: Any) -> list[Signal]:
    unc = getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    out = []
    vol = _call(nv, "nvmlDeviceGetTotalEccErrors", h, unc, getattr(nv, "NVML_VOLATILE_ECC", 0))
    agg = _call(nv, "nvmlDeviceGetTotalEccErrors", h, unc, getattr(nv, "NVML_AGGREGATE_ECC", 1))
    if vol:
        out.append(Signal(ECC_VOLATILE, int(vol)))
    if agg:
        out.append(Signal(ECC_AGGREGATE, int(agg)))
    return out


def _remapping(nv: Any, h: Any) -> list[Signal]:
    rows = _call(nv, "nvmlDeviceGetRemappedRows", h)
    out = []
    if rows is not None:
        # (correctable rows, uncorrectable rows, remapping pending, remapping failed)
        _corr, _unc, pending, failed = rows
        if failed:
            out.append(Signal(REMAPPED_ROWS_FAILED, 1))
        if pending:
            out.append(Signal(REMAPPED_ROWS_PENDING, 1))
        return out
    pending = _call(nv, "nvmlDeviceGetRetiredPagesPendingStatus", h)
    if pending == getattr(nv, "NVML_FEATURE_ENABLED", 1):
        out.append(Signal(RETIRED_PAGES_PENDING, 1))
    return out


def _nvlink(nv: Any, h: Any, uuid: str, baseline: dict[str, int]) -> list[Signal]:
    counters = [getattr(nv, n) for n in _NVLINK_COUNTERS if hasattr(nv, n)]
    if not counters or not hasattr(nv, "nvmlDeviceGetNvLinkErrorCounter"):
        return []
    total = 0
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        state = _call(nv, "nvmlDeviceGetNvLinkState", h, link)
        if state is None and link == 0:
            break  # no NVLink on this board
        if state != getattr(nv, "NVML_FEATURE_ENABLED", 1):
            continue
        for c in counters:
            total += int(_call(nv, "nvmlDeviceGetNvLinkErrorCounter", h, link, c) or 0)
    grown = total - baseline.setdefault(uuid, total)
    return [Signal(NVLINK_ERRORS, grown)] if grown > 0 else []


def _throttle(nv: Any, h: Any) -> list[Signal]:
    mask = _call(nv, "nvmlDeviceGetCurrentClocksEventReasons", h)
    if mask is None:
        mask = _call(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
    if not mask:
        return []
    words = [w for w, (name, bit) in _THROTTLE_BITS.items() if int(mask) & int(getattr(nv, name, bit))]
    s = throttle_signal(words)
    return [s] if s is not None else []
