"""Device fingerprint recorded in every profile: what was measured, with what software.

Also maps a CUDA device's marketing name to the planner's catalog id (``NVIDIA H100 80GB HBM3`` →
``H100-SXM5-80GB``) and controls the thread count of numpy's BLAS (OpenBLAS) so that a profile
can be taken with the threads one training rank would have.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
import socket
import subprocess
from typing import Any

import numpy as np

from cost_model.devices import LOCAL_CPU, catalog
from cost_model.errors import InvalidProfile
from cost_model.units import bytes_to_gb, kib_to_bytes


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _blas_info() -> dict[str, Any]:
    try:
        cfg = np.show_config(mode="dicts")  # numpy >= 1.26
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        return {"name": blas.get("name"), "version": blas.get("version")}
    except Exception:  # pragma: no cover - very old numpy
        return {"name": None, "version": None}


def _openblas_lib() -> ctypes.CDLL | None:
    """The OpenBLAS shared library numpy loaded (found through /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if not path.startswith("/"):
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


_SETTERS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads")


def numpy_blas_threads(set_to: int | None = None) -> int | None:
    """Read (and optionally set) the thread count of numpy's OpenBLAS; None if unknown."""
    lib = _openblas_lib()
    if lib is None:
        return None
    if set_to is not None:
        for name in _SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(int(set_to)))
                break
    for name in _GETTERS:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = ctypes.c_int
            return int(fn())
    return None


def _meminfo_GB() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return round(bytes_to_gb(kib_to_bytes(int(line.split()[1]))), 2)
    except OSError:
        pass
    return None


def _torch_versions(torch: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"torch": torch.__version__}
    if getattr(torch.version, "cuda", None):
        out["cuda"] = torch.version.cuda
    try:
        if torch.backends.cudnn.is_available():
            out["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    try:
        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:
        pass
    with contextlib.suppress(Exception):
        out["mkldnn"] = bool(torch.backends.mkldnn.is_available())
    return out


def cpu_fingerprint(threads: int, torch: Any | None) -> dict[str, Any]:
    libs: dict[str, Any] = {"numpy": np.__version__, "blas": _blas_info(), "python": platform.python_version()}
    if torch is not None:
        libs.update(_torch_versions(torch))
    return {
        "name": LOCAL_CPU,
        "kind": "cpu",
        "model": cpu_model(),
        "memory_GB": _meminfo_GB(),
        "cores": cpu_count(),
        "threads": threads,
        "numpy_blas_threads": numpy_blas_threads(),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "driver_version": None,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "libraries": libs,
    }


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=False,
        )
        line = out.stdout.strip().splitlines()
        return line[0].strip() if line else None
    except (OSError, subprocess.SubprocessError):
        return None


def catalog_name_for_gpu(raw_name: str, memory_GB: float | None) -> str | None:
    """Best catalog id for a CUDA/ROCm device name, or None."""
    n = raw_name.upper()
    pcie = "PCIE" in n or "PCI-E" in n
    mem = memory_GB or 0.0
    rules = [
        ("GB300", "GB300-NVL72-288GB"), ("GB200", "GB200-NVL72-186GB"), ("B200", "B200-SXM-192GB"),
        ("GH200", "H200-SXM-141GB"), ("H200", "H200-SXM-141GB"),
        ("H100", "H100-PCIE-80GB" if pcie else "H100-SXM5-80GB"),
        ("A100", ("A100-PCIE-" if pcie else "A100-SXM4-") + ("40GB" if 0 < mem < 60 else "80GB")),
        ("V100", "V100-SXM2-32GB"), ("L40S", "L40S-48GB"), ("MI300X", "MI300X"), ("MI250X", "MI250X"),
        ("910B", "Ascend-910B"),
    ]
    for token, cid in rules:
        if token in n:
            return cid if cid in catalog() else None
    if re.search(r"\bA10\b", n):
        return "A10-24GB"
    return None


def cuda_fingerprint(torch: Any, index: int, device_name: str | None, threads: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    raw = props.name
    memory_GB = round(bytes_to_gb(props.total_memory), 2)
    name = device_name or catalog_name_for_gpu(raw, memory_GB)
    if name is None:
        raise InvalidProfile(
            f"cannot map GPU {raw!r} to a catalog device; pass --device-name with one of {', '.join(sorted(catalog()))}",
            field="device",
        )
    return {
        "name": name,
        "kind": "gpu",
        "model": raw,
        "memory_GB": memory_GB,
        "cores": getattr(props, "multi_processor_count", None),
        "compute_capability": f"{props.major}.{props.minor}",
        "index": index,
        "device_count": torch.cuda.device_count(),
        "threads": threads,
        "driver_version": _nvidia_driver(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "libraries": {"numpy": np.__version__, "python": platform.python_version(), **_torch_versions(torch)},
    }


def _proc_stat_busy_s() -> float | None:
    """CPU seconds all processes have been busy since boot (from /proc/stat)."""
    try:
        with open("/proc/stat") as fh:
            parts = fh.readline().split()[1:]
    except OSError:
        return None
    vals = [float(v) for v in parts[:8]]
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return (sum(vals) - vals[3] - vals[4]) / hz


def _pids_cpu_s(pids: tuple[int, ...]) -> float:
    """CPU seconds (user + system, all threads) the given processes have used; 0 for one that is gone."""
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (float(fields[11]) + float(fields[12])) / hz  # utime, stime (fields 14, 15)
    return total


class HostMonitor:
    """Cores kept busy by *other* processes since the last :meth:`reset`: all CPU time on the
    host (/proc/stat, 10 ms resolution) minus this process's own and that of ``own_pids``
    (processes this measurement starts on purpose, e.g. neighbour ranks).  A measurement taken
    while others compute measures the contention, so the runner re-takes it when the host is
    quiet."""

    def __init__(self, own_pids: tuple[int, ...] = ()) -> None:
        self.own_pids = tuple(own_pids)
        self.reset()

    def reset(self) -> None:
        import time

        self._busy0 = _proc_stat_busy_s()
        self._own0 = time.process_time() + _pids_cpu_s(self.own_pids)
        self._t0 = time.monotonic()

    def elapsed_s(self) -> float:
        import time

        return time.monotonic() - self._t0

    def others_busy_cores(self) -> float | None:
        import time

        busy = _proc_stat_busy_s()
        wall = time.monotonic() - self._t0
        if busy is None or self._busy0 is None or wall <= 0:
            return None
        own = time.process_time() + _pids_cpu_s(self.own_pids)
        return max(0.0, (busy - self._busy0 - (own - self._own0)) / wall)


def host_busy_cores(interval_s: float = 0.5, own_pids: tuple[int, ...] = ()) -> float | None:
    """Cores other processes (not this one, nor ``own_pids``) keep busy, sampled over ``interval_s``."""
    import time

    mon = HostMonitor(own_pids)
    time.sleep(interval_s)
    return mon.others_busy_cores()


def wait_until_quiet(threshold_cores: float, max_wait_s: float, poll_s: float = 0.5,
                     own_pids: tuple[int, ...] = ()) -> tuple[float | None, float]:
    """Sleep until other processes (not ``own_pids``) use less than ``threshold_cores`` (or
    ``max_wait_s`` passed).  Returns (last reading, seconds waited)."""
    import time

    t0 = time.monotonic()
    busy = host_busy_cores(poll_s, own_pids)
    while busy is not None and busy >= threshold_cores and time.monotonic() - t0 < max_wait_s:
        busy = host_busy_cores(poll_s, own_pids)
    return busy, time.monotonic() - t0
