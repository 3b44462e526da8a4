"""A quick model of a trace under a queueing policy: GPUs counted as one pool (no nodes, no
API server, no controllers), for choosing a policy's parameters in seconds before a real
replay (`gpufleet simulate`, minutes) checks them.

    .venv/bin/python bench/policy_model.py ../shared/traces/philly-muri/trace1.csv srsf
    .venv/bin/python bench/policy_model.py TRACE las:3600,14400,57600:0 las:3250,7200:4
    .venv/bin/python bench/policy_model.py TRACE srsf --nodes 8     # 8 nodes of 8 GPUs

`srsf`: shortest remaining service first, knowing every job's duration. `las:LEVELS[:FACTOR]`:
attained service with those levels (GPU-seconds) and starvation factor (0: no guard; the
ranks are `gpufleet.queueing.policies.rank`, the code a live queue runs). At every arrival,
completion and rank change, jobs are taken in rank order and each that fits the free GPUs,
or the GPUs of admitted jobs of strictly lower rank (the lowest and latest admitted first),
starts; work survives preemption, with no restart overhead. This is how Muri's simulator
replays a trace (its SRSF lands within a few percent of the published average here); what it
leaves out is what a real cluster adds: a job's pods need room on nodes, and a policy that
does not know durations has to measure them.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpufleet.cli.simulate.trace import TraceJob, read_trace  # noqa: E402
from gpufleet.queueing import policies  # noqa: E402


@dataclass
class _Job:
    trace: TraceJob
    done: float = 0.0  # seconds of work kept, up to ``last``
    service: float = 0.0  # GPU-seconds of runs that are over
    started: float | None = None  # the run in progress
    last: float = 0.0  # while it runs: when its work was last counted
    since: float = 0.0  # waiting since (submit, or last preemption)
    finished: float | None = None
    preemptions: int = 0
    placed: tuple[tuple[int, int], ...] = ()  # (node, GPUs) while it runs, with --nodes

    def left(self, now: float, factor: float = 1.0) -> float:
        return self.trace.duration * factor - self.done - (now - self.last if self.started is not None else 0.0)


def _place(need: int, free: list[int], per_node: int) -> tuple[tuple[int, int], ...] | None:
    """Where a job of ``need`` GPUs goes: the fullest node it fits on, or whole free nodes."""
    if need <= per_node:
        fitting = [i for i, f in enumerate(free) if f >= need]
        return ((min(fitting, key=lambda i: (free[i], i)), need),) if fitting else None
    whole = [i for i, f in enumerate(free) if f == per_node][:math.ceil(need / per_node)]
    return tuple((i, per_node) for i in whole) if len(whole) * per_node >= need else None


def model(jobs: list[TraceJob], policy: str, gpus: int, levels: tuple[float, ...] = (), factor: float = 0.0,
          per_node: int | None = None, event_overhead: float = 0.0, slowdown: float = 1.0,
          order: str | None = None) -> tuple[float, int]:
    """(average JCT, preemptions) of ``jobs`` on ``gpus`` pooled GPUs, or on nodes of
    ``per_node`` GPUs (a job of up to a node's GPUs on one node, a larger one on whole nodes).
    ``event_overhead``: seconds of work each running job loses at every scheduling event but
    its own end, and ``slowdown``: a factor on every job's duration, as the simulator behind
    the published figures counts (10 s and 1.015 there; 0 and 1 is a replay's accounting)."""
    state = {j.name: _Job(j, since=j.submit) for j in jobs}
    arrivals = sorted(jobs, key=lambda j: j.submit)
    nxt, now, live = 0, 0.0, set()

    def standing(s: _Job) -> policies.Standing:
        return policies.Standing(s.trace.name, 0, s.trace.gpus, s.started is not None, s.started, s.service, s.since)

    def rank(s: _Job) -> int:
        if policy == "srsf":
            return -int(s.left(now, slowdown) * s.trace.gpus)
        return policies.rank(policies.ATTAINED_SERVICE, standing(s), now, levels, factor)

    while True:
        due = [arrivals[nxt].submit] if nxt < len(arrivals) else []
        due += [state[k].last + state[k].left(state[k].last, slowdown) for k in live if state[k].started is not None]
        if policy != "srsf":
            after = policies.next_change(policies.ATTAINED_SERVICE, [standing(state[k]) for k in live], now,
                                         levels, factor)
            if after is not None:
                due.append(now + after)
        if not due:
            break
        now = max(now, min(due))
        for k in list(live):
            s = state[k]
            if s.started is not None and s.left(now, slowdown) <= 1e-6:
                s.finished = now
                live.discard(k)
            elif s.started is not None:
                s.done += max(0.0, now - s.last - event_overhead)
                s.last = now
        while nxt < len(arrivals) and arrivals[nxt].submit <= now + 1e-9:
            live.add(arrivals[nxt].name)
            nxt += 1
        ranks = {k: rank(state[k]) for k in live}
        nodes = [per_node] * (gpus // per_node) if per_node else [gpus]
        for k in live:
            if state[k].started is not None:
                for i, n in state[k].placed:
                    nodes[i] -= n
        within = {k: 0.0 if policy == "srsf" else policies.order(policies.ATTAINED_SERVICE, standing(state[k]), order)
                  for k in live}
        for k in sorted(live, key=lambda k: (-ranks[k], within[k], state[k].since, k)):
            s = state[k]
            if s.started is not None:
                continue
            need = s.trace.gpus
            where = _place(need, nodes, per_node or gpus)
            if where is None:
                victims = sorted((v for v in live if state[v].started is not None and ranks[v] < ranks[k]),
                                 key=lambda v: (ranks[v], -(state[v].started or 0.0), v))
                chosen, trial = [], list(nodes)
                for v in victims:
                    if _place(need, trial, per_node or gpus) is not None:
                        break
                    chosen.append(v)
                    for i, n in state[v].placed:
                        trial[i] += n
                if _place(need, trial, per_node or gpus) is None:
                    continue
                # Give back the victims that turned out not to be needed, as admission does
                # (the latest choice first kept).
                for v in reversed(chosen[:-1]):
                    without = list(trial)
                    for i, n in state[v].placed:
                        without[i] -= n
                    if _place(need, without, per_node or gpus) is not None:
                        chosen.remove(v)
                        trial = without
                for v in chosen:
                    sv = state[v]
                    sv.service += (now - (sv.started or now)) * sv.trace.gpus
                    sv.started, sv.since = None, now
                    sv.preemptions += 1
                    for i, n in sv.placed:
                        nodes[i] += n
                    sv.placed = ()
                    ranks[v] = rank(sv)
                where = _place(need, nodes, per_node or gpus)
            if where is not None:
                if policy != "srsf" and policies.promoted(s.service, need, s.since, now, levels, factor):
                    s.service = 0.0  # as admission resets a workload promoted for starving
                s.started, s.last, s.placed = now, now, where
                for i, n in where:
                    nodes[i] -= n
    jct = [s.finished - s.trace.submit for s in state.values() if s.finished is not None]
    return sum(jct) / len(jct), sum(s.preemptions for s in state.values())


def tiresias(jobs: list[TraceJob], gpus: int, limits: tuple[float, ...] = (3_250.0, 7_200.0),
             event_overhead: float = 0.0, slowdown: float = 1.0) -> tuple[float, int]:
    """(average JCT, preemptions) under the discretized 2D-LAS of the simulator behind the
    published Tiresias figure, as it schedules: a list per level; an arriving job joins the
    end of the first, a running job whose GPU-time passes its level's limit the end of the
    next (one level per event). At every event the whole cluster is allotted again, level
    after level and each list in order, a job running if its GPUs are still free (counted
    as one pool) and preempted if not. Then each list puts its running jobs before its
    pending ones, both kept in order, so a job just preempted waits ahead of the older pending
    ones. No starvation guard (the published runs have none)."""
    arrivals = sorted(jobs, key=lambda j: j.submit)
    left = {j.name: j.duration * slowdown for j in jobs}
    held = {j.name: 0.0 for j in jobs}  # seconds run, over all runs: GPU-time / GPUs
    level = {j.name: 0 for j in jobs}
    need = {j.name: j.gpus for j in jobs}
    queues: list[list[str]] = [[] for _ in range(len(limits) + 1)]
    running: set[str] = set()
    finished: dict[str, float] = {}
    preemptions, nxt, now, jump = 0, 0, 0.0, math.inf
    while nxt < len(arrivals) or running:
        start = arrivals[nxt].submit if nxt < len(arrivals) else math.inf
        end = min((now + left[k] for k in running), default=math.inf)
        t = min(start, end, jump)
        ends, arrives = t == end, t == start  # neither: a level change only
        for k in [k for k in running if ends and now + left[k] <= end + 1e-9]:
            running.discard(k)
            queues[level[k]].remove(k)
            finished[k] = t
        while arrives and nxt < len(arrivals) and arrivals[nxt].submit <= t:
            queues[0].append(arrivals[nxt].name)
            nxt += 1
        for k in running:
            left[k] -= max(0.0, t - now - event_overhead)
            held[k] += t - now
            if level[k] < len(limits) and held[k] * need[k] >= limits[level[k]]:
                queues[level[k]].remove(k)
                level[k] += 1
                queues[level[k]].append(k)
        now, free, runs = t, gpus, set()
        for queue in queues:
            for k in queue:
                if free >= need[k]:
                    free -= need[k]
                    runs.add(k)
        preemptions += len(running - runs)
        running = runs
        for i, queue in enumerate(queues):
            queues[i] = [k for k in queue if k in running] + [k for k in queue if k not in running]
        jump = min((math.ceil(limits[level[k]] / need[k]) - held[k] + now for k in running
                    if level[k] < len(limits)), default=math.inf)
    jct = [finished[j.name] - j.submit for j in jobs if j.name in finished]
    return sum(jct) / len(jct), preemptions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("runs", nargs="+", help="srsf, las:LEVELS[:FACTOR], or tiresias[:LIMITS]")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--nodes", type=int, default=None, metavar="GPUS_PER_NODE",
                    help="place jobs on nodes of this many GPUs instead of one pool")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--order", default=None, choices=policies.ORDERS,
                    help="las: the order within a level (default the policy's own)")
    ap.add_argument("--event-overhead", type=float, default=0.0, metavar="SECONDS",
                    help="work each running job loses at every scheduling event (the published figures' simulator: 10)")
    ap.add_argument("--slowdown", type=float, default=1.0,
                    help="a factor on every duration (the published figures' simulator: 1.015)")
    args = ap.parse_args()
    jobs = read_trace(args.trace, args.limit)
    for run in args.runs:
        kind, _, rest = run.partition(":")
        levels_text, _, factor_text = rest.partition(":")
        levels = tuple(float(v) for v in levels_text.split(",")) if levels_text else policies.LEVELS
        t0 = time.process_time()
        if kind == "tiresias":
            avg, preemptions = tiresias(jobs, args.gpus, levels if levels_text else (3_250.0, 7_200.0),
                                        args.event_overhead, args.slowdown)
        else:
            avg, preemptions = model(jobs, "srsf" if kind == "srsf" else "las", args.gpus, levels,
                                     float(factor_text or 0), args.nodes, args.event_overhead, args.slowdown, args.order)
        print(f"{run}{f' ({args.order})' if args.order else ''}: average JCT {avg:,.0f} s, {preemptions:,} preemptions ({time.process_time() - t0:.0f} s CPU)",
              flush=True)


if __name__ == "__main__":
    main()
