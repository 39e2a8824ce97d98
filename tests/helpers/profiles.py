"""Synthetic profiles generated from the cost model's own functions with known parameters."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cost_model.comm import Links, allreduce_time_s, p2p_time_s, reduce_scatter_time_s
from cost_model.compute import gemm_time_s, memory_bound_time_s
from cost_model.devices import DeviceSpec, Efficiency, get_device

TRUE_EFF = Efficiency(
    gemm_max_fraction=0.62, gemm_half_dim=150.0, memory_fraction=0.7, nvlink_fraction=0.66, nic_fraction=0.8,
    collective_latency_s=12e-6, kernel_overhead_s=7e-6, gemm_half_k=300.0,
)
DIMS = (256, 1024, 4096, 8192)


def true_device(name: str = "A100-SXM4-80GB", eff: Efficiency = TRUE_EFF) -> DeviceSpec:
    return replace(get_device(name), efficiency=eff)


def synthetic_measurements(dev: DeviceSpec, dtypes=("bf16",), gemm_scale: float = 1.0, collectives: bool = True) -> list[dict[str, Any]]:
    ms: list[dict[str, Any]] = []
    for dt in dtypes:
        for m in DIMS:
            for n in DIMS:
                for k in DIMS:
                    t = float(gemm_time_s(m, n, k, dev, dt)) * gemm_scale
                    ms.append({"op": "gemm", "backend": "torch", "dtype": dt, "shape": {"m": m, "n": n, "k": k, "batch": 1},
                               "seconds": t, "repeats": 5, "spread": {"min_s": t * 0.98, "max_s": t * 1.03, "iqr_s": t * 0.01}})
    for e in (1 << 16, 1 << 20, 1 << 24, 1 << 27):
        for op, traffic in (("add", 3), ("copy", 2)):
            b = traffic * 2 * e
            ms.append({"op": op, "backend": "torch", "dtype": "bf16", "bytes": b, "kernels": 1,
                       "seconds": float(memory_bound_time_s(b, dev)), "repeats": 5})
    if collectives:
        links = Links(dev.intra_node_bandwidth_GBps * dev.efficiency.nvlink_fraction, 1.0, 8, dev.efficiency.collective_latency_s)
        for n in (2, 4, 8):
            for s in (1 << 16, 1 << 20, 1 << 24, 1 << 28):
                ms.append({"op": "allreduce", "backend": "nccl", "group_size": n, "bytes": s, "scope": "intra_node",
                           "seconds": float(allreduce_time_s(n, s, links, n)), "repeats": 5})
                ms.append({"op": "allgather", "backend": "nccl", "group_size": n, "bytes": s, "scope": "intra_node",
                           "seconds": float(reduce_scatter_time_s(n, s, links, n)), "repeats": 5})
        for s in (1 << 16, 1 << 24):
            ms.append({"op": "sendrecv", "backend": "nccl", "group_size": 2, "bytes": s, "scope": "intra_node",
                       "seconds": float(p2p_time_s(s, links, False)), "repeats": 5})
    return ms


def synthetic_profile(name: str = "A100-SXM4-80GB", **kw: Any) -> dict[str, Any]:
    dev = true_device(name, kw.pop("eff", TRUE_EFF))
    return {
        "schema": "planner-profile",
        "schema_version": 1,
        "source": "microbenchmark",
        "device": {"name": name, "kind": dev.kind},
        "measurements": synthetic_measurements(dev, **kw),
    }


def scale(m: dict[str, Any], factor: float) -> None:
    """Multiply a measurement's time and spread."""
    m["seconds"] *= factor
    for key in ("min_s", "max_s", "iqr_s"):
        if key in m.get("spread", {}):
            m["spread"][key] *= factor
