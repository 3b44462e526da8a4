"""Metrics a workload exposes on its own Prometheus endpoint, scraped by the agent of its
node and served at ``/stats/workload`` (what the HPA controller reads for Pods metrics
that neither the gateway nor the GPUs provide).

A pod opts in with the usual annotations:
  prometheus.io/scrape: "true"
  prometheus.io/port:   a container port's number or name (default: the pod's first port)
  prometheus.io/path:   default /metrics
The endpoint is reached at the pod's IP on its container port, or for a pod on the node's
network at the node's address on the pod's host port. Each metric is one
number per pod: the value of an unlabelled sample, or the sum over its label sets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.resources import port_requests

log = logging.getLogger(__name__)

SCRAPE = "prometheus.io/scrape"
PORT = "prometheus.io/port"
PATH = "prometheus.io/path"


def scrape_port(pod: Mapping[str, Any], host_ports: Mapping[str, int] | None) -> int | None:
    """The host port a pod's metrics are reached at, or None when it does not ask to be scraped."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    if str(ann.get(SCRAPE, "")).lower() != "true":
        return None
    requests = port_requests(pod)
    wanted = str(ann.get(PORT, "")).strip()
    ports = host_ports or {}
    for req in requests:
        if not wanted or wanted == req.name or wanted == str(req.container_port):
            return ports.get(req.key, req.container_port)
    return int(wanted) if wanted.isdigit() else None


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


async def scrape(address: str, pods: Iterable[tuple[Any, ...]],
                 now: str, request_timeout: float = 2.0) -> list[dict[str, Any]]:
    """One entry per pod that asks to be scraped and answered: name, namespace, time, metrics.
    ``pods``: (pod, host ports) for pods on the node's network, reached at ``address``, or
    (pod, None, pod IP) for pods with an IP of their own, reached on their container port."""
    targets = []
    for entry in pods:
        pod, host_ports = entry[0], entry[1]
        at = entry[2] if len(entry) > 2 and entry[2] else address
        port = scrape_port(pod, host_ports)
        if port is not None:
            path = ((pod.get("metadata") or {}).get("annotations") or {}).get(PATH) or "/metrics"
            targets.append((pod, f"http://{at}:{port}{path if path.startswith('/') else '/' + path}"))

    async def one(client: httpx.AsyncClient, pod: Mapping[str, Any], url: str) -> dict[str, Any] | None:
        meta = pod.get("metadata") or {}
        try:
            resp = await client.get(url)
            resp.raise_for_status()
            metrics = parse_metrics(resp.text)
        except (httpx.HTTPError, ValueError) as exc:
            log.debug("scraping %s/%s at %s: %s", meta.get("namespace"), meta.get("name"), url, exc)
            return None
        return {"name": meta.get("name"), "namespace": meta.get("namespace"), "time": now, "metrics": metrics}

    if not targets:
        return []
    # Every target is plain http://: verify=False spares each scrape loading the system's CA
    # bundle into a new TLS context (tens of ms of CPU and a few MiB that nothing uses).
    async with httpx.AsyncClient(timeout=request_timeout, trust_env=False, verify=False) as client:
        results = await asyncio.gather(*(one(client, pod, url) for pod, url in targets))
    return [r for r in results if r is not None]
