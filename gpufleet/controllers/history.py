"""ControllerRevisions: the history a StatefulSet or DaemonSet keeps of its pod templates.

As Kubernetes' controller history (pkg/controller/history) and the two controllers use it:
- a revision's ``data`` is the patch that puts its template back,
  ``{"spec": {"template": {..., "$patch": "replace"}}}``; `kubectl rollout undo` applies it
  as a strategic merge patch, and `kubectl rollout history --revision` shows its template;
- it is named ``<owner>-<hash>``, labelled with the template's labels and
  ``controller.kubernetes.io/hash``, carries the owner's annotations (so
  ``kubernetes.io/change-cause`` shows in `rollout history`) and a controller reference;
- ``revision`` numbers grow by one per new template; going back to an earlier template
  renumbers that revision to the next number instead of making a copy;
- revisions no pod and neither status revision uses are deleted, oldest first, beyond
  ``spec.revisionHistoryLimit``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from gpufleet.client import objects
from gpufleet.controllers._common import owner_reference, timestamp
from gpufleet.controllers.actions import Actions, Create, Update
from gpufleet.controllers.deployment.model import compute_hash

API_VERSION = "apps/v1"
KIND = "ControllerRevision"
HASH_LABEL = "controller.kubernetes.io/hash"
REVISION_LABEL = "controller-revision-hash"  # on the pods: which revision made them


def template_dict(template: Any) -> dict[str, Any]:
    return template.to_dict() if hasattr(template, "to_dict") else copy.deepcopy(dict(template or {}))


def revision_data(template: Any) -> dict[str, Any]:
    """The patch that restores ``template``."""
    return {"spec": {"template": {**template_dict(template), "$patch": "replace"}}}


def template_of(revision: Any) -> dict[str, Any]:
    """The pod template a revision holds (a wire dict)."""
    data = revision.data if hasattr(revision, "data") else (revision or {}).get("data")
    template = dict(((data or {}).get("spec") or {}).get("template") or {})
    template.pop("$patch", None)
    return template


def number(revision: Any) -> int:
    return int(getattr(revision, "revision", None) or 0)


def sort_revisions(revisions: list[Any]) -> list[Any]:
    """Oldest first: by revision number, then creation time, then name."""
    return sorted(revisions, key=lambda r: (number(r), timestamp(objects.meta(r, "creationTimestamp")) or 0.0,
                                            objects.name_of(r)))


def next_number(revisions: list[Any]) -> int:
    return max((number(r) for r in revisions), default=0) + 1


def equal_data(revision: Any, data: dict[str, Any]) -> bool:
    return _normalized(revision.data) == _normalized(data)


def _normalized(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _normalized(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


def revision_body(owner: Any, owner_kind: str, data: dict[str, Any], hash_: str, revision: int) -> dict[str, Any]:
    """A new ControllerRevision ``<owner>-<hash>`` of ``owner``."""
    template = (data.get("spec") or {}).get("template") or {}
    labels = {**((template.get("metadata") or {}).get("labels") or {}), HASH_LABEL: hash_}
    meta: dict[str, Any] = {
        "name": f"{objects.name_of(owner)}-{hash_}",
        "namespace": objects.namespace_of(owner),
        "labels": labels,
        "ownerReferences": [owner_reference(owner, "apps/v1", owner_kind)],
    }
    annotations = objects.meta(owner, "annotations") or {}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "data": data, "revision": revision}


def hash_of(value: Any, collision_count: int | None) -> str:
    return compute_hash(value, collision_count)


def to_truncate(revisions: list[Any], live: set[str], limit: int) -> list[Any]:
    """The revisions to delete: those not in ``live`` beyond the ``limit`` newest."""
    history = [r for r in sort_revisions(revisions) if objects.name_of(r) not in live]
    excess = len(history) - max(limit, 0)
    return history[:excess] if excess > 0 else []


@dataclass
class UpdateRevision:
    """The revision of the owner's template: its name, hash, the collision count that made the
    name free, and the writes (a create, or a renumbering) that make it the newest."""

    name: str
    hash: str
    collision_count: int
    actions: Actions = field(default_factory=Actions)


def update_revision(owner: Any, owner_kind: str, template: dict[str, Any], revisions: list[Any],
                    collision_count: int, *, hash_data: bool) -> UpdateRevision:
    """Find the revision holding ``template`` (the newest such) or make one. ``hash_data``:
    the name hashes the revision's data (StatefulSet) rather than the template (DaemonSet)."""
    data = revision_data(template)
    ordered = sort_revisions(revisions)
    equal = [r for r in ordered if equal_data(r, data)]
    if equal:
        found = equal[-1]
        name = objects.name_of(found)
        labels = objects.labels_of(found) or {}
        out = UpdateRevision(name, labels.get(HASH_LABEL) or name.rsplit("-", 1)[-1], collision_count)
        if objects.name_of(ordered[-1]) != name:
            # An earlier template is back (a rollback): it becomes the newest revision.
            body = found.to_dict()
            body["revision"] = next_number(ordered)
            out.actions.updates.append(Update(body))
        return out
    names = {objects.name_of(r) for r in ordered}
    while True:
        hash_ = hash_of(data if hash_data else template, collision_count)
        name = f"{objects.name_of(owner)}-{hash_}"
        if name not in names:
            break
        collision_count += 1
    out = UpdateRevision(name, hash_, collision_count)
    body = revision_body(owner, owner_kind, data, hash_, next_number(ordered))
    out.actions.creates.append(Create(body, on_exists="ignore"))
    return out
