"""`gpufleet simulate`: replay a job trace through the real control plane in virtual time
(docs/simulate.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.output import err


def register(app: typer.Typer) -> None:
    @app.command()
    def simulate(
        trace: Annotated[Path, typer.Option("--trace", help="Muri's Philly CSV (ms) or the generic CSV/JSON (s).")],
        nodes: Annotated[str, typer.Option("--nodes", help="NODESxGPUS, e.g. 8x8.")] = "8x8",
        policy: Annotated[str, typer.Option("--policy", help=(
            "fifo, priority, fair-share, attained-service or shortest-remaining-service."))] = "fifo",
        restart_overhead: Annotated[float, typer.Option("--restart-overhead",
                                                        help="Seconds every restart spends before progressing.")] = 0.0,
        levels: Annotated[str | None, typer.Option("--attained-service-levels", help=(
            "attained-service only: the levels' thresholds in GPU-seconds, e.g. 3250,7200 (Tiresias'); "
            "default the policy's own."))] = None,
        starvation: Annotated[str | None, typer.Option("--starvation-factor", help=(
            "attained-service only: a waiting job counts as level 0 once it has waited this many times "
            "as long as it has run; 0 turns the guard off. Default the policy's own."))] = None,
        order: Annotated[str | None, typer.Option("--attained-service-order", help=(
            "attained-service only: the order within a level, fewest-gpus (the default: the fewest GPUs "
            "first, then first come first served) or fifo (first come first served, as Tiresias)."))] = None,
        seed: Annotated[int, typer.Option("--seed", help=(
            "Where the replay's random choices come from (generated names, ties); the same seed, "
            "the same replay."))] = 0,
        events: Annotated[bool, typer.Option("--events/--no-events", help=(
            "Also record Events and refresh waiting workloads' messages, as a live cluster does "
            "(the same figures, about 1.4x slower)."))] = False,
        limit: Annotated[int | None, typer.Option("--limit", help="Only the first N jobs (by submit time).")] = None,
        output: Annotated[str, typer.Option("--output", "-o", help="table or json.")] = "table",
    ) -> None:
        """Replay a GPU-cluster trace through the real API server, scheduler and queues."""
        from gpufleet.cli.simulate.engine import Progress
        from gpufleet.cli.simulate.engine import simulate as run_sim
        from gpufleet.cli.simulate.trace import TraceError, read_trace

        try:
            n, _, g = nodes.partition("x")
            n_nodes, per_node = int(n), int(g)
            if n_nodes <= 0 or per_node <= 0:
                raise ValueError
        except ValueError:
            raise typer.BadParameter(f"{nodes!r}: give NODESxGPUS, e.g. 8x8", param_hint="--nodes") from None
        if output not in ("table", "json"):
            raise typer.BadParameter(f"{output!r}: choose table or json", param_hint="--output")
        try:
            jobs = read_trace(trace, limit)
        except TraceError as exc:
            err(f"error: {exc}")
            raise typer.Exit(1) from None

        def progress(p: Progress) -> None:
            width = 30
            filled = width * p.done // p.total
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {p.done}/{p.total} jobs, "
                             f"virtual day {p.now / 86400:.1f}, {p.running} running, "
                             f"{p.submitted - p.done - p.running} waiting, {p.preemptions} preemptions ")
            if p.done == p.total:
                sys.stderr.write("\n")
            sys.stderr.flush()

        async def replay():
            # Ctrl-C (or SIGTERM) ends the replay at the next clock jump with the figures of
            # the jobs finished so far, marked "interrupted"; a second one stops at once.
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()

            def release() -> None:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    with contextlib.suppress(NotImplementedError, RuntimeError):
                        loop.remove_signal_handler(sig)

            def interrupt() -> None:
                stop.set()
                release()  # the next signal acts as it always does
                err("\nstopping: the figures of the jobs finished so far follow (Ctrl-C again to quit at once)")

            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, interrupt)
            try:
                return await run_sim(jobs, nodes=n_nodes, gpus_per_node=per_node, policy=policy,
                                     restart_overhead=restart_overhead, progress=progress, levels=levels,
                                     starvation=starvation, seed=seed, events=events, stop=stop.is_set,
                                     order=order)
            finally:
                release()

        try:
            result = asyncio.run(replay())
        except ValueError as exc:
            err(f"error: {exc}")
            raise typer.Exit(1) from None
        figures = result.figures()
        if output == "json":
            typer.echo(json.dumps(figures, indent=2))
            return
        for key, value in figures.items():
            typer.echo(f"{key:<26}{value:.3f}" if isinstance(value, float) else f"{key:<26}{value}")
