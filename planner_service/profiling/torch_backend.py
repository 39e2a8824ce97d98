"""torch micro-benchmarks on CPU or one CUDA device (optional: needs ``pip install .[torch]``).

* GEMMs as the training step runs them: ``F.linear(x(m×k), w(n×k))`` (forward, layout ``nt``),
  ``x(m×k) @ w(k×n)`` (input gradient, ``nn``) and ``xᵀ @ g`` (weight gradient, ``tn``), per
  dtype the device supports (CPU: fp32; CUDA: fp32 with TF32 off, bf16, fp16).
* Batched GEMMs (``torch.bmm``) of attention shapes.
* Memory-bound ops, out of place as in training: clone, scale, add, GELU, LayerNorm (rows of
  1024), softmax (rows of 1024), dropout (p = 0.1, training mode, mask generation included).
  ``bytes`` is the minimum traffic (operands read once, result written once, plus dropout's
  one-byte mask); ``kernels`` is 1 (one ATen op each).  Inputs rotate over enough copies
  to exceed twice the last-level cache (CPU LLC, GPU L2), so operands come from memory as in a
  training step rather than from the cache of the previous repetition.
* ``scaled_dot_product_attention`` (causal), recorded but not fitted.
* The fixed cost of one op (``op_overhead``: dispatcher / launch; with autograd, forward op plus
  backward node), recorded but not fitted: the cost model has no per-op framework term.
* CUDA only: host↔device copies from/to pinned memory.
"""

from __future__ import annotations

from typing import Any

from cost_model.units import mib_to_bytes
from planner_service.profiling.cases import (
    Case,
    elements_grid,
    gemm_grid,
    last_level_cache_bytes,
    rotation_count,
)

BACKEND = "torch"
_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_ESIZE = {"fp32": 4, "bf16": 2, "fp16": 2}


def _sync_for(torch: Any, device: str):
    if device.startswith("cuda"):
        idx = device

        def sync():
            torch.cuda.synchronize(idx)

        return sync
    return lambda: None


def _gemm_case(torch: Any, device: str, dtype: str, m: int, n: int, k: int, layout: str, batch: int = 1) -> Case:
    """One GEMM shape and layout.  Operands rotate over enough copies to exceed twice the
    last-level cache, as in a training step, where a GEMM reads activations and weights that
    other operators have since evicted (small GEMMs run up to ~1.4× slower cold on a CPU)."""
    tdt = getattr(torch, _TORCH_DTYPES[dtype])
    rotate = rotation_count(batch * (m * k + k * n) * _ESIZE[dtype], _cache_bytes(torch, device))

    def setup():
        gen = torch.Generator(device="cpu").manual_seed(0)
        F = torch.nn.functional

        def rand(*shape):
            return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=tdt)

        if batch > 1:
            sets = [(rand(batch, m, k), rand(batch, k, n)) for _ in range(rotate)]
            op = torch.bmm
        elif layout == "nt":
            sets = [(rand(m, k), rand(n, k)) for _ in range(rotate)]
            op = F.linear
        elif layout == "nn":
            sets = [(rand(m, k), rand(k, n)) for _ in range(rotate)]
            op = torch.mm
        else:  # "tn": (k×m)ᵀ @ (k×n), the weight-gradient layout
            sets = [(rand(k, m).t(), rand(k, n)) for _ in range(rotate)]
            op = torch.mm
        state = [0]

        def fn():
            i = state[0] = (state[0] + 1) % rotate
            return op(*sets[i])

        return fn, _sync_for(torch, device)

    return Case(
        label=f"torch {device} gemm {dtype} {m}x{n}x{k} {layout}" + (f" x{batch}" if batch > 1 else ""),
        fields={"op": "gemm", "backend": BACKEND, "dtype": dtype, "shape": {"m": m, "n": n, "k": k, "batch": batch}, "layout": layout,
                "cold_inputs": rotate > 1},
        setup=setup,
        cost_hint=2.0 * m * n * k * batch,
    )


