"""The node agent with the podman runtime, end to end: a real control plane, a pod bound to the
agent's node, a busybox container serving HTTP on a published port, readiness through that
port, then a graceful deletion that takes the container away with the pod.

Like test_runtime_podman.py this fails (it does not skip) where podman, runc or
busybox-static are missing, so a machine that cannot run containers is noticed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.request
import uuid

from test_agent import NODE, cstatus, eventually, h, ready  # noqa: F401  (h is a fixture)
from test_runtime_podman import INDEX_HTML, busybox_image  # noqa: F401  (a fixture)

from gpufleet.agent.runtime.podman import PodmanRuntime
from gpufleet.client import NotFound

GRACE_S = 10


def _podman_ps(pod_name: str) -> list[dict]:
    # Every container the agent made for this pod, whatever its state, found by the label
    # the runtime puts on it rather than by a guessed name.
    proc = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label=gpufleet.io/pod={pod_name}", "--format", "json"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, f"podman ps failed: {proc.stderr}"
    return json.loads(proc.stdout or "[]") or []


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


async def test_agent_runs_a_podman_pod_ready_over_its_host_port_then_deletes_it(h, busybox_image):  # noqa: F811
    state = h.tmp / f"agent-{NODE}"
    await h.start_agent(runtime=PodmanRuntime(state))
    # A fresh name per run: a container left over from an earlier run cannot be mistaken
    # for this one's.
    name = f"httpd-{uuid.uuid4().hex[:8]}"
    try:
        await h.pod(name, containers=[{
            "name": "main",
            "image": busybox_image,
            # A local image, not in any registry: it must not be pulled.
            "imagePullPolicy": "IfNotPresent",
            "command": ["busybox", "httpd", "-f", "-p", "8080", "-h", "/www"],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        }], terminationGracePeriodSeconds=GRACE_S)
        # Image lookup and container start go through podman: slower than a process.
        pod = await h.wait_pod(name, ready, limit_s=90, what=f"{name} Running and Ready")
        cs = cstatus(pod)
        assert cs["ready"] and cs["started"], cs
        assert cs["containerID"].startswith("podman://"), cs

        # The pod has a network namespace and an IP of its own: it listens on its container
        # port there, and no port of the node is taken for it.
        assert "gpufleet.io/host-ports" not in (pod["metadata"].get("annotations") or {})
        ip = pod["status"]["podIP"]
        assert ip and ip != pod["status"]["hostIP"], pod["status"]
        body = await asyncio.to_thread(_get, f"http://{ip}:8080/")
        assert body == INDEX_HTML

        running = [c for c in await asyncio.to_thread(_podman_ps, name) if c.get("State") == "running"]
        # The pod's container and its sandbox (the pause container holding its namespaces).
        assert len(running) == 2, running
        assert sum(1 for c in running if (c.get("Labels") or {}).get("gpufleet.io/role") == "sandbox") == 1

        deleted = await h.api.delete("pods", name, "default", raw=True)
        assert deleted["metadata"].get("deletionTimestamp")
        t0 = time.monotonic()

        async def gone():
            try:
                await h.get(name)
            except NotFound:
                return True
            return False

        await eventually(gone, GRACE_S, f"pod {name} to disappear within its grace period")
        elapsed = time.monotonic() - t0
        left = await asyncio.to_thread(_podman_ps, name)
        assert not [c for c in left if c.get("State") == "running"], (
            f"a container of {name} still runs {elapsed:.1f}s after the pod was deleted: {left}")
        # httpd ends on SIGTERM, so the whole grace period is not needed; the exited container
        # is then removed by the agent (just after the pod object goes), not left behind.
        async def removed() -> bool:
            return not await asyncio.to_thread(_podman_ps, name)

        await eventually(removed, 10, f"the exited container of {name} to be removed")
    finally:
        for c in await asyncio.to_thread(_podman_ps, name):
            await asyncio.to_thread(subprocess.run, ["podman", "rm", "-f", "-t", "0", c["Id"]],
                                    capture_output=True, check=False)
