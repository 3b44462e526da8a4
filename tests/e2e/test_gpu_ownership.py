"""No GPU is ever held by two live processes, whatever the node agent goes through.

A real `gpufleet up --no-agent` and two `gpufleet agent`s with declared GPUs, on both
runtimes that run real processes (podman containers; sandboxed host processes). Every pod
process prints, five times a second, its node, the GPUs it was handed
(NVIDIA_VISIBLE_DEVICES: the GPUs' UUIDs), an id of its own drawn when it started and the
machine's uptime. Those lines, read from the container logs on disk, are the evidence:
for each (node, GPU), the time spans of different processes never overlap.

Then the agent of a node is SIGKILLed alone (its pods keep running, as they must) and started
again: each pod's process is adopted, not doubled. Then it is SIGKILLed again, its pods are
deleted while it is away (force, as an operator does for a dead node) and replaced on the
other node, more replicas are asked for so that new pods land on the returning node: the
orphans are stopped before any of their GPUs goes to a new process.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest
from e2e_helpers import Fleet, _kill_proc, podman_owner, running_fleet

from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import transport_from_kubeconfig

pytestmark = pytest.mark.e2e

NODES = ("node-a", "node-b")
GPUS = 2
IMAGE = "localhost/gpufleet/busybox:1"
TICK = re.compile(r"^\S+ stdout [FP] tick (\S+) (\S+) (\S+) ([\d.]+)$")
# Runs in busybox's sh (podman) and in the host's sh (process runtime) alike.
SCRIPT = ('id=$(cat /proc/sys/kernel/random/uuid); '
          'while :; do read up rest < /proc/uptime; echo "tick $NODE $NVIDIA_VISIBLE_DEVICES $id $up"; '
          'sleep 0.2; done')


def deployment(replicas: int) -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "holder", "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "holder"}},
            "template": {
                "metadata": {"labels": {"app": "holder"}},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "main", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", SCRIPT],
                        "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                        "resources": {"limits": {"nvidia.com/gpu": 1}},
                    }],
                },
            },
        },
    }


def ticks(root: Path) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(node, gpu uuid) -> process id -> [first, last] uptime it reported holding that GPU."""
    held: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(dict)
    for log in root.glob("agent-*/pods/*/*/*.log"):
        for line in log.read_text(errors="replace").splitlines():
            m = TICK.match(line)
            if not m:
                continue
            node, gpus, pid, up = m.group(1), m.group(2), m.group(3), float(m.group(4))
            for gpu in gpus.split(","):
                span = held[(node, gpu)].setdefault(pid, [up, up])
                span[0], span[1] = min(span[0], up), max(span[1], up)
    return held


def overlaps(held: dict[tuple[str, str], dict[str, list[float]]]) -> list[str]:
    out = []
    for key, spans in held.items():
        ordered = sorted(spans.items(), key=lambda kv: kv[1][0])
        for (a, (a0, a1)), (b, (b0, b1)) in zip(ordered, ordered[1:], strict=False):
            if b0 <= a1:
                out.append(f"{key}: process {a} [{a0}, {a1}] and {b} [{b0}, {b1}]")
    return out


def uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


async def pods_of(client: Client) -> list[dict]:
    return await client.list("Pod", "default", label_selector={"app": "holder"}, raw=True)


