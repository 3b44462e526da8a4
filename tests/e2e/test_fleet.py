"""A whole fleet on loopback: `gpufleet server`, three `gpufleet agent`s with declared GPUs
running pods as host processes, and a GPU Deployment packed onto them.

Each pod reports what it was actually given (its node from the downward API, the
CUDA_VISIBLE_DEVICES the agent set, its pid) in a file, so the GPU accounting is checked
from inside the containers rather than from the scheduler's own bookkeeping. Then one node
dies the hard way, agent and pods SIGKILLed with no chance to say goodbye, and the only
way the replicas come back is through the lease going stale, the node lifecycle
controller tainting and evicting, and the ReplicaSet and scheduler placing replacements.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_helpers import Fleet, kill_group, running_fleet

from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import transport_from_kubeconfig

pytestmark = pytest.mark.e2e

NODES = ("node-a", "node-b", "node-c")
GPUS_PER_NODE = 4
GPUS_PER_POD = 2
DEPLOYMENT = "trainer"
START_TIMEOUT = 60.0
FAILOVER_LIMIT = 60.0

# The pod's whole job is to say where it landed and what it was handed, then stay up.
POD_SCRIPT = """
import os, time
name = os.environ["POD_NAME"]
path = os.path.join(os.environ["REPORT_DIR"], name + ".txt")
line = " ".join([name, os.environ["NODE"], os.environ.get("CUDA_VISIBLE_DEVICES", ""), str(os.getpid())])
with open(path + ".tmp", "w") as f:
    f.write(line + "\\n")
os.replace(path + ".tmp", path)
while True:
    time.sleep(3600)
