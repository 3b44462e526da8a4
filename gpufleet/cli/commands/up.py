"""`gpufleet up`: the whole control plane on this machine, with SQLite under a state dir."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path

import typer
from rich.console import Console

from gpufleet.cli.commands.serveroptions import (  # noqa: F401 - imported from here
    LocalPathHelp,
    ServerOptions,
    audit_options,
    check_port_free,
    pod_security_config,
    with_server_options,
)
from gpufleet.utils import gctune

console = Console(stderr=True, soft_wrap=True)  # no line breaks inside commands to copy


def register(app: typer.Typer) -> None:
    @app.command()
    @with_server_options
    def up(
        *,
        state_dir: Path = typer.Option(Path("~/.gpufleet"), "--state-dir", help="Where the database, "
                                       "kubeconfig and logs live."),
        port: int = typer.Option(6443, "--port", help="API port on 127.0.0.1 (0 picks a free one)."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
        # --- the local node agent ---
        agent: bool = typer.Option(True, "--agent/--no-agent", help="Also run a node agent for this machine."),
        keep_pods: bool = typer.Option(False, "--keep-pods", help="Leave the local node's containers running "
                                       "when gpufleet up stops (the next start adopts them); by default they "
                                       "stop with it."),
        gpus: int | None = typer.Option(None, "--gpus", help="Declare this many GPUs for the local agent "
                                        "(default: what NVML finds)."),
        gpu_model: str | None = typer.Option(None, "--gpu-model", help="Model of the declared GPUs."),
        gpu_memory: int | None = typer.Option(None, "--gpu-memory", help="Memory of each declared GPU, in MiB "
                                              "(default: read from the model name, as in H100-SXM-80GB)."),
        runtime: str = typer.Option("auto", "--runtime", help="The local agent's runtime: podman (OCI "
                                    "containers), process (sandboxed host processes), simulated, or auto "
                                    "(podman where it can run containers, else process)."),
        options: ServerOptions,
        local_path_dir: Path | None = typer.Option(None, "--local-path-dir", help=LocalPathHelp
                                                   + " Default: <state-dir>/local-path."),
    ) -> None:
        """Start a local cluster: API server, scheduler, controllers and a node agent (runs until interrupted).

        The only server of its embedded database, it leads at once: it takes the scheduler's
        and the controller manager's Leases as it starts, with no election to wait for (a Lease
        left by an earlier `gpufleet up` on this machine whose process is gone is taken over
        at once), so there are no --leader-elect flags here. For several servers on one
        PostgreSQL, one of them leading, run `gpufleet server` (--leader-elect and its timings).
        """
        from gpufleet.utils.files import private_dir

        logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        # One line per probe and per metrics read is noise unless asked for.
        logging.getLogger("httpx").setLevel(logging.DEBUG if verbose else logging.WARNING)
        checked = options.checked()
        if agent:
            from gpufleet.agent.factory import check_declared

            try:
                check_declared(gpus, gpu_model, gpu_memory)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint="--gpus/--gpu-model/--gpu-memory") from None
        check_port_free(host, port)
        state_dir = private_dir(state_dir.expanduser().resolve())
        cp = checked.control_plane(store_url=f"sqlite:///{state_dir / 'state.db'}", host=host, port=port,
                                   state_dir=state_dir)
        # This machine is the only node and its agent runs as this user: volumes live under
        # the state dir rather than in /var/lib.
        cp.local_path_dir = str((local_path_dir or state_dir / "local-path").expanduser().resolve())
        local_agent = dict(gpus=gpus, gpu_model=gpu_model, gpu_memory=gpu_memory, runtime=runtime, address=host,
                           keep_pods=keep_pods) if agent else None
        asyncio.run(_serve(cp, state_dir, local_agent))


async def _start_local_agent(cp, state_dir: Path, options: dict):
    """An agent for this machine in the same process, talking to the API in-process."""
    from gpufleet.agent.agent import AgentConfig, NodeAgent
    from gpufleet.agent.bootstrap import node_token
    from gpufleet.agent.factory import build_devices, build_runtime
    from gpufleet.agent.node import hostname
    from gpufleet.cli.commands.agent import api_address
    from gpufleet.client import Client, LocalTransport
    from gpufleet.utils.files import private_dir

    name = hostname()
    agent_dir = private_dir(state_dir / "agent")
    address = options["address"] if options["address"] not in ("0.0.0.0", "::") else "127.0.0.1"
    # It joins like any other agent (join token -> its own node token), so NodeRestriction
    # holds for it too; with --insecure there is no token and it runs unrestricted.
    token = None
    if cp.secure:
        token = await node_token(lambda t: Client(LocalTransport(cp.api, token=t)), cp.join_token, name, agent_dir)
    agent = NodeAgent(Client(LocalTransport(cp.api, token=token)), build_runtime(options["runtime"], agent_dir,
                                                                    hidden_paths=[str(state_dir)], address=address),
                      build_devices(name, gpus=options["gpus"], gpu_model=options["gpu_model"],
                                    gpu_memory_mib=options.get("gpu_memory")),
                      AgentConfig(node_name=name, state_dir=agent_dir, address=address,
                                  secure_port=token is not None,
                                  api_server=api_address(cp.url),
                                  stop_pods_on_exit=not options.get("keep_pods", False)))
    await agent.start()
    return agent


async def _serve(cp, state_dir: Path, local_agent: dict | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    gctune.tune()
    await cp.start()
    agent = None
    if local_agent is not None:
        agent = await _start_local_agent(cp, state_dir, local_agent)
    gctune.freeze()
    kubeconfig = state_dir / "kubeconfig"
    console.print(f"[green]gpufleet is up[/green]: API at [bold]{cp.url}[/bold]")
    console.print(f"kubeconfig: {kubeconfig}")
    console.print(f"  export KUBECONFIG={kubeconfig}   # for kubectl and the kubernetes client")
    console.print(f"dashboard: [bold]{cp.url}/ui/[/bold]  (sign in with the token in the kubeconfig, "
                  "or one from `gpufleet token create`)")
    if agent is not None:
        console.print(f"node {agent.name}: {len(agent.gpus)} GPU(s), {agent.runtime.name} runtime; "
                      f"join more with `gpufleet agent --server {cp.kubeconfig_url} --token-file "
                      f"{state_dir / 'join-token'}"
                      f"{' --certificate-authority ' + str(cp.tls_ca_file) if cp.secure and cp.tls_ca_file else ''}`")
    if cp.gateway is not None:
        console.print(f"gateway: [bold]{cp.gateway.url}[/bold]/services/<namespace>/<name>/  "
                      f"(address also in {state_dir / 'gateway-url'})")
        print(f"Gateway listening on {cp.gateway.url}", flush=True)
    print(f"API server listening on {cp.url}", flush=True)
    await stop.wait()
    console.print("stopping ...")
    if agent is not None:
        await agent.stop()
    await cp.stop()
