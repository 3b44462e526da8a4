"""Describers of storage: PersistentVolumeClaim, PersistentVolume, StorageClass."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.api import storage
from gpufleet.api.registry import ResourceType
from gpufleet.cli.commands.describe._blocks import (
    _annotations,
    _host_path,
    _list,
)
from gpufleet.cli.describe_text import (
    Doc,
    when,
)
from gpufleet.cli.output import (
    LAST_APPLIED,
    Session,
    age,
    meta,
)

# -- storage --------------------------------------------------------------------------


def _finalizers(obj: Mapping[str, Any]) -> str:
    return "[" + " ".join(meta(obj).get("finalizers") or []) + "]"


def _storage_status(obj: Mapping[str, Any]) -> str:
    deleted = meta(obj).get("deletionTimestamp")
    if deleted:
        return f"Terminating (lasts {age(deleted)})"
    return str((obj.get("status") or {}).get("phase") or "")


async def _describe_pvc(session: Session, rt: ResourceType, pvc: dict[str, Any], doc: Doc) -> None:
    """kubectl's layout, with the pods using the claim (Used By), then its Events: where the
    PV controller, the provisioner and the scheduler say why a claim is Pending."""
    m, spec, status = meta(pvc), pvc.get("spec") or {}, pvc.get("status") or {}
    doc.kv(0, "Name", m.get("name", ""))
    doc.kv(0, "Namespace", m.get("namespace", ""))
    doc.kv(0, "StorageClass", storage.claim_class(pvc))
    doc.kv(0, "Status", _storage_status(pvc))
    doc.kv(0, "Volume", spec.get("volumeName") or "")
    doc.mapping(0, "Labels", m.get("labels"))
    _annotations(doc, 0, m.get("annotations"))
    doc.kv(0, "Finalizers", _finalizers(pvc))
    capacity = modes = ""
    if spec.get("volumeName"):
        capacity = str((status.get("capacity") or {}).get("storage") or "")
        modes = storage.access_modes_text(status.get("accessModes"))
    doc.kv(0, "Capacity", capacity)
    doc.kv(0, "Access Modes", modes)
    if spec.get("volumeMode"):
        doc.kv(0, "VolumeMode", spec["volumeMode"])
    source = spec.get("dataSource")
    if isinstance(source, Mapping):
        doc.title(0, "DataSource:")
        if source.get("apiGroup"):
            doc.kv(1, "APIGroup", source["apiGroup"])
        doc.kv(1, "Kind", source.get("kind", ""))
        doc.kv(1, "Name", source.get("name", ""))
    pods = await _list(session, "pods", m.get("namespace"))
    users = sorted(meta(p).get("name", "") for p in pods if m.get("name") in storage.pod_claim_names(p))
    doc.lines(0, "Used By", users)
    conditions = status.get("conditions") or []
    if conditions:
        doc.title(0, "Conditions:")
        doc.table(1, ["Type", "Status", "LastProbeTime", "LastTransitionTime", "Reason", "Message"], [
            [c.get("type", ""), c.get("status", ""), when(c.get("lastProbeTime")) if c.get("lastProbeTime") else "",
             when(c.get("lastTransitionTime")) if c.get("lastTransitionTime") else "", c.get("reason") or "",
             c.get("message") or ""] for c in conditions])


def _node_affinity(doc: Doc, affinity: Any) -> None:
    required = affinity.get("required") if isinstance(affinity, Mapping) else None
    if not isinstance(required, Mapping):
        doc.kv(0, "Node Affinity", "<none>")
        return
    doc.title(0, "Node Affinity:")
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        doc.kv(1, "Required Terms", "<none>")
        return
    doc.title(1, "Required Terms:")
    for i, term in enumerate(terms):
        expressions = []
        for req in term.get("matchExpressions") or []:
            text = f"{req.get('key', '')} {str(req.get('operator', '')).lower()}"
            if req.get("values"):
                text += f" [{', '.join(req['values'])}]"
            expressions.append(text)
        doc.lines(2, f"Term {i}", expressions)


async def _describe_pv(session: Session, rt: ResourceType, pv: dict[str, Any], doc: Doc) -> None:
    m, spec, status = meta(pv), pv.get("spec") or {}, pv.get("status") or {}
    doc.kv(0, "Name", m.get("name", ""))
    doc.mapping(0, "Labels", m.get("labels"))
    _annotations(doc, 0, m.get("annotations"))
    doc.kv(0, "Finalizers", _finalizers(pv))
    doc.kv(0, "StorageClass", storage.volume_class(pv))
    doc.kv(0, "Status", _storage_status(pv))
    ref = spec.get("claimRef")
    doc.kv(0, "Claim", f"{ref.get('namespace') or ''}/{ref.get('name') or ''}" if isinstance(ref, Mapping) else "")
    doc.kv(0, "Reclaim Policy", spec.get("persistentVolumeReclaimPolicy") or "")
    doc.kv(0, "Access Modes", storage.access_modes_text(spec.get("accessModes")))
    if spec.get("volumeMode"):
        doc.kv(0, "VolumeMode", spec["volumeMode"])
    doc.kv(0, "Capacity", str((spec.get("capacity") or {}).get("storage") or ""))
    _node_affinity(doc, spec.get("nodeAffinity"))
    doc.kv(0, "Message", status.get("message") or "")
    doc.title(0, "Source:")
    if isinstance(spec.get("hostPath"), Mapping):
        _host_path(doc, 2, spec["hostPath"])
    elif isinstance(spec.get("local"), Mapping):
        doc.kv(2, "Type", "LocalVolume (a persistent volume backed by local storage on a node)")
        doc.kv(2, "Path", spec["local"].get("path", ""))
    else:
        kinds = [k for k, v in spec.items() if isinstance(v, Mapping) and k not in
                 ("capacity", "claimRef", "nodeAffinity")]
        doc.kv(2, "Type", ", ".join(kinds) or "<unknown>")


def _format_map(values: Any) -> str:
    """labels.FormatLabels: k=v pairs, sorted, comma-separated; <none> when empty."""
    items = sorted((values or {}).items())
    return ",".join(f"{k}={v}" for k, v in items) if items else "<none>"


async def _describe_storage_class(session: Session, rt: ResourceType, sc: dict[str, Any], doc: Doc) -> None:
    m = meta(sc)
    doc.kv(0, "Name", m.get("name", ""))
    doc.kv(0, "IsDefaultClass", "Yes" if storage.is_default_class(sc) else "No")
    annotations = {k: v for k, v in (m.get("annotations") or {}).items() if k != LAST_APPLIED}
    doc.kv(0, "Annotations", _format_map(annotations))
    doc.kv(0, "Provisioner", sc.get("provisioner", ""))
    doc.kv(0, "Parameters", _format_map(sc.get("parameters")))
    expansion = sc.get("allowVolumeExpansion")
    doc.kv(0, "AllowVolumeExpansion", "<unset>" if expansion is None else str(bool(expansion)))
    options = sc.get("mountOptions") or []
    if options:
        doc.title(0, "MountOptions:")
        for option in options:
            doc.title(1, str(option))
    else:
        doc.kv(0, "MountOptions", "<none>")
    doc.kv(0, "ReclaimPolicy", sc.get("reclaimPolicy") or "Delete")
    doc.kv(0, "VolumeBindingMode", sc.get("volumeBindingMode") or "Immediate")
    topologies = sc.get("allowedTopologies") or []
    if topologies:
        doc.title(0, "AllowedTopologies:")
        for i, term in enumerate(topologies):
            doc.lines(1, f"Term {i}", [f"{e.get('key', '')} in [{', '.join(e.get('values') or [])}]"
                                       for e in term.get("matchLabelExpressions") or []])
