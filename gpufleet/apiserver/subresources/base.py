"""The one interface of a subresource (pods/status, deployments/scale, pods/binding ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.apiserver.errors import method_not_allowed

if TYPE_CHECKING:
    from gpufleet.apiserver.handlers.scope import Scope
    from gpufleet.utils.http import RawResponse


class Subresource:
    """``serve`` answers a request to {resource}/{name}/{subresource}; the default hands it to
    the verb handlers with the subresource named, for the parts of an object (status) that
    get, update and patch like the object itself.

    ``owns_part``: an update through it changes only its part of the object, which
    ``merge_for_update`` picks from the request (the generic registry asks it).
    ``takes_write_options``: a write through it reads dryRun and fieldManager.
    ``verbs``: the verbs it serves (others are a 405)."""

    name = ""
    owns_part = False
    takes_write_options = True
    verbs: frozenset[str] | None = None  # None: as the main resource

    async def serve(self, scope: Scope) -> RawResponse:
        from gpufleet.apiserver.handlers import by_verb

        self.check_verb(scope)
        return await by_verb(scope)

    def check_verb(self, scope: Scope) -> None:
        if self.verbs is not None and scope.info.verb not in self.verbs:
            raise method_not_allowed()

    def merge_for_update(self, obj: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError
