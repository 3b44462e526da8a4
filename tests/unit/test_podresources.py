"""Kubernetes' pod requests/limits rule (component-helpers resource.PodRequests/PodLimits),
on typed models and on wire JSON."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.api import k8s
from gpufleet.api.podresources import (
    container_gpu_request,
    container_requests,
    pod_gpu_request,
    pod_limits,
    pod_requests,
)

GPU = "nvidia.com/gpu"


def c(name: str, requests: dict | None = None, limits: dict | None = None, *, sidecar: bool = False) -> dict:
    out: dict = {"name": name, "image": "busybox"}
    res = {}
    if requests is not None:
        res["requests"] = requests
    if limits is not None:
        res["limits"] = limits
    if res:
        out["resources"] = res
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def pod(containers: list[dict], init: list[dict] | None = None, **spec) -> dict:
    s: dict = {"containers": containers, **spec}
    if init:
        s["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": s}


def typed(p: dict) -> k8s.Pod:
    return k8s.Pod.model_validate(p)


def both(p: dict, **kw):
    """The result on the wire form, checked equal to the one on the typed model."""
    wire = pod_requests(p, **kw)
    assert pod_requests(typed(p), **kw) == wire
    assert pod_requests(typed(p).spec, **kw) == wire
    assert pod_requests(p["spec"], **kw) == wire
    return wire


def test_regular_containers_add_up() -> None:
    p = pod([c("a", {"cpu": "500m", "memory": "1Gi"}), c("b", {"cpu": "250m"})])
    assert both(p) == {"cpu": Fraction(3, 4), "memory": Fraction(2**30)}


def test_an_init_container_alone_may_need_more() -> None:
    p = pod([c("a", {"cpu": "1"})], [c("i", {"cpu": "2"}), c("j", {"cpu": "500m"})])
    assert both(p) == {"cpu": Fraction(2)}
    # A resource only an init container asks for still counts.
    p = pod([c("a", {"cpu": "1"})], [c("i", {"memory": "1Mi"})])
    assert both(p) == {"cpu": Fraction(1), "memory": Fraction(2**20)}


def test_sidecars_add_to_the_containers() -> None:
    p = pod([c("a", {GPU: "1"})], [c("log", {GPU: "1"}, sidecar=True)])
    assert both(p) == {GPU: Fraction(2)}


def test_an_init_container_runs_alongside_the_sidecars_started_before_it() -> None:
    # sidecar (1) then init (2): while init runs, 1 + 2 = 3 are in use.
    p = pod([c("a", {GPU: "0"})], [c("side", {GPU: "1"}, sidecar=True), c("init", {GPU: "2"})])
    assert both(p) == {GPU: Fraction(3)}


def test_an_init_container_before_a_sidecar_does_not_run_with_it() -> None:
    # init (2) then sidecar (1), no regular GPUs: the peak is the init container's 2, not 3.
    p = pod([c("a")], [c("init", {GPU: "2"}), c("side", {GPU: "1"}, sidecar=True)])
    assert both(p) == {GPU: Fraction(2)}


def test_overhead_adds_to_every_request() -> None:
    p = pod([c("a", {"cpu": "1"})], overhead={"cpu": "250m", "memory": "64Mi"})
    assert both(p) == {"cpu": Fraction(5, 4), "memory": Fraction(64 * 2**20)}


def test_pod_level_requests_replace_the_aggregate_for_cpu_and_memory() -> None:
    p = pod([c("a", {"cpu": "1", "memory": "1Gi", GPU: "1"})],
            resources={"requests": {"cpu": "3"}}, overhead={"cpu": "1"})
    assert both(p) == {"cpu": Fraction(4), "memory": Fraction(2**30), GPU: Fraction(1)}


def test_a_limit_without_a_request_is_the_request() -> None:
    p = pod([c("a", limits={GPU: "2", "cpu": "1"}), c("b", {"cpu": "100m"}, {"cpu": "1"})])
    assert both(p) == {GPU: Fraction(2), "cpu": Fraction(11, 10)}
    assert container_requests(c("a", limits={GPU: 2})) == {GPU: Fraction(2)}


def test_non_missing_counts_containers_that_request_nothing() -> None:
    defaults = {"cpu": Fraction(1, 10), "memory": Fraction(200 * 2**20)}
    p = pod([c("a"), c("b", {"cpu": "1"})])
    assert both(p, non_missing=defaults) == {"cpu": Fraction(11, 10), "memory": Fraction(400 * 2**20)}
    assert both(p) == {"cpu": Fraction(1)}


def test_limits_follow_the_same_rule_and_overhead_only_raises_limits_that_are_set() -> None:
    p = pod([c("a", limits={"cpu": "1"})], [c("side", limits={"cpu": "1"}, sidecar=True)],
            overhead={"cpu": "100m", "memory": "10Mi"})
    # No memory limit anywhere: the overhead does not make one up (Kubernetes' PodLimits).
    assert pod_limits(p) == {"cpu": Fraction(21, 10)}
    assert pod_limits(typed(p)) == pod_limits(p)
    # Requests default from limits; limits never from requests.
    assert pod_limits(pod([c("a", {"cpu": "1"})])) == {}


def test_gpu_request_of_pods_and_containers() -> None:
    p = pod([c("a", limits={GPU: 2}), c("b", {GPU: 1}, {GPU: 1})], [c("warm", {GPU: 8}, {GPU: 8})])
    assert pod_gpu_request(p) == 8
    assert pod_gpu_request(typed(p)) == 8
    assert pod_gpu_request(pod([c("a")])) == 0
    assert pod_gpu_request({}) == 0
    assert container_gpu_request(c("a", limits={GPU: "2"})) == 2
    assert container_gpu_request(typed(p).spec.containers[1]) == 1


def test_unparseable_values_are_skipped() -> None:
    p = pod([c("a", {"cpu": "lots", GPU: "1"})])
    assert pod_requests(p) == {GPU: Fraction(1)}


# -- the rule against a timeline --------------------------------------------------------------

_amount = st.integers(min_value=0, max_value=8)
_container = st.fixed_dictionaries({}, optional={"cpu": _amount, GPU: _amount})


def _peak(containers: list[dict], inits: list[tuple[dict, bool]]) -> dict[str, int]:
    """The most of each resource in use at any moment of the pod's life: init containers one
    at a time beside the sidecars already started, then every sidecar and container."""
    names = {n for d in [*containers, *(i for i, _ in inits)] for n in d}
    moments: list[dict[str, int]] = []
    sidecars: list[dict] = []
    for req, sidecar in inits:
        if sidecar:
            sidecars.append(req)
            moments.append({n: sum(s.get(n, 0) for s in sidecars) for n in names})
        else:
            moments.append({n: req.get(n, 0) + sum(s.get(n, 0) for s in sidecars) for n in names})
    moments.append({n: sum(x.get(n, 0) for x in [*sidecars, *containers]) for n in names})
    return {n: max(m[n] for m in moments) for n in names}


@given(st.lists(_container, max_size=4), st.lists(st.tuples(_container, st.booleans()), max_size=4))
def test_the_request_is_the_peak_over_the_pods_life(containers, inits) -> None:
    p = pod([c(f"c{i}", {k: str(v) for k, v in r.items()}) for i, r in enumerate(containers)],
            [c(f"i{i}", {k: v for k, v in r.items()}, sidecar=s) for i, (r, s) in enumerate(inits)])
    expected = {n: Fraction(v) for n, v in _peak(containers, inits).items()}
    assert both(p) == expected
    assert pod_gpu_request(p) == expected.get(GPU, 0)
