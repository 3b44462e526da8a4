"""Queueing policies of a ClusterQueue beyond Kueue's: the order in which its pending
workloads are considered and which of its admitted ones they may preempt.

A ClusterQueue chooses its policy with the annotation ``gpufleet.io/queueing-policy``
(Kueue ignores annotations, so the same object still means the same to Kueue):

- ``fifo`` (or no annotation): Kueue's order, priority then age;
- ``attained-service``: non-clairvoyant, Tiresias' discretized least-attained-service.
  A workload's attained service is the GPU-time it has held (GPUs x seconds admitted,
  over all its runs). The service is cut into levels at ``LEVELS`` GPU-seconds (or the
  ClusterQueue's annotation ``gpufleet.io/attained-service-levels``); a
  workload at a lower level goes first and preempts admitted workloads at a higher level
  (checkpoint-restart, through the ordinary eviction). Within a level, the workload of the
  fewest GPUs first (it holds less for as long as it turns out to run), then first come
  first served (an evicted workload queues again from its eviction); the annotation
  ``gpufleet.io/attained-service-order: fifo`` makes it first come first served alone, as in
  Tiresias. A level's workloads never preempt each other. Starvation guard, off
  unless the ClusterQueue's annotation ``gpufleet.io/attained-service-starvation-factor``
  gives a factor: a workload that has waited that many times as long as it has run (and at
  least ``STARVATION_MIN_SECONDS``) is treated as level 0 until it is admitted again, and
  its service starts again from 0 when it is (Tiresias' promotion);
- ``shortest-remaining-service``: the workload with the least remaining GPU-time goes first
  and preempts those with more. The job declares its total steps (annotation
  ``gpufleet.io/total-steps``) and reports the steps done (``gpufleet.io/steps-done``, on the
  job); the time a step takes is measured by admission from two reports in one run, never
  declared. A workload not yet measured goes first (it runs to be measured).

Every function here is pure: the ranks are computed from ``WorkloadInfo`` and the time,
so the admission controller of a live cluster and the trace replay run the same code.
A rank is an integer priority: Kueue's priority stays the first key, the policy's order
the second, and ``admission.Cycle`` uses the rank wherever it would use the priority
(queue order, who may preempt whom: strictly lower ranks only).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

POLICY_ANNOTATION = "gpufleet.io/queueing-policy"
# Declared by the job (on the job and copied to nothing else): how many steps it runs.
TOTAL_STEPS_ANNOTATION = "gpufleet.io/total-steps"
# Reported by the job while it runs (its trainer's step counter, checkpointed progress).
STEPS_DONE_ANNOTATION = "gpufleet.io/steps-done"
# Kept by admission on the Workload: GPU-seconds held in the runs that are over.
ATTAINED_ANNOTATION = "gpufleet.io/attained-gpu-seconds"
# On a ClusterQueue of the attained-service policy: its levels' thresholds in GPU-seconds,
# comma-separated and increasing (default LEVELS).
LEVELS_ANNOTATION = "gpufleet.io/attained-service-levels"
# On a ClusterQueue of the attained-service policy: the starvation guard's factor (a pending
# workload that has waited this many times as long as it has run counts as level 0); "0"
# turns the guard off (default STARVATION_FACTOR).
STARVATION_ANNOTATION = "gpufleet.io/attained-service-starvation-factor"
# On a ClusterQueue of the attained-service policy: the order within a level (ORDERS).
ORDER_ANNOTATION = "gpufleet.io/attained-service-order"

FIFO = "fifo"
ATTAINED_SERVICE = "attained-service"
SHORTEST_REMAINING = "shortest-remaining-service"
POLICIES = (FIFO, ATTAINED_SERVICE, SHORTEST_REMAINING)
# The orders within an attained-service level (ORDER_ANNOTATION).
FEWEST_GPUS = "fewest-gpus"
ORDERS = (FEWEST_GPUS, FIFO)

# Attained-service levels, GPU-seconds: below 1 GPU-hour, then each 4 times the last, up to
# 1,024 GPU-hours. Chosen on the Philly traces (docs/simulate.md): fewer and lower levels
# (Tiresias' 3,250 and 7,200 GPU-s, or these up to 125 GPU-hours) leave most jobs in the
# last level, first come first served, and raise the average JCT.
LEVELS = (3_600.0, 14_400.0, 57_600.0, 230_400.0, 921_600.0, 3_686_400.0)
# No starvation guard by default: with one, on a cluster that is always behind (as on the
# Philly traces), every long job starves over and over, and each time it is promoted its
# service starts from 0, so it runs to the first level, is preempted again and starves again
# (bench/policy_model.py, trace1's first 300 jobs, the levels before these: 40,871
# preemptions and an average JCT of 4.1 million s with the guard at 4, 637 and 2.8 million s
# without). A queue turns it on with the annotation (Tiresias' knob, STARVELIMIT).
STARVATION_FACTOR = 0.0
STARVATION_MIN_SECONDS = 3_600.0

# Kueue's priority weighs more than any policy order.
_SCALE = 10**15


@dataclass(frozen=True)
class Progress:
    """What admission knows of a job's progress: the steps last reported and when it saw
    them, and the seconds a step takes (measured; None until measured)."""

    steps: int = 0
    seen_at: float = 0.0
    step_seconds: float | None = None
    # The run (admission time) the report belongs to: two reports of one run measure speed.
    run: float | None = None
    # Whether ``seen_at`` times a report made in ``run``. False for the steps a run starts
    # from (reported before it, seen when it began): the time from there to the run's first
    # report is the pods' start as well as steps, so it measures nothing.
    timed: bool = True


def parse_policy(value: str | None) -> str | None:
    """The policy an annotation value names, "" for none, None when it names no policy."""
    v = (value or "").strip()
    if not v or v == FIFO:
        return ""
    return v if v in POLICIES else None


def parse_levels(value: str | None) -> tuple[float, ...] | None:
    """The thresholds an attained-service-levels annotation gives (None when it is absent).
    Raises ValueError, saying what is wrong, unless they are positive and increasing."""
    if value is None or not value.strip():
        return None
    try:
        levels = tuple(float(part) for part in value.split(","))
    except ValueError:
        raise ValueError(f"{value!r} is not a comma-separated list of GPU-seconds such as \"3600,18000\"") from None
    if any(not math.isfinite(v) or v <= 0 for v in levels) or any(b <= a for a, b in itertools.pairwise(levels)):
        raise ValueError(f"{value!r}: the levels must be positive GPU-seconds, each above the one before")
    return levels


def parse_starvation(value: str | None) -> float | None:
    """The factor a starvation-factor annotation gives (None when it is absent; 0: no guard).
    Raises ValueError, saying what is wrong, unless it is a number of 0 or more."""
    if value is None or not value.strip():
        return None
    try:
        factor = float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number such as \"4\" (or \"0\": no starvation guard)") from None
    if not math.isfinite(factor) or factor < 0:
        raise ValueError(f"{value!r}: the factor must be 0 (no guard) or more")
    return factor


def parse_order(value: str | None) -> str | None:
    """The order within a level an attained-service-order annotation names (None when it is
    absent). Raises ValueError, saying what is wrong, unless it is one of ORDERS."""
    if value is None or not value.strip():
        return None
    v = value.strip()
    if v not in ORDERS:
        raise ValueError(f"{value!r}: supported values: {', '.join(ORDERS)}")
    return v


def attained(gpus: int, stored: float, admitted_at: float | None, now: float) -> float:
    """GPU-seconds held so far: the runs that are over plus the one in progress."""
    running = max(0.0, now - admitted_at) * gpus if admitted_at is not None else 0.0
    return stored + running


def level(service: float, levels: tuple[float, ...] = LEVELS) -> int:
    """The attained-service level: 0 below the first threshold, 1 below the second, ..."""
    return bisect.bisect_right(levels, service)


def starving(service: float, gpus: int, waiting_since: float, now: float,
             factor: float = STARVATION_FACTOR, minimum: float = STARVATION_MIN_SECONDS) -> bool:
    """Whether a pending workload has waited ``factor`` times its run time (at least
    ``minimum``); never with ``factor`` 0 (no guard)."""
    if service <= 0 or gpus <= 0 or factor <= 0:
        return False
    return now - waiting_since >= max(minimum, factor * service / gpus)


def promoted(service: float, gpus: int, waiting_since: float, now: float,
             levels: tuple[float, ...] | None = None, factor: float | None = None) -> bool:
    """Whether a pending workload is admitted only because it starves (above level 0 by its
    service): its service then starts again from 0, as Tiresias resets a promoted job's, so
    the workload it displaced cannot take the GPUs straight back."""
    return level(service, levels or LEVELS) > 0 and starving(
        service, gpus, waiting_since, now, STARVATION_FACTOR if factor is None else factor)


def measure(prev: Progress | None, steps: int, run: float | None, now: float) -> Progress:
    """Fold one observation of the steps done into what is known. A step's time is measured
    between two reports made in the same run (the steps moved, time passed); the steps a
    run starts from are not one of them (the time to its first report includes its pods'
    start, which can be many steps long)."""
    if prev is None:
        return Progress(steps, now, None, run)
    if steps == prev.steps and run == prev.run:
        return prev
    if run != prev.run:
        # A run begins (or ends) with steps reported before it: they time nothing of it.
        return Progress(steps, now, prev.step_seconds, run, timed=False)
    speed = prev.step_seconds
    if run is not None and prev.timed and steps > prev.steps and now > prev.seen_at:
        speed = (now - prev.seen_at) / (steps - prev.steps)
    return Progress(steps, now, speed, run)


def remaining_service(gpus: int, total_steps: int, progress: Progress | None, running: bool,
                      now: float) -> float | None:
    """GPU-seconds left: steps left x measured step time x GPUs; a running workload's steps
    are counted on from its last report. None when its step time is not measured yet."""
    if progress is None or progress.step_seconds is None:
        return None
    left = max(0.0, float(total_steps - progress.steps))
    if running and progress.step_seconds > 0:
        left = max(0.0, left - (now - progress.seen_at) / progress.step_seconds)
    return left * progress.step_seconds * max(gpus, 1)


@dataclass(frozen=True)
class Standing:
    """One workload as a policy sees it."""

    key: str
    priority: int
    gpus: int
    admitted: bool  # holds quota (admitted, not being evicted)
    admitted_at: float | None
    stored_service: float  # GPU-seconds of the runs that are over
    waiting_since: float  # creation or last eviction
    total_steps: int | None = None
    progress: Progress | None = None


def rank(policy: str, s: Standing, now: float, levels: tuple[float, ...] | None = None,
         factor: float | None = None) -> int:
    """The workload's rank under ``policy``: higher goes first and may preempt lower.
    ``levels`` and ``factor``: the attained-service queue's own (None: LEVELS, STARVATION_FACTOR)."""
    if policy == ATTAINED_SERVICE:
        service = attained(s.gpus, s.stored_service, s.admitted_at if s.admitted else None, now)
        lv = level(service, levels or LEVELS)
        if not s.admitted and starving(service, s.gpus, s.waiting_since, now,
                                       STARVATION_FACTOR if factor is None else factor):
            lv = 0
        return s.priority * _SCALE - lv
    if policy == SHORTEST_REMAINING:
        if not s.total_steps:
            return s.priority * _SCALE - (_SCALE - 1)  # nothing declared: last
        left = remaining_service(s.gpus, s.total_steps, s.progress, s.admitted, now)
        if left is None:
            return s.priority * _SCALE  # not measured yet: first, to be measured
        return s.priority * _SCALE - min(_SCALE - 2, 1 + int(left))
    return s.priority


