"""The environment that hands a container its GPUs, shared by the device plugins (which
reserve) and the runtimes (which apply it)."""

from __future__ import annotations

from collections.abc import Sequence

from gpufleet.agent.runtime.base import GPUAssignment

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# The CDI names of the reserved GPUs (podman's --device nvidia.com/gpu=UUID), so tools in
# or around the container can tell which devices were injected.
CDI_DEVICES = "GPUFLEET_CDI_DEVICES"


def cdi_device(uuid: str) -> str:
    return f"nvidia.com/gpu={uuid}"


def gpu_env(gpus: Sequence[GPUAssignment]) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES as host indices ("0,1"), NVIDIA_VISIBLE_DEVICES as UUIDs.

    A container without GPUs still gets both, empty and "void": a host process inherits
    nothing that would let CUDA see every GPU of the server."""
    if not gpus:
        return {CUDA_VISIBLE_DEVICES: "", NVIDIA_VISIBLE_DEVICES: "void"}
    return {
        CUDA_VISIBLE_DEVICES: ",".join(str(g.index) for g in gpus),
        NVIDIA_VISIBLE_DEVICES: ",".join(g.uuid for g in gpus),
        CDI_DEVICES: ",".join(cdi_device(g.uuid) for g in gpus),
    }
