"""The scheduling framework: extension points, the Status they answer with, and the
Framework that runs a profile's plugins over a Snapshot.

One cycle for one pod: PreFilter -> Filter (per node, until enough feasible nodes are
found) -> PostFilter (only when no node fits) -> PreScore -> Score (+ NormalizeScore,
times the plugin's weight) -> select the best node -> Reserve. The scheduler then assumes
the pod in its cache, runs Permit, and binds asynchronously: PreBind -> Bind -> PostBind.
Everything up to Reserve is a pure function of the pod and the snapshot; only the binding
plugins talk to the API.

A plugin implements only the extension points it needs; each is a ``typing.Protocol``
below. Contracts:
- Filter and Score must not change the NodeInfo they are given (it belongs to the cycle's
  snapshot and is shared by every plugin).
- A rejection is an expected answer (UNSCHEDULABLE, or UNSCHEDULABLE_AND_UNRESOLVABLE when
  evicting pods from the node would not help either); ERROR means a bug or a broken input
  and aborts the cycle.
- Reasons are short and node-independent ("Insufficient nvidia.com/gpu") because the
  FitError message counts nodes per reason; what is particular to one node ("requested 4,
  free 2") goes in ``Status.detail``.
- Unreserve must be idempotent: it runs for every Reserve plugin when any later step fails,
  including plugins whose Reserve never ran for this pod.
- A success status may be a shared constant (``OK``): never modify a returned status.
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
    __slots__ = ("code", "reasons", "plugin", "detail", "timeout", "error")

    def __init__(
        self,
        code: Code = Code.SUCCESS,
        reasons: Iterable[str] = (),
        plugin: str = "",
        *,
        detail: str = "",
        timeout: float | None = None,
        error: BaseException | None = None,
    ) -> None:
        self.code = code
        self.reasons = list(reasons)
        self.plugin = plugin
        # What is particular to this node, for the per-node breakdown.
        self.detail = detail
        # Seconds a WAIT from Permit may last.
        self.timeout = timeout
        # The exception behind an ERROR (the scheduler decides on it whether to retry).
        self.error = error

    @classmethod
    def unschedulable(cls, *reasons: str, detail: str = "", plugin: str = "") -> Status:
        return cls(Code.UNSCHEDULABLE, reasons, plugin, detail=detail)

    @classmethod
    def unresolvable(cls, *reasons: str, detail: str = "", plugin: str = "") -> Status:
        return cls(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reasons, plugin, detail=detail)

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
        """Can the pod run on this node? Must not change ``node_info``."""


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
        A plugin may also offer ``score_nodes(state, pod_info, nodes) -> list[int]``, which
        the framework prefers: one call per cycle instead of one per node."""


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
UNSCHEDULABLE_TIMEOUT = "UnschedulableTimeout"
ALL_EVENTS = frozenset(
    {NODE_ADD, NODE_DELETE, NODE_ALLOCATABLE, NODE_LABEL, NODE_TAINT, NODE_ANNOTATION, POD_DELETE, POD_UPDATE}
)


# -- results ----------------------------------------------------------------------------


@dataclass
class ScheduleResult:
    node: str
    gpu_indices: tuple[int, ...] = ()
    # Weighted total per scored node (empty when only one node was feasible).
    scores: dict[str, int] = field(default_factory=dict)
    evaluated_nodes: int = 0
    feasible_nodes: int = 0
    state: CycleState = field(default_factory=CycleState, repr=False, compare=False)


@dataclass
class Diagnosis:
    node_statuses: dict[str, Status] = field(default_factory=dict)
    pre_filter_msg: str = ""
    post_filter_msg: str = ""
    unschedulable_plugins: set[str] = field(default_factory=set)


class FitError(Exception):
    """No node can take the pod. ``str()`` is kube-scheduler's message, e.g.
    "0/3 nodes are available: 1 node(s) had untolerated taint {gpu: broken}, 2 Insufficient
    nvidia.com/gpu." (counts per reason, sorted as strings, like Kubernetes)."""

    def __init__(self, pod_info: PodInfo, num_all_nodes: int, diagnosis: Diagnosis) -> None:
        self.pod_info = pod_info
        self.num_all_nodes = num_all_nodes
        self.diagnosis = diagnosis
        super().__init__(self.message)

    @property
    def message(self) -> str:
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
        """ "node-a: Insufficient nvidia.com/gpu (requested 4, free 2)", one line per rejected
        node in name order; with a limit, a last line says how many were left out."""
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
        self, pod_info: PodInfo, snapshot: Snapshot, state: CycleState | None = None
    ) -> ScheduleResult | FitError:
        """Find a node for the pod and reserve it there. Returns the result, or the FitError
        saying why no node fits; raises SchedulingError when a plugin fails."""
        state = state if state is not None else CycleState()
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

        scores: dict[str, int] = {}
        if len(feasible) == 1:
            chosen = feasible[0].name
        else:
            totals = self._score(state, pod_info, feasible)
            best = max(totals)
            ties = [i for i, total in enumerate(totals) if total == best]
            chosen = feasible[ties[0] if len(ties) == 1 else self.rng.choice(ties)].name
            scores = {n.name: total for n, total in zip(feasible, totals, strict=True)}

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
            scores=scores,
            evaluated_nodes=evaluated,
            feasible_nodes=len(feasible),
            state=state,
        )

    def _fit_error(
        self, state: CycleState, pod_info: PodInfo, snapshot: Snapshot, diagnosis: Diagnosis
    ) -> FitError:
        for p in self.post_filter:
            nominated, status = p.post_filter(state, pod_info, snapshot, diagnosis.node_statuses)
            if status.code is Code.ERROR:
                status.plugin = p.name
                raise SchedulingError(status)
            if status.is_success and nominated:
                break
            if status.message:
                diagnosis.post_filter_msg = status.message
        return FitError(pod_info, len(snapshot), diagnosis)

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
        filters = [(p.name, p.filter) for p in self.filters if p.name not in skip]
        start = self._next_start_index % num_nodes
        # Walk the nodes from where the previous cycle stopped, so that stopping early
        # does not keep favouring the first nodes of the list.
        ordered = nodes[start:] + nodes[:start] if start else nodes
        feasible: list[NodeInfo] = []
        statuses = diagnosis.node_statuses
        evaluated = 0
        for node_info in ordered:
            evaluated += 1
            for name, fn in filters:
                status = fn(state, pod_info, node_info)
                code = status.code
                if code and code is not Code.SKIP:
                    status.plugin = name
                    if code is Code.ERROR:
                        raise SchedulingError(status)
                    statuses[node_info.name] = status
                    diagnosis.unschedulable_plugins.add(name)
                    break
            else:
                feasible.append(node_info)
                if len(feasible) >= want:
                    break
        self._next_start_index = (start + evaluated) % num_nodes
        return feasible, evaluated

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
        totals = [0] * len(nodes)
        for p, weight in self.scorers:
            if p.name in state.skip_score:
                continue
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
