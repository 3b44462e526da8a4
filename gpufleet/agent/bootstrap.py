"""Joining a cluster: trading the join token for the node's own token.

The join token (<state-dir>/join-token of `gpufleet up` / `gpufleet server`) authenticates
as a bootstrapper, which may only ask for a node token (a NodeTokenRequest of
bootstrap.gpufleet.io/v1). The first join under a node name binds that name: the token
returned acts as ``system:node:<name>`` and may write only that node's Node, Lease and pods.
The agent keeps it in <agent-state-dir>/node-token and uses it from then on; the join token
is not needed again unless an admin revokes the node token. With the node token the agent
then gets the serving certificate of its port (servingcert.py).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.client import Client
from gpufleet.client.errors import NotFound, TransportError, Unauthorized
from gpufleet.utils.clock import REAL_CLOCK, Clock
from gpufleet.utils.files import private_dir

log = logging.getLogger(__name__)

NODE_TOKEN_FILE = "node-token"
BOOTSTRAPPERS_GROUP = "system:bootstrappers"
NODE_USER_PREFIX = "system:node:"


async def whoami(client: Client) -> dict[str, Any] | None:
    """The userInfo the server sees for this client (SelfSubjectReview), or None when the
    server does not serve authentication.k8s.io."""
    try:
        resp = await client.raw_request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                        json={"apiVersion": "authentication.k8s.io/v1",
                                              "kind": "SelfSubjectReview"})
    except NotFound:
        return None
    return (json.loads(resp.body).get("status") or {}).get("userInfo") or {}


async def request_node_credentials(client: Client, node_name: str) -> dict[str, Any]:
    """The NodeTokenRequest's status: ``token``, ``user`` and ``groups``."""
    resp = await client.raw_request("POST", "/apis/bootstrap.gpufleet.io/v1/nodetokenrequests",
                                    json={"apiVersion": "bootstrap.gpufleet.io/v1", "kind": "NodeTokenRequest",
                                          "metadata": {"name": node_name}})
    return json.loads(resp.body)["status"]


async def request_node_token(client: Client, node_name: str) -> str:
    return (await request_node_credentials(client, node_name))["token"]


def _save(path: Path, token: str) -> None:
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)


async def node_token(connect: Callable[[str | None], Client], token: str | None, node_name: str,
                     state_dir: Path, *, clock: Clock = REAL_CLOCK, retry_max: float = 5.0) -> str | None:
    """The token the agent should run with. ``connect(token)`` makes a client.

    A node token saved by an earlier join wins while the server still accepts it; a join
    token is exchanged for a node token (and saved); any other token is used as it is.
    While the API server cannot be reached it waits and tries again, as the agent does.
    """
    backoff = 0.2
    while True:
        try:
            return await _node_token(connect, token, node_name, state_dir)
        except TransportError as exc:
            log.warning("agent %s: cannot reach the API to join (%s); retrying in %.1fs", node_name, exc, backoff)
            await clock.sleep(backoff)
            backoff = min(backoff * 2, retry_max)


async def _node_token(connect: Callable[[str | None], Client], token: str | None, node_name: str,
                      state_dir: Path) -> str | None:
    saved_path = state_dir / NODE_TOKEN_FILE
    if saved_path.exists():
        saved = saved_path.read_text().strip()
        async with connect(saved) as client:
            try:
                who = await whoami(client)
            except Unauthorized:
                who = None
                log.warning("agent %s: the saved node token was revoked; joining again", node_name)
                saved_path.unlink(missing_ok=True)
        if who is not None and who.get("username") == NODE_USER_PREFIX + node_name:
            return saved
    if token is None:
        return None
    async with connect(token) as client:
        who = await whoami(client)
        if who is None or BOOTSTRAPPERS_GROUP not in (who.get("groups") or []):
            return token
        issued = await request_node_credentials(client, node_name)
    # What an older version kept: the fixed per-node token of the agent's port.
    (state_dir / "log-token").unlink(missing_ok=True)
    _save(saved_path, issued["token"])
    log.info("agent %s: joined with the join token; node token saved in %s", node_name, saved_path)
    return issued["token"]
