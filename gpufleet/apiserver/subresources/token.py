"""serviceaccounts/{name}/token: TokenRequests, served by ApiServer.token_issuer (without one,
no tokens are issued and the subresource is a 404)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.apiserver.decoding import parse_body
from gpufleet.apiserver.errors import ApiException
from gpufleet.apiserver.subresources.base import Subresource

if TYPE_CHECKING:
    from gpufleet.apiserver.handlers.scope import Scope
    from gpufleet.utils.http import RawResponse


class Token(Subresource):
    name = "token"
    verbs = frozenset({"create"})

    async def serve(self, scope: Scope) -> RawResponse:
        from gpufleet.apiserver.handlers.scope import written

        issuer = scope.api.token_issuer
        if issuer is None:
            raise ApiException(404, "NotFound", "the server could not find the requested resource")
        self.check_verb(scope)
        obj, warnings = await issuer.create(scope.api, scope.rt, scope.ns, scope.name, await parse_body(scope.req),
                                            scope.user, scope.dry_run)
        return written(201, obj, warnings)
