"""What the Node authorizer costs on a node's get of a Secret.

    .venv/bin/python bench/node_authz_bench.py [--pods 0,100,1000,3000] [--gets 300]

A node may get a Secret only when a pod bound to it references it, decided from the store on
each request (gpufleet/apiserver/auth/nodeauthz.py): one read of the pods of the Secret's
namespace. This measures a get of a Secret through the API server's handler (authentication,
authorization, the store; no HTTP) as the node and as an admin (whom the authorizer lets
through at once), with a growing number of pods in that namespace: the first get of a
namespace reads all its pods, later ones only the pod writes since the previous get ("node,
churn": one pod written before each get; "node, first": the authorizer's first decision for
the namespace alone, as after a restart).

Figures are printed, never asserted. Compare the node and admin columns of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.agent.bootstrap import node_token
from gpufleet.apiserver.auth.nodeauthz import NodeAuthorizer
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import Client, LocalTransport

NS = "default"


def pod(name: str, node: str, secret: str = "") -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "python:3.12",
                                 "env": [{"name": "A", "value": "b"}]}
    if secret:
        container["env"].append({"name": "T", "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeName": node, "containers": [container]}}


async def timed_gets(client: Client, name: str, n: int, expect_ok: bool,
                     churn: Client | None = None) -> list[float]:
    out = []
    for i in range(n):
        if churn is not None:
            await churn.patch("pods", "zzz-user", {"metadata": {"labels": {"i": str(i)}}}, NS, raw=True)
        t0 = time.perf_counter()
        resp = await client.raw_request("GET", f"/api/v1/namespaces/{NS}/secrets/{name}", raise_for_status=False)
        out.append((time.perf_counter() - t0) * 1000)
        assert (resp.status == 200) == expect_ok, resp.status
    return out


def fmt(ms: list[float]) -> str:
    ms = sorted(ms)
    return f"{statistics.median(ms):7.2f} {ms[int(len(ms) * 0.99) - 1]:7.2f}"


async def main(sizes: list[int], gets: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cp = ControlPlane(store_url=f"sqlite:///{Path(tmp) / 'db'}", port=0, state_dir=Path(tmp) / "state",
                          run_controllers=False)
        await cp.start()
        try:
            assert cp.api is not None
            api = cp.api

            def connect(token: str | None) -> Client:
                return Client(LocalTransport(api, token=token))

            token = await node_token(connect, cp.join_token, "n1", Path(tmp) / "agent")
            admin, node = connect(cp.admin_token), connect(token)
            for name in ("used", "unused"):
                await admin.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
                                    "data": {"k": "dg=="}}, raw=True)
            await admin.create(pod("zzz-user", "n1", "used"), raw=True)
            print(f"secret get, ms (p50 p99), {gets} gets each; pods in the namespace besides the referencing one")
            print(f"{'pods':>6} | {'admin':>15} | {'node, allowed':>15} | {'node, refused':>15} | "
                  f"{'node, churn':>15} | {'node, first':>11} | node/admin p50")
            made = 0
            for size in sizes:
                while made < size:
                    await admin.create(pod(f"p{made:06d}", f"n{2 + made % 8}"), raw=True)
                    made += 1
                cold = NodeAuthorizer(api.store)  # what a restarted API server does first
                t0 = time.perf_counter()
                assert await cold.references("n1", "secrets", NS, "used")
                first = (time.perf_counter() - t0) * 1000
                a = await timed_gets(admin, "used", gets, True)
                allowed = await timed_gets(node, "used", gets, True)
                refused = await timed_gets(node, "unused", gets, False)
                churned = await timed_gets(node, "used", gets, True, churn=admin)
                print(f"{size:>6} | {fmt(a)} | {fmt(allowed)} | {fmt(refused)} | {fmt(churned)} | {first:11.2f} | "
                      f"{statistics.median(allowed) / statistics.median(a):6.1f}x")
        finally:
            await cp.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", default="0,100,1000,3000")
    parser.add_argument("--gets", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(main([int(x) for x in args.pods.split(",")], args.gets))
