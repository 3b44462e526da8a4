"""What the workload controllers share: pod predicates, conditions, owner references and
adoption, creation/deletion expectations, slow-start batches and the order in which pods
are given up when scaling down.

Objects read from informers are the typed models of gpufleet.api.k8s and shared by every
controller: read them, never change them. Writes are built as wire dicts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufleet.api.selectors import LabelSelector
from gpufleet.client import objects
from gpufleet.client.api import Client, retry_on_conflict
from gpufleet.client.errors import ApiError, NotFound
from gpufleet.client.informer import Informer
from gpufleet.utils.clock import Clock, parse_rfc3339, rfc3339

log = logging.getLogger(__name__)

# Index names on shared informers. Every controller that wants one of these registers the
# same function under the same name, so which controller registered it first is irrelevant.
CONTROLLER_UID_INDEX = "controllerUID"
NODE_NAME_INDEX = "nodeName"

POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# What Kubernetes' controllers create or delete at most per sync, so one huge scale-up
# neither floods the API server nor starves every other object in the queue.
BURST_REPLICAS = 500
SLOW_START_INITIAL_BATCH = 1
# Expectations older than this are presumed lost (a watch event that never came).
EXPECTATIONS_TTL = 300.0


# -- small accessors ------------------------------------------------------------------------


def timestamp(value: Any) -> float | None:
    """A model's datetime or a wire string as seconds since the epoch."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str) and value:
        return parse_rfc3339(value)
    return None


def now_text(clock: Clock) -> str:
    return rfc3339(clock.now())


def controller_uid(obj: Any) -> str | None:
    ref = objects.controller_ref(obj)
    return objects.field(ref, "uid") if ref is not None else None


def node_name_of(pod: Any) -> str | None:
    spec = getattr(pod, "spec", None)
    return (spec.node_name if spec is not None else None) or None


def index_by_controller(informer: Informer) -> None:
    informer.add_indexer(CONTROLLER_UID_INDEX, controller_uid)


def index_by_node(pod_informer: Informer) -> None:
    pod_informer.add_indexer(NODE_NAME_INDEX, node_name_of)


def is_being_deleted(obj: Any) -> bool:
    return objects.meta(obj, "deletionTimestamp") is not None


def selector_from(spec_selector: Any) -> LabelSelector:
    """A structured selector (model or dict) as a matcher; a missing one selects nothing."""
    if spec_selector is None:
        return LabelSelector.nothing()
    data = spec_selector if isinstance(spec_selector, dict) else spec_selector.to_dict()
    return LabelSelector.from_dict(data)


def annotations_of(obj: dict[str, Any]) -> dict[str, str]:
    """A copy of a wire object's annotations."""
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def volume_claim_key(pv: Any) -> str | None:
    """The key (namespace/name) of the claim a PersistentVolume's claimRef names, or None."""
    ref = pv.spec.claim_ref if pv.spec is not None else None
    if ref is None or not ref.name:
        return None
    return f"{ref.namespace or ''}/{ref.name}"


def owner_reference(owner: Any, api_version: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": objects.name_of(owner),
        "uid": objects.uid_of(owner),
        "controller": True,
        "blockOwnerDeletion": True,
    }


# -- pods -----------------------------------------------------------------------------------


def pod_phase(pod: Any) -> str:
    status = getattr(pod, "status", None)
    return (status.phase if status is not None else None) or "Pending"


def pod_is_terminal(pod: Any) -> bool:
    return pod_phase(pod) in ("Succeeded", "Failed")


def pod_is_active(pod: Any) -> bool:
    """Counts toward a controller's replicas: neither finished nor on its way out."""
    return not pod_is_terminal(pod) and not is_being_deleted(pod)


def pod_condition(pod: Any, type_: str) -> Any | None:
    status = getattr(pod, "status", None)
    for cond in (status.conditions if status is not None else None) or []:
        if cond.type == type_:
            return cond
    return None


def pod_is_ready(pod: Any) -> bool:
    cond = pod_condition(pod, "Ready")
    return cond is not None and cond.status == "True"


def pod_ready_since(pod: Any) -> float | None:
    cond = pod_condition(pod, "Ready")
    if cond is None or cond.status != "True":
        return None
    return timestamp(cond.last_transition_time)


def pod_available_at(pod: Any, min_ready_seconds: int) -> float | None:
    """When the pod counts (or counted) as available: ready for min_ready_seconds. None when
    it is not ready at all."""
    if not pod_is_ready(pod):
        return None
    if not min_ready_seconds:
        return 0.0
    since = pod_ready_since(pod)
    return (since or 0.0) + min_ready_seconds


