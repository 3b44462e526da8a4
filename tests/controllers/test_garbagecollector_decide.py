"""The garbage collector's decisions, as plain functions: an object and the state of its
owners (or an owner being deleted and its dependents) in; what to do with it out."""

from __future__ import annotations

from typing import Any

from gpufleet.api.registry import ResourceType
from gpufleet.controllers.garbagecollector import (
    DANGLING,
    FOREGROUND,
    ORPHAN,
    SOLID,
    WAITING,
    decide_dependent,
    decide_owner,
)

PODS: Any = ResourceType  # only carried through, never looked at


def obj(uid: str, *, owners: tuple[str, ...] = (), block: bool = False, finalizers: list[str] | None = None,
        deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": uid, "namespace": "default", "uid": uid}
    if owners:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": o, "uid": o,
                                    **({"blockOwnerDeletion": True} if block else {})} for o in owners]
    if finalizers:
        meta["finalizers"] = finalizers
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


def test_an_object_whose_owners_are_all_gone_is_deleted_with_the_policy_its_finalizers_ask_for():
    assert decide_dependent(obj("p", owners=("rs",)), [("rs", DANGLING)], False).delete == "Background"
    orphaning = obj("p", owners=("rs",), finalizers=[ORPHAN])
    assert decide_dependent(orphaning, [("rs", DANGLING)], False).delete == "Orphan"
    fg = obj("p", owners=("rs",), finalizers=[FOREGROUND])
    assert decide_dependent(fg, [("rs", DANGLING)], False).delete == "Foreground"


def test_a_live_owner_keeps_the_object_and_only_gone_owners_lose_their_references():
    d = decide_dependent(obj("p", owners=("a", "b", "c")), [("a", SOLID), ("b", DANGLING), ("c", WAITING)], False)
    assert (d.reason, d.delete, d.drop_refs) == ("OwnersLeft", None, {"b", "c"})
    d = decide_dependent(obj("p", owners=("a",)), [("a", SOLID)], False)
    assert (d.reason, d.delete, d.drop_refs) == ("Owned", None, frozenset())
    # An owner of a kind unknown here counts as alive.
    assert decide_dependent(obj("p", owners=("x",)), [("x", None)], False).delete is None


def test_a_dependent_of_a_foreground_deletion_with_dependents_of_its_own_goes_in_the_foreground():
    d = decide_dependent(obj("rs", owners=("dep",)), [("dep", WAITING)], True)
    assert (d.reason, d.delete) == ("OwnerWaiting", "Foreground")
    assert decide_dependent(obj("rs", owners=("dep",)), [("dep", WAITING)], False).delete == "Background"


def test_a_foreground_owner_waits_for_blocking_dependents_and_enqueues_those_not_being_deleted():
    owner = obj("rs", finalizers=[FOREGROUND], deleting=True)
    deps = [(PODS, obj("p1", owners=("rs",), block=True)), (PODS, obj("p2", owners=("rs",), deleting=True))]
    d = decide_owner(owner, deps)
    assert (d.reason, d.finalizer, d.enqueue) == ("Foreground", None, ["p1"])
    free = decide_owner(owner, [(PODS, obj("p3", owners=("rs",)))])
    assert (free.reason, free.finalizer, free.enqueue) == ("ForegroundDone", FOREGROUND, ["p3"])


def test_an_orphaning_owner_releases_every_dependent_then_its_finalizer():
    owner = obj("rs", finalizers=[ORPHAN, FOREGROUND], deleting=True)
    deps = [(PODS, obj("p1", owners=("rs",)))]
    d = decide_owner(owner, deps)
    assert (d.reason, d.finalizer, d.orphan) == ("Orphan", ORPHAN, deps)
    assert decide_owner(obj("rs", deleting=True), deps).reason == "Deleting"
