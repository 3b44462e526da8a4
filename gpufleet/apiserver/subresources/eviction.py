"""The pods/eviction subresource: a delete that honours PodDisruptionBudgets.

As Kubernetes' eviction REST handler: a pod that is Pending, finished or already being
deleted is deleted at once. Otherwise the one PDB selecting it (more than one is a 500) must
allow a disruption: its status must be current (observedGeneration), and
``disruptionsAllowed`` above zero, else 429 TooManyRequests "Cannot evict pod as it would
violate the pod's disruption budget." with a DisruptionBudget cause. The budget is spent by
a compare-and-swap on the PDB's status (``disruptionsAllowed`` - 1, the pod recorded in
``disruptedPods``) before the pod is deleted, so two concurrent evictions cannot both take
the last allowed disruption. A pod that is not Ready costs nothing from the budget when the
budget is already met (or the PDB's unhealthyPodEvictionPolicy is AlwaysAllow).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.api.selectors import LabelSelector, SelectorError
from gpufleet.apiserver.decoding import parse_body
from gpufleet.apiserver.errors import ApiException, conflict, forbidden
from gpufleet.apiserver.subresources.base import Subresource
from gpufleet.store import base as store_base
from gpufleet.utils.clock import rfc3339

if TYPE_CHECKING:
    from gpufleet.api.registry import ResourceType
    from gpufleet.apiserver.admission import UserInfo
    from gpufleet.apiserver.handlers.scope import Scope
    from gpufleet.apiserver.server import ApiServer
    from gpufleet.utils.http import RawResponse

PDBS = "poddisruptionbudgets.policy"
_VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
_ATTEMPTS = 20


def _too_many(message: str, retry_after: int) -> ApiException:
    details: dict[str, Any] = {"causes": [{"reason": "DisruptionBudget", "message": message}]}
    headers = {}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
        headers["retry-after"] = str(retry_after)
    return ApiException(429, "TooManyRequests", _VIOLATION, details, headers)


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _can_ignore_pdb(pod: dict[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or bool((pod.get("metadata") or {}).get("deletionTimestamp"))


async def _budgets(server: ApiServer, pod: dict[str, Any]) -> list[dict[str, Any]]:
    ns = pod["metadata"].get("namespace", "")
    labels = pod["metadata"].get("labels") or {}
    out = []
    for pdb in (await server.store.list(PDBS, ns)).items:
        sel = (pdb.get("spec") or {}).get("selector")
        if sel is None:
            continue
        try:
            if LabelSelector.from_dict(sel).matches(labels):
                out.append(pdb)
        except SelectorError:
            continue
    return out


async def evict(server: ApiServer, rt: ResourceType, ns: str, name: str, body: Any,
                user: UserInfo, options: dict[str, Any]) -> dict[str, Any]:
    success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    for _ in range(_ATTEMPTS):
        pod = await server.get_object(rt, ns, name)
        if _can_ignore_pdb(pod):
            await server.delete_object(rt, ns, name, options, user=user)
            return success
        budgets = await _budgets(server, pod)
        if len(budgets) > 1:
            raise ApiException(500, "InternalError", "This pod has more than one PodDisruptionBudget, "
                                                     "which the eviction subresource does not support.")
        if not budgets:
            await server.delete_object(rt, ns, name, options, user=user)
            return success
        pdb = budgets[0]
        status = pdb.get("status") or {}
        if not _ready(pod):
            policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy")
            healthy, desired = status.get("currentHealthy", 0), status.get("desiredHealthy", 0)
            if policy == "AlwaysAllow" or (healthy >= desired and desired > 0):
                pinned = {**options, "preconditions": {**(options.get("preconditions") or {}),
                                                       "resourceVersion": pod["metadata"]["resourceVersion"]}}
                try:
                    await server.delete_object(rt, ns, name, pinned, user=user)
                except ApiException as e:
                    if e.code == 409 and not (options.get("preconditions") or {}).get("resourceVersion"):
                        raise _too_many(f"The disruption budget {pdb['metadata']['name']} is still being "
                                        "processed by the server.", 10) from None
                    raise
                return success
        if not await _spend(server, pdb, name):
            continue  # the budget changed under us: read it again
        await server.delete_object(rt, ns, name, options, user=user)
        return success
    raise conflict(rt, name, "the pod's disruption budget kept changing; try again")


async def _spend(server: ApiServer, pdb: dict[str, Any], pod_name: str) -> bool:
    """Take one disruption from ``pdb``; False when the compare-and-swap lost a race."""
    meta, status = pdb["metadata"], dict(pdb.get("status") or {})
    pdb_name = meta["name"]
    if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 1):
        raise _too_many(f"The disruption budget {pdb_name} is still being processed by the server.", 10)
    allowed = int(status.get("disruptionsAllowed") or 0)
    if allowed < 0:
        raise forbidden(f'poddisruptionbudget.policy "{pdb_name}" is forbidden: pdb disruptions allowed is negative')
    if allowed == 0:
        raise _too_many(f"The disruption budget {pdb_name} needs {status.get('desiredHealthy', 0)} healthy pods "
                        f"and has {status.get('currentHealthy', 0)} currently", 0)
    status["disruptionsAllowed"] = allowed - 1
    now = rfc3339(server.clock.now())
    if allowed - 1 == 0:
        conditions = [dict(c) for c in status.get("conditions") or [] if c.get("type") != "DisruptionAllowed"]
        conditions.append({"type": "DisruptionAllowed", "status": "False", "reason": "InsufficientPods",
                           "message": "", "observedGeneration": meta.get("generation") or 1,
                           "lastTransitionTime": now})
        status["conditions"] = conditions
    status["disruptedPods"] = {**(status.get("disruptedPods") or {}), pod_name: now}
    updated = {**pdb, "status": status}
    try:
        await server.store.update(PDBS, meta.get("namespace", ""), pdb_name, updated,
                                  expected_revision=int(meta.get("resourceVersion") or 0))
    except (store_base.Conflict, store_base.NotFound):
        return False
    return True


class Eviction(Subresource):
    name = "eviction"
    verbs = frozenset({"create"})

    async def serve(self, scope: Scope) -> RawResponse:
        from gpufleet.apiserver.handlers.scope import json_response

        self.check_verb(scope)
        body = await parse_body(scope.req)
        return json_response(201, await scope.api.evict_pod(scope.rt, scope.ns, scope.name, body, scope.user))
