"""The Ray half of the gang-scheduling benchmark (bench/gang_bench.py runs it).

Runs inside Ray's own virtual environment, never the project's, and imports nothing of
gpufleet: Ray is a benchmark peer, not a dependency.

    <ray venv>/bin/python bench/ray_peer.py [--runs 3] [--nodes 8] [--gpus-per-node 8]

A local `ray.cluster_utils.Cluster`: a head node holding no GPUs (GCS and the driver's
raylet, as gpufleet's control plane) and --nodes worker nodes with num_gpus=--gpus-per-node
each, 1 CPU and a small object store per node. Per run, on the same cluster:

    bound    placement_group(N bundles of {"GPU": 1}, strategy) -> .ready() answered
    running  N actors (num_gpus=1, num_cpus=0), one per bundle -> every actor answered a ping

Both are measured from just before placement_group() is called. Between runs the actors
are killed and the group removed, and the next run starts only once every GPU is free
again, so each run starts N fresh worker processes. The cluster's start-up is timed on its
own and kept out of the figures. Prints one JSON object on stdout (with --serve: one JSON line
per event, runs on request, so the caller can interleave them with its own); progress goes
to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.placement_group import placement_group, remove_placement_group  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

perf = time.perf_counter
MiB = 1024 * 1024


def log(msg: str) -> None:
    print(f"[ray] {msg}", file=sys.stderr, flush=True)


@ray.remote
class Member:
    """One gang member: says where it landed and which GPU it was given."""

    def ping(self) -> tuple[str, str]:
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES", "")


def start_cluster(nodes: int, gpus_per_node: int, object_store_mib: int) -> Cluster:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False,
                        "object_store_memory": object_store_mib * MiB},
    )
    for _ in range(nodes):
        cluster.add_node(num_cpus=1, num_gpus=gpus_per_node, object_store_memory=object_store_mib * MiB)
    cluster.wait_for_nodes(timeout=120)
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    return cluster


def wait_gpus_free(total: int, within: float = 120) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if ray.available_resources().get("GPU", 0) >= total:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the GPUs of the previous run were not free again within {within:.0f} s")


def one_run(size: int, strategy: str, timeout: float) -> dict[str, object]:
    t0 = perf()
    pg = placement_group([{"GPU": 1}] * size, strategy=strategy)
    ray.get(pg.ready(), timeout=timeout)
    t_bound = perf() - t0
    actors = [
        Member.options(
            num_gpus=1, num_cpus=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=i),
        ).remote()
        for i in range(size)
    ]
    answers = ray.get([a.ping.remote() for a in actors], timeout=timeout)
    t_running = perf() - t0
    placed = {(node, gpu) for node, gpu in answers}
    result = {
        "bound_s": t_bound,
        "running_s": t_running,
        "nodes_used": len({node for node, _ in answers}),
        "distinct_gpus": len(placed),
    }
    for a in actors:
        ray.kill(a)
    remove_placement_group(pg)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--serve", action="store_true",
                   help="after start-up print a 'ready' JSON line, then do one run per 'run' line read "
                        "on stdin (one JSON line each) until 'quit' or end of input")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--strategy", default="PACK", choices=["PACK", "SPREAD"])
    p.add_argument("--object-store-mib", type=int, default=100,
                   help="object store per node (Ray's floor is 75 MiB)")
    p.add_argument("--timeout", type=float, default=300, help="seconds one run may take")
    args = p.parse_args(argv)
    size = args.nodes * args.gpus_per_node
    # SIGTERM (the caller stopping, or dying) unwinds like Ctrl-C, so the cluster is shut down.
    signal.signal(signal.SIGTERM, _raise_interrupt)

    log(f"starting a cluster of 1 head + {args.nodes} nodes x {args.gpus_per_node} GPUs")
    t = perf()
    cluster = start_cluster(args.nodes, args.gpus_per_node, args.object_store_mib)
    startup = perf() - t
    info = {
        "ray_version": ray.__version__,
        "python": platform.python_version(),
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "strategy": args.strategy,
        "cluster_startup_s": startup,
    }
    runs: list[dict[str, object]] = []
    try:
        total = ray.cluster_resources().get("GPU", 0)
        if total < size:
            raise RuntimeError(f"the cluster has {total:g} GPUs, the gang wants {size}")

        def run() -> dict[str, object]:
            wait_gpus_free(size)
            log(f"run {len(runs) + 1}: {size} bundles {args.strategy}, {size} actors")
            runs.append(one_run(size, args.strategy, args.timeout))
            log(f"  bound {runs[-1]['bound_s']:.3f} s, running {runs[-1]['running_s']:.3f} s")
            return runs[-1]

        if args.serve:
            emit({"event": "ready", **info})
            for line in sys.stdin:
                command = line.strip()
                if command == "quit":
                    break
                if command == "run":
                    emit({"event": "run", **run()})
                elif command:
                    emit({"event": "error", "message": f"unknown command {command!r}: run or quit"})
        else:
            for _ in range(args.runs):
                run()
    finally:
        t = perf()
        ray.shutdown()
        cluster.shutdown()
        log(f"cluster stopped in {perf() - t:.1f} s")
    if args.serve:
        emit({"event": "stopped"})
    else:
        emit({**info, "runs": runs})
    return 0


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def emit(obj: dict[str, object]) -> None:
    print(json.dumps(obj), flush=True)


if __name__ == "__main__":
    sys.exit(main())
