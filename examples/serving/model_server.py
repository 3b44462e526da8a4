"""A small PyTorch model behind HTTP, the way a model server runs under gpufleet.

  POST /predict    {"inputs": [[...32 floats], ...]} (or no body: one random row)
                   -> {"classes": [...], "pod": ...}
  POST /generate   streams one line per generated token (text/plain, chunked)
  GET  /ready      200 once the model is loaded, 503 while starting or draining
  GET  /metrics    its own load in Prometheus text: requests, in-flight, rate, latency

Environment: PORT (given by the agent), POD_NAME, WORK_MS (extra time per request spent
waiting, standing in for the accelerator's share of an inference; default 20),
DRAIN_SECONDS (after SIGTERM: keep answering this long while the gateway takes the pod out
of rotation, then finish what is in flight and exit; default 3).

Runs on CPU; CUDA_VISIBLE_DEVICES is honoured when a GPU is there.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import deque

import torch
from aiohttp import web

FEATURES = 32
CLASSES = 10


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(), torch.nn.Linear(128, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Server:
    def __init__(self) -> None:
        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = Model().to(self.device).eval()
        self.work = float(os.environ.get("WORK_MS", "20")) / 1000
        self.drain = float(os.environ.get("DRAIN_SECONDS", "3"))
        self.pod = os.environ.get("POD_NAME", os.uname().nodename)
        self.ready = False
        self.draining = False
        self.requests = 0
        self.in_flight = 0
        self.latency_sum = 0.0
        self.recent: deque[float] = deque()
        self.idle = asyncio.Event()
        self.idle.set()

    def _begin(self) -> float:
        self.requests += 1
        self.in_flight += 1
        self.idle.clear()
        now = time.monotonic()
        self.recent.append(now)
        return now

    def _end(self, start: float) -> None:
        self.in_flight -= 1
        self.latency_sum += time.monotonic() - start
        if not self.in_flight:
            self.idle.set()

    def rate(self) -> float:
        cutoff = time.monotonic() - 10
        while self.recent and self.recent[0] < cutoff:
            self.recent.popleft()
        return len(self.recent) / 10

    @torch.inference_mode()
    def infer(self, rows: list[list[float]]) -> list[int]:
        x = torch.tensor(rows, dtype=torch.float32, device=self.device)
        return self.model(x).argmax(dim=1).tolist()

    async def predict(self, request: web.Request) -> web.Response:
        start = self._begin()
        try:
            body = await request.read()
            rows = json.loads(body)["inputs"] if body else torch.rand(1, FEATURES).tolist()
            if not rows or any(len(r) != FEATURES for r in rows):
                return web.json_response({"error": f"inputs must be rows of {FEATURES} numbers"}, status=400)
            if self.work:
                await asyncio.sleep(self.work)
            return web.json_response({"classes": self.infer(rows), "pod": self.pod})
        finally:
            self._end(start)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        start = self._begin()
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await resp.prepare(request)
            x = torch.rand(1, FEATURES)
            for i in range(int(request.query.get("tokens", "5"))):
                await asyncio.sleep(self.work)
                token = self.infer(x.tolist())[0]
                await resp.write(f"{i} {token}\n".encode())
                x = torch.roll(x, 1)
            await resp.write_eof()
            return resp
        finally:
            self._end(start)

    async def ready_check(self, request: web.Request) -> web.Response:
        if self.ready and not self.draining:
            return web.Response(text="ready")
        return web.Response(status=503, text="draining" if self.draining else "loading")

    async def metrics(self, request: web.Request) -> web.Response:
        lines = [
            "# TYPE model_requests_total counter", f"model_requests_total {self.requests}",
            "# TYPE model_requests_in_flight gauge", f"model_requests_in_flight {self.in_flight}",
            "# TYPE model_requests_per_second gauge", f"model_requests_per_second {self.rate():.3f}",
            "# TYPE model_request_duration_seconds summary",
            f"model_request_duration_seconds_sum {self.latency_sum:.6f}",
            f"model_request_duration_seconds_count {self.requests - self.in_flight}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def main() -> None:
    server = Server()
    server.infer(torch.rand(1, FEATURES).tolist())  # warm up
    app = web.Application()
    app.router.add_post("/predict", server.predict)
    app.router.add_post("/generate", server.generate)
    app.router.add_get("/ready", server.ready_check)
    app.router.add_get("/metrics", server.metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=30)
    await runner.setup()
    site = web.TCPSite(runner, os.environ.get("HOST", "0.0.0.0"), int(os.environ.get("PORT", "8000")))
    await site.start()
    server.ready = True
    print(f"model server {server.pod} ready on port {os.environ.get('PORT', '8000')} ({server.device})",
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # Keep serving while the gateway learns the pod is going, then let in-flight work finish.
    server.draining = True
    print(f"draining for {server.drain:g}s", flush=True)
    await asyncio.sleep(server.drain)
    await server.idle.wait()
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
