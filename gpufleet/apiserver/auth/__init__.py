"""Authentication, authorization and admission for who-may-do-what.

`Security` assembles them for one ApiServer: bearer tokens (tokens.py) and service account
tokens with the TokenRequest API (serviceaccounts.py), impersonation
(impersonation.py: ``kubectl --as``, checked with the authorizers below), the Node authorizer
(nodeauthz.py: a node reads only the secrets and config maps of its own pods) ahead of RBAC
with the default roles (rbac.py), NodeRestriction for node agents (node.py), PodNodeName
(podbinding.py: only who may bind pods creates one with spec.nodeName) and the review APIs
(reviews.py). TLS material lives in certs.py.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.auth.impersonation import ImpersonatedUser, ImpersonatingAuthenticator
from gpufleet.apiserver.auth.node import NodeRestriction
from gpufleet.apiserver.auth.nodeauthz import NodeAuthorizer
from gpufleet.apiserver.auth.nodecreds import NodeCredentials, new_secret_data
from gpufleet.apiserver.auth.nodejoin import JoinPolicy, NodeRegistration, node_certificate
from gpufleet.apiserver.auth.podbinding import PodNodeNameRestriction
from gpufleet.apiserver.auth.rbac import (
    Attributes,
    Decision,
    RbacAuthorizer,
    RbacEscalationCheck,
    bootstrap_policy,
)
from gpufleet.apiserver.auth.reviews import Reviews
from gpufleet.apiserver.auth.serviceaccounts import ServiceAccountTokens
from gpufleet.apiserver.auth.tokens import (
    LOOPBACK_USER,
    SUPERUSER_GROUP,
    TOKEN_NAMESPACE,
    TokenAuthenticator,
    node_name_of,
)
from gpufleet.apiserver.errors import ApiException
from gpufleet.apiserver.requestinfo import RequestInfo
from gpufleet.store import base as store_base
from gpufleet.utils.clock import REAL_CLOCK, Clock

if TYPE_CHECKING:
    from gpufleet.apiserver.server import ApiServer

log = logging.getLogger("gpufleet.apiserver.auth")

# The node CA and the key of the node proxy tokens (nodecreds.py).
PROXY_KEY_SECRET = "gpufleet-node-proxy-key"

__all__ = ["Security", "Attributes", "Decision", "ImpersonatedUser", "NodeRestriction", "TokenAuthenticator"]


class Security:
    def __init__(self, store: store_base.Store, *, static_tokens: dict[str, UserInfo] | None = None,
                 join_token: str | None = None, loopback_token: str | None = None,
                 service_accounts: ServiceAccountTokens | None = None, clock: Clock = REAL_CLOCK,
                 join_policy: JoinPolicy | None = None) -> None:
        self.service_accounts = service_accounts
        self.token_issuer = service_accounts.issuer(clock) if service_accounts is not None else None
        sa_authenticator = service_accounts.authenticator(store, clock) if service_accounts is not None else None
        self.authenticator = TokenAuthenticator(store, static=static_tokens, join_token=join_token,
                                                loopback_token=loopback_token,
                                                service_accounts=sa_authenticator.authenticate
                                                if sa_authenticator is not None else None)
        # What the API server asks: the token's user, or whom it may impersonate.
        self.impersonating = ImpersonatingAuthenticator(self.authenticator, self.decide)
        self.rbac = RbacAuthorizer(store)
        self.node_authorizer = NodeAuthorizer(store)
        self.node_restriction = NodeRestriction()
        self.pod_node_name = PodNodeNameRestriction(self.decide)
        self.escalation = RbacEscalationCheck(self.rbac)
        self.join_policy = join_policy or JoinPolicy()
        self.node_registration = NodeRegistration(self.join_policy)
        self.node_credentials: NodeCredentials | None = None
        self.reviews = Reviews(self.impersonating, self.decide, self.rbac.rules,
                               node_certificate=lambda api, req, user: node_certificate(
                                   api, req, user, self.node_credentials, self.join_policy),
                               join_policy=self.join_policy.check_join)

    def node_proxy_headers(self, node: str) -> dict[str, str]:
        """What the API server shows a node's agent: a fresh proxy token for that node (60 s,
        used once)."""
        return self.node_credentials.headers(node) if self.node_credentials is not None else {}

    async def decide(self, user: UserInfo, attrs: Attributes) -> Decision:
        """The Node authorizer, then RBAC (Kubernetes' ``--authorization-mode=Node,RBAC``): the
        first that allows wins; a refusal carries the Node authorizer's reason, if it had one."""
        node = node_name_of(user)
        verdict = await self.node_authorizer.decide(node, attrs) if node is not None else None
        if verdict is not None and verdict.allowed:
            return verdict
        decision = await self.rbac.decide(user, attrs)
        if decision.allowed or verdict is None:
            return decision
        return verdict

    async def non_resource_access(self, token: str | None, path: str, verb: str = "get") -> int:
        """200, 401 (no token, or one nobody issued) or 403 (RBAC refuses ``verb`` on the
        non-resource URL ``path``): for what serves such a URL off the API server (the
        gateway's /metrics)."""
        user = await self.authenticator.user_for(token) if token else None
        if user is None:
            return 401
        decision = await self.decide(user, Attributes(verb=verb, is_resource=False, path=path))
        return 200 if decision.allowed else 403

    async def authorize(self, user: UserInfo, info: RequestInfo) -> bool:
        decision = await self.decide(user, Attributes.from_request(info))
        if not decision.allowed and decision.reason and info.is_resource_request:
            raise _forbidden(user, info, decision.reason)
        return decision.allowed

    def install(self, api: ApiServer) -> None:
        api.authenticator = self.impersonating
        api.authorizer = self.authorize
        if self.token_issuer is not None:
            api.token_issuer = self.token_issuer
        if not any(getattr(p, "name", "") == self.node_registration.name for p in api.mutating):
            api.mutating.append(self.node_registration)
        for plugin in (self.node_restriction, self.node_registration, self.pod_node_name, self.escalation):
            if any(getattr(p, "name", "") == plugin.name for p in api.validating):
                continue
            # Ahead of ResourceQuota, which charges for what the chain lets through.
            quota = next((i for i, p in enumerate(api.validating) if getattr(p, "name", "") == "ResourceQuota"),
                         len(api.validating))
            api.validating.insert(quota, plugin)
        self.reviews.install(api)

    async def ensure_proxy_key(self, api: ApiServer) -> NodeCredentials:
        """The node CA and the proxy token key, kept in a Secret so that every API server
        sharing the store (and the next start) signs and checks alike; a Secret of an older
        version (an HMAC key only) gets them added."""
        rt = api.registry.by_key("secrets")
        assert rt is not None
        system = UserInfo(LOOPBACK_USER, [SUPERUSER_GROUP])
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                  "metadata": {"name": PROXY_KEY_SECRET, "namespace": TOKEN_NAMESPACE},
                  "data": new_secret_data()}
        try:
            stored, _ = await api.create_object(rt, TOKEN_NAMESPACE, secret, user=system)
        except ApiException as e:
            if e.code != 409:
                raise
            try:
                stored = await api.get_object(rt, TOKEN_NAMESPACE, PROXY_KEY_SECRET)
            except store_base.TransformError as exc:
                # Encrypted with a key this server was not given: serve what it can read (node
                # logs and exec need these credentials) rather than not start; nothing is stored.
                log.error("node credentials unreadable, node logs and exec will be refused until the server "
                          "is started with the right --encryption-provider-config: %s", exc)
                creds = NodeCredentials.from_secret_data(secret["data"])
                assert creds is not None
                self.node_credentials = creds
                return creds
        creds = NodeCredentials.from_secret_data(stored.get("data") or {})
        if creds is None:
            fresh = {k: secret["data"][k] for k in ("ca.crt", "ca.key", "token.key")}
            stored["data"] = {**(stored.get("data") or {}), **fresh}
            try:
                stored, _ = await api.update_object(rt, TOKEN_NAMESPACE, PROXY_KEY_SECRET, stored, user=system)
            except ApiException as e:
                if e.code != 409:
                    raise
                stored = await api.get_object(rt, TOKEN_NAMESPACE, PROXY_KEY_SECRET)
            creds = NodeCredentials.from_secret_data(stored.get("data") or {})
            assert creds is not None
        self.node_credentials = creds
        return creds

    @staticmethod
    async def ensure_policy(api: ApiServer) -> None:
        """Create the default roles and bindings; put back the rules of those an admin has
        not marked ``rbac.authorization.kubernetes.io/autoupdate: "false"``."""
        system = UserInfo(LOOPBACK_USER, [SUPERUSER_GROUP])
        for obj in bootstrap_policy():
            rt = api.registry.by_api_version_kind(obj["apiVersion"], obj["kind"])
            assert rt is not None, f"{obj['kind']} is not registered"
            name = obj["metadata"]["name"]
            try:
                await api.create_object(rt, "", obj, user=system)
                continue
            except ApiException as e:
                if e.code != 409:
                    raise
            current = await api.get_object(rt, "", name)
            annotations = (current.get("metadata") or {}).get("annotations") or {}
            if annotations.get("rbac.authorization.kubernetes.io/autoupdate") == "false":
                continue
            fields = ("rules",) if obj["kind"] == "ClusterRole" else ("roleRef", "subjects")
            if all(current.get(f) == obj.get(f) for f in fields):
                continue
            updated: dict[str, Any] = dict(current)
            for f in fields:
                updated[f] = obj[f]
            try:
                await api.update_object(rt, "", name, updated, user=system)
            except ApiException as e:
                log.warning("could not update the default %s %s: %s", obj["kind"], name, e.message)


def _forbidden(user: UserInfo, info: RequestInfo, reason: str) -> ApiException:
    """Kubernetes' 403 for a refused resource request, with the authorizer's reason appended
    (``... in the namespace "default": no relationship found between node 'n1' and this object``)."""
    what = f'{info.resource}{"/" + info.subresource if info.subresource else ""}'
    scope = f' in the namespace "{info.namespace}"' if info.namespace else " at the cluster scope"
    qualified_resource = f"{info.resource}.{info.group}" if info.group else info.resource
    named = f' "{info.name}"' if info.name else ""
    msg = (f'{qualified_resource}{named} is forbidden: User "{user.name}" cannot {info.verb} resource "{what}" '
           f'in API group "{info.group}"{scope}: {reason}')
    return ApiException(403, "Forbidden", msg, {"name": info.name, "group": info.group, "kind": info.resource})
