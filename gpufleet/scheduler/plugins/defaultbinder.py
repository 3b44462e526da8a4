"""DefaultBinder: binds through the pods/{name}/binding subresource, as kube-scheduler does.

The Binding carries the pod's UID so a pod deleted and re-created under the same name
while the binding was in flight is not bound by mistake. It also carries the GPU indices
annotation: a real Kubernetes API server copies a Binding's annotations onto the pod.

Bindings started together (a gang's members, whose binding cycles all start in the cycle
that placed them) go to the API as one request: the Bindings of one namespace that reach
the binder before the event loop's next turn are sent as a List to
``POST /api/v1/namespaces/{ns}/bindings``, which stores them in one transaction. When that
request fails (one member deleted or bound meanwhile, an API server without the bulk path),
each is sent on its own through pods/{name}/binding, so every pod gets its own answer, as
if the batch had never been.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from gpufleet.api.gpu import GPU_INDICES_ANNOTATION, format_gpu_indices
from gpufleet.client.errors import ApiError
from gpufleet.scheduler.framework import GPU_INDICES_KEY, OK, Code, CycleState, FrameworkHandle, Status
from gpufleet.scheduler.snapshot import PodInfo

log = logging.getLogger(__name__)

# A batch larger than this is sent in parts (a request body well within the API's limits).
MAX_BATCH = 500


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


class BindingBatcher:
    """Collects the Bindings asked for within one turn of the event loop and sends each
    namespace's as one request (see the module's docstring)."""

    def __init__(self, client: Any, max_batch: int = MAX_BATCH) -> None:
        self.client = client
        self.max_batch = max_batch
        self.bulk = True  # False once the API server has answered that it has no bulk path
        self.stats = {"requests": 0, "bulk_requests": 0, "fallbacks": 0}
        self._pending: dict[str, list[tuple[dict[str, Any], asyncio.Future[None]]]] = {}
        self._flushing = False
        self._sending: set[asyncio.Task[None]] = set()

    async def bind(self, namespace: str, body: dict[str, Any]) -> None:
        """Binds one pod; raises what its own pods/{name}/binding would have raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.setdefault(namespace, []).append((body, future))
        if not self._flushing:
            self._flushing = True
            loop.call_soon(self._flush)
        await future

    def _flush(self) -> None:
        pending, self._pending, self._flushing = self._pending, {}, False
        for namespace, items in pending.items():
            live = [(b, f) for b, f in items if not f.done()]  # a cancelled binding cycle: left out
            for start in range(0, len(live), self.max_batch):
                task = asyncio.get_running_loop().create_task(
                    self._send(namespace, live[start:start + self.max_batch]), name=f"bind:{namespace}")
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)

    async def _send(self, namespace: str, items: list[tuple[dict[str, Any], asyncio.Future[None]]]) -> None:
        if len(items) > 1 and self.bulk:
            body = {"apiVersion": "v1", "kind": "List", "items": [b for b, _ in items]}
            self.stats["requests"] += 1
            self.stats["bulk_requests"] += 1
            try:
                await self.client.raw_request("POST", f"/api/v1/namespaces/{namespace}/bindings", json=body)
            except ApiError as exc:
                if exc.code in (404, 405) and not exc.details.get("name"):
                    self.bulk = False  # an API server without the collection: one by one from now on
                self.stats["fallbacks"] += 1
                log.debug("binding %d pods of %s together: %s; binding them one by one", len(items), namespace, exc)
            except BaseException as exc:
                for _, future in items:
                    _settle(future, exc)
                if not isinstance(exc, Exception):
                    raise
                return
            else:
                for _, future in items:
                    _settle(future, None)
                return
        await asyncio.gather(*(self._send_one(namespace, body, future) for body, future in items))

    async def _send_one(self, namespace: str, body: dict[str, Any], future: asyncio.Future[None]) -> None:
        if future.done():
            return
        rt = self.client.resource_type("pods")
        self.stats["requests"] += 1
        try:
            await self.client.raw_request("POST", rt.path(namespace, body["metadata"]["name"], "binding"), json=body)
        except Exception as exc:
            _settle(future, exc)
        else:
            _settle(future, None)


def _settle(future: asyncio.Future[None], exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    elif isinstance(exc, Exception):
        future.set_exception(exc)
    else:
        future.cancel()  # the send itself was cancelled (the scheduler stopping)


class DefaultBinder:
    name = "DefaultBinder"

    def __init__(self, args: Mapping[str, Any] | None = None, handle: FrameworkHandle | None = None) -> None:
        self.handle = handle or FrameworkHandle()
        self._batcher: BindingBatcher | None = None

    def batcher(self) -> BindingBatcher | None:
        client = self.handle.client
        if client is None:
            return None
        if self._batcher is None or self._batcher.client is not client:
            self._batcher = BindingBatcher(client)
        return self._batcher

    async def bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status:
        batcher = self.batcher()
        if batcher is None:
            return Status(Code.ERROR, ["no API client to bind with"])
        body = binding_body(pod_info, node_name, tuple(state.read(GPU_INDICES_KEY, ())))
        await batcher.bind(pod_info.namespace, body)
        return OK
