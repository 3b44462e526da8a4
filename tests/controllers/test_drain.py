"""cordon / uncordon / drain, run as the CLI runs them against a real control plane."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ctrl_helpers import NS, FakeAgent, eventually, node, pod
from typer.testing import CliRunner

from gpufleet.apiserver.errors import ApiException
from gpufleet.cli.commands.cordon import DrainOptions, drain_nodes
from gpufleet.cli.main import app
from gpufleet.client.api import Client
from gpufleet.client.errors import NotFound


async def cli(tmp_path: Path, *args: str) -> Any:
    """The `gpufleet` command in a thread (it runs its own event loop) against the test's server."""
    runner = CliRunner()
    return await asyncio.to_thread(runner.invoke, app, [*args, "--kubeconfig", str(tmp_path / "kubeconfig")])


def owned(name: str, kind: str = "ReplicaSet", **spec: Any) -> dict[str, Any]:
    p = pod(name, {"app": "web"}, node="n1", **spec)
    p["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": kind, "name": "owner",
                                         "uid": "00000000-0000-0000-0000-000000000001", "controller": True}]
    return p


async def exists(client: Client, name: str) -> bool:
    try:
        await client.get("pods", name, NS, raw=True)
    except NotFound:
        return False
    return True


async def test_cordon_and_uncordon(client: Client, tmp_path: Path) -> None:
    await client.create(node("n1"))
    r = await cli(tmp_path, "cordon", "n1")
    assert r.exit_code == 0, r.output
    assert r.output.strip() == "node/n1 cordoned"
    assert (await client.get("nodes", "n1", raw=True))["spec"]["unschedulable"] is True
    r = await cli(tmp_path, "cordon", "n1")
    assert r.output.strip() == "node/n1 already cordoned"
    r = await cli(tmp_path, "uncordon", "n1")
    assert r.output.strip() == "node/n1 uncordoned"
    assert not (await client.get("nodes", "n1", raw=True))["spec"].get("unschedulable")
    r = await cli(tmp_path, "cordon", "nope")
    assert r.exit_code == 1 and 'nodes "nope" not found' in r.output


async def test_drain_refuses_unmanaged_pods_then_evicts_with_force(client: Client, tmp_path: Path) -> None:
    await client.create(node("n1"))
    await client.create(node("n2"))
    await client.create(owned("web-1"))
    await client.create(owned("web-2", volumes=[{"name": "scratch", "emptyDir": {}}]))
    await client.create(owned("ds-1", kind="DaemonSet"))
    await client.create(pod("solo", {"app": "solo"}, node="n1"))
    await client.create(owned("elsewhere") | {"spec": {**owned("elsewhere")["spec"], "nodeName": "n2"}})

    async with FakeAgent(client, delay=0.0):
        r = await cli(tmp_path, "drain", "n1")
        assert r.exit_code == 1
        assert "node/n1 cordoned" in r.output
        assert "cannot delete Pods declare no controller (use --force to override): default/solo" in r.output
        assert "cannot delete Pods with local storage (use --delete-emptydir-data to override): default/web-2" \
            in r.output
        assert "cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore): default/ds-1" in r.output
        assert "There are pending nodes to be drained:" in r.output
        assert await exists(client, "web-1") and await exists(client, "solo")

        r = await cli(tmp_path, "drain", "n1", "--force", "--ignore-daemonsets", "--delete-emptydir-data",
                      "--timeout", "30s")
        assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "node/n1 already cordoned"
    assert "Warning: ignoring DaemonSet-managed Pods: default/ds-1" in lines
    assert "Warning: deleting Pods that declare no controller: default/solo" in lines
    for name in ("web-1", "web-2", "solo"):
        assert f"evicting pod default/{name}" in lines and f"pod/{name} evicted" in lines
        assert not await exists(client, name)
    assert lines[-1] == "node/n1 drained"
    assert await exists(client, "ds-1") and await exists(client, "elsewhere")


async def test_drain_retries_evictions_refused_with_429(cp, client: Client) -> None:
    class Budget:
        name = "budget"
        refusals = 2

        async def validate(self, ctx, obj, old) -> None:
            if ctx.operation == "DELETE" and ctx.rt.kind == "Pod" and self.refusals > 0:
                self.refusals -= 1
                raise ApiException(429, "TooManyRequests",
                                   "Cannot evict pod as it would violate the pod's disruption budget.")

    budget = Budget()
    cp.api.validating.append(budget)
    await client.create(node("n1"))
    await client.create(owned("web-1"))
    said: list[str] = []
    code = await drain_nodes(client, ["n1"], DrainOptions(grace_period=0, retry_seconds=0.05, poll_seconds=0.05),
                             emit=said.append, warn=said.append)
    assert code == 0, said
    assert budget.refusals == 0
    assert said.count('error when evicting pods/"web-1" -n "default" (will retry after 0.05s): '
                      "Cannot evict pod as it would violate the pod's disruption budget.") == 2
    assert said[-1] == "node/n1 drained"
    await eventually(lambda: _gone(client, "web-1"))


async def test_drain_times_out_when_a_pod_never_stops(client: Client) -> None:
    await client.create(node("n1"))
    await client.create(owned("stuck"))  # no agent: a graceful deletion never completes
    said: list[str] = []
    code = await drain_nodes(client, ["n1"], DrainOptions(timeout=0.3, poll_seconds=0.05),
                             emit=said.append, warn=said.append)
    assert code == 1
    assert any('error when waiting for pod "stuck" in namespace "default" to terminate' in s for s in said)


async def _gone(client: Client, name: str) -> bool:
    return not await exists(client, name)
