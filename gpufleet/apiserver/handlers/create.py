"""POST of a new object."""

from __future__ import annotations

from gpufleet.apiserver.decoding import parse_body
from gpufleet.apiserver.errors import method_not_allowed
from gpufleet.apiserver.handlers.scope import Scope, written
from gpufleet.utils.http import RawResponse


async def create(scope: Scope) -> RawResponse:
    if scope.subresource:
        raise method_not_allowed()
    body = await parse_body(scope.req)
    obj, warnings = await scope.generic.create(
        scope.rt, scope.ns, body, field_validation=scope.req.param("fieldValidation"), user=scope.user,
        dry_run=scope.dry_run, manager=scope.manager,
    )
    return written(201, obj, warnings)
