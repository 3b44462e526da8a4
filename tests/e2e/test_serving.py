"""Model serving end to end: the real `gpufleet up` (API, controllers, scheduler, gateway,
a node agent) runs examples/serving (a PyTorch model server, its Service and an
autoscaling/v2 HPA on the gateway's requests_per_second) while bench/load.py drives traffic
through the gateway.

One continuous run, with every request checked:
1. the Deployment starts at zero replicas: the first request is held by the gateway, which
   scales the model up; it is answered, and its latency is printed;
2. a load step (20 req/s, 5 req/s per pod wanted): replicas grow from 1 to the HPA's max (4)
   and never beyond; the time from the step to the first new replica Ready is printed;
3. a rolling update under that load;
4. the load drops to 4 req/s: after the stabilization window one replica is left, the
   others drained while requests kept coming;
5. the load stops: after the stabilization window the model goes back to zero.
Across all of it no request fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import transport_from_kubeconfig

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "serving"
sys.path.insert(0, str(ROOT / "bench"))
from load import Load  # noqa: E402

NS = "serving"
NAME = "classifier"
# The example HPA's behavior.scaleDown.stabilizationWindowSeconds.
DOWN_WINDOW = next(d for d in yaml.safe_load_all((EXAMPLE / "model.yaml").read_text())
                   if d and d.get("kind") == "HorizontalPodAutoscaler")["spec"]["behavior"]["scaleDown"][
                       "stabilizationWindowSeconds"]
_API = re.compile(r"API server listening on (\S+)")
_GATEWAY = re.compile(r"Gateway listening on (\S+)")


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("serving")
    state = root / "state"
    log_path = root / "server.log"
    env = dict(os.environ, HOME=str(root), PYTHONUNBUFFERED="1")
    env.pop("KUBECONFIG", None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.cli.main", "up", "--state-dir", str(state), "--port", "0",
             "--gateway-port", "0", "--hpa-sync-period", "1"],
            stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    gateway = None
    deadline = time.monotonic() + 60
    try:
        while gateway is None:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None or time.monotonic() > deadline:
                pytest.fail(f"gpufleet up did not start its gateway\n{log_path.read_text()[-4000:]}")
            m = _GATEWAY.search(line or "")
            if m:
                gateway = m.group(1)
        yield gateway, state / "kubeconfig"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if os.environ.get("GPUFLEET_E2E_LOG"):  # a path to keep the server's log at
            Path(os.environ["GPUFLEET_E2E_LOG"]).write_text(log_path.read_text())


def _manifests() -> list[dict]:
    text = (EXAMPLE / "model.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    for d in docs:
        if d["kind"] == "Deployment":
            d["spec"]["replicas"] = 0  # start from zero: the first request brings the model up
    return docs


async def _wait(fn, timeout: float, what: str, interval: float = 0.2):  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while True:
        value = await fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {value!r}")
        await asyncio.sleep(interval)


async def _ready_pods(client: Client) -> set[str]:
    pods = await client.list("pods", NS, label_selector={"app": NAME}, raw=True)
    out = set()
    for p in pods.items:
        if p["metadata"].get("deletionTimestamp"):
            continue
        for c in (p.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") == "True":
                out.add(p["metadata"]["name"])
    return out


async def _deployment(client: Client) -> dict:
    return await client.get("deployments", NAME, NS, raw=True)


async def _scenario(gateway: str, kubeconfig: Path) -> None:
    client = Client(transport_from_kubeconfig(kubeconfig))
    try:
        for doc in _manifests():
            await client.create(doc, doc["metadata"].get("namespace"), raw=True)
        url = f"{gateway}/services/{NS}/{NAME}/predict"
        # The gateway's informers must know the Service before the first request.
        await asyncio.sleep(0.5)

        async with Load(url, timeout=60) as load:
            # 1. Scale from zero.
            assert (await _deployment(client))["spec"]["replicas"] == 0
            first = await load.one()
            assert first.status == 200, first
            print(f"\nscale-from-zero: first request answered in {first.latency:.2f}s")
            assert len(await _ready_pods(client)) == 1

            # 2. Load step: 20 req/s against 5 req/s per pod.
            before = await _ready_pods(client)
            max_seen = 0
            load.rate = 20
            step = time.monotonic()

            async def first_new_ready():
                nonlocal max_seen
                dep = await _deployment(client)
                max_seen = max(max_seen, dep["spec"]["replicas"])
                return (await _ready_pods(client)) - before

            await _wait(first_new_ready, 45, "a new replica Ready after the load step")
            print(f"load step -> first new replica Ready: {time.monotonic() - step:.2f}s")

            async def at_max():
                nonlocal max_seen
                dep = await _deployment(client)
                max_seen = max(max_seen, dep["spec"]["replicas"])
                return len(await _ready_pods(client)) >= 4 and dep["spec"]["replicas"] == 4

            await _wait(at_max, 45, "4 Ready replicas under load")
            print(f"load step -> 4 replicas Ready: {time.monotonic() - step:.2f}s")

            async def both_metrics_read():
                hpa = await client.get("horizontalpodautoscalers", NAME, NS, raw=True)
                names = {m["pods"]["metric"]["name"] for m in (hpa.get("status") or {}).get("currentMetrics") or []
                         if m.get("type") == "Pods"}
                return names == {"requests_per_second", "model_requests_in_flight"}

            # The gateway's rate and the workload's own gauge (scraped by the agent) both arrive.
            await _wait(both_metrics_read, 10, "the HPA to read both of its metrics")

            # 3. Rolling update under load.
            await client.patch("deployments", NAME, {"spec": {"template": {"metadata": {
                "annotations": {"example.com/revision": "2"}}}}}, NS)

            async def rolled_out():
                dep = await _deployment(client)
                st = dep.get("status") or {}
                return (st.get("observedGeneration") == dep["metadata"]["generation"]
                        and st.get("updatedReplicas") == dep["spec"]["replicas"] == st.get("readyReplicas")
                        and st.get("replicas") == dep["spec"]["replicas"])

            roll = time.monotonic()
            await _wait(rolled_out, 60, "the rolling update to finish")
            print(f"rolling update under load: {time.monotonic() - roll:.2f}s")

            # 4. Less load (4 req/s: one pod's worth): scale-down while requests keep coming.
            load.rate = 4
            lowered = time.monotonic()

            # Kubernetes' scale-down stabilization: the HPA applies the highest recommendation of
            # the last window. Under 20 req/s no recommendation was below 2 (the load needs 4
            # pods; young pods' sliding-window rates can pull one down to 3 or 2, never to 1), so
            # one replica cannot be reached before a whole window has passed since the drop. A
            # slower machine only makes that later.
            first_decrease: float | None = None
            stabilized_seen = False

            async def at_one():
                nonlocal first_decrease, stabilized_seen
                dep = await _deployment(client)
                hpa = await client.get("horizontalpodautoscalers", NAME, NS, raw=True)
                able = next((c for c in (hpa.get("status") or {}).get("conditions") or []
                             if c["type"] == "AbleToScale"), {})
                if able.get("reason") == "ScaleDownStabilized":
                    stabilized_seen = True
                if first_decrease is None and dep["spec"]["replicas"] < 4:
                    first_decrease = time.monotonic() - lowered
                return dep["spec"]["replicas"] == 1 and (dep.get("status") or {}).get("replicas") == 1

            await _wait(at_one, 60, "the HPA to scale down to one replica under 4 req/s")
            to_one = time.monotonic() - lowered
            print(f"load lowered -> one replica left: {to_one:.2f}s (first replica removed after "
                  f"{first_decrease if first_decrease is not None else float('nan'):.2f}s; window "
                  f"{DOWN_WINDOW}s; ScaleDownStabilized seen: {stabilized_seen})")
            assert to_one >= DOWN_WINDOW - 1.0, (
                f"one replica was left {to_one:.2f}s after the load dropped, inside the "
                f"{DOWN_WINDOW}s stabilization window")

            # 5. Load stops: back to zero after the stabilization window.
            load.rate = 0
            await load.drain()
            stopped = time.monotonic()

            async def at_zero():
                dep = await _deployment(client)
                return dep["spec"]["replicas"] == 0

            await _wait(at_zero, 60, "the HPA to scale back to zero")
            print(f"load stopped -> scaled to zero: {time.monotonic() - stopped:.2f}s")

            report = load.report
        assert max_seen <= 4
        assert report.results, "no request was sent"
        failures = report.failures
        print(f"requests: {len(report.results)}, failed: {len(failures)}")
        assert not failures, [(f.status, f.error, f.body) for f in failures[:5]]
        hpa = await client.get("horizontalpodautoscalers", NAME, NS, raw=True)
        types = {c["type"] for c in hpa["status"].get("conditions") or []}
        assert {"AbleToScale", "ScalingActive", "ScalingLimited"} <= types
        events = await client.list("events", NS, field_selector={"involvedObject.name": NAME,
                                                                  "reason": "SuccessfulRescale"}, raw=True)
        messages = [e["message"] for e in events.items]
        assert any("requests_per_second above target" in m for m in messages), messages
        assert any("All metrics below target" in m for m in messages), messages
    finally:
        with contextlib.suppress(Exception):
            await client.close()


def test_serving_scales_with_traffic_and_drops_nothing(plane: tuple[str, Path]) -> None:
    gateway, kubeconfig = plane
    asyncio.run(asyncio.wait_for(_scenario(gateway, kubeconfig), 200))
