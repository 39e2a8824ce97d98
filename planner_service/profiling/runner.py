"""Run the micro-benchmarks of one device and assemble a schema-v1 profile (see
docs/PROFILE_FORMAT.md).  The fit (cost_model.profiles.fit_profile) is attached by the caller."""

from __future__ import annotations

import datetime as dt
import importlib
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

from cost_model.errors import InvalidProfile
from cost_model.profiles import SCHEMA_NAME, SCHEMA_VERSION

from . import numpy_backend
from .cases import Case
from .collectives import planned_count, run_collectives
from .fingerprint import cpu_count, cpu_fingerprint, cuda_fingerprint, host_busy_cores, numpy_blas_threads
from .timing import TimingSettings, measure

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


def run_profile(options: ProfileOptions, progress: Progress | None = None) -> dict[str, Any]:
    kind, index = parse_device(options.device)
    torch = import_torch() if "torch" in options.backends or kind == "cuda" else None
    if kind == "cuda":
        if torch is None:
            raise InvalidProfile("--device cuda needs torch (pip install '.[torch]')", field="device")
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise InvalidProfile(f"CUDA device {index} is not available (this host has {have})", field="device")
    threads = options.threads or cpu_count()
    if threads < 1:
        raise InvalidProfile("must be at least 1", field="threads")

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
            if "numpy" in options.backends:
                cases += numpy_backend.plan(options.quick)
                backends_used.append("numpy")
            if torch is not None:
                from . import torch_backend

                cases += torch_backend.plan(torch, "cpu", options.quick)
                backends_used.append("torch")
            fingerprint = cpu_fingerprint(threads, torch)
            dev_str = "cpu"
        else:
            from . import torch_backend

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
        measurements: list[dict[str, Any]] = []
        previous_backend = None
        for i, case in enumerate(cases):
            if progress:
                progress(case.label, i, total)
            if case.fields.get("backend") != previous_backend:
                # let the previous backend's spinning worker threads (OpenBLAS, OpenMP) park
                # before timing another thread pool on the same cores
                time.sleep(0.2)
                previous_backend = case.fields.get("backend")
            fn, sync = case.setup()
            timing = measure(fn, settings, sync)
            del fn
            measurements.append({**case.fields, **timing.to_fields()})
        done = len(cases)
        if do_coll:
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
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "source": "microbenchmark",
        "device": fingerprint,
        "settings": {
            "quick": options.quick,
            "device": dev_str,
            "threads": threads,
            "backends": backends_used,
            "collectives": {"world_size": world, "backend": ("nccl" if cuda else "gloo")} if do_coll else None,
            "timing": settings.to_dict(),
            "host_busy_cores_before": busy_before,
            "host_busy_cores_after": host_busy_cores(0.3),
        },
        "measurements": measurements,
    }
