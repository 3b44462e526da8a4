"""The node's GPUs behind one small device-plugin interface, shaped like Nomad's:
``fingerprint`` (what devices exist and whether they are healthy), ``reserve`` (devices ->
the environment a container needs to see exactly them) and ``stats`` (utilization).

Three plugins: ``NvmlDevices`` reads real GPUs through NVML, ``DeclaredDevices`` stands in
for GPUs that are only declared (machines without GPUs, simulated fleets), and
``NoDevices``. The rest of the agent cannot tell them apart, so a simulated node publishes,
schedules and reserves GPUs exactly as a real one does.

plugin.py holds the interface and what every plugin shares; nvml.py and declared.py the
two plugins.
"""

from __future__ import annotations

import logging

from gpufleet.agent.devices.declared import DeclaredDevices
from gpufleet.agent.devices.nvml import NvmlDevices
from gpufleet.agent.devices.plugin import (
    GPU,
    HEALTHY,
    UNHEALTHY,
    DevicePlugin,
    GPUStats,
    NoDevices,
    NoGPUs,
    interconnect_groups,
    node_gpu_annotation,
    node_gpu_labels,
    normalize_model,
    parse_node_gpu_annotation,
)

__all__ = [
    "GPU", "HEALTHY", "UNHEALTHY", "DeclaredDevices", "DevicePlugin", "GPUStats", "NoDevices", "NoGPUs",
    "NvmlDevices", "discover", "interconnect_groups", "node_gpu_annotation", "node_gpu_labels",
    "normalize_model", "parse_node_gpu_annotation",
]

log = logging.getLogger(__name__)


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
