"""What the volume manager's parts share: the plugin directory names, the errors with the
kubelet's wording, what a pod's volumes are once set up, and the pod as read once per setup."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpufleet.api.selectors import Operator

log = logging.getLogger(__name__)

# (kind, namespace, name) -> the object as a dict, or None when it does not exist.
ObjectGetter = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]

DEFAULT_MODE = 0o644
# In a ConfigMap, Secret, downward API or projected volume: what subPath mounts pinned.
SUBPATHS_DIR = "..subpaths"
SHM_PATH = "/dev/shm"

EMPTY_DIR = "kubernetes.io~empty-dir"
CONFIG_MAP = "kubernetes.io~configmap"
SECRET = "kubernetes.io~secret"
DOWNWARD_API = "kubernetes.io~downward-api"
PROJECTED = "kubernetes.io~projected"
HOST_PATH = "kubernetes.io~host-path"
LOCAL_VOLUME = "kubernetes.io~local-volume"

# SetVolumeOwnership's masks.
_RW_MASK, _RO_MASK, _EXEC_MASK = 0o660, 0o440, 0o110

# Volume sources of the pod API this node cannot serve, by the kubelet plugin they need.
_PLUGINS = {
    "awsElasticBlockStore": "kubernetes.io/aws-ebs", "azureDisk": "kubernetes.io/azure-disk",
    "azureFile": "kubernetes.io/azure-file", "cephfs": "kubernetes.io/cephfs", "cinder": "kubernetes.io/cinder",
    "csi": "kubernetes.io/csi", "fc": "kubernetes.io/fc", "flexVolume": "kubernetes.io/flexvolume",
    "flocker": "kubernetes.io/flocker", "gcePersistentDisk": "kubernetes.io/gce-pd",
    "gitRepo": "kubernetes.io/git-repo", "glusterfs": "kubernetes.io/glusterfs", "image": "kubernetes.io/image",
    "iscsi": "kubernetes.io/iscsi", "nfs": "kubernetes.io/nfs", "photonPersistentDisk": "kubernetes.io/photon-pd",
    "portworxVolume": "kubernetes.io/portworx-volume", "quobyte": "kubernetes.io/quobyte",
    "rbd": "kubernetes.io/rbd", "scaleIO": "kubernetes.io/scaleio", "storageos": "kubernetes.io/storageos",
    "vsphereVolume": "kubernetes.io/vsphere-volume",
}

# PersistentVolumeSpec fields that are not its volume source.
_PV_NON_SOURCE_FIELDS = frozenset({
    "accessModes", "capacity", "claimRef", "mountOptions", "nodeAffinity", "persistentVolumeReclaimPolicy",
    "storageClassName", "volumeMode", "volumeAttributesClassName",
})

_NODE_SELECTOR_OPERATORS = {
    "In": Operator.IN, "NotIn": Operator.NOT_IN, "Exists": Operator.EXISTS,
    "DoesNotExist": Operator.DOES_NOT_EXIST, "Gt": Operator.GREATER_THAN, "Lt": Operator.LESS_THAN,
}


class VolumeError(Exception):
    """A volume could not be made ready. The pod's containers wait (ContainerCreating) and the
    agent records an Event with ``reason`` and ``message``; the next setup() tries again.
    From mounts() the reason is CreateContainerConfigError: the kubelet reports those as the
    container's waiting reason, with a "Failed" event reading "Error: <message>"."""

    def __init__(self, volume: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.volume = volume
        self.reason = reason
        self.message = message
        # Every volume that failed in the same setup() (this one first).
        self.errors: list[VolumeError] = [self]


def _setup_failed(volume: str, err: str) -> VolumeError:
    return VolumeError(volume, "FailedMount", f'MountVolume.SetUp failed for volume "{volume}" : {err}')


@dataclass(frozen=True)
class VolumeInfo:
    name: str
    # The pod API's source field: emptyDir, configMap, secret, downwardAPI, projected,
    # hostPath, persistentVolumeClaim, ephemeral.
    kind: str
    # The volume's root on the node, what a volumeMount without subPath shows.
    path: str
    # Mounted read-only in every container (ConfigMaps, Secrets, ...; a claim's readOnly).
    read_only: bool = False
    # Written by the atomic writer: a subPath of it is a snapshot, not updated.
    atomic: bool = False
    tmpfs: bool = False
    medium: str = ""
    size_limit: int | None = None


@dataclass
class PodVolumes:
    pod_uid: str
    volumes: dict[str, VolumeInfo] = field(default_factory=dict)
    # What was not done as the pod asked, for a Warning event (stable across calls).
    notices: list[str] = field(default_factory=list)
    # fsGroup was set but the agent may not chown: ownership was left as it was.
    fs_group_skipped: bool = False

    def path(self, name: str) -> str:
        return self.volumes[name].path


class EmptyDirUsage(NamedTuple):
    volume: str
    used: int
    limit: int
    # The sizeLimit as the pod spec writes it (the API server keeps quantities canonical).
    limit_text: str

    @property
    def message(self) -> str:
        """The kubelet eviction manager's message. Its trailing space is the kubelet's too:
        it joins several of these into one status message."""
        return f'Usage of EmptyDir volume "{self.volume}" exceeds the limit "{self.limit_text}". '


class _SetUpError(Exception):
    """A plugin's own error text, wrapped into the kubelet's message by the caller."""

def _config_error(volume: str, message: str) -> VolumeError:
    return VolumeError(volume, "CreateContainerConfigError", message)

# -- the pod, read once per setup ------------------------------------------------------------


class _PodContext:
    def __init__(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        self.uid: str = meta.get("uid") or ""
        self.name: str = meta.get("name") or ""
        self.namespace: str = meta.get("namespace") or "default"
        self.service_account: str = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        fs_group = (spec.get("securityContext") or {}).get("fsGroup")
        self.fs_group: int | None = int(fs_group) if fs_group is not None else None

    def container(self, name: str) -> dict[str, Any] | None:
        spec = self.pod.get("spec") or {}
        return next((c for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
                     if c.get("name") == name), None)
