"""CustomResourceDefinition (apiextensions.k8s.io/v1): the kind that declares other kinds.

The model keeps Kubernetes' field names; a version's ``openAPIV3Schema`` stays plain JSON
(JSONSchemaProps nests without end, and the structural rules in ``structural.py`` read it as
such). Importing this module registers the kind's defaults and validation
(``validation/apiextensions.py``). The helpers at the end read what a CRD declares for one
version: its schema, subresources, printer columns and selectable fields.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from gpufleet.api import defaults as api_defaults
from gpufleet.api.k8s import K8sModel, ListMeta, ObjectMeta, Time

GROUP = "apiextensions.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "CustomResourceDefinition"
RESOURCE_KEY = f"customresourcedefinitions.{GROUP}"
# The finalizer that holds a deleted CRD until its objects are gone.
CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"

ESTABLISHED = "Established"
NAMES_ACCEPTED = "NamesAccepted"
TERMINATING = "Terminating"


class CustomResourceDefinitionNames(K8sModel):
    """The names the kind is served under."""

    plural: str | None = Field(default=None, description="The plural name of the resource to serve "
                               "(/apis/<group>/<version>/.../<plural>); must be all lowercase.")
    singular: str | None = Field(default=None, description="The singular name of the resource; all lowercase. "
                                 "Defaults to the lowercased kind.")
    kind: str | None = Field(default=None, description="The serialized kind of the resource, in CamelCase.")
    list_kind: str | None = Field(default=None, alias="listKind",
                                  description="The serialized kind of the list. Defaults to `<kind>List`.")
    short_names: list[str] | None = Field(default=None, alias="shortNames",
                                          description="Short names for the resource, for `kubectl get <shortname>`.")
    categories: list[str] | None = Field(default=None, description="Grouped resources this one belongs to "
                                         "(e.g. 'all'), for `kubectl get <category>`.")


class CustomResourceValidation(K8sModel):
    open_apiv3_schema: dict[str, Any] | None = Field(
        default=None, alias="openAPIV3Schema",
        description="The OpenAPI v3 schema used for validation, pruning and defaulting.")


class CustomResourceSubresourceScale(K8sModel):
    spec_replicas_path: str | None = Field(default=None, alias="specReplicasPath")
    status_replicas_path: str | None = Field(default=None, alias="statusReplicasPath")
    label_selector_path: str | None = Field(default=None, alias="labelSelectorPath")


class CustomResourceSubresources(K8sModel):
    status: dict[str, Any] | None = Field(default=None, description="Enables the /status subresource.")
    scale: CustomResourceSubresourceScale | None = Field(default=None, description="Enables the /scale subresource.")


class CustomResourceColumnDefinition(K8sModel):
    name: str | None = None
    type: str | None = None
    format: str | None = None
    description: str | None = None
    priority: int | None = None
    json_path: str | None = Field(default=None, alias="jsonPath")


class SelectableField(K8sModel):
    json_path: str | None = Field(default=None, alias="jsonPath")


class CustomResourceDefinitionVersion(K8sModel):
    name: str | None = Field(default=None, description="The version name, e.g. v1, v2beta1.")
    served: bool | None = Field(default=None, description="Whether this version is served by the REST API.")
    storage: bool | None = Field(default=None, description="Whether this version is the one objects are stored "
                                 "in; exactly one version is.")
    deprecated: bool | None = None
    deprecation_warning: str | None = Field(default=None, alias="deprecationWarning")
    schema_: CustomResourceValidation | None = Field(default=None, alias="schema")
    subresources: CustomResourceSubresources | None = None
    additional_printer_columns: list[CustomResourceColumnDefinition] | None = Field(
        default=None, alias="additionalPrinterColumns")
    selectable_fields: list[SelectableField] | None = Field(default=None, alias="selectableFields")


class CustomResourceDefinitionSpec(K8sModel):
    group: str | None = Field(default=None, description="The API group of the defined kind "
                              "(/apis/<group>/...); must match the CRD's name, <plural>.<group>.")
    names: CustomResourceDefinitionNames | None = None
    scope: str | None = Field(default=None, description="Namespaced or Cluster.")
    versions: list[CustomResourceDefinitionVersion] | None = None
    conversion: dict[str, Any] | None = None
    preserve_unknown_fields: bool | None = Field(default=None, alias="preserveUnknownFields")


class CustomResourceDefinitionCondition(K8sModel):
    type: str | None = None
    status: str | None = None
    last_transition_time: Time | None = Field(default=None, alias="lastTransitionTime")
    reason: str | None = None
    message: str | None = None


class CustomResourceDefinitionStatus(K8sModel):
    conditions: list[CustomResourceDefinitionCondition] | None = None
    accepted_names: CustomResourceDefinitionNames | None = Field(default=None, alias="acceptedNames")
    stored_versions: list[str] | None = Field(default=None, alias="storedVersions")


class CustomResourceDefinition(K8sModel):
    """Declares a kind the API server serves like a built-in one: its group, names, scope,
    versions and their schemas."""

    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = KIND

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: CustomResourceDefinitionSpec | None = None
    status: CustomResourceDefinitionStatus | None = None


class CustomResourceDefinitionList(K8sModel):
    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "CustomResourceDefinitionList"

    api_version: str | None = Field(default=None, alias="apiVersion")
    items: list[CustomResourceDefinition]
    kind: str | None = None
    metadata: ListMeta | None = None


# -- defaults -------------------------------------------------------------------------------


def _default_crd(crd: CustomResourceDefinition) -> None:
    """apiextensions/v1 SetDefaults: singular and listKind from the kind, conversion None."""
    spec = crd.spec
    if spec is None:
        return
    names = spec.names
    if names is not None and names.kind:
        if not names.singular:
            names.singular = names.kind.lower()
        if not names.list_kind:
            names.list_kind = f"{names.kind}List"
    if spec.conversion is None:
        spec.conversion = {"strategy": "None"}
    elif not spec.conversion.get("strategy"):
        spec.conversion = {**spec.conversion, "strategy": "None"}


api_defaults.register_defaulter(CustomResourceDefinition, _default_crd)


# -- what a CRD declares, read from its stored (plain JSON) form -------------------------------


def spec_of(crd: dict[str, Any]) -> dict[str, Any]:
    spec = crd.get("spec")
    return spec if isinstance(spec, dict) else {}


def names_of(crd: dict[str, Any]) -> dict[str, Any]:
    names = spec_of(crd).get("names")
    return names if isinstance(names, dict) else {}


def versions_of(crd: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in spec_of(crd).get("versions") or [] if isinstance(v, dict)]


def storage_version(crd: dict[str, Any]) -> str | None:
    for v in versions_of(crd):
        if v.get("storage"):
            return v.get("name")
    return None


def version_schema(version: dict[str, Any]) -> dict[str, Any] | None:
    schema = (version.get("schema") or {}).get("openAPIV3Schema")
    return schema if isinstance(schema, dict) else None


def version_subresources(version: dict[str, Any]) -> dict[str, Any]:
    subs = version.get("subresources")
    return subs if isinstance(subs, dict) else {}


def printer_columns(version: dict[str, Any]) -> list[dict[str, Any]]:
    """The version's additionalPrinterColumns; without any, the one Kubernetes shows: Age."""
    columns = [c for c in version.get("additionalPrinterColumns") or [] if isinstance(c, dict)]
    if not columns:
        return [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
    return columns


def selectable_fields(version: dict[str, Any]) -> tuple[str, ...]:
    """The field selector labels a version adds (``spec.color`` for jsonPath ``.spec.color``)."""
    out = []
    for f in version.get("selectableFields") or []:
        if isinstance(f, dict) and isinstance(f.get("jsonPath"), str):
            out.append(f["jsonPath"].lstrip("."))
    return tuple(out)


def condition(crd: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (crd.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == type_:
            return c
    return None


def is_established(crd: dict[str, Any]) -> bool:
    c = condition(crd, ESTABLISHED)
    return c is not None and c.get("status") == "True"


def uses_cel(schema: Any) -> bool:
    """Whether a schema carries x-kubernetes-validations rules anywhere."""
    if isinstance(schema, dict):
        if schema.get("x-kubernetes-validations"):
            return True
        return any(uses_cel(v) for v in schema.values())
    if isinstance(schema, list):
        return any(uses_cel(v) for v in schema)
    return False


# Registers the CRD's validation with the validation dispatch.
from gpufleet.api.validation import apiextensions as _validation  # noqa: E402,F401
