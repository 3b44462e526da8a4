"""Property: however pods arrive, are assumed, confirmed, forgotten or deleted, no node is
over-committed and no GPU index belongs to two pods."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_factories import make_node, make_pod

from gpufleet.scheduler.cache import SchedulerCache
from gpufleet.scheduler.framework import CycleState, FitError, Framework
from gpufleet.scheduler.profile import LEAST_ALLOCATED, MOST_ALLOCATED, Profile
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot
from gpufleet.utils.clock import FakeClock

GI = 1024**3


@st.composite
def nodes(draw):
    count = draw(st.integers(1, 6))
    out = []
    for i in range(count):
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
        groups = None
        unhealthy: tuple[int, ...] = ()
        if gpus and draw(st.booleans()):
            size = draw(st.sampled_from([g for g in (1, 2, 4, 8) if g <= gpus and gpus % g == 0]))
            groups = [size] * (gpus // size)
            unhealthy = tuple(draw(st.sets(st.integers(0, gpus - 1), max_size=2)))
        out.append(
            make_node(
                f"n{i}",
                cpu=str(draw(st.integers(1, 16))),
                memory=f"{draw(st.integers(1, 64))}Gi",
                gpus=gpus,
                pods=draw(st.one_of(st.none(), st.integers(1, 8))),
                gpu_groups=groups,
                unhealthy=unhealthy,
            )
        )
    return out


pod_shapes = st.tuples(
    st.integers(0, 8000),  # cpu millis
    st.integers(0, 16),  # memory GiB
    st.sampled_from([0, 0, 1, 1, 2, 4, 8]),  # GPUs
    st.booleans(),  # same interconnect group required
)

operations = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), pod_shapes),
        st.tuples(st.sampled_from(["confirm", "forget", "delete"]), st.integers(0, 1000)),
    ),
    min_size=1,
    max_size=40,
)


def bound_pod(pod_info: PodInfo):
    data = pod_info.pod.to_dict()
    data["spec"]["nodeName"] = pod_info.node_name
    if pod_info.gpu_indices:
        data["metadata"].setdefault("annotations", {})["gpufleet.io/gpu-indices"] = ",".join(
            map(str, pod_info.gpu_indices)
        )
    return type(pod_info.pod).model_validate(data)


def check(cache: SchedulerCache, placed: dict[str, PodInfo]) -> None:
    for node_info in cache.snapshot():
        pods = [p for p in placed.values() if p.node_name == node_info.name]
        # The incremental accounting agrees with a recount...
        assert sorted(node_info.pods) == sorted(p.key for p in pods)
        assert node_info.req_cpu == sum(p.cpu for p in pods)
        assert node_info.req_memory == sum(p.memory for p in pods)
        assert node_info.req_gpus == sum(p.gpus for p in pods)
        # ...and the recount fits the node.
        assert node_info.req_cpu <= node_info.alloc_cpu
        assert node_info.req_memory <= node_info.alloc_memory
        assert node_info.req_gpus <= node_info.alloc_gpus
        if node_info.alloc_pods is not None:
            assert len(pods) <= node_info.alloc_pods
        taken: list[int] = []
        for p in pods:
            assert len(p.gpu_indices) == p.gpus
            assert set(p.gpu_indices) <= set(node_info.gpu_group_of), "unhealthy or unknown GPU handed out"
            if p.annotations.get("gpufleet.io/gpu-topology") == "same-group" and p.gpu_indices:
                assert len({node_info.gpu_group_of[i] for i in p.gpu_indices}) == 1
            taken.extend(p.gpu_indices)
        assert len(taken) == len(set(taken)), "a GPU index was given to two pods"
        free = set().union(*node_info.free_gpus.values()) if node_info.free_gpus else set()
        assert free.isdisjoint(taken)
        assert free | set(taken) == set(node_info.gpu_group_of)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster=nodes(),
    ops=operations,
    strategy=st.sampled_from([MOST_ALLOCATED, LEAST_ALLOCATED]),
    seed=st.integers(0, 99),
)
def test_no_overcommit_and_no_shared_gpu(cluster, ops, strategy, seed):
    clock = FakeClock()
    cache = SchedulerCache(clock=clock)
    for node in cluster:
        cache.add_node(node)
    framework = Framework(Profile(scoring_strategy=strategy), rng=random.Random(seed))
    snapshot = Snapshot()
    placed: dict[str, PodInfo] = {}
    assumed: set[str] = set()
    for n, (op, arg) in enumerate(ops):
        if op == "schedule":
            cpu, memory, gpus, same_group = arg
            annotations = {"gpufleet.io/gpu-topology": "same-group"} if same_group else None
            pending = PodInfo(
                make_pod(f"p{n}", cpu=f"{cpu}m", memory=f"{memory}Gi", gpus=gpus, annotations=annotations)
            )
            cache.update_snapshot(snapshot)
            result = framework.schedule(pending, snapshot)
            if isinstance(result, FitError):
                continue
            placed[pending.uid] = cache.assume_pod(pending, result.node, result.gpu_indices)
            assumed.add(pending.uid)
        elif placed:
            uid = sorted(placed)[arg % len(placed)]
            pod_info = placed[uid]
            if op == "confirm" and uid in assumed:
                cache.add_pod(bound_pod(pod_info))
                placed[uid] = cache.get_pod(pod_info)
                assumed.discard(uid)
            elif op == "forget" and uid in assumed:
                cache.forget_pod(pod_info)
                del placed[uid]
                assumed.discard(uid)
            elif op == "delete":
                cache.remove_pod(pod_info)
                del placed[uid]
                assumed.discard(uid)
        check(cache, placed)


@st.composite
def pods(draw):
    cpu, memory, gpus, same_group = draw(pod_shapes)
    annotations = {"gpufleet.io/gpu-topology": "same-group"} if same_group else None
    tolerations = [{"key": "gpu", "operator": "Exists"}] if draw(st.booleans()) else None
    return PodInfo(
        make_pod(
            "p",
            cpu=f"{cpu}m",
            memory=f"{memory}Gi",
            gpus=gpus,
            annotations=annotations,
            tolerations=tolerations,
        )
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=nodes(), pod=pods(), load=st.lists(pod_shapes, max_size=8), cordon=st.booleans())
def test_batch_filters_agree_with_filter(cluster, pod, load, cordon):
    """Each plugin's filter_nodes keeps exactly the nodes its filter accepts, in order."""
    node_infos = [NodeInfo(n) for n in cluster]
    if cordon:
        node_infos[0].unschedulable = True
        node_infos[-1].taints = (("gpu", "broken", "NoSchedule"),)
    # Load the nodes, over-committing some on purpose (pods bound by something else).
    for i, (cpu, memory, gpus, _) in enumerate(load):
        node_infos[i % len(node_infos)].add_pod(
            PodInfo(make_pod(f"l{i}", cpu=f"{cpu}m", memory=f"{memory}Gi", gpus=gpus, node_name="x"))
        )
    framework = Framework()
    state = CycleState()
    snapshot = Snapshot(node_infos)
    for plugin in framework.pre_filter:
        plugin.pre_filter(state, pod, snapshot)
    for plugin in framework.filters:
        batch = getattr(plugin, "filter_nodes", None)
        if batch is None:
            continue
        expected = [n for n in node_infos if not plugin.filter(state, pod, n).code]
        assert batch(state, pod, node_infos) == expected, plugin.name


