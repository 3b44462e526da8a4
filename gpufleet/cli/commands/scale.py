"""`gpufleet scale`: set replicas through the /scale subresource, so it works for every kind
that has one (deployments, replicasets, training jobs) without knowing where the kind
keeps its replica count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.api.registry import ResourceType
from gpufleet.cli.output import (
    CliError,
    ContextOpt,
    KubeconfigOpt,
    NamespaceOpt,
    Session,
    api_error_message,
    connect,
    err,
    kind_ref,
    out,
    run,
)
from gpufleet.client.errors import ApiError


def register(app: typer.Typer) -> None:
    @app.command()
    def scale(
        args: Annotated[list[str], typer.Argument(help="KIND/NAME... or KIND NAME...", show_default=False)],
        replicas: Annotated[int, typer.Option("--replicas", help="The new number of replicas.")],
        current_replicas: Annotated[int, typer.Option(
            "--current-replicas", help="Only scale if the current number of replicas is this.")] = -1,
        resource_version: Annotated[str | None, typer.Option(
            "--resource-version", help="Only scale if the object is still at this resourceVersion.")] = None,
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """Set the number of replicas of a deployment, replica set, or any kind with a scale subresource."""
        if replicas < 0:
            raise typer.BadParameter("must be greater than or equal to 0", param_hint="--replicas")
        run(lambda: _scale(args, replicas, current_replicas, resource_version, kubeconfig, context, namespace))


async def _targets(session: Session, args: list[str]) -> list[tuple[ResourceType, str]]:
    if any("/" in a for a in args):
        if not all("/" in a for a in args):
            raise CliError("error: there is no need to specify a resource type as a separate argument when "
                           "passing arguments in KIND/NAME form")
        out_ = []
        for a in args:
            kind, _, name = a.partition("/")
            out_.append((await session.kinds.resolve(kind), name))
        return out_
    if len(args) < 2:
        raise CliError("error: name the object to scale: `gpufleet scale deployment/web --replicas 3` "
                       "or `gpufleet scale deployment web --replicas 3`")
    rt = await session.kinds.resolve(args[0])
    return [(rt, name) for name in args[1:]]


async def _scale(args: list[str], replicas: int, current: int, resource_version: str | None,
                 kubeconfig: Path | None, context: str | None, namespace: str | None) -> int:
    failed = False
    async with connect(kubeconfig, namespace, context) as session:
        for rt, name in await _targets(session, args):
            if "scale" not in rt.subresources:
                err(f"error: {kind_ref(rt)}/{name}: {rt.plural} cannot be scaled (the kind has no scale "
                    "subresource)")
                failed = True
                continue
            ns = session.namespace if rt.namespaced else None
            path = rt.path(ns, name, "scale")
            try:
                if current >= 0:
                    scale_obj = json.loads((await session.client.raw_request("GET", path)).body)
                    have = (scale_obj.get("spec") or {}).get("replicas", 0)
                    if have != current:
                        err(f"error: {kind_ref(rt)}/{name}: expected {current} replicas, found {have}")
                        failed = True
                        continue
                patch: dict[str, Any] = {"spec": {"replicas": replicas}}
                if resource_version:
                    patch["metadata"] = {"resourceVersion": resource_version}
                await session.client.raw_request(
                    "PATCH", path, content=json.dumps(patch), headers={"content-type": "application/merge-patch+json"})
            except ApiError as e:
                err(api_error_message(e))
                failed = True
                continue
            out(f"{kind_ref(rt)}/{name} scaled")
    return 1 if failed else 0
