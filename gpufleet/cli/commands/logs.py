"""`gpufleet logs`: a container's output, through the API's pods/log (which the API server
fetches from the pod's node agent)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

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

# KIND/NAME whose log is one of its pods' (as kubectl logs job/NAME reads the Job's pod):
# a Job's, a RayJob's submitter (the Job of its name), a RayCluster's head.
_OWNER_PODS: dict[str, Callable[[str], dict[str, str]]] = {
    "job": lambda n: {"job-name": n},
    "jobs": lambda n: {"job-name": n},
    "rayjob": lambda n: {"job-name": n},
    "rayjobs": lambda n: {"job-name": n},
    "raycluster": lambda n: {"ray.io/cluster": n, "ray.io/node-type": "head"},
    "rayclusters": lambda n: {"ray.io/cluster": n, "ray.io/node-type": "head"},
}


async def _newest_pod(session: Any, what: str, selector: dict[str, str]) -> str:
    pods = await session.client.list("Pod", session.namespace, label_selector=selector, raw=True)
    if not pods:
        raise CliError(f"error: no pod found for {what}")
    newest = max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
    return newest["metadata"]["name"]


def register(app: typer.Typer) -> None:
    @app.command()
    def logs(
        pod: Annotated[str, typer.Argument(help="The pod (NAME or pod/NAME), or job/, rayjob/ or raycluster/NAME.", show_default=False)],
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
        selector = None
        if "/" in name:
            kind, _, owner = name.partition("/")
            if kind.lower() not in _OWNER_PODS:
                raise typer.BadParameter(f"give NAME, pod/NAME or one of {', '.join(sorted(_OWNER_PODS))}/NAME",
                                         param_hint="POD")
            selector = _OWNER_PODS[kind.lower()](owner)
        since_seconds = None
        if since:
            try:
                since_seconds = max(int(parse_duration(since)), 1)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint="--since") from None
        run(lambda: _logs(name, container, follow, previous, tail, since_seconds, timestamps, kubeconfig, context,
                          namespace, selector))


async def _logs(name: str, container: str | None, follow: bool, previous: bool, tail: int,
                since_seconds: int | None, timestamps: bool, kubeconfig: Path | None, context: str | None,
                namespace: str | None, selector: dict[str, str] | None = None) -> int:
    if follow and previous:
        raise CliError("error: only one of --follow and --previous can be given")
    async with connect(kubeconfig, namespace, context) as session:
        if selector is not None:
            name = await _newest_pod(session, name, selector)
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
