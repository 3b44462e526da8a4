"""The `gpufleet` command. Each subcommand lives in its own module under cli/commands/.

`app` has every command. `main()`, the installed `gpufleet`, loads only the module of the
command it was given when that module is named after it (`gpufleet agent ...` loads
cli/commands/agent.py alone), so that a long-running process such as a node agent does not
carry every other command's imports (the API's typed models among them, about 20 MiB).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer

# module name -> the commands it defines with `register(app)`
_COMMAND_MODULES = ["up", "server", "apply", "get", "describe", "delete", "scale", "cordon", "version", "agent", "logs", "top", "token", "export", "simulate"]


def build(only: str | None = None) -> typer.Typer:
    """The command with every subcommand, or only those of the module ``only``."""
    cli = typer.Typer(
        name="gpufleet",
        help="Run deep learning on a fleet of GPU servers, with the Kubernetes API.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    if only is not None:
        # One command alone would become the whole program (`gpufleet --name x` instead of
        # `gpufleet agent --name x`); a callback keeps it a subcommand.
        cli.callback()(lambda: None)
    for name in [only] if only is not None else _COMMAND_MODULES:
        try:
            module = importlib.import_module(f"gpufleet.cli.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"gpufleet.cli.commands.{name}":
                continue
            raise
        module.register(cli)
    return cli


def __getattr__(name: str) -> Any:
    if name == "app":
        cli = globals()["app"] = build()
        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else None
    build(command if command in _COMMAND_MODULES else None)()


if __name__ == "__main__":
    main()
