"""VolumeBinding: a pod goes only where the volumes of its claims can be, as kube-scheduler's
plugin of that name decides, over the claims, volumes and classes of the cycle's snapshot.

- PreFilter (every claim of the pod's ``persistentVolumeClaim`` and generic ephemeral
  volumes): a claim that does not exist, is being deleted or has lost its volume makes the
  pod UnschedulableAndUnresolvable with Kubernetes' message (``persistentvolumeclaim "data"
  not found``); so does a claim still unbound whose class binds at once ("pod has unbound
  immediate PersistentVolumeClaims": the PV controller binds it first, and the claim's
  change brings the pod back).
- Filter, per node: a bound claim's volume must exist and its node affinity admit the node
  ("node(s) had volume node affinity conflict"); a claim of a WaitForFirstConsumer class not
  bound yet needs, from that node, a free volume that satisfies it or a class that can
  provision there ("node(s) didn't find available persistent volumes to bind"); a claim
  already promised to a node (``volume.kubernetes.io/selected-node``) admits only that node.
- PreBind, in the binding cycle: each such claim is annotated with the chosen node, which
  is what the PV controller and the provisioner act on, and the binding waits until every
  claim of the pod is bound to a volume reachable from the node (at most
  ``bindTimeoutSeconds``, 600 as in Kubernetes). Binding is asynchronous here, so the wait
  holds no scheduling cycle: the pod stays assumed on its node, keeping its resources
  there, while the volume is made. A claim that is deleted, or given back by its provisioner
  (the annotation removed), ends the wait at once; on a timeout the annotation is taken back
  (if nothing was bound yet) and the pod is retried.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.api import storage
from gpufleet.client.errors import ApiError, NotFound
from gpufleet.scheduler.framework import (
    NODE_ADD,
    NODE_LABEL,
    OK,
    PV_ADD,
    PV_UPDATE,
    PVC_ADD,
    PVC_UPDATE,
    SKIP,
    STORAGE_CLASS_ADD,
    Code,
    CycleState,
    FrameworkHandle,
    Status,
)
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot
from gpufleet.scheduler.volumes import StorageState

NAME = "VolumeBinding"
UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
NODE_CONFLICT = "node(s) had volume node affinity conflict"
PV_NOT_EXIST = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
DEFAULT_BIND_TIMEOUT = 600.0

_STATE_KEY = "VolumeBinding/claims"
_CLAIMS_CACHE = "VolumeBinding/names"

Wire = Mapping[str, Any]


@dataclass(frozen=True)
class _Delayed:
    """An unbound claim of a WaitForFirstConsumer class, and what could serve it."""

    claim: Wire
    storage_class: Wire
    candidates: tuple[Wire, ...]  # free volumes that satisfy it, on whatever node

    @property
    def key(self) -> str:
        return storage.claim_key(self.claim)

    @property
    def selected_node(self) -> str:
        return storage.annotations_of(self.claim).get(storage.ANN_SELECTED_NODE) or ""


@dataclass(frozen=True)
class PodClaims:
    # (claim name, its volume or None when the volume does not exist)
    bound: tuple[tuple[str, Wire | None], ...]
    delayed: tuple[_Delayed, ...]


def pod_claims(pod_info: PodInfo) -> list[tuple[str, bool]]:
    """(claim name, is an ephemeral volume's) of a pod, memoized on the PodInfo."""
    cached = pod_info.cache.get(_CLAIMS_CACHE)
    if cached is None:
        spec = pod_info.pod.spec
        out: list[tuple[str, bool]] = []
        for vol in (spec.volumes if spec is not None else None) or ():
            if vol.persistent_volume_claim is not None:
                out.append((vol.persistent_volume_claim.claim_name, False))
            elif vol.ephemeral is not None:
                out.append((f"{pod_info.name}-{vol.name}", True))
        cached = pod_info.cache[_CLAIMS_CACHE] = out
    return cached


def classify(pod_info: PodInfo, state: StorageState) -> PodClaims | Status:
    """The pod's claims split into bound and waiting-for-a-node, or the reason it cannot be
    scheduled anywhere yet."""
    bound: list[tuple[str, Wire | None]] = []
    delayed: list[_Delayed] = []
    for name, ephemeral in pod_claims(pod_info):
        pvc = state.claim(pod_info.namespace, name)
        if pvc is None:
            if ephemeral:
                return Status.unresolvable(
                    f'waiting for ephemeral volume controller to create the persistentvolumeclaim "{name}"')
            return Status.unresolvable(f'persistentvolumeclaim "{name}" not found')
        volume_name = (pvc.get("spec") or {}).get("volumeName") or ""
        if (pvc.get("status") or {}).get("phase") == storage.CLAIM_LOST:
            return Status.unresolvable(
                f'persistentvolumeclaim "{name}" bound to non-existent persistentvolume "{volume_name}"')
        if storage.being_deleted(pvc):
            return Status.unresolvable(f'persistentvolumeclaim "{name}" is being deleted')
        if volume_name:
            bound.append((name, state.volume(volume_name)))
            continue
        sc = state.storage_class(storage.claim_class(pvc))
        if not storage.waits_for_first_consumer(sc):
            return Status.unresolvable(UNBOUND_IMMEDIATE)
        assert sc is not None
        candidates = tuple(
            pv for pv in state.volumes.values()
            if not (pv.get("spec") or {}).get("claimRef") or storage.claim_ref_names(pv, pvc)
        )
        delayed.append(_Delayed(pvc, sc, candidates))
    return PodClaims(tuple(bound), tuple(delayed))


def _topology_allows(sc: Wire, labels: Mapping[str, str]) -> bool:
    """A class's allowedTopologies admit the node (any term; every expression of a term)."""
    terms = sc.get("allowedTopologies") or []
    if not terms:
        return True
    for term in terms:
        if all(labels.get(e.get("key") or "") in (e.get("values") or []) for e in term.get("matchLabelExpressions") or []):
            return True
    return False


def node_reasons(claims: PodClaims, node_name: str, labels: Mapping[str, str]) -> list[str]:
    """Why the pod's volumes keep it off this node (empty: they do not)."""
    reasons: list[str] = []
    for _, pv in claims.bound:
        if pv is None:
            reason = PV_NOT_EXIST
        elif not storage.volume_node_affinity_matches(pv, node_name, labels):
            reason = NODE_CONFLICT
        else:
            continue
        if reason not in reasons:
            reasons.append(reason)
    chosen: set[str] = set()
    for d in claims.delayed:
        if d.selected_node and d.selected_node != node_name:
            ok = False
        else:
            free = [pv for pv in d.candidates if (pv.get("metadata") or {}).get("name") not in chosen]
            pv = storage.find_matching_volume(d.claim, free, node=(node_name, labels))
            if pv is not None:
                chosen.add((pv.get("metadata") or {}).get("name") or "")
                ok = True
            else:
                ok = storage.can_provision(d.storage_class) and _topology_allows(d.storage_class, labels)
        if not ok and BIND_CONFLICT not in reasons:
            reasons.append(BIND_CONFLICT)
    return reasons


class VolumeBinding:
    name = NAME

    def __init__(self, args: Mapping[str, Any] | None = None, handle: FrameworkHandle | None = None) -> None:
        args = args or {}
        self.handle = handle or FrameworkHandle()
        self.bind_timeout = float(args.get("bindTimeoutSeconds", DEFAULT_BIND_TIMEOUT))

    # -- the scheduling cycle: pure over the snapshot -----------------------------------------

    def pre_filter(self, state: CycleState, pod_info: PodInfo, snapshot: Snapshot) -> Status:
        if not pod_claims(pod_info):
            return SKIP
        claims = classify(pod_info, snapshot.storage)
        if isinstance(claims, Status):
            return claims
        state.write(_STATE_KEY, claims)
        return OK

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status:
        claims: PodClaims | None = state.read(_STATE_KEY)
        if claims is None:
            return OK
        reasons = node_reasons(claims, node_info.name, node_info.labels)
        return Status.unresolvable(*reasons) if reasons else OK

    def events_to_register(self) -> set[str]:
        return {PVC_ADD, PVC_UPDATE, PV_ADD, PV_UPDATE, STORAGE_CLASS_ADD, NODE_ADD, NODE_LABEL}

    # -- the binding cycle ----------------------------------------------------------------------

    async def pre_bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status:
        claims: PodClaims | None = state.read(_STATE_KEY)
        tracker = self.handle.volumes
        client = self.handle.client
        if claims is None or not claims.delayed or tracker is None or client is None:
            return OK
        keys = [d.key for d in claims.delayed]
        # Claim -> the resourceVersion that named the node: until the informers have seen
        # that write, a claim without the annotation is only behind, not given back.
        written: dict[str, int] = {}
        # The claims this binding named the node of: only those are taken back on a timeout.
        mine: list[str] = []
        for key in keys:
            why = await self._select_node(tracker.state(), key, node_name, written, mine)
            if why:
                return self._failed(why)
        clock = self.handle.clock
        deadline = clock.monotonic() + self.bind_timeout
        while True:
            generation = tracker.generation
            current = tracker.state()
            waiting, why = _binding_progress(current, keys, node_name, self._node_labels(node_name), written)
            if why:
                return self._failed(why)
            if not waiting:
                return OK
            left = deadline - clock.monotonic()
            if left <= 0:
                await self._take_back(tracker.state(), mine, written, node_name)
                return self._failed("timed out waiting for the condition")
            await tracker.wait_changed(generation, left, clock)

    def _node_labels(self, node_name: str) -> Mapping[str, str]:
        snapshot = self.handle.snapshot
        node_info = snapshot.get(node_name) if snapshot is not None else None
        return node_info.labels if node_info is not None else {}

    @staticmethod
    def _failed(why: str) -> Status:
        return Status(Code.UNSCHEDULABLE, [f'running PreBind plugin "{NAME}": binding volumes: {why}'])

    async def _select_node(self, current: StorageState, key: str, node_name: str, written: dict[str, int],
                           mine: list[str]) -> str:
        namespace, _, name = key.partition("/")
        pvc = current.claim(namespace, name)
        if pvc is None:
            return f'persistentvolumeclaim "{name}" not found'
        if (pvc.get("spec") or {}).get("volumeName"):
            return ""
        selected = storage.annotations_of(pvc).get(storage.ANN_SELECTED_NODE)
        if selected == node_name:
            written[key] = _revision(pvc)
            return ""
        if selected:
            return f'persistentvolumeclaim "{name}" is already waiting for a volume on node "{selected}"'
        patch = {"metadata": {"annotations": {storage.ANN_SELECTED_NODE: node_name}}}
        try:
            patched = await self.handle.client.patch("persistentvolumeclaims", name, patch, namespace, raw=True)
        except NotFound:
            return f'persistentvolumeclaim "{name}" not found'
        except ApiError as exc:
            return f'selecting node "{node_name}" for persistentvolumeclaim "{name}": {exc.message}'
        written[key] = _revision(patched)
        mine.append(key)
        return ""

    async def _take_back(self, current: StorageState, mine: list[str], written: Mapping[str, int],
                         node_name: str) -> None:
        for key in mine:
            namespace, _, name = key.partition("/")
            pvc = current.claim(namespace, name)
            if pvc is None or (pvc.get("spec") or {}).get("volumeName"):
                continue
            selected = storage.annotations_of(pvc).get(storage.ANN_SELECTED_NODE)
            # Our node is still named, or the informers have not shown our write yet.
            if selected != node_name and (selected or _revision(pvc) > written.get(key, 0)):
                continue
            patch = {"metadata": {"annotations": {storage.ANN_SELECTED_NODE: None}}}
            try:
                await self.handle.client.patch("persistentvolumeclaims", name, patch, namespace, raw=True)
            except ApiError:
                continue


def _revision(obj: Any) -> int:
    """The store revision of an object (gpufleet's resourceVersions are its integers)."""
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError, AttributeError):
        return 0


