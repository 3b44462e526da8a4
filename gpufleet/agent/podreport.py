"""A pod worker's report: the pod's status from its containers' records, written when it
changed (retried with back-off when the API does not take it)."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

from gpufleet.agent import podstatus, podsync
from gpufleet.agent.podcontext import ContainerRecord, WorkerContext
from gpufleet.api.gpu import GPU_UNHEALTHY_REASON
from gpufleet.api.gpuhealth import disruption_condition
from gpufleet.client import ApiError, NotFound, TransportError
from gpufleet.utils.clock import rfc3339

log = logging.getLogger("gpufleet.agent.podworker")

# A pod condition saying what the node's runtime could not honour (an image on the process
# runtime, a user it cannot switch to...), beside the Event of the same reason.
RUNTIME_LIMITATION = "gpufleet.io/RuntimeLimitation"


class StatusReport:
    """The status part of PodWorker (mixed into it)."""

    ctx: WorkerContext
    pod: dict[str, Any]
    records: list[ContainerRecord]

    # -- status -------------------------------------------------------------------------

    def _pod_with_ips(self) -> dict[str, Any]:
        pod = dict(self.pod)
        status = dict(pod.get("status") or {})
        status.setdefault("hostIP", self.ctx.address)
        status["podIP"] = self.pod_ip
        status["podIPs"] = [{"ip": self.pod_ip}]
        pod["status"] = status
        return pod

    def _container_status(self, rec: ContainerRecord) -> dict[str, Any]:
        image = rec.spec.get("image") or ""
        cs: dict[str, Any] = {
            "name": rec.name,
            "image": image,
            "imageID": (rec.image_id or image) if rec.ran else "",
            "ready": bool(rec.ready and rec.running),
            "restartCount": rec.restart_count,
            "started": bool(rec.started and rec.running),
            "state": copy.deepcopy(rec.state),
            "lastState": copy.deepcopy(rec.last_state),
        }
        if rec.container_id:
            cs["containerID"] = rec.container_id
        if rec.init and not podsync.is_sidecar(rec.spec, rec.init):
            term = rec.state.get("terminated")
            cs["ready"] = bool(term is not None and term.get("exitCode", 0) == 0)
        return cs

    def _statuses(self, init: bool) -> list[dict[str, Any]]:
        return [self._container_status(r) for r in self.records if r.init == init]

    def _phase(self) -> str:
        return podstatus.phase(self.pod.get("spec") or {}, self._statuses(True), self._statuses(False))

    def compute_status(self) -> dict[str, Any]:
        pod_status = self.pod.get("status") or {}
        init_statuses = self._statuses(True)
        statuses = self._statuses(False)
        phase = self.terminal or self._phase()
        existing = list(pod_status.get("conditions") or [])
        if self.last_written is not None:
            mine = {c["type"]: c for c in self.last_written.get("conditions") or []}
            seen = {c.get("type") for c in existing}
            existing = [mine.get(c.get("type"), c) for c in existing]
            existing += [c for t, c in mine.items() if t not in seen]
        spec = self.pod.get("spec") or {}
        conds = podstatus.conditions(phase, init_statuses, statuses, spec.get("readinessGates") or [], existing,
                                     self.ctx.clock.now(), podstatus.sidecar_names(spec))
        if self.unhonoured and not any(c.get("type") == RUNTIME_LIMITATION for c in conds):
            conds.append({"type": RUNTIME_LIMITATION, "status": "True", "reason": "NotHonoured",
                          "message": f"the {self.ctx.runtime.name} runtime: " + "; ".join(self.unhonoured),
                          "lastProbeTime": None, "lastTransitionTime": rfc3339(self.ctx.clock.now())})
        status = {k: v for k, v in pod_status.items() if k not in (
            "phase", "conditions", "hostIP", "hostIPs", "podIP", "podIPs", "startTime",
            "containerStatuses", "initContainerStatuses", "reason", "message")}
        status["phase"] = phase
        status["conditions"] = conds
        status["hostIP"] = self.ctx.address
        status["hostIPs"] = [{"ip": self.ctx.address}]
        status["podIP"] = self.pod_ip
        status["podIPs"] = [{"ip": self.pod_ip}]
        if self.start_time:
            status["startTime"] = self.start_time
        if init_statuses:
            status["initContainerStatuses"] = init_statuses
        status["containerStatuses"] = statuses
        if self.terminal and pod_status.get("phase") == self.terminal:
            # Finished as recorded (by this node, or reported by someone else): its reason stays.
            for k in ("reason", "message"):
                if k in pod_status:
                    status[k] = pod_status[k]
        if self.deadline_exceeded:
            status["reason"] = "DeadlineExceeded"
            status["message"] = "Pod was active on the node longer than the specified deadline"
        gpu_failure = getattr(self, "gpu_failure", None)
        if gpu_failure is not None and self.terminal == "Failed":
            status["reason"] = GPU_UNHEALTHY_REASON
            status["message"] = f"Stopped by the node: {gpu_failure}"
            if not any(c.get("type") == "DisruptionTarget" for c in conds):
                conds.append(disruption_condition(status["message"], rfc3339(self.ctx.clock.now())))
        return status

    async def _write_status(self, final: bool = False) -> float | None:
        """Write the status if it changed; the time to retry when the API did not take it."""
        if self.removed or self.deleted:
            return None
        if self.terminal and self.last_written is None and not self.killed and \
                (self.pod.get("status") or {}).get("phase") == self.terminal:
            # Finished before this agent started: the status on record is the last word.
            return None
        now = self.ctx.clock.monotonic()
        if self.write_retry_at is not None and now < self.write_retry_at and not final:
            return self.write_retry_at
        status = self.compute_status()
        if self.terminal is None and status["phase"] in ("Succeeded", "Failed"):
            # Never report a pod finished while it still holds its GPUs and ports: the
            # scheduler gives them to the next pod the moment it reads the phase.
            self._finish(status["phase"])
            status = self.compute_status()
        current = self.pod.get("status") or {}
        if current.get("phase") in ("Succeeded", "Failed") and status["phase"] not in ("Succeeded", "Failed"):
            # Reported finished while this pass ran: never back to a running phase (the
            # kubelet's "illegal phase transition"); the next pass stops the pod.
            log.info("%s: the pod was reported %s; not writing %s over it", self.key, current["phase"],
                     status["phase"])
            self.wake()
            return None
        if self.last_written is not None and _same_status(status, self.last_written):
            return None
        if self.last_written is None and _same_status(status, current):
            self.last_written = status
            return None
        ops = [{"op": "test", "path": "/metadata/uid", "value": self.uid}]
        if status["phase"] not in ("Succeeded", "Failed") and current.get("phase"):
            # Only over the phase this node last saw: a pod someone else reported finished
            # meanwhile stays finished (the next pass reads it and stops the pod).
            ops.append({"op": "test", "path": "/status/phase", "value": current.get("phase")})
        ops.append({"op": "add", "path": "/status", "value": status})
        try:
            await self.ctx.client.patch("pods", self.name, ops, self.namespace, patch_type="json",
                                        subresource="status", raw=True)
        except NotFound:
            return None
        except ApiError as exc:
            if exc.code == 422 and "/metadata/uid" in (exc.message or ""):
                log.info("%s: the pod was replaced; leaving it to its new worker", self.key)
                self.removed = True
                self.wake()
                return None
            if exc.code == 422 and "/status/phase" in (exc.message or ""):
                return await self._reread()
            return self._write_failed(exc)
        except TransportError as exc:
            return self._write_failed(exc)
        self.last_written = status
        self.write_retry_at = None
        self.write_backoff = 0.5
        return None

    async def _reread(self) -> float | None:
        """The phase on record is not the one this node last saw: read the pod again and
        decide anew (the watch brings it too, maybe later)."""
        try:
            pod = await self.ctx.client.get("pods", self.name, self.namespace, raw=True)
        except NotFound:
            return None
        except (ApiError, TransportError) as exc:
            return self._write_failed(exc)
        if (pod.get("metadata") or {}).get("uid") == self.uid:
            self.pod = pod
        self.wake()
        return None

    def _write_failed(self, exc: Exception) -> float:
        log.log(logging.INFO if isinstance(exc, TransportError) else logging.WARNING,
                "%s: writing status failed (%s); retrying in %.1fs", self.key, exc, self.write_backoff)
        self.write_retry_at = self.ctx.clock.monotonic() + self.write_backoff
        self.write_backoff = min(self.write_backoff * 2, 10.0)
        return self.write_retry_at

def _same_status(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    def strip(s: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if k != "conditions"}

    return strip(a) == strip(b) and podstatus.conditions_equal(a.get("conditions") or [], b.get("conditions") or [])


