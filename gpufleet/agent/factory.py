"""Building an agent's runtime and device plugin from command-line choices, shared by
`gpufleet agent` and the agent `gpufleet up` runs for the local machine."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from gpufleet.utils.clock import REAL_CLOCK, Clock

RUNTIMES = ("auto", "podman", "process", "simulated")
DEFAULT_GPU_MODEL = "NVIDIA H100 80GB HBM3"


def podman_usable(podman: str = "podman") -> bool:
    """Whether podman can run this agent's containers: installed, answering, and rootful
    (pods get an IP of their own on the node's bridge, which rootless podman cannot give)."""
    import os
    import shutil
    import subprocess

    if shutil.which(podman) is None or os.geteuid() != 0:
        return False
    try:
        proc = subprocess.run([podman, "info", "--format", "{{.Host.OCIRuntime.Name}}"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def resolve_runtime(kind: str) -> str:
    if kind == "auto":
        return "podman" if podman_usable() else "process"
    return kind


def build_runtime(kind: str, state_dir: Path, clock: Clock = REAL_CLOCK, *, hidden_paths: list[str] | None = None,
                  shared_paths: list[str] | None = None, address: str | None = None) -> Any:
    """``hidden_paths``: host paths the process runtime's sandboxes show empty (the control
    plane's state, the agent user's ~/.gpufleet and kubeconfigs are always among them);
    ``shared_paths``: host paths they show read-write (scratch and home filesystems)."""
    kind = resolve_runtime(kind)
    if kind == "process":
        from gpufleet.agent.runtime.process import ProcessRuntime

        hidden = [str(Path(p).expanduser()) for p in ["~/.gpufleet", "~/.kube", *(hidden_paths or [])]]
        return ProcessRuntime(state_dir, clock, hidden_paths=hidden, shared_paths=shared_paths or [],
                              node_address=address)
    if kind == "simulated":
        module = importlib.import_module("gpufleet.agent.runtime.simulated")
        return module.SimulatedRuntime(clock)
    if kind == "podman":
        module = importlib.import_module("gpufleet.agent.runtime.podman")
        return module.PodmanRuntime(state_dir)
    raise ValueError(f"unknown runtime {kind!r}: choose one of {', '.join(RUNTIMES)}")


def check_declared(gpus: int | None, gpu_model: str | None, gpu_memory_mib: int | None = None) -> None:
    """Raises ValueError, before anything starts, for declared GPUs that cannot be made."""
    if gpus is not None:
        from gpufleet.agent import devices

        devices.DeclaredDevices(gpus, gpu_model or DEFAULT_GPU_MODEL, gpu_memory_mib)


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
