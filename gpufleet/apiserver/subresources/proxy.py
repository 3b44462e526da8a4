"""nodes/{name}/proxy/...: requests passed to the node agent (ApiServer.node_proxy_provider)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.apiserver.errors import ApiException
from gpufleet.apiserver.subresources.base import Subresource

if TYPE_CHECKING:
    from gpufleet.apiserver.handlers.scope import Scope
    from gpufleet.utils.http import RawResponse


class Proxy(Subresource):
    name = "proxy"
    takes_write_options = False
    verbs = frozenset({"get"})

    async def serve(self, scope: Scope) -> RawResponse:
        self.check_verb(scope)
        provider = scope.api.node_proxy_provider
        if provider is None:
            raise ApiException(503, "ServiceUnavailable", f"no node proxy is configured to reach node {scope.name}")
        path = scope.req.path
        prefix = f"/nodes/{scope.name}/proxy"
        rest = path[path.index(prefix) + len(prefix):] if prefix in path else ""
        return await provider(scope.name, rest or "/", scope.req)
