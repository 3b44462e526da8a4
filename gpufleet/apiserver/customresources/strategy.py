"""What custom resources and their definitions add to the generic verbs (their Strategies).

``CustomResourceStrategy``: metadata.generation counts every change but metadata (and status,
when the status subresource owns it); validation is the version's schema; the table shows
the CRD's additionalPrinterColumns. ``CustomResourceDefinitionStrategy``: the status the
naming and establishing controllers of kube-apiserver would write (acceptedNames,
NamesAccepted, Established, storedVersions), written with the object here; a delete holds the
CRD (finalizer customresourcecleanup.apiextensions.k8s.io) until its objects are gone.
"""

from __future__ import annotations

import json
import time
from typing import Any

from gpufleet.api import apiextensions as crds
from gpufleet.api import jsonpath, k8s, structural
from gpufleet.api import validation as v
from gpufleet.api.registry import REGISTRY
from gpufleet.apiserver.errors import ApiException
from gpufleet.apiserver.strategy import Strategy, register_strategy
from gpufleet.apiserver.tables import NAME_COLUMN, Column, Printer, human_duration, since, to_table
from gpufleet.store import base as store_base
from gpufleet.utils.clock import parse_rfc3339, rfc3339

# --- custom resources ----------------------------------------------------------------------


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def cell(column: dict[str, Any], obj: dict[str, Any], now: float) -> Any:
    """One printer column's cell, as kube-apiserver's TableConvertor fills it (None: <none>)."""
    found = jsonpath.find(obj, str(column.get("jsonPath") or ""))
    if not found or found[0] is None:
        return None
    value = found[0]
    kind = column.get("type")
    if kind == "string":
        return _text(value)
    if kind == "integer":
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if kind == "number":
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    if kind == "date":
        if not isinstance(value, str):
            return None
        try:
            return human_duration(now - parse_rfc3339(value))
        except ValueError:
            return None
    return None


def printer(columns: list[dict[str, Any]]) -> Printer:
    defs = (NAME_COLUMN, *(Column(str(c.get("name") or ""), str(c.get("type") or "string"),
                                  str(c.get("format") or ""), str(c.get("description") or ""),
                                  int(c.get("priority") or 0)) for c in columns))

    def row(obj: dict[str, Any], now: float) -> list[Any]:
        return [(obj.get("metadata") or {}).get("name", ""), *(cell(c, obj, now) for c in columns)]

    return Printer(defs, row)


