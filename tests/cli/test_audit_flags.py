"""The audit flags of `gpufleet up` and `gpufleet server`: refused at once, naming the flag and
the field, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.commands.up import audit_options
from gpufleet.cli.main import app


@pytest.mark.parametrize("command", ["up", "server"])
def test_bad_audit_flags_are_refused_naming_the_flag(command: str, tmp_path: Path) -> None:
    runner = CliRunner()
    # A free API port and no gateway: were they to start, nothing fixed is bound.
    state = ["--state-dir", str(tmp_path / "state"), "--port", "0", "--gateway-port", "-1"]
    r = runner.invoke(app, [command, *state, "--audit-log-path", str(tmp_path / "audit.log")])
    assert r.exit_code == 2
    assert "--audit-policy-file" in r.output and "needs" in r.output
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n  - level: All\n")
    r = runner.invoke(app, [command, *state, "--audit-policy-file", str(policy),
                            "--audit-log-path", str(tmp_path / "audit.log")])
    assert r.exit_code == 2
    assert 'rules[0].level: Unsupported value: "All"' in " ".join(r.output.split())
    assert not (tmp_path / "audit.log").exists()


def test_audit_options_give_the_control_plane_its_policy_and_log(tmp_path: Path) -> None:
    assert audit_options(None, None) == {}
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n  - level: Metadata\n")
    got = audit_options(policy, str(tmp_path / "logs" / "audit.log"), 100, 3, 7)
    assert got["audit_log_path"] == str(tmp_path / "logs" / "audit.log")
    assert got["audit_policy"].rules[0].level == "Metadata"
    opts = got["audit_log_options"]
    assert (opts.max_size_mb, opts.max_backups, opts.max_age_days) == (100, 3, 7)
    assert audit_options(policy, "-")["audit_log_path"] == "-"
