"""`gpufleet apply -f`: make the objects in manifests exist as written.

Client-side apply, as kubectl does it for kinds without a strategic-merge schema: each
object keeps the manifest it was last applied from in the
`kubectl.kubernetes.io/last-applied-configuration` annotation, and an update is a JSON merge
patch computed three ways (last applied, the new manifest, the live object), so fields
removed from the manifest are removed from the object and fields set by others (status,
defaults, a scaler's replicas when the manifest leaves them out) are left alone. Because
the annotation is kubectl's, `kubectl apply` and `gpufleet apply` can take turns on the same
objects. `--server-side` sends the manifest as an apply patch instead.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli import manifests
from gpufleet.cli.output import (
    LAST_APPLIED,
    CliError,
    ContextOpt,
    KubeconfigOpt,
    NamespaceOpt,
    Session,
    connect,
    err,
    kind_ref,
    out,
    print_warnings,
    problem_text,
    run,
)
from gpufleet.client.errors import ApiError, NotFound

FIELD_MANAGER = "gpufleet"
_MISSING = object()


class ManifestProblem(Exception):
    """Something wrong with one document that the server was not needed to find."""


def register(app: typer.Typer) -> None:
    @app.command()
    def apply(
        filename: Annotated[list[str], typer.Option(
            "--filename", "-f", help="A manifest file, a directory of *.yaml/*.yml/*.json, or - for stdin. "
            "Repeatable.")],
        recursive: Annotated[bool, typer.Option("--recursive", "-R", help="Read directories recursively.")] = False,
        dry_run: Annotated[str, typer.Option(
            "--dry-run", help="none, server (the server checks and answers, nothing is stored) or client "
            "(nothing is sent).")] = "none",
        server_side: Annotated[bool, typer.Option(
            "--server-side", help="Send each manifest as a server-side apply patch.")] = False,
        force_conflicts: Annotated[bool, typer.Option(
            "--force-conflicts", help="With --server-side: take over fields other managers own.")] = False,
        validate: Annotated[str, typer.Option(
            "--validate", help="strict (unknown fields are errors), warn or ignore.")] = "strict",
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """Create or update the objects in manifests (files, directories, or - for stdin)."""
        dry_run = dry_run.lower()
        if dry_run not in ("none", "server", "client"):
            raise typer.BadParameter("must be none, server or client", param_hint="--dry-run")
        validation = {"strict": "Strict", "true": "Strict", "warn": "Warn", "ignore": "Ignore",
                      "false": "Ignore"}.get(validate.lower())
        if validation is None:
            raise typer.BadParameter("must be strict, warn or ignore", param_hint="--validate")
        options = _Options(dry_run, server_side, force_conflicts, validation)
        run(lambda: _apply(filename, recursive, options, kubeconfig, context, namespace))


class _Options:
    def __init__(self, dry_run: str, server_side: bool, force: bool, validation: str) -> None:
        self.dry_run = dry_run
        self.server_side = server_side
        self.force = force
        self.validation = validation

    @property
    def suffix(self) -> str:
        return {"server": " (server dry run)", "client": " (dry run)"}.get(self.dry_run, "")

    def params(self) -> dict[str, Any]:
        return {"fieldManager": FIELD_MANAGER, "fieldValidation": self.validation,
                "dryRun": "All" if self.dry_run == "server" else None}


async def _apply(paths: list[str], recursive: bool, options: _Options, kubeconfig: Path | None,
                 context: str | None, namespace: str | None) -> int:
    loaded = manifests.load(paths, recursive=recursive)
    for problem in loaded.errors:
        err(f"error: {problem}")
    if not loaded.manifests:
        if not loaded.errors:
            raise CliError("error: no objects passed to apply")
        return 1
    failed = bool(loaded.errors)
    async with connect(kubeconfig, namespace, context) as session:
        for m in manifests.sort_for_apply(loaded.manifests):
            try:
                out(await apply_one(session, m, options))
            except ManifestProblem as e:
                err(f"error: {m.where}: {e}")
                failed = True
            except ApiError as e:
                err(f"error: {m.where}: {m.title}: {problem_text(e)}")
                failed = True
    return 1 if failed else 0


async def apply_one(session: Session, m: manifests.Manifest, options: _Options) -> str:
    """Apply one object and say what happened: `deployment.apps/web created|configured|unchanged`."""
    rt = await session.kinds.for_manifest(m.api_version, m.kind)
    if rt is None:
        raise ManifestProblem(f'{m.title}: no matches for kind "{m.kind}" in version "{m.api_version}"')
    if not m.name:
        if m.metadata.get("generateName"):
            raise ManifestProblem(f"{m.kind}: apply needs metadata.name (generateName only works with create)")
        raise ManifestProblem(f"{m.kind}: metadata.name not set")
    obj = copy.deepcopy(m.obj)
    meta = obj.setdefault("metadata", {})
    ns = None
    if rt.namespaced:
        obj_ns = m.namespace
        if session.namespace_explicit and obj_ns and obj_ns != session.namespace:
            raise ManifestProblem(
                f'{m.title}: the namespace from the manifest ("{obj_ns}") does not match the namespace '
                f'"{session.namespace}" given with --namespace'
            )
        ns = obj_ns or session.namespace
        meta["namespace"] = ns
    else:
        meta.pop("namespace", None)
    ref = f"{kind_ref(rt)}/{m.name}"
    client = session.client
    path = rt.path(ns, m.name)

    if options.server_side:
        if options.dry_run == "client":
            return f"{ref} serverside-applied{options.suffix}"
        resp = await client.raw_request(
            "PATCH", path, params={**options.params(), "force": "true" if options.force else "false"},
            content=json.dumps(obj, separators=(",", ":")),
            headers={"content-type": "application/apply-patch+yaml"},
        )
        print_warnings(resp.headers)
        return f"{ref} serverside-applied{options.suffix}"

    modified = with_last_applied(obj)
    try:
        current = json.loads((await client.raw_request("GET", path)).body)
    except NotFound:
        current = None
    if current is None:
        if options.dry_run != "client":
            resp = await client.raw_request("POST", rt.path(ns), params=options.params(), json=modified)
            print_warnings(resp.headers)
        return f"{ref} created{options.suffix}"

    original = last_applied(current)
    if original is None:
        err(f"Warning: {ref} has no {LAST_APPLIED} annotation (it was not created by apply); "
            "fields missing from the manifest are left as they are this time")
    patch = three_way_merge_patch(original, modified, current)
    if not patch:
        return f"{ref} unchanged{options.suffix}"
    if options.dry_run == "client":
        return f"{ref} configured{options.suffix}"
    resp = await client.raw_request(
        "PATCH", path, params=options.params(), content=json.dumps(patch, separators=(",", ":")),
        headers={"content-type": "application/merge-patch+json"},
    )
    print_warnings(resp.headers)
    updated = json.loads(resp.body or b"{}")
    before = (current.get("metadata") or {}).get("resourceVersion")
    after = (updated.get("metadata") or {}).get("resourceVersion")
    # The patch may only restate what the server had already defaulted or normalised (the
    # live object always carries more than the manifest); the revision says whether
    # anything was written.
    if before and after == before:
        return f"{ref} unchanged{options.suffix}"
    return f"{ref} configured{options.suffix}"


def with_last_applied(obj: dict[str, Any]) -> dict[str, Any]:
    """The object to write: the manifest plus the annotation recording it (without itself)."""
    recorded = copy.deepcopy(obj)
    annotations = recorded.get("metadata", {}).get("annotations")
    if isinstance(annotations, dict):
        annotations.pop(LAST_APPLIED, None)
        if not annotations:
            recorded["metadata"].pop("annotations")
    modified = copy.deepcopy(recorded)
    meta = modified.setdefault("metadata", {})
    if not isinstance(meta.get("annotations"), dict):
        meta["annotations"] = {}
    meta["annotations"][LAST_APPLIED] = json.dumps(recorded, sort_keys=True, separators=(",", ":"))
    return modified


def last_applied(current: dict[str, Any]) -> dict[str, Any] | None:
    text = ((current.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def three_way_merge_patch(original: Any, modified: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that takes `current` to what `modified` asks for.

    - a field in `modified` that differs from `current` is set;
    - a field in the last applied `original` but no longer in `modified` is deleted (null);
    - a field only `current` has (defaults, status, other writers' fields) is left alone.

    Lists are replaced whole, as merge patches do. A list the manifest did not change since
    the last apply is left alone while the live one still holds everything it asks for
    (the server adds defaults to list items, so the live list is rarely equal to it)."""
    patch: dict[str, Any] = {}
    original = original if isinstance(original, dict) else {}
    for key in original:
        if key not in modified and key in current:
            patch[key] = None
    for key, want in modified.items():
        have = current.get(key, _MISSING)
        before = original.get(key, _MISSING)
        if want is None:
            if have is not _MISSING and have is not None:
                patch[key] = None
            continue
        if isinstance(want, dict) and isinstance(have, dict):
            sub = three_way_merge_patch(before if isinstance(before, dict) else {}, want, have)
            if sub:
                patch[key] = sub
            continue
        if isinstance(want, list) and isinstance(have, list):
            if want == have or (want == before and _contained(want, have)):
                continue
            patch[key] = want
            continue
        if want != have:
            patch[key] = want
    return patch


def _contained(want: Any, have: Any) -> bool:
    """Whether `have` holds everything `want` asks for (and maybe more, in mappings)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and _contained(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(
            _contained(w, h) for w, h in zip(want, have, strict=True))
    return want == have
