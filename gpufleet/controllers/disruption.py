"""Disruption: the status of every PodDisruptionBudget, which the eviction API reads.

As Kubernetes' disruption controller computes it:
- ``expectedPods``: for ``minAvailable`` as a number, the pods the selector matches; for a
  percentage, or for ``maxUnavailable``, the replicas their controllers want (the sum of
  ``spec.replicas`` of each distinct controller: a ReplicaSet's Deployment, a ReplicaSet, or
  any kind with a scale subresource). A pod without such a controller makes the budget
  fail safe (no disruption allowed, condition reason SyncFailed, a Warning event);
- ``desiredHealthy``: ``minAvailable`` (a percentage of expected, rounded up), or expected
  minus ``maxUnavailable`` (rounded up);
- ``currentHealthy``: selected pods that are Ready, not being deleted and not recently
  evicted (``disruptedPods``, entries the eviction API adds and this controller drops once the
  pod is gone or two minutes passed);
- ``disruptionsAllowed`` = max(currentHealthy - desiredHealthy, 0), the DisruptionAllowed
  condition (SufficientPods / InsufficientPods) and ``observedGeneration``.

The decision is ``decide_budget`` over ``pdb_status`` (the budget, its pods and the
controllers' scale in; status, Events and when to look again out), applied with
``actions.apply``.

A ``selector`` of ``{}`` selects every pod of the namespace, a missing one none (policy/v1).
"""

from __future__ import annotations

import math
from typing import Any

from gpufleet.api.k8s import Pod, PodDisruptionBudget
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Controller, Requeue
from gpufleet.client.errors import Conflict, NotFound
from gpufleet.client.events import NORMAL, WARNING, EventRecorder
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.client.workqueue import WorkQueue
from gpufleet.controllers._common import is_being_deleted, pod_is_ready, selector_from, timestamp
from gpufleet.controllers.actions import Actions, apply
from gpufleet.utils.clock import REAL_CLOCK, Clock, rfc3339

# How long an eviction's entry in disruptedPods keeps its pod out of currentHealthy.
DELETION_TIMEOUT = 120.0


class ExpectedPodsError(Exception):
    pass


