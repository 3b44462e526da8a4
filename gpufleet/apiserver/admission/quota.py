"""ResourceQuota admission: charge a quota before the object it pays for is stored.

As Kubernetes' ResourceQuota plugin does: for a create in a namespace with quotas, every
quota that covers the object (it names a resource the object costs, and the object
matches its scopes) must have room for the object's cost, else the request is refused with
403 ``exceeded quota: <quota>, requested: ..., used: ..., limited: ...``. The charge is
written into the quota's ``status.used`` with a compare-and-swap on its resourceVersion
before the object is created, so concurrent creates (here or on another API server
sharing the store) can never spend the same headroom twice. Charges for objects whose
create then failed, and releases for deleted or finished objects, are the resourcequota
controller's job: it recomputes ``status.used`` from the objects that exist.

Within one API server, charges to one namespace are taken one at a time (Kubernetes'
quota evaluator also works a namespace at a time), so the compare-and-swap only retries
against other servers or the controller.

Deliberate difference: Kubernetes refuses requests while a new quota's usage is unknown
("status unknown for quota"); here the missing usage is computed from the store on the
spot, so a quota is enforced from the moment it exists.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.api import quota as q
from gpufleet.apiserver.admission import AdmissionContext
from gpufleet.apiserver.errors import ApiException, forbidden
from gpufleet.store import base as store_base

QUOTAS = "resourcequotas"


class ResourceQuotaAdmission:
    name = "ResourceQuota"

    def __init__(self, *, max_attempts: int = 50) -> None:
        self.max_attempts = max_attempts
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, namespace: str) -> asyncio.Lock:
        lock = self._locks.get(namespace)
        if lock is None:
            lock = self._locks[namespace] = asyncio.Lock()
        return lock

    async def validate(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        # Kubernetes' evaluators charge on create only (pod resources cannot change after it).
        if ctx.operation != "CREATE" or ctx.subresource or not ctx.rt.namespaced:
            return
        store = ctx.server.store
        quotas = await store_base.list_items(store, QUOTAS, ctx.namespace)
        if not quotas:
            return
        key = ctx.rt.key
        covering = [rq for rq in quotas if q.quota_matches(rq, key, obj)]
        if not covering:
            return
        if key == "pods":
            for rq in covering:
                missing = q.missing_requirements(rq, obj)
                if missing:
                    raise forbidden(f'{key} "{ctx.name}" is forbidden: failed quota: '
                                    f'{rq["metadata"]["name"]}: {missing}', ctx.rt, ctx.name)
        now = ctx.server.clock.now()
        cost = q.object_usage(key, obj, now)
        async with self._lock(ctx.namespace):
            for rq in covering:
                await self._charge(ctx, rq, cost, now)

    async def _charge(self, ctx: AdmissionContext, rq: dict[str, Any], cost: dict, now: float) -> None:
        store = ctx.server.store
        ns, rq_name = ctx.namespace, rq["metadata"]["name"]
        for _ in range(self.max_attempts):
            hard_raw = (rq.get("spec") or {}).get("hard") or {}
            hard = q.parse_list(hard_raw)
            requested = {n: cost[n] for n in q.matching_resources(ctx.rt.key, hard) if cost.get(n)}
            if not requested:
                return
            used_raw = (rq.get("status") or {}).get("used") or {}
            used = q.parse_list(used_raw)
            if any(n not in used for n in hard):
                live = await self._live_usage(store, rq, now)
                for n in hard:
                    used.setdefault(n, live.get(n, 0))
            new_used = {n: used.get(n, 0) for n in hard}
            for n, amount in requested.items():
                new_used[n] = new_used[n] + amount
            exceeded = sorted(n for n in requested if new_used[n] > hard[n])
            if exceeded:
                msg = (f"exceeded quota: {rq_name}, "
                       f"requested: {q.pretty({n: requested[n] for n in exceeded}, hard_raw)}, "
                       f"used: {q.pretty({n: used.get(n, 0) for n in exceeded}, hard_raw)}, "
                       f"limited: {q.pretty({n: hard[n] for n in exceeded}, hard_raw)}")
                raise forbidden(f'{ctx.rt.key} "{ctx.name}" is forbidden: {msg}', ctx.rt, ctx.name)
            if ctx.dry_run:
                return
            updated = dict(rq)
            updated["status"] = {"hard": dict(hard_raw), "used": q.format_list(new_used, hard_raw)}
            try:
                await store.update(QUOTAS, ns, rq_name, updated,
                                   expected_revision=int(rq["metadata"].get("resourceVersion") or 0))
                return
            except store_base.Conflict:
                try:
                    rq = await store.get(QUOTAS, ns, rq_name)
                except store_base.NotFound:
                    return
            except store_base.NotFound:
                return
        raise ApiException(500, "InternalError",
                           f"Internal error occurred: resource quota {rq_name} kept changing; try again")

    @staticmethod
    async def _live_usage(store: store_base.Store, rq: dict[str, Any], now: float) -> dict:
        ns = rq["metadata"].get("namespace", "")
        objects = {r: (await store.list(r, ns)).items for r in q.needed_resources(rq)}
        return q.quota_usage(rq, objects, now)
