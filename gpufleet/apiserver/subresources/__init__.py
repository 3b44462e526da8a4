"""Subresources as small objects with one interface (base.Subresource), by name.

A kind lists the subresources it has (ResourceType.subresources); a request to one of them
is served by its object here. A new subresource: a Subresource subclass in its own module,
listed in SUBRESOURCES, and named in the kinds that have it.
"""

from __future__ import annotations

from gpufleet.apiserver.subresources.base import Subresource
from gpufleet.apiserver.subresources.binding import Binding
from gpufleet.apiserver.subresources.eviction import Eviction
from gpufleet.apiserver.subresources.log import Log
from gpufleet.apiserver.subresources.proxy import Proxy
from gpufleet.apiserver.subresources.scale import Scale
from gpufleet.apiserver.subresources.status import Finalize, Status
from gpufleet.apiserver.subresources.streams import Attach, Exec, PortForward
from gpufleet.apiserver.subresources.token import Token

SUBRESOURCES: dict[str, Subresource] = {
    s.name: s for s in (Status(), Finalize(), Scale(), Binding(), Eviction(), Log(), Proxy(), Token(),
                           Exec(), Attach(), PortForward())
}

__all__ = ["SUBRESOURCES", "Subresource"]
