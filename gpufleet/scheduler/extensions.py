"""The framework's extension points, and the cluster events a plugin may say requeue a pod
it rejected.

A plugin implements only the extension points it needs; each is a ``typing.Protocol``
below. Contracts:
- Filter and Score must not change the NodeInfo they are given (it belongs to the cycle's
  snapshot and is shared by every plugin), except to remember results in its ``memo``
  under a key that captures everything else the result depends on.
- A rejection is an expected answer (UNSCHEDULABLE, or UNSCHEDULABLE_AND_UNRESOLVABLE when
  evicting pods from the node would not help either); ERROR means a bug or a broken input
  and aborts the cycle.
- Reasons are short and node-independent ("Insufficient nvidia.com/gpu") because the
  FitError message counts nodes per reason; what is particular to one node ("requested 4,
  free 2") goes in ``Status.detail``.
- Unreserve must be idempotent: it runs for every Reserve plugin when any later step fails,
  including plugins whose Reserve never ran for this pod.
- A status may be shared (the ``OK`` constant, or a rejection a plugin keeps on a node):
  the framework only ever sets its ``plugin``, always to the plugin that returned it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot
from gpufleet.scheduler.status import CycleState, Status

if TYPE_CHECKING:
    from gpufleet.scheduler.queue import QueuedPodInfo


@runtime_checkable
class Plugin(Protocol):
    name: str


@runtime_checkable
class QueueSortPlugin(Plugin, Protocol):
    def less(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
        """True when ``a`` should be tried before ``b``."""


@runtime_checkable
class PreEnqueuePlugin(Plugin, Protocol):
    def pre_enqueue(self, pod_info: PodInfo) -> Status:
        """Anything but success keeps the pod out of the active queue until it changes."""


@runtime_checkable
class PreFilterPlugin(Plugin, Protocol):
    def pre_filter(self, state: CycleState, pod_info: PodInfo, snapshot: Snapshot) -> Status:
        """Once per cycle before Filter: precompute into ``state``; SKIP when this plugin's
        Filter has nothing to check for the pod; a rejection rejects every node."""


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status:
        """Can the pod run on this node? Must not change ``node_info``.

        A plugin may also offer ``filter_nodes(state, pod_info, nodes) -> list``: exactly
        the nodes ``filter`` accepts, in order. The framework prefers it (one call per batch
        of nodes instead of one per node) and asks ``filter`` for the reasons only when no
        node fits at all — or ``filter_statuses(state, pod_info, nodes) -> list[Status]``,
        the same as ``filter`` on each node, if the plugin has it."""


@runtime_checkable
class PostFilterPlugin(Plugin, Protocol):
    def post_filter(
        self, state: CycleState, pod_info: PodInfo, snapshot: Snapshot, node_statuses: Mapping[str, Status]
    ) -> tuple[str | None, Status]:
        """Only when no node fits (preemption): a node to nominate, or a status whose
        message joins the FitError message."""


@runtime_checkable
class PreScorePlugin(Plugin, Protocol):
    def pre_score(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Status:
        """Once per cycle before Score; SKIP when this plugin's Score would rank all equal."""


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> int:
        """A rank from MIN_NODE_SCORE to MAX_NODE_SCORE (after normalization, if the plugin
        has ``normalize_score(state, pod_info, scores)`` changing the list in place).

        Optional, for speed: ``score_nodes(state, pod_info, nodes) -> list[int]``, which the
        framework prefers (one call per cycle instead of one per node); and
        ``score_key(state, pod_info) -> hashable``, a plugin's promise that its score is a
        function of the node and that key only, which lets the framework keep a node's
        weighted total until the node changes."""


@runtime_checkable
class ReservePlugin(Plugin, Protocol):
    def reserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status: ...

    def unreserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> None:
        """Undo reserve; must be idempotent and must tolerate a reserve that never ran."""


@runtime_checkable
class PermitPlugin(Plugin, Protocol):
    def permit(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status:
        """SUCCESS, a rejection, or WAIT with ``timeout`` (seconds) until someone calls
        ``allow``/``reject`` on the framework's WaitingPod (gang scheduling)."""


@runtime_checkable
class PreBindPlugin(Plugin, Protocol):
    async def pre_bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status: ...


@runtime_checkable
class BindPlugin(Plugin, Protocol):
    async def bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status:
        """SKIP hands the pod to the next bind plugin."""


@runtime_checkable
class PostBindPlugin(Plugin, Protocol):
    def post_bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> None: ...


@runtime_checkable
class EnqueueExtensions(Protocol):
    def events_to_register(self) -> set[str]:
        """Cluster events (the constants below) after which a pod this plugin rejected may
        fit; other events leave it waiting. A plugin without this method is woken by all."""


# Cluster events that may make an unschedulable pod schedulable.
NODE_ADD = "Node/Add"
NODE_DELETE = "Node/Delete"
NODE_ALLOCATABLE = "Node/UpdateAllocatable"
NODE_LABEL = "Node/UpdateLabel"
NODE_TAINT = "Node/UpdateTaint"
NODE_ANNOTATION = "Node/UpdateAnnotation"
POD_DELETE = "AssignedPod/Delete"
POD_UPDATE = "AssignedPod/Update"
PVC_ADD = "PersistentVolumeClaim/Add"
PVC_UPDATE = "PersistentVolumeClaim/Update"
PV_ADD = "PersistentVolume/Add"
PV_UPDATE = "PersistentVolume/Update"
STORAGE_CLASS_ADD = "StorageClass/Add"
UNSCHEDULABLE_TIMEOUT = "UnschedulableTimeout"
ALL_EVENTS = frozenset(
    {NODE_ADD, NODE_DELETE, NODE_ALLOCATABLE, NODE_LABEL, NODE_TAINT, NODE_ANNOTATION, POD_DELETE, POD_UPDATE,
     PVC_ADD, PVC_UPDATE, PV_ADD, PV_UPDATE, STORAGE_CLASS_ADD}
)


# -- results ----------------------------------------------------------------------------
