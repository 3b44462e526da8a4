"""Which failed pods count as failed by their hardware (``api.gpu.pod_failed_by_hardware``):
the shape the node agent writes for a GPU that failed, and Kubernetes' own node-fault reasons."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.api.gpu import GPU_UNHEALTHY_REASON, hardware_disruption, pod_failed_by_hardware
from gpufleet.api.k8s import Pod


def failed(reason: str, status: str = "True", phase: str = "Failed") -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": phase, "reason": reason, "message": "GPU 2 (GPU-2a) on node n1: XID 79",
                       "conditions": [{"type": "DisruptionTarget", "status": status, "reason": reason,
                                       "message": "GPU 2 (GPU-2a) on node n1: XID 79"}]}}


@pytest.mark.parametrize("reason", [GPU_UNHEALTHY_REASON, "DeletionByTaintManager", "DeletionByPodGC"])
def test_a_failed_pod_disrupted_by_its_hardware_or_node(reason: str) -> None:
    assert pod_failed_by_hardware(failed(reason))
    assert pod_failed_by_hardware(Pod.from_dict(failed(reason)))
    assert hardware_disruption(Pod.from_dict(failed(reason))).message.endswith("XID 79")


@pytest.mark.parametrize("reason", ["PreemptionByScheduler", "EvictionByEvictionAPI", "TerminationByKubelet"])
def test_voluntary_disruptions_and_node_pressure_are_not_hardware(reason: str) -> None:
    assert not pod_failed_by_hardware(failed(reason))
    assert not pod_failed_by_hardware(Pod.from_dict(failed(reason)))


def test_only_a_failed_pod_with_the_condition_true_counts() -> None:
    assert not pod_failed_by_hardware(failed(GPU_UNHEALTHY_REASON, status="False"))
    assert not pod_failed_by_hardware(failed(GPU_UNHEALTHY_REASON, phase="Running"))
    plain = failed(GPU_UNHEALTHY_REASON)
    plain["status"].pop("conditions")
    assert not pod_failed_by_hardware(plain)
    assert not pod_failed_by_hardware({"metadata": {"name": "p"}})
