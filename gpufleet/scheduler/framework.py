"""The scheduling framework: extension points, the Status they answer with, and the
Framework that runs a profile's plugins over a Snapshot.

One cycle for one pod: PreFilter -> Filter (batches of nodes, until enough feasible nodes
are found) -> PostFilter (only when no node fits) -> PreScore -> Score (+ NormalizeScore,
times the plugin's weight) -> select the best node -> Reserve. The scheduler then assumes
the pod in its cache, runs Permit, and binds asynchronously: PreBind -> Bind -> PostBind.
Everything up to Reserve is a pure function of the pod and the snapshot; only the binding
plugins talk to the API.

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

import asyncio
import contextlib
import enum
import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpufleet.scheduler.profile import Profile, num_feasible_nodes_to_find
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot
from gpufleet.utils.clock import REAL_CLOCK, Clock

if TYPE_CHECKING:
    from gpufleet.scheduler.queue import QueuedPodInfo

log = logging.getLogger(__name__)

MAX_NODE_SCORE = 100
MIN_NODE_SCORE = 0

# CycleState key under which a Reserve plugin leaves the GPU indices it chose.
GPU_INDICES_KEY = "gpufleet.io/gpu-indices"


class Code(enum.IntEnum):
    # SUCCESS is 0 so the hot path can test ``if status.code:``.
    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    UNSCHEDULABLE_AND_UNRESOLVABLE = 3
    WAIT = 4
    SKIP = 5


class Status:
    __slots__ = ("code", "reasons", "plugin", "_detail", "timeout", "error")

    def __init__(
        self,
        code: Code = Code.SUCCESS,
        reasons: Iterable[str] = (),
        plugin: str = "",
        *,
        detail: str | Callable[[], str] = "",
        timeout: float | None = None,
        error: BaseException | None = None,
    ) -> None:
        self.code = code
        self.reasons = list(reasons)
        self.plugin = plugin
        # What is particular to this node, for the per-node breakdown. A callable is
        # rendered only when read: most rejections of a successful cycle are never shown.
        self._detail = detail
        # Seconds a WAIT from Permit may last.
        self.timeout = timeout
        # The exception behind an ERROR (the scheduler decides on it whether to retry).
        self.error = error

    @classmethod
    def unschedulable(cls, *reasons: str, detail: str | Callable[[], str] = "", plugin: str = "") -> Status:
        return cls(Code.UNSCHEDULABLE, reasons, plugin, detail=detail)

    @classmethod
    def unresolvable(cls, *reasons: str, detail: str | Callable[[], str] = "", plugin: str = "") -> Status:
        return cls(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reasons, plugin, detail=detail)

    @property
    def detail(self) -> str:
        if callable(self._detail):
            self._detail = self._detail()
        return self._detail

    @classmethod
    def from_error(cls, error: BaseException, plugin: str = "") -> Status:
        return cls(Code.ERROR, [str(error) or type(error).__name__], plugin, error=error)

    @classmethod
    def wait(cls, timeout: float, plugin: str = "") -> Status:
        return cls(Code.WAIT, (), plugin, timeout=timeout)

    @property
    def is_success(self) -> bool:
        return self.code is Code.SUCCESS

    @property
    def is_skip(self) -> bool:
        return self.code is Code.SKIP

    @property
    def is_rejected(self) -> bool:
        return self.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)

    @property
    def message(self) -> str:
        return ", ".join(self.reasons)

    def describe(self) -> str:
        """The per-node text: the detail when the plugin gave one, else the reasons."""
        return self.detail or self.message

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Status):
            return NotImplemented
        return (self.code, self.reasons, self.plugin, self.detail) == (
            other.code,
            other.reasons,
            other.plugin,
            other.detail,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = [self.code.name]
        if self.plugin:
            parts.append(f"plugin={self.plugin!r}")
        if self.reasons:
            parts.append(f"reasons={self.reasons!r}")
        if self.detail:
            parts.append(f"detail={self.detail!r}")
        return f"Status({', '.join(parts)})"


OK = Status()
SKIP = Status(Code.SKIP)


class CycleState:
    """Scratch space of one scheduling cycle, shared by the plugins of that cycle (and by the
    binding steps of the same pod). Keys are plugin-chosen strings."""

    __slots__ = ("_data", "skip_filter", "skip_score")

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}
        # Plugins whose PreFilter/PreScore said SKIP: nothing to check for this pod.
        self.skip_filter: set[str] = set()
        self.skip_score: set[str] = set()

    def read(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def write(self, key: str, value: Any) -> None:
        self._data[key] = value

    def delete(self, key: str) -> None:
        self._data.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def clone(self) -> CycleState:
        other = CycleState()
        other._data = dict(self._data)
        other.skip_filter = set(self.skip_filter)
        other.skip_score = set(self.skip_score)
        return other


# -- extension points -------------------------------------------------------------------


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


class ScheduleResult:
    """Where the pod goes and which GPUs it gets. ``scores`` (weighted total per scored node,
    empty when only one node was feasible) is built on first access: most callers never
    look at it, and a dict of a few hundred nodes per cycle is measurable."""

    __slots__ = ("node", "gpu_indices", "evaluated_nodes", "feasible_nodes", "state", "_scored", "_scores")

    def __init__(
        self,
        node: str,
        gpu_indices: tuple[int, ...] = (),
        scores: dict[str, int] | None = None,
        evaluated_nodes: int = 0,
        feasible_nodes: int = 0,
        state: CycleState | None = None,
        *,
        scored: tuple[list[NodeInfo], list[int]] | None = None,
    ) -> None:
        self.node = node
        self.gpu_indices = gpu_indices
        self.evaluated_nodes = evaluated_nodes
        self.feasible_nodes = feasible_nodes
        self.state = state if state is not None else CycleState()
        self._scored = scored
        self._scores = scores

    @property
    def scores(self) -> dict[str, int]:
        if self._scores is None:
            if self._scored is None:
                self._scores = {}
            else:
                nodes, totals = self._scored
                self._scores = {n.name: total for n, total in zip(nodes, totals, strict=True)}
        return self._scores

    def __repr__(self) -> str:
        return (
            f"ScheduleResult(node={self.node!r}, gpu_indices={self.gpu_indices}, "
            f"evaluated_nodes={self.evaluated_nodes}, feasible_nodes={self.feasible_nodes})"
        )


@dataclass
class Diagnosis:
    node_statuses: dict[str, Status] = field(default_factory=dict)
    pre_filter_msg: str = ""
    post_filter_msg: str = ""
    unschedulable_plugins: set[str] = field(default_factory=set)
    # Where a PostFilter plugin (preemption) made room for the pod, to try there first.
    nominated_node: str | None = None


class FitError(Exception):
    """No node can take the pod. ``str()`` is kube-scheduler's message, e.g.
    "0/3 nodes are available: 1 node(s) had untolerated taint {gpu: broken}, 2 Insufficient
    nvidia.com/gpu." (counts per reason, sorted as strings, like Kubernetes)."""

    def __init__(self, pod_info: PodInfo, num_all_nodes: int, diagnosis: Diagnosis) -> None:
        super().__init__(pod_info.key, num_all_nodes)
        self.pod_info = pod_info
        self.num_all_nodes = num_all_nodes
        self.diagnosis = diagnosis
        self._message: str | None = None

    @property
    def message(self) -> str:
        # Rendered on first use: counting the reasons of thousands of nodes is wasted on
        # a caller that only needs to know the pod did not fit.
        if self._message is None:
            self._message = self._render()
        return self._message

    def _render(self) -> str:
        if self.num_all_nodes == 0 and not self.diagnosis.pre_filter_msg:
            return "no nodes available to schedule pods"
        text = f"0/{self.num_all_nodes} nodes are available:"
        if self.diagnosis.pre_filter_msg:
            text += f" {self.diagnosis.pre_filter_msg}."
        else:
            counts = Counter(r for status in self.diagnosis.node_statuses.values() for r in status.reasons)
            histogram = sorted(f"{count} {reason}" for reason, count in counts.items())
            if histogram:
                text += f" {', '.join(histogram)}."
        if self.diagnosis.post_filter_msg:
            text += f" {self.diagnosis.post_filter_msg}."
        return text

    def node_breakdown(self, limit: int | None = None) -> list[str]:
        """One line per rejected node, in name order, such as
        'node-a: Insufficient nvidia.com/gpu (requested 4, free 2)'; with a limit, a last
        line says how many were left out."""
        items = sorted(self.diagnosis.node_statuses.items())
        lines = [f"{name}: {status.describe()}" for name, status in items[: limit if limit else None]]
        if limit and len(items) > limit:
            lines.append(f"... and {len(items) - limit} more node(s)")
        return lines

    def __str__(self) -> str:
        return self.message