class CustomResourceStrategy(Strategy):
    """A custom resource: schema validation, generation on every change, the CRD's columns."""

    strategic_merge = False

    @property
    def generation_tracked(self) -> bool:
        return True

    async def prepare_for_create(self, store: store_base.Store, obj: dict[str, Any]) -> None:
        if self.rt.extra.get("terminating"):
            raise ApiException(405, "MethodNotAllowed",
                               "create not allowed while custom resource definition is terminating")
        await super().prepare_for_create(store, obj)

    def update_generation(self, new: dict[str, Any], current: dict[str, Any], subresource: str) -> None:
        if subresource == "status":
            return
        skip = ("metadata", "status") if self.has_status else ("metadata",)
        before = {k: val for k, val in current.items() if k not in skip}
        after = {k: val for k, val in new.items() if k not in skip}
        if before != after:
            new["metadata"]["generation"] = int(current["metadata"].get("generation") or 1) + 1

    def validate(self, model: Any, old_model: Any | None) -> list[Any]:
        errs: list[Any] = []
        data = model.to_dict()
        meta = k8s.ObjectMeta.model_validate(data.get("metadata") or {})
        v.validate_object_meta(meta, errs, namespaced=self.rt.namespaced)
        if old_model is not None:
            old_meta = k8s.ObjectMeta.model_validate(old_model.to_dict().get("metadata") or {})
            v.validate_object_meta_update(meta, old_meta, errs)
        errs.extend(structural.validate(data, self.rt.extra.get("schema")))
        return errs

    def table(self, items: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        return to_table(self.rt, items, printer=printer(self.rt.extra.get("columns") or []), **kwargs)


# --- the definitions -------------------------------------------------------------------------


def _condition(previous: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
               now: str) -> dict[str, Any]:
    for c in previous:
        if c.get("type") == type_ and c.get("status") == status:
            return {**c, "reason": reason, "message": message}
    return {"type": type_, "status": status, "lastTransitionTime": now, "reason": reason, "message": message}


def derive_status(crd: dict[str, Any], previous: dict[str, Any] | None,
                  naming: crds.Naming | None = None) -> dict[str, Any]:
    """The status a CRD's names and versions give it: accepted names, NamesAccepted and
    Established as ``naming`` decides them (without it, as the previous status had them; a
    CRD without any is granted its names), stored versions (those ever used for storage,
    the current one included)."""
    prev = previous if isinstance(previous, dict) else {}
    now = rfc3339(time.time())
    conditions = [c for c in prev.get("conditions") or [] if isinstance(c, dict)]
    if naming is None:
        kept_names = {c.get("type"): c for c in conditions}
        if prev.get("acceptedNames") and crds.NAMES_ACCEPTED in kept_names and crds.ESTABLISHED in kept_names:
            naming = crds.Naming(prev["acceptedNames"],
                                 *(tuple(str(kept_names[t].get(k) or "") for k in ("status", "reason", "message"))
                                   for t in (crds.NAMES_ACCEPTED, crds.ESTABLISHED)))
        else:
            naming = crds.decide_names({**crd, "status": {}}, set(), set())
    kept = [c for c in conditions if c.get("type") not in (crds.NAMES_ACCEPTED, crds.ESTABLISHED)]
    status_conditions = [
        _condition(conditions, crds.NAMES_ACCEPTED, *naming.names_accepted, now),
        _condition(conditions, crds.ESTABLISHED, *naming.established, now),
        *kept,
    ]
    stored = [s for s in prev.get("storedVersions") or [] if isinstance(s, str)]
    storage = crds.storage_version(crd)
    if storage and storage not in stored:
        stored.append(storage)
    return {"conditions": status_conditions, "acceptedNames": naming.accepted, "storedVersions": stored}


BUILTIN_KEYS = frozenset(t.key for t in REGISTRY.served())


def is_builtin(crd: dict[str, Any], builtin_keys: frozenset[str] | set[str] = BUILTIN_KEYS) -> bool:
    """Whether ``crd`` names a resource gpufleet serves by itself (it changes nothing)."""
    names, spec = crds.names_of(crd), crds.spec_of(crd)
    return f"{names.get('plural')}.{spec.get('group')}" in builtin_keys


def naming_of_all(items: list[dict[str, Any]]) -> dict[str, crds.Naming]:
    builtin = [t for t in REGISTRY.served() if t.key != crds.RESOURCE_KEY]
    return crds.decide_all_names(items, builtin, is_builtin)


def _created_at(obj: dict[str, Any], now: float) -> list[Any]:
    meta = obj.get("metadata") or {}
    return [meta.get("name", ""), meta.get("creationTimestamp") or since(None, now)]


_CRD_PRINTER = Printer((NAME_COLUMN, Column(
    "Created At", "date", description="CreationTimestamp is a timestamp representing the server time when this "
                                      "object was created.")), _created_at)


class CustomResourceDefinitionStrategy(Strategy):
    """Status derived on every write; a delete waits for the cleanup of the objects."""

    held_until_finalized = True

    async def prepare_for_create(self, store: store_base.Store, obj: dict[str, Any]) -> None:
        await super().prepare_for_create(store, obj)
        name = (obj.get("metadata") or {}).get("name") or ""
        others = [c for c in (await store.list(crds.RESOURCE_KEY, None)).items
                  if (c.get("metadata") or {}).get("name") != name]
        fresh = {**obj, "status": {}}
        obj["status"] = derive_status(obj, None, naming_of_all([*others, fresh]).get(name))

    def prepare_for_update(self, new: dict[str, Any], old: dict[str, Any]) -> None:
        new["status"] = derive_status(new, new.get("status"))

    def mark_terminating(self, new: dict[str, Any], current: dict[str, Any]) -> None:
        meta = new["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if not (current.get("metadata") or {}).get("deletionTimestamp") and crds.CLEANUP_FINALIZER not in finalizers:
            finalizers.append(crds.CLEANUP_FINALIZER)
        if finalizers:
            meta["finalizers"] = finalizers
        status = dict(new.get("status") or {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != crds.TERMINATING]
        conditions.append(_condition([], crds.TERMINATING, "True", "InstanceDeletionInProgress",
                                     "CustomResource deletion is in progress", rfc3339(time.time())))
        status["conditions"] = conditions
        new["status"] = status

    def table(self, items: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        return to_table(self.rt, items, printer=_CRD_PRINTER, **kwargs)


register_strategy(crds.GROUP, crds.KIND, CustomResourceDefinitionStrategy)
