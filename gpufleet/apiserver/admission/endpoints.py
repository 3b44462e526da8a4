"""EndpointsAddresses: no Endpoints address in the node-centric ranges from a user.

Kubernetes refuses, for everyone, Endpoints addresses that are unspecified, loopback or
link-local (unicast or multicast): ValidateNonSpecialIP in validateEndpointAddress. Such an
address sends a Service's traffic (through the gateway, which dials it from the control
plane's host) to the host itself: its agent, its API server, the metadata service. gpufleet
refuses them the same way, 422 naming the field (``subsets[0].addresses[0].ip``), to every
user but ``system:masters``: the control plane's own writers list them where they are real,
the endpoints controller for host-network pods of a node serving on loopback (the process
runtime of `gpufleet up`) and the default/kubernetes Endpoints of an API server on 127.0.0.1.
"""

from __future__ import annotations

from typing import Any

from gpufleet.api.validation import endpoints_addresses, validate_non_special_ip
from gpufleet.apiserver.admission import AdmissionContext
from gpufleet.apiserver.errors import invalid

SUPERUSER_GROUP = "system:masters"


class EndpointsAddresses:
    name = "EndpointsAddresses"

    async def validate(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if ctx.rt.key != "endpoints" or ctx.operation not in ("CREATE", "UPDATE") or ctx.subresource:
            return
        if SUPERUSER_GROUP in ctx.user.groups:
            return
        errors = [e for path, ip in endpoints_addresses(obj) for e in validate_non_special_ip(ip, path)]
        if errors:
            raise invalid(ctx.rt, ctx.name or (obj.get("metadata") or {}).get("name", ""),
                          [e.to_cause() for e in errors])
