"""Run the micro-benchmarks of one device and assemble a schema-v1 profile (see
docs/PROFILE_FORMAT.md).  The fit (cost_model.profiles.fit_profile) is attached by the caller."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import importlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cost_model.errors import InvalidProfile
from cost_model.profiles import SCHEMA_NAME, SCHEMA_VERSION
from planner_service.profiling import numpy_backend
from planner_service.profiling.cases import Case
from planner_service.profiling.collectives import planned_count, run_collectives
from planner_service.profiling.fingerprint import (
    HostMonitor,
    cpu_count,
    cpu_fingerprint,
    cuda_fingerprint,
    host_busy_cores,
    numpy_blas_threads,
    wait_until_quiet,
)
from planner_service.profiling.timing import TimingSettings, measure

#: progress(label, done, total)
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class ProfileOptions:
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"
    quick: bool = False
    threads: int | None = None  # CPU threads (numpy BLAS and torch); default: all cores
    backends: tuple[str, ...] = ("numpy", "torch")  # torch used only when importable
    collectives: bool = True
    world_size: int | None = None  # ranks for the collective benchmark (default: CPU 2, CUDA all GPUs)
    device_name: str | None = None  # catalog name override for GPUs
    #: CPU only: re-take a measurement during which other processes kept this many cores busy
    #: (after waiting for the host to be quiet), spending at most ``max_wait_s`` waiting in all.
    quiet_threshold_cores: float = 0.3
    #: CPU only: ranks sharing the host while measuring.  With N > 1, N − 1 neighbour processes
    #: run the same micro-benchmarks at the same time (:mod:`.neighbour`), so the profile is the
    #: share of the host (memory bandwidth, last-level cache, clock) one of N ranks gets.
    concurrent: int = 1
    max_wait_s: float | None = None  # default: 20 s for --quick (it must stay short), else 120 s


def import_torch() -> Any | None:
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


def parse_device(value: str) -> tuple[str, int | None]:
    m = re.fullmatch(r"(cpu|cuda)(?::(\d+))?", value.strip().lower())
    if not m or (m.group(1) == "cpu" and m.group(2) is not None):
        raise InvalidProfile(f"must be 'cpu', 'cuda' or 'cuda:N', got {value!r}", field="device")
    return m.group(1), (int(m.group(2)) if m.group(2) is not None else (0 if m.group(1) == "cuda" else None))


#: Judge host contention over windows at least this long (/proc/stat ticks are 10 ms).
CONTENTION_WINDOW_S = 0.3


def cpu_cases(torch: Any | None, quick: bool, backends: tuple[str, ...]) -> tuple[list[Case], list[str]]:
    """The CPU micro-benchmarks, torch first (the fit prefers it), then numpy."""
    cases: list[Case] = []
    used: list[str] = []
    if torch is not None:
        from planner_service.profiling import torch_backend

        cases += torch_backend.plan(torch, "cpu", quick)
        used.append("torch")
    if "numpy" in backends:
        cases += numpy_backend.plan(quick)
        used.append("numpy")
    return cases, used


def cpu_backend_switcher(torch: Any | None, threads: int) -> Callable[[str], None]:
    """Give the cores to one backend's thread pool and shrink the other's to one thread (two
    pools spinning on the same cores halve each other's throughput)."""
    def switch(backend: str) -> None:
        numpy_blas_threads(threads if backend == "numpy" else 1)
        if torch is not None:
            torch.set_num_threads(threads if backend == "torch" else 1)

    return switch


def _measure_cases(cases: list[Case], settings: TimingSettings, check_host: bool, options: ProfileOptions,
                   waited: dict[str, float], progress: Progress | None, total: int,
                   switch_backend: Callable[[str], None], own_pids: tuple[int, ...] = (),
                   on_case: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Time every case (``on_case(i)`` first: the neighbour ranks follow it, :func:`follow`).
    On a CPU, consecutive cases are grouped into windows of at least
    CONTENTION_WINDOW_S; when other processes kept ``quiet_threshold_cores`` busy during a
    window, the runner waits for a quiet host and re-takes the window's cases (at most 3 times,
    within the ``max_wait_s`` budget).  Each measurement records the contention it saw."""
    out: list[dict[str, Any] | None] = [None] * len(cases)
    monitor = HostMonitor(own_pids)
    window: list[int] = []
    retakes = 0
    previous_backend = None

    def take(i: int) -> None:
        if on_case is not None:
            on_case(i)
        fn, sync = cases[i].setup()
        timing = measure(fn, settings, sync)
        del fn
        out[i] = {**cases[i].fields, **timing.to_fields()}

    def close_window() -> None:
        nonlocal retakes
        busy = monitor.others_busy_cores()
        tries = 0
        while busy is not None and busy >= options.quiet_threshold_cores and waited["s"] < options.max_wait_s and tries < 3:
            _, w = wait_until_quiet(options.quiet_threshold_cores, options.max_wait_s - waited["s"], own_pids=own_pids)
            waited["s"] += w
            tries += 1
            retakes += 1
            monitor.reset()
            for j in window:
                take(j)
            busy = monitor.others_busy_cores()
        for j in window:
            out[j]["host_busy_cores"] = None if busy is None else round(busy, 3)
            if tries:
                out[j]["retakes"] = tries
        window.clear()
        monitor.reset()

    for i, case in enumerate(cases):
        if progress:
            progress(case.label, i, total)
        if case.fields.get("backend") != previous_backend:
            # let the previous backend's spinning worker threads (OpenBLAS, OpenMP) park
            # before timing another thread pool on the same cores
            if check_host and window:
                close_window()
            switch_backend(case.fields.get("backend"))
            time.sleep(0.2)
            monitor.reset()
            previous_backend = case.fields.get("backend")
        take(i)
        if check_host:
            window.append(i)
            if monitor.elapsed_s() >= CONTENTION_WINDOW_S:
                close_window()
    if check_host and window:
        close_window()
    return [m for m in out if m is not None]


def start_neighbours(n: int, quick: bool, threads: int, backends: tuple[str, ...]) -> list[Any]:
    """Start ``n`` neighbour processes (:mod:`.neighbour`) and wait until each has built its
    benchmarks and is about to run the first; :func:`follow` tells them which to run."""
    import os
    import subprocess
    import sys

    procs = []
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    try:
        for _ in range(n):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "planner_service.profiling.neighbour", "--threads", str(threads),
                 "--backends", ",".join(backends)] + (["--quick"] if quick else []),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env))
        for p in procs:
            line = p.stdout.readline() if p.stdout else ""
            if line.strip() != "ready":
                raise RuntimeError("a neighbour process for --concurrent did not start")
    except BaseException:
        stop_neighbours(procs)
        raise
    return procs


def follow(procs: list[Any], index: int) -> None:
    """Tell the neighbour ranks to run case ``index`` (the one about to be timed) until told
    otherwise (:func:`planner_service.profiling.neighbour.follow_cases`)."""
    for p in procs:
        with contextlib.suppress(OSError, ValueError):  # a neighbour that died loads nothing: the profile goes on
            p.stdin.write(f"{index}\n")
            p.stdin.flush()


def stop_neighbours(procs: list[Any]) -> None:
    for p in procs:
        if p.stdin is not None:
            with contextlib.suppress(OSError):
                p.stdin.close()
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except Exception:  # noqa: BLE001 - it must not outlive the profile
            p.kill()


def run_profile(options: ProfileOptions, progress: Progress | None = None) -> dict[str, Any]:
    kind, index = parse_device(options.device)
    torch = import_torch() if "torch" in options.backends or kind == "cuda" else None
    if kind == "cuda":
        if torch is None:
            raise InvalidProfile("--device cuda needs torch (pip install '.[torch]')", field="device")
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise InvalidProfile(f"CUDA device {index} is not available (this host has {have})", field="device")
    if options.max_wait_s is None:
        options = dataclasses.replace(options, max_wait_s=20.0 if options.quick else 120.0)
    threads = options.threads or cpu_count()
    if threads < 1:
        raise InvalidProfile("must be at least 1", field="threads")
    if options.concurrent < 1:
        raise InvalidProfile("must be at least 1", field="concurrent")
    if options.concurrent > 1:
        if kind != "cpu":
            raise InvalidProfile("concurrent ranks are measured on a CPU only (a GPU is one rank's)", field="concurrent")
        if options.concurrent * threads > cpu_count():
            raise InvalidProfile(f"{options.concurrent} ranks × {threads} threads exceed this host's {cpu_count()} cores "
                                 "(the profile would measure time slicing); lower --threads or --concurrent", field="concurrent")

    busy_before = host_busy_cores(0.3)
    old_blas = numpy_blas_threads()
    old_torch_threads = torch.get_num_threads() if torch is not None else None
    old_tf32 = None
    try:
        numpy_blas_threads(threads)
        if torch is not None:
            torch.set_num_threads(threads)
        cases: list[Case] = []
        backends_used: list[str] = []
        if kind == "cpu":
            cases, backends_used = cpu_cases(torch, options.quick, options.backends)
            fingerprint = cpu_fingerprint(threads, torch)
            dev_str = "cpu"
        else:
            from planner_service.profiling import torch_backend

            dev_str = f"cuda:{index}"
            old_tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
            torch_backend.prepare(torch, dev_str)
            cases += torch_backend.plan(torch, dev_str, options.quick)
            backends_used.append("torch")
            fingerprint = cuda_fingerprint(torch, index, options.device_name, threads)

        cuda = kind == "cuda"
        world = options.world_size or ((torch.cuda.device_count() if cuda else 2) if torch is not None else 0)
        do_coll = options.collectives and torch is not None and world >= 2
        if cuda and world > torch.cuda.device_count():
            raise InvalidProfile(f"world size {world} exceeds the {torch.cuda.device_count()} GPUs", field="world_size")
        n_coll = planned_count(world, options.quick, cuda) if do_coll else 0
        total = len(cases) + n_coll
        settings = TimingSettings.quick() if options.quick else TimingSettings()
        waited = {"s": 0.0}

        switch_backend = cpu_backend_switcher(torch, threads) if kind == "cpu" else (lambda backend: None)
        neighbours = start_neighbours(options.concurrent - 1, options.quick, threads, tuple(backends_used)) if kind == "cpu" else []
        try:
            measurements = _measure_cases(cases, settings, kind == "cpu", options, waited, progress, total, switch_backend,
                                          own_pids=tuple(p.pid for p in neighbours),
                                          on_case=(lambda i: follow(neighbours, i)) if neighbours else None)
        finally:
            stop_neighbours(neighbours)
        done = len(cases)
        if do_coll:
            if kind == "cpu":
                _, w = wait_until_quiet(options.quiet_threshold_cores, max(0.0, options.max_wait_s - waited["s"]))
                waited["s"] += w
            counter = {"n": done}

            def coll_progress(label: str) -> None:
                counter["n"] += 1
                if progress:
                    progress(label, counter["n"], total)

            per_rank = max(1, threads // world) if not cuda else 1
            if progress:
                progress(f"starting {world} ranks for collectives", done, total)
            measurements += run_collectives(world, cuda, options.quick, per_rank, coll_progress)
        if progress:
            progress("done", total, total)
    finally:
        if old_blas is not None:
            numpy_blas_threads(old_blas)
        if torch is not None and old_torch_threads is not None:
            torch.set_num_threads(old_torch_threads)
        if old_tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old_tf32

    return {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "source": "microbenchmark",
        "device": fingerprint,
        "settings": {
            "quick": options.quick,
            "device": dev_str,
            "threads": threads,
            "concurrent": options.concurrent,
            "backends": backends_used,
            "collectives": {"world_size": world, "backend": ("nccl" if cuda else "gloo")} if do_coll else None,
            "timing": settings.to_dict(),
            "host_busy_cores_before": busy_before,
            "host_busy_cores_after": host_busy_cores(0.3),
            "waited_for_quiet_host_s": round(waited["s"], 1),
        },
        "measurements": measurements,
    }
