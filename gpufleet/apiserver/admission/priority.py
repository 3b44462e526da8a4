"""Priority admission: a pod's priority comes from its PriorityClass, as Kubernetes'
Priority plugin resolves it.

- Pod create: ``spec.priorityClassName`` names the class (403 ``no PriorityClass with name
  x was found`` when there is none); without one, the ``globalDefault`` class is used and
  named on the pod, or priority 0 when no class is the default. ``spec.priority`` and
  ``spec.preemptionPolicy`` are filled from the class; a pod that states different values
  is refused, since the scheduler preempts by them.
- PriorityClass create/update: only one class may be the ``globalDefault``; the built-in
  classes cannot be deleted.
- At server start the built-in classes system-cluster-critical (2000000000) and
  system-node-critical (2000001000) are created when absent, as kube-apiserver does.
"""

from __future__ import annotations

from typing import Any

from gpufleet.api.validation import SYSTEM_PRIORITY_CLASSES
from gpufleet.apiserver.admission import AdmissionContext
from gpufleet.apiserver.errors import ApiException, forbidden
from gpufleet.store import base as store_base

PRIORITY_CLASSES = "priorityclasses.scheduling.k8s.io"
DEFAULT_PREEMPTION_POLICY = "PreemptLowerPriority"
DEFAULT_PRIORITY = 0
_DESCRIPTIONS = {
    "system-cluster-critical": "Used for system critical pods that must run in the cluster, "
                               "but can be moved to another node if necessary.",
    "system-node-critical": "Used for system critical pods that must not be moved from their current node.",
}


async def default_priority_class(store: store_base.Store) -> dict[str, Any] | None:
    """The globalDefault class; should a race have left several, the lowest value wins."""
    found = None
    for pc in await store_base.list_items(store, PRIORITY_CLASSES, None):
        if pc.get("globalDefault") and (found is None or (pc.get("value") or 0) < (found.get("value") or 0)):
            found = pc
    return found


class PriorityAdmission:
    name = "Priority"

    async def start(self, server: Any) -> None:
        rt = server.registry.by_key(PRIORITY_CLASSES)
        if rt is None:
            return
        for name, value in SYSTEM_PRIORITY_CLASSES.items():
            body = {"metadata": {"name": name}, "value": value, "description": _DESCRIPTIONS.get(name, "")}
            try:
                await server.create_object(rt, "", body)
            except ApiException as e:
                if e.code != 409:
                    raise

    async def admit(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if ctx.operation != "CREATE" or ctx.subresource or ctx.rt.key != "pods":
            return
        spec = obj.setdefault("spec", {})
        class_name = spec.get("priorityClassName") or ""
        store = ctx.server.store
        if class_name:
            try:
                pc: dict[str, Any] | None = await store.get(PRIORITY_CLASSES, "", class_name)
            except store_base.NotFound:
                raise forbidden(f'{ctx.rt.key} "{ctx.name}" is forbidden: no PriorityClass with name '
                                f'{class_name} was found', ctx.rt, ctx.name) from None
        else:
            pc = await default_priority_class(store)
        if pc is not None:
            class_name = pc["metadata"]["name"]
            priority = int(pc.get("value") or 0)
            policy = pc.get("preemptionPolicy") or DEFAULT_PREEMPTION_POLICY
        else:
            priority, policy = DEFAULT_PRIORITY, DEFAULT_PREEMPTION_POLICY
        given = spec.get("priority")
        if given is not None and given != priority:
            raise forbidden(
                f'{ctx.rt.key} "{ctx.name}" is forbidden: the integer value of priority ({given}) must not be '
                f'provided in pod spec; priority admission controller computed {priority} from the given '
                f'PriorityClass name', ctx.rt, ctx.name)
        given_policy = spec.get("preemptionPolicy")
        if given_policy is not None and given_policy != policy:
            raise forbidden(
                f'{ctx.rt.key} "{ctx.name}" is forbidden: the string value of PreemptionPolicy ({given_policy}) '
                f'must not be provided in pod spec; priority admission controller computed {policy} from the '
                f'given PriorityClass name', ctx.rt, ctx.name)
        if class_name:
            spec["priorityClassName"] = class_name
        spec["priority"] = priority
        spec["preemptionPolicy"] = policy

    async def validate(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if ctx.subresource or ctx.rt.key != PRIORITY_CLASSES:
            return
        if ctx.operation == "DELETE":
            if ctx.name in SYSTEM_PRIORITY_CLASSES:
                raise forbidden(f'{ctx.rt.key} "{ctx.name}" is forbidden: this is a system priority class and '
                                "cannot be deleted", ctx.rt, ctx.name)
            return
        if ctx.operation not in ("CREATE", "UPDATE"):
            return
        if not obj.get("globalDefault"):
            return
        current = await default_priority_class(ctx.server.store)
        if current is not None and current["metadata"]["name"] != ctx.name:
            raise forbidden(
                f'{ctx.rt.key} "{ctx.name}" is forbidden: PriorityClass {current["metadata"]["name"]} is already '
                f'marked as default. Only one default can exist', ctx.rt, ctx.name)
