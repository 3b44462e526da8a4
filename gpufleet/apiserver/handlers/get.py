"""GET of one object."""

from __future__ import annotations

from gpufleet.apiserver.handlers.scope import Scope, render_object
from gpufleet.utils.http import RawResponse


async def get(scope: Scope) -> RawResponse:
    obj = await scope.generic.get(scope.rt, scope.ns, scope.name)
    return render_object(scope, obj)
