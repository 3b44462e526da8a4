"""Persistent storage in Kubernetes' shapes: the annotations, finalizers and matching rules
that PersistentVolumes, PersistentVolumeClaims and StorageClasses share between the API
server (admission, the Node authorizer), the PV controller, the local-path provisioner, the
scheduler's VolumeBinding plugin and the node agent.

Everything here works on the wire form (plain dicts, camelCase), as stored and as informers
with ``raw=True`` hold it, and is pure: no I/O, no clock.

The rules follow Kubernetes' ``pkg/controller/volume/persistentvolume`` and
``component-helpers/storage/volume``:

- a claim's class is the beta annotation ``volume.beta.kubernetes.io/storage-class`` when
  present, else ``spec.storageClassName`` ("" means "no class": only volumes without a
  class match);
- a volume satisfies a claim when it is not being deleted, has the claim's class and volume
  mode, offers every access mode the claim asks for, at least the storage it requests, and
  the labels its selector wants; among those the smallest one wins, a volume pre-bound to
  the claim (``spec.claimRef`` naming it) before any other;
- ``volume.kubernetes.io/selected-node`` on a claim names the node the scheduler chose for
  its first consumer (WaitForFirstConsumer classes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from gpufleet.api.quantity import parse_quantity
from gpufleet.api.selectors import LabelSelector, SelectorError

# -- annotations and finalizers (Kubernetes' names) ---------------------------------------

ANN_BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
ANN_BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
ANN_PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
ANN_STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
ANN_BETA_STORAGE_PROVISIONER = "volume.beta.kubernetes.io/storage-provisioner"
ANN_BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"
ANN_DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
ANN_BETA_DEFAULT_CLASS = "storageclass.beta.kubernetes.io/is-default-class"

PVC_PROTECTION_FINALIZER = "kubernetes.io/pvc-protection"
PV_PROTECTION_FINALIZER = "kubernetes.io/pv-protection"

# -- phases, modes, policies ----------------------------------------------------------------

CLAIM_PENDING, CLAIM_BOUND, CLAIM_LOST = "Pending", "Bound", "Lost"
VOLUME_PENDING, VOLUME_AVAILABLE, VOLUME_BOUND = "Pending", "Available", "Bound"
VOLUME_RELEASED, VOLUME_FAILED = "Released", "Failed"

RETAIN, DELETE, RECYCLE = "Retain", "Delete", "Recycle"
IMMEDIATE, WAIT_FOR_FIRST_CONSUMER = "Immediate", "WaitForFirstConsumer"
FILESYSTEM, BLOCK = "Filesystem", "Block"

ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")
_MODE_ABBREVIATIONS = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX",
                       "ReadWriteOncePod": "RWOP"}

# A class whose volumes are all created by hand (Kubernetes' "kubernetes.io/no-provisioner").
NO_PROVISIONER = "kubernetes.io/no-provisioner"

# -- the local-path provisioner ---------------------------------------------------------------

LOCAL_PATH_PROVISIONER = "gpufleet.io/local-path"
# Rancher's local-path-provisioner (k3s's default class): its manifests carry over.
RANCHER_LOCAL_PATH_PROVISIONER = "rancher.io/local-path"
LOCAL_PATH_PROVISIONERS = frozenset({LOCAL_PATH_PROVISIONER, RANCHER_LOCAL_PATH_PROVISIONER})
LOCAL_PATH_CLASS = "local-path"
NODE_PATH_PARAMETER = "nodePath"
DEFAULT_NODE_PATH = "/var/lib/gpufleet/local-path"
# Held by every provisioned volume until the node it lives on removed its directory.
LOCAL_PATH_CLEANUP_FINALIZER = "gpufleet.io/local-path-cleanup"
# On provisioned volumes: the node whose agent cleans them up (and may list and watch them).
LOCAL_PATH_NODE_LABEL = "gpufleet.io/local-path-node"
HOSTNAME_LABEL = "kubernetes.io/hostname"


def _part(obj: Mapping[str, Any] | None, key: str) -> Mapping[str, Any]:
    # Objects come from the store as clients wrote them: a malformed part reads as empty.
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _part(obj, "metadata")


def _spec(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _part(obj, "spec")


def _status(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _part(obj, "status")


def annotations_of(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return _meta(obj).get("annotations") or {}


def being_deleted(obj: Mapping[str, Any] | None) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def claim_key(pvc: Mapping[str, Any]) -> str:
    m = _meta(pvc)
    return f"{m.get('namespace') or ''}/{m.get('name') or ''}"


# -- classes ------------------------------------------------------------------------------------


def claim_class(pvc: Mapping[str, Any]) -> str:
    """The class a claim asks for ("" for none), as Kubernetes' GetPersistentVolumeClaimClass."""
    annotations = annotations_of(pvc)
    if ANN_BETA_STORAGE_CLASS in annotations:
        return annotations[ANN_BETA_STORAGE_CLASS]
    return _spec(pvc).get("storageClassName") or ""


