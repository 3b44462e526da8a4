"""What a node may claim when it joins and registers.

* ``--node-name-allowed`` (JoinPolicy.allowed_names: names or shell patterns such as
  ``gpu-*``): a join (NodeTokenRequest), a serving certificate request and a Node write by a
  node under any other name are refused, 403.
* ``--max-node-gpus N``: a node's Node may not claim more than N ``nvidia.com/gpu`` in its
  capacity or allocatable, 422 naming the field (what the agent declares with --gpus or
  --gpu-inventory is not checked by anyone but this bound).
* A Node registered by its own agent carries the annotation ``gpufleet.io/registered-by:
  system:node:<name>``, kept by the API server (only ``system:masters`` may set or change
  it). The join token never buys the name of a Node registered by another identity (the
  annotation names someone else): 409, delete the Node first. A name already joined is
  refused too (its node token exists: reviews.py). A Node an administrator made beforehand
  without the annotation may be joined, as a kubelet registers over a pre-made Node.
* ``NodeCertificateRequest``: a node (``system:node:<name>``; or ``system:masters`` for the
  node it names, an agent run with an administrator's credentials) sends a PEM certificate
  request for a key it made; the answer is its serving certificate from the node CA (nodecreds.py),
  the public key that checks the API server's proxy tokens, and the TLS name it answers to.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufleet.api.gpu import GPU_RESOURCE
from gpufleet.api.quantity import parse_quantity
from gpufleet.apiserver.admission import AdmissionContext, UserInfo
from gpufleet.apiserver.auth.nodecreds import CertificateRequestError, NodeCredentials
from gpufleet.apiserver.auth.tokens import NODE_USER_PREFIX, SUPERUSER_GROUP, node_name_of
from gpufleet.apiserver.errors import ApiException
from gpufleet.store import base as store_base
from gpufleet.utils.http import RawRequest, RawResponse
from gpufleet.utils.nodeauth import serving_name

if TYPE_CHECKING:
    from gpufleet.apiserver.server import ApiServer

BOOTSTRAP_GROUP = "bootstrap.gpufleet.io"
REGISTERED_BY = "gpufleet.io/registered-by"


@dataclass
class JoinPolicy:
    max_node_gpus: int | None = None
    allowed_names: list[str] = field(default_factory=list)

    def name_allowed(self, node: str) -> bool:
        return not self.allowed_names or any(fnmatch.fnmatchcase(node, p) for p in self.allowed_names)

    def not_allowed(self, kind: str, node: str, plural: str, group: str = BOOTSTRAP_GROUP) -> ApiException:
        qualified = f"{plural}.{group}" if group else plural
        return ApiException(403, "Forbidden", f'{qualified} "{node}" is forbidden: node name "{node}" is not in '
                            f"the server's --node-name-allowed list ({', '.join(self.allowed_names)})",
                            {"name": node, "group": group, "kind": plural})

    async def check_join(self, api: ApiServer, node: str, user: UserInfo) -> None:
        """Before a NodeTokenRequest for ``node`` is granted."""
        if not self.name_allowed(node):
            raise self.not_allowed("NodeTokenRequest", node, "nodetokenrequests")
        if SUPERUSER_GROUP in user.groups:
            return
        try:
            existing = await api.store.get("nodes", "", node)
        except store_base.NotFound:
            return
        owner = ((existing.get("metadata") or {}).get("annotations") or {}).get(REGISTERED_BY)
        if owner is not None and owner != NODE_USER_PREFIX + node:
            raise ApiException(
                409, "AlreadyExists",
                f'nodetokenrequests.{BOOTSTRAP_GROUP} "{node}" already exists: node {node} was registered by '
                f"another identity ({REGISTERED_BY}: {owner}); the join token cannot take it over: choose another "
                f"--name, or delete node {node} first",
                {"name": node, "group": BOOTSTRAP_GROUP, "kind": "nodetokenrequests"})


class NodeRegistration:
    """Admission for Node objects written by nodes: the registered-by annotation (mutating),
    the name allow-list and the GPU bound (validating)."""

    name = "NodeRegistration"

    def __init__(self, policy: JoinPolicy) -> None:
        self.policy = policy

    async def admit(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if ctx.rt.key != "nodes" or ctx.operation not in ("CREATE", "UPDATE"):
            return
        if SUPERUSER_GROUP in ctx.user.groups:
            return
        meta = obj.setdefault("metadata", {})
        annotations = dict(meta.get("annotations") or {})
        before = ((old or {}).get("metadata") or {}).get("annotations") or {}
        if ctx.operation == "CREATE" and node_name_of(ctx.user) is not None:
            annotations[REGISTERED_BY] = ctx.user.name
        elif REGISTERED_BY in before:
            annotations[REGISTERED_BY] = before[REGISTERED_BY]
        else:
            annotations.pop(REGISTERED_BY, None)
        if annotations:
            meta["annotations"] = annotations
        else:
            meta.pop("annotations", None)

    async def validate(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        node = node_name_of(ctx.user)
        if ctx.rt.key != "nodes" or node is None or ctx.operation not in ("CREATE", "UPDATE"):
            return
        if not self.policy.name_allowed(node):
            raise self.policy.not_allowed("Node", node, "nodes", group="")
        limit = self.policy.max_node_gpus
        if limit is None:
            return
        status = obj.get("status") or {}
        causes = []
        for attr in ("capacity", "allocatable"):
            raw = (status.get(attr) or {}).get(GPU_RESOURCE)
            if raw is None:
                continue
            try:
                count = parse_quantity(str(raw))
            except ValueError:
                continue
            if count > limit:
                causes.append({"reason": "FieldValueInvalid", "field": f"status.{attr}[{GPU_RESOURCE}]",
                               "message": f'Invalid value: "{raw}": this server accepts at most {limit} GPUs per '
                                          "node (--max-node-gpus)"})
        if causes:
            name = ctx.name or (obj.get("metadata") or {}).get("name", "")
            msg = "; ".join(f"{c['field']}: {c['message']}" for c in causes)
            raise ApiException(422, "Invalid", f'Node "{name}" is invalid: {msg}',
                               {"name": name, "kind": "Node", "causes": causes})


async def node_certificate(api: ApiServer, req: RawRequest, user: UserInfo, creds: NodeCredentials | None,
                           policy: JoinPolicy) -> RawResponse:
    try:
        body = json.loads(req.body or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ApiException(400, "BadRequest", "the body must be a NodeCertificateRequest (JSON object)")
    asked = (body.get("metadata") or {}).get("name") if isinstance(body.get("metadata"), dict) else None
    node = node_name_of(user)
    if node is None and SUPERUSER_GROUP in user.groups and isinstance(asked, str) and asked:
        node = asked  # an agent run with an administrator's credentials
    if node is None:
        raise ApiException(403, "Forbidden", f'nodecertificaterequests.{BOOTSTRAP_GROUP} is forbidden: User '
                           f'"{user.name}" is not a node; only a node (system:node:<name>) asks for its serving '
                           "certificate", {"group": BOOTSTRAP_GROUP, "kind": "nodecertificaterequests"})
    if not policy.name_allowed(node):
        raise policy.not_allowed("NodeCertificateRequest", node, "nodecertificaterequests")
    if creds is None:
        raise ApiException(503, "ServiceUnavailable", "the node CA is not ready yet; try again")
    name = asked or node
    if name != node:
        raise ApiException(403, "Forbidden", f'nodecertificaterequests.{BOOTSTRAP_GROUP} "{name}" is forbidden: '
                           f'node "{node}" may only ask for its own serving certificate',
                           {"name": name, "group": BOOTSTRAP_GROUP, "kind": "nodecertificaterequests"})
    raw = (body.get("spec") or {}).get("request")
    try:
        csr = base64.b64decode(raw, validate=True) if isinstance(raw, str) else b""
        cert = creds.sign(node, csr)
    except (binascii.Error, CertificateRequestError) as exc:
        detail = str(exc) if isinstance(exc, CertificateRequestError) else "not base64"
        msg = f"Invalid value: spec.request: {detail}" if raw else "Required value"
        raise ApiException(422, "Invalid", f'NodeCertificateRequest.{BOOTSTRAP_GROUP} "{node}" is invalid: '
                           f"spec.request: {msg}",
                           {"name": node, "group": BOOTSTRAP_GROUP, "kind": "NodeCertificateRequest",
                            "causes": [{"reason": "FieldValueInvalid", "field": "spec.request",
                                        "message": msg}]}) from None
    out = {"apiVersion": f"{BOOTSTRAP_GROUP}/v1", "kind": "NodeCertificateRequest", "metadata": {"name": node},
           "status": {"certificate": base64.b64encode(cert).decode(),
                      "proxyTokenKey": creds.token_public_pem.decode(), "serverName": serving_name(node)}}
    return RawResponse(201, {"content-type": "application/json"}, json.dumps(out).encode())
