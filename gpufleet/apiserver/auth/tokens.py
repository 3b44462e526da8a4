"""Bearer-token authentication.

Where a token can come from, checked in this order:

* the loopback token: a random token made at start and never written down, held by the
  components that run inside the control plane process (user ``system:apiserver`` in
  ``system:masters``);
* a static token file in Kubernetes' CSV format ``token,user,uid,"group1,group2"``
  (``gpufleet up`` keeps the admin token in <state-dir>/tokens.csv);
* the join token (<state-dir>/join-token): user ``system:bootstrap:join`` in group
  ``system:bootstrappers``, which may do one thing, ask for a node token;
* service account tokens (JWTs of the cluster's issuer, serviceaccounts.py);
* token Secrets: ``type: gpufleet.io/token`` in kube-system, named
  ``gpufleet-token-<id>`` for a token ``<id>.<secret>``. The Secret holds the SHA-256 of the
  secret part (never the token), the user name and the groups. ``gpufleet token create`` and
  node joins make them; deleting the Secret revokes the token at once (it is read on each
  request: one keyed read of a small object).

Every authenticated user is also in ``system:authenticated``.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import hmac
import io
import re
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gpufleet.apiserver.admission import UserInfo
from gpufleet.store import base as store_base
from gpufleet.utils.files import write_private
from gpufleet.utils.http import RawRequest

TOKEN_SECRET_TYPE = "gpufleet.io/token"
TOKEN_NAMESPACE = "kube-system"
TOKEN_SECRET_PREFIX = "gpufleet-token-"
USER_LABEL = "gpufleet.io/token-user"
NODE_LABEL = "gpufleet.io/node"
SUPERUSER_GROUP = "system:masters"
AUTHENTICATED_GROUP = "system:authenticated"
NODES_GROUP = "system:nodes"
NODE_USER_PREFIX = "system:node:"
BOOTSTRAP_USER = "system:bootstrap:join"
BOOTSTRAPPERS_GROUP = "system:bootstrappers"
LOOPBACK_USER = "system:apiserver"
_SECRETS_KEY = "secrets"
_ID = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class TokenFileError(ValueError):
    pass


def parse_token_csv(text: str, source: str = "token file") -> dict[str, UserInfo]:
    """Kubernetes' static token file: ``token,user,uid[,"group1,group2"]`` per line."""
    out: dict[str, UserInfo] = {}
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) < 3:
            raise TokenFileError(f"{source}:{lineno}: expected token,user,uid[,\"group1,group2\"], "
                                 f"got {len(row)} field(s)")
        token, user = row[0].strip(), row[1].strip()
        if not token or not user:
            raise TokenFileError(f"{source}:{lineno}: the token and the user name must not be empty")
        groups = [g.strip() for g in row[3].split(",") if g.strip()] if len(row) > 3 else []
        out[token] = UserInfo(name=user, groups=groups)
    return out


def load_token_file(path: Path) -> dict[str, UserInfo]:
    return parse_token_csv(path.read_text(), str(path))


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(path, text)


def ensure_admin_token(path: Path, user: str = "admin") -> str:
    """The token of ``user`` (in system:masters) from the CSV token file at ``path``, added
    to the file when it is not there yet."""
    text = path.read_text() if path.exists() else ""
    for token, info in parse_token_csv(text, str(path)).items():
        if info.name == user and SUPERUSER_GROUP in info.groups:
            return token
    token = secrets.token_urlsafe(32)
    sep = "" if not text or text.endswith("\n") else "\n"
    _write_private(path, f'{text}{sep}{token},{user},{user},"{SUPERUSER_GROUP}"\n')
    return token


def ensure_join_token(path: Path) -> str:
    """The cluster's join token, made once and kept across restarts."""
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    token = secrets.token_urlsafe(32)
    _write_private(path, token + "\n")
    return token


def secret_name(token_id: str) -> str:
    return TOKEN_SECRET_PREFIX + token_id


def node_token_id(node: str) -> str:
    return f"node-{node}"


