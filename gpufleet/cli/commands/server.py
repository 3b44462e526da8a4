"""`gpufleet server`: the control plane alone, on SQLite or a shared PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer

from gpufleet.cli.commands.serveroptions import (
    LocalPathHelp,
    ServerOptions,
    check_port_free,
    with_server_options,
)


def register(app: typer.Typer) -> None:
    @app.command()
    @with_server_options
    def server(
        *,
        store: str = typer.Option("sqlite:///~/.gpufleet/state.db", "--store",
                                  help="sqlite:///PATH or postgresql://USER@HOST:PORT/DB"),
        port: int = typer.Option(6443, "--port"),
        host: str = typer.Option("127.0.0.1", "--host"),
        state_dir: Path = typer.Option(Path("~/.gpufleet"), "--state-dir",
                                       help="Where the kubeconfig, tokens and certificates are kept."),
        controllers: bool = typer.Option(True, "--controllers/--no-controllers",
                                         help="Run the controllers in this process."),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
        options: ServerOptions,
        leader_elect: bool = typer.Option(
            True, "--leader-elect/--no-leader-elect", help="Run the scheduler and the controllers only while "
            "holding their Lease in kube-system, so several servers on one PostgreSQL have one active of each."),
        lease_duration: float = typer.Option(
            15.0, "--leader-elect-lease-duration", help="Seconds a standby waits, after it last saw the "
            "leader renew, before it takes the Lease over."),
        renew_deadline: float = typer.Option(
            10.0, "--leader-elect-renew-deadline", help="Seconds the leader keeps trying to renew before it "
            "stops leading (less than the lease duration)."),
        retry_period: float = typer.Option(
            2.0, "--leader-elect-retry-period", help="Seconds between two attempts to acquire or renew."),
        local_path_dir: str = typer.Option("/var/lib/gpufleet/local-path", "--local-path-dir", help=LocalPathHelp),
    ) -> None:
        """Run the API server (and controllers) without a local node agent."""
        from gpufleet.cli.commands.up import _serve

        logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if store.startswith("sqlite:///~"):
            store = "sqlite:///" + str(Path(store.removeprefix("sqlite:///")).expanduser())
        if store.startswith("sqlite:///") and ":memory:" not in store:
            db_dir = Path(store.removeprefix("sqlite://")).parent
            try:
                db_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise typer.BadParameter(f"cannot create {db_dir} for the database ({exc.strerror}); "
                                         "choose a directory you can write to", param_hint="--store") from None
        checked = options.checked()
        check_port_free(host, port)
        state_dir = state_dir.expanduser().resolve()
        cp = checked.control_plane(store_url=store, host=host, port=port, state_dir=state_dir,
                                   run_controllers=controllers)
        cp.local_path_dir = local_path_dir
        if leader_elect:
            from gpufleet.client.leaderelection import LeaderElectionConfig

            try:
                LeaderElectionConfig(name="check", identity="check", lease_duration=lease_duration,
                                     renew_deadline=renew_deadline, retry_period=retry_period)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint="--leader-elect-lease-duration") from None
        cp.leader_elect = leader_elect
        cp.lease_duration, cp.renew_deadline, cp.retry_period = lease_duration, renew_deadline, retry_period
        asyncio.run(_serve(cp, state_dir))