def pod_is_available(pod: Any, min_ready_seconds: int, now: float) -> bool:
    at = pod_available_at(pod, min_ready_seconds)
    if at is None:
        return False
    # Kubernetes requires the deadline to be strictly in the past.
    return min_ready_seconds == 0 or at < now


def pod_restart_count(pod: Any) -> int:
    status = getattr(pod, "status", None)
    if status is None:
        return 0
    statuses = [*(status.init_container_statuses or []), *(status.container_statuses or [])]
    return sum(s.restart_count or 0 for s in statuses)


def pod_from_template(
    template: Any,
    *,
    namespace: str,
    generate_name: str,
    owner_ref: dict[str, Any],
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    finalizers: Iterable[str] = (),
) -> dict[str, Any]:
    """A Pod as Kubernetes' GetPodFromTemplate makes it: the template's labels, annotations
    and spec, a generated name, and the controller's owner reference."""
    data = template.to_dict() if hasattr(template, "to_dict") else dict(template or {})
    tmeta = data.get("metadata") or {}
    meta: dict[str, Any] = {
        "generateName": generate_name,
        "namespace": namespace,
        "ownerReferences": [owner_ref],
    }
    all_labels = {**(tmeta.get("labels") or {}), **(labels or {})}
    if all_labels:
        meta["labels"] = all_labels
    all_annotations = {**(tmeta.get("annotations") or {}), **(annotations or {})}
    if all_annotations:
        meta["annotations"] = all_annotations
    all_finalizers = list(tmeta.get("finalizers") or [])
    for f in finalizers:
        if f not in all_finalizers:
            all_finalizers.append(f)
    if all_finalizers:
        meta["finalizers"] = all_finalizers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": data.get("spec") or {}}


def generate_name_prefix(name: str) -> str:
    # The API server appends five random characters and keeps names within 63 characters.
    return f"{name}-"


_PHASE_ORDER = {"Pending": 0, "Unknown": 1, "Running": 2}


def _deletion_cost(pod: Any) -> int:
    annotations = objects.meta(pod, "annotations") or {}
    try:
        return int(annotations.get(POD_DELETION_COST, 0))
    except (TypeError, ValueError):
        return 0


def pod_deletion_rank(pod: Any, related_on_node: int = 0) -> tuple:
    """Sort key: the pods a controller should give up first sort first (Kubernetes'
    ActivePodsWithRanks): unscheduled before scheduled, pending before running, not ready
    before ready, lower deletion cost first, pods doubled up on a node before lone ones,
    recently ready before long ready, more restarts first, newer before older."""
    scheduled = node_name_of(pod) is not None
    ready = pod_is_ready(pod)
    ready_since = pod_ready_since(pod) if ready else None
    created = timestamp(objects.meta(pod, "creationTimestamp")) or 0.0
    return (
        scheduled,
        _PHASE_ORDER.get(pod_phase(pod), 0),
        ready,
        _deletion_cost(pod),
        -related_on_node,
        -(ready_since or 0.0),
        -pod_restart_count(pod),
        -created,
        objects.name_of(pod),
    )


def pods_to_delete(pods: list[Any], count: int, related: Iterable[Any] = ()) -> list[Any]:
    """The ``count`` pods to delete first, ranking doubled-up pods by how many pods of the
    same workload (``related``, e.g. sibling replica sets of one Deployment) share their node."""
    if count <= 0:
        return []
    per_node: dict[str, int] = {}
    seen: set[str] = set()
    for p in [*pods, *related]:
        uid = objects.uid_of(p)
        node = node_name_of(p)
        if uid in seen or node is None or not pod_is_active(p):
            continue
        seen.add(uid)
        per_node[node] = per_node.get(node, 0) + 1
    ranked = sorted(pods, key=lambda p: pod_deletion_rank(p, per_node.get(node_name_of(p) or "", 0)))
    return ranked[:count]


# -- conditions -----------------------------------------------------------------------------


