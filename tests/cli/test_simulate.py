"""`gpufleet simulate`: a small synthetic trace replays through the real control plane in
virtual time, with FIFO's exact completion times."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.cli.simulate.engine import simulate
from gpufleet.cli.simulate.trace import TraceError, read_trace

TRACES = Path(__file__).parent / "traces"


async def test_fifo_replay_on_one_node_gives_the_exact_times():
    jobs = read_trace(TRACES / "small.csv")
    result = await simulate(jobs, nodes=1, gpus_per_node=8, policy="fifo")
    times = {j.trace.name: (j.first_start, j.finished) for j in result.jobs}
    # a holds all 8 GPUs until 100; b and c share them until 150; d waits behind them (FIFO).
    assert times == {"a": (0.0, 100.0), "b": (100.0, 150.0), "c": (100.0, 150.0), "d": (150.0, 160.0)}
    f = result.figures()
    assert f["avgJCTSeconds"] == pytest.approx((100 + 140 + 130 + 130) / 4)
    assert f["makespanSeconds"] == pytest.approx(160.0)
    assert f["gpuUtilization"] == pytest.approx((800 + 200 + 200 + 10) / (8 * 160))
    assert f["preemptions"] == 0


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
