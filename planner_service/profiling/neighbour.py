"""A neighbour rank for ``planner profile --concurrent N``.

Training ranks that share a host share its memory bandwidth, last-level cache and power budget:
one rank of N runs its operators slower than the same process alone.  The profiler measures that
share by starting N − 1 of these processes next to itself: each builds the same CPU
micro-benchmarks and runs, over and over, the one the measuring process is timing — its index
read from stdin, one line per case (:func:`follow_cases`) — so every operator is timed beside
copies of itself, as the ranks of a data-parallel step run the same operators at once, until
it is terminated or stdin closes.  (Running the list on its own, in the same order with the
same timing settings, drifted out of step: each process stops a benchmark when its own time
budget is spent, so a GEMM could be timed beside a neighbour's memory copy.)  Nothing it runs
is timed.

Usage (started by :func:`planner_service.profiling.runner.start_neighbours`):
``python -m planner_service.profiling.neighbour --threads T --backends torch,numpy [--quick]``
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from planner_service.profiling.fingerprint import numpy_blas_threads
from planner_service.profiling.runner import (
    cpu_backend_switcher,
    cpu_cases,
    import_torch,
)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--backends", default="numpy,torch")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    backends = tuple(b for b in args.backends.split(",") if b)
    torch = import_torch() if "torch" in backends else None
    numpy_blas_threads(args.threads)
    if torch is not None:
        torch.set_num_threads(args.threads)
    cases, _ = cpu_cases(torch, args.quick, backends)
    switch = cpu_backend_switcher(torch, args.threads)
    current = {"index": 0, "open": True}

    def read_indices() -> None:
        for i in index_lines(sys.stdin, len(cases)):
            current["index"] = i
        current["open"] = False  # the measuring process closed the pipe: stop

    threading.Thread(target=read_indices, daemon=True).start()
    print("ready", flush=True)
    follow_cases(cases, lambda: current["index"] if current["open"] else None, switch)
    return 0


def index_lines(lines: Iterable[str], count: int) -> Iterable[int]:
    """The case indices the measuring process sends, one per line (others ignored)."""
    for line in lines:
        text = line.strip()
        if text.isdigit() and int(text) < count:
            yield int(text)


def follow_cases(cases: Sequence[Any], index: Callable[[], int | None], switch: Callable[[str | None], None]) -> int:
    """Run the case ``index()`` names, untimed, until it names another (set up anew) or None
    (return).  Returns how many times a case was set up."""
    backend = None
    setups = 0
    i = index()
    while i is not None:
        case = cases[i]
        if case.fields.get("backend") != backend:
            backend = case.fields.get("backend")
            switch(backend)
        fn, sync = case.setup()
        setups += 1
        while (nxt := index()) == i:
            fn()
            sync()
        del fn
        i = nxt
    return setups


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
