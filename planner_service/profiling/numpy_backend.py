"""numpy micro-benchmarks (the always-available CPU backend).

GEMMs ``a(m×k) @ b(k×n)`` in fp32 over a cube of dimensions, batched GEMMs (attention shapes),
out-of-place streaming ops (copy, scale, add: each allocates its result, as frameworks do, so
page-faulting of large fresh buffers is part of the measured cost; inputs rotate over copies
whose total exceeds twice the last-level cache, so they are read from memory) and an unfused
attention core.
``bytes`` is the minimum traffic of the op: every operand read once, the result written once.
"""

from __future__ import annotations

import numpy as np

from planner_service.profiling.cases import (
    Case,
    elements_grid,
    gemm_grid,
    last_level_cache_bytes,
    rotation_count,
)

BACKEND = "numpy"


def _noop() -> None:
    return None


def _gemm_case(m: int, n: int, k: int, batch: int = 1) -> Case:
    def setup():
        rng = np.random.default_rng(0)
        shape_a = (batch, m, k) if batch > 1 else (m, k)
        shape_b = (batch, k, n) if batch > 1 else (k, n)
        a = rng.standard_normal(shape_a, dtype=np.float32)
        b = rng.standard_normal(shape_b, dtype=np.float32)
        return (lambda: np.matmul(a, b)), _noop

    shape = {"m": m, "n": n, "k": k, "batch": batch}
    return Case(
        label=f"numpy gemm fp32 {m}x{n}x{k}" + (f" x{batch}" if batch > 1 else ""),
        fields={"op": "gemm", "backend": BACKEND, "dtype": "fp32", "shape": shape, "layout": "nn"},
        setup=setup,
        cost_hint=2.0 * m * n * k * batch,
    )


def _memory_case(op: str, elements: int) -> Case:
    reads_writes = {"copy": 2, "scale": 2, "add": 3}[op]
    rotate = rotation_count((2 if op == "add" else 1) * 4 * elements, last_level_cache_bytes())

    def setup():
        xs = [np.ones(elements, dtype=np.float32) for _ in range(rotate)]
        ys = [np.ones(elements, dtype=np.float32) for _ in range(rotate)] if op == "add" else xs
        kernel = {"copy": lambda x, y: x.copy(), "scale": lambda x, y: x * np.float32(2.0), "add": lambda x, y: x + y}[op]
        state = [0]

        def fn():
            i = state[0] = (state[0] + 1) % rotate
            return kernel(xs[i], ys[i])

        return fn, _noop

    return Case(
        label=f"numpy {op} fp32 {elements} elements",
        fields={"op": op, "backend": BACKEND, "dtype": "fp32", "shape": {"elements": elements},
                "bytes": reads_writes * 4 * elements, "kernels": 1, "cold_inputs": rotate > 1},
        setup=setup,
        cost_hint=float(elements),
    )


def _attention_case(batch_heads: int, seq: int, head_dim: int) -> Case:
    def setup():
        rng = np.random.default_rng(0)
        q = rng.standard_normal((batch_heads, seq, head_dim), dtype=np.float32)
        k = rng.standard_normal((batch_heads, seq, head_dim), dtype=np.float32)
        v = rng.standard_normal((batch_heads, seq, head_dim), dtype=np.float32)
        mask = np.triu(np.full((seq, seq), -np.inf, dtype=np.float32), 1)
        scale = np.float32(1.0 / np.sqrt(head_dim))

        def attn():
            s = np.matmul(q, k.transpose(0, 2, 1)) * scale + mask
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            return np.matmul(s, v)

        return attn, _noop

    return Case(
        label=f"numpy attention (unfused) {batch_heads}x{seq}x{head_dim}",
        fields={
            "op": "attention", "backend": BACKEND, "dtype": "fp32", "impl": "unfused",
            "shape": {"batch_heads": batch_heads, "q_len": seq, "kv_len": seq, "head_dim": head_dim, "causal": True},
        },
        setup=setup,
        cost_hint=4.0 * batch_heads * seq * seq * head_dim,
    )


def plan(quick: bool) -> list[Case]:
    dims = (64, 256, 1024) if quick else (64, 128, 256, 512, 1024, 2048)
    cases = [_gemm_case(m, n, k) for m, n, k in gemm_grid(dims)]
    seqs = (128, 512) if quick else (128, 256, 512, 1024)
    for s in seqs:
        cases.append(_gemm_case(s, s, 64, batch=16))  # Q·Kᵀ
        cases.append(_gemm_case(s, 64, s, batch=16))  # P·V
    for op in ("copy", "scale", "add"):
        cases += [_memory_case(op, e) for e in elements_grid(quick)]
    cases += [_attention_case(16, s, 64) for s in seqs]
    return cases
