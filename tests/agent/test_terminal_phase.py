"""A pod someone else reported finished stays finished: when a pod's phase on record turns
Failed (or Succeeded) while the agent still runs it (a controller, an operator, the node's own
report after a restart), the agent stops its containers and never writes a phase that is not
terminal over it, as the kubelet's status manager refuses an "illegal phase transition"."""

from __future__ import annotations

import asyncio
import os

from test_agent import Harness, eventually, h  # noqa: F401  (the fixture)

from gpufleet.client.api import Client


async def report_failed(api: Client, name: str) -> None:
    pod = await api.get("pods", name, "default", raw=True)
    st = pod["status"]
    message = "GPU 0 on node gpu-node-1 is unhealthy: XID 79 (GPU has fallen off the bus)"
    st.update(phase="Failed", reason="GPUUnhealthy", message=message)
    st["conditions"] = [c for c in st.get("conditions") or [] if c["type"] != "DisruptionTarget"] + [
        {"type": "DisruptionTarget", "status": "True", "reason": "GPUUnhealthy", "message": message,
         "lastTransitionTime": st.get("startTime")}]
    await api.update_status(pod, raw=True)


async def test_a_pod_reported_failed_elsewhere_is_stopped_and_stays_failed(h: Harness) -> None:  # noqa: F811
    await h.start_agent()
    # The container exits now and then: restartPolicy Always would start it again.
    await h.pod("worker", command=["sh", "-c", "sleep 0.5; exit 3"], restartPolicy="Always",
                terminationGracePeriodSeconds=1)
    p = await h.wait_pod("worker", lambda p: p["status"].get("phase") == "Running", what="worker running")
    pid = int(p["status"]["containerStatuses"][0]["containerID"].removeprefix("process://"))
    phases: list[str] = []

    async def watch() -> None:
        async for ev in h.api.watch("pods", "default", resource_version=p["metadata"]["resourceVersion"],
                                    raw=True, allow_bookmarks=False):
            if ev.object["metadata"]["name"] == "worker":
                phases.append(ev.object["status"].get("phase"))

    watcher = asyncio.create_task(watch())
    try:
        await report_failed(h.api, "worker")

        async def stopped() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False
        await eventually(stopped, 10, "the worker's process stopped")
        # Give the agent the time to restart the container, were it to.
        await asyncio.sleep(2)
        got = await h.get("worker")
        assert got["status"]["phase"] == "Failed" and got["status"]["reason"] == "GPUUnhealthy", got["status"]
        cs = got["status"]["containerStatuses"][0]
        assert "terminated" in cs["state"], cs
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    assert "Failed" in phases
    assert set(phases[phases.index("Failed"):]) == {"Failed"}, phases
