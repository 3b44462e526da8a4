"""What the agent serves about its pods over HTTP: container logs (kubectl logs), usage
(the stats summary, metrics and workload metrics), and where a pod's port is reached (the
relay behind pods/proxy and services/proxy, podproxy.py)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from gpufleet.agent import logfiles
from gpufleet.agent import stats as stats_mod
from gpufleet.agent.httpserver import LogAnswer
from gpufleet.agent.podproxy import PodTarget, resolve_port
from gpufleet.utils.clock import parse_rfc3339, rfc3339

log = logging.getLogger(__name__)

class LogsAndStatsMixin:
    """NodeAgent's logs and stats (see agent.py)."""

    # -- the pod relay --------------------------------------------------------------------

    async def pod_target(self, namespace: str, pod: str, port: str) -> PodTarget:
        """Where this node's pod ``namespace/pod`` answers on ``port`` (a container port's
        number or name); a 503 for a pod this node does not run now."""
        worker = self.worker_for(namespace, pod)
        if worker is None or worker.removed or worker.terminal or not any(r.running for r in worker.records):
            return PodTarget(code=503, reason="ServiceUnavailable",
                             message=f'pod "{pod}" in namespace "{namespace}" is not running on node {self.name}')
        number = resolve_port(worker.pod, port, worker.ports if worker.uses_host_network() else None)
        if number is None:
            return PodTarget(code=400, reason="BadRequest", message=f'pod "{pod}" has no container port named "{port}"')
        return PodTarget(host=worker.pod_ip, port=number)

    # -- logs -----------------------------------------------------------------------------

    async def container_logs(self, namespace: str, pod: str, container: str,
                             params: Mapping[str, str]) -> LogAnswer:
        worker = self.worker_for(namespace, pod)
        pod_dir: Path | None = None
        if worker is not None:
            pod_dir = logfiles.pod_log_dir(self.state_dir, namespace, pod, worker.uid)
            names = [r.name for r in worker.records if not r.init]
            all_names = [r.name for r in worker.records]
        else:
            pod_dir = self._newest_pod_dir(namespace, pod)
            if pod_dir is None:
                return LogAnswer(404, "NotFound", f'pods "{pod}" not found')
            names = all_names = sorted(p.name for p in pod_dir.iterdir() if p.is_dir())
        if not container:
            if len(names) != 1:
                return LogAnswer(400, "BadRequest", f"a container name must be specified for pod {pod}, "
                                                    f"choose one of: [{' '.join(names)}]")
            container = names[0]
        if container not in all_names:
            return LogAnswer(400, "BadRequest", f"container {container} is not valid for pod {pod}")
        cdir = pod_dir / container
        found = logfiles.attempts(cdir)
        previous = _truthy(params.get("previous"))
        rec = worker.record_for(container) if worker is not None else None
        if previous:
            if len(found) < 2:
                return LogAnswer(400, "BadRequest",
                                 f'previous terminated container "{container}" in pod "{pod}" not found')
            attempt = found[-2]
        else:
            if not found:
                reason = ((rec.state.get("waiting") or {}).get("reason") if rec is not None else "") or \
                    "ContainerCreating"
                return LogAnswer(400, "BadRequest",
                                 f'container "{container}" in pod "{pod}" is waiting to start: {reason}')
            attempt = found[-1]
        try:
            opts = logfiles.LogOptions(
                tail_lines=int(params["tailLines"]) if params.get("tailLines") else None,
                timestamps=_truthy(params.get("timestamps")),
                limit_bytes=int(params["limitBytes"]) if params.get("limitBytes") else None,
            )
            if params.get("sinceSeconds"):
                opts.since_time = self.clock.now() - float(params["sinceSeconds"])
            elif params.get("sinceTime"):
                opts.since_time = parse_rfc3339(params["sinceTime"])
        except ValueError as exc:
            return LogAnswer(400, "BadRequest", f"invalid log options: {exc}")
        path = cdir / f"{attempt}.log"
        if _truthy(params.get("follow")) and not previous:
            def running() -> bool:
                return (rec is not None and rec.running and rec.handle is not None
                        and _attempt_of(rec) == attempt and worker is not None and not worker.done)

            return LogAnswer(stream=_limited(logfiles.follow_log(path, opts, running), opts.limit_bytes))
        body = logfiles.read_log(path, opts)
        if opts.limit_bytes is not None:
            body = body[: opts.limit_bytes]
        return LogAnswer(body=body)

    def _newest_pod_dir(self, namespace: str, pod: str) -> Path | None:
        base = self.state_dir / "pods"
        prefix = f"{namespace}_{pod}_"
        try:
            dirs = [base / n for n in os.listdir(base) if n.startswith(prefix)]
        except OSError:
            return None
        dirs = [d for d in dirs if d.is_dir()]
        if not dirs:
            return None
        return max(dirs, key=lambda d: d.stat().st_mtime)

    # -- stats ----------------------------------------------------------------------------

    def _invalidate_stats(self) -> None:
        self._stats_cache = None

    async def sample(self, max_age: float = 1.0) -> stats_mod.NodeSample:
        async with self._stats_lock:
            now = self.clock.monotonic()
            if self._stats_cache is not None and now - self._stats_cache[0] < max_age:
                return self._stats_cache[1]
            result = await self._collect()
            self._stats_cache = (now, result)
            return result

    async def _collect(self) -> stats_mod.NodeSample:
        pods: list[stats_mod.PodSample] = []
        gpu_owner: dict[int, tuple[str, str]] = {}
        for worker in list(self.workers.values()):
            containers = []
            for rec in worker.records:
                if not rec.running or rec.handle is None:
                    continue
                try:
                    st = await self.runtime.stats(rec.handle)
                except Exception:
                    st = None
                containers.append(stats_mod.ContainerSample(
                    name=rec.name,
                    start_time=(rec.state.get("running") or {}).get("startedAt"),
                    cpu_millis=st.cpu_millis if st else 0.0,
                    memory_bytes=st.memory_bytes if st else 0,
                    restart_count=rec.restart_count,
                    gpus=list(rec.gpus),
                ))
                for i in rec.gpus:
                    gpu_owner.setdefault(i, (worker.key, rec.name))
            if containers:
                pods.append(stats_mod.PodSample(worker.name, worker.namespace, worker.uid, worker.start_time,
                                                containers))
        try:
            gpu_stats = await self._call_devices("stats")
        except Exception:
            log.exception("agent %s: reading GPU stats failed", self.name)
            gpu_stats = {}
        gpus = []
        for g in self._gpus:
            st = gpu_stats.get(g.index)
            owner = gpu_owner.get(g.index, ("", ""))
            gpus.append(stats_mod.GPUSample(
                index=g.index, uuid=g.uuid, model=g.model, health=getattr(g, "health", "Healthy"),
                group=getattr(g, "group", ""),
                utilization_pct=st.utilization_pct if st else 0.0,
                memory_used_mib=st.memory_used_mib if st else 0,
                memory_total_mib=st.memory_total_mib if st else getattr(g, "memory_mib", 0),
                temperature_c=st.temperature_c if st else None,
                power_w=st.power_w if st else None,
                pod=owner[0], container=owner[1],
            ))
        if self.runtime.name == "simulated":
            # A simulated node is busy with what its pods pretend to use, not with this machine's load.
            cpu = sum(c.cpu_millis for p in pods for c in p.containers)
            used = sum(c.memory_bytes for p in pods for c in p.containers)
            total = self.settings.memory_bytes if self.settings else used
        else:
            cpu = psutil.cpu_percent(interval=None) / 100.0 * (psutil.cpu_count() or 1) * 1000
            vm = psutil.virtual_memory()
            used, total = vm.total - vm.available, vm.total
        return stats_mod.NodeSample(
            node_name=self.name, time=self.clock.now(), start_time=self._started_at, cpu_millis=cpu,
            memory_used_bytes=used, memory_total_bytes=total, memory_available_bytes=max(total - used, 0),
            pods=pods, gpus=gpus,
        )

    async def stats_summary(self) -> dict[str, Any]:
        return stats_mod.summary(await self.sample())

    async def metrics_text(self) -> bytes:
        return stats_mod.prometheus_text(await self.sample(), [self.gpu_health_collector()])

    async def workload_metrics(self, namespace: str | None = None) -> dict[str, Any]:
        """The pods' own Prometheus metrics (see workloadmetrics), for the HPA's Pods metrics."""
        from gpufleet.agent.workloadmetrics import scrape

        pods = [(w.pod, w.ports, None) if w.uses_host_network() else (w.pod, None, w.pod_ip)
                for w in list(self.workers.values())
                if not w.removed and (namespace is None or w.namespace == namespace)]
        return {"pods": await scrape(self.config.address, pods, rfc3339(self.clock.now()))}


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1", "yes")


def _attempt_of(rec: Any) -> int:
    return rec.restart_count


async def _limited(stream: Any, limit: int | None) -> Any:
    sent = 0
    try:
        async for chunk in stream:
            if limit is not None:
                chunk = chunk[: max(limit - sent, 0)]
            if chunk:
                sent += len(chunk)
                yield chunk
            if limit is not None and sent >= limit:
                return
    finally:
        with contextlib.suppress(Exception):
            await stream.aclose()
