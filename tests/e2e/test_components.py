"""`gpufleet server --components`: the API server in one process, the scheduler and the
controllers in another that reaches it over HTTPS with the kubeconfig the first wrote, as a
node agent does. A pod waits until the second process runs, then is scheduled; a Deployment
gets its pods from the controllers there."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from e2e_helpers import GPUFLEET, Fleet, _kill_proc, running_fleet

from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import transport_from_kubeconfig


def _pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}]}}


def _deployment(name: str, replicas: int) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": _pod(name)["spec"]}}}


def _start_components(fleet: Fleet, log: Path) -> subprocess.Popen:
    """`gpufleet server --components scheduler,controllers` on the API server's state dir
    (its kubeconfig: the address, the CA, the admin token)."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [*GPUFLEET, "server", "--components", "scheduler,controllers", "--state-dir", str(fleet.state)],
            stdout=out, stderr=subprocess.STDOUT, env=fleet.env, start_new_session=True)


async def test_apiserver_and_components_in_separate_processes(tmp_path: Path) -> None:
    server = ["server", "--store", f"sqlite:///{tmp_path / 'state.db'}", "--components", "apiserver"]
    with running_fleet(tmp_path, server, ["node-a"], gpus=1, runtime="simulated") as fleet:
        client = Client(transport_from_kubeconfig(fleet.kubeconfig), read_retries=3)
        components: subprocess.Popen | None = None
        try:
            await fleet.nodes_ready(client)
            await client.create(_pod("early"), raw=True)
            await client.create(_deployment("web", 2), raw=True)
            # The API server alone schedules nothing and runs no controller.
            await asyncio.sleep(3)
            assert not (await client.get("pods", "early", "default", raw=True))["spec"].get("nodeName")
            assert not len(await client.list("replicasets", "default", raw=True))
            leases = {lease["metadata"]["name"] for lease in await client.list("leases", "kube-system", raw=True)}
            assert not {"gpufleet-scheduler", "gpufleet-controller-manager"} & leases, leases

            log = tmp_path / "components.log"
            components = _start_components(fleet, log)

            async def early_running() -> bool:
                pod = await client.get("pods", "early", "default", raw=True)
                return pod["spec"].get("nodeName") == "node-a" and pod.get("status", {}).get("phase") == "Running"

            await fleet.wait_until(early_running, 60, "the pod scheduled and running")

            async def web_pods_bound() -> bool:
                pods = await client.list("pods", "default", label_selector="app=web", raw=True)
                return len(pods) == 2 and all(p["spec"].get("nodeName") == "node-a" for p in pods)

            await fleet.wait_until(web_pods_bound, 60, "the Deployment's 2 pods bound")
            # Both components hold their Leases from the second process, not the API server's.
            leases = {lease["metadata"]["name"]: lease["spec"].get("holderIdentity")
                      for lease in await client.list("leases", "kube-system", raw=True)}
            holder = f"_{components.pid}_"
            assert holder in (leases.get("gpufleet-scheduler") or ""), leases
            assert holder in (leases.get("gpufleet-controller-manager") or ""), leases
            assert "running against the API server at https://" in log.read_text()
        finally:
            if components is not None:
                _kill_proc(components)
            await client.close()



def test_components_are_checked() -> None:
    import pytest
    import typer

    from gpufleet.cli.commands.server import parse_components

    assert parse_components(None) == {"apiserver", "scheduler", "controllers"}
    assert parse_components(None, controllers=False) == {"apiserver"}
    assert parse_components(" scheduler, controllers ") == {"scheduler", "controllers"}
    for bad in ("", "apiserver,kubelet", ","):
        with pytest.raises(typer.BadParameter, match="apiserver, scheduler, controllers"):
            parse_components(bad)
    with pytest.raises(typer.BadParameter, match="opposite"):
        parse_components("apiserver,controllers", controllers=False)
