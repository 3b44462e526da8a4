"""pods/{name}/log: served by the node agent of the pod's node (ApiServer.log_provider)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.apiserver.errors import ApiException, bad_request
from gpufleet.apiserver.subresources.base import Subresource

if TYPE_CHECKING:
    from gpufleet.apiserver.handlers.scope import Scope
    from gpufleet.utils.http import RawResponse


class Log(Subresource):
    name = "log"
    takes_write_options = False

    async def serve(self, scope: Scope) -> RawResponse:
        name = scope.name
        pod = await scope.generic.get(scope.rt, scope.ns, name)
        if not (pod.get("spec") or {}).get("nodeName"):
            containers = (pod.get("spec") or {}).get("containers") or [{}]
            c = scope.req.param("container") or containers[0].get("name", "")
            raise bad_request(f'container "{c}" in pod "{name}" is waiting to start: pod is not scheduled yet')
        if scope.api.log_provider is None:
            raise ApiException(503, "ServiceUnavailable",
                               f"no node agent is reachable to serve logs of pod {name}")
        return await scope.api.log_provider(pod, scope.req)
