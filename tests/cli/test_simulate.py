"""`gpufleet simulate`: a small synthetic trace replays through the real control plane in
virtual time, with FIFO's exact completion times."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.cli.simulate.engine import simulate
from gpufleet.cli.simulate.trace import TraceError, read_trace

TRACES = Path(__file__).parent / "traces"


async def test_fifo_replay_on_one_node_gives_the_exact_times():
    jobs = read_trace(TRACES / "small.csv")
    result = await simulate(jobs, nodes=1, gpus_per_node=8, policy="fifo", batching=False)
    times = {j.trace.name: (j.first_start, j.finished) for j in result.jobs}
    # a holds all 8 GPUs until 100; b and c share them until 150; d waits behind them (FIFO).
    assert times == {"a": (0.0, 100.0), "b": (100.0, 150.0), "c": (100.0, 150.0), "d": (150.0, 160.0)}
    f = result.figures()
    assert f["avgJCTSeconds"] == pytest.approx((100 + 140 + 130 + 130) / 4)
    assert f["makespanSeconds"] == pytest.approx(160.0)
    assert f["gpuUtilization"] == pytest.approx((800 + 200 + 200 + 10) / (8 * 160))
    assert f["preemptions"] == 0


async def test_the_controllers_batch_periods_delay_a_replay_by_seconds():
    # What a live cluster's defaults do: the admission cycle waits 0.1 s after what woke it,
    # the Job controller 1 s after its pods' events, so the next job starts ~1.2 s after one
    # finishes; each hand-over adds that much, no more.
    jobs = read_trace(TRACES / "small.csv")
    result = await simulate(jobs, nodes=1, gpus_per_node=8, policy="fifo")
    exact = {"a": (0.0, 100.0), "b": (100.0, 150.0), "c": (100.0, 150.0), "d": (150.0, 160.0)}
    handovers = {"a": 0, "b": 1, "c": 1, "d": 2}
    for name, (start, end) in _times(result).items():
        late = 0.1 + 1.2 * handovers[name]
        assert exact[name][0] < start <= exact[name][0] + late + 0.01, (name, start)
        assert end == pytest.approx(start + exact[name][1] - exact[name][0])


def test_muri_rows_are_read_in_milliseconds(tmp_path: Path):
    p = tmp_path / "muri.csv"
    p.write_text("job_id,num_gpu,submit_time,iterations,model_name,batch_size,duration,interval,iteration_time,"
                 "resource_time_0,resource_time_1,resource_time_2,priority\n"
                 "0,16,2000,1000,vgg16,16,500000,0,500,0,0,0,1\n")
    (job,) = read_trace(p)
    assert (job.name, job.submit, job.gpus, job.duration, job.steps, job.priority) == ("job-0", 2.0, 16, 500.0, 1000, 1)


def test_a_bad_row_names_the_field(tmp_path: Path):
    p = tmp_path / "bad.csv"
    p.write_text("submit_time,gpus,duration\n0,two,10\n")
    with pytest.raises(TraceError, match=r"row 1: field 'gpus'='two' is not a number"):
        read_trace(p)


def _times(result) -> dict[str, tuple[float | None, float | None]]:
    return {j.trace.name: (j.first_start, j.finished) for j in result.jobs}


async def test_attained_service_lets_a_short_job_overtake_a_long_one():
    jobs = read_trace(TRACES / "overtake.csv")  # long: 8 GPUs x 20,000 s; short at 1,000 s
    fifo = await simulate(jobs, nodes=1, gpus_per_node=8, policy="fifo", batching=False)
    las = await simulate(jobs, nodes=1, gpus_per_node=8, policy="attained-service", batching=False)
    assert _times(fifo) == {"long": (0.0, 20000.0), "short": (20000.0, 20300.0)}
    # long has 8,000 GPU-s at 1,000 s (level 1): the new job (level 0) preempts it, and long
    # resumes from its checkpoint when short is done.
    assert _times(las) == {"long": (0.0, 20300.0), "short": (1000.0, 1300.0)}
    assert las.figures()["preemptions"] == 1 and fifo.figures()["preemptions"] == 0


async def test_shortest_remaining_service_keeps_a_nearly_done_job_running():
    jobs = read_trace(TRACES / "nearly-done.csv")  # 8 GPUs x 20,000 steps; 5,000 steps at 19,000 s
    las = await simulate(jobs, nodes=1, gpus_per_node=8, policy="attained-service", batching=False)
    srs = await simulate(jobs, nodes=1, gpus_per_node=8, policy="shortest-remaining-service", batching=False)
    # Attained service only knows the runner has had a lot: the newcomer preempts it.
    assert _times(las) == {"nearly-done": (0.0, 25000.0), "newcomer": (19000.0, 24000.0)}
    # Shortest remaining service runs the unmeasured newcomer for its two progress reports
    # (its first step, and 60 s later), measures 1 s a step, and gives the GPUs back to the
    # job that has 1,000 steps left; the newcomer resumes from its checkpoint after it.
    times = _times(srs)
    assert times["nearly-done"] == (0.0, pytest.approx(20061.0))
    assert times["newcomer"] == (19000.0, pytest.approx(25000.0))
    assert srs.figures()["preemptions"] == 2


async def test_restart_overhead_is_charged_on_the_resumed_job():
    jobs = read_trace(TRACES / "overtake.csv")
    las = await simulate(jobs, nodes=1, gpus_per_node=8, policy="attained-service", restart_overhead=60.0,
                         batching=False)
    assert _times(las) == {"long": (0.0, 20360.0), "short": (1000.0, 1300.0)}


def _ties_trace(tmp_path: Path) -> list:
    """40 random jobs of 1 to 4 GPUs, many submitted at once: ties for 2 nodes of 4."""
    rng = random.Random(7)
    rows, t = ["submit_time,gpus,duration"], 0
    for _ in range(40):
        t += rng.choice([0, 0, 5, 30])
        rows.append(f"{t},{rng.choice([1, 1, 2, 3, 4])},{rng.choice([50, 100, 100, 400, 1000])}")
    p = tmp_path / "ties.csv"
    p.write_text("\n".join(rows) + "\n")
    return read_trace(p)


async def test_a_replay_with_the_same_seed_is_the_same_replay(tmp_path: Path):
    # 40 jobs of 1 to 4 GPUs on 2 nodes of 4: which node a pod lands on among equals, and the
    # names that break ties, change what fits later; the seed fixes them all.
    jobs = _ties_trace(tmp_path)
    runs = [_times(await simulate(jobs, nodes=2, gpus_per_node=4, policy="fifo", seed=seed)) for seed in (0, 0, 1)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]  # the seed is what decides them


@pytest.mark.parametrize("policy", ["fifo", "attained-service"])
async def test_events_and_message_refreshes_change_no_figure(tmp_path: Path, policy: str):
    # A replay writes no Events and refreshes no waiting workload's message unless asked
    # (--events): both are what a user reads, not what decides, so every job starts and ends
    # at the same times either way (attained-service preempts on this trace).
    jobs = _ties_trace(tmp_path)
    quiet = await simulate(jobs, nodes=2, gpus_per_node=4, policy=policy)
    loud = await simulate(jobs, nodes=2, gpus_per_node=4, policy=policy, events=True)
    assert _times(quiet) == _times(loud)
    assert sum(j.preemptions for j in quiet.jobs) == sum(j.preemptions for j in loud.jobs)
    if policy == "attained-service":
        assert sum(j.preemptions for j in quiet.jobs) > 0


async def test_a_stopped_replay_gives_the_figures_of_the_jobs_finished_so_far(tmp_path: Path):
    rows = ["submit_time,gpus,duration"] + [f"{10 * i},8,{100 + i}" for i in range(12)]
    p = tmp_path / "serial.csv"
    p.write_text("\n".join(rows) + "\n")
    jobs = read_trace(p)
    done = [0]

    def progress(pr) -> None:
        done[0] = pr.done

    result = await simulate(jobs, nodes=1, gpus_per_node=8, policy="fifo", progress=progress,
                            stop=lambda: done[0] >= 4)
    figures = result.figures()
    assert result.interrupted and figures["interrupted"] is True
    assert 4 <= figures["finished"] < len(jobs) == figures["jobs"]
    assert figures["virtualSecondsReplayed"] > 0
    whole = (await simulate(jobs, nodes=1, gpus_per_node=8, policy="fifo")).figures()
    assert "interrupted" not in whole and whole["finished"] == len(jobs)
    # FIFO one at a time: the first jobs end at the same times either way.
    finished = sorted(j.finished for j in result.jobs if j.finished is not None)
    assert finished == sorted(j.finished for j in
                              (await simulate(jobs, nodes=1, gpus_per_node=8, policy="fifo")).jobs)[:len(finished)]


def test_ctrl_c_ends_the_command_with_the_figures_so_far(tmp_path: Path):
    rows = ["submit_time,gpus,duration"] + [f"{10 * i},8,{100 + i}" for i in range(3000)]
    p = tmp_path / "long.csv"
    p.write_text("\n".join(rows) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli.main", "simulate", "--trace", str(p), "--nodes", "1x8",
                             "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = ""
        while " 3/3000 jobs" not in seen and "] 4/3000" not in seen and proc.poll() is None:
            seen += proc.stderr.read(1)
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, seen + rest
    figures = json.loads(out[out.index("{"):])
    assert figures["interrupted"] is True and 3 <= figures["finished"] < 3000
    assert "stopping: the figures of the jobs finished so far follow" in rest


def test_the_command_gives_levels_to_the_queue_and_refuses_bad_ones(tmp_path: Path):
    runner = CliRunner()
    trace = str(TRACES / "overtake.csv")
    r = runner.invoke(app, ["simulate", "--trace", trace, "--nodes", "1x8", "--policy", "attained-service",
                            "--attained-service-levels", "3250,7200", "-o", "json"])
    assert r.exit_code == 0, r.output
    figures = json.loads(r.stdout[r.stdout.index("{"):])
    # long has 8,000 GPU-s at 1,000 s: above 7,200, so at the last level; short preempts it.
    assert figures["attainedServiceLevels"] == "3250,7200" and figures["preemptions"] == 1
    assert figures["starvationFactor"] == 0.0  # the policy's own: no guard
    assert figures["attainedServiceOrder"] == "fewest-gpus"  # the policy's own
    r = runner.invoke(app, ["simulate", "--trace", trace, "--nodes", "1x8", "--policy", "attained-service",
                            "--starvation-factor", "4", "-o", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout[r.stdout.index("{"):])["starvationFactor"] == 4.0
    r = runner.invoke(app, ["simulate", "--trace", trace, "--nodes", "1x8", "--policy", "attained-service",
                            "--attained-service-order", "fifo", "-o", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout[r.stdout.index("{"):])["attainedServiceOrder"] == "fifo"
    r = runner.invoke(app, ["simulate", "--trace", trace, "--policy", "attained-service",
                            "--attained-service-order", "shortest"])
    assert r.exit_code == 1 and "supported values: fewest-gpus, fifo" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["simulate", "--trace", trace, "--policy", "fifo", "--attained-service-order", "fifo"])
    assert r.exit_code == 1 and "the order within a level is for the attained-service policy" in r.output
    r = runner.invoke(app, ["simulate", "--trace", trace, "--policy", "attained-service", "--starvation-factor", "-2"])
    assert r.exit_code == 1 and "must be 0 (no guard) or more" in r.output
    r = runner.invoke(app, ["simulate", "--trace", trace, "--policy", "attained-service",
                            "--attained-service-levels", "7200,3250"])
    assert r.exit_code == 1 and "each above the one before" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["simulate", "--trace", trace, "--policy", "fifo", "--attained-service-levels", "60"])
    assert r.exit_code == 1 and "levels are for the attained-service policy" in r.output
    r = runner.invoke(app, ["simulate", "--trace", str(tmp_path / "none.csv")])
    assert r.exit_code == 1 and "cannot read the trace" in r.output


async def test_a_replay_reports_its_progress_as_jobs_finish():
    jobs = read_trace(TRACES / "overtake.csv")
    seen = []
    las = await simulate(jobs, nodes=1, gpus_per_node=8, policy="attained-service", progress=seen.append)
    # short finishes first, while long waits preempted; then long.
    assert [(p.done, p.total) for p in seen if p.done] == [(1, 2), (2, 2)]
    first = next(p for p in seen if p.done == 1)
    assert (first.submitted, first.running, first.preemptions) == (2, 0, 1)
    assert seen[-1].preemptions == las.figures()["preemptions"] == 1
    assert seen[-1].now == pytest.approx(max(j.finished for j in las.jobs))
