"""The `gpufleet` command. Each subcommand lives in its own module under cli/commands/."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="gpufleet",
    help="Run deep learning on a fleet of GPU servers, with the Kubernetes API.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# module name -> the commands it defines with `register(app)`
_COMMAND_MODULES = ["up", "server", "apply", "get", "describe", "delete", "scale", "cordon", "version", "agent", "logs", "top", "token", "export", "simulate"]


def _register() -> None:
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(f"gpufleet.cli.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"gpufleet.cli.commands.{name}":
                continue
            raise
        module.register(app)


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