_ROW = 1024


def _cache_bytes(torch: Any, device: str) -> int:
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return int(getattr(props, "L2_cache_size", 0) or mib_to_bytes(50))
    return last_level_cache_bytes()


def _memory_bytes(op: str, dtype: str, elements: int) -> int:
    """Minimum traffic: operands read once, result written once; dropout also writes a one-byte
    mask (what a fused dropout kernel stores for backward)."""
    e = _ESIZE[dtype]
    if op == "add":
        return 3 * e * elements
    if op == "dropout":
        return (2 * e + 1) * elements
    return 2 * e * elements


def _memory_case(torch: Any, device: str, dtype: str, op: str, elements: int) -> Case:
    tdt = getattr(torch, _TORCH_DTYPES[dtype])
    n_inputs = 2 if op == "add" else 1
    rotate = rotation_count(n_inputs * elements * _ESIZE[dtype], _cache_bytes(torch, device))

    def setup():
        F = torch.nn.functional
        xs = [torch.ones(elements // _ROW, _ROW, dtype=tdt, device=device) for _ in range(rotate)]
        ys = [torch.ones_like(xs[0]) for _ in range(rotate)] if op == "add" else xs
        w = torch.ones(_ROW, dtype=tdt, device=device)
        b = torch.zeros(_ROW, dtype=tdt, device=device)
        kernel = {
            "copy": lambda x, y: x.clone(),
            "scale": lambda x, y: x * 2.0,
            "add": lambda x, y: x + y,
            "gelu": lambda x, y: F.gelu(x),
            "layernorm": lambda x, y: F.layer_norm(x, (_ROW,), w, b),
            "softmax": lambda x, y: torch.softmax(x, dim=-1),
            "dropout": lambda x, y: F.dropout(x, 0.1, True),
        }[op]
        state = [0]

        def fn():
            i = state[0] = (state[0] + 1) % rotate
            return kernel(xs[i], ys[i])

        return fn, _sync_for(torch, device)

    return Case(
        label=f"torch {device} {op} {dtype} {elements} elements",
        fields={
            "op": op, "backend": BACKEND, "dtype": dtype, "shape": {"elements": elements, "row": _ROW},
            "bytes": _memory_bytes(op, dtype, elements), "kernels": 1, "cold_inputs": rotate > 1,
            # fresh tensors per call: the result (dropout: and its mask, kept in the input dtype)
            "output_bytes": elements * _ESIZE[dtype] * (2 if op == "dropout" else 1),
        },
        setup=setup,
        cost_hint=float(elements),
    )


def _attention_case(torch: Any, device: str, dtype: str, batch: int, heads: int, seq: int, head_dim: int) -> Case:
    tdt = getattr(torch, _TORCH_DTYPES[dtype])

    def setup():
        gen = torch.Generator(device="cpu").manual_seed(0)
        q, k, v = (torch.randn(batch, heads, seq, head_dim, generator=gen).to(device=device, dtype=tdt) for _ in range(3))
        F = torch.nn.functional
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), _sync_for(torch, device)

    return Case(
        label=f"torch {device} sdpa {dtype} {batch}x{heads}x{seq}x{head_dim}",
        fields={
            "op": "attention", "backend": BACKEND, "dtype": dtype, "impl": "sdpa",
            "shape": {"batch_heads": batch * heads, "q_len": seq, "kv_len": seq, "head_dim": head_dim, "causal": True},
        },
        setup=setup,
        cost_hint=4.0 * batch * heads * seq * seq * head_dim,
    )


def _copy_case(torch: Any, device: str, direction: str, nbytes: int) -> Case:
    def setup():
        host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
        if direction == "h2d":
            fn = lambda: dev.copy_(host, non_blocking=True)  # noqa: E731
        else:
            fn = lambda: host.copy_(dev, non_blocking=True)  # noqa: E731
        return fn, _sync_for(torch, device)

    return Case(
        label=f"torch {device} {direction} {nbytes} bytes",
        fields={"op": direction, "backend": BACKEND, "bytes": nbytes, "pinned": True},
        setup=setup,
        cost_hint=float(nbytes),
    )


def _overhead_case(torch: Any, device: str, autograd: bool) -> Case:
    """Fixed cost of framework ops on a one-element tensor: one in-place add (dispatcher, and
    kernel launch on CUDA) without autograd; with autograd, a chain of 32 multiplies and a sum,
    then ``backward()`` — per call 33 forward ops and their 33 backward nodes plus one engine
    start, so ``seconds / ops`` is the amortised forward+backward cost of one op."""
    chain = 32

    def setup():
        if autograd:
            x = torch.ones(1, device=device, requires_grad=True)

            def fn():
                y = x
                for _ in range(chain):
                    y = y * 1.0001
                y.sum().backward()
        else:
            x = torch.ones(1, device=device)

            def fn():
                x.add_(1.0)
        return fn, _sync_for(torch, device)

    return Case(
        label=f"torch {device} op overhead{' (autograd)' if autograd else ''}",
        fields={"op": "op_overhead", "backend": BACKEND, "autograd": autograd, "ops": chain + 1 if autograd else 1},
        setup=setup,
        cost_hint=1.0,
    )


def supported_dtypes(device: str) -> tuple[str, ...]:
    return ("fp32", "bf16", "fp16") if device.startswith("cuda") else ("fp32",)


def plan(torch: Any, device: str, quick: bool) -> list[Case]:
    cuda = device.startswith("cuda")
    if cuda:
        dims = (512, 2048, 8192) if quick else (256, 512, 1024, 2048, 4096, 8192)
        side_dims = (1024, 4096) if quick else (512, 1024, 2048, 4096, 8192)
    else:
        dims = (64, 256, 1024) if quick else (64, 128, 256, 512, 1024, 2048)
        side_dims = (256, 1024) if quick else (128, 512, 1024, 2048)
    cases: list[Case] = [_overhead_case(torch, device, False), _overhead_case(torch, device, True)]
    for dtype in supported_dtypes(device):
        cases += [_gemm_case(torch, device, dtype, m, n, k, "nt") for m, n, k in gemm_grid(dims)]
        for layout in ("nn", "tn"):
            cases += [_gemm_case(torch, device, dtype, m, n, k, layout) for m, n, k in gemm_grid(side_dims)]
        seqs = ((512, 2048) if quick else (512, 1024, 2048, 4096)) if cuda else ((128, 512) if quick else (128, 256, 512, 1024))
        bh = 64 if cuda else 16
        for s in seqs:
            cases.append(_gemm_case(torch, device, dtype, s, s, 64, "nn", batch=bh))
            cases.append(_gemm_case(torch, device, dtype, s, 64, s, "nn", batch=bh))
        elems = elements_grid(quick)
        if cuda:
            elems = tuple(e * 16 for e in elems)  # HBM: go well past the L2 cache
        mem_dtypes = ("fp32",) if not cuda else ("fp32", "bf16")
        if dtype in mem_dtypes:
            for op in ("copy", "scale", "add", "gelu", "layernorm", "softmax", "dropout"):
                cases += [_memory_case(torch, device, dtype, op, e) for e in elems]
        for s in seqs:
            cases.append(_attention_case(torch, device, dtype, bh // 8 if bh >= 8 else 1, 8, s, 64))
    if cuda:
        for nbytes in ((1 << 20, 1 << 24, 1 << 28) if quick else tuple(1 << p for p in range(16, 30, 2))):
            cases += [_copy_case(torch, device, d, nbytes) for d in ("h2d", "d2h")]
    return cases


def prepare(torch: Any, device: str) -> None:
    """Deterministic GEMM precision: fp32 means fp32 (no TF32), so the catalog's fp32 peak applies."""
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
