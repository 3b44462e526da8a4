"""SchedulerCache: events in, assumptions, expiry, and incremental snapshots."""

from __future__ import annotations

from sched_factories import make_node, make_pod, pod_info

from gpufleet.scheduler.cache import SchedulerCache
from gpufleet.scheduler.snapshot import PodInfo, Snapshot
from gpufleet.utils.clock import FakeClock


def cache_with(*names: str, gpus: int = 8, ttl: float | None = 30.0) -> tuple[SchedulerCache, FakeClock]:
    clock = FakeClock()
    cache = SchedulerCache(clock=clock, ttl=ttl)
    for name in names:
        cache.add_node(make_node(name, gpus=gpus))
    return cache, clock


def bound(pod, node: str, *indices: int):
    """The pod as the informer delivers it once bound."""
    data = pod.to_dict()
    data["spec"]["nodeName"] = node
    if indices:
        data["metadata"].setdefault("annotations", {})["gpufleet.io/gpu-indices"] = ",".join(
            map(str, indices)
        )
    return type(pod).model_validate(data)


class TestEvents:
    def test_bound_pods_are_accounted(self):
        cache, _ = cache_with("a")
        cache.add_pod(make_pod("x", gpus=2, node_name="a", gpu_indices=(0, 1)))
        node = cache.get_node("a")
        assert node.req_gpus == 2 and node.free_gpus[""] == set(range(2, 8))

    def test_pending_pods_are_not(self):
        cache, _ = cache_with("a")
        cache.add_pod(make_pod("x", gpus=2))
        assert cache.pod_count == 0

    def test_finished_pods_free_their_resources(self):
        cache, _ = cache_with("a")
        pod = make_pod("x", gpus=2, node_name="a", gpu_indices=(0, 1))
        cache.add_pod(pod)
        done = type(pod).model_validate({**pod.to_dict(), "status": {"phase": "Succeeded"}})
        cache.update_pod(pod, done)
        assert cache.get_node("a").req_gpus == 0 and cache.pod_count == 0

    def test_pod_before_its_node(self):
        cache, _ = cache_with()
        cache.add_pod(make_pod("x", gpus=2, node_name="late", gpu_indices=(0, 1)))
        assert cache.node_count == 0 and len(cache.snapshot()) == 0
        cache.add_node(make_node("late", gpus=8))
        node = cache.get_node("late")
        assert node.req_gpus == 2 and node.free_gpus[""] == set(range(2, 8))

    def test_removed_node_with_pods_leaves_the_snapshot(self):
        cache, _ = cache_with("a", "b")
        pod = make_pod("x", node_name="a")
        cache.add_pod(pod)
        cache.remove_node(make_node("a"))
        assert [n.name for n in cache.snapshot()] == ["b"]
        cache.remove_pod(pod)
        assert cache.get_node("a") is None


class TestAssumptions:
    def test_assume_then_confirm(self):
        cache, _ = cache_with("a")
        pending = make_pod("x", gpus=2)
        cache.assume_pod(PodInfo(pending), "a", (3, 4))
        assert cache.is_assumed(pending)
        assert cache.get_node("a").free_gpus[""] == {0, 1, 2, 5, 6, 7}
        cache.add_pod(bound(pending, "a", 3, 4))
        assert not cache.is_assumed(pending)
        assert cache.get_node("a").req_gpus == 2 and cache.pod_count == 1

    def test_forget_gives_everything_back(self):
        cache, _ = cache_with("a")
        info = pod_info("x", gpus=2)
        cache.assume_pod(info, "a", (0, 1))
        cache.forget_pod(info)
        node = cache.get_node("a")
        assert (node.req_gpus, node.num_pods, node.free_gpus[""]) == (0, 0, set(range(8)))
        cache.forget_pod(info)  # idempotent

    def test_forget_leaves_a_confirmed_pod(self):
        cache, _ = cache_with("a")
        pending = make_pod("x", gpus=1)
        cache.assume_pod(PodInfo(pending), "a", (0,))
        cache.add_pod(bound(pending, "a", 0))
        cache.forget_pod(PodInfo(pending))
        assert cache.get_node("a").req_gpus == 1

    def test_expiry_only_after_binding_finished(self):
        cache, clock = cache_with("a", ttl=30.0)
        info = pod_info("x", gpus=1)
        cache.assume_pod(info, "a", (0,))
        clock.advance(100)
        assert cache.cleanup_expired() == []  # binding still in flight
        cache.finish_binding(info)
        clock.advance(29)
        assert cache.cleanup_expired() == []
        clock.advance(2)
        assert [p.key for p in cache.cleanup_expired()] == ["default/x"]
        assert cache.get_node("a").req_gpus == 0 and not cache.is_assumed(info)

    def test_no_ttl_means_no_expiry(self):
        cache, clock = cache_with("a", ttl=None)
        info = pod_info("x")
        cache.assume_pod(info, "a")
        cache.finish_binding(info)
        clock.advance(10_000)
        assert cache.cleanup_expired() == []

    def test_deleting_an_assumed_pod(self):
        cache, _ = cache_with("a")
        pending = make_pod("x", gpus=1)
        cache.assume_pod(PodInfo(pending), "a", (0,))
        cache.remove_pod(pending)
        assert not cache.is_assumed(pending) and cache.get_node("a").req_gpus == 0

    def test_bound_elsewhere_than_assumed(self):
        cache, _ = cache_with("a", "b")
        pending = make_pod("x", gpus=1)
        cache.assume_pod(PodInfo(pending), "a", (0,))
        cache.add_pod(bound(pending, "b", 5))
        assert cache.get_node("a").req_gpus == 0
        assert cache.get_node("b").req_gpus == 1 and 5 not in cache.get_node("b").free_gpus[""]


class TestSnapshots:
    def test_only_changed_nodes_are_copied(self):
        cache, _ = cache_with("a", "b", "c")
        snapshot = cache.snapshot()
        before = {n.name: n for n in snapshot}
        cache.assume_pod(pod_info("x", gpus=1), "b", (0,))
        cache.update_snapshot(snapshot)
        after = {n.name: n for n in snapshot}
        assert after["a"] is before["a"] and after["c"] is before["c"]
        assert after["b"] is not before["b"] and after["b"].req_gpus == 1
        assert [n.name for n in snapshot] == ["a", "b", "c"]

    def test_snapshot_is_private(self):
        cache, _ = cache_with("a")
        snapshot = cache.snapshot()
        snapshot.add_pod(pod_info("what-if", gpus=4), "a", (0, 1, 2, 3))
        assert cache.get_node("a").req_gpus == 0
        # The what-if is undone on the next refresh.
        cache.update_snapshot(snapshot)
        assert snapshot.get("a").req_gpus == 0

    def test_nodes_added_and_removed(self):
        cache, _ = cache_with("b", "a")
        snapshot = cache.snapshot()
        assert [n.name for n in snapshot] == ["a", "b"]
        cache.add_node(make_node("c"))
        cache.remove_node(make_node("a"))
        cache.update_snapshot(snapshot)
        assert [n.name for n in snapshot] == ["b", "c"]

    def test_two_snapshots_stay_independent(self):
        cache, _ = cache_with("a", "b")
        one, two = cache.snapshot(), Snapshot()
        cache.assume_pod(pod_info("x", gpus=1), "a", (0,))
        cache.update_snapshot(one)
        cache.update_snapshot(two)
        assert one.get("a").req_gpus == two.get("a").req_gpus == 1
        assert one.get("a") is not two.get("a")
