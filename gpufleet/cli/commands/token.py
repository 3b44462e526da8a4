"""`gpufleet token`: bearer tokens for people and programs, bound to a role in a namespace.

`gpufleet token create --namespace team-a --role edit` makes a token for a new user and a
RoleBinding that gives that user the role (a Role of that name in the namespace if there is
one, else the ClusterRole) in that namespace only. The token is printed once; the server
keeps only its SHA-256 in a Secret (kube-system/gpufleet-token-<id>, type gpufleet.io/token),
so it survives restarts. `gpufleet token delete <id>` revokes it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.apiserver.auth.tokens import (
    TOKEN_NAMESPACE,
    TOKEN_SECRET_TYPE,
    USER_LABEL,
    new_token,
    secret_name,
    token_secret,
)
from gpufleet.cli.output import CliError, ContextOpt, KubeconfigOpt, connect, out, run
from gpufleet.client import Client
from gpufleet.client.errors import NotFound
from gpufleet.client.kubeconfig import load_kubeconfig, write_kubeconfig

RBAC = "rbac.authorization.k8s.io"
TOKEN_ID_LABEL = "gpufleet.io/token-id"

token_app = typer.Typer(help="Create, list and revoke API tokens.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")


async def _role_kind(client: Client, namespace: str | None, role: str) -> str:
    if namespace:
        try:
            await client.get("roles", role, namespace, raw=True)
            return "Role"
        except NotFound:
            pass
    try:
        await client.get("clusterroles", role, raw=True)
        return "ClusterRole"
    except NotFound:
        where = f'a Role in namespace "{namespace}" or ' if namespace else ""
        raise CliError(f'error: --role {role}: there is no {where}ClusterRole named "{role}" '
                       "(the defaults are view, edit, admin and cluster-admin)") from None


async def create_token(client: Client, *, role: str, namespace: str | None, user: str | None = None,
                       groups: list[str] | None = None, description: str = "") -> dict[str, Any]:
    """Make a token for ``user`` bound to ``role`` in ``namespace`` (cluster-wide when
    namespace is None). Returns {"id", "token", "user", "binding"}."""
    if namespace:
        try:
            await client.get("namespaces", namespace, raw=True)
        except NotFound:
            raise CliError(f'error: --namespace {namespace}: namespace "{namespace}" does not exist; '
                           f"create it first (kubectl create namespace {namespace})") from None
    kind = await _role_kind(client, namespace, role)
    if namespace is None and kind != "ClusterRole":
        raise CliError("error: a cluster-wide token needs a ClusterRole")
    token_id, token = new_token()
    user = user or f"token-{token_id}"
    labels = {TOKEN_ID_LABEL: token_id}
    binding: dict[str, Any] = {
        "apiVersion": f"{RBAC}/v1", "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": {"name": secret_name(token_id), "labels": labels},
        "roleRef": {"apiGroup": RBAC, "kind": kind, "name": role},
        "subjects": [{"apiGroup": RBAC, "kind": "User", "name": user}],
    }
    if namespace:
        binding["metadata"]["namespace"] = namespace
    await client.create(binding, namespace, raw=True)
    secret = token_secret(token, user, list(groups or []), labels=labels,
                          description=description or f"{kind} {role} in {namespace or 'all namespaces'}")
    secret["metadata"]["annotations"] = {
        **secret["metadata"].get("annotations", {}),
        "gpufleet.io/binding": f"{binding['kind']}/{namespace + '/' if namespace else ''}{secret_name(token_id)}"}
    await client.create(secret, TOKEN_NAMESPACE, raw=True)
    return {"id": token_id, "token": token, "user": user, "binding": binding}


def _write_user_kubeconfig(path: Path, kubeconfig: Path | None, context: str | None, made: dict[str, Any],
                           namespace: str | None) -> None:
    """A kubeconfig for the new token: the server and CA of the caller's, the token, the namespace."""
    cfg = load_kubeconfig(kubeconfig, context=context)
    ca = cfg.ca_data or (Path(cfg.ca_file).read_bytes() if cfg.ca_file else None)
    write_kubeconfig(path, cfg.server, token=made["token"], ca_data=ca, namespace=namespace,
                     insecure=cfg.insecure, context=made["user"].replace(":", "-"))


