"""The node agent's volume manager: a pod's volumes made real on the node, as the kubelet's
volume manager and in-tree volume plugins make them.

manager.py holds VolumeManager (set up, mounts, teardown); its plugins are emptydir.py,
payloads.py (ConfigMap, Secret, downward API, projected), claims.py (persistentVolumeClaim,
ephemeral) and paths.py (hostPath, fsGroup ownership, subPath); common.py what they share.
"""

from gpufleet.agent.volumes.common import (
    CONFIG_MAP,
    DEFAULT_MODE,
    DOWNWARD_API,
    EMPTY_DIR,
    HOST_PATH,
    LOCAL_VOLUME,
    PROJECTED,
    SECRET,
    SHM_PATH,
    SUBPATHS_DIR,
    EmptyDirUsage,
    ObjectGetter,
    PodVolumes,
    VolumeError,
    VolumeInfo,
)
from gpufleet.agent.volumes.emptydir import disk_usage, pod_memory_limit
from gpufleet.agent.volumes.manager import VolumeManager
from gpufleet.agent.volumes.paths import check_host_path, safe_make_dir, set_volume_ownership
from gpufleet.agent.volumes.payloads import config_map_payload, secret_payload

__all__ = [
    "CONFIG_MAP", "DEFAULT_MODE", "DOWNWARD_API", "EMPTY_DIR", "HOST_PATH", "LOCAL_VOLUME", "PROJECTED",
    "SECRET", "SHM_PATH", "SUBPATHS_DIR", "EmptyDirUsage", "ObjectGetter", "PodVolumes",
    "VolumeError", "VolumeInfo", "VolumeManager", "check_host_path", "config_map_payload", "disk_usage",
    "pod_memory_limit", "safe_make_dir", "secret_payload", "set_volume_ownership",
]
