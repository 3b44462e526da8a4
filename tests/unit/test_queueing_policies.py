"""The queueing policies (gpufleet.queueing.policies) as pure functions, and the admission
pass ordering and preempting by them."""

from __future__ import annotations

import pytest

from gpufleet.api.gpu import GPU_RESOURCE as GPU
from gpufleet.queueing import policies as p
from gpufleet.queueing.admission import (
    WAIT_PRIORITY,
    WAIT_QUOTA,
    ClusterQueueInfo,
    FlavorInfo,
    NodeInfo,
    PodSetInfo,
    Quota,
    ResourceGroupInfo,
    WorkloadInfo,
    schedule,
)

FLAVOR = "default"
FLAVORS = {FLAVOR: FlavorInfo(FLAVOR)}
NOW = 1_000_000.0


def queue(policy: str, levels: tuple[float, ...] | None = None, within: str | None = None,
          ) -> dict[str, ClusterQueueInfo]:
    return {"q": ClusterQueueInfo("q", [ResourceGroupInfo((GPU,), (FLAVOR,))], {(FLAVOR, GPU): Quota(8)},
                                  policy=policy, levels=levels, within_level=within)}


def wl(key: str, gpus: int, *, ts: float = 0.0, admitted_at: float | None = None, **kw) -> WorkloadInfo:
    w = WorkloadInfo(key, "q", [PodSetInfo("main", 1, {GPU: gpus})], timestamp=ts, **kw)
    if admitted_at is not None:
        w.admission = {"main": {GPU: FLAVOR}}
        w.admitted_at = admitted_at
        w.placed = []
    return w


def node() -> list[NodeInfo]:
    return [NodeInfo("n0", {}, {"": 8})]


def standing(gpus: int = 1, *, admitted_at: float | None = None, stored: float = 0.0, since: float = NOW,
             total: int | None = None, progress: p.Progress | None = None) -> p.Standing:
    return p.Standing("ns/w", 0, gpus, admitted_at is not None, admitted_at, stored, since, total, progress)


# -- attained service ----------------------------------------------------------------------------


def test_levels_cut_attained_service_at_the_thresholds():
    assert [p.level(s) for s in (0, 3_599, 3_600, 18_000, 10**9)] == [0, 0, 1, 2, len(p.LEVELS)]


def test_attained_service_counts_stored_runs_and_the_run_in_progress():
    assert p.attained(4, 100.0, NOW - 10, NOW) == 140.0
    assert p.attained(4, 100.0, None, NOW) == 100.0


def test_less_attained_service_ranks_higher():
    fresh = p.rank(p.ATTAINED_SERVICE, standing(8), NOW)
    served = p.rank(p.ATTAINED_SERVICE, standing(8, admitted_at=NOW - 3_600), NOW)  # 28,800 GPU-s
    assert fresh > served
    # Within a level the rank is the same: no preemption among equals.
    assert p.rank(p.ATTAINED_SERVICE, standing(1, stored=10), NOW) == fresh


# Levels at 1, 5, 25 and 125 GPU-hours, a starvation factor of 4: a queue that turns the guard on.
GUARDED = ((3_600.0, 18_000.0, 90_000.0, 450_000.0), 4.0)


def test_the_default_levels_are_powers_of_4_of_a_gpu_hour_and_no_one_starves():
    assert p.LEVELS == tuple(3_600.0 * 4**i for i in range(6))
    s = standing(8, stored=8 * 7_200, since=NOW - 10**6)  # 16 GPU-hours: level 3
    assert p.rank(p.ATTAINED_SERVICE, s, NOW) == -3 and not p.starving(8 * 7_200, 8, NOW - 10**6, NOW)


def test_a_starving_workload_goes_back_to_the_first_level():
    # Ran 2 h on 8 GPUs (level 2), waiting since: not starving at 4 h, starving at 8 h.
    s = standing(8, stored=8 * 7_200, since=NOW - 4 * 3_600)
    assert p.rank(p.ATTAINED_SERVICE, s, NOW, *GUARDED) == -2
    s = standing(8, stored=8 * 7_200, since=NOW - 8 * 3_600)
    assert p.rank(p.ATTAINED_SERVICE, s, NOW, *GUARDED) == 0


