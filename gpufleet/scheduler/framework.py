"""The scheduling framework: extension points, the Status they answer with, and the
Framework that runs a profile's plugins over a Snapshot.

One cycle for one pod: PreFilter -> Filter (batches of nodes, until enough feasible nodes
are found) -> PostFilter (only when no node fits) -> PreScore -> Score (+ NormalizeScore,
times the plugin's weight) -> select the best node -> Reserve. The scheduler then assumes
the pod in its cache, runs Permit, and binds asynchronously: PreBind -> Bind -> PostBind.
Everything up to Reserve is a pure function of the pod and the snapshot; only the binding
plugins talk to the API.

The extension points and their contracts are in extensions.py, Status and CycleState in
status.py, what a cycle gives back in cycle.py; all are re-exported here.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from gpufleet.scheduler.cycle import (
    Diagnosis,
    FitError,
    FrameworkHandle,
    PluginFactory,
    Registry,
    ScheduleResult,
    SchedulingError,
    WaitingPod,
)
from gpufleet.scheduler.extensions import (
    ALL_EVENTS,
    NODE_ADD,
    NODE_ALLOCATABLE,
    NODE_ANNOTATION,
    NODE_DELETE,
    NODE_LABEL,
    NODE_TAINT,
    POD_DELETE,
    POD_UPDATE,
    PV_ADD,
    PV_UPDATE,
    PVC_ADD,
    PVC_UPDATE,
    STORAGE_CLASS_ADD,
    UNSCHEDULABLE_TIMEOUT,
    BindPlugin,
    EnqueueExtensions,
    FilterPlugin,
    PermitPlugin,
    Plugin,
    PostBindPlugin,
    PostFilterPlugin,
    PreBindPlugin,
    PreEnqueuePlugin,
    PreFilterPlugin,
    PreScorePlugin,
    QueueSortPlugin,
    ReservePlugin,
    ScorePlugin,
)
from gpufleet.scheduler.profile import Profile, num_feasible_nodes_to_find
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot
from gpufleet.scheduler.status import (
    GPU_INDICES_KEY,
    MAX_NODE_SCORE,
    MIN_NODE_SCORE,
    OK,
    SKIP,
    Code,
    CycleState,
    Status,
)

if TYPE_CHECKING:
    from gpufleet.scheduler.queue import QueuedPodInfo

# Re-exported: plugins and callers import the framework's vocabulary from here.
__all__ = [
    "ALL_EVENTS", "BindPlugin", "Code", "CycleState", "Diagnosis", "EnqueueExtensions", "FilterPlugin",
    "FitError", "Framework", "FrameworkHandle", "GPU_INDICES_KEY", "MAX_NODE_SCORE", "MIN_NODE_SCORE",
    "NODE_ADD", "NODE_ALLOCATABLE", "NODE_ANNOTATION", "NODE_DELETE", "NODE_LABEL", "NODE_TAINT", "OK",
    "POD_DELETE", "POD_UPDATE", "PVC_ADD", "PVC_UPDATE", "PV_ADD", "PV_UPDATE", "PermitPlugin",
    "Plugin", "PluginFactory", "PostBindPlugin", "PostFilterPlugin", "PreBindPlugin",
    "PreEnqueuePlugin", "PreFilterPlugin", "PreScorePlugin", "QueueSortPlugin", "Registry",
    "ReservePlugin", "SKIP", "STORAGE_CLASS_ADD", "ScheduleResult", "SchedulingError", "ScorePlugin",
    "Status", "UNSCHEDULABLE_TIMEOUT", "WaitingPod",
]

log = logging.getLogger(__name__)


async def _answer(step: Callable[..., Awaitable[Status]], *args: Any) -> Status:
    """A binding plugin's answer; an exception it raises is an ERROR status."""
    try:
        return await step(*args)
    except Exception as exc:
        return Status.from_error(exc)


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

        status = self.run_pre_filter(state, pod_info, snapshot)
        if status.code:
            if status.code is Code.ERROR:
                raise SchedulingError(status)
            diagnosis.pre_filter_msg = status.message
            diagnosis.unschedulable_plugins.add(status.plugin)
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
            status = await _answer(p.pre_bind, state, pod_info, node_name)
            if not status.is_success:
                status.plugin = p.name
                return status
        return OK

    async def run_bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status:
        for p in self.binders:
            status = await _answer(p.bind, state, pod_info, node_name)
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
