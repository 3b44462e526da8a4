"""Per-verb handlers of resource requests, as kube-apiserver's endpoint handlers.

``serve`` is the entry for a resource request (after authentication, authorization and the
kind's lookup): it builds the request's Scope, hands a subresource request to its object
(subresources/), and every other to the handler of its verb, which works through the
generic registry (genericregistry.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gpufleet.api.registry import ResourceType
from gpufleet.apiserver import managedfields, params
from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.errors import method_not_allowed
from gpufleet.apiserver.handlers.create import create
from gpufleet.apiserver.handlers.delete import delete, delete_collection
from gpufleet.apiserver.handlers.get import get
from gpufleet.apiserver.handlers.list import list_
from gpufleet.apiserver.handlers.patch import patch
from gpufleet.apiserver.handlers.scope import Scope
from gpufleet.apiserver.handlers.update import update
from gpufleet.apiserver.handlers.watch import watch
from gpufleet.apiserver.requestinfo import RequestInfo
from gpufleet.apiserver.subresources import SUBRESOURCES
from gpufleet.utils.http import RawRequest, RawResponse

if TYPE_CHECKING:
    from gpufleet.apiserver.server import ApiServer

Handler = Callable[[Scope], Awaitable[RawResponse]]

VERBS: dict[str, Handler] = {
    "get": get,
    "list": list_,
    "watch": watch,
    "create": create,
    "update": update,
    "patch": patch,
    "delete": delete,
    "deletecollection": delete_collection,
}

_WRITES = ("create", "update", "patch", "delete", "deletecollection")


async def by_verb(scope: Scope) -> RawResponse:
    """The handler of the request's verb."""
    handler = VERBS.get(scope.info.verb)
    if handler is None:
        raise method_not_allowed()
    return await handler(scope)


async def serve(api: ApiServer, req: RawRequest, info: RequestInfo, rt: ResourceType, user: UserInfo) -> RawResponse:
    """A resource request for ``rt``, which the caller has found and authorized."""
    sub = SUBRESOURCES.get(info.subresource) if info.subresource else None
    dry_run = False
    if info.verb in _WRITES and (sub is None or sub.takes_write_options):
        dry_run = params.write_options(req, info.verb)["dry_run"]
    manager = req.param("fieldManager") or managedfields.manager_from_user_agent(req.headers.get("user-agent"))
    scope = Scope(api, req, info, rt, user, info.namespace if rt.namespaced else "", dry_run, manager)
    if sub is not None:
        return await sub.serve(scope)
    return await by_verb(scope)