def test_only_a_workload_above_level_0_admitted_for_starving_is_promoted():
    # Ran 2 h on 8 GPUs (level 2): promoted once it has waited 8 h, not at 4 h.
    assert not p.promoted(8 * 7_200, 8, NOW - 4 * 3_600, NOW, *GUARDED)
    assert p.promoted(8 * 7_200, 8, NOW - 8 * 3_600, NOW, *GUARDED)
    # At level 0 it goes first anyway: nothing to reset.
    assert not p.promoted(100, 1, NOW - 10**6, NOW, *GUARDED)
    assert p.promoted(100, 1, NOW - 10**6, NOW, (60.0,), 4.0)


def test_next_change_is_the_next_threshold_or_the_starvation_time():
    running = standing(8, admitted_at=NOW - 100)  # 800 GPU-s, next level at 3,600
    fresh = standing(1)  # pending at level 0: it may preempt running once that is at level 1
    assert p.next_change(p.ATTAINED_SERVICE, [running, fresh], NOW, *GUARDED) == pytest.approx(350.0, abs=0.01)
    assert p.next_change(p.ATTAINED_SERVICE, [running, fresh], NOW) == pytest.approx(350.0, abs=0.01)
    # With nothing pending at running's level or below, its crossing changes no decision.
    assert p.next_change(p.ATTAINED_SERVICE, [running], NOW, *GUARDED) is None
    waiting = standing(8, stored=8 * 7_200, since=NOW - 3_600)  # starves 8 h after it was stopped
    assert p.next_change(p.ATTAINED_SERVICE, [waiting], NOW, *GUARDED) == pytest.approx(7 * 3_600, abs=0.01)
    assert p.next_change(p.ATTAINED_SERVICE, [waiting], NOW) is None  # no guard: it never starves
    assert p.next_change(p.SHORTEST_REMAINING, [running], NOW) is None


def test_a_queue_may_set_its_own_levels():
    assert p.parse_levels("60, 600,6000") == (60.0, 600.0, 6000.0)
    assert p.parse_levels(None) is None and p.parse_levels(" ") is None
    for bad in ("60,30", "0,10", "ten", "60,,600", "nan"):
        with pytest.raises(ValueError):
            p.parse_levels(bad)
    running = standing(1, admitted_at=NOW - 100)  # 100 GPU-s: level 0 by default, 1 above 60
    assert p.rank(p.ATTAINED_SERVICE, running, NOW) == 0
    assert p.rank(p.ATTAINED_SERVICE, running, NOW, (60.0,)) == -1
    fresh = standing(1)
    assert p.next_change(p.ATTAINED_SERVICE, [standing(1, admitted_at=NOW - 10), fresh], NOW, (60.0,)) == \
        pytest.approx(50.0, abs=0.01)


# -- shortest remaining service ------------------------------------------------------------------


def test_step_time_is_measured_between_two_reports_of_one_run():
    first = p.measure(None, 10, run=5.0, now=100.0)
    assert first.step_seconds is None
    second = p.measure(first, 70, run=5.0, now=130.0)
    assert second.step_seconds == pytest.approx(0.5)
    # A report of another run (or after it stopped) keeps the measured speed, measures nothing.
    stopped = p.measure(second, 80, run=None, now=200.0)
    assert (stopped.steps, stopped.step_seconds) == (80, pytest.approx(0.5))
    restarted = p.measure(stopped, 81, run=300.0, now=400.0)
    assert restarted.step_seconds == pytest.approx(0.5)


