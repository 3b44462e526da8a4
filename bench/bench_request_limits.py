"""Request limits of a real `gpufleet up` (TLS, tokens, a node agent joined over HTTPS):

1. server RSS before and after 5 concurrent unauthenticated 100 MB POSTs (it should stay
   flat: nothing of a body is read before authentication, a declared length over
   --max-request-body-bytes is refused from the headers), with a declared length and chunked;
2. /readyz latency (a new TLS connection per probe, as a kubelet probes) idle and while one
   edit token floods the server with 200 concurrent lists and 4 senders of 31 MB bodies
   (tests/e2e/flood_client.py, niced as if on other machines): p50, p99, max and the ratio.

    python bench/bench_request_limits.py [--flood-seconds 10] [--big-bodies 4] [--concurrency 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
FLOOD = ROOT / "tests" / "e2e" / "flood_client.py"
GPUFLEET = [sys.executable, "-m", "gpufleet.cli.main"]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def unauthenticated_post(url: str, ca: str, size: int, chunked: bool) -> str:
    """Streams ``size`` bytes (declared or chunked) without a token until the server answers."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port,
                                                   ssl=ssl.create_default_context(cafile=ca))
    head = ["POST /api/v1/namespaces/default/configmaps HTTP/1.1", f"Host: {parts.netloc}",
            "Content-Type: application/json", "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    chunk = b"x" * (1 << 20)

    async def send() -> None:
        with contextlib.suppress(OSError):
            for _ in range(size // len(chunk)):
                if writer.is_closing():
                    return
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                await writer.drain()

    sender = asyncio.create_task(send())
    try:
        status = (await asyncio.wait_for(reader.readline(), 60)).decode().strip() or "closed"
    except OSError as e:  # cut off while still sending: the answer went with the connection
        status = f"connection reset ({type(e).__name__})"
    finally:
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender
        writer.close()
    return status


def probe(url: str, ca: str, seconds: float, interval: float = 0.05) -> list[float]:
    ctx = ssl.create_default_context(cafile=ca)
    out: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with httpx.Client(base_url=url, verify=ctx, timeout=10) as client:
            t0 = time.perf_counter()
            r = client.get("/readyz")
            out.append(time.perf_counter() - t0)
            assert r.status_code == 200
        time.sleep(interval)
    return sorted(out)


def figures(lat: list[float]) -> dict[str, float]:
    return {"n": len(lat), "p50_ms": statistics.median(lat) * 1000,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, "max_ms": lat[-1] * 1000}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flood-seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--big-bodies", type=int, default=4)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-limits-"))
    env = dict(os.environ, HOME=str(root), PYTHONUNBUFFERED="1")
    env.pop("KUBECONFIG", None)
    state = root / "state"
    from e2e_helpers import wait_for_url

    log = root / "server.log"
    server = subprocess.Popen([*GPUFLEET, "up", "--no-agent", "--gateway-port", "-1", "--port", "0",
                               "--state-dir", str(state)], stdout=subprocess.PIPE, stderr=open(log, "w"),
                              text=True, env=env, start_new_session=True)
    agent = None
    try:
        url = wait_for_url(server, log)
        ca = str(state / "pki" / "ca.crt")
        agent = subprocess.Popen([*GPUFLEET, "agent", "--server", url, "--token-file", str(state / "join-token"),
                                  "--certificate-authority", ca, "--name", "bench-node", "--gpus", "1",
                                  "--runtime", "simulated", "--state-dir", str(root / "agent")],
                                 stdout=open(root / "agent.log", "w"), stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
        admin = yaml.safe_load((state / "kubeconfig").read_text())["users"][0]["user"]["token"]
        with httpx.Client(base_url=url, verify=ssl.create_default_context(cafile=ca),
                          headers={"authorization": f"Bearer {admin}"}) as c:
            c.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": "team-a"}})
        made = subprocess.run([*GPUFLEET, "token", "create", "--namespace", "team-a", "--role", "edit",
                               "--kubeconfig", str(state / "kubeconfig")], capture_output=True, text=True, env=env)
        token = made.stdout.strip()
        time.sleep(2.0)

        before = rss_mib(server.pid)
        for chunked in (False, True):
            statuses = asyncio.run(_five(url, ca, chunked))
            print(f"5 concurrent unauthenticated 100 MB POSTs ({'chunked' if chunked else 'Content-Length'}): "
                  f"{sorted(set(statuses))}")
        after = rss_mib(server.pid)
        print(f"server RSS: before {before:.0f} MiB, after {after:.0f} MiB (+{after - before:.1f} MiB)")

        idle = probe(url, ca, 5.0)
        flood = subprocess.Popen(["nice", "-n", "10", sys.executable, str(FLOOD), "--url", url, "--token", token,
                                  "--ca", ca, "--concurrency", str(args.concurrency), "--seconds",
                                  str(args.flood_seconds), "--big-bodies", str(args.big_bodies)],
                                 stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        loaded = probe(url, ca, args.flood_seconds - 1.5)
        report = json.loads(flood.communicate(timeout=120)[0])
        i, f = figures(idle), figures(loaded)
        print(f"/readyz idle:  n={i['n']} p50={i['p50_ms']:.1f} ms p99={i['p99_ms']:.1f} ms max={i['max_ms']:.1f} ms")
        print(f"/readyz flood: n={f['n']} p50={f['p50_ms']:.1f} ms p99={f['p99_ms']:.1f} ms max={f['max_ms']:.1f} ms")
        print(f"ratio flood/idle: p50 {f['p50_ms'] / i['p50_ms']:.2f}x, p99 {f['p99_ms'] / i['p99_ms']:.2f}x")
        print(f"flood answers: {report['counts']}, errors: {report['errors']}")
        print(f"server RSS after the flood: {rss_mib(server.pid):.0f} MiB")
    finally:
        for proc in (agent, server):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=15)


async def _five(url: str, ca: str, chunked: bool) -> list[str]:
    return await asyncio.gather(*[unauthenticated_post(url, ca, 100 * 1000 * 1000, chunked) for _ in range(5)])


if __name__ == "__main__":
    main()
