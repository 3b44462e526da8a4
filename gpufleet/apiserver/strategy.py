"""What each kind adds to the generic create, update and delete: kube-apiserver's strategies.

The generic registry (genericregistry.py) does what every kind shares: names, system
metadata, decoding, defaulting, admission and the store. A kind's Strategy holds the rest in
one place: whether a create may set status, whether metadata.generation counts spec changes,
what a create or an update prepares (a Service's cluster IP), how a delete proceeds (a bound
Pod's grace period, a Namespace's finalizers), how long the store keeps the object, the
validation hook and the table. ``strategy_for(rt)`` gives the one for a kind; a kind without
its own gets the default.

A new kind with rules of its own: subclass Strategy, override what differs, and list it in
``_STRATEGIES`` under its (group, kind).
"""

from __future__ import annotations

import ipaddress
import secrets
from typing import Any

from gpufleet.api import validation as api_validation
from gpufleet.api.batch import generate_job_selector
from gpufleet.api.registry import ResourceType
from gpufleet.apiserver import tables
from gpufleet.apiserver.errors import ApiException
from gpufleet.store import base as store_base


class Strategy:
    """The default: status is the status subresource's alone and generation counts spec changes
    (for kinds that have a status subresource), a delete waits only for finalizers."""

    # A create may set status (otherwise it is reset, as the status subresource owns it).
    status_on_create = False
    # metadata.generation counts changes outside metadata and status.
    tracks_generation = True
    # A PUT of the main resource may change status too.
    status_writable_on_update = False
    # An immediate delete answers the deleted object rather than a Success Status.
    returns_object_on_delete = False
    # A delete marks the object terminating and keeps it until its spec.finalizers are done.
    held_until_finalized = False
    # A PATCH may be a strategic merge patch (kinds with Go types; not custom resources).
    strategic_merge = True
    # Paths of metav1.Time leaves (None: any list index) an agent moves at every heartbeat: an
    # update that changes nothing else skips decoding and validating the unchanged rest
    # (apiserver/heartbeat.py).
    heartbeat_fields: tuple[tuple[str | None, ...], ...] = ()

    def __init__(self, rt: ResourceType) -> None:
        self.rt = rt

    # ------------------------------------------------------------------ facts

    def has_subresource(self, name: str) -> bool:
        return name in self.rt.subresources

    @property
    def has_status(self) -> bool:
        return self.has_subresource("status")

    @property
    def generation_tracked(self) -> bool:
        return self.tracks_generation and self.has_status

    def ttl(self, event_ttl: float) -> float | None:
        """Seconds the store keeps a new object (None: until deleted)."""
        return None

    # ------------------------------------------------------------------ create & update

    def reset_status(self, obj: dict[str, Any]) -> None:
        """Status on create, where the client may not set it."""
        if self.has_status and not self.status_on_create:
            obj.pop("status", None)

    async def prepare_for_create(self, store: store_base.Store, obj: dict[str, Any]) -> None:
        """System fields a create sets, before the object is decoded."""
        if self.generation_tracked:
            obj["metadata"]["generation"] = 1
        self.reset_status(obj)

    def prepare_for_update(self, new: dict[str, Any], old: dict[str, Any]) -> None:
        """Fields an update keeps or derives from the stored object, before decoding."""

    def keep_status(self, new: dict[str, Any], current: dict[str, Any]) -> None:
        """A PUT of the main resource keeps the stored status."""
        if self.has_status and not self.status_writable_on_update:
            if "status" in current:
                new["status"] = current["status"]
            else:
                new.pop("status", None)

    def update_generation(self, new: dict[str, Any], current: dict[str, Any], subresource: str) -> None:
        """After admission: a change outside metadata and status bumps metadata.generation."""
        if not self.generation_tracked or subresource == "status":
            return
        before = {k: v for k, v in current.items() if k not in ("metadata", "status")}
        after = {k: v for k, v in new.items() if k not in ("metadata", "status")}
        if before != after:
            new["metadata"]["generation"] = int(current["metadata"].get("generation") or 1) + 1

    def validate(self, model: Any, old_model: Any | None) -> list[Any]:
        """The kind's validation: a list of api.validation errors (empty when valid)."""
        if old_model is None:
            return api_validation.validate_create(model)
        return api_validation.validate_update(model, old_model)

    # ------------------------------------------------------------------ delete

    def graceful_delete(self, current: dict[str, Any], grace: int | None) -> tuple[bool, int | None]:
        """(whether the delete waits for a grace period, the period)."""
        return False, grace

    def mark_terminating(self, new: dict[str, Any], current: dict[str, Any]) -> None:
        """What a held delete records on the object (held_until_finalized kinds)."""

    def ready_to_delete(self, obj: dict[str, Any]) -> bool:
        """A deleted object whose finalizers are all done leaves the store."""
        meta = obj.get("metadata", {})
        return bool(meta.get("deletionTimestamp")) and not meta.get("finalizers")

    # ------------------------------------------------------------------ reads

    def table(self, items: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        """The kind's Table (kubectl get's columns)."""
        return tables.to_table(self.rt, items, **kwargs)


class PodStrategy(Strategy):
    """A new pod is Pending; a bound pod's delete waits its grace period for the node agent;
    its delete answers the pod."""

    tracks_generation = False
    returns_object_on_delete = True

    def reset_status(self, obj: dict[str, Any]) -> None:
        obj["status"] = {"phase": "Pending"}

    def graceful_delete(self, current: dict[str, Any], grace: int | None) -> tuple[bool, int | None]:
        spec = current.get("spec") or {}
        if not spec.get("nodeName"):
            return False, grace
        phase = (current.get("status") or {}).get("phase")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        return grace > 0 and phase not in ("Succeeded", "Failed"), grace


class NamespaceStrategy(Strategy):
    """A delete makes the namespace Terminating; it stays until spec.finalizers are done
    (the namespace controller empties it, then namespaces/{name}/finalize)."""

    tracks_generation = False
    held_until_finalized = True

    def mark_terminating(self, new: dict[str, Any], current: dict[str, Any]) -> None:
        new["status"] = {**(current.get("status") or {}), "phase": "Terminating"}

    def ready_to_delete(self, obj: dict[str, Any]) -> bool:
        return super().ready_to_delete(obj) and not (obj.get("spec") or {}).get("finalizers")


class NodeStrategy(Strategy):
    """The agent registers its Node with the status it found, and a PUT may carry status."""

    tracks_generation = False
    status_on_create = True
    status_writable_on_update = True
    heartbeat_fields = (("status", "conditions", None, "lastHeartbeatTime"),)


class LeaseStrategy(Strategy):
    """Node agents and leader election renew their Leases every few seconds."""

    heartbeat_fields = (("spec", "renewTime"),)


class ServiceStrategy(Strategy):
    """A virtual IP per Service from 10.96.0.0/12, as kube-apiserver's default range; the
    gateway routes by Service name, the address keeps `get svc` and clients honest."""

    tracks_generation = False

    async def prepare_for_create(self, store: store_base.Store, obj: dict[str, Any]) -> None:
        await super().prepare_for_create(store, obj)
        spec = obj.get("spec")
        if not isinstance(spec, dict) or spec.get("type") == "ExternalName" or spec.get("clusterIP"):
            if isinstance(spec, dict) and spec.get("clusterIP") and not spec.get("clusterIPs"):
                spec["clusterIPs"] = [spec["clusterIP"]]
            return
        used = set()
        result = await store.list("services", None)
        for svc in result.items:
            used.add((svc.get("spec") or {}).get("clusterIP"))
        base = int(ipaddress.IPv4Address("10.96.0.0"))
        for _ in range(1000):
            # 10.96.0.1 is the default/kubernetes Service's, as Kubernetes reserves it.
            candidate = str(ipaddress.IPv4Address(base + secrets.randbelow(2**20 - 3) + 2))
            if candidate not in used:
                spec["clusterIP"] = candidate
                spec["clusterIPs"] = [candidate]
                return
        raise ApiException(500, "InternalError", "Internal error occurred: failed to allocate a serviceIP: "
                           "range is full")

    def prepare_for_update(self, new: dict[str, Any], old: dict[str, Any]) -> None:
        # Allocated values survive a PUT that leaves them out, as in Kubernetes.
        if not isinstance(new.get("spec"), dict):
            return
        old_spec = old.get("spec") or {}
        for key in ("clusterIP", "clusterIPs"):
            if not new["spec"].get(key) and old_spec.get(key):
                new["spec"][key] = old_spec[key]


class JobStrategy(Strategy):
    """A new Job gets the selector and pod template labels of its uid (unless manualSelector),
    as kube-apiserver's Job strategy generates them."""

    async def prepare_for_create(self, store: store_base.Store, obj: dict[str, Any]) -> None:
        await super().prepare_for_create(store, obj)
        generate_job_selector(obj)


class EventStrategy(Strategy):
    """Events expire: the store drops them after the server's event TTL."""

    def ttl(self, event_ttl: float) -> float | None:
        return event_ttl


class _UntrackedGeneration(Strategy):
    """Kinds whose spec changes metadata.generation does not count on a real cluster."""

    tracks_generation = False


_STRATEGIES: dict[tuple[str, str], type[Strategy]] = {
    ("", "Pod"): PodStrategy,
    ("", "Namespace"): NamespaceStrategy,
    ("", "Node"): NodeStrategy,
    ("coordination.k8s.io", "Lease"): LeaseStrategy,
    ("", "Service"): ServiceStrategy,
    ("", "Event"): EventStrategy,
    ("batch", "Job"): JobStrategy,
    ("", "ResourceQuota"): _UntrackedGeneration,
    ("", "PersistentVolume"): _UntrackedGeneration,
    ("", "PersistentVolumeClaim"): _UntrackedGeneration,
}


def register_strategy(group: str, kind: str, strategy: type[Strategy]) -> None:
    """Give a kind defined outside this module its Strategy."""
    _STRATEGIES[(group, kind)] = strategy


def strategy_for(rt: ResourceType) -> Strategy:
    """The Strategy of rt's kind (the default one for kinds without rules of their own); a
    kind declared at run time (a custom resource) names its own in ``rt.extra``."""
    own = rt.extra.get("strategy")
    if own is not None:
        return own(rt)
    return _STRATEGIES.get((rt.group, rt.kind), Strategy)(rt)