def test_a_restarted_run_is_not_timed_from_the_steps_it_started_with():
    """Readmitted with 80 steps checkpointed, its pods take 10 s to start: the first report
    of the run (81 steps, 10.5 s after the admission saw 80) is not a step of 10.5 s."""
    stopped = p.Progress(steps=80, seen_at=200.0, step_seconds=0.5, run=None)
    readmitted = p.measure(stopped, 80, run=300.0, now=300.0)
    first = p.measure(readmitted, 81, run=300.0, now=310.5)
    assert first.step_seconds == pytest.approx(0.5)
    # The run's own reports measure it: 120 steps in the next 60 s.
    second = p.measure(first, 201, run=300.0, now=370.5)
    assert second.step_seconds == pytest.approx(0.5)
    slower = p.measure(second, 231, run=300.0, now=430.5)
    assert slower.step_seconds == pytest.approx(2.0)


def test_remaining_service_counts_on_from_the_last_report_while_running():
    prog = p.Progress(steps=100, seen_at=NOW - 10, step_seconds=0.5, run=1.0)
    assert p.remaining_service(2, 300, prog, running=False, now=NOW) == pytest.approx(200 * 0.5 * 2)
    assert p.remaining_service(2, 300, prog, running=True, now=NOW) == pytest.approx(180 * 0.5 * 2)
    assert p.remaining_service(2, 300, p.Progress(100, NOW, None), running=True, now=NOW) is None


def test_unmeasured_goes_first_then_least_remaining_and_undeclared_last():
    measured = p.Progress(0, NOW, 1.0)
    short = p.rank(p.SHORTEST_REMAINING, standing(1, total=100, progress=measured), NOW)
    long = p.rank(p.SHORTEST_REMAINING, standing(1, total=10_000, progress=measured), NOW)
    unmeasured = p.rank(p.SHORTEST_REMAINING, standing(1, total=10_000), NOW)
    undeclared = p.rank(p.SHORTEST_REMAINING, standing(1), NOW)
    assert unmeasured > short > long > undeclared


def test_unknown_policy_names_are_refused():
    assert p.parse_policy("attained-service") == p.ATTAINED_SERVICE
    assert p.parse_policy("fifo") == "" and p.parse_policy(None) == ""
    assert p.parse_policy("las") is None


# -- the admission pass ordering by them -------------------------------------------------------------


def test_attained_service_preempts_the_long_runner_for_a_new_job():
    long = wl("ns/long", 8, ts=0.0, admitted_at=NOW - 3_600)  # level 2 by now
    long.placed = []
    new = wl("ns/new", 2, ts=NOW - 1)
    r = schedule(queue(p.ATTAINED_SERVICE), FLAVORS, [long, new], node(), now=NOW)
    assert set(r.preempted) == {"ns/long"}
    assert r.preempted["ns/long"].preemptor == "ns/new"
    # The same queue under Kueue's order lets the new job wait.
    r = schedule(queue(""), FLAVORS, [long, new], node(), now=NOW)
    assert not r.preempted and "ns/new" in r.waiting


def test_a_queues_own_levels_decide_when_the_long_runner_is_preempted():
    long = wl("ns/long", 1, ts=0.0, admitted_at=NOW - 100)  # 100 GPU-s
    new = wl("ns/new", 8, ts=NOW - 1)
    assert not schedule(queue(p.ATTAINED_SERVICE), FLAVORS, [long, new], node(), now=NOW).preempted
    r = schedule(queue(p.ATTAINED_SERVICE, (60.0,)), FLAVORS, [long, new], node(), now=NOW)
    assert set(r.preempted) == {"ns/long"}


def test_attained_service_orders_pending_by_level_then_age():
    old_served = wl("ns/old", 8, ts=NOW - 2, attained=50_000.0)
    young_fresh = wl("ns/young", 8, ts=NOW - 1)
    r = schedule(queue(p.ATTAINED_SERVICE), FLAVORS, [old_served, young_fresh], node(), now=NOW)
    assert set(r.admitted) == {"ns/young"}
    r = schedule(queue(""), FLAVORS, [old_served, young_fresh], node(), now=NOW)
    assert set(r.admitted) == {"ns/old"}


