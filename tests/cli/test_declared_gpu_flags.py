"""Declared GPUs on `gpufleet up` and `gpufleet agent` are checked before anything starts: a
model whose memory cannot be read is refused naming the flags and the fix; --gpu-memory fixes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.agent.factory import check_declared
from gpufleet.cli.main import app


def test_check_declared_takes_the_memory_from_the_model_or_the_flag() -> None:
    check_declared(None, "anything")
    check_declared(2, "H100-SXM-80GB")
    check_declared(2, "my-accelerator", 40960)
    check_declared(0, "my-accelerator")
    with pytest.raises(ValueError, match=r"cannot be read from the model name 'my-accelerator'.*--gpu-memory"):
        check_declared(2, "my-accelerator")


@pytest.mark.parametrize("command", ["up", "agent"])
def test_a_declared_model_without_memory_is_refused_before_anything_starts(command: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    where = ["--port", "0", "--gateway-port", "-1"] if command == "up" else ["--server", "http://127.0.0.1:1"]
    r = CliRunner().invoke(app, [command, "--state-dir", str(state), *where, "--gpus", "2",
                                 "--gpu-model", "my-accelerator"], env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert "--gpu-memory" in r.output and "'my-accelerator'" in r.output
    assert not state.exists()
