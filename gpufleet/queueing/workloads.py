"""What admission reads (ClusterQueues with their quotas, flavors, nodes, workloads with their
pod sets) and what it answers (a Wait, a Preemption, the CycleResult), with the reason words
the answers use. Plain frozen data, built by controllers/kueue/cycle.py from the API objects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpufleet.api.gpu import GPU_RESOURCE
from gpufleet.api.taints import TaintTuple, TolerationTuple

# Why a workload waits: the first word of its QuotaReserved=False message, and the column
# `get workloads` shows.
WAIT_QUOTA = "Quota"
WAIT_SHAPE = "Shape"
WAIT_PRIORITY = "Priority"
WAIT_PREEMPTING = "Preempting"
WAIT_INADMISSIBLE = "Inadmissible"
WAIT_QUEUED = "Queued"

# Workload Preempted condition reasons (Kueue's).
IN_CLUSTER_QUEUE = "InClusterQueue"
IN_COHORT_RECLAMATION = "InCohortReclamation"
IN_COHORT_RECLAIM_WHILE_BORROWING = "InCohortReclaimWhileBorrowing"

FlavorResource = tuple[str, str]  # (flavor, resource)
Assignment = dict[str, dict[str, str]]  # pod set -> resource -> flavor


# -- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quota:
    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    @property
    def guaranteed(self) -> int:
        """What the queue keeps for itself and never lends."""
        return max(0, self.nominal - self.lending_limit) if self.lending_limit is not None else 0


@dataclass(frozen=True)
class ResourceGroupInfo:
    resources: tuple[str, ...]
    flavors: tuple[str, ...]


@dataclass
class ClusterQueueInfo:
    name: str
    groups: list[ResourceGroupInfo]
    quotas: dict[FlavorResource, Quota]
    cohort: str = ""
    weight: float = 1.0
    strategy: str = "BestEffortFIFO"
    reclaim_within_cohort: str = "Never"
    borrow_within_cohort: str = "Never"
    borrow_max_priority: int | None = None
    within_cluster_queue: str = "Never"
    when_can_borrow: str = "Borrow"
    # The queueing policy (gpufleet.queueing.policies); "" is Kueue's order.
    policy: str = ""
    # attained-service: the levels' thresholds, GPU-seconds (None: policies.LEVELS).
    levels: tuple[float, ...] | None = None
    starvation_factor: float | None = None  # attained-service: the guard's factor (None: the default)
    within_level: str | None = None  # attained-service: the order within a level (None: the default)
    # Why the queue admits nothing (stopped, a flavor missing); empty when active.
    inactive: str = ""

    def group_of(self, resource: str) -> ResourceGroupInfo | None:
        for g in self.groups:
            if resource in g.resources:
                return g
        return None


# (key, operator, value, effect), as Kubernetes' Toleration.
Toleration = TolerationTuple
# (key, value, effect) of a node taint that keeps pods off (NoSchedule, NoExecute).
Taint = TaintTuple


@dataclass(frozen=True)
class FlavorInfo:
    name: str
    node_labels: Mapping[str, str] = field(default_factory=dict)
    # Given to the pods admitted on this flavor, as Kueue does.
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True)
class PodSetInfo:
    name: str
    count: int
    requests: Mapping[str, int]  # per pod
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # The pod's GPUs must come from one interconnect group (NVLink domain) of its node.
    same_gpu_group: bool = False
    tolerations: tuple[Toleration, ...] = ()

    @property
    def gpus(self) -> int:
        return int(self.requests.get(GPU_RESOURCE, 0))


@dataclass(frozen=True)
class Placement:
    """GPUs one bound pod holds on its node, by interconnect group."""

    node: str
    gpus: Mapping[str, int]


@dataclass
class WorkloadInfo:
    key: str
    cluster_queue: str
    pod_sets: list[PodSetInfo]
    priority: int = 0
    # Queue order: creation, or the time it was last evicted (it goes back in line).
    timestamp: float = 0.0
    # A queueing policy's order among workloads of one priority, before the timestamp (lower
    # first; set by admission.ranked, 0 without a policy).
    order: float = 0.0
    # Set once admitted: pod set -> resource -> flavor.
    admission: Assignment | None = None
    admitted_at: float = 0.0
    # Admitted, told to stop, still holding its quota until its pods are gone.
    evicting: bool = False
    # Its pods bound to nodes and still active.
    placed: list[Placement] = field(default_factory=list)
    # Admitted: how many pods of each pod set are not bound yet.
    unbound: dict[str, int] = field(default_factory=dict)
    # Set when it cannot even be considered (its LocalQueue is missing, say).
    problem: str = ""
    # Evicting: the workload it makes room for, when known.
    preempted_by: str = ""
    # For the queueing policies: GPU-seconds held in runs that are over, the steps the job
    # declares and what is known of its progress (a policies.Progress).
    attained: float = 0.0
    total_steps: int | None = None
    progress: object | None = None

    @property
    def gpus(self) -> int:
        return sum(ps.gpus * ps.count for ps in self.pod_sets)


@dataclass
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    capacity: dict[str, int]  # interconnect group -> GPUs
    used: dict[str, int] = field(default_factory=dict)  # by bound, active pods
    taints: tuple[Taint, ...] = ()

    def free(self) -> dict[str, int]:
        return {g: max(0, n - self.used.get(g, 0)) for g, n in self.capacity.items()}


# -- outputs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wait:
    kind: str
    message: str


@dataclass(frozen=True)
class Preemption:
    preemptor: str
    reason: str
    message: str


@dataclass
class CycleResult:
    admitted: dict[str, Assignment] = field(default_factory=dict)
    borrowing: set[str] = field(default_factory=set)
    preempted: dict[str, Preemption] = field(default_factory=dict)
    waiting: dict[str, Wait] = field(default_factory=dict)
    # Seconds until time alone can change a decision (a queueing policy's ranks); None: never.
    requeue_after: float | None = None
