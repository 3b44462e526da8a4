"""CustomResourceDefinitionRules: a warning where a CRD's schema has x-kubernetes-validations.

gpufleet checks custom resources against every part of their schema but the CEL rules
(types, required fields, enums, bounds, patterns, lengths, items, defaults and pruning).
A CRD that carries rules is accepted, as Kubernetes accepts it, and the write answers a
``Warning:`` naming the versions whose rules are not evaluated.
"""

from __future__ import annotations

from typing import Any

from gpufleet.api import apiextensions as crds
from gpufleet.apiserver.admission import AdmissionContext


class CustomResourceDefinitionRules:
    name = "CustomResourceDefinitionRules"

    async def validate(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if ctx.rt.key != crds.RESOURCE_KEY or ctx.operation not in ("CREATE", "UPDATE") or ctx.subresource:
            return
        for i, version in enumerate(crds.versions_of(obj)):
            if crds.uses_cel(crds.version_schema(version)):
                ctx.warnings.append(
                    f"spec.versions[{i}].schema.openAPIV3Schema: x-kubernetes-validations rules are not "
                    f"evaluated by this server; objects of version {version.get('name')} are checked against "
                    "the rest of the schema")
