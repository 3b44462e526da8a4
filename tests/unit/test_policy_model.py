"""bench/policy_model.py's model of the simulator behind the published Tiresias figure: the
order its queues keep and the work it charges at each event (docs/simulate.md, "Fidelity")."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from gpufleet.cli.simulate.trace import TraceJob

_spec = importlib.util.spec_from_file_location(
    "policy_model", Path(__file__).resolve().parents[2] / "bench" / "policy_model.py")
assert _spec is not None and _spec.loader is not None
policy_model = importlib.util.module_from_spec(_spec)
sys.modules["policy_model"] = policy_model  # its dataclasses look their module up
_spec.loader.exec_module(policy_model)


def job(name: str, submit: float, gpus: int, duration: float) -> TraceJob:
    return TraceJob(name, submit, gpus, duration)


def test_a_job_just_preempted_waits_ahead_of_the_older_pending_ones():
    # 2 GPUs, one level change at 100 GPU-s. P (2 GPUs) is preempted at 60 for X; X and R
    # (1 GPU each) reach the second level at 160 and 170 and run there, ahead of P, which
    # does not fit. Y (2 GPUs, 40 s) preempts both at 200; at 240 X and R run again before P
    # (preempted earlier): X ends at 10,100, R at 10,110, and only then P, at 20,050.
    jobs = [job("p", 0, 2, 10_000), job("x", 60, 1, 10_000), job("r", 70, 1, 10_000), job("y", 200, 2, 40)]
    avg, preemptions = policy_model.tiresias(jobs, 2, (100.0,))
    assert preemptions == 3
    assert avg == pytest.approx((20_050 + 10_040 + 10_040 + 40) / 4)


def test_every_event_but_its_own_end_costs_a_running_job_the_overhead():
    # A runs alone but for B's arrival at 500 and B's end at 600: 10 s lost at each.
    jobs = [job("a", 0, 1, 1_000), job("b", 500, 1, 100)]
    avg, _ = policy_model.tiresias(jobs, 2, event_overhead=10.0)
    assert avg == pytest.approx((1_020 + 100) / 2)
    avg, _ = policy_model.tiresias(jobs, 2, event_overhead=10.0, slowdown=1.5)
    assert avg == pytest.approx((1_520 + 150) / 2)