def find_condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    for cond in conditions:
        if cond.get("type") == type_:
            return cond
    return None


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    now: str,
    *,
    update_time_field: str | None = None,
) -> bool:
    """Set a condition in place (the apps/v1 rule): unchanged when status and reason are the
    same; lastTransitionTime kept while the status stays. Returns whether anything changed."""
    current = find_condition(conditions, type_)
    if current is not None and current.get("status") == status and current.get("reason") == reason:
        return False
    new: dict[str, Any] = {"type": type_, "status": status}
    if update_time_field:
        new[update_time_field] = now
    keep_transition = current is not None and current.get("status") == status
    new["lastTransitionTime"] = current.get("lastTransitionTime", now) if keep_transition else now
    if reason:
        new["reason"] = reason
    if message:
        new["message"] = message
    remove_condition(conditions, type_)
    conditions.append(new)
    return True


def remove_condition(conditions: list[dict[str, Any]], type_: str) -> bool:
    before = len(conditions)
    conditions[:] = [c for c in conditions if c.get("type") != type_]
    return len(conditions) != before


# -- expectations ---------------------------------------------------------------------------


@dataclass
class _Expectation:
    adds: int = 0
    deletes: set[str] = field(default_factory=set)
    since: float = 0.0


class Expectations:
    """What a controller is waiting to see in its informer after its own creates and deletes
    (Kubernetes' UIDTrackingControllerExpectations): until the cache caught up, a sync must
    not act on replica counts, or it would create or delete the same pods twice."""

    def __init__(self, clock: Clock, ttl: float = EXPECTATIONS_TTL) -> None:
        self.clock = clock
        self.ttl = ttl
        self._items: dict[str, _Expectation] = {}

    def satisfied(self, key: str) -> bool:
        exp = self._items.get(key)
        if exp is None:
            return True
        if exp.adds <= 0 and not exp.deletes:
            return True
        if self.clock.monotonic() - exp.since > self.ttl:
            log.warning("%s: expectations expired (%d creates, %d deletes unseen)", key, exp.adds, len(exp.deletes))
            return True
        return False

    def expect_creations(self, key: str, count: int) -> None:
        self._items[key] = _Expectation(adds=count, since=self.clock.monotonic())

    def expect_deletions(self, key: str, pod_keys: Iterable[str]) -> None:
        self._items[key] = _Expectation(deletes=set(pod_keys), since=self.clock.monotonic())

    def creation_observed(self, key: str) -> None:
        exp = self._items.get(key)
        if exp is not None and exp.adds > 0:
            exp.adds -= 1

    def deletion_observed(self, key: str, pod_key: str) -> None:
        exp = self._items.get(key)
        if exp is not None:
            exp.deletes.discard(pod_key)

    def forget(self, key: str) -> None:
        self._items.pop(key, None)


