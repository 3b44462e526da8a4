"""ResourceQuota: keep ``status.used`` equal to what the namespace's objects really use.

Quota admission charges a quota (compare-and-swap on its ``status.used``) before the
object it pays for is stored; nothing in admission gives the charge back when that object
is deleted, finishes (a Succeeded/Failed pod stops counting) or was never stored because
its create failed. This controller recomputes usage from the objects themselves, as
Kubernetes' resource quota controller does: on every quota change, on pod events in the
quota's namespace, and every ``resync_period`` for the other kinds a quota may count
(``count/deployments.apps``, ``services``, ...). ``status.hard`` mirrors ``spec.hard``.

Releasing is the dangerous direction: between admission's charge and the object's
appearance in a listing there is a moment where the object is paid for but not seen, and
recomputing then would hand its headroom to the next create. So a recomputed value lower
than the charged one is written only once the quota has gone ``charge_grace`` seconds
without a charge this controller did not make; until then the charged value stands and
the quota is looked at again when the grace ends. A raise (objects that exist but were
never charged, e.g. created before the quota) is written at once: it can only refuse more.
Every write is a compare-and-swap on the quota read in the same pass, so a charge landing
meanwhile makes the write fail and the pass start over.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gpufleet.api import quota as q
from gpufleet.api.k8s import Pod, ResourceQuota
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import Conflict, NotFound
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.controllers.actions import Actions
from gpufleet.controllers.base import KeyedController
from gpufleet.utils.tasks import cancel_and_wait

log = logging.getLogger(__name__)

DEFAULT_CHARGE_GRACE = 5.0
DEFAULT_RESYNC_PERIOD = 30.0


def desired_status(
    rq: dict[str, Any], computed: dict[str, Any], *, hold_releases: bool
) -> tuple[dict[str, Any], bool]:
    """The status to write and whether a release was held back (see the module docstring)."""
    hard_raw = (rq.get("spec") or {}).get("hard") or {}
    current = q.parse_list(((rq.get("status") or {}).get("used")) or {})
    used: dict[str, Any] = {}
    held = False
    for name in hard_raw:
        value = computed.get(name, 0)
        if hold_releases and name in current and value < current[name]:
            value, held = current[name], True
        used[name] = value
    return {"hard": dict(hard_raw), "used": q.format_list(used, hard_raw)}, held


def decide_quota(rq: dict[str, Any], computed: dict[str, Any], quiet_for: float, charge_grace: float) -> Actions:
    """The status to write (None when it is the quota's already), and when to look again at a
    release held back because the quota changed less than ``charge_grace`` seconds ago."""
    status, held = desired_status(rq, computed, hold_releases=quiet_for < charge_grace)
    actions = Actions(status=status if status != (rq.get("status") or {}) else None,
                      reason="HoldingRelease" if held else "Synced")
    if held:
        actions.requeue(max(charge_grace - quiet_for, 0.0) + 0.05)
    return actions


class ResourceQuotaController(KeyedController):
    name = "resourcequota"
    model = ResourceQuota

    def __init__(self, client: Client, informers: SharedInformerFactory, *,
                 charge_grace: float = DEFAULT_CHARGE_GRACE, resync_period: float = DEFAULT_RESYNC_PERIOD,
                 **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.charge_grace = charge_grace
        self.resync_period = resync_period
        self.quota_informer = self.informer
        self.pod_informer = informers.informer(Pod)
        self.pod_informer.add_event_handler(self._pod_event, self._pod_changed, self._pod_event)
        # quota key -> (resourceVersion last seen, when a change not ours was last seen)
        self._seen: dict[str, tuple[str, float]] = {}
        self._resync: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await super().start()
        if self._resync is None:
            self._resync = asyncio.create_task(self._resync_loop(), name="resourcequota:resync")

    async def stop(self) -> None:
        await cancel_and_wait(self._resync)
        self._resync = None
        await super().stop()

    async def _resync_loop(self) -> None:
        while True:
            await self.clock.sleep(self.resync_period)
            for rq in self.quota_informer.list():
                self.controller.enqueue_object(rq)

    def _pod_event(self, pod: Any) -> None:
        for rq in self.quota_informer.by_index(NAMESPACE_INDEX, objects.namespace_of(pod)):
            self.controller.enqueue_object(rq)

    def _pod_changed(self, old: Any, new: Any) -> None:
        self._pod_event(new)

    async def _objects(self, rq: dict[str, Any], namespace: str) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for key in q.needed_resources(rq):
            rt = self.client.registry.by_key(key)
            if rt is None or not rt.namespaced:
                out[key] = []
                continue
            out[key] = [dict(o) for o in await self.client.list(rt, namespace, raw=True)]
        return out

    async def sync(self, key: str, _cached: Any | None) -> Requeue | None:
        # Read from the API, not the cache: the usage is counted against the quota as stored.
        namespace, name = objects.split_key(key)
        try:
            rq = await self.client.get(ResourceQuota, name, namespace, raw=True)
        except NotFound:
            self._seen.pop(str(key), None)
            return None
        now = self.clock.now()
        rv = objects.resource_version_of(rq)
        seen = self._seen.get(str(key))
        changed_at = now if seen is None or seen[0] != rv else seen[1]
        self._seen[str(key)] = (rv, changed_at)
        quiet_for = now - changed_at
        # Listed after the quota was read: every charge up to that read belongs to an object
        # that is either listed now or still in flight (which the grace covers).
        computed = q.quota_usage(rq, await self._objects(rq, namespace), now)
        actions = decide_quota(rq, computed, quiet_for, self.charge_grace)
        try:
            outcome = await self.act(key, rq, actions)
        except Conflict:
            return Requeue(after=0.0)
        except NotFound:
            return None
        if outcome.owner is not None:
            self._seen[str(key)] = (objects.resource_version_of(outcome.owner), changed_at)
        return self.requeue(actions)
