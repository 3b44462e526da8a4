"""The validation pod a fenced GPU must pass before it returns to service.

The agent makes it itself, as the kubelet makes a static pod's mirror: a Pod in kube-system
bound to its own node (``spec.nodeName``), owned by its Node, annotated
``kubernetes.io/config.mirror`` (NodeRestriction lets a node create only such pods, and only
for itself) and ``gpufleet.io/gpu-validation: <index>``. It requests no ``nvidia.com/gpu``:
the fenced GPU is outside the node's allocatable, so no scheduler accounting is touched, and
the agent hands it exactly that GPU (the environment and device nodes a container with it
gets) because it made this pod for it, in this run, with this attempt's token. A pod that
only looks like one (made by anyone else, or by the agent's previous run) is never given a
GPU; the agent deletes the leftovers of its previous runs.

What runs is configurable (``--gpu-validation-image``, ``--gpu-validation-command``); the
defaults: on declared GPUs, a shell check that the pod was given exactly that GPU and that the
inventory reports it healthy (GPUFLEET_GPU_HEALTH is what the inventory says right now); on
real GPUs, a short CUDA check (gpucheck.py) with the process runtime, ``nvidia-smi`` on the
device in a CUDA base image with podman. ``activeDeadlineSeconds`` is the validation's
timeout, so a check that hangs fails as DeadlineExceeded. A pod that passed is deleted; one
that failed stays until the next attempt, so ``kubectl logs -n kube-system`` shows why.
"""

from __future__ import annotations

import math
import sys
from typing import Any

NAMESPACE = "kube-system"
VALIDATION_ANNOTATION = "gpufleet.io/gpu-validation"
TOKEN_ANNOTATION = "gpufleet.io/gpu-validation-token"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
CONTAINER = "check"

DECLARED_IMAGE = "localhost/gpufleet/busybox:1"
HOST_IMAGE = "host"
CUDA_IMAGE = "nvcr.io/nvidia/cuda:12.6.3-base-ubuntu24.04"

_DECLARED_CHECK = (
    'if [ "$NVIDIA_VISIBLE_DEVICES" != "$GPUFLEET_GPU_UUID" ]; then '
    'echo "given GPU(s) $NVIDIA_VISIBLE_DEVICES, not $GPUFLEET_GPU_UUID"; exit 1; fi; '
    'if [ "$GPUFLEET_GPU_HEALTH" != Healthy ]; then '
    'echo "the inventory reports GPU $GPUFLEET_GPU_INDEX $GPUFLEET_GPU_HEALTH"; exit 1; fi; '
    'echo "GPU $GPUFLEET_GPU_INDEX ($GPUFLEET_GPU_UUID): given to this pod alone; the inventory reports it healthy"'
)
_SMI_CHECK = ('nvidia-smi -i "$GPUFLEET_GPU_UUID" '
              '--query-gpu=uuid,name,ecc.errors.uncorrected.volatile.total --format=csv,noheader')


def pod_name(node: str, index: int) -> str:
    return f"gpu-validation-{node}-{index}"


def default_check(devices: str, runtime: str) -> tuple[str, list[str]]:
    """The image and command when none are configured. The process runtime runs the node's
    own programs (the image "host"), where the agent's Python has gpucheck."""
    podman = runtime == "podman"
    if devices == "declared":
        return DECLARED_IMAGE if podman else HOST_IMAGE, ["sh", "-c", _DECLARED_CHECK]
    if podman:
        return CUDA_IMAGE, ["sh", "-c", _SMI_CHECK]
    return HOST_IMAGE, [sys.executable, "-m", "gpufleet.agent.gpucheck"]


def validation_pod(*, node: str, node_uid: str, index: int, uuid: str, health: str, image: str,
                   command: list[str], timeout: float, token: str) -> dict[str, Any]:
    env = {"GPUFLEET_GPU_INDEX": str(index), "GPUFLEET_GPU_UUID": uuid, "GPUFLEET_GPU_HEALTH": health}
    container: dict[str, Any] = {
        "name": CONTAINER, "command": list(command),
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    container["image"] = image or HOST_IMAGE
    container["imagePullPolicy"] = "IfNotPresent"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": pod_name(node, index), "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "gpu-validation", "app.kubernetes.io/managed-by": "gpufleet-agent"},
            "annotations": {MIRROR_ANNOTATION: token, VALIDATION_ANNOTATION: str(index), TOKEN_ANNOTATION: token},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                 "controller": True}],
        },
        "spec": {
            "nodeName": node, "restartPolicy": "Never", "containers": [container],
            "activeDeadlineSeconds": max(1, math.ceil(timeout)), "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False, "enableServiceLinks": False,
            # Whatever the node is tainted with (one without a healthy GPU is), this runs.
            "tolerations": [{"operator": "Exists"}],
        },
    }


def is_validation_pod(pod: dict[str, Any]) -> bool:
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    return VALIDATION_ANNOTATION in ann and MIRROR_ANNOTATION in ann


def result(pod: dict[str, Any]) -> tuple[bool, str]:
    """Passed or not, and in which words, from a finished validation pod's status."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    term = next(((cs.get("state") or {}).get("terminated") or {} for cs in status.get("containerStatuses") or []
                 if cs.get("name") == CONTAINER), {})
    if phase == "Succeeded":
        return True, "the validation pod succeeded"
    if status.get("reason") == "DeadlineExceeded":
        return False, f"the validation pod did not finish within its {pod['spec'].get('activeDeadlineSeconds')}s"
    if term.get("exitCode") is not None:
        return False, f"exit code {term['exitCode']}" + (f" ({term['reason']})" if term.get("reason") else "")
    return False, status.get("message") or status.get("reason") or f"the validation pod {phase}"
