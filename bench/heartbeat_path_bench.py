"""What one heartbeat costs the API server, in one process: a node's Lease renewal and its
status heartbeat, each a merge patch through ``ApiServer.handle`` on SQLite (no HTTP, no
controllers), as `gpufleet agent` sends them.

    .venv/bin/python bench/heartbeat_path_bench.py [--requests 2000] [--rounds 5] [--compare-src DIR]

Printed: the median over rounds of the time per request (µs) for each kind, wall-clock
(each request commits alone here, so its fsync is in it) and the process's CPU time, and with
--compare-src the same measured in a second process whose PYTHONPATH is the other source
tree (a `git archive` of the code before a change), rounds interleaved, with the ratio.
Figures are printed, never asserted. See docs/scale.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

KINDS = ("lease renewal", "node status heartbeat")


class _Gpu:
    health = "Healthy"


async def _setup(tmp: Path) -> tuple[Any, Any]:
    from gpufleet.agent.node import NodeSettings, new_lease, new_node, system_info
    from gpufleet.apiserver.server import ApiServer
    from gpufleet.store.base import open_store
    from gpufleet.utils.http import RawRequest

    store = open_store(f"sqlite:///{tmp / 'state.db'}")
    await store.start()
    api = ApiServer(store)
    await api.start()
    settings = NodeSettings(name="sim-0001", address="127.0.0.1", port=10250, cpus=64, memory_bytes=512 << 30,
                            runtime_version="sim://1.0", max_pods=110, ephemeral_storage_bytes=0,
                            info=system_info("sim://1.0"))
    body = new_node(settings, [_Gpu()] * 8, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "", time.time())
    body["metadata"]["annotations"] = {}
    agent = {"content-type": "application/json", "user-agent": "gpufleet-agent/bench"}
    resp = await api.handle(RawRequest("POST", "/api/v1/nodes", headers=agent, body=orjson.dumps(body)))
    assert resp.status == 201, resp.body
    patch = {"content-type": "application/merge-patch+json", "user-agent": "gpufleet-agent/bench"}
    resp = await api.handle(RawRequest("PATCH", "/api/v1/nodes/sim-0001/status", headers=patch,
                                       body=orjson.dumps({"status": body["status"]})))
    assert resp.status == 200, resp.body
    uid = orjson.loads(resp.body)["metadata"]["uid"]
    lease = new_lease("sim-0001", uid, 40, time.time())
    resp = await api.handle(RawRequest("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                                       headers=agent, body=orjson.dumps(lease)))
    assert resp.status == 201, resp.body
    return api, (store, orjson.loads((await api.handle(RawRequest("GET", "/api/v1/nodes/sim-0001"))).body))


async def _round(api: Any, node: dict[str, Any], n: int, kind: str) -> tuple[float, float]:
    from gpufleet.agent.node import NodeSettings, node_status, system_info
    from gpufleet.utils.clock import rfc3339
    from gpufleet.utils.http import RawRequest

    headers = {"content-type": "application/merge-patch+json", "user-agent": "gpufleet-agent/bench"}
    settings = NodeSettings(name="sim-0001", address="127.0.0.1", port=10250, cpus=64, memory_bytes=512 << 30,
                            runtime_version="sim://1.0", max_pods=110, ephemeral_storage_bytes=0,
                            info=system_info("sim://1.0"))
    status = node["status"]
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        if kind == KINDS[0]:
            body = {"spec": {"renewTime": rfc3339(time.time(), micro=True)}}
            req = RawRequest("PATCH", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/sim-0001",
                             headers=headers, body=orjson.dumps(body))
        else:
            status = node_status(settings, [_Gpu()] * 8, status, time.time())
            req = RawRequest("PATCH", "/api/v1/nodes/sim-0001/status", headers=headers,
                             body=orjson.dumps({"status": status}))
        resp = await api.handle(req)
        assert resp.status == 200, resp.body
    return (time.perf_counter() - start) / n * 1e6, (time.process_time() - cpu) / n * 1e6


async def _serve(requests: int) -> None:
    """Child mode: set up, then answer each round asked on stdin with its figures."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-hb-path-") as tmp:
        api, (store, node) = await _setup(Path(tmp))
        loop = asyncio.get_running_loop()
        while (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            out = {kind: await _round(api, node, requests, kind) for kind in KINDS}
            print(json.dumps(out), flush=True)
        await store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compare-src", help="another source tree to measure in the same rounds")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        asyncio.run(_serve(args.requests))
        return
    trees = {"this tree": None}
    if args.compare_src:
        root = Path(args.compare_src).expanduser().resolve()
        if not (root / "gpufleet" / "cli" / "main.py").exists():
            raise SystemExit(f"--compare-src {args.compare_src}: no gpufleet source tree there")
        trees["other"] = str(root)
    procs = {}
    for name, src in trees.items():
        env = dict(os.environ, PYTHONPATH=src) if src else None
        procs[name] = subprocess.Popen([sys.executable, __file__, "--serve", "--requests", str(args.requests)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    results: dict[str, dict[str, list[list[float]]]] = {name: {k: [] for k in KINDS} for name in trees}
    for r in range(args.rounds):
        for name, proc in procs.items():
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"{name}: the measuring process ended (see its error above)")
            for k, v in json.loads(line).items():
                results[name][k].append(v)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    print(f"{args.requests} requests x {args.rounds} rounds, median per request: wall µs (the commit's fsync "
          "included) and CPU µs")
    for k in KINDS:
        for i, what in ((0, "wall"), (1, "CPU")):
            mine = statistics.median(r[i] for r in results["this tree"][k])
            line = f"  {k:<22} {what:<4} this tree {mine:8.1f} µs"
            if "other" in results:
                other = statistics.median(r[i] for r in results["other"][k])
                line += f"   other {other:8.1f} µs   other / this {other / mine:.2f}x"
            print(line)


if __name__ == "__main__":
    main()
