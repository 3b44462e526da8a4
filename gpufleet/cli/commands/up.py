"""`gpufleet up`: the whole control plane on this machine, with SQLite under a state dir."""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
    ) -> None:
        """Start a local cluster: API server, scheduler, controllers (runs until interrupted)."""
        from gpufleet.cli.controlplane import ControlPlane

        logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        state_dir = state_dir.expanduser().resolve()
        state_dir.mkdir(parents=True, exist_ok=True)
        cp = ControlPlane(store_url=f"sqlite:///{state_dir / 'state.db'}", host=host, port=port,
                          state_dir=state_dir)
        asyncio.run(_serve(cp, state_dir))


async def _serve(cp, state_dir: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await cp.start()
    kubeconfig = state_dir / "kubeconfig"
    console.print(f"[green]gpufleet is up[/green]: API at [bold]{cp.url}[/bold]")
    console.print(f"kubeconfig: {kubeconfig}")
    console.print(f"  export KUBECONFIG={kubeconfig}   # for kubectl and the kubernetes client")
    print(f"API server listening on {cp.url}", flush=True)
    await stop.wait()
    console.print("stopping ...")
    await cp.stop()
