"""What the agent runs for the API server's pods/exec, pods/attach and pods/portforward
(served by streamserver.py): a process in a running container, an attach to a container's
main process, and where a pod's port is reached from the node.

- exec: the runtime's ``exec_stream`` (podman: ``podman exec -i [-t]``; process runtime:
  nsenter into the container's sandbox, as its user, in its cgroup). The simulated runtime
  runs no processes and refuses.
- attach: the runtime's ``attach_stream`` (podman: ``podman attach``); a runtime without one
  (the process runtime, whose programs have no stdin to share) streams the container's
  output from now on, read from its log.
- port-forward: podman pods have an address of their own (the pod IP); the process runtime's
  share the node's network, where a declared container port may have been moved to the host
  port the agent allocated (the container is told it through its environment).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from gpufleet.agent.runtime.base import RuntimeError_
from gpufleet.agent.streamserver import Process, StreamRefused


class StreamsMixin:
    """NodeAgent's stream endpoints (see agent.py)."""

    def _running(self, namespace: str, pod: str, container: str):  # noqa: ANN202
        worker = self.worker_for(namespace, pod)  # type: ignore[attr-defined]
        if worker is None:
            raise StreamRefused(f'pod "{pod}" not found on this node', "NotFound", 404)
        rec = worker.record_for(container)
        if rec is None:
            raise StreamRefused(f"container {container} is not valid for pod {pod}", "BadRequest", 400)
        if not rec.running or rec.handle is None:
            raise StreamRefused(f'container "{container}" in pod "{pod}" is not running', "BadRequest", 400)
        return worker, rec

    async def open_exec(self, namespace: str, pod: str, container: str, command: list[str],
                        tty: bool) -> Process:
        _, rec = self._running(namespace, pod, container)
        runtime = self.runtime  # type: ignore[attr-defined]
        exec_stream = getattr(runtime, "exec_stream", None)
        if exec_stream is None:
            raise StreamRefused(f"the {runtime.name} runtime runs no processes: exec is not supported on this node")
        if not command:
            raise StreamRefused("you must specify at least 1 command", "BadRequest", 400)
        try:
            return Process(await exec_stream(rec.handle, command, tty=tty))
        except RuntimeError_ as exc:
            raise StreamRefused(f"error executing command in container: {exc}") from None
        except OSError as exc:
            raise StreamRefused(f"error executing command in container: {exc.strerror or exc}") from None

    async def open_attach(self, namespace: str, pod: str, container: str, tty: bool, stdin: bool) -> Process:
        _, rec = self._running(namespace, pod, container)
        runtime = self.runtime  # type: ignore[attr-defined]
        attach_stream = getattr(runtime, "attach_stream", None)
        if attach_stream is not None:
            try:
                return Process(await attach_stream(rec.handle, tty=tty, stdin=stdin), report_exit=False)
            except (RuntimeError_, OSError) as exc:
                raise StreamRefused(f"error attaching to container: {exc}") from None
        if runtime.name == "simulated":
            raise StreamRefused("the simulated runtime runs no processes: attach is not supported on this node")
        answer = await self.container_logs(namespace, pod, container,  # type: ignore[attr-defined]
                                           {"follow": "true", "sinceSeconds": "0"})
        if answer.code >= 400:
            raise StreamRefused(answer.message, answer.reason, answer.code)
        return Process(output=answer.stream or _once(answer.body))

    async def pod_address(self, namespace: str, pod: str, port: int) -> tuple[str, int]:
        worker = self.worker_for(namespace, pod)  # type: ignore[attr-defined]
        if worker is None:
            raise StreamRefused(f'pod "{pod}" not found on this node', "NotFound", 404)
        if self.runtime.name == "simulated":  # type: ignore[attr-defined]
            raise StreamRefused("the simulated runtime runs no processes: nothing listens on its pods' ports")
        host = worker.pod_ip
        if self.runtime.name != "podman":  # type: ignore[attr-defined]
            # The node's network: a declared port is where the agent put it.
            from gpufleet.agent.resources import port_requests

            for req in port_requests(worker.pod):
                if req.container_port == port and worker.ports and req.key in worker.ports:
                    return host, int(worker.ports[req.key])
        return host, port


async def _once(body: bytes) -> AsyncIterator[bytes]:
    if body:
        yield body
