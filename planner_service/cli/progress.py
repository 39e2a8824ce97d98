"""Progress bars for long CLI work, on stderr, only where a person is watching.

A batch's JSON lines go to stdout; the bar is drawn only when stderr is a terminal and stdout
is not (``planner estimate --batch FILE --json > out.jsonl``), so it never mixes with the
output a script reads.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from planner_service.cli.common import err_console


def _count_lines(path: Path) -> int | None:
    try:
        with path.open("rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return None  # run_batch reports the unreadable file


@contextmanager
def batch_progress(path: Path, handle: Callable[[dict], Any], what: str) -> Iterator[Callable[[dict], Any]]:
    """``handle`` wrapped so that each call advances a bar of the file's lines (or ``handle``
    itself where no bar is shown)."""
    total = _count_lines(path)
    if total is None or not err_console.is_terminal or sys.stdout.isatty():
        yield handle
        return
    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err_console,
                  transient=True, redirect_stdout=False, redirect_stderr=False) as prog:
        task = prog.add_task(what, total=total)

        def counted(body: dict) -> Any:
            try:
                return handle(body)
            finally:
                prog.advance(task)

        yield counted