async def slow_start_batch(
    count: int, fn: Callable[[], Awaitable[None]], initial: int = SLOW_START_INITIAL_BATCH
) -> tuple[int, BaseException | None]:
    """Call ``fn`` ``count`` times in doubling batches (1, 2, 4, ...), stopping after the first
    batch with a failure: a create that fails for quota or admission fails the same way for
    every pod, and one rejected request is better than five hundred."""
    successes = 0
    remaining = count
    batch = min(remaining, initial)
    while batch > 0:
        results = await asyncio.gather(*(fn() for _ in range(batch)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        successes += batch - len(errors)
        if errors:
            for e in errors:
                if isinstance(e, asyncio.CancelledError):
                    raise e
            return successes, errors[0]
        remaining -= batch
        batch = min(2 * batch, remaining)
    return successes, None


def error_text(e: BaseException) -> str:
    return e.message if isinstance(e, ApiError) else str(e)


# -- owner references: adoption and release -------------------------------------------------


async def edit_owner_references(
    client: Client,
    kind: Any,
    obj: Any,
    edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None],
    *,
    also: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any] | None:
    """Read the object fresh, let ``edit`` return its new ownerReferences (None: leave it),
    and write it back as a compare-and-swap. None when the object is gone or was replaced."""
    uid = objects.uid_of(obj)
    ns = objects.namespace_of(obj) or None
    name = objects.name_of(obj)

    async def attempt() -> dict[str, Any] | None:
        try:
            fresh = await client.get(kind, name, ns, raw=True)
        except NotFound:
            return None
        meta = fresh.setdefault("metadata", {})
        if uid and meta.get("uid") != uid:
            return None
        refs = edit([dict(r) for r in meta.get("ownerReferences") or []])
        if refs is None:
            return fresh
        if refs:
            meta["ownerReferences"] = refs
        else:
            meta.pop("ownerReferences", None)
        if also is not None:
            also(fresh)
        try:
            return await client.update(fresh, raw=True)
        except NotFound:
            return None

    return await retry_on_conflict(attempt)


class RefManager:
    """Kubernetes' ControllerRefManager: a controller claims the objects its selector matches
    (adopting orphans) and lets go of the ones it owns that stopped matching."""

    def __init__(
        self,
        client: Client,
        owner: Any,
        owner_api_version: str,
        owner_kind: str,
        selector: LabelSelector,
        child_kind: Any,
        *,
        adopt_also: Callable[[dict[str, Any]], None] | None = None,
        release_also: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.client = client
        self.owner = owner
        self.owner_api_version = owner_api_version
        self.owner_kind = owner_kind
        self.selector = selector
        self.child_kind = child_kind
        self.adopt_also = adopt_also
        self.release_also = release_also
        self._can_adopt: bool | None = None

    async def _owner_can_adopt(self) -> bool:
        # Adoption must not race with the owner's deletion: read it from the API, not the cache.
        if self._can_adopt is None:
            try:
                fresh = await self.client.get(
                    f"{self.owner_api_version}/{self.owner_kind}",
                    objects.name_of(self.owner),
                    objects.namespace_of(self.owner) or None,
                    raw=True,
                )
            except NotFound:
                fresh = None
            meta = (fresh or {}).get("metadata") or {}
            self._can_adopt = bool(
                fresh and meta.get("uid") == objects.uid_of(self.owner) and not meta.get("deletionTimestamp")
            )
        return self._can_adopt

    async def claim(self, candidates: Iterable[Any], *, adopt_filter: Callable[[Any], bool] | None = None) -> list[Any]:
        owner_uid = objects.uid_of(self.owner)
        owner_deleting = is_being_deleted(self.owner)
        claimed: list[Any] = []
        errors: list[BaseException] = []
        for obj in candidates:
            ref = objects.controller_ref(obj)
            matches = self.selector.matches(objects.labels_of(obj))
            if ref is not None:
                if objects.field(ref, "uid") != owner_uid:
                    continue
                if matches:
                    claimed.append(obj)
                    continue
                if owner_deleting:
                    continue
                try:
                    await self._release(obj)
                except ApiError as e:
                    errors.append(e)
                continue
            if not matches or owner_deleting or is_being_deleted(obj):
                continue
            if adopt_filter is not None and not adopt_filter(obj):
                continue
            if not await self._owner_can_adopt():
                continue
            try:
                adopted = await self._adopt(obj)
            except ApiError as e:
                errors.append(e)
                continue
            if adopted is not None:
                claimed.append(adopted)
        if errors:
            raise errors[0]
        return claimed

    async def _adopt(self, obj: Any) -> Any | None:
        ref = owner_reference(self.owner, self.owner_api_version, self.owner_kind)

        def edit(refs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
            if any(r.get("controller") for r in refs):
                return None  # someone else adopted it meanwhile
            return [*[r for r in refs if r.get("uid") != ref["uid"]], ref]

        updated = await edit_owner_references(self.client, self.child_kind, obj, edit, also=self.adopt_also)
        if updated is None or objects.field(objects.controller_ref(updated), "uid") != ref["uid"]:
            return None
        return self.client.decode(updated, self.client.resource_type(self.child_kind))

    async def _release(self, obj: Any) -> None:
        owner_uid = objects.uid_of(self.owner)

        def edit(refs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
            kept = [r for r in refs if r.get("uid") != owner_uid]
            return kept if len(kept) != len(refs) else None

        await edit_owner_references(self.client, self.child_kind, obj, edit, also=self.release_also)


def resolve_controller(informer: Informer, obj: Any, kind: str) -> Any | None:
    """The cached controller of ``obj`` of ``kind``, if the reference still names it (same uid)."""
    ref = objects.controller_ref(obj)
    if ref is None or objects.field(ref, "kind") != kind:
        return None
    ns = objects.namespace_of(obj)
    name = objects.field(ref, "name")
    owner = informer.get(f"{ns}/{name}" if ns else name)
    if owner is None or objects.uid_of(owner) != objects.field(ref, "uid"):
        return None
    return owner


def status_dict(obj: Any) -> dict[str, Any]:
    status = getattr(obj, "status", None)
    return status.to_dict() if status is not None else {}


async def write_status(client: Client, obj: Any, status: dict[str, Any]) -> Any:
    """PUT /status with ``status`` unless it already is the object's status. A Conflict (the
    object changed since the cache saw it) propagates: the caller's next sync recomputes."""
    if status_dict(obj) == status:
        return obj
    body = obj.to_dict()
    body["status"] = status
    return await client.update_status(body)