def order(policy: str, s: Standing, within: str | None = None) -> float:
    """Where the workload goes among those of its rank, before the time it has waited: lower
    first. ``within``: the attained-service queue's order within a level (None: FEWEST_GPUS)."""
    if policy == ATTAINED_SERVICE and (within or FEWEST_GPUS) == FEWEST_GPUS:
        return float(s.gpus)
    return 0.0


def next_change(policy: str, standings: Iterable[Standing], now: float,
                levels: tuple[float, ...] | None = None, factor: float | None = None) -> float | None:
    """Seconds until time alone changes a rank in a way that can change a decision (an
    admitted workload reaching its next level, a pending one starving); None when never."""
    if policy != ATTAINED_SERVICE:
        return None  # remaining service only falls while running: that changes no decision
    levels = levels or LEVELS
    factor = STARVATION_FACTOR if factor is None else factor
    standings = [s for s in standings if s.gpus > 0]
    # A pending workload at level p may preempt admitted ones above p: an admitted workload
    # reaching level L + 1 matters only when some pending one is at level L or below.
    # Without the guard the lowest pending level is that of the least stored service (levels
    # rise with service).
    pending = [s for s in standings if not s.admitted]
    if factor > 0:
        lowest = min((0 if starving(s.stored_service, s.gpus, s.waiting_since, now, factor)
                      else level(s.stored_service, levels) for s in pending), default=math.inf)
    else:
        lowest = level(min(s.stored_service for s in pending), levels) if pending else math.inf
    soonest = math.inf
    for s in standings:
        if s.admitted:
            service = attained(s.gpus, s.stored_service, s.admitted_at, now)
            lv = level(service, levels)
            if lv < len(levels) and lv >= lowest:
                soonest = min(soonest, (levels[lv] - service) / s.gpus + 1e-3)
    if factor > 0:
        for s in pending:
            service = s.stored_service
            if service > 0 and level(service, levels) > 0:
                due = s.waiting_since + max(STARVATION_MIN_SECONDS, factor * service / s.gpus)
                if due > now:
                    soonest = min(soonest, due - now)
    return soonest if math.isfinite(soonest) else None