class SchedulingError(Exception):
    """A plugin answered ERROR: the cycle is aborted and the pod retried after a back-off."""

    def __init__(self, status: Status) -> None:
        self.status = status
        super().__init__(f"{status.plugin or 'framework'}: {status.message}")


# -- plugin construction ----------------------------------------------------------------


@dataclass
class FrameworkHandle:
    """What plugins may use besides their arguments. ``client`` is None in pure use (tests,
    benchmarks): binding plugins then have nothing to do."""

    client: Any = None
    clock: Clock = REAL_CLOCK
    framework: Framework | None = None
    # The snapshot of the cycle in progress, for plugins that get a node by name (Reserve).
    snapshot: Snapshot | None = None
    # Pod (uid or key) -> the node preemption nominated it for, while its victims leave.
    nominated_nodes: dict[str, str] = field(default_factory=dict)
    # Pods ('namespace/name') preemption is deleting, not yet seen terminating.
    pending_victims: set[str] = field(default_factory=set)
    # The claims, volumes and classes as they are now (a volumes.StorageTracker), for the
    # binding steps that wait on them; cycles read the snapshot's copy instead.
    volumes: Any = None


PluginFactory = Callable[[Mapping[str, Any], FrameworkHandle], Any]
Registry = dict[str, PluginFactory]


