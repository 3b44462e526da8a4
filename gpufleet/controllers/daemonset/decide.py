"""The DaemonSet decision: ``decide(observed, now) -> Actions``, a pure function.

As Kubernetes' syncDaemonSet:
1. the revision of the template (found, renumbered on a rollback, or created); its hash
   labels the pods (``controller-revision-hash``);
2. manage, per node (``podsShouldBeOnNode``): a node that should run the daemon and has no
   pod gets one; a failed or finished pod is deleted (with a back-off per node) to be made
   again; extra pods on a node are deleted, the oldest kept (with maxSurge: the oldest new
   one and, until the new one is available, the oldest old one); a node that should not keep
   the daemon (selector, affinity or a NoExecute taint no longer tolerated) loses it; a pod
   not yet scheduled whose node is gone is deleted;
3. only when manage had nothing to do: RollingUpdate replaces old pods, at most maxUnavailable
   nodes without an available pod at a time (an old pod that is unavailable anyway is replaced
   at once), or with maxSurge starts the new pod beside the old one and deletes the old one
   once the new one is available; OnDelete replaces nothing;
4. status, and old revisions beyond revisionHistoryLimit deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufleet.api.k8s import ControllerRevision, Pod
from gpufleet.client import objects
from gpufleet.controllers import history
from gpufleet.controllers._common import (
    is_being_deleted,
    pod_available_at,
    pod_is_ready,
    pod_phase,
    status_dict,
)
from gpufleet.controllers.actions import Actions, Create, Delete, Instant
from gpufleet.controllers.daemonset.model import (
    KIND,
    available,
    daemon_status,
    is_updated,
    oldest_first,
    pod_body,
    should_run,
    template_dict,
)
from gpufleet.controllers.deployment.model import scaled_value
from gpufleet.controllers.history import REVISION_LABEL

FAILED_BACKOFF = 1.0
FAILED_BACKOFF_MAX = 900.0


@dataclass
class Observed:
    ds: Any
    nodes: list[Any]
    by_node: dict[str, list[Any]]  # the set's pods by the node they are for (any phase)
    revisions: list[Any] = field(default_factory=list)
    expectations_satisfied: bool = True
    # node -> (monotonic time before which no failed pod there is deleted again, last delay)
    backoff: dict[str, tuple[float, float]] = field(default_factory=dict)


def _rolling(ds: Any) -> bool:
    strategy = ds.spec.update_strategy
    return strategy is None or (strategy.type or "RollingUpdate") == "RollingUpdate"


def fenceposts(ds: Any, desired: int) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) in nodes; both rounded up, and never both zero."""
    ru = ds.spec.update_strategy.rolling_update if ds.spec.update_strategy is not None else None
    surge = scaled_value(ru.max_surge if ru is not None else 0, desired, round_up=True)
    unavailable = scaled_value(ru.max_unavailable if ru is not None and ru.max_unavailable is not None else 1,
                               desired, round_up=True)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


class _Plan:
    def __init__(self, obs: Observed, hash_: str, actions: Actions, now: Instant) -> None:
        self.obs = obs
        self.ds = obs.ds
        self.hash = hash_
        self.actions = actions
        self.now = now
        self.min_ready = self.ds.spec.min_ready_seconds or 0
        self.template = template_dict(self.ds)

    def delete(self, pod: Any) -> None:
        self.actions.deletes.append(Delete(Pod, objects.name_of(pod), objects.namespace_of(pod),
                                           uid=objects.uid_of(pod), expect=True,
                                           success_reason="SuccessfulDelete", failure_reason="FailedDelete"))

    def create(self, node_name: str) -> None:
        self.actions.creates.append(Create(pod_body(self.ds, self.template, node_name, self.hash), expect=True,
                                           success_reason="SuccessfulCreate", failure_reason="FailedCreate"))

    def available(self, pod: Any) -> bool:
        return available(pod, self.min_ready, self.now.wall)


def _manage(plan: _Plan) -> None:
    obs, actions = plan.obs, plan.actions
    surge = _rolling(plan.ds) and fenceposts(plan.ds, len(obs.nodes))[0] > 0
    backoff = dict(obs.backoff)
    node_names = set()
    for node in sorted(obs.nodes, key=objects.name_of):
        name = objects.name_of(node)
        node_names.add(name)
        run, keep = should_run(plan.ds, node)
        pods = obs.by_node.get(name, [])
        if run and not pods:
            plan.create(name)
        elif keep:
            running = []
            for p in pods:
                if is_being_deleted(p):
                    continue
                if pod_phase(p) in ("Failed", "Succeeded"):
                    until, delay = backoff.get(name, (0.0, 0.0))
                    if plan.now.monotonic < until:
                        actions.requeue(until - plan.now.monotonic)
                        continue
                    delay = min(max(delay * 2, FAILED_BACKOFF), FAILED_BACKOFF_MAX)
                    backoff[name] = (plan.now.monotonic + delay, delay)
                    actions.event("Warning", "FailedDaemonPod",
                                  f"Found failed daemon pod {objects.namespace_of(p)}/{objects.name_of(p)} on node "
                                  f"{name}, will try to kill it")
                    plan.delete(p)
                    continue
                running.append(p)
            if not running:
                # Without surge a new pod waits for the old ones to be gone.
                if surge and run:
                    plan.create(name)
                continue
            ordered = oldest_first(running)
            if not surge:
                for p in ordered[1:]:
                    plan.delete(p)
                continue
            _prune_surge(plan, ordered)
        elif pods:
            for p in pods:
                if not is_being_deleted(p):
                    plan.delete(p)
    # Pods never scheduled whose node is gone.
    for name, pods in obs.by_node.items():
        if name in node_names:
            continue
        for p in pods:
            if not getattr(p.spec, "node_name", None) and not is_being_deleted(p):
                plan.delete(p)
    if backoff != obs.backoff:
        actions.memo["backoff"] = backoff


