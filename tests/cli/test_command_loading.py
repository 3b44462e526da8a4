"""`gpufleet <command>` loads only that command's module, and a node agent's code never loads
the API's typed models (they are about 20 MiB of a process that works on JSON)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner


def _python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_agent_and_its_command_load_no_typed_models():
    loaded = _python(
        "import sys\n"
        "from gpufleet.cli import main\n"
        "main.build('agent')\n"
        "import gpufleet.agent.agent\n"
        "print(sorted(m for m in ('gpufleet.api.k8s', 'gpufleet.cli.commands.get', 'gpufleet.apiserver.server')"
        " if m in sys.modules))\n")
    assert loaded == "[]"


# The installed command, beside this interpreter (its usage line says `gpufleet`).
GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))


def test_a_command_run_alone_is_still_a_subcommand():
    out = subprocess.run([GPUFLEET, "agent", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Usage: gpufleet agent [OPTIONS]" in " ".join(out.stdout.split())
    out = subprocess.run([GPUFLEET, "agent", "--no-such-flag"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "No such option: --no-such-flag" in out.stderr + out.stdout


def test_the_whole_command_still_has_every_subcommand():
    from gpufleet.cli.main import app
    out = CliRunner().invoke(app, ["--help"]).output
    for name in ("up", "server", "agent", "apply", "get", "describe", "uncordon", "drain", "token", "simulate"):
        assert f" {name} " in out, name


def test_validation_names_load_from_their_modules_on_first_use():
    loaded = _python(
        "import sys\n"
        "from gpufleet.api.validation import is_label_value, FieldError\n"
        "a = 'gpufleet.api.validation.dispatch' in sys.modules\n"
        "from gpufleet.api import validation\n"
        "b = validation.validate_create is not None and 'gpufleet.api.validation.dispatch' in sys.modules\n"
        "print(a, b, is_label_value('ok') == [], validation.errors.FieldError is FieldError)\n")
    assert loaded == "False True True True"
