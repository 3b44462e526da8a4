"""A terminating Namespace as plain decisions: what it still holds in; the deletes, when to
look again, and the /finalize body out."""

from __future__ import annotations

from typing import Any

from gpufleet.api.k8s import Namespace
from gpufleet.controllers.namespace import (
    FINALIZER,
    decide_conditions,
    decide_contents,
    decide_finalize,
    tally,
)


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


def test_what_remains_is_counted_per_resource_and_finalizer():
    from gpufleet.api.registry import REGISTRY
    from gpufleet.client.discovery import DiscoveredType

    widgets = DiscoveredType("example.com", "v1", "Widget", "widgets", True, "")
    held = {"metadata": {"name": "w", "finalizers": ["example.com/hold", "example.com/other"]}}
    remaining = [(widgets, held), (widgets, {"metadata": {"name": "v"}}),
                 (REGISTRY.by_key("pods"), {"metadata": {"name": "p", "finalizers": ["example.com/hold"]}})]
    assert tally(remaining) == ({"widgets.example.com": 2, "pods.": 1},
                                {"example.com/hold": 2, "example.com/other": 1})


def test_conditions_say_what_is_left_then_that_all_is_done():
    now = "2026-01-01T00:00:00Z"
    first = decide_conditions([], now=now, remaining={"widgets.example.com": 1, "pods.": 2},
                              finalizers={"example.com/hold": 1}, errors=["failed to delete widgets.example.com w"])
    by_type = {c["type"]: c for c in first}
    assert by_type["NamespaceContentRemaining"]["message"] == (
        "Some resources are remaining: pods. has 2 resource instances, widgets.example.com has 1 resource instances")
    assert by_type["NamespaceFinalizersRemaining"]["reason"] == "SomeFinalizersRemain"
    assert by_type["NamespaceDeletionContentFailure"]["message"] == (
        "Failed to delete all resource types, 1 remaining: failed to delete widgets.example.com w")
    assert by_type["NamespaceDeletionDiscoveryFailure"]["status"] == "False"
    # Nothing new: nothing to write.
    assert decide_conditions(first, now="later", remaining={"widgets.example.com": 1, "pods.": 2},
                             finalizers={"example.com/hold": 1},
                             errors=["failed to delete widgets.example.com w"]) is None
    done = {c["type"]: c for c in decide_conditions(first, now="2026-01-01T00:01:00Z")}
    assert done["NamespaceContentRemaining"] == {
        "type": "NamespaceContentRemaining", "status": "False", "reason": "ContentRemoved",
        "message": "All content successfully removed", "lastTransitionTime": "2026-01-01T00:01:00Z"}
    assert done["NamespaceDeletionDiscoveryFailure"]["lastTransitionTime"] == now  # unchanged status


def test_discovery_gives_known_kinds_their_registry_type_and_the_rest_a_plain_one():
    from gpufleet.api.registry import REGISTRY
    from gpufleet.client.discovery import DiscoveredType, parse_aggregated

    doc = {"items": [
        {"metadata": {"name": "apps"}, "versions": [{"version": "v1", "resources": [
            {"resource": "deployments", "responseKind": {"kind": "Deployment"}, "scope": "Namespaced",
             "verbs": ["list"]}]}]},
        {"metadata": {"name": "example.com"}, "versions": [
            {"version": "v2", "resources": [{"resource": "widgets", "responseKind": {"kind": "Widget"},
                                             "scope": "Namespaced", "verbs": ["list", "delete"],
                                             "subresources": [{"subresource": "status"}]}]},
            {"version": "v1", "resources": [{"resource": "widgets", "responseKind": {"kind": "Widget"}},
                                            {"resource": "gadgets", "responseKind": {"kind": "Gadget"},
                                             "scope": "Cluster"}]}]}]}
    deploy, widgets, gadgets = parse_aggregated(doc, REGISTRY)
    assert deploy is REGISTRY.by_key("deployments.apps")
    assert isinstance(widgets, DiscoveredType) and widgets.version == "v2" and widgets.namespaced
    assert widgets.verbs == ("list", "delete") and widgets.subresources == ("status",) and widgets.model is None
    assert (gadgets.version, gadgets.namespaced) == ("v1", False)