def test_within_a_level_the_fewest_gpus_go_first_unless_the_queue_says_fifo():
    # Both at level 0; room for one of them. The older one asks for 6 GPUs, the younger 4.
    running = wl("ns/run", 2, admitted_at=NOW - 10)
    older_wide = wl("ns/wide", 6, ts=NOW - 20)
    younger_narrow = wl("ns/narrow", 4, ts=NOW - 5)
    both = [running, older_wide, younger_narrow]
    r = schedule(queue(p.ATTAINED_SERVICE), FLAVORS, both, node(), now=NOW)
    assert set(r.admitted) == {"ns/narrow"} and "ns/wide" in r.waiting
    r = schedule(queue(p.ATTAINED_SERVICE, within=p.FIFO), FLAVORS, both, node(), now=NOW)
    assert set(r.admitted) == {"ns/wide"} and "ns/narrow" in r.waiting
    # A level still comes first: a narrow job with more service waits behind a wide fresh one.
    served_narrow = wl("ns/narrow", 4, ts=NOW - 5, attained=50_000.0)
    r = schedule(queue(p.ATTAINED_SERVICE), FLAVORS, [running, older_wide, served_narrow], node(), now=NOW)
    assert set(r.admitted) == {"ns/wide"}


def test_a_level_never_preempts_within_itself_whatever_the_order():
    # An 8-GPU job at level 0 runs; a 1-GPU job at level 0 waits for it rather than preempt it.
    wide = wl("ns/wide", 8, admitted_at=NOW - 10)  # 80 GPU-s: level 0
    narrow = wl("ns/narrow", 1, ts=NOW - 1)
    r = schedule(queue(p.ATTAINED_SERVICE), FLAVORS, [wide, narrow], node(), now=NOW)
    assert not r.preempted and "ns/narrow" in r.waiting


def test_every_waiting_job_below_a_running_one_is_told_it_waits_for_priority():
    # A fresh 8-GPU job runs (level 0); five of the same shape wait at level 2 and one at
    # level 0. Those at level 2 may not preempt it: each is told so, not only the first.
    running = wl("ns/run", 8, admitted_at=NOW - 10)
    served = [wl(f"ns/served-{i}", 8, ts=NOW - 10 + i, attained=20_000.0) for i in range(5)]
    equal = wl("ns/equal", 8, ts=NOW)
    r = schedule(queue(p.ATTAINED_SERVICE), FLAVORS, [running, *served, equal], node(), now=NOW)
    assert not r.preempted and not r.admitted
    assert {w.key: r.waiting[w.key].kind for w in served} == {w.key: WAIT_PRIORITY for w in served}
    assert r.waiting["ns/equal"].kind == WAIT_QUOTA  # same level: nothing above it holds the quota


def test_a_pass_given_the_last_passes_memo_decides_as_a_pass_without_it():
    # The same WorkloadInfo objects pass after pass, as a live cycle gives those that did not
    # change: what the memo keeps must not stand in for what time changed. With the guard on,
    # a job at level 2 stopped 4 h ago does not starve; at 8 h it does, and preempts.
    queues = {"q": ClusterQueueInfo("q", [ResourceGroupInfo((GPU,), (FLAVOR,))], {(FLAVOR, GPU): Quota(8)},
                                    policy=p.ATTAINED_SERVICE, levels=GUARDED[0], starvation_factor=GUARDED[1])}
    running = wl("ns/run", 8, admitted_at=NOW - 4_000)  # 32,000 GPU-s: level 1
    stopped = wl("ns/stopped", 8, ts=NOW - 4 * 3_600, attained=8 * 7_200.0)  # level 2
    fresh = [wl(f"ns/fresh-{i}", 8, ts=NOW - i, attained=50_000.0) for i in range(3)]  # level 2
    workloads = [running, stopped, *fresh]
    memo: dict = {}
    for now in (NOW, NOW + 3_600, NOW + 4 * 3_600, NOW + 4 * 3_600 + 1):
        kept = schedule(queues, FLAVORS, workloads, node(), now=now, memo=memo)
        alone = schedule(queues, FLAVORS, workloads, node(), now=now)
        assert (kept.admitted, kept.preempted, kept.waiting, kept.requeue_after) == (
            alone.admitted, alone.preempted, alone.waiting, alone.requeue_after)
    assert set(kept.preempted) == {"ns/run"} and kept.preempted["ns/run"].preemptor == "ns/stopped"
    assert not schedule(queues, FLAVORS, workloads, node(), now=NOW, memo=memo).preempted


