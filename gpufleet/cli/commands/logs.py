"""`gpufleet logs`: a container's output, through the API's pods/log (which the API server
fetches from the pod's node agent)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.output import (
    CliError,
    ContextOpt,
    KubeconfigOpt,
    NamespaceOpt,
    connect,
    parse_duration,
    run,
)


def register(app: typer.Typer) -> None:
    @app.command()
    def logs(
        pod: Annotated[str, typer.Argument(help="The pod (NAME or pod/NAME).", show_default=False)],
        container: Annotated[str | None, typer.Option(
            "--container", "-c", help="The container (default: the pod's only one).")] = None,
        follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream the log until the container stops.")]
        = False,
        previous: Annotated[bool, typer.Option(
            "--previous", "-p", help="The log of the container's previous instance (before its last restart).")]
        = False,
        tail: Annotated[int, typer.Option("--tail", help="Only the last N lines (-1: all).")] = -1,
        since: Annotated[str | None, typer.Option("--since", help="Only lines newer than this, e.g. 5m.")] = None,
        timestamps: Annotated[bool, typer.Option("--timestamps", help="Prefix each line with its time.")] = False,
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """Print the logs of a container in a pod."""
        name = pod.split("/", 1)[1] if pod.startswith(("pod/", "pods/", "po/")) else pod
        if "/" in name:
            raise typer.BadParameter("only pods have logs: give NAME or pod/NAME", param_hint="POD")
        since_seconds = None
        if since:
            try:
                since_seconds = max(int(parse_duration(since)), 1)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint="--since") from None
        run(lambda: _logs(name, container, follow, previous, tail, since_seconds, timestamps, kubeconfig, context,
                          namespace))


async def _logs(name: str, container: str | None, follow: bool, previous: bool, tail: int,
                since_seconds: int | None, timestamps: bool, kubeconfig: Path | None, context: str | None,
                namespace: str | None) -> int:
    if follow and previous:
        raise CliError("error: only one of --follow and --previous can be given")
    async with connect(kubeconfig, namespace, context) as session:
        kwargs = dict(container=container, tail_lines=tail if tail >= 0 else None, previous=previous,
                      since_seconds=since_seconds, timestamps=timestamps)
        if not follow:
            text = await session.client.log(name, session.namespace, **kwargs)
            sys.stdout.write(text)
            sys.stdout.flush()
            return 0
        lines = await session.client.log(name, session.namespace, follow=True, **kwargs)
        async for line in lines:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    return 0
