"""`gpufleet server`: the control plane alone, on SQLite or a shared PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer

from gpufleet.cli.commands.up import (
    GatewayPortOption,
    HpaSyncPeriodOption,
    InsecureOption,
    TlsCaOption,
    TlsCertOption,
    TlsKeyOption,
    TokenFileOption,
    security_options,
)


def register(app: typer.Typer) -> None:
    @app.command()
    def server(
        store: str = typer.Option("sqlite:///~/.gpufleet/state.db", "--store",
                                  help="sqlite:///PATH or postgresql://USER@HOST:PORT/DB"),
        port: int = typer.Option(6443, "--port"),
        host: str = typer.Option("127.0.0.1", "--host"),
        state_dir: Path = typer.Option(Path("~/.gpufleet"), "--state-dir",
                                       help="Where the kubeconfig, tokens and certificates are kept."),
        controllers: bool = typer.Option(True, "--controllers/--no-controllers",
                                         help="Run the controllers in this process."),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
        insecure: bool = InsecureOption,
        tls_cert_file: Path | None = TlsCertOption,
        tls_key_file: Path | None = TlsKeyOption,
        tls_ca_file: Path | None = TlsCaOption,
        token_auth_file: Path | None = TokenFileOption,
        gateway_port: int = GatewayPortOption,
        hpa_sync_period: float = HpaSyncPeriodOption,
    ) -> None:
        """Run the API server (and controllers) without a local node agent."""
        from gpufleet.cli.commands.up import _serve
        from gpufleet.cli.controlplane import ControlPlane

        logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if store.startswith("sqlite:///~"):
            store = "sqlite:///" + str(Path(store.removeprefix("sqlite:///")).expanduser())
            Path(store.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        state_dir = state_dir.expanduser().resolve()
        cp = ControlPlane(store_url=store, host=host, port=port, state_dir=state_dir, run_controllers=controllers,
                          **security_options(insecure, tls_cert_file, tls_key_file, tls_ca_file, token_auth_file))
        cp.gateway_port = gateway_port if gateway_port >= 0 else None
        cp.hpa_sync_period = hpa_sync_period
        asyncio.run(_serve(cp, state_dir))
