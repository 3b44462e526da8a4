"""Request statistics per Service and per pod: counts, in-flight requests, latency, and a
sliding-window request rate. Rendered as Prometheus text and as custom.metrics.k8s.io
MetricValues (what the HPA controller reads for `requests_per_second` and `concurrency`).

All times come from the injected clock (monotonic for rates and latencies).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufleet.utils.clock import Clock

# Seconds; the last bucket is +Inf.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
METRIC_NAMES = ("requests_per_second", "concurrency")


@dataclass
class Counters:
    """What is counted for one Service or one pod."""

    first_seen: float
    requests: int = 0
    errors: int = 0  # answered 5xx by the gateway or the pod, or failed in transit
    in_flight: int = 0
    latency_sum: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    # Arrival times (monotonic) within the rate window.
    arrivals: deque[float] = field(default_factory=deque)
    # Time-weighted in-flight over the rate window: (since, level) steps.
    last_change: float = 0.0
    busy_area: deque[tuple[float, float]] = field(default_factory=deque)

    def observe_latency(self, seconds: float) -> None:
        self.latency_sum += seconds
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1
                return
        self.buckets[-1] += 1


class RequestStats:
    def __init__(self, clock: Clock, window: float = 10.0) -> None:
        self.clock = clock
        self.window = window
        self.services: dict[str, Counters] = {}
        self.pods: dict[str, Counters] = {}
        # pod key -> the Service key whose traffic it served last (for labels).
        self.pod_service: dict[str, str] = {}
        # Requests held while a Service had no Ready endpoint.
        self.held: dict[str, int] = {}

    def _get(self, table: dict[str, Counters], key: str) -> Counters:
        c = table.get(key)
        if c is None:
            now = self.clock.monotonic()
            c = table[key] = Counters(first_seen=now, last_change=now)
        return c

    def _trim(self, c: Counters, now: float) -> None:
        cutoff = now - self.window
        while c.arrivals and c.arrivals[0] < cutoff:
            c.arrivals.popleft()
        while c.busy_area and c.busy_area[0][0] < cutoff:
            c.busy_area.popleft()

    def _level_changed(self, c: Counters, now: float, delta: int) -> None:
        c.busy_area.append((now, (now - c.last_change) * c.in_flight))
        c.last_change = now
        c.in_flight += delta
        self._trim(c, now)

    def started(self, service: str, pod: str) -> float:
        """A request to ``service`` was sent to ``pod``; returns its start time."""
        now = self.clock.monotonic()
        self.pod_service[pod] = service
        for c in (self._get(self.services, service), self._get(self.pods, pod)):
            c.requests += 1
            c.arrivals.append(now)
            self._level_changed(c, now, +1)
        return now

    def finished(self, service: str, pod: str, start: float, error: bool) -> None:
        now = self.clock.monotonic()
        # A pod that left the endpoints meanwhile was forgotten; its last answers are not
        # counted again for it.
        pod_counters = self.pods.get(pod)
        for c in (self._get(self.services, service), *((pod_counters,) if pod_counters else ())):
            self._level_changed(c, now, -1)
            c.observe_latency(now - start)
            if error:
                c.errors += 1

    def failed_without_pod(self, service: str) -> None:
        c = self._get(self.services, service)
        c.requests += 1
        c.errors += 1

    def forget_pod(self, pod: str) -> None:
        self.pods.pop(pod, None)
        self.pod_service.pop(pod, None)

    def rate(self, c: Counters) -> float:
        """Requests per second over the window (or over the time since first seen, if shorter)."""
        now = self.clock.monotonic()
        self._trim(c, now)
        span = min(self.window, max(now - c.first_seen, 1.0))
        return len(c.arrivals) / span

    def concurrency(self, c: Counters) -> float:
        """Average in-flight requests over the window, time-weighted."""
        now = self.clock.monotonic()
        self._trim(c, now)
        span = min(self.window, now - c.first_seen)
        if span <= 0:
            return float(c.in_flight)
        area = sum(a for _, a in c.busy_area) + (now - c.last_change) * c.in_flight
        return area / span

    def pod_metric(self, pod: str, metric: str) -> float | None:
        c = self.pods.get(pod)
        if c is None:
            return None
        if metric == "requests_per_second":
            return self.rate(c)
        if metric == "concurrency":
            return self.concurrency(c)
        return None

    # -- renderings ----------------------------------------------------------------------

    def prometheus(self) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, help_: str) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")

        def rows(prefix: str, table: Iterable[tuple[dict[str, str], Counters]]) -> None:
            table = list(table)
            family(f"{prefix}_requests_total", "counter", "Requests forwarded.")
            for labels, c in table:
                lines.append(f"{prefix}_requests_total{_labels(labels)} {c.requests}")
            family(f"{prefix}_request_errors_total", "counter", "Requests that failed (5xx or transport).")
            for labels, c in table:
                lines.append(f"{prefix}_request_errors_total{_labels(labels)} {c.errors}")
            family(f"{prefix}_requests_in_flight", "gauge", "Requests being served now.")
            for labels, c in table:
                lines.append(f"{prefix}_requests_in_flight{_labels(labels)} {c.in_flight}")
            family(f"{prefix}_requests_per_second", "gauge", f"Request rate over the last {self.window:g}s.")
            for labels, c in table:
                lines.append(f"{prefix}_requests_per_second{_labels(labels)} {self.rate(c):.6g}")
            family(f"{prefix}_request_duration_seconds", "histogram", "Time from forwarding to the last byte.")
            for labels, c in table:
                total = 0
                for bound, n in zip((*LATENCY_BUCKETS, math.inf), c.buckets, strict=True):
                    total += n
                    le = "+Inf" if bound == math.inf else f"{bound:g}"
                    lines.append(f"{prefix}_request_duration_seconds_bucket{_labels({**labels, 'le': le})} {total}")
                lines.append(f"{prefix}_request_duration_seconds_sum{_labels(labels)} {c.latency_sum:.6f}")
                lines.append(f"{prefix}_request_duration_seconds_count{_labels(labels)} {total}")

        rows("gpufleet_gateway_service", ((_svc_labels(k), c) for k, c in sorted(self.services.items())))
        rows("gpufleet_gateway_pod", (({**_svc_labels(self.pod_service.get(k, "/")), "pod": k.partition("/")[2]}, c)
                                      for k, c in sorted(self.pods.items())))
        family("gpufleet_gateway_requests_held", "gauge", "Requests waiting for a Ready endpoint.")
        for k, n in sorted(self.held.items()):
            lines.append(f"gpufleet_gateway_requests_held{_labels(_svc_labels(k))} {n}")
        return "\n".join(lines) + "\n"


def _svc_labels(key: str) -> dict[str, str]:
    ns, _, name = key.partition("/")
    return {"namespace": ns, "service": name}


def _labels(labels: dict[str, str]) -> str:
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return "{" + body + "}"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def milli_quantity(value: float) -> str:
    """A Kubernetes quantity for ``value``, in milli-units when it is not a whole number."""
    milli = round(value * 1000)
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"
