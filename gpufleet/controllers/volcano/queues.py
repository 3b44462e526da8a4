"""Volcano's Queues and the status of its PodGroups: when a PodGroup leaves Pending
(Inqueue: its Queue admits it, and only then are its pods made and placed), its phase
after that, and each Queue's counts and allocation.

``decide`` is pure: the Queues, the PodGroups and their member pods in, the status patches
out. The rules (docs/volcano.md):

- a PodGroup holds its ``spec.minResources`` against its Queue while Inqueue or Running;
- a Pending PodGroup is admitted when its Queue exists (``default`` always does), is Open,
  and, for every resource the Queue's ``capability`` names, what the Queue holds plus the
  group's minResources stays within it; otherwise it stays Pending with an Unschedulable
  condition that says why;
- several PodGroups waiting: the Queue holding least per ``weight`` goes first (counted in
  GPUs, then cpu), then the older group;
- once admitted, as Volcano's scheduler moves it: Running when at least minMember members
  are placed (bound, or Succeeded), Completed when those all Succeeded; back to Pending when
  fewer than minMember are placed and it is not Inqueue (a restarted job queues again);
  Completed stays Completed (its job ended);
- a Queue's ``status.state`` Closed or Closing (written by its owner) admits nothing new;
  Closing becomes Closed once nothing of it is held; an unset state is Open.
- ``reclaimable`` and ``deserved``/``guarantee`` are stored only: nothing is preempted
  across Queues.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from gpufleet.api import k8s
from gpufleet.api import volcano as vc
from gpufleet.api.gpu import GPU_RESOURCE
from gpufleet.api.quantity import format_quantity, parse_quantity
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import ApiError
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.controllers._common import is_being_deleted, pod_phase, status_dict, timestamp
from gpufleet.controllers.actions import Actions, Patch
from gpufleet.controllers.base import QueueController
from gpufleet.controllers.pytorchjob.model import gang_wait_reason

HOLDING = (vc.PG_INQUEUE, vc.PG_RUNNING)
CYCLE_KEY = "cycle"


def _amounts(values: Mapping[str, Any] | None) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    for res, q in (values or {}).items():
        try:
            out[res] = parse_quantity(q)
        except ValueError:
            continue
    return out


def _format(res: str, amount: Fraction) -> str:
    return format_quantity(amount, "cpu" if res == "cpu" else "memory" if res == "memory" else "plain")


def _placed(pod: k8s.Pod) -> bool:
    phase = pod_phase(pod)
    bound = bool(pod.spec is not None and pod.spec.node_name)
    return (bound and phase in ("Pending", "Running")) or phase == "Succeeded"


def group_phase(pg: vc.VolcanoPodGroup, members: Sequence[k8s.Pod]) -> str:
    """The phase the group's members give it, before the Queue admits anything."""
    previous = (pg.status.phase if pg.status is not None else None) or vc.PG_PENDING
    min_member = max(1, (pg.spec.min_member if pg.spec is not None else None) or 1)
    # Members on their way out (the job ended and stops them) do not reopen an ended group.
    active = [p for p in members if pod_phase(p) in ("Pending", "Running") and not is_being_deleted(p)]
    if previous == vc.PG_COMPLETED and not active:
        return vc.PG_COMPLETED
    placed = [p for p in members if _placed(p)]
    if len(placed) >= min_member:
        if all(pod_phase(p) == "Succeeded" for p in placed):
            return vc.PG_COMPLETED
        return vc.PG_RUNNING
    if previous == vc.PG_INQUEUE:
        return vc.PG_INQUEUE
    return vc.PG_PENDING


def _share(held: Mapping[str, Fraction], weight: int) -> Fraction:
    return (held.get(GPU_RESOURCE, Fraction(0)) * 1000 + held.get("cpu", Fraction(0))) / max(weight, 1)


def _condition(type_: str, status: str, reason: str, message: str, now: str, old: Sequence[Any]) -> dict[str, Any]:
    for c in old:
        if c.get("type") == type_ and c.get("status") == status and c.get("message") == message:
            return dict(c)
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": now,
            "transitionID": ""}


