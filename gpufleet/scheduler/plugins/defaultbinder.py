"""DefaultBinder: binds through the pods/{name}/binding subresource, as kube-scheduler does.

The Binding carries the pod's UID so a pod deleted and re-created under the same name
while the binding was in flight is not bound by mistake. It also carries the GPU indices
annotation: a real Kubernetes API server copies a Binding's annotations onto the pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.api.gpu import GPU_INDICES_ANNOTATION, format_gpu_indices
from gpufleet.scheduler.framework import GPU_INDICES_KEY, OK, Code, CycleState, FrameworkHandle, Status
from gpufleet.scheduler.snapshot import PodInfo


def binding_body(pod_info: PodInfo, node_name: str, gpu_indices: tuple[int, ...] = ()) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": pod_info.name, "namespace": pod_info.namespace}
    if pod_info.uid:
        metadata["uid"] = pod_info.uid
    if gpu_indices:
        metadata["annotations"] = {GPU_INDICES_ANNOTATION: format_gpu_indices(gpu_indices)}
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
    }


class DefaultBinder:
    name = "DefaultBinder"

    def __init__(self, args: Mapping[str, Any] | None = None, handle: FrameworkHandle | None = None) -> None:
        self.handle = handle or FrameworkHandle()

    async def bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status:
        client = self.handle.client
        if client is None:
            return Status(Code.ERROR, ["no API client to bind with"])
        rt = client.resource_type("pods")
        body = binding_body(pod_info, node_name, tuple(state.read(GPU_INDICES_KEY, ())))
        await client.raw_request("POST", rt.path(pod_info.namespace, pod_info.name, "binding"), json=body)
        return OK
