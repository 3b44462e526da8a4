"""What every verb handler gets: the request, what it names, who asked; and the answers' shapes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gpufleet.api.registry import ResourceType
from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.errors import bad_request
from gpufleet.apiserver.genericregistry import GenericRegistry, rv
from gpufleet.apiserver.headers import warning_header
from gpufleet.apiserver.requestinfo import RequestInfo
from gpufleet.apiserver.strategy import Strategy, strategy_for
from gpufleet.utils.http import RawRequest, RawResponse

if TYPE_CHECKING:
    from gpufleet.apiserver.server import ApiServer

JSON = "application/json"


@dataclass
class Scope:
    """One resource request: ``ns`` is empty for cluster-scoped kinds; ``dry_run`` and
    ``manager`` are the write options as the request gives them."""

    api: ApiServer
    req: RawRequest
    info: RequestInfo
    rt: ResourceType
    user: UserInfo
    ns: str
    dry_run: bool
    manager: str | None

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def subresource(self) -> str:
        return self.info.subresource

    @property
    def generic(self) -> GenericRegistry:
        return self.api.generic

    @property
    def strategy(self) -> Strategy:
        return strategy_for(self.rt)


def truthy(v: str | None) -> bool:
    return v is not None and v.lower() in ("true", "1", "yes")


def dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:
        # orjson refuses lone surrogates; an error about such input must still be rendered.
        return json.dumps(obj, ensure_ascii=True, default=str).encode()


def json_response(status: int, obj: Any, headers: dict[str, str] | None = None) -> RawResponse:
    h = {"content-type": JSON}
    if headers:
        h.update(headers)
    return RawResponse(status=status, headers=h, body=dumps(obj))


def written(status: int, obj: Any, warnings: list[str]) -> RawResponse:
    """The answer to a write: the object, and the admission and decoding warnings."""
    return json_response(status, obj, warning_header(warnings))


def wants_table(req: RawRequest) -> bool:
    accept = req.headers.get("accept", "").replace(" ", "")
    first = accept.split(",")[0] if accept else ""
    return "as=Table" in first


def include_object(req: RawRequest) -> str:
    value = req.param("includeObject") or "Metadata"
    if value not in ("None", "Metadata", "Object"):
        raise bad_request(f'includeObject: Unsupported value: "{value}": supported values: '
                          '"None", "Metadata", "Object"')
    return value


def render_object(scope: Scope, obj: dict[str, Any]) -> RawResponse:
    """The object, or its Table row when the client asked for one."""
    if wants_table(scope.req):
        table = scope.strategy.table(
            [obj], resource_version=str(rv(obj)), now=scope.api.clock.now(),
            include_object=include_object(scope.req),
        )
        return json_response(200, table)
    return json_response(200, obj)