def decide(queues: Sequence[vc.Queue], podgroups: Sequence[vc.VolcanoPodGroup],
           members: Mapping[str, Sequence[k8s.Pod]], now: str) -> Actions:
    """The status patches of PodGroups and Queues (see the module's doc for the rules)."""
    by_name = {objects.name_of(q): q for q in queues}
    phases: dict[str, str] = {}
    why: dict[str, str] = {}
    held: dict[str, dict[str, Fraction]] = {}
    groups = {objects.object_key(pg): pg for pg in podgroups}

    def queue_of(pg: vc.VolcanoPodGroup) -> str:
        return (pg.spec.queue if pg.spec is not None else None) or vc.DEFAULT_QUEUE

    def need(pg: vc.VolcanoPodGroup) -> dict[str, Fraction]:
        return _amounts(pg.spec.min_resources if pg.spec is not None else None)

    for key, pg in groups.items():
        phases[key] = group_phase(pg, members.get(key, ()))
        if phases[key] in HOLDING:
            per = held.setdefault(queue_of(pg), {})
            for res, n in need(pg).items():
                per[res] = per.get(res, Fraction(0)) + n

    def weight(name: str) -> int:
        q = by_name.get(name)
        return (q.spec.weight if q is not None and q.spec is not None else None) or 1

    waiting = [k for k, p in phases.items() if p == vc.PG_PENDING]
    while waiting:
        waiting.sort(key=lambda k: (_share(held.get(queue_of(groups[k]), {}), weight(queue_of(groups[k]))),
                                    timestamp(objects.meta(groups[k], "creation_timestamp")) or 0.0, k))
        key = waiting.pop(0)
        pg = groups[key]
        qname = queue_of(pg)
        queue = by_name.get(qname)
        if queue is None and qname != vc.DEFAULT_QUEUE:
            why[key] = f"queue {qname} not found; create it or set spec.queue"
            continue
        state = vc.queue_state(queue) if queue is not None else vc.QUEUE_OPEN
        if state != vc.QUEUE_OPEN:
            why[key] = f"queue {qname} is {state}: it admits no PodGroup"
            continue
        cap = _amounts(vc.queue_capability(queue)) if queue is not None else {}
        have = held.get(qname, {})
        short = [(res, have.get(res, Fraction(0)), amount, cap[res]) for res, amount in sorted(need(pg).items())
                 if res in cap and have.get(res, Fraction(0)) + amount > cap[res]]
        if short:
            res, h, n, c = short[0]
            why[key] = (f"queue resource quota insufficient: queue {qname} capability {res} {_format(res, c)}, "
                        f"{_format(res, h)} held, the group needs {_format(res, n)}")
            continue
        phases[key] = vc.PG_INQUEUE
        per = held.setdefault(qname, {})
        for res, n in need(pg).items():
            per[res] = per.get(res, Fraction(0)) + n

    actions = Actions()
    for key, pg in groups.items():
        mine = members.get(key, ())
        old = status_dict(pg)
        old_conditions = list(old.get("conditions") or [])
        conditions: list[dict[str, Any]] = []
        if key in why:
            conditions.append(_condition(vc.PG_UNSCHEDULABLE, "True", "NotEnoughResources", why[key], now,
                                         old_conditions))
        elif phases[key] in (vc.PG_INQUEUE,) and (reason := gang_wait_reason(list(mine))):
            conditions.append(_condition(vc.PG_UNSCHEDULABLE, "True", "NotEnoughResources", reason, now,
                                         old_conditions))
        elif phases[key] in (vc.PG_RUNNING, vc.PG_COMPLETED):
            conditions.append(_condition(vc.PG_SCHEDULED, "True", "tasks in gang are ready to be scheduled",
                                         "", now, old_conditions))
        status: dict[str, Any] = {
            "phase": phases[key],
            "running": sum(1 for p in mine if pod_phase(p) == "Running"),
            "succeeded": sum(1 for p in mine if pod_phase(p) == "Succeeded"),
            "failed": sum(1 for p in mine if pod_phase(p) == "Failed"),
            "conditions": conditions,
        }
        current = {"phase": old.get("phase"), "running": old.get("running") or 0,
                   "succeeded": old.get("succeeded") or 0, "failed": old.get("failed") or 0,
                   "conditions": old_conditions}
        if current != status:
            actions.patches.append(Patch(vc.VolcanoPodGroup, objects.name_of(pg), objects.namespace_of(pg),
                                         {"status": {**status, "conditions": conditions or None}},
                                         subresource="status"))

    for q in queues:
        name = objects.name_of(q)
        mine_groups = [k for k, pg in groups.items() if queue_of(pg) == name]
        count = {p: sum(1 for k in mine_groups if phases[k] == p) for p in vc.PG_PHASES}
        state = vc.queue_state(q)
        if state == vc.QUEUE_CLOSING and not (count[vc.PG_INQUEUE] or count[vc.PG_RUNNING]):
            state = vc.QUEUE_CLOSED
        status = {"state": state, "pending": count[vc.PG_PENDING], "inqueue": count[vc.PG_INQUEUE],
                  "running": count[vc.PG_RUNNING], "completed": count[vc.PG_COMPLETED],
                  "unknown": count[vc.PG_UNKNOWN],
                  "allocated": {res: _format(res, n) for res, n in sorted(held.get(name, {}).items())}}
        old = status_dict(q)
        current = {k: old.get(k) or (0 if k not in ("state", "allocated") else {} if k == "allocated" else None)
                   for k in status}
        if current != status:
            actions.patches.append(Patch(vc.Queue, name, None, {"status": status}, subresource="status"))
    actions.reason = f"{sum(1 for p in phases.values() if p == vc.PG_INQUEUE)} inqueue"
    return actions


