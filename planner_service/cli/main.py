"""The ``planner`` command line.  Each area registers its commands from its own module
(``register(app)``) so the root stays small."""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperGroup

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


#: Metavars by option name where the name alone does not say what to type.
METAVARS = {
    "server": "URL", "upload": "URL", "database_url": "URL", "env": "KEY=VALUE", "out": "PATH",
    "plan": "ID|FILE", "files": "FILE", "file": "FILE",
}


def _metavar(param: Any) -> str:
    """What a person types: ``FILE``, ``URL``, ``N``, or the option's name in capitals."""
    name = param.name or ""
    many = "..." if param.nargs != 1 else ""
    if name in METAVARS:
        return METAVARS[name]
    desc = getattr(param, "type_descriptor", None)
    kind = str(getattr(desc, "annotation", ""))
    if "Path" in kind:
        return "FILE" + many
    if "int" in kind:
        return "N"
    if "float" in kind:
        return "NUMBER"
    return name.upper().replace("_", "-") + many


def readable_help(cmd: Any) -> Any:
    """Help a person reads: every option and argument shows a metavar such as ``FILE`` or
    ``URL`` (typer's default is the Python type, ``<path>``, ``<list[Path]>``), flags show
    none, and arguments no second type column.  Walks the click command typer builds (typer
    vendors click, so parameters are recognised by their ``param_type_name``)."""
    for param in cmd.params:
        if param.param_type_name == "option" and (param.is_flag or param.count):
            param.metavar = ""
        elif param.metavar is None:
            param.metavar = _metavar(param)
        if param.param_type_name == "argument":
            # typer prints an argument's Python type beside its metavar; the metavar says it.
            param.display_type_rich = lambda ctx: None
    make_help_option = cmd.get_help_option

    def help_option(ctx: Any) -> Any:
        option = make_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    cmd.get_help_option = help_option
    for sub in (getattr(cmd, "commands", None) or {}).values():
        readable_help(sub)
    return cmd


class ReadableGroup(TyperGroup):
    """The root command: :func:`readable_help` over the whole tree before it runs."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        readable_help(self)
        return super().main(*args, **kwargs)


app = typer.Typer(help="Auto-parallel planner: estimate, plan, serve, profile, launch.", no_args_is_help=True, add_completion=False,
                  cls=ReadableGroup)


def main() -> None:
    _register_all()
    app(prog_name="planner")


if __name__ == "__main__":  # pragma: no cover
    main()