def claim_class_unset(pvc: Mapping[str, Any]) -> bool:
    """No class at all (neither field nor annotation): the default class may be given to it.
    An explicit "" means "no class" and is left alone."""
    return _spec(pvc).get("storageClassName") is None and ANN_BETA_STORAGE_CLASS not in annotations_of(pvc)


def volume_class(pv: Mapping[str, Any]) -> str:
    annotations = annotations_of(pv)
    if ANN_BETA_STORAGE_CLASS in annotations:
        return annotations[ANN_BETA_STORAGE_CLASS]
    return _spec(pv).get("storageClassName") or ""


def is_default_class(sc: Mapping[str, Any]) -> bool:
    annotations = annotations_of(sc)
    return annotations.get(ANN_DEFAULT_CLASS) == "true" or annotations.get(ANN_BETA_DEFAULT_CLASS) == "true"


def default_class(classes: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The default class; of several, the newest (then the first by name), as Kubernetes
    chooses since 1.28."""
    defaults = [sc for sc in classes if is_default_class(sc)]
    if not defaults:
        return None
    defaults.sort(key=lambda sc: _meta(sc).get("name") or "")
    defaults.sort(key=lambda sc: _meta(sc).get("creationTimestamp") or "", reverse=True)
    return defaults[0]


def binding_mode(sc: Mapping[str, Any] | None) -> str:
    return (sc or {}).get("volumeBindingMode") or IMMEDIATE


def waits_for_first_consumer(sc: Mapping[str, Any] | None) -> bool:
    return sc is not None and binding_mode(sc) == WAIT_FOR_FIRST_CONSUMER


def can_provision(sc: Mapping[str, Any] | None) -> bool:
    provisioner = (sc or {}).get("provisioner") or ""
    return bool(provisioner) and provisioner != NO_PROVISIONER


def node_path(sc: Mapping[str, Any] | None) -> str:
    """Where a local-path class keeps its volumes on each node."""
    return ((sc or {}).get("parameters") or {}).get(NODE_PATH_PARAMETER) or DEFAULT_NODE_PATH


# -- quantities and modes -------------------------------------------------------------------


def _storage(resources: Mapping[str, Any] | None) -> Fraction | None:
    raw = (resources or {}).get("storage")
    if raw is None:
        return None
    try:
        return parse_quantity(raw)
    except ValueError:
        return None


def claim_request(pvc: Mapping[str, Any]) -> Fraction | None:
    return _storage((_spec(pvc).get("resources") or {}).get("requests"))


def volume_capacity(pv: Mapping[str, Any]) -> Fraction | None:
    return _storage(_spec(pv).get("capacity"))


def access_modes_text(modes: Iterable[str] | None) -> str:
    """Kubernetes' GetAccessModesAsString: "RWO,ROX,RWX,RWOP" in that order, each once."""
    given = set(modes or ())
    return ",".join(_MODE_ABBREVIATIONS[m] for m in ACCESS_MODES if m in given)


def volume_mode(obj: Mapping[str, Any]) -> str:
    return _spec(obj).get("volumeMode") or FILESYSTEM


# -- pods and their claims -------------------------------------------------------------------


def pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The claims a pod's volumes use: ``persistentVolumeClaim.claimName``, and for a generic
    ephemeral volume the claim Kubernetes names ``<pod>-<volume>``."""
    out: list[str] = []
    name = _meta(pod).get("name") or ""
    volumes = _spec(pod).get("volumes")
    for vol in volumes if isinstance(volumes, list) else []:
        if not isinstance(vol, Mapping):
            continue
        source = vol.get("persistentVolumeClaim")
        if isinstance(source, Mapping) and source.get("claimName"):
            claim = str(source["claimName"])
        elif isinstance(vol.get("ephemeral"), Mapping):
            claim = f"{name}-{vol.get('name') or ''}"
        else:
            continue
        if claim not in out:
            out.append(claim)
    return out


def pod_uses_claim(pod: Mapping[str, Any], claim_name: str) -> bool:
    """Whether the pod holds the claim in use (pvc-protection): scheduled to a node and not
    finished. A pod still waiting for a node cannot start with a claim being deleted, and a
    finished one has let go of its volumes."""
    if not _spec(pod).get("nodeName"):
        return False
    if _status(pod).get("phase") in ("Succeeded", "Failed"):
        return False
    return claim_name in pod_claim_names(pod)


# -- node affinity ----------------------------------------------------------------------------


def _int64(text: str) -> int | None:
    try:
        return int(text, 10)
    except (TypeError, ValueError):
        return None


def _requirement_matches(req: Mapping[str, Any], value: str | None) -> bool:
    op = req.get("operator")
    values = [str(v) for v in req.get("values") or []]
    present = value is not None
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        have, want = _int64(value or ""), _int64(values[0])
        if have is None or want is None:
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_selector_term_matches(term: Mapping[str, Any], node_name: str, labels: Mapping[str, str]) -> bool:
    """One NodeSelectorTerm; a term without any expression matches nothing, as in Kubernetes."""
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    for req in expressions:
        key = req.get("key") or ""
        if not _requirement_matches(req, labels.get(key)):
            return False
    for req in fields:
        if req.get("key") != "metadata.name" or not _requirement_matches(req, node_name):
            return False
    return True


def volume_node_affinity_matches(pv: Mapping[str, Any], node_name: str, labels: Mapping[str, str]) -> bool:
    """Whether a pod using the volume may run on the node: no affinity allows every node;
    otherwise one of the required terms must match."""
    affinity = _spec(pv).get("nodeAffinity") or {}
    required = affinity.get("required")
    if not required:
        return True
    return any(node_selector_term_matches(t, node_name, labels) for t in required.get("nodeSelectorTerms") or [])


def pinned_nodes(pv: Mapping[str, Any]) -> set[str]:
    """The nodes a volume's affinity names outright (``kubernetes.io/hostname In [...]`` or
    ``metadata.name In [...]``, in a term of its own): where its data lives."""
    affinity = _spec(pv).get("nodeAffinity") or {}
    out: set[str] = set()
    for term in (affinity.get("required") or {}).get("nodeSelectorTerms") or []:
        for req in [*(term.get("matchExpressions") or []), *(term.get("matchFields") or [])]:
            if req.get("operator") != "In":
                continue
            if req.get("key") in (HOSTNAME_LABEL, "metadata.name"):
                out.update(str(v) for v in req.get("values") or [])
    return out


def pinned_to(pv: Mapping[str, Any], node_name: str) -> bool:
    return node_name in pinned_nodes(pv)


def node_affinity_for(node_name: str) -> dict[str, Any]:
    """The affinity of a volume that lives on one node (what the local-path provisioner writes)."""
    return {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": HOSTNAME_LABEL, "operator": "In", "values": [node_name]}]}]}}


# -- matching claims and volumes --------------------------------------------------------------


def claim_ref_names(pv: Mapping[str, Any], pvc: Mapping[str, Any]) -> bool:
    """The volume's claimRef names this claim (and, when it records a uid, this very claim)."""
    ref = _spec(pv).get("claimRef")
    if not ref:
        return False
    m = _meta(pvc)
    if ref.get("name") != m.get("name") or (ref.get("namespace") or "") != (m.get("namespace") or ""):
        return False
    return not ref.get("uid") or ref.get("uid") == m.get("uid")