class VolcanoQueueController(QueueController):
    """One pass over every Volcano Queue and PodGroup (key ``cycle``) whenever one of them,
    or a member pod, changes."""

    name = "volcanoqueue"

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.queues = informers.informer(vc.Queue)
        self.podgroups = informers.informer(vc.VolcanoPodGroup)
        self.pods = informers.informer(k8s.Pod)
        self.pods.add_indexer("volcanoGroup", lambda pod: _group_key(pod))
        for inf in (self.queues, self.podgroups):
            inf.add_event_handler(self._wake, lambda old, new: self._wake(new), self._wake)
        self.pods.add_event_handler(self._pod_event, self._pod_updated, self._pod_event)

    def _wake(self, _obj: Any = None) -> None:
        self.queue.add(CYCLE_KEY)

    def _pod_event(self, pod: Any) -> None:
        if _group_key(pod):
            self._wake()

    def _pod_updated(self, old: Any, new: Any) -> None:
        if _group_key(new) and (pod_phase(old) != pod_phase(new) or _bound(old) != _bound(new)
                                or _scheduled_message(old) != _scheduled_message(new)):
            self._wake()

    async def reconcile(self, key: Any) -> Requeue | None:
        pgs = [_typed(vc.VolcanoPodGroup, p) for p in self.podgroups.list()]
        members = {objects.object_key(pg): [_typed(k8s.Pod, p) for p in self.pods.by_index(
            "volcanoGroup", objects.object_key(pg))] for pg in pgs}
        actions = decide([_typed(vc.Queue, q) for q in self.queues.list()], pgs, members, self.now().text)
        try:
            await self.act(actions)
        except ApiError:
            return Requeue(after=0.1)
        return None

    async def act(self, actions: Actions) -> None:
        from gpufleet.controllers.actions import apply

        outcome = await apply(self.client, actions, owner=None, recorder=self.recorder, raise_errors=False)
        if outcome.error is not None:
            raise outcome.error


def _typed(cls: Any, obj: Any) -> Any:
    return obj if isinstance(obj, cls) else cls.model_validate(obj)


def _group_key(pod: Any) -> str | None:
    name = vc.group_annotation(objects.meta(pod, "annotations"))
    return f"{objects.namespace_of(pod)}/{name}" if name else None


def _bound(pod: Any) -> bool:
    spec = getattr(pod, "spec", None)
    return bool(spec is not None and spec.node_name)


def _scheduled_message(pod: Any) -> str | None:
    status = getattr(pod, "status", None)
    for c in (status.conditions if status is not None else None) or []:
        if c.type == "PodScheduled":
            return c.message
    return None
