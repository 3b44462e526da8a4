"""Server memory per TLS connection: a real `gpufleet server` (SQLite, controllers on) and N
clients, each on a connection of its own over HTTPS holding a watch open, as node agents hold
theirs (an agent has about three: its pods' watch, its Lease renewals, its status). The server
process's RSS before the connections, with them open, and the difference per connection.

    .venv/bin/python bench/tls_connections_bench.py [--connections 300] [--compare-src DIR]

`--compare-src` runs the same against a server from another tree, one after the other.
Figures are printed, never asserted. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster_bench import Cluster, source_env  # noqa: E402

from gpufleet.client.api import Client  # noqa: E402
from gpufleet.client.kubeconfig import transport_from_kubeconfig  # noqa: E402

MIB = 1 << 20


async def _hold(client: Client) -> None:
    """A watch held open until the bench cancels it."""
    async for _ in client.watch("pods", namespace="default", timeout_seconds=3600, raw=True):
        pass


async def measure(src: str | None, connections: int, settle: float) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-tls-"))
    c = Cluster(root)
    c.env = source_env(src)
    clients: list[Client] = []
    tasks: list[asyncio.Task] = []
    try:
        c.start_server()
        assert c.server is not None
        server = psutil.Process(c.server.pid)
        await asyncio.sleep(settle)
        before = server.memory_info().rss
        kubeconfig = root / "server" / "kubeconfig"
        for _ in range(connections):
            client = Client(transport_from_kubeconfig(kubeconfig))
            clients.append(client)
            tasks.append(asyncio.create_task(_hold(client)))
        # Each watch is open once the server has answered it: wait for the connections to show.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            established = sum(1 for conn in server.net_connections(kind="tcp") if conn.status == "ESTABLISHED")
            if established >= connections:
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(settle)
        after = server.memory_info().rss
        return {"before": before / MIB, "after": after / MIB, "established": established,
                "per_connection_kib": (after - before) / 1024 / max(1, connections)}
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()
        c.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=300)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds to wait before each reading")
    ap.add_argument("--compare-src", default=None, metavar="DIR")
    args = ap.parse_args()
    trees = [("this tree", None)] + ([(args.compare_src, args.compare_src)] if args.compare_src else [])
    rows = []
    for label, src in trees:
        print(f"measuring {label} ...", file=sys.stderr, flush=True)
        rows.append((label, asyncio.run(measure(src, args.connections, args.settle))))
    print(f"server RSS, MiB, before and with {args.connections} TLS connections each holding a watch")
    print(f"{'tree':<40} {'before':>8} {'with':>8} {'open':>6} {'KiB per connection':>20}")
    for label, r in rows:
        print(f"{label[:40]:<40} {r['before']:8.1f} {r['after']:8.1f} {r['established']:6d} "
              f"{r['per_connection_kib']:20.1f}")


if __name__ == "__main__":
    main()
