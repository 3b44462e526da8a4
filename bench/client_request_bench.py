"""What one request costs gpufleet's HTTP client stack (httpx over httpcore), as every agent,
controller and scheduler request pays it.

    .venv/bin/python bench/client_request_bench.py [--requests 2000]

A local aiohttp server answering "ok" on loopback and one httpx.AsyncClient keeping its
connection alive, in one process: wall and CPU microseconds per request (client and server
together), and how many times httpcore asked which event loop runs (``current_async_library``,
which costs a failed import each time when sniffio is not installed). Printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import httpx
from aiohttp import web


def _count_library_lookups() -> list[int]:
    import httpcore._synchronization  # noqa: F401  (imported lazily by httpcore)

    calls = [0]
    for module in list(sys.modules.values()):
        real = getattr(module, "current_async_library", None)
        if getattr(module, "__name__", "").startswith("httpcore") and real is not None:
            def spy(real=real):
                calls[0] += 1
                return real()
            module.current_async_library = spy
    return calls


async def main(requests: int) -> None:
    app = web.Application()
    app.router.add_get("/", lambda r: web.Response(text="ok"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    calls = _count_library_lookups()
    try:
        import sniffio  # noqa: F401
        have = "installed"
    except ImportError:
        have = "NOT installed"
    async with httpx.AsyncClient() as client:
        for _ in range(100):
            await client.get(f"http://127.0.0.1:{port}/")
        calls[0] = 0
        t, c = time.perf_counter(), time.process_time()
        for _ in range(requests):
            await client.get(f"http://127.0.0.1:{port}/")
        wall, cpu = time.perf_counter() - t, time.process_time() - c
    await runner.cleanup()
    print(f"sniffio {have}: {wall / requests * 1e6:.0f} us wall, {cpu / requests * 1e6:.0f} us CPU per request "
          f"(client and server in one process); event-loop lookups per request: {calls[0] / requests:.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    asyncio.run(main(ap.parse_args().requests))
