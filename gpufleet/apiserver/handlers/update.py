"""PUT of an object (or of its status / finalize part)."""

from __future__ import annotations

from gpufleet.apiserver.decoding import parse_body
from gpufleet.apiserver.handlers.scope import Scope, written
from gpufleet.utils.http import RawResponse


async def update(scope: Scope) -> RawResponse:
    body = await parse_body(scope.req)
    obj, warnings = await scope.generic.update(
        scope.rt, scope.ns, scope.name, body, subresource=scope.subresource,
        field_validation=scope.req.param("fieldValidation"), user=scope.user, dry_run=scope.dry_run,
        manager=scope.manager,
    )
    return written(200, obj, warnings)
