"""`gpufleet version`: this client's version and the server's /version."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.output import ContextOpt, KubeconfigOpt, NamespaceOpt, connect, dump, out, run


def client_version() -> str:
    try:
        return "v" + metadata.version("gpufleet")
    except metadata.PackageNotFoundError:
        return "v0.0.0-unknown"


def register(app: typer.Typer) -> None:
    @app.command()
    def version(
        client: Annotated[bool, typer.Option("--client", help="Only this client's version.")] = False,
        output: Annotated[str, typer.Option("--output", "-o", help="json or yaml.")] = "",
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """Print the client and server versions."""
        del namespace  # accepted like every command's, so scripts can pass it everywhere
        if output not in ("", "json", "yaml"):
            raise typer.BadParameter("must be json or yaml", param_hint="--output")
        run(lambda: _version(client, output, kubeconfig, context))


async def _version(client_only: bool, output: str, kubeconfig: Path | None, context: str | None) -> int:
    info: dict[str, Any] = {"clientVersion": {"gitVersion": client_version(), "program": "gpufleet"}}
    if not output:
        out(f"Client Version: {info['clientVersion']['gitVersion']}")
    if client_only:
        if output:
            out(dump(info, output))
        return 0
    async with connect(kubeconfig, None, context) as session:
        server = json.loads((await session.client.raw_request("GET", "/version")).body or b"{}")
    info["serverVersion"] = server
    if output:
        out(dump(info, output))
    else:
        out(f"Server Version: {server.get('gitVersion', '<unknown>')}")
        out(f"Server: {session.server}")
    return 0