def test_the_order_within_a_level_is_parsed_and_checked():
    assert p.parse_order("fifo") == p.FIFO and p.parse_order(" fewest-gpus ") == p.FEWEST_GPUS
    assert p.parse_order(None) is None and p.parse_order("") is None
    with pytest.raises(ValueError, match="supported values: fewest-gpus, fifo"):
        p.parse_order("shortest")
    assert p.order(p.ATTAINED_SERVICE, standing(4), None) == 4.0 == p.order(p.ATTAINED_SERVICE, standing(4), "fewest-gpus")
    assert p.order(p.ATTAINED_SERVICE, standing(4), p.FIFO) == 0.0
    assert p.order(p.SHORTEST_REMAINING, standing(4), None) == 0.0


def test_attained_service_asks_to_be_woken_when_a_level_is_crossed():
    running = wl("ns/run", 8, admitted_at=NOW - 100)
    waiting = wl("ns/wait", 8, ts=NOW, attained=1_000.0)  # level 0: may preempt level 1
    r = schedule(queue(p.ATTAINED_SERVICE), FLAVORS, [running, waiting], node(), now=NOW)
    assert r.requeue_after == pytest.approx(350.0, abs=0.01)  # running reaches level 1 then


def test_shortest_remaining_preempts_the_job_with_more_left():
    long = wl("ns/long", 8, admitted_at=NOW - 100, total_steps=10_000,
              progress=p.Progress(100, NOW - 100, 1.0, NOW - 100))
    nearly = wl("ns/nearly", 8, ts=NOW - 1, total_steps=1_000, progress=p.Progress(900, NOW - 50, 1.0))
    r = schedule(queue(p.SHORTEST_REMAINING), FLAVORS, [long, nearly], node(), now=NOW)
    assert set(r.preempted) == {"ns/long"}
    # The other way round (the runner has less left), nothing is preempted.
    long.total_steps = 1_000
    nearly.total_steps = 10_000
    r = schedule(queue(p.SHORTEST_REMAINING), FLAVORS, [long, nearly], node(), now=NOW)
    assert not r.preempted


def test_a_queue_may_set_its_starvation_factor_or_turn_the_guard_off():
    assert p.parse_starvation("16") == 16.0 and p.parse_starvation("0") == 0.0 and p.parse_starvation(None) is None
    for bad in ("-1", "often", "inf", "nan"):
        with pytest.raises(ValueError):
            p.parse_starvation(bad)
    # Ran 2 h on 8 GPUs (16 GPU-hours, level 3 of the defaults), waiting 8 h: starving at
    # factor 4, not at 16, nor without a guard (the default).
    s = standing(8, stored=8 * 7_200, since=NOW - 8 * 3_600)
    assert p.rank(p.ATTAINED_SERVICE, s, NOW, None, 4.0) == 0
    assert p.rank(p.ATTAINED_SERVICE, s, NOW, None, 16.0) == -3
    assert p.rank(p.ATTAINED_SERVICE, s, NOW, None, 0.0) == -3 == p.rank(p.ATTAINED_SERVICE, s, NOW)
    assert not p.promoted(8 * 7_200, 8, NOW - 10**6, NOW, None, 0.0)
    # Without a guard, time alone starves no one: nothing to wake for.
    assert p.next_change(p.ATTAINED_SERVICE, [standing(8, stored=8 * 7_200, since=NOW - 3_600)], NOW, None, 0.0) is None
