"""Building an agent's runtime and device plugin from command-line choices, shared by
`gpufleet agent` and the agent `gpufleet up` runs for the local machine."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from gpufleet.utils.clock import REAL_CLOCK, Clock

RUNTIMES = ("process", "podman", "simulated")
DEFAULT_GPU_MODEL = "NVIDIA H100 80GB HBM3"


def build_runtime(kind: str, state_dir: Path, clock: Clock = REAL_CLOCK) -> Any:
    if kind == "process":
        from gpufleet.agent.runtime.process import ProcessRuntime

        return ProcessRuntime(state_dir, clock)
    if kind == "simulated":
        module = importlib.import_module("gpufleet.agent.runtime.simulated")
        return module.SimulatedRuntime(clock)
    if kind == "podman":
        module = importlib.import_module("gpufleet.agent.runtime.podman")
        return module.PodmanRuntime(state_dir)
    raise ValueError(f"unknown runtime {kind!r}: choose one of {', '.join(RUNTIMES)}")


def build_devices(node_name: str, *, gpus: int | None = None, gpu_model: str | None = None,
                  gpu_memory_mib: int | None = None, inventory: Path | None = None) -> Any:
    """Declared GPUs when asked for (a count, or an inventory file), else what NVML finds,
    else none."""
    from gpufleet.agent import devices

    if inventory is not None:
        return devices.DeclaredDevices.from_file(inventory, node_name)
    if gpus is not None:
        return devices.DeclaredDevices(gpus, gpu_model or DEFAULT_GPU_MODEL, gpu_memory_mib, node_name=node_name)
    return devices.discover(node_name, None)
