"""Each kind's Strategy states its rules without a server: what a create resets, whether
generation counts spec changes, how a delete proceeds, which subresources serve."""

from __future__ import annotations

import asyncio

from gpufleet.api.registry import REGISTRY
from gpufleet.apiserver.strategy import NamespaceStrategy, PodStrategy, Strategy, strategy_for
from gpufleet.apiserver.subresources import SUBRESOURCES
from gpufleet.store.base import Store, open_store


def _prepare(s: Strategy, obj: dict) -> None:
    """prepare_for_create over a real (empty, in-memory SQLite) store."""

    async def run() -> None:
        store: Store = open_store("sqlite://:memory:")
        await store.start()
        try:
            await s.prepare_for_create(store, obj)
        finally:
            await store.close()

    asyncio.run(run())


def _rt(key: str):
    rt = REGISTRY.by_key(key)
    assert rt is not None
    return rt


def test_kinds_without_rules_of_their_own_get_the_default():
    s = strategy_for(_rt("deployments.apps"))
    assert type(s) is Strategy
    assert s.generation_tracked
    obj = {"metadata": {}, "status": {"replicas": 3}}
    _prepare(s, obj)
    assert obj == {"metadata": {"generation": 1}}


def test_a_new_pod_is_pending_and_its_generation_is_not_tracked():
    s = strategy_for(_rt("pods"))
    assert isinstance(s, PodStrategy) and not s.generation_tracked
    obj = {"metadata": {}, "status": {"phase": "Running"}}
    _prepare(s, obj)
    assert obj == {"metadata": {}, "status": {"phase": "Pending"}}


def test_a_bound_pod_waits_its_grace_period_an_unbound_one_goes_at_once():
    s = strategy_for(_rt("pods"))
    bound = {"spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 5}, "status": {"phase": "Running"}}
    assert s.graceful_delete(bound, None) == (True, 5)
    assert s.graceful_delete(bound, 0) == (False, 0)
    assert s.graceful_delete({**bound, "status": {"phase": "Succeeded"}}, None) == (False, 5)
    assert s.graceful_delete({"spec": {}}, None) == (False, None)


def test_a_node_registers_with_its_status():
    s = strategy_for(_rt("nodes"))
    obj = {"metadata": {}, "status": {"capacity": {"nvidia.com/gpu": "8"}}}
    _prepare(s, obj)
    assert obj["status"] == {"capacity": {"nvidia.com/gpu": "8"}}
    new = {"status": {"phase": "x"}}
    s.keep_status(new, {"status": {"phase": "y"}})
    assert new == {"status": {"phase": "x"}}  # a PUT of a Node may carry status


def test_a_deleted_namespace_stays_until_its_spec_finalizers_are_done():
    s = strategy_for(_rt("namespaces"))
    assert isinstance(s, NamespaceStrategy) and s.held_until_finalized
    held = {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"finalizers": ["kubernetes"]}}
    assert not s.ready_to_delete(held)
    assert s.ready_to_delete({**held, "spec": {}})
    new: dict = {}
    s.mark_terminating(new, {"status": {"phase": "Active"}})
    assert new["status"] == {"phase": "Terminating"}


def test_a_service_gets_a_cluster_ip_that_an_update_keeps():
    s = strategy_for(_rt("services"))
    obj = {"metadata": {}, "spec": {"ports": [{"port": 80}]}}
    _prepare(s, obj)
    ip = obj["spec"]["clusterIP"]
    assert ip.startswith("10.") and obj["spec"]["clusterIPs"] == [ip]
    new = {"spec": {"ports": [{"port": 81}]}}
    s.prepare_for_update(new, obj)
    assert new["spec"]["clusterIP"] == ip
    external = {"metadata": {}, "spec": {"type": "ExternalName"}}
    _prepare(s, external)
    assert "clusterIP" not in external["spec"]


def test_events_expire_other_kinds_stay():
    assert strategy_for(_rt("events")).ttl(60.0) == 60.0
    assert strategy_for(_rt("configmaps")).ttl(60.0) is None


def test_generation_counts_spec_changes_not_status_ones():
    s = strategy_for(_rt("deployments.apps"))
    current = {"metadata": {"generation": 2}, "spec": {"replicas": 1}, "status": {}}
    same_spec = {"metadata": {"generation": 2}, "spec": {"replicas": 1}, "status": {"replicas": 1}}
    s.update_generation(same_spec, current, "")
    assert same_spec["metadata"]["generation"] == 2
    scaled = {"metadata": {"generation": 2}, "spec": {"replicas": 3}}
    s.update_generation(scaled, current, "")
    assert scaled["metadata"]["generation"] == 3


def test_every_subresource_a_kind_lists_has_an_object_serving_it():
    for rt in REGISTRY.all():
        for sub in rt.subresources:
            assert sub in SUBRESOURCES, f"{rt.key}/{sub}"
