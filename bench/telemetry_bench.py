"""What the API server's request metrics and audit log cost per request.

One in-process ApiServer on SQLite (a temporary file); GETs of one ConfigMap and creates of
ConfigMaps through ``ApiServer.handle``, in interleaved rounds of four setups:

- bare: no metrics (the telemetry hooks and the store wrapper replaced by no-ops)
- metrics: as shipped, audit off (the default)
- audit Metadata: every request logged at Metadata
- audit RequestResponse: every request logged with its bodies

Prints the median per-request time of each and its ratio to bare. Run:

    .venv/bin/python bench/telemetry_bench.py [--requests 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import orjson

from gpufleet.apiserver.audit import AuditLog, Auditor, parse_policy
from gpufleet.apiserver.server import ApiServer
from gpufleet.apiserver.telemetry import Telemetry
from gpufleet.store.base import open_store
from gpufleet.utils.http import RawRequest, RawResponse


class _Bare(Telemetry):
    def begin(self, req: RawRequest):  # type: ignore[override]
        return None

    def authenticated(self, rec, info, user) -> None:  # type: ignore[override]
        pass

    def finish(self, rec, resp: RawResponse) -> RawResponse:  # type: ignore[override]
        return resp


def _policy(level: str):
    return parse_policy({"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                         "rules": [{"level": level, "omitStages": ["RequestReceived"]}]})


async def _run(api: ApiServer, n: int, kind: str, seq: list[int]) -> float:
    get = RawRequest("GET", "/api/v1/namespaces/default/configmaps/bench", headers={"user-agent": "bench"})
    start = time.perf_counter()
    for _ in range(n):
        if kind == "get":
            resp = await api.handle(get)
        else:
            seq[0] += 1
            body = orjson.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": f"c{seq[0]}"}, "data": {"k": "v" * 200}})
            resp = await api.handle(RawRequest("POST", "/api/v1/namespaces/default/configmaps",
                                               headers={"content-type": "application/json"}, body=body))
        assert resp.status in (200, 201), resp.body
    return (time.perf_counter() - start) / n * 1e6


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="telemetry-bench-"))
    store = open_store(f"sqlite:///{tmp / 'state.db'}")
    await store.start()
    api = ApiServer(store)
    await api.start()
    await api.handle(RawRequest("POST", "/api/v1/namespaces/default/configmaps", body=orjson.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bench"}, "data": {"k": "v"}})))
    shipped, wrapped = api.telemetry, api.store
    bare = _Bare(api)
    logs = {level: AuditLog(str(tmp / f"audit-{level}.log")) for level in ("Metadata", "RequestResponse")}
    setups = {"bare": None, "metrics": None, "audit Metadata": "Metadata",
              "audit RequestResponse": "RequestResponse"}
    results: dict[tuple[str, str], list[float]] = {}
    seq = [0]
    for _ in range(args.rounds):
        for name, level in setups.items():
            if name == "bare":
                api.telemetry, api.store = bare, wrapped.wrapped
            else:
                api.telemetry, api.store = shipped, wrapped
                shipped.auditor = Auditor(_policy(level), logs[level]) if level else None
            for kind in ("get", "create"):
                results.setdefault((name, kind), []).append(await _run(api, args.requests, kind, seq))
    for log in logs.values():
        log.close()
    print(f"{args.requests} requests x {args.rounds} rounds, median per request (us), ratio to bare")
    for kind in ("get", "create"):
        base = statistics.median(results[("bare", kind)])
        for name in setups:
            m = statistics.median(results[(name, kind)])
            print(f"  {kind:6} {name:22} {m:8.1f} us  x{m / base:.2f}")
    for level in ("Metadata", "RequestResponse"):
        f = tmp / f"audit-{level}.log"
        lines = f.read_text().count("\n")
        print(f"  audit {level}: {lines} events, {f.stat().st_size / max(lines, 1):.0f} bytes per event")
    await store.close()


if __name__ == "__main__":
    asyncio.run(main())
