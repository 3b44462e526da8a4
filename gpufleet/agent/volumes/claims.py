"""persistentVolumeClaim and ephemeral volumes: the claim, its bound PersistentVolume and the
node affinity that says whether this node may mount it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpufleet.agent.volumes.common import (
    _NODE_SELECTOR_OPERATORS,
    _PLUGINS,
    _PV_NON_SOURCE_FIELDS,
    VolumeError,
    VolumeInfo,
    _PodContext,
    _SetUpError,
)
from gpufleet.agent.volumes.paths import check_host_path
from gpufleet.api.selectors import Requirement, SelectorError

log = logging.getLogger(__name__)

class ClaimsMixin:
    """VolumeManager's claims (see manager.py)."""

    # -- claims -------------------------------------------------------------------------

    async def _claim(self, ctx: _PodContext, name: str, claim_name: str, read_only: bool, *,
                     ephemeral: bool = False) -> VolumeInfo:
        ns = ctx.namespace
        pvc = await self._fetch(name, "persistentvolumeclaims", ns, claim_name)
        if pvc is None:
            if ephemeral:
                raise VolumeError(name, "FailedMount", "waiting for ephemeral volume controller to create the "
                                                       f'persistentvolumeclaim "{claim_name}"')
            raise VolumeError(name, "FailedMount", f'persistentvolumeclaim "{claim_name}" not found')
        meta = pvc.get("metadata") or {}
        if ephemeral and not any(ref.get("uid") == ctx.uid and ref.get("controller")
                                 for ref in meta.get("ownerReferences") or []):
            raise VolumeError(name, "FailedMount",
                              f"PVC {ns}/{claim_name} was not created for pod {ns}/{ctx.name} (pod is not owner)")
        if meta.get("deletionTimestamp"):
            raise VolumeError(name, "FailedMount", f"can't start pod because PVC {ns}/{claim_name} is being deleted")
        phase = (pvc.get("status") or {}).get("phase") or ""
        pv_name = (pvc.get("spec") or {}).get("volumeName") or ""
        if phase != "Bound" or not pv_name:
            raise VolumeError(name, "FailedMount", f'PVC {ns}/{claim_name} has non-bound phase ("{phase}") or empty '
                                                   f'pvc.Spec.VolumeName ("{pv_name}")')
        pv = await self._fetch(name, "persistentvolumes", "", pv_name)
        if pv is None:
            raise VolumeError(name, "FailedMount",
                              f'failed to fetch PV {pv_name} from API server: persistentvolumes "{pv_name}" not found')
        spec = pv.get("spec") or {}
        claim_ref = spec.get("claimRef")
        if not claim_ref:
            raise VolumeError(name, "FailedMount", f'found PV object "{pv_name}" but it has a nil pv.Spec.ClaimRef '
                                                   "indicating it is not yet bound to the claim")
        claim_uid = meta.get("uid") or ""
        if claim_ref.get("uid") and claim_uid and claim_ref["uid"] != claim_uid:
            raise VolumeError(name, "FailedMount", f'found PV object "{pv_name}" but its pv.Spec.ClaimRef.UID '
                                                   f'("{claim_ref["uid"]}") does not point to claim.UID ("{claim_uid}")')
        if (spec.get("volumeMode") or "Filesystem") != "Filesystem":
            raise VolumeError(name, "FailedMount", f'Volume "{name}" has volumeMode "{spec["volumeMode"]}", but is '
                                                   f'specified in volumeMounts for pod "{ns}"/"{ctx.name}"')
        if not await self._node_matches(spec.get("nodeAffinity")):
            raise VolumeError(name, "FailedMount", f'MountVolume.NodeAffinity check failed for volume "{pv_name}" : '
                                                   "no matching NodeSelectorTerms")
        kind = "ephemeral" if ephemeral else "persistentVolumeClaim"
        if spec.get("hostPath") is not None:
            host = spec["hostPath"]
            provisioner = ((pv.get("metadata") or {}).get("annotations") or {}).get("pv.kubernetes.io/provisioned-by")
            try:
                if provisioner in _LOCAL_PATH_PROVISIONERS:
                    # As the local-path provisioner's own helper does (mkdir -m 0777): any
                    # container user may write its new volume.
                    await asyncio.to_thread(_make_open_dir, host.get("path") or "")
                await asyncio.to_thread(check_host_path, host.get("path") or "", host.get("type") or "")
            except _SetUpError as exc:
                raise VolumeError(name, "FailedMount",
                                  f'MountVolume.SetUp failed for volume "{pv_name}" : {exc}') from None
            # The kubelet's hostPath plugin manages no ownership: fsGroup does not apply.
            return VolumeInfo(name, kind, host.get("path") or "", read_only=read_only)
        if spec.get("local") is not None:
            path = spec["local"].get("path") or ""
            if not os.path.isabs(path) or not await asyncio.to_thread(os.path.exists, path):
                raise VolumeError(name, "FailedMount", f'MountVolume.NewMounter initialization failed for volume '
                                                       f'"{pv_name}" : path "{path}" does not exist')
            if not read_only:
                policy = ((ctx.pod.get("spec") or {}).get("securityContext") or {}).get("fsGroupChangePolicy")
                key = (ctx.uid, name)
                if key not in self._owned:
                    await asyncio.to_thread(self._own, ctx, name, Path(path), False, policy)
                    self._owned.add(key)
            return VolumeInfo(name, kind, path, read_only=read_only)
        sources = [k for k, v in spec.items() if v is not None and k not in _PV_NON_SOURCE_FIELDS]
        what = sources[0] if sources else ""
        plugin = f'volume plugin "{_PLUGINS.get(what, what)}"' if what else "a volume without a source"
        if what == "csi":
            plugin += f' (driver "{(spec.get("csi") or {}).get("driver") or ""}")'
        raise VolumeError(name, "FailedMount", f'MountVolume.SetUp failed for volume "{pv_name}" : {plugin} is not '
                                               "supported on this node (PersistentVolumes here: hostPath, local)")

    async def _node_matches(self, affinity: dict[str, Any] | None) -> bool:
        if not affinity or not affinity.get("required"):
            return True
        terms = affinity["required"].get("nodeSelectorTerms") or []
        node = None
        with contextlib.suppress(VolumeError):
            node = await self._fetch("", "nodes", "", self.node_name)
        labels = dict(((node or {}).get("metadata") or {}).get("labels") or {})
        labels.setdefault("kubernetes.io/hostname", self.node_name)
        return any(_term_matches(term, labels, self.node_name) for term in terms)

def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str], node_name: str) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    for expr in expressions:
        op = _NODE_SELECTOR_OPERATORS.get(expr.get("operator") or "")
        if op is None:
            return False
        try:
            requirement = Requirement.new(expr.get("key") or "", op, expr.get("values") or [])
        except SelectorError:
            return False
        if not requirement.matches(labels):
            return False
    for f in fields:
        if f.get("key") != "metadata.name":
            return False
        inside = node_name in (f.get("values") or [])
        if f.get("operator") == "In" and not inside:
            return False
        if f.get("operator") == "NotIn" and inside:
            return False
        if f.get("operator") not in ("In", "NotIn"):
            return False
    return True


_LOCAL_PATH_PROVISIONERS = ("gpufleet.io/local-path", "rancher.io/local-path")


def _make_open_dir(path: str) -> None:
    if not path or not os.path.isabs(path) or os.path.lexists(path):
        return
    try:
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o777)
    except OSError as exc:
        raise _SetUpError(str(exc)) from None