def is_volume_bound_to_claim(pv: Mapping[str, Any], pvc: Mapping[str, Any]) -> bool:
    return claim_ref_names(pv, pvc)


def mismatch(pv: Mapping[str, Any], pvc: Mapping[str, Any]) -> str | None:
    """Why the volume cannot serve the claim (Kubernetes' checkVolumeSatisfyClaim), or None."""
    request = claim_request(pvc) or Fraction(0)
    capacity = volume_capacity(pv)
    if capacity is None or capacity < request:
        return "requested PV is too small"
    if volume_class(pv) != claim_class(pvc):
        return "storageClassName does not match"
    if volume_mode(pv) != volume_mode(pvc):
        return "incompatible volumeMode"
    wanted = set(_spec(pvc).get("accessModes") or ())
    if not wanted <= set(_spec(pv).get("accessModes") or ()):
        return "incompatible accessMode"
    return None


def _selector_matches(pvc: Mapping[str, Any], pv: Mapping[str, Any]) -> bool:
    selector = _spec(pvc).get("selector")
    if selector is None:
        return True
    try:
        return LabelSelector.from_dict(selector).matches(_meta(pv).get("labels") or {})
    except SelectorError:
        return False


def find_matching_volume(
    pvc: Mapping[str, Any],
    volumes: Iterable[Mapping[str, Any]],
    *,
    delay_binding: bool = False,
    node: tuple[str, Mapping[str, str]] | None = None,
    prebound_anywhere: bool = False,
) -> Mapping[str, Any] | None:
    """The volume the claim should be bound to, as Kubernetes' findMatchingVolume picks it.

    A volume pre-bound to the claim (its ``claimRef`` names it) wins outright: that is the
    administrator's (or a provisioner's) choice. Otherwise the smallest Available volume that
    satisfies the claim and its selector. With ``delay_binding`` (a WaitForFirstConsumer
    claim whose consumer has no node yet) only a pre-bound volume counts; ``node`` (name,
    labels) keeps only the volumes reachable from that node, pre-bound ones too unless
    ``prebound_anywhere`` (the PV controller binds what was reserved wherever it is).
    """
    best: Mapping[str, Any] | None = None
    best_capacity: Fraction | None = None
    request = claim_request(pvc) or Fraction(0)
    for pv in volumes:
        if volume_mode(pv) != volume_mode(pvc) or being_deleted(pv):
            continue
        reachable = node is None or volume_node_affinity_matches(pv, node[0], node[1])
        if claim_ref_names(pv, pvc):
            return pv if reachable or prebound_anywhere else None
        if _spec(pv).get("claimRef") or delay_binding or not reachable:
            continue
        if _status(pv).get("phase") != VOLUME_AVAILABLE or not _selector_matches(pvc, pv):
            continue
        if mismatch(pv, pvc) is not None:
            continue
        capacity = volume_capacity(pv)
        if capacity is None or capacity < request:
            continue
        if best_capacity is None or capacity < best_capacity:
            best, best_capacity = pv, capacity
    return best