@token_app.command("create")
def create(
    role: Annotated[str, typer.Option("--role", help="Role (in the namespace) or ClusterRole to grant, "
                                      "e.g. view, edit, admin.")],
    namespace: Annotated[str | None, typer.Option(
        "--namespace", "-n", help="Namespace the role applies in.")] = None,
    cluster: Annotated[bool, typer.Option(
        "--cluster", help="Grant the ClusterRole in every namespace instead of one.")] = False,
    user: Annotated[str | None, typer.Option("--user", help="User name (default: token-<id>).")] = None,
    group: Annotated[list[str] | None, typer.Option("--group", help="Groups of the user (repeatable).")] = None,
    write_kubeconfig_to: Annotated[Path | None, typer.Option(
        "--write-kubeconfig", help="Also write a kubeconfig for the token (server and CA as in yours).")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="token (just the token) or json.")] = "token",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Create a token for a user bound to a role in a namespace; prints the token (shown only once)."""
    if cluster == (namespace is not None):
        raise typer.BadParameter("give --namespace NAME, or --cluster for every namespace", param_hint="--namespace")
    if output not in ("token", "json"):
        raise typer.BadParameter("must be token or json", param_hint="--output")

    async def main() -> int:
        async with connect(kubeconfig, namespace, context) as session:
            made = await create_token(session.client, role=role, namespace=namespace, user=user, groups=group)
        if write_kubeconfig_to is not None:
            await asyncio.to_thread(_write_user_kubeconfig, write_kubeconfig_to, kubeconfig, context, made,
                                    namespace)
        if output == "json":
            out(json.dumps({"id": made["id"], "token": made["token"], "user": made["user"],
                            "namespace": namespace, "role": role}))
        else:
            out(made["token"])
        return 0
    run(main)


@token_app.command("list")
def list_(kubeconfig: KubeconfigOpt = None, context: ContextOpt = None) -> None:
    """List tokens (never their secrets): id, user, groups, what they grant."""
    import base64

    async def main() -> int:
        async with connect(kubeconfig, None, context) as session:
            secrets = await session.client.list("secrets", namespace=TOKEN_NAMESPACE, raw=True,
                                                field_selector=f"type={TOKEN_SECRET_TYPE}")
        out(f"{'ID':<24} {'USER':<32} {'GROUPS':<24} GRANTS")
        for s in secrets.items:
            data = s.get("data") or {}

            def dec(k: str, data: dict = data) -> str:
                return base64.b64decode(data.get(k, "")).decode(errors="replace")
            ann = (s["metadata"].get("annotations") or {})
            out(f"{dec('token-id'):<24} {dec('user'):<32} {dec('groups') or '<none>':<24} "
                f"{ann.get('gpufleet.io/description', '')}")
        return 0
    run(main)


@token_app.command("delete")
def delete(token_id: Annotated[str, typer.Argument(help="The token's id (the part before the dot).")],
           kubeconfig: KubeconfigOpt = None, context: ContextOpt = None) -> None:
    """Revoke a token: delete its Secret and the binding made with it."""
    async def main() -> int:
        async with connect(kubeconfig, None, context) as session:
            c = session.client
            try:
                secret = await c.get("secrets", secret_name(token_id), TOKEN_NAMESPACE, raw=True)
            except NotFound:
                raise CliError(f'error: no token with id "{token_id}" (see `gpufleet token list`)') from None
            binding = ((secret["metadata"].get("annotations") or {}).get("gpufleet.io/binding") or "")
            await c.delete("secrets", secret_name(token_id), TOKEN_NAMESPACE, raw=True)
            kind, _, where = binding.partition("/")
            ns, _, name = where.rpartition("/")
            if kind and name:
                try:
                    await c.delete("rolebindings" if kind == "RoleBinding" else "clusterrolebindings", name,
                                   ns or None, raw=True)
                except NotFound:
                    pass
            user = (secret["metadata"].get("labels") or {}).get(USER_LABEL, "")
        out(f"token {token_id} revoked{f' (user {user})' if user else ''}")
        return 0
    run(main)
