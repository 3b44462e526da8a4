"""A terminating Namespace as plain decisions: what it still holds in; the deletes, when to
look again, and the /finalize body out."""

from __future__ import annotations

from typing import Any

from gpufleet.api.k8s import Namespace
from gpufleet.controllers.namespace import FINALIZER, decide_contents, decide_finalize


def item(name: str, *, deleting: bool = False) -> tuple[str, dict[str, Any]]:
    meta: dict[str, Any] = {"name": name, "namespace": "team"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return "pods", {"metadata": meta}


def test_what_is_left_is_deleted_in_the_background_and_looked_at_again():
    actions = decide_contents("team", [item("a"), item("b", deleting=True)])
    assert [(d.kind, d.name, d.namespace, d.propagation_policy) for d in actions.deletes] == [
        ("pods", "a", "team", "Background")]
    assert actions.requeue_after == 1.0
    waiting = decide_contents("team", [item("b", deleting=True)])
    assert waiting.deletes == [] and waiting.requeue_after == 1.0


def test_an_empty_namespace_is_finalized_without_its_finalizer_only():
    empty = decide_contents("team", [])
    assert empty.empty and empty.requeue_after is None and empty.reason == "Empty"
    ns = Namespace.from_dict({"metadata": {"name": "team", "deletionTimestamp": "2026-01-01T00:00:00Z"},
                              "spec": {"finalizers": [FINALIZER, "example.com/other"]}})
    assert decide_finalize(ns)["spec"]["finalizers"] == ["example.com/other"]
    done = Namespace.from_dict({"metadata": {"name": "team"}, "spec": {"finalizers": ["example.com/other"]}})
    assert decide_finalize(done) is None
