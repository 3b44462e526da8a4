"""Request statistics: the sliding-window rate and the time-weighted concurrency the HPA reads."""

from __future__ import annotations

import pytest

from gpufleet.gateway.stats import RequestStats, milli_quantity
from gpufleet.utils.clock import FakeClock


def test_rate_over_the_window_and_over_a_young_pod() -> None:
    clock = FakeClock()
    stats = RequestStats(clock, window=10.0)
    for _ in range(20):  # 20 requests in 2 s: a young pod's rate is over its 2 s of life
        start = stats.started("ns/svc", "ns/pod-a")
        clock.advance(0.1)
        stats.finished("ns/svc", "ns/pod-a", start, error=False)
    assert stats.pod_metric("ns/pod-a", "requests_per_second") == pytest.approx(10.0)
    clock.advance(8)  # 10 s of life, still 20 in the window
    assert stats.pod_metric("ns/pod-a", "requests_per_second") == pytest.approx(2.0)
    clock.advance(3)  # the first ones left the window
    assert stats.pod_metric("ns/pod-a", "requests_per_second") < 2.0
    clock.advance(10)
    assert stats.pod_metric("ns/pod-a", "requests_per_second") == 0.0
    assert stats.pod_metric("ns/unknown", "requests_per_second") is None


def test_concurrency_is_time_weighted_in_flight() -> None:
    clock = FakeClock()
    stats = RequestStats(clock, window=10.0)
    clock.advance(0)
    a = stats.started("ns/svc", "ns/p")
    b = stats.started("ns/svc", "ns/p")
    clock.advance(5)  # two in flight for 5 s
    stats.finished("ns/svc", "ns/p", a, error=False)
    stats.finished("ns/svc", "ns/p", b, error=True)
    clock.advance(5)  # none for 5 s
    assert stats.pod_metric("ns/p", "concurrency") == pytest.approx(1.0)
    assert stats.services["ns/svc"].errors == 1
    assert stats.services["ns/svc"].in_flight == 0


def test_prometheus_histogram_is_cumulative() -> None:
    clock = FakeClock()
    stats = RequestStats(clock)
    for seconds in (0.002, 0.02, 2.0):
        start = stats.started("ns/svc", "ns/p")
        clock.advance(seconds)
        stats.finished("ns/svc", "ns/p", start, error=False)
    text = stats.prometheus()
    assert 'gpufleet_gateway_service_request_duration_seconds_bucket{namespace="ns",service="svc",le="0.0025"} 1' in text
    assert 'gpufleet_gateway_service_request_duration_seconds_bucket{namespace="ns",service="svc",le="0.025"} 2' in text
    assert 'gpufleet_gateway_service_request_duration_seconds_bucket{namespace="ns",service="svc",le="+Inf"} 3' in text
    assert 'gpufleet_gateway_pod_requests_total{namespace="ns",service="svc",pod="p"} 3' in text


def test_milli_quantity() -> None:
    assert milli_quantity(2.0) == "2"
    assert milli_quantity(2.5) == "2500m"
    assert milli_quantity(0.0) == "0"
