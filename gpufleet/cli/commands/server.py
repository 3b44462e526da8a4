"""`gpufleet server`: the control plane alone, on SQLite or a shared PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path

import typer

from gpufleet.cli.commands.serveroptions import (
    LocalPathHelp,
    ServerOptions,
    check_port_free,
    with_server_options,
)
from gpufleet.utils import gctune

COMPONENTS = ("apiserver", "scheduler", "controllers")


def parse_components(value: str | None, controllers: bool = True) -> set[str]:
    """The parts --components names (default: all, or the API server alone with
    --no-controllers)."""
    if value is None:
        return set(COMPONENTS) if controllers else {"apiserver"}
    parts = {p.strip() for p in value.split(",") if p.strip()}
    unknown = sorted(parts - set(COMPONENTS))
    if unknown or not parts:
        raise typer.BadParameter(f"{', '.join(unknown) or 'nothing'}: name one or more of {', '.join(COMPONENTS)}, "
                                 "comma-separated", param_hint="--components")
    if not controllers and "controllers" in parts:
        raise typer.BadParameter("--no-controllers and --components with controllers say opposite things: "
                                 "give one", param_hint="--components")
    return parts


async def _serve_components(cp) -> None:
    """The scheduler and/or controllers against a remote API server, until interrupted."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    gctune.tune()
    await cp.start()
    gctune.freeze()
    running = [name for name, on in (("scheduler", cp.run_scheduler), ("controllers", cp.run_controllers)) if on]
    print(f"{', '.join(running) or 'nothing'} running against the API server at {cp.remote_url}", flush=True)
    await stop.wait()
    await cp.stop()


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
        components: str | None = typer.Option(
            None, "--components", help="What this process runs, comma-separated: apiserver (the store, the "
            "API and the gateway), scheduler, controllers. Default: all three (apiserver alone with "
            "--no-controllers). Without apiserver, the scheduler and controllers reach the API server named by "
            "--kubeconfig over HTTP, as node agents do, so each part can run in its own process."),
        kubeconfig: Path | None = typer.Option(
            None, "--kubeconfig", help="With --components lacking apiserver: the API server to use and the "
            "credentials (default: <state-dir>/kubeconfig, which the API server writes)."),
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

        parts = parse_components(components, controllers)

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
        if "apiserver" in parts:
            check_port_free(host, port)
        elif kubeconfig is None and not (state_dir.expanduser() / "kubeconfig").exists():
            raise typer.BadParameter(f"no kubeconfig at {state_dir / 'kubeconfig'}: give the API server's with "
                                     "--kubeconfig (or the --state-dir of the server that wrote it)",
                                     param_hint="--kubeconfig")
        state_dir = state_dir.expanduser().resolve()
        cp = checked.control_plane(store_url=store, host=host, port=port, state_dir=state_dir,
                                   run_controllers="controllers" in parts)
        cp.run_scheduler = "scheduler" in parts
        cp.run_apiserver = "apiserver" in parts
        cp.kubeconfig = kubeconfig.expanduser() if kubeconfig is not None else None
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
        if cp.run_apiserver:
            asyncio.run(_serve(cp, state_dir))
        else:
            asyncio.run(_serve_components(cp))
