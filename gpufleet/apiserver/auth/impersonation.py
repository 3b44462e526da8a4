"""User impersonation (``kubectl --as``, ``--as-group``, ``--as-uid``), in Kubernetes' shape.

A request may carry the headers ``Impersonate-User``, ``Impersonate-Group`` (repeatable),
``Impersonate-Uid`` and ``Impersonate-Extra-<key>``. Each thing asked for is authorized
for the authenticated user, one check each, with the verb ``impersonate``:

* the user: resource ``users`` (resourceName the user) in API group "", or, for
  ``system:serviceaccount:<ns>:<name>``, resource ``serviceaccounts`` in namespace ``<ns>``;
* each group: ``groups`` in API group "";
* the uid: ``uids`` in ``authentication.k8s.io``;
* each extra value: ``userextras/<key>`` in ``authentication.k8s.io``.

The first refusal answers 403 and the request goes no further. When every check passes,
the request proceeds as the impersonated user: RBAC, the Node authorizer, NodeRestriction
and the review APIs all see only that user. The groups are those asked for (a service
account without any gets ``system:serviceaccounts`` and ``system:serviceaccounts:<ns>``),
plus ``system:authenticated`` (``system:unauthenticated`` for ``system:anonymous``).

Groups, a uid or extras without a user are refused with 400 (Kubernetes answers 500).
Each header's value is split on commas, the form repeated headers take when joined (RFC 9110);
group names cannot hold a comma here anyway (the token file separates them so). The HTTP
adapter (apiserver/app.py) keeps only the last of repeated headers, so until it joins them,
``--as-group a --as-group b`` arrives as ``b`` alone.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.auth.rbac import Attributes, Decision
from gpufleet.apiserver.auth.tokens import AUTHENTICATED_GROUP
from gpufleet.apiserver.errors import ApiException, bad_request
from gpufleet.utils.http import RawRequest

log = logging.getLogger("gpufleet.apiserver.auth")

USER_HEADER = "impersonate-user"
GROUP_HEADER = "impersonate-group"
UID_HEADER = "impersonate-uid"
EXTRA_HEADER_PREFIX = "impersonate-extra-"

AUTHN_GROUP = "authentication.k8s.io"
ANONYMOUS_USER = "system:anonymous"
UNAUTHENTICATED_GROUP = "system:unauthenticated"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts"

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

Authenticate = Callable[[RawRequest], Awaitable[UserInfo | None]]
Decide = Callable[[UserInfo, Attributes], Awaitable[Decision]]


@dataclass
class ImpersonatedUser(UserInfo):
    """The user a request acts as, and who asked."""

    impersonator: UserInfo | None = None


def split_service_account(username: str) -> tuple[str, str] | None:
    """(namespace, name) of ``system:serviceaccount:<ns>:<name>``, else None (Kubernetes'
    serviceaccount.SplitUsername: any other shape is an ordinary user name)."""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    parts = username[len(SERVICE_ACCOUNT_PREFIX):].split(":")
    if len(parts) != 2:
        return None
    ns, name = parts
    if not (ns and len(ns) <= 63 and _DNS1123_LABEL.match(ns)):
        return None
    if not (name and len(name) <= 253 and _DNS1123_SUBDOMAIN.match(name)):
        return None
    return ns, name


def _values(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


@dataclass(frozen=True)
class Wanted:
    """What a request's Impersonate-* headers ask for."""

    user: str = ""
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, str], ...] = ()  # (key, value), one per value

    def __bool__(self) -> bool:
        return bool(self.user or self.groups or self.uid or self.extra)

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> Wanted:
        """A 400 when groups, a uid or extras come without a user."""
        user = headers.get(USER_HEADER, "").strip()
        groups = tuple(_values(headers.get(GROUP_HEADER, "")))
        uid = headers.get(UID_HEADER, "").strip()
        extra: list[tuple[str, str]] = []
        for name, value in headers.items():
            if name.startswith(EXTRA_HEADER_PREFIX) and len(name) > len(EXTRA_HEADER_PREFIX):
                key = unquote(name[len(EXTRA_HEADER_PREFIX):].lower())
                extra += [(key, v) for v in _values(value)]
        wanted = cls(user, groups, uid, tuple(extra))
        if wanted and not user:
            asked = [f"group {g!r}" for g in groups] + ([f"uid {uid!r}"] if uid else [])
            asked += [f"extra {k}={v!r}" for k, v in extra]
            raise bad_request(
                f"requested impersonation of {', '.join(asked)} without impersonating a user: "
                f"Impersonate-Group, Impersonate-Uid and Impersonate-Extra-* need Impersonate-User "
                f"(kubectl --as) in the same request")
        return wanted

    def checks(self) -> list[Attributes]:
        """One ``impersonate`` check per thing asked for, in Kubernetes' order."""
        out: list[Attributes] = []
        sa = split_service_account(self.user)
        if sa is not None:
            out.append(Attributes(verb="impersonate", resource="serviceaccounts", namespace=sa[0], name=sa[1]))
        else:
            out.append(Attributes(verb="impersonate", resource="users", name=self.user))
        out += [Attributes(verb="impersonate", resource="groups", name=g) for g in self.groups]
        out += [Attributes(verb="impersonate", group=AUTHN_GROUP, resource="userextras", subresource=k, name=v)
                for k, v in self.extra]
        if self.uid:
            out.append(Attributes(verb="impersonate", group=AUTHN_GROUP, resource="uids", name=self.uid))
        return out

    def user_info(self, impersonator: UserInfo | None = None) -> ImpersonatedUser:
        groups = list(dict.fromkeys(self.groups))
        sa = split_service_account(self.user)
        if sa is not None and not groups:
            groups = [SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{sa[0]}"]
        if self.user == ANONYMOUS_USER:
            if UNAUTHENTICATED_GROUP not in groups:
                groups.append(UNAUTHENTICATED_GROUP)
        elif AUTHENTICATED_GROUP not in groups and UNAUTHENTICATED_GROUP not in groups:
            groups.append(AUTHENTICATED_GROUP)
        extra: dict[str, list[str]] = {}
        for k, v in self.extra:
            extra.setdefault(k, []).append(v)
        return ImpersonatedUser(name=self.user, groups=groups, uid=self.uid, extra=extra, impersonator=impersonator)


def forbidden(requestor: UserInfo, attrs: Attributes, reason: str) -> ApiException:
    """Kubernetes' 403 for a refused impersonation (responsewriters.Forbidden):
    ``users "alice" is forbidden: User "bob" cannot impersonate resource "users" in API group ""
    at the cluster scope``."""
    what = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    scope = f' in the namespace "{attrs.namespace}"' if attrs.namespace else " at the cluster scope"
    qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    named = f' "{attrs.name}"' if attrs.name else ""
    msg = (f'{qualified}{named} is forbidden: User "{requestor.name}" cannot {attrs.verb} resource "{what}" '
           f'in API group "{attrs.group}"{scope}')
    if reason:
        msg += f": {reason}"
    return ApiException(403, "Forbidden", msg, {"name": attrs.name, "group": attrs.group, "kind": attrs.resource})


class ImpersonatingAuthenticator:
    """The API server's authenticator: the user a request's credentials name, or, when it
    carries Impersonate-* headers, the user it may act as (else a 403 or a 400)."""

    def __init__(self, authenticate: Authenticate, decide: Decide) -> None:
        self.authenticate = authenticate
        self.decide = decide

    async def __call__(self, req: RawRequest) -> UserInfo | None:
        requestor = await self.authenticate(req)
        if requestor is None:
            return None
        wanted = Wanted.from_headers(req.headers)
        if not wanted:
            return requestor
        for attrs in wanted.checks():
            decision = await self.decide(requestor, attrs)
            if not decision.allowed:
                raise forbidden(requestor, attrs, decision.reason)
        user = wanted.user_info(requestor)
        log.debug("%s%s is impersonating %s%s", requestor.name, requestor.groups, user.name, user.groups)
        return user
