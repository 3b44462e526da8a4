"""examples/training/train.py in a world of one: --init-process-group joins a real process
group (gloo here, nccl on a GPU) and checks an all-reduce; without it no group is made."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "training" / "train.py"


def _run(tmp_path: Path, *args: str) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "1", "RANK": "0",
           "GPUFLEET_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run([sys.executable, str(TRAIN), "--steps", "20", *args], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_init_process_group_joins_a_group_of_one_and_checks_an_all_reduce(tmp_path: Path) -> None:
    out = _run(tmp_path, "--init-process-group")
    line = re.search(r"^backend=(\w+) nccl=(\S+) device=(\S+) \((.*)\) all_reduce=(\S+) want=(\S+) "
                     r"world_size=1 rank=0$", out, re.M)
    assert line, out
    assert line.group(1) == "gloo" and line.group(3) == "cpu"
    assert line.group(5) == line.group(6) == "1"
    assert "done step=20 world_size=1 rank=0" in out


def test_without_the_flag_a_world_of_one_makes_no_group(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert "backend=" not in out
    assert "done step=20 world_size=1 rank=0" in out
