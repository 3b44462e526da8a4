"""Kubeconfig files: where the server is and who we are, in the format kubectl reads.

We read the subset that matters for one API server (current-context, a cluster's server and
CA, a user's token or client certificate) and write files that kubectl and the official
clients accept unchanged, so `gpufleet up` can hand a user one file for every tool.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.client.errors import ClientError
from gpufleet.client.transport import HttpTransport

GPUFLEET_KUBECONFIG = Path("~/.gpufleet/kubeconfig")
KUBE_KUBECONFIG = Path("~/.kube/config")


class KubeConfigError(ClientError):
    pass


@dataclass
class KubeConfig:
    server: str
    token: str | None = None
    ca_file: str | None = None
    # PEM bytes, already base64-decoded from certificate-authority-data.
    ca_data: bytes | None = None
    insecure: bool = False
    client_cert_file: str | None = None
    client_key_file: str | None = None
    client_cert_data: bytes | None = None
    client_key_data: bytes | None = None
    namespace: str = "default"
    context: str = ""
    cluster: str = ""
    user: str = ""
    path: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def client_cert(self) -> tuple[str | bytes, str | bytes] | None:
        cert = self.client_cert_data or self.client_cert_file
        key = self.client_key_data or self.client_key_file
        if cert and key:
            return (cert, key)
        return None


def candidate_paths(env: Mapping[str, str] | None = None, home: str | Path | None = None) -> list[Path]:
    """Where a kubeconfig is looked for, in order: each entry of $KUBECONFIG, then
    ~/.gpufleet/kubeconfig, then ~/.kube/config."""
    env = os.environ if env is None else env
    home_dir = Path(home) if home is not None else Path(env.get("HOME") or Path.home())
    out: list[Path] = []
    for entry in (env.get("KUBECONFIG") or "").split(os.pathsep):
        if entry.strip():
            out.append(Path(entry.strip()).expanduser())
    for rel in (GPUFLEET_KUBECONFIG, KUBE_KUBECONFIG):
        out.append(home_dir / str(rel).removeprefix("~/"))
    return out


def find_kubeconfig(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    home: str | Path | None = None,
) -> Path:
    """The kubeconfig to use: ``path`` when given (it must exist), else the first existing
    candidate; raises KubeConfigError naming every place it looked."""
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise KubeConfigError(f"kubeconfig {p} does not exist")
        return p
    looked = candidate_paths(env, home)
    for p in looked:
        if p.is_file():
            return p
    where = ", ".join(str(p) for p in looked)
    raise KubeConfigError(
        f"no kubeconfig found (looked in: {where}); pass --kubeconfig, set KUBECONFIG, "
        "or run `gpufleet up` to create one"
    )


def _named(entries: Any, name: str, what: str, source: Path) -> dict[str, Any]:
    for entry in entries or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry.get(what) or {}
    raise KubeConfigError(f"{source}: no {what} named {name!r}")


def _resolve(base: Path, value: str | None) -> str | None:
    # client-go resolves relative file references against the kubeconfig's own directory.
    if not value:
        return None
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base.parent / p))


def _b64(value: str | None, what: str, source: Path) -> bytes | None:
    if not value:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise KubeConfigError(f"{source}: {what} is not valid base64") from exc


def parse_kubeconfig(data: Mapping[str, Any], source: Path, *, context: str | None = None) -> KubeConfig:
    ctx_name = context or data.get("current-context") or ""
    if not ctx_name:
        contexts = data.get("contexts") or []
        if len(contexts) == 1 and isinstance(contexts[0], dict):
            ctx_name = contexts[0].get("name", "")
        else:
            raise KubeConfigError(f"{source}: no current-context set; pick one with --context")
    ctx = _named(data.get("contexts"), ctx_name, "context", source)
    cluster_name = ctx.get("cluster") or ""
    user_name = ctx.get("user") or ""
    cluster = _named(data.get("clusters"), cluster_name, "cluster", source)
    user = _named(data.get("users"), user_name, "user", source) if user_name else {}

    server = cluster.get("server")
    if not server:
        raise KubeConfigError(f"{source}: cluster {cluster_name!r} has no server")

    token = user.get("token")
    token_file = _resolve(source, user.get("tokenFile"))
    if not token and token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise KubeConfigError(f"{source}: cannot read tokenFile {token_file}: {exc}") from exc

    return KubeConfig(
        server=server,
        token=token or None,
        ca_file=_resolve(source, cluster.get("certificate-authority")),
        ca_data=_b64(cluster.get("certificate-authority-data"), "certificate-authority-data", source),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        client_cert_file=_resolve(source, user.get("client-certificate")),
        client_key_file=_resolve(source, user.get("client-key")),
        client_cert_data=_b64(user.get("client-certificate-data"), "client-certificate-data", source),
        client_key_data=_b64(user.get("client-key-data"), "client-key-data", source),
        namespace=ctx.get("namespace") or "default",
        context=ctx_name,
        cluster=cluster_name,
        user=user_name,
        path=source,
    )


def load_kubeconfig(
    path: str | Path | None = None,
    *,
    context: str | None = None,
    env: Mapping[str, str] | None = None,
    home: str | Path | None = None,
) -> KubeConfig:
    source = find_kubeconfig(path, env=env, home=home)
    try:
        data = yaml.safe_load(source.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise KubeConfigError(f"cannot read kubeconfig {source}: {exc}") from exc
    if not isinstance(data, dict):
        raise KubeConfigError(f"{source}: not a kubeconfig (expected a mapping)")
    return parse_kubeconfig(data, source, context=context)


def write_kubeconfig(
    path: str | Path,
    server: str,
    *,
    token: str | None = None,
    ca_data: bytes | str | None = None,
    context: str = "gpufleet",
    namespace: str | None = None,
    insecure: bool = False,
) -> Path:
    """Write a one-context kubeconfig (mode 0600: it may hold a token). ``ca_data`` is PEM."""
    path = Path(path).expanduser()
    cluster: dict[str, Any] = {"server": server}
    if ca_data:
        pem = ca_data.encode() if isinstance(ca_data, str) else ca_data
        cluster["certificate-authority-data"] = base64.b64encode(pem).decode()
    if insecure:
        cluster["insecure-skip-tls-verify"] = True
    user: dict[str, Any] = {"token": token} if token else {}
    ctx: dict[str, Any] = {"cluster": context, "user": context}
    if namespace:
        ctx["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": context, "user": user}],
        "contexts": [{"name": context, "context": ctx}],
        "current-context": context,
    }
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Written beside the target and renamed so a reader never sees half a file, and created
    # 0600 so the token is never readable by others, not even for a moment.
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def transport_from_config(config: KubeConfig, *, timeout: float = 30) -> HttpTransport:
    return HttpTransport(
        config.server,
        token=config.token,
        ca_file=config.ca_file,
        ca_data=config.ca_data,
        insecure=config.insecure,
        client_cert=config.client_cert,
        timeout=timeout,
    )


def transport_from_kubeconfig(
    path: str | Path | None = None,
    *,
    context: str | None = None,
    timeout: float = 30,
) -> HttpTransport:
    return transport_from_config(load_kubeconfig(path, context=context), timeout=timeout)