# -- local-path volumes -----------------------------------------------------------------------

_PROVISIONED_NAME = re.compile(r"^pvc-[0-9a-f-]+$")


def provisioned_volume_name(pvc: Mapping[str, Any]) -> str:
    """``pvc-<claim uid>``: the name Kubernetes' provisioners give a claim's volume."""
    return f"pvc-{_meta(pvc).get('uid') or ''}"


def local_path_dir_name(volume_name: str, namespace: str, claim_name: str) -> str:
    """The directory of a provisioned volume under the class's nodePath (Rancher's layout)."""
    return f"{volume_name}_{namespace}_{claim_name}"


def looks_provisioned(volume_name: str, dir_name: str) -> bool:
    """Whether ``dir_name`` is what the local-path provisioner made for ``volume_name``: the
    cleanup removes nothing else."""
    return bool(_PROVISIONED_NAME.match(volume_name)) and dir_name.startswith(f"{volume_name}_") \
        and "/" not in dir_name and len(dir_name) > len(volume_name) + 1


def volume_path(pv: Mapping[str, Any]) -> str:
    """The directory a hostPath or local volume names ("" for other sources)."""
    spec = _spec(pv)
    for source in ("hostPath", "local"):
        value = spec.get(source)
        if isinstance(value, Mapping) and value.get("path"):
            return str(value["path"])
    return ""


def provisioned_by(pv: Mapping[str, Any]) -> str:
    return annotations_of(pv).get(ANN_PROVISIONED_BY) or ""


def provisioned_locally(pv: Mapping[str, Any]) -> bool:
    return provisioned_by(pv) in LOCAL_PATH_PROVISIONERS
