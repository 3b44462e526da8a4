"""pods/{name}/exec, pods/{name}/attach and pods/{name}/portforward: streams to the pod's
node agent (ApiServer.stream_provider, podstreams.PodStreams), upgraded from a WebSocket
handshake (GET) or a SPDY/3.1 request (POST)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.apiserver.errors import ApiException
from gpufleet.apiserver.subresources.base import Subresource

if TYPE_CHECKING:
    from gpufleet.apiserver.handlers.scope import Scope
    from gpufleet.utils.http import RawResponse


class _PodStream(Subresource):
    takes_write_options = False
    verbs = frozenset({"get", "create"})

    async def serve(self, scope: Scope) -> RawResponse:
        self.check_verb(scope)
        pod = await scope.generic.get(scope.rt, scope.ns, scope.name)
        provider = scope.api.stream_provider
        if provider is None:
            raise ApiException(503, "ServiceUnavailable",
                               f"no node agent is reachable to {self.name} pod {scope.name}")
        return await provider.open(self.name, pod, scope.req)


class Exec(_PodStream):
    name = "exec"


class Attach(_PodStream):
    name = "attach"


class PortForward(_PodStream):
    name = "portforward"