def new_token(token_id: str | None = None) -> tuple[str, str]:
    """(token id, token). The token is ``<id>.<secret>``; only the id and a hash are stored."""
    token_id = token_id or secrets.token_hex(4)
    if not _ID.match(token_id):
        raise ValueError(f"token id {token_id!r} must be lower-case letters, digits, '-' and '.'")
    return token_id, f"{token_id}.{secrets.token_urlsafe(32)}"


def _hash(secret_part: str) -> str:
    return hashlib.sha256(secret_part.encode()).hexdigest()


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def token_secret(token: str, user: str, groups: list[str], *, description: str = "",
                 labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The Secret that makes ``token`` authenticate as ``user`` in ``groups``."""
    token_id, _, secret_part = token.rpartition(".")
    return {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": secret_name(token_id), "namespace": TOKEN_NAMESPACE,
            "labels": {USER_LABEL: _label_value(user), **(labels or {})},
            **({"annotations": {"gpufleet.io/description": description}} if description else {}),
        },
        "type": TOKEN_SECRET_TYPE,
        "data": {"token-id": _b64(token_id), "token-sha256": _b64(_hash(secret_part)),
                 "user": _b64(user), "groups": _b64(",".join(groups))},
    }


def _label_value(s: str) -> str:
    v = re.sub(r"[^A-Za-z0-9_.-]", "_", s)[:63].strip("_.-")
    return v or "user"


def _decoded(secret: dict[str, Any], key: str) -> str:
    try:
        return base64.b64decode((secret.get("data") or {}).get(key, "")).decode()
    except (ValueError, UnicodeDecodeError):
        return ""


def with_authenticated(user: UserInfo) -> UserInfo:
    if AUTHENTICATED_GROUP in user.groups:
        return user
    return UserInfo(name=user.name, groups=[*user.groups, AUTHENTICATED_GROUP])


class TokenAuthenticator:
    """ApiServer's authenticator: the user a request's bearer token names, or None."""

    def __init__(self, store: store_base.Store, *, static: dict[str, UserInfo] | None = None,
                 join_token: str | None = None, loopback_token: str | None = None,
                 service_accounts: Callable[[str], Awaitable[UserInfo | None]] | None = None) -> None:
        self.store = store
        self.service_accounts = service_accounts
        self.static = {t: with_authenticated(u) for t, u in (static or {}).items()}
        if join_token:
            self.static[join_token] = with_authenticated(UserInfo(BOOTSTRAP_USER, [BOOTSTRAPPERS_GROUP]))
        if loopback_token:
            self.static[loopback_token] = with_authenticated(UserInfo(LOOPBACK_USER, [SUPERUSER_GROUP]))

    @staticmethod
    def bearer(req: RawRequest) -> str | None:
        value = req.headers.get("authorization", "")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return token.strip()

    async def __call__(self, req: RawRequest) -> UserInfo | None:
        token = self.bearer(req)
        if token is None:
            return None
        return await self.user_for(token)

    async def user_for(self, token: str) -> UserInfo | None:
        """The user a bearer token names, or None."""
        for known, user in self.static.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return user
        if self.service_accounts is not None and token.count(".") == 2:
            return await self.service_accounts(token)
        return await self.lookup(token)

    async def lookup(self, token: str) -> UserInfo | None:
        token_id, dot, secret_part = token.rpartition(".")
        if not dot or not _ID.match(token_id) or not secret_part:
            return None
        try:
            secret = await self.store.get(_SECRETS_KEY, TOKEN_NAMESPACE, secret_name(token_id))
        except store_base.NotFound:
            return None
        if secret.get("type") != TOKEN_SECRET_TYPE or (secret.get("metadata") or {}).get("deletionTimestamp"):
            return None
        if not hmac.compare_digest(_decoded(secret, "token-sha256"), _hash(secret_part)):
            return None
        name = _decoded(secret, "user")
        if not name:
            return None
        groups = [g for g in _decoded(secret, "groups").split(",") if g]
        return with_authenticated(UserInfo(name=name, groups=groups))


def node_name_of(user: UserInfo) -> str | None:
    """The node a user acts for (``system:node:<name>`` in ``system:nodes``), else None."""
    if NODES_GROUP in user.groups and user.name.startswith(NODE_USER_PREFIX):
        return user.name[len(NODE_USER_PREFIX):]
    return None
