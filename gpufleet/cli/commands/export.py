"""`gpufleet export`: the user's objects as manifests that apply to a real Kubernetes
cluster (and back to gpufleet with `gpufleet apply -f`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufleet.api.registry import REGISTRY, ResourceType
from gpufleet.cli.output import CliError, ContextOpt, KubeconfigOpt, NamespaceOpt, connect, err, out, run
from gpufleet.export import gather, to_files, to_yaml
from gpufleet.export.clean import RUNTIME_KINDS


def register(app: typer.Typer) -> None:
    @app.command()
    def export(
        kinds: Annotated[list[str] | None, typer.Argument(
            help="Kinds to export (e.g. `deploy svc hpa pytorchjobs`); default: every kind.",
            show_default=False)] = None,
        all_namespaces: Annotated[bool, typer.Option(
            "--all-namespaces", "-A", help="Every namespace, and the cluster-scoped objects.")] = False,
        output_dir: Annotated[Path | None, typer.Option(
            "--output-dir", "-o", help="Write one numbered file per kind into this directory "
            "(default: one YAML stream on stdout).")] = None,
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """Write the objects users made as manifests for a real Kubernetes cluster."""
        if all_namespaces and namespace:
            raise typer.BadParameter("give either --namespace or --all-namespaces, not both",
                                     param_hint="--all-namespaces")
        run(lambda: _export(kinds or [], all_namespaces, output_dir, kubeconfig, context, namespace))


async def _export(kinds: list[str], all_namespaces: bool, output_dir: Path | None, kubeconfig: Path | None,
                  context: str | None, namespace: str | None) -> int:
    async with connect(kubeconfig, namespace, context) as session:
        if kinds:
            types: list[ResourceType] = []
            for name in (n for arg in kinds for n in arg.split(",") if n):
                rt = await session.kinds.resolve(name)
                if (rt.group, rt.kind) in RUNTIME_KINDS:
                    raise CliError(f"error: {rt.plural} describe the running cluster and are not exported; "
                                   "a real cluster makes its own")
                if rt not in types:
                    types.append(rt)
        else:
            types = [rt for rt in REGISTRY.all() if (rt.group, rt.kind) not in RUNTIME_KINDS]
        result = await gather(session.client, types, None if all_namespaces else session.namespace,
                              skip_forbidden=not kinds)
    if output_dir is None:
        out(to_yaml(result).rstrip("\n"))
    else:
        files = _write_dir(output_dir, to_files(result))
        err(f"wrote {len(result.documents)} objects in {files} files to {output_dir}")
    if result.skipped:
        err(f"Warning: left out {', '.join(result.skipped)}: not allowed to list them")
    for requirement in result.requirements:
        err(f"note: the target cluster needs {requirement.split(' (')[0]}")
    return 0


def _write_dir(directory: Path, files: dict[str, str]) -> int:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (directory / name).write_text(text)
    except OSError as e:
        raise CliError(f"error: cannot write to --output-dir {directory}: {e.strerror}") from None
    return len(files)