def scaled(value: Any, total: int) -> int:
    """An int-or-percent against ``total``, percentages rounded up (intstr, roundUp=true)."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def pdb_status(
    pdb: dict[str, Any],
    pods: list[Any],
    expected: int | None,
    error: str | None,
    now: float,
) -> tuple[dict[str, Any], float | None]:
    """The status of ``pdb`` over its selected ``pods``; ``expected`` is the controllers' scale
    (None when it was not needed). Also returns when a disruptedPods entry expires."""
    spec = pdb.get("spec") or {}
    old = pdb.get("status") or {}
    generation = (pdb.get("metadata") or {}).get("generation") or 1
    by_name = {objects.name_of(p): p for p in pods}
    disrupted: dict[str, str] = {}
    recheck: float | None = None
    for name, when in (old.get("disruptedPods") or {}).items():
        pod = by_name.get(name)
        started = timestamp(when)
        if pod is None or is_being_deleted(pod) or started is None or started + DELETION_TIMEOUT <= now:
            continue
        disrupted[name] = when
        recheck = started + DELETION_TIMEOUT if recheck is None else min(recheck, started + DELETION_TIMEOUT)
    healthy = sum(1 for p in pods if not is_being_deleted(p) and objects.name_of(p) not in disrupted
                  and pod_is_ready(p))
    min_available, max_unavailable = spec.get("minAvailable"), spec.get("maxUnavailable")
    if error is None:
        if max_unavailable is not None:
            expected = expected or 0
            desired = max(expected - scaled(max_unavailable, expected), 0)
        elif isinstance(min_available, str) and min_available.endswith("%"):
            expected = expected or 0
            desired = scaled(min_available, expected)
        elif min_available is not None:
            expected, desired = len(pods), int(min_available)
        else:
            expected, desired = len(pods), len(pods)
        allowed = max(healthy - desired, 0)
    else:
        expected = old.get("expectedPods", 0)
        desired = old.get("desiredHealthy", 0)
        allowed = 0
    conditions = [dict(c) for c in old.get("conditions") or [] if c.get("type") != "DisruptionAllowed"]
    prev = next((c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)
    cond_status = "True" if allowed > 0 else "False"
    reason = "SyncFailed" if error else ("SufficientPods" if allowed > 0 else "InsufficientPods")
    transition = rfc3339(now)
    if prev is not None and prev.get("status") == cond_status:
        transition = prev.get("lastTransitionTime") or transition
    conditions.append({"type": "DisruptionAllowed", "status": cond_status, "reason": reason,
                       "message": error or "", "observedGeneration": generation,
                       "lastTransitionTime": transition})
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": conditions,
    }
    if disrupted:
        status["disruptedPods"] = disrupted
    return status, recheck


def needs_scale(pdb: Any) -> bool:
    """Whether the budget counts its pods' controllers' replicas (maxUnavailable, or a
    percentage minAvailable)."""
    spec = pdb.to_dict().get("spec") or {}
    return spec.get("maxUnavailable") is not None or (
        isinstance(spec.get("minAvailable"), str) and str(spec["minAvailable"]).endswith("%"))


def decide_budget(pdb: Any, pods: list[Any], expected: int | None, error: str | None, now: float) -> Actions:
    """The budget's status (written only when it changed), its Events, and when to look again
    for a disruptedPods entry to expire. ``error``: why the expected count is unknown."""
    body = pdb.to_dict()
    status, recheck = pdb_status(body, pods, expected, error, now)
    actions = Actions(reason="SyncFailed" if error else "Synced")
    if error is not None:
        actions.event(WARNING, "CalculateExpectedPodCountFailed",
                      f"Failed to calculate the number of expected pods: {error}")
    if status != (body.get("status") or {}):
        if not pods:
            actions.event(NORMAL, "NoPods", "No matching pods found")
        actions.status = status
    if recheck is not None:
        actions.requeue(max(recheck - now, 0.0) + 0.05)
    return actions


class DisruptionController:
    name = "disruption"

    def __init__(
        self,
        client: Client,
        informers: SharedInformerFactory,
        *,
        clock: Clock = REAL_CLOCK,
        recorder: EventRecorder | None = None,
        workers: int = 2,
    ) -> None:
        self.client = client
        self.clock = clock
        self.recorder = recorder or EventRecorder(client, "controllermanager", clock=clock)
        self.pdb_informer = informers.informer(PodDisruptionBudget)
        self.pod_informer = informers.informer(Pod)
        self.queue = WorkQueue(self.name, clock=clock)
        self.controller = Controller(self.name, self.reconcile, self.queue, workers=workers)
        self.controller.watch(self.pdb_informer)
        self.pod_informer.add_event_handler(self._pod_event, self._pod_changed, self._pod_event)

    async def start(self) -> None:
        await self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()

    def _pod_event(self, pod: Any) -> None:
        labels = objects.labels_of(pod)
        for pdb in self.pdb_informer.by_index(NAMESPACE_INDEX, objects.namespace_of(pod)):
            if selector_from(pdb.spec.selector if pdb.spec else None).matches(labels):
                self.controller.enqueue_object(pdb)

    def _pod_changed(self, old: Any, new: Any) -> None:
        self._pod_event(new)
        if old is not None and objects.labels_of(old) != objects.labels_of(new):
            self._pod_event(old)

    async def _expected(self, pods: list[Any]) -> int:
        """The replicas wanted by the distinct controllers of ``pods``."""
        total = 0
        seen: set[str] = set()
        for pod in pods:
            ref = objects.controller_ref(pod)
            if ref is None:
                raise ExpectedPodsError(f'found no controller ref for pod "{objects.name_of(pod)}"')
            kind, name = objects.field(ref, "kind"), objects.field(ref, "name")
            api_version = objects.field(ref, "api_version") or objects.field(ref, "apiVersion")
            ns = objects.namespace_of(pod)
            rt = self.client.registry.by_api_version_kind(api_version, kind)
            try:
                if rt is not None and rt.key == "replicasets.apps":
                    rs = await self.client.get(rt, name, ns, raw=True)
                    owner = next((r for r in (rs.get("metadata") or {}).get("ownerReferences") or []
                                  if r.get("controller") and r.get("kind") == "Deployment"), None)
                    if owner is not None:
                        deploy = await self.client.get("deployments.apps", owner["name"], ns, raw=True)
                        uid, replicas = deploy["metadata"]["uid"], (deploy.get("spec") or {}).get("replicas", 1)
                    else:
                        uid, replicas = rs["metadata"]["uid"], (rs.get("spec") or {}).get("replicas", 1)
                elif rt is not None and "scale" in rt.subresources:
                    scale = await self.client.get_scale(rt, name, ns, raw=True)
                    uid = objects.field(ref, "uid")
                    replicas = (scale.get("spec") or {}).get("replicas") or 0
                else:
                    raise ExpectedPodsError(f"found no controllers for pod \"{objects.name_of(pod)}\"")
            except NotFound:
                raise ExpectedPodsError(f'the controller {kind} "{name}" of pod "{objects.name_of(pod)}" '
                                        "was not found") from None
            if uid not in seen:
                seen.add(uid)
                total += int(replicas or 0)
        return total

    async def reconcile(self, key: Any) -> Requeue | None:
        cached = self.pdb_informer.get(str(key))
        if cached is None:
            return None
        spec = cached.to_dict().get("spec") or {}
        selector = selector_from(spec.get("selector"))
        pods = [p for p in self.pod_informer.by_index(NAMESPACE_INDEX, objects.namespace_of(cached))
                if selector.matches(objects.labels_of(p))]
        expected, error = None, None
        if needs_scale(cached):
            try:
                expected = await self._expected(pods)
            except ExpectedPodsError as e:
                error = str(e)
        actions = decide_budget(cached, pods, expected, error, self.clock.now())
        try:
            await apply(self.client, actions, owner=cached, recorder=self.recorder)
        except Conflict:
            return Requeue(after=0.0)
        except NotFound:
            return None
        return Requeue(after=actions.requeue_after) if actions.requeue_after is not None else None
