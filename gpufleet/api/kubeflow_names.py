"""The names of Kubeflow's PyTorchJob API that a node agent needs, without its models: the
group and kind, and the rendezvous port a leader pod asks its node for. ``gpufleet.api.kubeflow``
(the typed models, which load the core API's) re-exports every one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUP = "kubeflow.org"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PyTorchJob"

# The container the operator configures (env, rendezvous port) when a pod has several.
DEFAULT_CONTAINER_NAME = "pytorch"
DEFAULT_PORT_NAME = "pytorchjob-port"
DEFAULT_PORT = 23456
# On the leader pod, set by the controller: the node port its DEFAULT_PORT_NAME port must
# have (the members reach the leader at its node's address, as there is no pod network).
# The node agent honours it only on pods a PyTorchJob controls, and only the control plane
# (or whoever may bind pods) may create a pod carrying it; a hostPort would do the same but
# is refused by Pod Security's baseline level.
RENDEZVOUS_PORT_ANNOTATION = "gpufleet.io/rendezvous-port"


def rendezvous_port(pod: Any) -> int | None:
    """The leader port a PyTorchJob's pod (a JSON dict) asks its node for, if it is one."""
    meta = (pod.get("metadata") or {}) if isinstance(pod, Mapping) else {}
    value = (meta.get("annotations") or {}).get(RENDEZVOUS_PORT_ANNOTATION)
    controlled = any(isinstance(o, Mapping) and o.get("controller") is True and o.get("kind") == KIND
                     and str(o.get("apiVersion") or "").startswith(f"{GROUP}/")
                     for o in meta.get("ownerReferences") or [])
    if not controlled or not isinstance(value, str) or not value.isdigit() or not 1 <= int(value) <= 65535:
        return None
    return int(value)