def running_on(pods: list[dict], node: str) -> list[dict]:
    return [p for p in pods if (p.get("spec") or {}).get("nodeName") == node
            and (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
            and all(cs.get("state", {}).get("running") for cs in p["status"].get("containerStatuses") or [])]


def live_ids(root: Path, node: str, since: float) -> dict[str, set[str]]:
    """gpu -> ids of processes that reported holding it on `node` after `since`."""
    out: dict[str, set[str]] = defaultdict(set)
    for (n, gpu), spans in ticks(root).items():
        if n == node:
            out[gpu] |= {pid for pid, (_, last) in spans.items() if last > since}
    return out


def restart_agent(fleet: Fleet, node: str, runtime: str) -> None:
    fleet.start_agent(node, gpus=GPUS, runtime=runtime)


@pytest.mark.parametrize("runtime", ["podman", "process"])
async def test_a_gpu_is_never_held_by_two_live_processes(tmp_path: Path, runtime: str) -> None:
    with running_fleet(tmp_path, ["up", "--no-agent"], NODES, gpus=GPUS, runtime=runtime) as fleet:
        client = Client(transport_from_kubeconfig(fleet.kubeconfig))
        try:
            await fleet.nodes_ready(client)
            await client.create(deployment(2), "default", raw=True)

            async def two_running():
                pods = await pods_of(client)
                live = [p for n in NODES for p in running_on(pods, n)]
                return live if len(live) == 2 else None

            live = await fleet.wait_until(two_running, 90, "2 holders running")
            x = live[0]["spec"]["nodeName"]
            before = {p["metadata"]["uid"]: p["status"]["containerStatuses"][0] for p in running_on(live, x)}

            # 1. The agent of x dies alone; its pods' processes go on. Started again, it adopts them.
            _kill_proc(fleet.agents[x])
            await asyncio.sleep(1.5)
            back_at = uptime()
            restart_agent(fleet, x, runtime)
            await fleet.nodes_ready(client)
            await asyncio.sleep(3.0)
            pods = await pods_of(client)
            after = {p["metadata"]["uid"]: p["status"]["containerStatuses"][0] for p in running_on(pods, x)}
            assert set(after) == set(before), (before, after)
            for uid, cs in before.items():
                assert after[uid]["containerID"] == cs["containerID"], (cs, after[uid])
                assert after[uid]["restartCount"] == cs["restartCount"]
            doubled = {gpu: ids for gpu, ids in live_ids(tmp_path, x, back_at).items() if len(ids) > 1}
            assert not doubled, f"processes started again next to the adopted ones: {doubled}"
            if runtime == "podman":
                running = await asyncio.to_thread(podman_ids, tmp_path, x, "label=gpufleet.io/container=main")
                assert len(running) == len(before), running

            # 2. It dies again; its pods are deleted for good while it is away and replaced
            # on the other node; then it comes back and new replicas land on it.
            _kill_proc(fleet.agents[x])
            orphan_ids = {pid for ids in live_ids(tmp_path, x, uptime() - 1).values() for pid in ids}
            assert orphan_ids
            for uid in before:
                pod = next(p for p in pods if p["metadata"]["uid"] == uid)
                with contextlib.suppress(Exception):
                    await client.delete("Pod", pod["metadata"]["name"], "default", grace_period_seconds=0)

            y = next(n for n in NODES if n != x)

            async def replaced():
                got = running_on(await pods_of(client), y)
                return got if len(got) >= min(2, GPUS) else None

            await fleet.wait_until(replaced, 90, f"the replicas replaced on {y}")
            restart_agent(fleet, x, runtime)
            await fleet.nodes_ready(client)
            await client.patch("Deployment", "holder", {"spec": {"replicas": 4}}, "default", raw=True)

            async def four():
                pods = await pods_of(client)
                return running_on(pods, x) if len(running_on(pods, x)) == 2 and len(running_on(pods, y)) == 2 \
                    else None

            await fleet.wait_until(four, 90, f"two new replicas running on {x}")
            await asyncio.sleep(2.0)
            late = uptime() - 1.0
            still = {pid for ids in live_ids(tmp_path, x, late).values() for pid in ids} & orphan_ids
            assert not still, f"orphaned processes still run on {x}: {still}"
        finally:
            await client.close()
        problems = overlaps(ticks(tmp_path))
        assert not problems, "a GPU was held by two live processes:\n" + "\n".join(problems)
        held = ticks(tmp_path)
        # The evidence is there: every GPU of x was held, by the orphans and then by new processes.
        assert sum(len(spans) for (n, _), spans in held.items() if n == x) >= 2 + len(before), held
    # Nothing of this test may outlive it.
    if runtime == "podman":
        await asyncio.to_thread(remove_containers, tmp_path, NODES)


def podman_ids(root: Path, node: str, *filters: str, all_states: bool = False) -> list[str]:
    """The containers of this fleet's agent of `node` (not those of another fleet's node of
    the same name on this machine)."""
    args = ["podman", "ps", "-q", "--filter", f"label=gpufleet.io/node={node}",
            "--filter", f"label=gpufleet.io/owner={podman_owner(root / f'agent-{node}')}"]
    for f in filters:
        args += ["--filter", f]
    if all_states:
        args.append("-a")
    return subprocess.run(args, capture_output=True, text=True, check=False).stdout.split()


def remove_containers(root: Path, nodes) -> None:
    """The nodes' containers (and their sandboxes after them): they outlive their agents."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ids = [c for n in nodes for c in podman_ids(root, n, all_states=True)]
        if not ids:
            return
        subprocess.run(["podman", "rm", "-f", "-t", "0", *ids], capture_output=True, check=False)