def _prune_surge(plan: _Plan, ordered: list[Any]) -> None:
    """With maxSurge a node may hold the oldest new pod and, until that is available, the
    oldest old one; every other pod goes."""
    newest = oldest_old = None
    for p in ordered:
        if is_updated(p, plan.hash):
            if newest is None:
                newest = p
                continue
        elif oldest_old is None:
            oldest_old = p
            continue
        plan.delete(p)
    if newest is not None and oldest_old is not None:
        if not pod_is_ready(oldest_old) or plan.available(newest):
            plan.delete(oldest_old)


def _updated_pods_on_node(pods: list[Any], hash_: str) -> tuple[Any | None, Any | None, bool]:
    """(new pod, old pod, ok): ok is False when the node has more than one of either."""
    new = old = None
    for p in pods:
        if is_being_deleted(p):
            continue
        if is_updated(p, hash_):
            if new is not None:
                return None, None, False
            new = p
        else:
            if old is not None:
                return None, None, False
            old = p
    return new, old, True


def _rolling_update(plan: _Plan) -> None:
    obs = plan.obs
    desired = sum(1 for n in obs.nodes if should_run(plan.ds, n)[0])
    max_surge, max_unavailable = fenceposts(plan.ds, desired)
    nodes = sorted(obs.by_node)
    if max_surge == 0:
        unavailable = 0
        replace: list[Any] = []
        candidates: list[Any] = []
        for name in nodes:
            new, old, ok = _updated_pods_on_node(obs.by_node[name], plan.hash)
            if not ok or (new is None) == (old is None):
                unavailable += 1
            elif new is not None:
                if not plan.available(new):
                    unavailable += 1
            elif not plan.available(old):
                replace.append(old)
            elif unavailable < max_unavailable:
                candidates.append(old)
        room = min(max(max_unavailable - unavailable, 0), len(candidates))
        for p in [*replace, *candidates[:room]]:
            plan.delete(p)
        if replace or room:
            plan.actions.reason = "RollingUpdate"
        return
    surging = 0
    allowed: list[str] = []
    candidate_nodes: list[str] = []
    for name in nodes:
        new, old, ok = _updated_pods_on_node(obs.by_node[name], plan.hash)
        if not ok:
            surging += 1
            continue
        if old is None:
            continue
        if new is None:
            if not plan.available(old):
                allowed.append(name)
            elif surging < max_surge:
                candidate_nodes.append(name)
        elif not plan.available(new):
            surging += 1
        else:
            plan.delete(old)
            plan.actions.reason = "RollingUpdate"
    room = min(max(max_surge - surging, 0), len(candidate_nodes))
    for name in [*allowed, *candidate_nodes[:room]]:
        plan.create(name)
        plan.actions.reason = "RollingUpdate"


def availability_recheck(obs: Observed, min_ready: int, now: float) -> float | None:
    if not min_ready:
        return None
    pods = [p for pods in obs.by_node.values() for p in pods]
    pending = [at for p in pods if (at := pod_available_at(p, min_ready)) is not None and at >= now]
    return max(min(pending) - now, 0.0) + 0.001 if pending else None


def decide(obs: Observed, now: Instant) -> Actions:
    ds = obs.ds
    collision = (ds.status.collision_count if ds.status is not None else None) or 0
    rev = history.update_revision(ds, KIND, template_dict(ds), obs.revisions, collision, hash_data=False)
    actions = rev.actions
    plan = _Plan(obs, rev.hash, actions, now)
    status = daemon_status(ds, obs.nodes, obs.by_node, rev.hash, rev.collision_count, now.wall)
    if status != status_dict(ds):
        actions.status = status
    actions.requeue(availability_recheck(obs, plan.min_ready, now.wall))
    if not obs.expectations_satisfied:
        actions.reason = "WaitingForCache"
        return actions
    if is_being_deleted(ds):
        actions.reason = "Deleting"
        return actions
    _manage(plan)
    managed = any(c.expect for c in actions.creates) or any(d.kind is Pod for d in actions.deletes)
    if managed:
        actions.reason = "Manage"
    elif _rolling(ds):
        _rolling_update(plan)
    live = {rev.name} | {f"{objects.name_of(ds)}-{h}" for pods in obs.by_node.values() for p in pods
                         if (h := (objects.labels_of(p) or {}).get(REVISION_LABEL))}
    limit = ds.spec.revision_history_limit
    for r in history.to_truncate(obs.revisions, live, 10 if limit is None else limit):
        actions.deletes.append(Delete(ControllerRevision, objects.name_of(r), objects.namespace_of(r),
                                      uid=objects.uid_of(r), must=False))
    actions.reason = actions.reason or "InSync"
    return actions
