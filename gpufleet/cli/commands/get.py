"""`gpufleet get`: list objects as the server's tables, or print them as YAML, JSON or names,
and with -w keep printing the rows that change."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.api.registry import ResourceType
from gpufleet.cli.output import (
    TABLE_ACCEPT,
    CliError,
    ContextOpt,
    KubeconfigOpt,
    NamespaceOpt,
    Session,
    TablePrinter,
    TableView,
    api_error_message,
    connect,
    dump,
    err,
    kind_ref,
    meta,
    out,
    run,
    strip_managed_fields,
)
from gpufleet.client.errors import ApiError, Expired, Gone, TransportError, error_from_status

_OUTPUTS = ("", "wide", "yaml", "json", "name")


@dataclass
class Target:
    rt: ResourceType
    # Empty: every object of the kind (narrowed by selectors).
    names: list[str]


def register(app: typer.Typer) -> None:
    @app.command()
    def get(
        args: Annotated[list[str], typer.Argument(
            help="KIND[,KIND...] [NAME...], or KIND/NAME..., e.g. `pods`, `deploy web`, `pods,svc`, `all`.",
            show_default=False)],
        output: Annotated[str, typer.Option("--output", "-o", help="wide, yaml, json or name.")] = "",
        selector: Annotated[str | None, typer.Option(
            "--selector", "-l", help="Label selector, e.g. app=web,tier!=cache.")] = None,
        field_selector: Annotated[str | None, typer.Option(
            "--field-selector", help="Field selector, e.g. status.phase=Running.")] = None,
        all_namespaces: Annotated[bool, typer.Option(
            "--all-namespaces", "-A", help="List across all namespaces.")] = False,
        watch: Annotated[bool, typer.Option(
            "--watch", "-w", help="After listing, print each change as it happens (Ctrl-C to stop).")] = False,
        watch_only: Annotated[bool, typer.Option(
            "--watch-only", help="Like --watch, without listing first.")] = False,
        show_labels: Annotated[bool, typer.Option("--show-labels", help="Add a LABELS column.")] = False,
        no_headers: Annotated[bool, typer.Option("--no-headers", help="Leave out the header row.")] = False,
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """Show objects: a table by default (the columns the server defines for the kind)."""
        if output not in _OUTPUTS:
            raise typer.BadParameter(f"must be one of {', '.join(o for o in _OUTPUTS if o)}",
                                     param_hint="--output")
        opts = _GetOptions(output, selector, field_selector, all_namespaces, watch or watch_only, watch_only,
                           show_labels, no_headers)
        run(lambda: _get(args, opts, kubeconfig, context, namespace))


@dataclass
class _GetOptions:
    output: str
    selector: str | None
    field_selector: str | None
    all_namespaces: bool
    watch: bool
    watch_only: bool
    show_labels: bool
    no_headers: bool


async def parse_targets(session: Session, args: list[str]) -> list[Target]:
    """kubectl's argument forms: `KIND[,KIND] [NAME...]` or `KIND/NAME...`; `all` expands to
    the kinds in the "all" category."""
    if not args:
        raise CliError("error: you must specify the type of resource to get, e.g. `gpufleet get pods`")
    if any("/" in a for a in args):
        if not all("/" in a for a in args):
            raise CliError("error: there is no need to specify a resource type as a separate argument "
                           "when passing arguments in KIND/NAME form (e.g. 'gpufleet get pod/web-0')")
        targets: list[Target] = []
        for a in args:
            kind, _, name = a.partition("/")
            if not kind or not name:
                raise CliError(f"error: arguments in KIND/NAME form must have a single KIND and NAME: {a!r}")
            rt = await session.kinds.resolve(kind)
            existing = next((t for t in targets if t.rt.key == rt.key), None)
            if existing is not None:
                existing.names.append(name)
            else:
                targets.append(Target(rt, [name]))
        return targets
    kinds, names = args[0], args[1:]
    targets = []
    for kind in (k for k in kinds.split(",") if k):
        if kind == "all":
            rts = await session.kinds.category("all")
        else:
            rts = [await session.kinds.resolve(kind)]
        for rt in rts:
            if not any(t.rt.key == rt.key for t in targets):
                targets.append(Target(rt, list(names)))
    if not targets:
        raise CliError("error: you must specify the type of resource to get")
    return targets


def _params(opts: _GetOptions, extra_field: str | None = None) -> dict[str, Any]:
    fields = ",".join(f for f in (opts.field_selector, extra_field) if f) or None
    return {"labelSelector": opts.selector or None, "fieldSelector": fields}


async def _get(args: list[str], opts: _GetOptions, kubeconfig: Path | None, context: str | None,
               namespace: str | None) -> int:
    async with connect(kubeconfig, namespace, context) as session:
        targets = await parse_targets(session, args)
        if opts.all_namespaces and any(t.names for t in targets):
            raise CliError("error: a resource cannot be retrieved by name across all namespaces")
        if opts.watch:
            if len(targets) != 1:
                raise CliError("error: you may only specify a single resource type to watch")
            return await _watch(session, targets[0], opts)
        if opts.output in ("yaml", "json", "name"):
            return await _print_objects(session, targets, opts)
        return await _print_tables(session, targets, opts)


def _ns(session: Session, rt: ResourceType, opts: _GetOptions) -> str | None:
    if not rt.namespaced or opts.all_namespaces:
        return None
    return session.namespace


async def _fetch_table(session: Session, target: Target, opts: _GetOptions) -> tuple[TableView, bool]:
    """The kind's Table: a list, or the named objects' rows. The flag says whether a named
    object was missing (reported on stderr already)."""
    rt = target.rt
    ns = _ns(session, rt, opts)
    headers = {"accept": TABLE_ACCEPT}
    if not target.names:
        resp = await session.client.raw_request(
            "GET", rt.path(ns), params={**_params(opts), "includeObject": "Metadata"}, headers=headers)
        return TableView.from_response(json.loads(resp.body)), False
    view: TableView | None = None
    missing = False
    for name in target.names:
        try:
            resp = await session.client.raw_request(
                "GET", rt.path(ns, name), params={"includeObject": "Metadata"}, headers=headers)
        except ApiError as e:
            err(api_error_message(e))
            missing = True
            continue
        part = TableView.from_response(json.loads(resp.body))
        if view is None:
            view = part
        else:
            view.rows += part.rows
    return view or TableView([], []), missing


def _empty_message(session: Session, targets: list[Target], opts: _GetOptions) -> str:
    if opts.all_namespaces or not any(t.rt.namespaced for t in targets):
        return "No resources found"
    return f"No resources found in {session.namespace} namespace."


async def _print_tables(session: Session, targets: list[Target], opts: _GetOptions) -> int:
    failed = False
    printed = False
    several = len(targets) > 1
    for target in targets:
        view, missing = await _fetch_table(session, target, opts)
        failed = failed or missing
        if not view.rows:
            continue
        printer = TablePrinter(
            wide=opts.output == "wide", with_namespace=opts.all_namespaces and target.rt.namespaced,
            show_labels=opts.show_labels, name_prefix=f"{kind_ref(target.rt)}/" if several else "",
            no_headers=opts.no_headers,
        )
        if printed:
            out()
        for line in printer.lines(view):
            out(line)
        printed = True
    if not printed and not any(t.names for t in targets):
        err(_empty_message(session, targets, opts))
    return 1 if failed else 0


async def _list_objects(session: Session, target: Target, opts: _GetOptions) -> tuple[list[dict], bool]:
    rt = target.rt
    ns = _ns(session, rt, opts)
    if not target.names:
        resp = await session.client.raw_request("GET", rt.path(ns), params=_params(opts))
        items = json.loads(resp.body).get("items") or []
        return [_with_kind(rt, i) for i in items], False
    objs, missing = [], False
    for name in target.names:
        try:
            resp = await session.client.raw_request("GET", rt.path(ns, name))
        except ApiError as e:
            err(api_error_message(e))
            missing = True
            continue
        objs.append(_with_kind(rt, json.loads(resp.body)))
    return objs, missing


def _with_kind(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    # List items come without apiVersion/kind; printed objects should carry them.
    if obj.get("kind") and obj.get("apiVersion"):
        return obj
    return {"apiVersion": rt.api_version, "kind": rt.kind, **obj}


async def _print_objects(session: Session, targets: list[Target], opts: _GetOptions) -> int:
    objs: list[tuple[ResourceType, dict]] = []
    failed = False
    for target in targets:
        found, missing = await _list_objects(session, target, opts)
        failed = failed or missing
        objs += [(target.rt, strip_managed_fields(o)) for o in found]
    if opts.output == "name":
        for rt, o in objs:
            out(f"{kind_ref(rt)}/{meta(o).get('name', '')}")
        if not objs and not any(t.names for t in targets):
            err(_empty_message(session, targets, opts))
        return 1 if failed else 0
    single = len(targets) == 1 and len(targets[0].names) == 1
    if single:
        if objs:
            out(dump(objs[0][1], opts.output))
        return 1 if failed else 0
    listing = {"apiVersion": "v1", "items": [o for _, o in objs], "kind": "List",
               "metadata": {"resourceVersion": ""}}
    out(dump(listing, opts.output))
    return 1 if failed else 0


# -- watch ----------------------------------------------------------------------------


async def _watch(session: Session, target: Target, opts: _GetOptions) -> int:
    """List, then follow changes from the list's resourceVersion; a stream the server ends
    is resumed from the last version seen, and one too old to resume (410) starts over."""
    rt = target.rt
    ns = _ns(session, rt, opts)
    if len(target.names) > 1:
        raise CliError("error: watch takes at most one object name")
    name_field = f"metadata.name={target.names[0]}" if target.names else None
    as_table = opts.output not in ("yaml", "json", "name")
    printer = TablePrinter(wide=opts.output == "wide", with_namespace=opts.all_namespaces and rt.namespaced,
                           show_labels=opts.show_labels, no_headers=opts.no_headers)
    header_done = False
    relisting = False
    while True:
        rv, header_done = await _initial(session, rt, ns, target, opts, printer, header_done,
                                         quiet=opts.watch_only and not relisting, as_table=as_table)
        relisting = False
        try:
            while True:
                rv, printed, received = await _follow(session, rt, ns, rv, name_field, opts, printer,
                                                      header_done, as_table)
                header_done = header_done or printed
                if not received:
                    # A stream that ends without a single event (a proxy closing idle
                    # connections) is reopened, but not in a tight loop.
                    await asyncio.sleep(1)
        except (Gone, Expired):
            relisting = True
            continue


async def _initial(session: Session, rt: ResourceType, ns: str | None, target: Target, opts: _GetOptions,
                   printer: TablePrinter, header_done: bool, *, quiet: bool, as_table: bool) -> tuple[str, bool]:
    if as_table:
        view, missing = await _fetch_table(session, target, opts)
        if missing:
            raise CliError("")
        if not quiet and view.rows:
            for line in printer.lines(view, header=not header_done):
                out(line)
            header_done = True
        elif not quiet and not header_done and not view.rows and not target.names:
            err(_empty_message(session, [target], opts))
        rv = view.resource_version
        if not rv or target.names:
            rv = await _list_rv(session, rt, ns, opts)
        return rv, header_done
    objs, missing = await _list_objects(session, target, opts)
    if missing:
        raise CliError("")
    if not quiet:
        for o in objs:
            _print_object(rt, strip_managed_fields(o), opts.output)
    return await _list_rv(session, rt, ns, opts), header_done


async def _list_rv(session: Session, rt: ResourceType, ns: str | None, opts: _GetOptions) -> str:
    # A one-item page is enough to learn the collection's current resourceVersion.
    resp = await session.client.raw_request("GET", rt.path(ns), params={**_params(opts), "limit": 1})
    return str(meta(json.loads(resp.body)).get("resourceVersion") or "")


def _print_object(rt: ResourceType, obj: dict[str, Any], output: str) -> None:
    if output == "name":
        out(f"{kind_ref(rt)}/{meta(obj).get('name', '')}")
    elif output == "json":
        out(dump(_with_kind(rt, obj), "json"))
    else:
        out("---")
        out(dump(_with_kind(rt, obj), "yaml"))


async def _follow(session: Session, rt: ResourceType, ns: str | None, rv: str, name_field: str | None,
                  opts: _GetOptions, printer: TablePrinter, header_done: bool,
                  as_table: bool) -> tuple[str, bool, bool]:
    """Print one watch stream's events; returns the last resourceVersion seen, whether rows
    were printed, and whether anything (a bookmark included) arrived."""
    params = {**_params(opts, name_field), "watch": "true", "resourceVersion": rv or None,
              "allowWatchBookmarks": "true"}
    headers = {"accept": TABLE_ACCEPT if as_table else "application/json"}
    printed = received = False
    stream = session.client.transport.stream("GET", rt.path(ns), params, headers=headers)
    try:
        async for line in stream:
            if not line.strip():
                continue
            received = True
            try:
                event = json.loads(line)
            except ValueError as e:
                raise TransportError(f"watch {rt.path(ns)}: undecodable event {line[:200]!r}") from e
            etype, obj = event.get("type"), event.get("object") or {}
            if etype == "ERROR":
                raise error_from_status(obj, obj.get("code") if isinstance(obj, dict) else None)
            new_rv = meta(obj).get("resourceVersion")
            if etype == "BOOKMARK":
                rv = str(new_rv or rv)
                continue
            if as_table:
                view = TableView.from_response(obj)
                for row in view.rows:
                    row_rv = meta(row.get("object") or {}).get("resourceVersion")
                    rv = str(row_rv or view.resource_version or rv)
                for text in printer.lines(view, header=not (header_done or printed)):
                    out(text)
                printed = True
            else:
                rv = str(new_rv or rv)
                _print_object(rt, strip_managed_fields(obj), opts.output)
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    return rv, printed, received
