"""The in-tree plugins, one module each, registered by name."""

from __future__ import annotations

from gpufleet.scheduler.framework import Registry
from gpufleet.scheduler.plugins.defaultbinder import DefaultBinder
from gpufleet.scheduler.plugins.defaultspread import DefaultSpread
from gpufleet.scheduler.plugins.gpumemory import GPUMemory
from gpufleet.scheduler.plugins.gputopology import GPUTopology
from gpufleet.scheduler.plugins.nodeaffinity import NodeAffinity
from gpufleet.scheduler.plugins.nodename import NodeName
from gpufleet.scheduler.plugins.noderesources import NodeResourcesFit
from gpufleet.scheduler.plugins.nodeunschedulable import NodeUnschedulable
from gpufleet.scheduler.plugins.queuesort import PrioritySort
from gpufleet.scheduler.plugins.schedulinggates import SchedulingGates
from gpufleet.scheduler.plugins.tainttoleration import TaintToleration
from gpufleet.scheduler.plugins.volumebinding import VolumeBinding
from gpufleet.scheduler.preemption import DefaultPreemption

_IN_TREE = (
    PrioritySort,
    SchedulingGates,
    NodeUnschedulable,
    NodeName,
    TaintToleration,
    NodeAffinity,
    GPUMemory,
    NodeResourcesFit,
    GPUTopology,
    VolumeBinding,
    DefaultSpread,
    DefaultPreemption,
    DefaultBinder,
)


def in_tree_registry() -> Registry:
    """name -> factory(args, handle) for every in-tree plugin; a fresh dict the caller may
    extend with out-of-tree plugins."""
    return {cls.name: cls for cls in _IN_TREE}


__all__ = [
    "DefaultBinder",
    "DefaultPreemption",
    "DefaultSpread",
    "GPUMemory",
    "GPUTopology",
    "NodeAffinity",
    "NodeName",
    "NodeResourcesFit",
    "NodeUnschedulable",
    "PrioritySort",
    "SchedulingGates",
    "TaintToleration",
    "VolumeBinding",
    "in_tree_registry",
]
