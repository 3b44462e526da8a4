"""Throughput of the scheduling framework and cache alone (no API server, no binding I/O).

Simulates N GPU servers (8 GPUs in two NVLink groups of 4, 64 cores, 512 GiB, 110 pods)
and schedules a stream of pods of mixed shapes one by one, each cycle as the real loop
runs it: refresh the snapshot from the cache, run the framework, assume the pod.

    .venv/bin/python bench/scheduler_bench.py                 # 1,000 and 5,000 nodes, 10,000 pods
    .venv/bin/python bench/scheduler_bench.py --nodes 5000 --pods 2000 --profile
    .venv/bin/python bench/scheduler_bench.py --gangs-only     # only the gang cases

Pod shapes (GPUs / cpu / memory, share of pods): 1/4/32Gi 40%, 2/8/64Gi 30%, 4/16/128Gi
20%, 8/32/256Gi 10% — 2.6 GPUs per pod on average, so 10,000 pods want 26,000 GPUs: the
1,000-node cluster (8,000 GPUs) fills up and the remaining pods are unschedulable (every
node must then be checked to say why), while the 5,000-node cluster (40,000 GPUs) takes all.

Pods arrive already decoded (PodInfo), as the informer hands them over; binding, the
queue and the API are not measured. Cycles stop filtering after percentageOfNodesToScore
of the nodes were found feasible (adaptive: 420 at 1,000 nodes, 500 at 5,000); pass
--percentage 100 to score every node.

Gang cases (PodGroup, every member placed in one cycle or none): one 64-pod gang of
1-GPU members on 8 nodes x 8 GPUs (the whole cluster), and 100 gangs of 8 members x 8 GPUs
on 1,000 nodes (32 nodes per rack); each gang cycle refreshes the snapshot, places the
whole gang (gang.place_gang) and assumes its members. Printed: gangs/s, pods/s, and how
many nodes and racks each gang spans. A last case asks for 150 such gangs, more than the
1,000 nodes hold, so the rejection of whole gangs is measured too.

For scale: the CI floor quoted for kube-scheduler at 5,000 nodes is 680-810 pods/s, from
compiled Go using every core; this is one Python thread.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpufleet.api import k8s  # noqa: E402
from gpufleet.api.gpu import GPU_PRODUCT_LABEL, GPUS_ANNOTATION, RACK_LABEL, ZONE_LABEL  # noqa: E402
from gpufleet.scheduler.cache import SchedulerCache  # noqa: E402
from gpufleet.scheduler.framework import FitError, Framework  # noqa: E402
from gpufleet.scheduler.gang import place_gang  # noqa: E402
from gpufleet.scheduler.profile import Profile  # noqa: E402
from gpufleet.scheduler.snapshot import PodInfo, Snapshot  # noqa: E402

SHAPES = [  # (GPUs, cpu, memory, weight)
    (1, "4", "32Gi", 40),
    (2, "8", "64Gi", 30),
    (4, "16", "128Gi", 20),
    (8, "32", "256Gi", 10),
]

_INVENTORY = (
    "["
    + ",".join(
        f'{{"index": {i}, "uuid": "GPU-{i}", "model": "H100-SXM-80GB", "memoryMiB": 81920, '
        f'"health": "Healthy", "group": "nvlink-{i // 4}"}}'
        for i in range(8)
    )
    + "]"
)


def make_node(i: int) -> k8s.Node:
    allocatable = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "110"}
    return k8s.Node.model_validate(
        {
            "metadata": {
                "name": f"node-{i:05d}",
                "labels": {
                    GPU_PRODUCT_LABEL: "H100-SXM-80GB",
                    ZONE_LABEL: f"zone-{i % 3}",
                    RACK_LABEL: f"rack-{i // 32}",
                },
                "annotations": {GPUS_ANNOTATION: _INVENTORY},
            },
            "status": {"capacity": allocatable, "allocatable": allocatable},
        }
    )


def make_pods(count: int, rng: random.Random) -> list[PodInfo]:
    weights = [w for *_, w in SHAPES]
    pods = []
    for i in range(count):
        gpus, cpu, memory, _ = rng.choices(SHAPES, weights)[0]
        resources = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus)}
        pod = k8s.Pod.model_validate(
            {
                "metadata": {"name": f"pod-{i:05d}", "namespace": "bench", "uid": f"uid-{i}"},
                "spec": {
                    "containers": [
                        {"name": "main", "resources": {"requests": resources, "limits": resources}}
                    ]
                },
            }
        )
        pods.append(PodInfo(pod))
    return pods


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(num_nodes: int, pods: list[PodInfo], profile: Profile, seed: int, use_profiler: bool) -> None:
    cache = SchedulerCache(ttl=None)
    for i in range(num_nodes):
        cache.add_node(make_node(i))
    framework = Framework(profile, rng=random.Random(seed))
    snapshot = Snapshot()
    cache.update_snapshot(snapshot)
    latencies_ok: list[float] = []
    latencies_fail: list[float] = []
    clock = time.perf_counter
    profiler = cProfile.Profile() if use_profiler else None
    if profiler:
        profiler.enable()
    started = clock()
    for pod_info in pods:
        t0 = clock()
        cache.update_snapshot(snapshot)
        result = framework.schedule(pod_info, snapshot)
        if isinstance(result, FitError):
            latencies_fail.append(clock() - t0)
            continue
        cache.assume_pod(pod_info, result.node, result.gpu_indices)
        latencies_ok.append(clock() - t0)
    elapsed = clock() - started
    if profiler:
        profiler.disable()
    all_latencies = latencies_ok + latencies_fail
    used = sum(n.req_gpus for n in snapshot)
    print(
        f"{num_nodes:>6} nodes x 8 GPUs | {len(pods)} pods in {elapsed:6.2f}s = {len(pods) / elapsed:7.0f} pods/s"
        f" | p50 {percentile(all_latencies, 0.5) * 1e3:6.2f} ms  p99 {percentile(all_latencies, 0.99) * 1e3:6.2f} ms"
    )
    if latencies_ok:
        ok_time = sum(latencies_ok)
        print(
            f"{'':>6}   scheduled {len(latencies_ok):>5}: {len(latencies_ok) / ok_time:7.0f} pods/s,"
            f" p50 {percentile(latencies_ok, 0.5) * 1e3:6.2f} ms, p99 {percentile(latencies_ok, 0.99) * 1e3:6.2f} ms"
        )
    if latencies_fail:
        fail_time = sum(latencies_fail)
        print(
            f"{'':>6}   unschedulable {len(latencies_fail):>5}: {len(latencies_fail) / fail_time:7.0f} pods/s,"
            f" p50 {percentile(latencies_fail, 0.5) * 1e3:6.2f} ms, p99 {percentile(latencies_fail, 0.99) * 1e3:6.2f} ms"
        )
    print(f"{'':>6}   GPUs in use: {used} of {num_nodes * 8} ({100 * used / (num_nodes * 8):.1f}%)")
    fully_used = sum(1 for n in snapshot if n.req_gpus == 8)
    print(
        f"{'':>6}   nodes with all 8 GPUs in use: {fully_used}; mean latency {statistics.mean(all_latencies) * 1e3:.2f} ms"
    )
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def make_gang(name: str, count: int, gpus: int) -> list[PodInfo]:
    resources = {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": str(gpus)}
    return [
        PodInfo(
            k8s.Pod.model_validate(
                {
                    "metadata": {
                        "name": f"{name}-{i}",
                        "namespace": "bench",
                        "uid": f"{name}-uid-{i}",
                        "labels": {"scheduling.x-k8s.io/pod-group": name},
                    },
                    "spec": {
                        "containers": [
                            {"name": "main", "resources": {"requests": resources, "limits": resources}}
                        ]
                    },
                }
            )
        )
        for i in range(count)
    ]


def run_gangs(
    num_nodes: int, gangs: int, size: int, gpus: int, profile: Profile, seed: int, repeats: int = 1
) -> None:
    """``repeats`` fresh clusters, each given the same gangs; the median run is printed
    (one gang alone is too short to time once)."""
    runs = [_gang_run(num_nodes, gangs, size, gpus, profile, seed) for _ in range(repeats)]
    elapsed, latencies, placed_gangs, placed_pods, spans = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    print(
        f"{num_nodes:>6} nodes x 8 GPUs | {gangs} gang(s) of {size} x {gpus} GPU in {elapsed:6.3f}s ="
        f" {gangs / elapsed:8.1f} gangs/s, {gangs * size / elapsed:8.0f} pods/s"
        f" | p50 {percentile(latencies, 0.5) * 1e3:7.2f} ms  p99 {percentile(latencies, 0.99) * 1e3:7.2f} ms per gang"
        + (f" (median of {repeats} runs)" if repeats > 1 else "")
    )
    if spans:
        print(
            f"{'':>6}   placed {placed_gangs}/{gangs} gangs ({placed_pods} pods); nodes per gang:"
            f" min {min(s[0] for s in spans)}, max {max(s[0] for s in spans)};"
            f" racks per gang: min {min(s[1] for s in spans)}, max {max(s[1] for s in spans)}"
        )


def _gang_run(
    num_nodes: int, gangs: int, size: int, gpus: int, profile: Profile, seed: int
) -> tuple[float, list[float], int, int, list[tuple[int, int]]]:
    cache = SchedulerCache(ttl=None)
    for i in range(num_nodes):
        cache.add_node(make_node(i))
    framework = Framework(profile, rng=random.Random(seed))
    snapshot = Snapshot()
    cache.update_snapshot(snapshot)
    work = [make_gang(f"gang-{g:03d}", size, gpus) for g in range(gangs)]
    latencies: list[float] = []
    placed_gangs = placed_pods = 0
    spans: list[tuple[int, int]] = []
    clock = time.perf_counter
    started = clock()
    for g, members in enumerate(work):
        t0 = clock()
        cache.update_snapshot(snapshot)
        placement = place_gang(framework, snapshot, f"bench/gang-{g:03d}", members, min_member=size)
        if placement.ok:
            for member, result in placement.placed:
                cache.assume_pod(member, result.node, result.gpu_indices)
            placed_gangs += 1
            placed_pods += len(placement.placed)
            used = placement.nodes_used()
            racks = {snapshot.get(n).labels.get(RACK_LABEL) for n in used}
            spans.append((len(used), len(racks)))
        latencies.append(clock() - t0)
    return clock() - started, latencies, placed_gangs, placed_pods, spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--strategy", default="MostAllocated", choices=["MostAllocated", "LeastAllocated"])
    parser.add_argument(
        "--percentage", type=int, default=0, help="percentageOfNodesToScore (0 = adaptive, 100 = every node)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="print a cProfile summary")
    parser.add_argument("--gangs-only", action="store_true", help="run only the gang cases")
    args = parser.parse_args()
    profile = Profile(scoring_strategy=args.strategy, percentage_of_nodes_to_score=args.percentage)
    print(f"strategy {args.strategy}, percentageOfNodesToScore {args.percentage or 'adaptive'}")
    if not args.gangs_only:
        pods = make_pods(args.pods, random.Random(args.seed))
        for num_nodes in args.nodes:
            run(num_nodes, pods, profile, args.seed, args.profile)
        print(
            "for comparison, kube-scheduler's quoted CI floor: 680-810 pods/s at 5,000 nodes (Go, all cores)"
        )
    print("gangs (all members in one cycle or none):")
    run_gangs(8, 1, 64, 1, profile, args.seed, repeats=21)
    run_gangs(1000, 100, 8, 8, profile, args.seed)
    # More than the cluster holds: the last 25 gangs are rejected whole.
    run_gangs(1000, 150, 8, 8, profile, args.seed)


if __name__ == "__main__":
    main()
