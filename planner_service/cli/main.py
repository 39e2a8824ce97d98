"""The ``planner`` command line.  Each area registers its commands from its own module
(``register(app)``) so the root stays small."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(help="Auto-parallel planner: estimate, plan, serve, profile, launch.", no_args_is_help=True, add_completion=False)

#: Modules that define ``register(app: typer.Typer)``.
COMMAND_MODULES = (
    "planner_service.cli.estimate",
    "planner_service.cli.launch",
    "planner_service.cli.cluster",
    "planner_service.cli.plan",
    "planner_service.cli.serve",
    "planner_service.cli.profile",
    "planner_service.cli.keys",
    "planner_service.cli.observe",
)


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


def main() -> None:
    _register_all()
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
