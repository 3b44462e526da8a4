"""CustomResourceDefinition (apiextensions.k8s.io/v1): the kind that declares other kinds.

The model keeps Kubernetes' field names; a version's ``openAPIV3Schema`` stays plain JSON
(JSONSchemaProps nests without end, and the structural rules in ``structural.py`` read it as
such). Importing this module registers the kind's defaults and validation
(``validation/apiextensions.py``). The helpers at the end read what a CRD declares for one
version: its schema, subresources, printer columns and selectable fields.
"""

from __future__ import annotations

from dataclasses import dataclass
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


# -- names: which CRD may serve which names (kube-apiserver's naming controller) -------------------


def requested_names(crd: dict[str, Any]) -> dict[str, Any]:
    """spec.names with singular and listKind defaulted."""
    names = names_of(crd)
    kind = names.get("kind") or ""
    out: dict[str, Any] = {"plural": names.get("plural") or "", "singular": names.get("singular") or kind.lower(),
                           "kind": kind, "listKind": names.get("listKind") or (f"{kind}List" if kind else "")}
    for key in ("shortNames", "categories"):
        if names.get(key):
            out[key] = list(names[key])
    return out


def accepted_names(crd: dict[str, Any]) -> dict[str, Any]:
    names = (crd.get("status") or {}).get("acceptedNames")
    return names if isinstance(names, dict) else {}


def _claims(names: dict[str, Any], resources: set[str], kinds: set[str]) -> None:
    resources.update(n for n in (names.get("plural"), names.get("singular"), *(names.get("shortNames") or ())) if n)
    kinds.update(n for n in (names.get("kind"), names.get("listKind")) if n)


def builtin_claims(types: list[Any], group: str) -> tuple[set[str], set[str]]:
    """The resource names and kinds the built-in resource types of ``group`` use."""
    resources: set[str] = set()
    kinds: set[str] = set()
    for t in types:
        if t.group == group:
            _claims({"plural": t.plural, "singular": t.singular, "shortNames": list(t.short_names),
                     "kind": t.kind, "listKind": t.list_kind}, resources, kinds)
    return resources, kinds


@dataclass
class Naming:
    """What the naming decision gives a CRD: its accepted names, and its NamesAccepted and
    Established conditions as (status, reason, message)."""

    accepted: dict[str, Any]
    names_accepted: tuple[str, str, str]
    established: tuple[str, str, str]


def _fresh(requested: str, accepted: str, used: set[str]) -> str | None:
    """None when ``requested`` may be had (already this CRD's, or nobody's), else the error."""
    if requested == accepted or requested not in used:
        return None
    return f'"{requested}" is already in use'


def decide_names(crd: dict[str, Any], resources: set[str], kinds: set[str]) -> Naming:
    """The names ``crd`` is granted given the names others of its group hold (``resources``:
    plurals, singulars and short names; ``kinds``: kinds and list kinds), as kube-apiserver's
    naming controller grants them: a name another holds stays with it, and the CRD's
    NamesAccepted is False with the conflict's reason (PluralConflict, SingularConflict,
    ShortNamesConflict, KindConflict, ListKindConflict). Established becomes True once all
    names are accepted, and stays True (the names accepted before keep being served)."""
    requested, accepted = requested_names(crd), accepted_names(crd)
    new = dict(accepted)
    problem: tuple[str, str] | None = None
    for key, used, reason in (("plural", resources, "PluralConflict"), ("singular", resources, "SingularConflict")):
        err = _fresh(requested[key], accepted.get(key) or "", used)
        if err:
            problem = (reason, err)
        else:
            new[key] = requested[key]
    wanted_short = list(requested.get("shortNames") or [])
    if wanted_short != list(accepted.get("shortNames") or []):
        mine = set(accepted.get("shortNames") or [])
        errs = [e for e in (_fresh(n, "", resources) for n in wanted_short if n not in mine) if e]
        if errs:
            problem = ("ShortNamesConflict", errs[0] if len(errs) == 1 else f"[{', '.join(errs)}]")
        elif wanted_short:
            new["shortNames"] = wanted_short
        else:
            new.pop("shortNames", None)
    for key, reason in (("kind", "KindConflict"), ("listKind", "ListKindConflict")):
        err = _fresh(requested[key], accepted.get(key) or "", kinds)
        if err:
            problem = (reason, err)
        else:
            new[key] = requested[key]
    if requested.get("categories"):
        new["categories"] = requested["categories"]
    else:
        new.pop("categories", None)
    names_accepted = ("False", problem[0], problem[1]) if problem else ("True", "NoConflicts", "no conflicts found")
    was = condition(crd, ESTABLISHED)
    if was is not None and was.get("status") == "True":
        established = ("True", str(was.get("reason") or "InitialNamesAccepted"), str(was.get("message") or ""))
    elif problem is None:
        established = ("True", "InitialNamesAccepted", "the initial names have been accepted")
    else:
        established = ("False", "NotAccepted", "not all names are accepted")
    return Naming(new, names_accepted, established)


def decide_all_names(crds: list[dict[str, Any]], builtin: list[Any],
                     is_builtin: Any = lambda crd: False) -> dict[str, Naming]:
    """The naming of every CRD, oldest first, each against what the others of its group hold
    (their names as granted so far) and the group's built-in resource types. A CRD for a
    built-in resource (``is_builtin``) is granted its names: it changes nothing."""
    ordered = sorted(crds, key=lambda c: (str((c.get("metadata") or {}).get("creationTimestamp") or ""),
                                          (c.get("metadata") or {}).get("name") or ""))
    granted: dict[str, tuple[str, dict[str, Any]]] = {
        (c.get("metadata") or {}).get("name") or "": (spec_of(c).get("group") or "", accepted_names(c)) for c in ordered}
    out: dict[str, Naming] = {}
    for crd in ordered:
        name = (crd.get("metadata") or {}).get("name") or ""
        group = spec_of(crd).get("group") or ""
        if is_builtin(crd):
            naming = decide_names({**crd, "status": {}}, set(), set())
        else:
            resources, kinds = builtin_claims(builtin, group)
            for other, (other_group, names) in granted.items():
                if other != name and other_group == group:
                    _claims(names, resources, kinds)
            naming = decide_names(crd, resources, kinds)
        granted[name] = (group, naming.accepted)
        out[name] = naming
    return out


# Registers the CRD's validation with the validation dispatch.
from gpufleet.api.validation import apiextensions as _validation  # noqa: E402,F401
