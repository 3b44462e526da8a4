"""--cluster-cidr and --node-cidr-mask-size of `gpufleet up` and `gpufleet server`: the pod
network each node's subnet is cut from, checked before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gpufleet.cli.commands.serveroptions import check_cluster_cidr
from gpufleet.cli.main import app


def test_a_cluster_cidr_is_normalized_once_it_holds_a_node_subnet() -> None:
    assert check_cluster_cidr("10.0.0.1/12", 24) == "10.0.0.0/12"
    assert check_cluster_cidr("fd00::/48", 64) == "fd00::/48"
    with pytest.raises(typer.BadParameter, match="not a CIDR"):
        check_cluster_cidr("10.0.0.0/33", 24)
    with pytest.raises(typer.BadParameter, match=r"/8 does not fit in 10.244.0.0/16: give a prefix length from 16"):
        check_cluster_cidr("10.244.0.0/16", 8)
    with pytest.raises(typer.BadParameter, match="to 30"):
        check_cluster_cidr("10.244.0.0/16", 31)


@pytest.mark.parametrize("command", ["up", "server"])
def test_bad_cluster_cidr_flags_are_refused_naming_the_flag(command: str, tmp_path: Path) -> None:
    runner = CliRunner()
    state = ["--state-dir", str(tmp_path / "state"), "--port", "0", "--gateway-port", "-1"]
    r = runner.invoke(app, [command, *state, "--cluster-cidr", "10.300.0.0/16"])
    assert r.exit_code == 2
    assert "--cluster-cidr" in r.output and "not a CIDR" in r.output
    r = runner.invoke(app, [command, *state, "--cluster-cidr", "10.0.0.0/12", "--node-cidr-mask-size", "8"])
    assert r.exit_code == 2
    assert "--node-cidr-mask-size" in r.output
    assert not (tmp_path / "state").exists()
