"""Helpers shared by the CLI commands: reading request files, printing errors, batch lines."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from cost_model.errors import PlannerError

#: Exit codes: 0 ok, 1 the command failed at run time, 2 bad input (file unreadable, invalid request).
EXIT_BAD_INPUT = 2

console = Console()
err_console = Console(stderr=True)


def step_interval(p10: float | None, p90: float | None, regime: str | None) -> str:
    """`` (p10–p90 a–b s, regime r)`` after a step time, or nothing where the cost model has no
    interval (an uncalibrated regime: operator graphs, CPU profiles)."""
    if p10 is None or p90 is None:
        return ""
    return f"  (p10–p90 {p10:.4g}–{p90:.4g} s" + (f", regime {regime}" if regime else "") + ")"


def read_json_file(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        err_console.print(f"[red]error:[/red] cannot read {path}: {exc.strerror or exc}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        err_console.print(f"[red]error:[/red] {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
        raise typer.Exit(EXIT_BAD_INPUT) from None


def fail(exc: PlannerError, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"error": exc.to_dict()}))
    else:
        where = f" ({exc.field})" if exc.field else ""
        err_console.print(f"[red]error{where}:[/red] {exc.message}")
    raise typer.Exit(EXIT_BAD_INPUT)


def run_batch(path: Path, handle: Callable[[dict], dict]) -> None:
    """One JSON line out per input line, in order; a bad line prints ``{"error": …}`` and the
    rest go on.  Only an unreadable file makes the exit code non-zero."""
    try:
        fh = path.open()
    except OSError as exc:
        err_console.print(f"[red]error:[/red] cannot read {path}: {exc.strerror or exc}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                print(json.dumps({"error": {"code": "invalid_input", "message": "empty line", "field": f"line {lineno}"}}))
                continue
            try:
                body = json.loads(line)
            except json.JSONDecodeError as exc:
                print(json.dumps({"error": {"code": "invalid_json", "message": f"not valid JSON: {exc.msg} at column {exc.colno}", "field": f"line {lineno}"}}))
                continue
            try:
                print(json.dumps(handle(body)), flush=True)
            except PlannerError as exc:
                print(json.dumps({"error": exc.to_dict()}), flush=True)
            except Exception as exc:  # noqa: BLE001 - one bad line must not stop the batch
                print(json.dumps({"error": {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}", "field": None}}), flush=True)


#: ``--batch FILE`` of the commands that take one request per JSON line (estimate, plan).
BatchFileOption = Annotated[
    Path | None, typer.Option("--batch", metavar="FILE", help="JSON Lines file: one request per line; one JSON line out per line.")
]
#: ``--profile FILE``: an operator profile applied to the device it was taken on (estimate, plan).
ProfileFileOption = Annotated[
    Path | None, typer.Option("--profile", metavar="FILE", help="Operator profile JSON to apply to the device it was taken on.")
]
