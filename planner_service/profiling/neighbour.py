"""A neighbour rank for ``planner profile --concurrent N``.

Training ranks that share a host share its memory bandwidth, last-level cache and power budget:
one rank of N runs its operators slower than the same process alone.  The profiler measures that
share by starting N − 1 of these processes next to itself: each builds the same CPU
micro-benchmarks and runs them in the same order with the same timing settings — so they stay
roughly in step with the measuring process, as ranks of a data-parallel step do — until it is
terminated.  Its own timings are discarded.

Usage (started by :func:`planner_service.profiling.runner.start_neighbours`):
``python -m planner_service.profiling.neighbour --threads T --backends torch,numpy [--quick]``
"""

from __future__ import annotations

import argparse
import sys

from planner_service.profiling.fingerprint import numpy_blas_threads
from planner_service.profiling.runner import (
    cpu_backend_switcher,
    cpu_cases,
    import_torch,
)
from planner_service.profiling.timing import TimingSettings, measure


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
    settings = TimingSettings.quick() if args.quick else TimingSettings()
    switch = cpu_backend_switcher(torch, args.threads)
    print("ready", flush=True)
    while True:  # until terminated by the measuring process
        previous = None
        for case in cases:
            if case.fields.get("backend") != previous:
                previous = case.fields.get("backend")
                switch(previous)
            fn, sync = case.setup()
            measure(fn, settings, sync)
            del fn


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
