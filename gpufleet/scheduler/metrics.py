"""Prometheus metrics of the scheduler, named after kube-scheduler's where one exists."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)

SCHEDULE_ATTEMPTS = Counter(
    "gpufleet_scheduler_schedule_attempts_total",
    "Scheduling cycles by result: scheduled, unschedulable or error.",
    ["result", "profile"],
)
SCHEDULING_ATTEMPT_DURATION = Histogram(
    "gpufleet_scheduler_scheduling_attempt_duration_seconds",
    "Duration of one scheduling cycle (filter, score, reserve), binding excluded.",
    ["result", "profile"],
    buckets=_LATENCY_BUCKETS,
)
POD_SCHEDULING_DURATION = Histogram(
    "gpufleet_scheduler_pod_scheduling_duration_seconds",
    "From a pod's first scheduling attempt until its binding succeeded.",
    buckets=_LATENCY_BUCKETS + (30.0, 60.0, 300.0),
)
BINDINGS = Counter(
    "gpufleet_scheduler_bindings_total",
    "Binding cycles by result: bound or failed.",
    ["result"],
)
PENDING_PODS = Gauge(
    "gpufleet_scheduler_pending_pods",
    "Pods waiting in the scheduling queue, by sub-queue.",
    ["queue"],
)