class WaitingPod:
    """A pod that a Permit plugin holds back (gang scheduling): it binds once every waiting
    plugin allowed it, and is rejected at the first reject or when the shortest timeout ends."""

    def __init__(self, pod_info: PodInfo, node_name: str, timeouts: Mapping[str, float]) -> None:
        self.pod_info = pod_info
        self.node_name = node_name
        self.pending: dict[str, float] = dict(timeouts)
        self._result: Status | None = None
        self._future: asyncio.Future[Status] | None = None

    @property
    def decided(self) -> bool:
        return self._result is not None

    def allow(self, plugin: str) -> None:
        self.pending.pop(plugin, None)
        if not self.pending:
            self._decide(OK)

    def reject(self, plugin: str, message: str) -> None:
        self._decide(Status(Code.UNSCHEDULABLE, [message], plugin))

    def _decide(self, status: Status) -> None:
        if self._result is not None:
            return
        self._result = status
        if self._future is not None and not self._future.done():
            self._future.set_result(status)

    async def wait(self, clock: Clock) -> Status:
        if self._result is not None:
            return self._result
        self._future = asyncio.get_running_loop().create_future()
        plugin, timeout = min(self.pending.items(), key=lambda kv: kv[1])
        # Sleep on the injected clock so gang timeouts follow virtual time in replays.
        sleeper = asyncio.ensure_future(clock.sleep(timeout))
        try:
            await asyncio.wait({self._future, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not sleeper.done():
                sleeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sleeper
        if self._result is None:
            self.reject(plugin, f"rejected due to timeout after waiting {timeout:g}s at plugin {plugin}")
        assert self._result is not None
        return self._result


def _has(plugin: Any, protocol: type) -> bool:
    return isinstance(plugin, protocol)


class _MemoToken:
    __slots__ = ()


def _split_memoizable(
    active: list[tuple[Any, int]], state: CycleState, pod_info: PodInfo
) -> tuple[tuple | None, list[tuple[Any, int]]]:
    """The key under which the weighted total of the scorers that say what their score
    depends on (and normalize nothing across nodes) may be memoized per node, and the
    scorers that cannot, whose scores are computed fresh every cycle."""
    parts = []
    fresh = []
    for p, weight in active:
        score_key = getattr(p, "score_key", None)
        key = None
        if score_key is not None and getattr(p, "normalize_score", None) is None:
            key = score_key(state, pod_info)
        if key is None:
            fresh.append((p, weight))
        else:
            parts.append((p.name, weight, key))
    if not parts:
        return None, fresh
    return ("total", *parts), fresh


# CycleState key: this cycle must not run PostFilter.
_NO_POST_FILTER_KEY = "framework/no-post-filter"

# Fewest nodes filtered in one batch (when only a few more feasible nodes are wanted).
_MIN_BATCH = 32


class Framework:
    """A profile's plugins, instantiated and sorted by extension point."""

    def __init__(
        self,
        profile: Profile | None = None,
        *,
        registry: Registry | None = None,
        handle: FrameworkHandle | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if registry is None:
            from gpufleet.scheduler.plugins import in_tree_registry

            registry = in_tree_registry()
        self.profile = profile or Profile()
        self.handle = handle or FrameworkHandle()
        self.handle.framework = self
        self.rng = rng or random.Random()
        self.plugins: dict[str, Any] = {}
        for name in self.profile.plugins:
            factory = registry.get(name)
            if factory is None:
                raise ValueError(
                    f"unknown scheduler plugin {name!r}: known are {', '.join(sorted(registry))}"
                )
            plugin = factory(self.profile.args_for(name), self.handle)
            if getattr(plugin, "name", None) != name:
                raise ValueError(
                    f"plugin registered as {name!r} calls itself {getattr(plugin, 'name', None)!r}"
                )
            self.plugins[name] = plugin
        plugins = list(self.plugins.values())
        sorters = [p for p in plugins if _has(p, QueueSortPlugin)]
        if len(sorters) != 1:
            raise ValueError(
                f"a profile needs exactly one queue sort plugin, has {[p.name for p in sorters]}"
            )
        self.queue_sort: QueueSortPlugin = sorters[0]
        self.pre_enqueue = [p for p in plugins if _has(p, PreEnqueuePlugin)]
        self.pre_filter = [p for p in plugins if _has(p, PreFilterPlugin)]
        self.filters = [p for p in plugins if _has(p, FilterPlugin)]
        self.post_filter = [p for p in plugins if _has(p, PostFilterPlugin)]
        self.pre_score = [p for p in plugins if _has(p, PreScorePlugin)]
        self.scorers = [
            (p, self.profile.weight_of(p.name))
            for p in plugins
            if _has(p, ScorePlugin) and self.profile.weight_of(p.name) > 0
        ]
        self.reserve = [p for p in plugins if _has(p, ReservePlugin)]
        self.permit = [p for p in plugins if _has(p, PermitPlugin)]
        self.pre_bind = [p for p in plugins if _has(p, PreBindPlugin)]
        self.binders = [p for p in plugins if _has(p, BindPlugin)]
        self.post_bind = [p for p in plugins if _has(p, PostBindPlugin)]
        self._next_start_index = 0
        self._total_keys: dict[tuple, _MemoToken] = {}
        self.waiting_pods: dict[str, WaitingPod] = {}

    # -- queue ---------------------------------------------------------------------------

    def less(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
        return self.queue_sort.less(a, b)

    def run_pre_enqueue(self, pod_info: PodInfo) -> Status:
        for p in self.pre_enqueue:
            status = p.pre_enqueue(pod_info)
            if not status.is_success:
                status.plugin = p.name
                return status
        return OK

    def plugins_for_event(self, event: str) -> set[str]:
        """Names of the plugins whose rejections this cluster event may lift."""
        out = set()
        for name, plugin in self.plugins.items():
            register = getattr(plugin, "events_to_register", None)
            if register is None or event in register():
                out.add(name)
        return out

    # -- the scheduling cycle -------------------------------------------------------------

    def schedule(
        self,
        pod_info: PodInfo,
        snapshot: Snapshot,
        state: CycleState | None = None,
        *,
        post_filter: bool = True,
    ) -> ScheduleResult | FitError:
        """Find a node for the pod and reserve it there. Returns the result, or the FitError
        saying why no node fits; raises SchedulingError when a plugin fails. With
        ``post_filter`` False a pod that fits nowhere does not run PostFilter (preemption):
        a gang asks for it once for all its members."""
        state = state if state is not None else CycleState()
        if not post_filter:
            state.write(_NO_POST_FILTER_KEY, True)
        self.handle.snapshot = snapshot
        num_nodes = len(snapshot)
        diagnosis = Diagnosis()

        for p in self.pre_filter:
            status = p.pre_filter(state, pod_info, snapshot)
            code = status.code
            if not code:
                continue
            if code is Code.SKIP:
                state.skip_filter.add(p.name)
                continue
            status.plugin = p.name
            if code is Code.ERROR:
                raise SchedulingError(status)
            diagnosis.pre_filter_msg = status.message
            diagnosis.unschedulable_plugins.add(p.name)
            diagnosis.node_statuses = {n.name: status for n in snapshot.node_infos}
            return self._fit_error(state, pod_info, snapshot, diagnosis)

        if num_nodes == 0:
            return FitError(pod_info, 0, diagnosis)

        feasible, evaluated = self._find_feasible(state, pod_info, snapshot, diagnosis)
        if not feasible:
            return self._fit_error(state, pod_info, snapshot, diagnosis)

        scored = None
        if len(feasible) == 1:
            chosen = feasible[0].name
        else:
            totals = self._score(state, pod_info, feasible)
            best = max(totals)
            if totals.count(best) == 1:
                chosen = feasible[totals.index(best)].name
            else:
                ties = [i for i, total in enumerate(totals) if total == best]
                chosen = feasible[self.rng.choice(ties)].name
            scored = (feasible, totals)

        status = self.run_reserve(state, pod_info, chosen)
        if not status.is_success:
            self.run_unreserve(state, pod_info, chosen)
            if status.code is Code.ERROR:
                raise SchedulingError(status)
            diagnosis.node_statuses = {chosen: status}
            diagnosis.unschedulable_plugins.add(status.plugin)
            return FitError(pod_info, num_nodes, diagnosis)
        return ScheduleResult(
            node=chosen,
            gpu_indices=tuple(state.read(GPU_INDICES_KEY, ())),
            evaluated_nodes=evaluated,
            feasible_nodes=len(feasible),
            state=state,
            scored=scored,
        )

    def _fit_error(
        self, state: CycleState, pod_info: PodInfo, snapshot: Snapshot, diagnosis: Diagnosis
    ) -> FitError:
        if state.read(_NO_POST_FILTER_KEY):
            return FitError(pod_info, len(snapshot), diagnosis)
        for p in self.post_filter:
            nominated, status = p.post_filter(state, pod_info, snapshot, diagnosis.node_statuses)
            if status.code is Code.ERROR:
                status.plugin = p.name
                raise SchedulingError(status)
            if status.is_success and nominated:
                diagnosis.nominated_node = nominated
                break
            if status.message:
                diagnosis.post_filter_msg = status.message
        return FitError(pod_info, len(snapshot), diagnosis)

    def run_pre_filter(self, state: CycleState, pod_info: PodInfo, snapshot: Snapshot) -> Status:
        """The PreFilter plugins alone (SKIPs recorded in ``state``): OK, or the first
        rejection or error."""
        self.handle.snapshot = snapshot
        for p in self.pre_filter:
            status = p.pre_filter(state, pod_info, snapshot)
            code = status.code
            if not code:
                continue
            if code is Code.SKIP:
                state.skip_filter.add(p.name)
                continue
            status.plugin = p.name
            return status
        return OK

    def feasible_nodes(self, pod_info: PodInfo, snapshot: Snapshot) -> list[NodeInfo]:
        """Every node of the snapshot the pod passes all filters on (no early stop): what a
        gang's placement plan is made from."""
        state = CycleState()
        if not self.run_pre_filter(state, pod_info, snapshot).is_success:
            return []
        nodes = snapshot.node_infos
        for p in self.filters:
            if p.name in state.skip_filter:
                continue
            batch = getattr(p, "filter_nodes", None)
            if batch is not None:
                nodes = batch(state, pod_info, nodes)
            else:
                nodes = [n for n in nodes if p.filter(state, pod_info, n).code in (Code.SUCCESS, Code.SKIP)]
            if not nodes:
                break
        return list(nodes)

    def schedule_ordered(
        self, pod_info: PodInfo, snapshot: Snapshot, order: Iterable[str], *, post_filter: bool = False
    ) -> ScheduleResult | FitError:
        """The first node of ``order`` the pod passes every filter on, reserved (first fit
        along a plan, as a gang fills its nodes one after the other); a normal cycle over
        all nodes when none of them does."""
        state = CycleState()
        if self.run_pre_filter(state, pod_info, snapshot).is_success:
            tried = 0
            for name in order:
                node_info = snapshot.get(name)
                if node_info is None:
                    continue
                tried += 1
                if not self.run_filters(state, pod_info, node_info).is_success:
                    continue
                status = self.run_reserve(state, pod_info, name)
                if status.is_success:
                    return ScheduleResult(
                        node=name,
                        gpu_indices=tuple(state.read(GPU_INDICES_KEY, ())),
                        evaluated_nodes=tried,
                        feasible_nodes=1,
                        state=state,
                    )
                self.run_unreserve(state, pod_info, name)
        return self.schedule(pod_info, snapshot, post_filter=post_filter)

    def _find_feasible(
        self, state: CycleState, pod_info: PodInfo, snapshot: Snapshot, diagnosis: Diagnosis
    ) -> tuple[list[NodeInfo], int]:
        nodes = snapshot.node_infos
        num_nodes = len(nodes)
        profile = self.profile
        want = num_feasible_nodes_to_find(
            num_nodes, profile.percentage_of_nodes_to_score, profile.min_feasible_nodes_to_find
        )
        skip = state.skip_filter
        filters = [(p, getattr(p, "filter_nodes", None)) for p in self.filters if p.name not in skip]
        # Batch filters say only which nodes pass. Why the others did not matters only if
        # no node fits, so it is worked out then, from what each batch filter dropped.
        dropped: list[tuple[Any, list[NodeInfo], list[NodeInfo]]] = []
        # Walk the nodes from where the previous cycle stopped, so that stopping early does
        # not keep favouring the first nodes of the list; take them in batches sized to
        # what is still missing, so a cycle reads few nodes past the last one it needs.
        start = self._next_start_index % num_nodes
        feasible: list[NodeInfo] = []
        taken = 0
        while taken < num_nodes and len(feasible) < want:
            size = min(max(want - len(feasible), _MIN_BATCH), num_nodes - taken)
            first = (start + taken) % num_nodes
            last = first + size
            batch = nodes[first:last] if last <= num_nodes else nodes[first:] + nodes[: last - num_nodes]
            taken += size
            for plugin, filter_nodes in filters:
                if filter_nodes is not None:
                    passed = filter_nodes(state, pod_info, batch)
                    if len(passed) != len(batch):
                        dropped.append((plugin, batch, passed))
                else:
                    passed = self._filter_one_by_one(plugin, state, pod_info, batch, diagnosis)
                batch = passed
                if not batch:
                    break
            feasible.extend(batch)
        if not feasible:
            for plugin, batch, passed in dropped:
                self._explain(plugin, state, pod_info, batch, passed, diagnosis)
        if len(feasible) > want:
            del feasible[want:]
        self._next_start_index = (start + taken) % num_nodes
        return feasible, taken

    def _filter_one_by_one(
        self, plugin: Any, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo], diagnosis: Diagnosis
    ) -> list[NodeInfo]:
        passed = []
        name = plugin.name
        for node_info in nodes:
            status = plugin.filter(state, pod_info, node_info)
            if status.code and status.code is not Code.SKIP:
                status.plugin = name
                if status.code is Code.ERROR:
                    raise SchedulingError(status)
                diagnosis.node_statuses[node_info.name] = status
                diagnosis.unschedulable_plugins.add(name)
            else:
                passed.append(node_info)
        return passed

    def _explain(
        self,
        plugin: Any,
        state: CycleState,
        pod_info: PodInfo,
        nodes: list[NodeInfo],
        passed: list[NodeInfo],
        diagnosis: Diagnosis,
    ) -> None:
        """Record why ``plugin`` dropped the nodes of ``nodes`` missing from ``passed``."""
        name = plugin.name
        if passed:
            kept = {id(n) for n in passed}
            nodes = [n for n in nodes if id(n) not in kept]
        batch = getattr(plugin, "filter_statuses", None)
        if batch is not None:
            statuses = batch(state, pod_info, nodes)
        else:
            statuses = [plugin.filter(state, pod_info, n) for n in nodes]
        if len(statuses) != len(nodes):
            raise SchedulingError(Status(Code.ERROR, ["filter_statuses answered for other nodes"], name))
        for node_info, status in zip(nodes, statuses, strict=True):
            if not status.code or status.code is Code.SKIP or status.code is Code.ERROR:
                if status.code is not Code.ERROR:
                    status = Status(
                        Code.ERROR, [f"filter_nodes dropped node {node_info.name} that filter accepts"]
                    )
                status.plugin = name
                raise SchedulingError(status)
        # Answers kept on nodes from earlier cycles already carry the plugin's name.
        for status in [s for s in statuses if s.plugin != name]:
            status.plugin = name
        diagnosis.node_statuses.update(zip([n.name for n in nodes], statuses, strict=True))
        diagnosis.unschedulable_plugins.add(name)

    def run_filters(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status:
        """All filters on one node (for preemption's "what if" checks)."""
        for p in self.filters:
            if p.name in state.skip_filter:
                continue
            status = p.filter(state, pod_info, node_info)
            if status.code and status.code is not Code.SKIP:
                status.plugin = p.name
                return status
        return OK

    def _score(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> list[int]:
        for p in self.pre_score:
            status = p.pre_score(state, pod_info, nodes)
            if status.code is Code.SKIP:
                state.skip_score.add(p.name)
            elif status.code:
                status.plugin = p.name
                raise SchedulingError(status)
        active = [(p, w) for p, w in self.scorers if p.name not in state.skip_score]
        full_key, unkeyed = _split_memoizable(active, state, pod_info)
        if full_key is None:
            return self._weighted_totals(active, state, pod_info, nodes)
        keyed = [(p, w) for p, w in active if (p, w) not in unkeyed] if unkeyed else active
        # Looked up once per node: a token with an identity hash, not the nested tuple
        # (whose hash Python recomputes on every lookup). Tokens live as long as this
        # framework, so no other framework sharing the snapshot can collide with them.
        memo_key = self._total_keys.get(full_key)
        if memo_key is None:
            memo_key = self._total_keys[full_key] = _MemoToken()
        # The keyed scorers rank a node by the node alone (no normalization across nodes)
        # and say what of the pod they read: their weighted total is then a function of
        # the node and that key, kept on the node until it changes. Scorers that rank
        # across nodes (spreading) are added on top, fresh, so they do not cost the rest
        # their memo.
        totals = [n.memo.get(memo_key) for n in nodes]
        missing = [i for i, total in enumerate(totals) if total is None]
        if missing:
            fresh = self._weighted_totals(keyed, state, pod_info, [nodes[i] for i in missing])
            for i, total in zip(missing, fresh, strict=True):
                totals[i] = nodes[i].memo[memo_key] = total
        if unkeyed:
            extra = self._weighted_totals(unkeyed, state, pod_info, nodes)
            return [t + e for t, e in zip(totals, extra, strict=True)]  # type: ignore[operator]
        return totals  # type: ignore[return-value]

    def _weighted_totals(
        self, active: list[tuple[Any, int]], state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> list[int]:
        totals = [0] * len(nodes)
        for p, weight in active:
            batch = getattr(p, "score_nodes", None)
            if batch is not None:
                scores = batch(state, pod_info, nodes)
            else:
                fn = p.score
                scores = [fn(state, pod_info, n) for n in nodes]
            normalize = getattr(p, "normalize_score", None)
            if normalize is not None:
                normalize(state, pod_info, scores)
            if scores and (max(scores) > MAX_NODE_SCORE or min(scores) < MIN_NODE_SCORE):
                raise SchedulingError(
                    Status(Code.ERROR, [f"score outside [{MIN_NODE_SCORE}, {MAX_NODE_SCORE}]"], p.name)
                )
            if weight == 1:
                totals = [t + s for t, s in zip(totals, scores, strict=True)]
            else:
                totals = [t + s * weight for t, s in zip(totals, scores, strict=True)]
        return totals

    # -- reserve and permit -----------------------------------------------------------------

    def run_reserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status:
        for p in self.reserve:
            status = p.reserve(state, pod_info, node_name)
            if not status.is_success:
                status.plugin = p.name
                return status
        return OK

    def run_unreserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> None:
        # Reverse order, like kube-scheduler: the last reservation is undone first.
        for p in reversed(self.reserve):
            try:
                p.unreserve(state, pod_info, node_name)
            except Exception:
                log.exception("unreserve of %s failed in %s", pod_info.key, p.name)

    def run_permit(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status:
        """SUCCESS, a rejection, or WAIT (the pod is then in ``waiting_pods`` until decided)."""
        timeouts: dict[str, float] = {}
        for p in self.permit:
            status = p.permit(state, pod_info, node_name)
            if status.code is Code.WAIT:
                timeouts[p.name] = status.timeout if status.timeout is not None else 0.0
            elif not status.is_success:
                status.plugin = p.name
                return status
        if timeouts:
            self.waiting_pods[pod_info.uid or pod_info.key] = WaitingPod(pod_info, node_name, timeouts)
            return Status(Code.WAIT, (), "", timeout=min(timeouts.values()))
        return OK

    def get_waiting_pod(self, uid_or_key: str) -> WaitingPod | None:
        return self.waiting_pods.get(uid_or_key)

    async def wait_on_permit(self, pod_info: PodInfo) -> Status:
        waiting = self.waiting_pods.get(pod_info.uid or pod_info.key)
        if waiting is None:
            return OK
        try:
            return await waiting.wait(self.handle.clock)
        finally:
            self.waiting_pods.pop(pod_info.uid or pod_info.key, None)

    # -- binding ----------------------------------------------------------------------------

    async def run_pre_bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status:
        for p in self.pre_bind:
            try:
                status = await p.pre_bind(state, pod_info, node_name)
            except Exception as exc:
                status = Status.from_error(exc)
            if not status.is_success:
                status.plugin = p.name
                return status
        return OK

    async def run_bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status:
        for p in self.binders:
            try:
                status = await p.bind(state, pod_info, node_name)
            except Exception as exc:
                status = Status.from_error(exc)
            if status.code is Code.SKIP:
                continue
            if not status.is_success:
                status.plugin = p.name
            return status
        return Status(Code.ERROR, ["no bind plugin bound the pod"])

    def run_post_bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> None:
        for p in self.post_bind:
            try:
                p.post_bind(state, pod_info, node_name)
            except Exception:
                log.exception("post-bind of %s failed in %s", pod_info.key, p.name)
