"""`gpufleet up`: the whole control plane on this machine, with SQLite under a state dir."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
from pathlib import Path

import typer
from rich.console import Console

console = Console(stderr=True)


def register(app: typer.Typer) -> None:
    @app.command()
    def up(
        state_dir: Path = typer.Option(Path("~/.gpufleet"), "--state-dir", help="Where the database, "
                                       "kubeconfig and logs live."),
        port: int = typer.Option(6443, "--port", help="API port on 127.0.0.1 (0 picks a free one)."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
        # --- the local node agent ---
        agent: bool = typer.Option(True, "--agent/--no-agent", help="Also run a node agent for this machine."),
        gpus: int | None = typer.Option(None, "--gpus", help="Declare this many GPUs for the local agent "
                                        "(default: what NVML finds)."),
        gpu_model: str | None = typer.Option(None, "--gpu-model", help="Model of the declared GPUs."),
        runtime: str = typer.Option("process", "--runtime", help="The local agent's runtime: process, podman "
                                    "or simulated."),
    ) -> None:
        """Start a local cluster: API server, scheduler, controllers and a node agent (runs until interrupted)."""
        from gpufleet.cli.controlplane import ControlPlane

        logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        state_dir = state_dir.expanduser().resolve()
        state_dir.mkdir(parents=True, exist_ok=True)
        cp = ControlPlane(store_url=f"sqlite:///{state_dir / 'state.db'}", host=host, port=port,
                          state_dir=state_dir)
        local_agent = dict(gpus=gpus, gpu_model=gpu_model, runtime=runtime, address=host) if agent else None
        asyncio.run(_serve(cp, state_dir, local_agent))


def _write_join_token(state_dir: Path) -> Path:
    """The token agents on other machines join with; kept across restarts."""
    path = state_dir / "join-token"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return path


async def _start_local_agent(cp, state_dir: Path, options: dict):
    """An agent for this machine in the same process, talking to the API in-process."""
    from gpufleet.agent.agent import AgentConfig, NodeAgent
    from gpufleet.agent.factory import build_devices, build_runtime
    from gpufleet.agent.node import hostname
    from gpufleet.client import Client, LocalTransport

    name = hostname()
    agent_dir = state_dir / "agent"
    agent_dir.mkdir(parents=True, exist_ok=True)
    address = options["address"] if options["address"] not in ("0.0.0.0", "::") else "127.0.0.1"
    agent = NodeAgent(Client(LocalTransport(cp.api)), build_runtime(options["runtime"], agent_dir),
                      build_devices(name, gpus=options["gpus"], gpu_model=options["gpu_model"]),
                      AgentConfig(node_name=name, state_dir=agent_dir, address=address))
    await agent.start()
    return agent


async def _serve(cp, state_dir: Path, local_agent: dict | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await cp.start()
    agent = None
    if local_agent is not None:
        _write_join_token(state_dir)
        agent = await _start_local_agent(cp, state_dir, local_agent)
    kubeconfig = state_dir / "kubeconfig"
    console.print(f"[green]gpufleet is up[/green]: API at [bold]{cp.url}[/bold]")
    console.print(f"kubeconfig: {kubeconfig}")
    console.print(f"  export KUBECONFIG={kubeconfig}   # for kubectl and the kubernetes client")
    if agent is not None:
        console.print(f"node {agent.name}: {len(agent.gpus)} GPU(s), {agent.runtime.name} runtime; "
                      f"join more with `gpufleet agent --server {cp.url} --token-file {state_dir / 'join-token'}`")
    print(f"API server listening on {cp.url}", flush=True)
    await stop.wait()
    console.print("stopping ...")
    if agent is not None:
        await agent.stop()
    await cp.stop()
