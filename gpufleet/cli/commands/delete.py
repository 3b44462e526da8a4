"""`gpufleet delete`: delete objects named on the command line, in manifests, or by label,
and (by default) wait until they are really gone — a pod on a node first stops its
containers, and finalizers may hold an object for a while after the request."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.api.registry import ResourceType
from gpufleet.cli import manifests
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
    meta,
    out,
    parse_duration,
    run,
)
from gpufleet.client.errors import ApiError, Gone, NotFound

_CASCADE = {"background": "Background", "foreground": "Foreground", "orphan": "Orphan",
            "true": "Background", "false": "Orphan"}


@dataclass
class _Item:
    rt: ResourceType
    namespace: str | None
    name: str
    # Where the name came from, for messages about manifests.
    where: str = ""


def register(app: typer.Typer) -> None:
    @app.command()
    def delete(
        args: Annotated[list[str] | None, typer.Argument(
            help="KIND NAME..., KIND/NAME..., or KIND with -l/--all.", show_default=False)] = None,
        filename: Annotated[list[str] | None, typer.Option(
            "--filename", "-f", help="Delete the objects in these manifests (files, directories, -).")] = None,
        recursive: Annotated[bool, typer.Option("--recursive", "-R")] = False,
        selector: Annotated[str | None, typer.Option("--selector", "-l", help="Label selector.")] = None,
        all_: Annotated[bool, typer.Option("--all", help="Delete every object of the kind in the namespace.")]
        = False,
        all_namespaces: Annotated[bool, typer.Option(
            "--all-namespaces", "-A", help="With -l or --all: in every namespace.")] = False,
        grace_period: Annotated[int, typer.Option(
            "--grace-period", help="Seconds a pod gets to stop; -1 uses the pod's own setting.")] = -1,
        force: Annotated[bool, typer.Option(
            "--force", help="Remove at once, without waiting for the node to confirm the pod stopped.")] = False,
        wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until the objects are gone.")] = True,
        timeout: Annotated[str, typer.Option("--timeout", help="How long --wait waits, e.g. 60s, 5m.")] = "5m",
        cascade: Annotated[str, typer.Option(
            "--cascade", help="background, foreground (dependents first) or orphan (keep dependents).")]
        = "background",
        ignore_not_found: Annotated[bool, typer.Option(
            "--ignore-not-found", help="An object that does not exist is not an error.")] = False,
        dry_run: Annotated[str, typer.Option("--dry-run", help="none or server.")] = "none",
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """Delete objects by name, by label, or as listed in manifests."""
        policy = _CASCADE.get(cascade.lower())
        if policy is None:
            raise typer.BadParameter("must be background, foreground or orphan", param_hint="--cascade")
        try:
            timeout_s = parse_duration(timeout)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--timeout") from None
        if dry_run not in ("none", "server"):
            raise typer.BadParameter("must be none or server", param_hint="--dry-run")
        if force and grace_period < 0:
            grace_period = 0
        elif grace_period == 0 and not force:
            # As kubectl: 0 without --force means "as soon as possible", which is 1 second
            # of grace; immediate removal is what --force is for.
            grace_period = 1
        if force:
            err("Warning: Immediate deletion does not wait for confirmation that the running resource has "
                "been terminated. The resource may continue to run on the cluster indefinitely.")
        opts = _DeleteOptions(policy, grace_period if grace_period >= 0 else None, wait and dry_run == "none",
                              timeout_s, ignore_not_found, dry_run == "server", selector, all_, all_namespaces)
        run(lambda: _delete(args or [], filename or [], recursive, opts, kubeconfig, context, namespace))


@dataclass
class _DeleteOptions:
    propagation: str
    grace_period: int | None
    wait: bool
    timeout: float
    ignore_not_found: bool
    dry_run: bool
    selector: str | None
    all: bool
    all_namespaces: bool


async def _delete(args: list[str], files: list[str], recursive: bool, opts: _DeleteOptions,
                  kubeconfig: Path | None, context: str | None, namespace: str | None) -> int:
    if not args and not files:
        raise CliError("error: you must provide one or more resources by argument or filename (-f)")
    if args and files:
        raise CliError("error: pass objects either as arguments or with -f, not both")
    if (opts.selector or opts.all) and any("/" in a for a in args):
        raise CliError("error: -l and --all take a KIND, not KIND/NAME")
    failed = False
    async with connect(kubeconfig, namespace, context) as session:
        if files:
            items, failed = await _from_files(session, files, recursive)
        else:
            items = await _from_args(session, args, opts)
            if items is None:
                return 0
        deleted: list[tuple[_Item, str]] = []
        for item in items:
            try:
                uid = await _delete_one(session, item, opts)
            except NotFound as e:
                if not opts.ignore_not_found:
                    err(api_error_message(e))
                    failed = True
                continue
            except ApiError as e:
                prefix = f"error: {item.where}: " if item.where else ""
                err(prefix + api_error_message(e))
                failed = True
                continue
            out(f'{kind_ref(item.rt)} "{item.name}" deleted' + (" (server dry run)" if opts.dry_run else ""))
            if uid is not None:
                deleted.append((item, uid))
        if opts.wait and deleted:
            try:
                async with asyncio.timeout(opts.timeout):
                    await asyncio.gather(*(_wait_gone(session, item, uid) for item, uid in deleted))
            except TimeoutError:
                pending = [f"{item.rt.plural}/{item.name}" for item, _ in deleted]
                raise CliError(f"error: timed out waiting for the condition on {', '.join(pending)}") from None
    return 1 if failed else 0


async def _from_files(session: Session, files: list[str], recursive: bool) -> tuple[list[_Item], bool]:
    loaded = manifests.load(files, recursive=recursive)
    failed = bool(loaded.errors)
    for problem in loaded.errors:
        err(f"error: {problem}")
    items = []
    # Dependents before what they live in: the reverse of the order apply creates them in.
    for m in reversed(manifests.sort_for_apply(loaded.manifests)):
        rt = await session.kinds.for_manifest(m.api_version, m.kind)
        if rt is None:
            err(f'error: {m.where}: {m.title}: no matches for kind "{m.kind}" in version "{m.api_version}"')
            failed = True
            continue
        if not m.name:
            err(f"error: {m.where}: {m.kind}: metadata.name not set")
            failed = True
            continue
        ns = (m.namespace or session.namespace) if rt.namespaced else None
        items.append(_Item(rt, ns, m.name, m.where))
    return items, failed


async def _from_args(session: Session, args: list[str], opts: _DeleteOptions) -> list[_Item] | None:
    """The objects the arguments name; None when a selector matched nothing (reported)."""
    if any("/" in a for a in args):
        if not all("/" in a for a in args):
            raise CliError("error: there is no need to specify a resource type as a separate argument when "
                           "passing arguments in KIND/NAME form")
        items = []
        for a in args:
            kind, _, name = a.partition("/")
            rt = await session.kinds.resolve(kind)
            items.append(_Item(rt, session.namespace if rt.namespaced else None, name))
        return items
    rts = [await session.kinds.resolve(k) for k in args[0].split(",") if k]
    names = args[1:]
    if opts.selector or opts.all:
        if names:
            raise CliError("error: name cannot be provided when a selector or --all is specified")
        items = []
        for rt in rts:
            ns = None if (opts.all_namespaces or not rt.namespaced) else session.namespace
            resp = await session.client.raw_request("GET", rt.path(ns), params={"labelSelector": opts.selector})
            for obj in json.loads(resp.body).get("items") or []:
                m = meta(obj)
                items.append(_Item(rt, m.get("namespace") if rt.namespaced else None, m.get("name", "")))
        if not items:
            ns_text = "" if opts.all_namespaces else f" in {session.namespace} namespace"
            err(f"No resources found{ns_text}")
            return None
        return items
    if not names:
        raise CliError("error: resource(s) were provided, but no name was specified; "
                       "use -l SELECTOR or --all to delete by label or everything")
    return [_Item(rt, session.namespace if rt.namespaced else None, n) for rt in rts for n in names]


async def _delete_one(session: Session, item: _Item, opts: _DeleteOptions) -> str | None:
    """Send the DELETE; returns the object's uid when it may still exist (graceful deletion
    or finalizers), None when the answer says it is already gone."""
    body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": opts.propagation}
    if opts.grace_period is not None:
        body["gracePeriodSeconds"] = opts.grace_period
    resp = await session.client.raw_request(
        "DELETE", item.rt.path(item.namespace, item.name), json=body,
        params={"dryRun": "All" if opts.dry_run else None})
    data = json.loads(resp.body or b"{}")
    if data.get("kind") == "Status":
        return (data.get("details") or {}).get("uid") or ""
    if resp.status == 200 and not meta(data).get("deletionTimestamp"):
        return None
    return meta(data).get("uid") or ""


async def _wait_gone(session: Session, item: _Item, uid: str) -> None:
    """Return once no object with this name and uid exists (a new object under the same name
    does not count). Reads once, then watches from that read's version."""
    rt, ns, name = item.rt, item.namespace, item.name
    while True:
        try:
            current = json.loads((await session.client.raw_request("GET", rt.path(ns, name))).body)
        except NotFound:
            return
        if uid and meta(current).get("uid") != uid:
            return
        try:
            async for event in session.client.watch(
                rt, ns, resource_version=meta(current).get("resourceVersion"),
                field_selector=f"metadata.name={name}", raw=True,
            ):
                if event.type == "BOOKMARK":
                    continue
                same = not uid or meta(event.object).get("uid") == uid
                if event.type == "DELETED" and same:
                    return
                if event.type in ("ADDED", "MODIFIED") and not same:
                    return
        except Gone:
            continue
