"""KubeRay's RayService end to end with real Ray Serve in the pods: `gpufleet up --no-agent`,
one `gpufleet agent` running pods as host processes, and examples/ray/rayservice.sample.yaml
(a ConfigMap holding the application's module, a RayService) applied with kubectl.

The RayService makes its RayCluster, deploys serveConfigV2 through the head's dashboard and
becomes Ready (serviceStatus Running, one Serve endpoint, the application RUNNING with its
deployment HEALTHY); the application answers through `<rayservice>-serve-svc` (the API
server's service proxy); `kubectl get rayservices` shows KubeRay's columns. Then
serveConfigV2 alone changes and is deployed on the same cluster. Then rayClusterConfig and
serveConfigV2 change together: a new cluster comes up with the new
config, the Services switch to it, the old cluster is deleted, and every request sent all
along was answered, first by the old application, then by the new one.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import Fleet, Kubectl, kubectl_binary, process_pids, running_fleet, table

from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import transport_from_kubeconfig

pytest.importorskip("ray.serve", reason="the RayService test runs Ray Serve (pip install 'ray[serve]')")

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray" / "rayservice.sample.yaml"
NS = "default"
NAME = "rayservice-hello"
OLD, MID, NEW = "hello from Ray Serve", "hello again", "hello from the upgraded cluster"
PROXY = f"/api/v1/namespaces/{NS}/services/{NAME}-serve-svc:serve/proxy/"


def _ray_pids(marker: str) -> set[int]:
    out: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                    out.add(int(entry))
            except OSError:
                pass
    return out


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    kubectl_binary()
    # A short directory of Ray's own (socket paths stay under 108 bytes), also what finds
    # Ray's daemons at the end.
    ray_dir = tempfile.mkdtemp(prefix="gfrs-", dir="/tmp")
    with running_fleet(tmp_path, ["up", "--no-agent"], ("node-a",), gpus=1, runtime="process",
                       join=False, python_on_path=True, poll_interval=0.3) as f:
        f.ray_dir = ray_dir  # type: ignore[attr-defined]
        try:
            yield f
        finally:
            for pid in _ray_pids(ray_dir):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            shutil.rmtree(ray_dir, ignore_errors=True)


def manifests(temp_dir: str) -> list[dict[str, Any]]:
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    service = next(d for d in docs if d["kind"] == "RayService")
    service["spec"]["rayClusterDeletionDelaySeconds"] = 3
    cluster = service["spec"]["rayClusterConfig"]
    for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        group["rayStartParams"]["temp-dir"] = temp_dir
        # Ray lives in this machine's virtualenv: the pods run as root on the node, in a
        # namespace labelled privileged (as the RayCluster test does).
        for c in group["template"]["spec"]["containers"]:
            c["securityContext"] = {"privileged": True}
            c["env"] = [*(c.get("env") or []), {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"}]
    return docs


# Two Ray clusters start one after the other: ~85 s on 2 idle cores, three times that on a
# busy machine, past the suite's default of 300 s.
@pytest.mark.timeout(540)
async def test_rayservice_serves_and_upgrades_without_downtime(fleet: Fleet) -> None:
    home = fleet.root / "kubectl-home"
    home.mkdir(exist_ok=True)
    kubectl = Kubectl(kubectl_binary(), fleet.kubeconfig, str(home), timeout=60)
    docs = manifests(fleet.ray_dir)  # type: ignore[attr-defined]
    started = time.monotonic()
    async with Client(transport_from_kubeconfig(fleet.kubeconfig)) as client:
        await fleet.nodes_ready(client)
        await client.patch("Namespace", NS, {"metadata": {"labels": {
            "pod-security.kubernetes.io/enforce": "privileged"}}}, raw=True)
        kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs)).ok()

        async def status() -> dict[str, Any]:
            pods = await client.list("Pod", NS, raw=True)
            fleet.pids |= process_pids(pods)
            return (await client.get("rayservices", NAME, NS, raw=True)).get("status") or {}

        async def until(check: Any, limit: float, what: str) -> Any:
            """fleet.wait_until, failing with the RayService's status and Events as well."""
            try:
                return await fleet.wait_until(check, limit, what)
            except pytest.fail.Exception as e:
                events = [f"{ev.get('reason')}: {ev.get('message')}" for ev in await client.list("Event", NS, raw=True)
                          if (ev.get("involvedObject") or {}).get("kind") in ("RayService", "RayCluster")]
                pytest.fail(f"{e}\nRayService status: {json.dumps(await status(), indent=1)}\n"
                            f"Events: {events[-20:]}", pytrace=False)

        async def ready() -> dict[str, Any] | None:
            st = await status()
            return st if st.get("serviceStatus") == "Running" else None

        st = await until(ready, 300, "the RayService to be Running")
        up = time.monotonic() - started
        conditions = {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}
        assert conditions == {"Ready": ("True", "NonZeroServeEndpoints"),
                              "UpgradeInProgress": ("False", "NoPendingCluster")}, st
        assert st["numServeEndpoints"] == 1 and "pendingServiceStatus" not in st
        first = st["activeServiceStatus"]["rayClusterName"]
        assert first.startswith(f"{NAME}-") and st["activeServiceStatus"]["rayClusterStatus"]["state"] == "ready"
        app = st["activeServiceStatus"]["applicationStatuses"]["hello"]
        assert app["status"] == "RUNNING" and app["serveDeploymentStatuses"]["Hello"]["status"] == "HEALTHY", st

        # The application answers through the Serve Service; kubectl shows KubeRay's columns.
        assert kubectl("get", "--raw", PROXY).ok().stdout == OLD
        rows = table(kubectl("get", "rayservices").ok().stdout)
        assert rows == [{"NAME": NAME, "SERVICE STATUS": "Running", "NUM SERVE ENDPOINTS": "1"}], rows
        serve_svc = await client.get("Service", f"{NAME}-serve-svc", NS, raw=True)
        assert serve_svc["spec"]["selector"] == {"ray.io/cluster": first, "ray.io/serve": "true"}

        # serveConfigV2 alone changes: deployed again on the same cluster.
        service = next(d for d in docs if d["kind"] == "RayService")
        service["spec"]["serveConfigV2"] = service["spec"]["serveConfigV2"].replace(OLD, MID)
        kubectl("apply", "-f", "-", input=json.dumps(service)).ok()

        async def in_place() -> bool:
            got = await client.raw_request("GET", PROXY, raise_for_status=False)
            return got.status == 200 and got.body.decode() == MID

        await until(in_place, 120, "the changed application to answer")
        st = await status()
        assert st["activeServiceStatus"]["rayClusterName"] == first and "pendingServiceStatus" not in st
        assert [c["metadata"]["name"] for c in await client.list("rayclusters", NS, raw=True)] == [first]

        # An upgrade: rayClusterConfig and serveConfigV2 change; requests keep being answered.
        answers: list[tuple[int, str]] = []
        done = asyncio.Event()

        async def ask() -> None:
            while not done.is_set():
                got = await client.raw_request("GET", PROXY, raise_for_status=False)
                answers.append((got.status, got.body.decode(errors="replace")))
                await asyncio.sleep(0.25)

        asker = asyncio.create_task(ask())
        service["spec"]["serveConfigV2"] = service["spec"]["serveConfigV2"].replace(MID, NEW)
        service["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = "1"
        upgrade_started = time.monotonic()
        kubectl("apply", "-f", "-", input=json.dumps(service)).ok()

        async def upgraded() -> dict[str, Any] | None:
            st = await status()
            active = (st.get("activeServiceStatus") or {}).get("rayClusterName")
            clusters = {c["metadata"]["name"] for c in await client.list("rayclusters", NS, raw=True)
                        if not c["metadata"].get("deletionTimestamp")}
            return st if active not in (None, first) and clusters == {active} and answers \
                and answers[-1] == (200, NEW) else None

        try:
            st = await until(upgraded, 300, "the upgraded cluster to serve and the old one to go")
        finally:
            done.set()
            await asyncio.wait_for(asker, 30)
        upgrade = time.monotonic() - upgrade_started
        failed = [a for a in answers if a[0] != 200 or a[1] not in (MID, NEW)]
        assert not failed, (failed, answers)
        switched = [a[1] for a in answers]
        assert switched[0] == MID and switched == sorted(switched, key=lambda m: m == NEW), switched
        assert st["serviceStatus"] == "Running" and "pendingServiceStatus" not in st
        conditions = {c["type"]: c["status"] for c in st["conditions"]}
        assert conditions == {"Ready": "True", "UpgradeInProgress": "False"}, st
        serve_svc = await client.get("Service", f"{NAME}-serve-svc", NS, raw=True)
        assert serve_svc["spec"]["selector"]["ray.io/cluster"] == st["activeServiceStatus"]["rayClusterName"]
        print(f"\nRayService Running after {up:.1f}s; upgrade served by the new cluster after {upgrade:.1f}s; "
              f"{len(answers)} requests during the upgrade, all answered")
