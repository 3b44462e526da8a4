"""A scheduler profile: which plugins run, their score weights and arguments, and how many
nodes a cycle looks at. The shape follows kube-scheduler's KubeSchedulerProfile, reduced to
what this scheduler implements."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_SCHEDULER_NAME = "default-scheduler"

MOST_ALLOCATED = "MostAllocated"
LEAST_ALLOCATED = "LeastAllocated"
SCORING_STRATEGIES = (MOST_ALLOCATED, LEAST_ALLOCATED)

# Order matters twice: filters run in this order and a node is rejected by the first that
# fails, so cheap, label-like checks come before resource arithmetic (the same order as
# kube-scheduler's defaults); and the reason a user reads is the first failing plugin's.
DEFAULT_PLUGINS: tuple[str, ...] = (
    "PrioritySort",
    "SchedulingGates",
    "NodeUnschedulable",
    "NodeName",
    "TaintToleration",
    "NodeAffinity",
    "GPUMemory",
    "NodeResourcesFit",
    "GPUTopology",
    "VolumeBinding",
    "DefaultSpread",
    "DefaultPreemption",
    "DefaultBinder",
)

# kube-scheduler's default weights for the plugins both have; GPUTopology counts as much
# as node affinity: a job split across NVLink domains loses more than a spread preference.
# DefaultSpread must outweigh bin-packing (NodeResourcesFit's MostAllocated plus
# GPUTopology's tight fit, 1 + 2 = 3 full ranges together) or replicas still stack on one
# node; kube-scheduler gets away with 2 because its default scoring already spreads. It
# only scores owned replicas, so everything else bin-packs as before.
DEFAULT_WEIGHTS: dict[str, int] = {
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "NodeResourcesFit": 1,
    "GPUTopology": 2,
    "DefaultSpread": 4,
}


@dataclass
class Profile:
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    # Other schedulerNames whose pods this profile places: Volcano's ("volcano"), so that a
    # Volcano user's pods and Jobs run unchanged (their gangs are Volcano PodGroups).
    also_answers_to: tuple[str, ...] = ("volcano",)
    plugins: list[str] = field(default_factory=lambda: list(DEFAULT_PLUGINS))
    weights: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    plugin_args: dict[str, dict[str, Any]] = field(default_factory=dict)
    # MostAllocated (bin-pack) keeps whole nodes free for the 8-GPU jobs that need them;
    # LeastAllocated spreads. NodeResourcesFit's own scoringStrategy argument overrides it.
    scoring_strategy: str = MOST_ALLOCATED
    # 0 = adaptive, as kube-scheduler: 50% of the nodes at 100 nodes, falling by 1% per 125
    # nodes (10% at 5,000), never under 5% (from 5,625 nodes on), and never fewer than
    # min_feasible_nodes_to_find.
    percentage_of_nodes_to_score: int = 0
    min_feasible_nodes_to_find: int = 100

    def __post_init__(self) -> None:
        if self.scoring_strategy not in SCORING_STRATEGIES:
            raise ValueError(
                f"scoring_strategy must be one of {', '.join(SCORING_STRATEGIES)}, not {self.scoring_strategy!r}"
            )
        if not 0 <= self.percentage_of_nodes_to_score <= 100:
            raise ValueError("percentage_of_nodes_to_score must be between 0 (adaptive) and 100")
        if self.min_feasible_nodes_to_find < 1:
            raise ValueError("min_feasible_nodes_to_find must be at least 1")
        for name, weight in self.weights.items():
            if weight < 0:
                raise ValueError(f"weight of {name} must not be negative")

    def args_for(self, plugin: str) -> dict[str, Any]:
        args = dict(self.plugin_args.get(plugin) or {})
        if plugin == "NodeResourcesFit":
            strategy = dict(args.get("scoringStrategy") or {})
            strategy.setdefault("type", self.scoring_strategy)
            args["scoringStrategy"] = strategy
        return args

    def weight_of(self, plugin: str) -> int:
        return self.weights.get(plugin, 1)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        """A profile from configuration written like a KubeSchedulerProfile:

        ``schedulerName``, ``percentageOfNodesToScore``, ``scoringStrategy``,
        ``plugins: {enabled: [{name, weight}], disabled: [{name}]}`` (changes to the
        defaults; ``disabled: [{name: "*"}]`` starts from none) and
        ``pluginConfig: [{name, args}]``.
        """
        profile = cls()
        if "schedulerName" in data:
            profile.scheduler_name = str(data["schedulerName"])
        if "percentageOfNodesToScore" in data:
            profile.percentage_of_nodes_to_score = int(data["percentageOfNodesToScore"])
        if "scoringStrategy" in data:
            profile.scoring_strategy = str(data["scoringStrategy"])
        plugins = data.get("plugins") or {}
        disabled = {str(p["name"]) for p in plugins.get("disabled") or ()}
        names = [] if "*" in disabled else [p for p in profile.plugins if p not in disabled]
        for entry in plugins.get("enabled") or ():
            name = str(entry["name"])
            if name not in names:
                names.append(name)
            if "weight" in entry:
                profile.weights[name] = int(entry["weight"])
        profile.plugins = names
        for entry in data.get("pluginConfig") or ():
            profile.plugin_args[str(entry["name"])] = dict(entry.get("args") or {})
        profile.__post_init__()
        return profile


def num_feasible_nodes_to_find(num_all_nodes: int, percentage: int = 0, minimum: int = 100) -> int:
    """How many feasible nodes a cycle looks for before it stops filtering and scores them.

    Scoring every node of a large cluster buys little placement quality for a lot of time;
    kube-scheduler stops after a share of the nodes that shrinks as the cluster grows.
    """
    if num_all_nodes < minimum or percentage >= 100:
        return num_all_nodes
    if percentage <= 0:
        percentage = max(5, 50 - num_all_nodes // 125)
    return max(num_all_nodes * percentage // 100, minimum)