gangs = st.lists(
    st.tuples(
        st.integers(1, 6),  # members
        st.sampled_from([0, 1, 2, 4, 8]),  # GPUs per member
        st.integers(1, 6),  # minMember (capped at the members)
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=nodes(), gangs=gangs, seed=st.integers(0, 99))
def test_gangs_are_placed_whole_or_not_at_all_without_overcommit(cluster, gangs, seed):
    from gpufleet.scheduler.gang import place_gang

    cache = SchedulerCache(clock=FakeClock())
    for node in cluster:
        cache.add_node(node)
    framework = Framework(Profile(), rng=random.Random(seed))
    snapshot = Snapshot()
    placed: dict[str, PodInfo] = {}
    for g, (count, gpus, min_member) in enumerate(gangs):
        min_member = min(min_member, count)
        members = [
            PodInfo(
                make_pod(
                    f"g{g}-{i}",
                    cpu="500m",
                    memory="1Gi",
                    gpus=gpus,
                    labels={"scheduling.x-k8s.io/pod-group": f"g{g}"},
                )
            )
            for i in range(count)
        ]
        cache.update_snapshot(snapshot)
        before = {n.name: n.req_gpus for n in snapshot}
        placement = place_gang(framework, snapshot, f"default/g{g}", members, min_member=min_member)
        if not placement.ok:
            # Nothing of a rejected gang stays anywhere.
            assert {n.name: n.req_gpus for n in snapshot} == before
            assert not any(p.pod_group == f"default/g{g}" for n in snapshot for p in n.pods.values())
            continue
        assert len(placement.placed) >= min_member
        for member, result in placement.placed:
            placed[member.uid] = cache.assume_pod(member, result.node, result.gpu_indices)
        check(cache, placed)