"""


@dataclass(frozen=True)
class Report:
    pod: str
    node: str
    gpus: tuple[int, ...]
    pid: int


def report_dir(fleet: Fleet) -> Path:
    return fleet.root / "reports"


def read_reports(reports: Path) -> dict[str, Report]:
    found = {}
    for p in reports.glob("*.txt"):
        parts = p.read_text().split()
        if len(parts) != 4:
            continue
        pod, node, cvd, pid = parts
        found[pod] = Report(pod, node, tuple(int(i) for i in cvd.split(",") if i), int(pid))
    return found


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    reports = tmp_path / "reports"
    reports.mkdir()
    # The pods (sandboxed, as an unprivileged user) write their reports to a shared path.
    reports.chmod(0o777)
    try:
        with running_fleet(
            tmp_path, ["server", "--store", f"sqlite:///{tmp_path / 'state.db'}"], NODES,
            gpus=GPUS_PER_NODE, gpu_model="H100-SXM-80GB", runtime="process",
            agent_args=["--shared-path", str(reports)],
        ) as f:
            yield f
    finally:
        # The pods report their own pids; the fleet is down by now, so none comes back.
        for r in read_reports(reports).values():
            kill_group(r.pid)


def deployment(replicas: int, reports: Path) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "labels": {"app": DEPLOYMENT}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": DEPLOYMENT}},
            "template": {
                "metadata": {"labels": {"app": DEPLOYMENT}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": "python:3",
                            "command": ["python3", "-c", POD_SCRIPT],
                            "env": [
                                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                                {
                                    "name": "POD_NAME",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                },
                                {"name": "REPORT_DIR", "value": str(reports)},
                            ],
                            "resources": {"limits": {"nvidia.com/gpu": GPUS_PER_POD}},
                        }
                    ],
                },
            },
        },
    }


def _ready(pod: dict) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


async def live_pods(client: Client) -> list[dict]:
    """Running, Ready, not being deleted: the replicas that actually serve."""
    pods = await client.list("Pod", "default", label_selector={"app": DEPLOYMENT}, raw=True)
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") == "Running"
        and _ready(p)
    ]


async def reported(fleet: Fleet, pods: list[dict], limit: float = 20.0) -> dict[str, Report]:
    """The reports of these pods; a container can be Running a moment before it has written."""
    names = {p["metadata"]["name"] for p in pods}

    async def check():
        reps = read_reports(report_dir(fleet))
        return {n: reps[n] for n in names} if names <= set(reps) else None

    return await fleet.wait_until(check, limit, f"reports from {sorted(names)}")


async def test_gpu_packing_and_node_failover(fleet: Fleet) -> None:
    async with Client(transport_from_kubeconfig(fleet.kubeconfig)) as client:
        await fleet.nodes_ready(client, START_TIMEOUT)

        total = len(NODES) * GPUS_PER_NODE
        full = total // GPUS_PER_POD
        await client.create(deployment(full, report_dir(fleet)), "default", raw=True)

        async def all_running():
            pods = await live_pods(client)
            return pods if len(pods) == full else None

        pods = await fleet.wait_until(all_running, 60, f"{full} pods Running")
        reps = await reported(fleet, pods)

        # The agent's view (pod.spec.nodeName) and the container's view (downward API) agree.
        for p in pods:
            assert reps[p["metadata"]["name"]].node == p["spec"]["nodeName"]
        for r in reps.values():
            assert len(r.gpus) == GPUS_PER_POD, r
            assert all(0 <= g < GPUS_PER_NODE for g in r.gpus), r
        held = Counter((r.node, g) for r in reps.values() for g in r.gpus)
        doubled = {k: c for k, c in held.items() if c > 1}
        assert not doubled, f"GPUs handed to more than one pod: {doubled}\n{reps}"
        per_node = Counter(r.node for r in reps.values())
        assert per_node == {n: GPUS_PER_NODE // GPUS_PER_POD for n in NODES}, per_node

        # With every GPU taken there would be nowhere to put a lost replica; scale down so
        # that the surviving nodes have room for exactly what the dead one held.
        keep = full - GPUS_PER_NODE // GPUS_PER_POD
        scale = await client.set_scale("Deployment", DEPLOYMENT, keep, "default", raw=True)
        print(f"scaled {DEPLOYMENT} to {scale['spec']['replicas']} replicas")

        async def scaled_down():
            pods = await live_pods(client)
            every = await client.list("Pod", "default", label_selector={"app": DEPLOYMENT}, raw=True)
            # Wait for the extra pods to be gone entirely, not just terminating, so the
            # victim choice below sees the final layout.
            return pods if len(pods) == keep and len(every) == keep else None

        pods = await fleet.wait_until(scaled_down, 60, f"{keep} pods Running")
        reps = await reported(fleet, pods)
        survivors = Counter(p["spec"]["nodeName"] for p in pods)
        victim, lost = survivors.most_common(1)[0]
        assert lost >= 1

        victim_pids = [reps[p["metadata"]["name"]].pid for p in pods if p["spec"]["nodeName"] == victim]
        fleet.kill_node(victim, victim_pids)
        t0 = time.monotonic()

        async def recovered():
            pods = await live_pods(client)
            if len(pods) == keep and all(p["spec"]["nodeName"] != victim for p in pods):
                return pods
            return None

        pods = await fleet.wait_until(recovered, FAILOVER_LIMIT + 30, f"{keep} pods Running off {victim}")
        elapsed = time.monotonic() - t0
        print(f"failover: {lost} replicas lost on {victim}, Running elsewhere after {elapsed:.1f} s")
        assert elapsed < FAILOVER_LIMIT

        # The replacements are real processes holding distinct GPUs, not just API objects.
        reps = await reported(fleet, pods)
        held = Counter((r.node, g) for r in reps.values() for g in r.gpus)
        assert all(c == 1 for c in held.values()), held
        assert all(r.node != victim for r in reps.values())

        node = await client.get("Node", victim, raw=True)
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] in ("False", "Unknown"), ready
        taints = {(t["key"], t["effect"]) for t in node["spec"].get("taints") or []}
        assert ("node.kubernetes.io/unreachable", "NoExecute") in taints, taints