def _binding_progress(
    current: StorageState, keys: list[str], node_name: str, labels: Mapping[str, str], written: Mapping[str, int]
) -> tuple[list[str], str]:
    """(claims still waiting, why the wait cannot succeed) — Kubernetes' checkBindings."""
    waiting: list[str] = []
    for key in keys:
        namespace, _, name = key.partition("/")
        pvc = current.claim(namespace, name)
        if pvc is None:
            return [], f'persistentvolumeclaim "{name}" not found'
        if storage.being_deleted(pvc):
            return [], f'persistentvolumeclaim "{name}" is being deleted'
        volume_name = (pvc.get("spec") or {}).get("volumeName") or ""
        annotations = storage.annotations_of(pvc)
        if not volume_name or annotations.get(storage.ANN_BIND_COMPLETED) is None:
            if annotations.get(storage.ANN_SELECTED_NODE) != node_name and _revision(pvc) > written.get(key, 0):
                # The provisioner gives a claim back by removing the annotation.
                return [], f'provisioning failed for PVC "{name}"'
            waiting.append(key)
            continue
        pv = current.volume(volume_name)
        if pv is None:
            waiting.append(key)
            continue
        if not storage.volume_node_affinity_matches(pv, node_name, labels):
            return [], f'pv "{volume_name}" node affinity doesn\'t match node "{node_name}"'
    return waiting, ""
