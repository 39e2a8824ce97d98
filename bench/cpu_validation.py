"""CPU validation of the calibrated cost model (``make bench-cpu``).

The whole loop on this machine's CPU: profile it (``planner profile --quick``: numpy + torch
micro-benchmarks and gloo collectives), fit the cost model, then train real GPT-style decoder
stacks in torch (fp32, forward + backward + Adam step; median of several steps) and compare the
measured step time with ``cost_model.estimate`` on a ``local-cpu`` cluster — once with the
fitted profile and once with the catalog defaults.

Cases: several transformer sizes (hidden size, sequence length, micro-batch, layers), each run
in one process (all cores) and, when the machine has at least 2 cores, with data parallelism
over 2 processes (gloo, DistributedDataParallel, one core each).  A device of the cost model is
what one rank gets, so the DP cases use a profile of one thread taken while a neighbour process
runs the same benchmarks on the other core (``planner profile --threads 1 --concurrent 2``: the
two ranks share the socket's caches, memory bandwidth and clock) and a cluster of
``gpus_per_node=2`` local-cpu devices.

Every case gets a fresh profile taken right before it is measured, so that profile and
measurement see the host in the same state: this VM's speed drifts by up to 2× over minutes,
which no model predicts.  A short speed probe (a GEMM and a memory pass) right after profiling
and around the measurement says how far it moved; a case more than 15% off is measured again
(twice at most) and the probe ratios are recorded with it.

Case L is a Llama-style stack as Hugging Face's eager modelling writes it (``build_llama``:
RMSNorm as separate operators, rotary embedding by rotate_half, SwiGLU, no biases or dropout, an
untied head; TransformerSpec from a Llama config), which checks the eager RMSNorm, rotary and
gated-activation traffic (``cost_model.transformer.layer_cost.eager_*_traffic``).  The others
match cost_model's GPT assumptions (TransformerSpec from a GPT-2 config):
learned positions, LayerNorm with bias, QKV/projection/FC1/FC2 with biases, 4h GELU FFN, tied
LM head, dropout 0.1 (attention probabilities and both residual branches), unfused causal
attention (scores materialised, masked softmax) — so ``training.attention = "unfused"`` — written
in plain PyTorch ops with ``torch.optim.Adam`` (no fused kernels: ``training.fused_kernels =
False``), initialised as GPT-2 is (PyTorch's default initialisation drives this untrained toy's
softmax into fp32 subnormals, which x86 cores process ~50× slower: see ``build_model``).

Writes bench/results/cpu_validation.json (and each case's fitted profile in bench/results/cpu_profiles/) and prints a table;
``--cases`` measures only those and keeps the other cases' saved rows.
Usage: python bench/cpu_validation.py [--steps 5] [--cases A,B] [--no-dp] [--reuse-profiles]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results"
PROFILES = RESULTS / "cpu_profiles"
TARGET_MEDIAN_ERROR = 0.15
QUIET_CORES = 0.3

#: name, layers, hidden, heads, sequence, micro-batch, vocabulary
CASES: list[dict[str, Any]] = [
    {"name": "A", "layers": 4, "hidden": 256, "heads": 4, "seq": 256, "micro_batch": 8, "vocab": 8192},
    {"name": "B", "layers": 4, "hidden": 512, "heads": 8, "seq": 128, "micro_batch": 8, "vocab": 8192},
    {"name": "C", "layers": 2, "hidden": 768, "heads": 12, "seq": 512, "micro_batch": 2, "vocab": 8192},
    {"name": "D", "layers": 6, "hidden": 128, "heads": 4, "seq": 128, "micro_batch": 4, "vocab": 4096},
    # Llama-style (Hugging Face's modelling in plain PyTorch): RMSNorm as separate operators,
    # rotary embedding by rotate_half, SwiGLU FFN, no biases or dropout, untied head
    {"name": "L", "family": "llama", "layers": 4, "hidden": 256, "heads": 4, "seq": 256, "micro_batch": 8, "vocab": 8192,
     "ffn": 688},
]
DROPOUT = 0.1


# ---------------------------------------------------------------------------------- the model
def build_model(case: dict[str, Any]):
    if case.get("family") == "llama":
        return build_llama(case)
    import torch
    from torch import nn
    from torch.nn import functional as F

    h, a, s = case["hidden"], case["heads"], case["seq"]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(h)
            self.qkv = nn.Linear(h, 3 * h)
            self.proj = nn.Linear(h, h)
            self.ln2 = nn.LayerNorm(h)
            self.fc1 = nn.Linear(h, 4 * h)
            self.fc2 = nn.Linear(4 * h, h)
            self.register_buffer("mask", torch.triu(torch.ones(s, s, dtype=torch.bool), 1), persistent=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
            q, k, v = (z.view(b, t, a, h // a).transpose(1, 2) for z in (q, k, v))
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(h // a))
            probs = F.dropout(torch.softmax(scores.masked_fill(self.mask[:t, :t], float("-inf")), dim=-1), DROPOUT, self.training)
            y = (probs @ v).transpose(1, 2).reshape(b, t, h)
            x = x + F.dropout(self.proj(y), DROPOUT, self.training)
            return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), DROPOUT, self.training)

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(case["vocab"], h)
            self.wpe = nn.Embedding(s, h)
            self.blocks = nn.ModuleList(Block() for _ in range(case["layers"]))
            self.ln_f = nn.LayerNorm(h)

        def forward(self, idx, targets):
            x = F.dropout(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])), DROPOUT, self.training)
            for blk in self.blocks:
                x = blk(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied LM head
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    torch.manual_seed(0)
    return init_gpt2_style(GPT(), case["layers"], residual=("proj.weight", "fc2.weight"))


def init_gpt2_style(model, layers: int, residual: tuple[str, ...]):
    """GPT-2's initialisation (Radford et al. 2019; nanoGPT): N(0, 0.02) weights and embeddings,
    zero biases, the ``residual`` projections scaled by 1/sqrt(2·layers).  PyTorch's defaults
    (N(0, 1) embeddings, Kaiming-uniform projections) make logits and attention scores of tens,
    whose softmax underflows into fp32 subnormals — and x86 cores take a microcode assist per
    subnormal operand, slowing the head's backward GEMMs ~50× and the softmax ~20×: a slowdown
    of the untrained toy, not of training, which no cost model should learn."""
    from torch import nn

    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.dim() == 2:
            nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if name.endswith(residual) else 0.02)
    return model


def build_llama(case: dict[str, Any]):
    """A Llama-style decoder as Hugging Face's ``modeling_llama`` writes it in eager mode:
    ``LlamaRMSNorm`` (upcast, pow, mean, rsqrt, scale — one operator each), rotary embedding by
    ``rotate_half``, unfused causal attention, SwiGLU (``down(silu(gate(x)) * up(x))``), no biases,
    no dropout, an untied head; initialised as GPT-2 is (:func:`init_gpt2_style`)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    h, a, s, f = case["hidden"], case["heads"], case["seq"], case["ffn"]
    d = h // a

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h))

        def forward(self, x):
            dtype = x.dtype
            x = x.to(torch.float32)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * x.to(dtype)

    def rotate_half(x):
        return torch.cat((-x[..., d // 2:], x[..., : d // 2]), dim=-1)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = RMSNorm(), RMSNorm()
            self.q, self.k, self.v, self.o = (nn.Linear(h, h, bias=False) for _ in range(4))
            self.gate, self.up = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
            self.down = nn.Linear(f, h, bias=False)
            self.register_buffer("mask", torch.triu(torch.ones(s, s, dtype=torch.bool), 1), persistent=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            y = self.norm1(x)
            q, k, v = (proj(y).view(b, t, a, d).transpose(1, 2) for proj in (self.q, self.k, self.v))
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            probs = torch.softmax(scores.masked_fill(self.mask[:t, :t], float("-inf")), dim=-1)
            x = x + self.o((probs @ v).transpose(1, 2).reshape(b, t, h))
            y = self.norm2(x)
            return x + self.down(F.silu(self.gate(y)) * self.up(y))

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(case["vocab"], h)
            self.blocks = nn.ModuleList(Block() for _ in range(case["layers"]))
            self.norm = RMSNorm()
            self.head = nn.Linear(h, case["vocab"], bias=False)
            inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
            self.register_buffer("inv_freq", inv, persistent=False)

        def forward(self, idx, targets):
            angles = torch.outer(torch.arange(idx.shape[1], dtype=torch.float32), self.inv_freq)
            emb = torch.cat((angles, angles), dim=-1)
            cos, sin = emb.cos(), emb.sin()
            x = self.embed(idx)
            for blk in self.blocks:
                x = blk(x, cos, sin)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    torch.manual_seed(0)
    model = init_gpt2_style(Llama(), case["layers"], residual=("o.weight", "down.weight"))
    return with_lora(model, case["lora_rank"]) if case.get("lora_rank") else model


def with_lora(model, rank: int):
    """``model`` as PEFT's LoRA trains it (``LoraConfig(r=rank, target_modules="all-linear")``
    on the decoder's linear layers, no dropout): every weight frozen, each of q, k, v, o, gate,
    up and down wrapped so that ``y = base(x) + lora_B(lora_A(x)) * scaling`` with A [r × in] and
    B [out × r] trainable (PEFT's ``LoraLayer.forward``; B starts at zero, as PEFT's does)."""
    import torch
    from torch import nn

    class LoRALinear(nn.Module):
        def __init__(self, base: nn.Linear) -> None:
            super().__init__()
            self.base = base
            self.lora_A = nn.Linear(base.in_features, rank, bias=False)
            self.lora_B = nn.Linear(rank, base.out_features, bias=False)
            nn.init.zeros_(self.lora_B.weight)
            self.scaling = 2.0

        def forward(self, x):
            return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling

    for p in model.parameters():
        p.requires_grad_(False)
    torch.manual_seed(1)
    for blk in model.blocks:
        for name in ("q", "k", "v", "o", "gate", "up", "down"):
            setattr(blk, name, LoRALinear(getattr(blk, name)))
    return model


def hf_config(case: dict[str, Any]) -> dict[str, Any]:
    if case.get("family") == "llama":
        return {"model_type": "llama", "num_hidden_layers": case["layers"], "hidden_size": case["hidden"],
                "num_attention_heads": case["heads"], "num_key_value_heads": case["heads"], "intermediate_size": case["ffn"],
                "vocab_size": case["vocab"], "max_position_embeddings": case["seq"], "tie_word_embeddings": False}
    return {"n_layer": case["layers"], "n_embd": case["hidden"], "n_head": case["heads"], "vocab_size": case["vocab"],
            "n_positions": case["seq"], "model_type": "gpt2"}


def _batch(case: dict[str, Any]):
    import torch

    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, case["vocab"], (case["micro_batch"], case["seq"]), generator=g)
    return idx, torch.roll(idx, -1, dims=1)


def _steps(model, opt, case, n: int, on_step=None) -> list[float]:
    idx, targets = _batch(case)
    times = []
    for _ in range(n):
        if on_step:
            on_step()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def measure_single(case: dict[str, Any], threads: int, warmup: int, steps: int) -> dict[str, Any]:
    """Median of ``steps`` training steps during which no other process kept ``QUIET_CORES``
    busy (a disturbed step is dropped, the host waited for, and the step re-taken; at most
    3×steps attempts — the record says how many were dropped), and the median memory the kernel
    mapped in per step (minor page faults × 4 KiB: fresh tensors the allocator took from the OS)."""
    import resource

    import torch

    from planner_service.profiling.fingerprint import HostMonitor, wait_until_quiet

    torch.set_num_threads(threads)
    model = build_model(case)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    _steps(model, opt, case, warmup)
    times: list[float] = []
    busy_seen: list[float] = []
    faulted_bytes: list[float] = []
    dropped = 0
    mon = HostMonitor()
    for _ in range(3 * steps):
        if len(times) >= steps:
            break
        mon.reset()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = _steps(model, opt, case, 1)[0]
        faulted_bytes.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) * resource.getpagesize())
        busy = mon.others_busy_cores() or 0.0
        if busy >= QUIET_CORES and t > 0.05:  # (shorter windows are below /proc/stat resolution)
            dropped += 1
            wait_until_quiet(QUIET_CORES, 60.0)
            continue
        times.append(t)
        busy_seen.append(busy)
    if len(times) < 3:
        raise RuntimeError(f"the host stayed busy: only {len(times)} undisturbed steps")
    return {"median_s": statistics.median(times), "samples_s": times, "threads": threads, "dropped_busy_steps": dropped,
            "max_host_busy_cores": max(busy_seen), "params": sum(p.numel() for p in model.parameters()),
            "page_faulted_bytes_per_step": statistics.median(faulted_bytes)}


# ---------------------------------------------------------------- host speed drift probe
PROBE_SHAPE = (1024, 1024, 1024)  # in the quick profile's torch grid (layout nt)
PROBE_ELEMENTS = 1 << 22  # the profile's "scale" op at 4M elements (16 MB, below the first-touch size)


#: A case is measured again (at most twice) when the host runs further than this fraction off
#: its speed right after profiling, for GEMMs or for streaming memory access.
DRIFT_TOLERANCE = 0.15


def within_drift(*ratios: float | None) -> bool:
    return all(r is None or abs(r - 1) <= DRIFT_TOLERANCE for r in ratios)


@dataclass(frozen=True)
class Probe:
    """Times of two short probes, taken right after profiling (the reference) or now: a 1024³
    ``F.linear`` GEMM (in the profile's grid) and an in-place pass over 16 MB (no allocation,
    so the allocator's state does not enter), inputs rotated past the last-level cache."""

    gemm_s: float
    stream_s: float
    threads: int


@functools.lru_cache(maxsize=1)
def _probe_buffers():
    """The probe's operands, made once per process (allocating and filling them would cost more
    than the probe and would page-fault)."""
    import torch

    from planner_service.profiling.cases import last_level_cache_bytes, rotation_count

    m, n, k = PROBE_SHAPE
    llc = last_level_cache_bytes()
    sets = [(torch.randn(m, k), torch.randn(n, k)) for _ in range(rotation_count(4 * (m * k + k * n), llc))]
    xs = [torch.ones(PROBE_ELEMENTS // 1024, 1024) for _ in range(rotation_count(4 * PROBE_ELEMENTS, llc))]
    return sets, xs


def take_probe(threads: int, repeats: int = 1) -> Probe:
    """The probe's times now (per component the median of ``repeats`` probes)."""
    import torch

    torch.set_num_threads(threads)
    sets, xs = _probe_buffers()
    gemm, stream = [], []
    if repeats > 1:  # a reference: first bring the clock and the operands to steady state
        for _ in range(2):
            _median_time(lambda i: torch.nn.functional.linear(*sets[i % len(sets)]))
            _median_time(lambda i: xs[i % len(xs)].mul_(1.0))
    for _ in range(repeats):
        gemm.append(_median_time(lambda i: torch.nn.functional.linear(*sets[i % len(sets)])))
        stream.append(_median_time(lambda i: xs[i % len(xs)].mul_(1.0)))
    return Probe(gemm_s=statistics.median(gemm), stream_s=statistics.median(stream), threads=threads)


def probe_speed(ref: Probe) -> float:
    """How fast the host runs now compared with the reference: time now over time then, of the
    GEMM or of the memory pass, whichever is further from 1 (> 1: slower — which no
    calibration can predict)."""
    now = take_probe(ref.threads)
    return max((now.gemm_s / ref.gemm_s, now.stream_s / ref.stream_s), key=lambda r: abs(r - 1))


def settle(ref: Probe, tries: int = 3) -> float:
    """Wait (10 s at a time) until the probes run within DRIFT_TOLERANCE of the reference."""
    ratio = probe_speed(ref)
    for _ in range(tries):
        if within_drift(ratio):
            break
        time.sleep(10.0)
        ratio = probe_speed(ref)
    return ratio


def profile_gemm_ratio(profile: dict[str, Any], probe: Probe) -> float | None:
    """The probe's GEMM time over the same GEMM's time in the profile: far from 1 means the
    host's speed moved while it was being profiled."""
    m, n, k = PROBE_SHAPE
    ref = [x["seconds"] for x in profile["measurements"] if x["op"] == "gemm" and x.get("backend") == "torch"
           and x.get("layout") == "nt" and (x["shape"]["m"], x["shape"]["n"], x["shape"]["k"]) == (m, n, k)]
    return probe.gemm_s / ref[0] if ref else None


def _median_time(fn, repeats: int = 7) -> float:
    fn(0)
    times = []
    for i in range(1, repeats + 1):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ------------------------------------------------------------- where a measured step goes
_CATEGORIES = (
    ("gemm", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
    ("dropout_rng", ("aten::bernoulli_",)),
    ("softmax", ("aten::_softmax", "aten::_log_softmax", "aten::_softmax_backward_data", "aten::_log_softmax_backward_data")),
    ("layernorm", ("aten::native_layer_norm", "aten::native_layer_norm_backward")),
    ("gelu", ("aten::gelu", "aten::gelu_backward")),
    ("copies", ("aten::copy_", "aten::cat", "aten::clone", "aten::contiguous")),
    ("loss", ("aten::nll_loss_forward", "aten::nll_loss_backward", "aten::nll_loss_nd", "aten::nll_loss")),
    ("embedding", ("aten::embedding", "aten::embedding_dense_backward", "aten::index_select", "aten::index_add_")),
)


def explain_step(case: dict[str, Any], threads: int, profile: dict[str, Any], ref: Probe, tries: int = 5) -> dict[str, Any]:
    """One training step under torch.profiler (taken when the host is quiet): self time per
    category of ATen op, the optimizer, and the time outside any op (Python, autograd engine,
    allocator), next to the cost model's GEMM time for exactly the GEMM shapes that ran."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from cost_model.compute import gemm_time_s
    from cost_model.devices import get_device
    from cost_model.profiles import apply_profile
    from planner_service.profiling.fingerprint import HostMonitor, wait_until_quiet
    from planner_service.profiling.trace_import import _gemm_shape

    torch.set_num_threads(threads)
    model = build_model(case)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    _steps(model, opt, case, 2)
    dev = apply_profile(get_device("local-cpu"), profile)
    mon = HostMonitor()
    for _attempt in range(tries):
        wait_until_quiet(QUIET_CORES, 60.0)
        before = probe_speed(ref)
        torch.set_num_threads(threads)
        mon.reset()
        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            wall = _steps(model, opt, case, 1)[0]
        busy = mon.others_busy_cores() or 0.0
        if busy < QUIET_CORES and within_drift(before, probe_speed(ref)):
            break
        time.sleep(5.0)
    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        prof.export_chrome_trace(fh.name)
        with open(fh.name) as trace_fh:
            trace = json.load(trace_fh)
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (e.get("tid"), e["ts"], -e["dur"]))
    opt_spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name", "")).startswith("Optimizer.step")]
    # self time = duration minus the durations of the ops directly nested in it
    child = {id(e): 0.0 for e in ops}
    stack: list[dict] = []
    last_tid = None
    for e in ops:
        if e.get("tid") != last_tid:
            stack, last_tid = [], e.get("tid")
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        if stack:
            child[id(stack[-1])] += e["dur"]
        stack.append(e)
    cats: dict[str, float] = {}
    gemm_model = 0.0
    n_ops = 0
    for e in ops:
        self_s = max(0.0, e["dur"] - child[id(e)]) * 1e-6
        name = e["name"]
        n_ops += 1
        in_opt = any(a <= e["ts"] < b for a, b in opt_spans)
        cat = "optimizer" if in_opt else next((c for c, names in _CATEGORIES if name in names), "other_elementwise")
        cats[cat] = cats.get(cat, 0.0) + self_s
        if cat == "gemm":
            shp = _gemm_shape(name, e.get("args", {}).get("Input Dims"))
            if shp:
                gemm_model += float(gemm_time_s(shp["m"], shp["n"], shp["k"], dev, "fp32", shp["batch"]))
    in_ops = sum(cats.values())
    cats["outside_ops"] = max(0.0, wall - in_ops)
    return {"profiled_step_s": wall, "host_busy_cores": busy, "aten_ops": n_ops, "self_s": cats,
            "gemm_model_same_shapes_s": gemm_model}


# ---------------------------------------------------------------------- data parallel (gloo)
def _dp_worker(rank: int, world: int, port: int, case: dict[str, Any], warmup: int, steps: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    model = DDP(build_model(case))
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    from planner_service.profiling.fingerprint import HostMonitor

    _steps(model, opt, case, warmup, on_step=dist.barrier)
    mon = HostMonitor()
    times, busy = [], []
    for _ in range(2 * steps):
        mon.reset()
        times += _steps(model, opt, case, 1, on_step=dist.barrier)
        busy.append(mon.others_busy_cores() or 0.0)
    # a step ends when the slowest rank ends it
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        # the other ranks are "other processes" here: a step is disturbed beyond them
        limit = (world - 1) + QUIET_CORES
        clean = [x for x, b in zip(t.tolist(), busy, strict=False) if b < limit]
        use = clean if len(clean) >= 3 else t.tolist()
        print("RESULT " + json.dumps({"median_s": statistics.median(use), "samples_s": use, "threads": 1,
                                      "dropped_busy_steps": len(times) - len(use)}), flush=True)
    dist.destroy_process_group()


def measure_dp(case: dict[str, Any], world: int, warmup: int, steps: int, tries: int = 3) -> dict[str, Any]:
    """Median step of ``world`` gloo DDP processes.  A rank that dies before rank 0 reports (gloo
    has been seen to abort a process, "terminate called without an active exception") costs a
    fresh start on a new port, ``tries`` times at most; rank 0's result stands when only the
    teardown after it failed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    failure = ""
    for _attempt in range(tries):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [
            subprocess.Popen([sys.executable, __file__, "--dp-worker", str(r), str(world), str(port), json.dumps(case), str(warmup), str(steps)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for r in range(world)
        ]
        outs = [p.communicate(timeout=1800) for p in procs]
        for line in outs[0][0].splitlines():
            if line.startswith("RESULT "):
                return dict(json.loads(line[7:]))
        failure = "; ".join(f"rank {r} exit {p.returncode}: {err.strip().splitlines()[-1:]}"
                            for r, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)) if p.returncode != 0) or "no result"
        print(f"  DP run failed ({failure}), starting again", flush=True)
    raise RuntimeError(f"DP workers failed {tries} times: {failure}")


# ------------------------------------------------------------------------------ predictions
def predict(case: dict[str, Any], dp: int, profile: dict[str, Any] | None, framework: str = "megatron-core") -> dict[str, Any]:
    from cost_model import (
        Strategy,
        Training,
        cluster_from_dict,
        estimate,
        from_hf_config,
    )

    model = from_hf_config(hf_config(case), name=f"case-{case['name']}")
    training = Training(global_batch_size=case["micro_batch"] * dp, sequence_length=case["seq"], dtype="fp32",
                        optimizer="adam", attention="unfused", fused_kernels=False, grad_reduce_overlap=dp > 1, framework=framework,
                        lora_rank=case.get("lora_rank", 0))
    cluster = cluster_from_dict({"name": "local", "node_groups": [{"name": "cpu", "count": 1, "gpus_per_node": dp, "device": "local-cpu"}]})
    try:
        est = estimate(model, training, cluster, Strategy(dp=dp, micro_batch_size=case["micro_batch"]), profile=profile)
    except Exception as exc:  # noqa: BLE001 - reported in the results, not hidden
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"step_time_s": est.step_time_s, "breakdown_s": est.breakdown_s, "profile_ids": list(est.profile_ids),
            "params": model.total_params()}


# ----------------------------------------------------------------------------------- driver
def wait_for_quiet(max_wait_s: float = 300.0) -> float | None:
    """Wait (up to ``max_wait_s``) until other processes use < QUIET_CORES cores; return the
    last reading.  Measurements on a busy shared host would measure the contention."""
    from planner_service.profiling.fingerprint import host_busy_cores, wait_until_quiet

    busy = host_busy_cores(1.0)
    if busy is not None and busy >= QUIET_CORES:
        print(f"  host busy ({busy:.2f} cores used by other processes); waiting up to {max_wait_s:.0f} s…", flush=True)
        busy, waited = wait_until_quiet(QUIET_CORES, max_wait_s, poll_s=1.0)
        print(f"  waited {waited:.0f} s (now {busy:.2f} cores busy)", flush=True)
    return busy


def take_profile(threads: int, path: Path, reuse: bool, concurrent: int = 1) -> tuple[dict[str, Any], Probe]:
    """The profile (taken now, or the saved one) and the speed probe's reference right after it.
    ``concurrent``: ranks sharing the host while profiling (``planner profile --concurrent``);
    such a profile is slower than the probe alone by design, so its drift check is skipped."""
    from cost_model.profiles import load_profile_file, with_fit
    from planner_service.profiling import ProfileOptions, run_profile

    if reuse and path.exists():
        print(f"reusing {path.relative_to(ROOT)}")
        return load_profile_file(path), take_probe(threads, repeats=5)
    best = None
    for _attempt in range(3):
        wait_for_quiet()
        t0 = time.monotonic()
        prof = with_fit(run_profile(ProfileOptions(quick=True, threads=threads, concurrent=concurrent)))
        # the host's speed right after profiling must match what the profile saw, or the
        # profile caught a transient slow (or fast) phase of the shared machine
        probe = take_probe(threads, repeats=5)
        ratio = profile_gemm_ratio(prof, probe) if concurrent == 1 else None
        print(f"profiled with {threads} thread(s) in {time.monotonic() - t0:.0f} s: "
              f"GEMM {prof['fit']['rates']['gemm_tflops'].get('fp32', 0) * 1e3:.0f} GFLOP/s, "
              f"bandwidth {prof['fit']['rates'].get('memory_bandwidth_GBps', float('nan')):.1f} GB/s, "
              f"fit median error GEMM {prof['fit']['quality']['gemm']['median_abs_rel_error'] * 100:.1f}%; "
              f"probe now/profile {ratio if ratio is None else round(ratio, 2)}", flush=True)
        if best is None or (ratio is not None and abs(ratio - 1) < abs(best[1] - 1)):
            best = (prof, ratio if ratio is not None else 1.0, probe)
        if within_drift(ratio):
            break
        print("  the host's speed moved during profiling; profiling again", flush=True)
    prof = best[0]
    path.write_text(json.dumps(prof, indent=1) + "\n")
    return prof, best[2]


def profile_path(case: dict[str, Any], dp: int) -> Path:
    return PROFILES / f"case_{case['name']}_dp{dp}.json"


def _err(pred: dict[str, Any], measured: float) -> float | None:
    return (pred["step_time_s"] - measured) / measured if "step_time_s" in pred else None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cases", default=",".join(c["name"] for c in CASES))
    ap.add_argument("--no-dp", action="store_true")
    ap.add_argument("--reuse-profiles", action="store_true", help="use the profiles of a previous run if present")
    ap.add_argument("--no-explain", action="store_true", help="skip the torch.profiler breakdown of one step per case")
    ap.add_argument("--repredict", action="store_true",
                    help="measure nothing: refit the saved profiles and recompute the predictions for the saved measurements "
                         "(after a cost model or calibration change)")
    args = ap.parse_args(argv)
    if args.repredict:
        return repredict()
    try:
        import torch
    except ImportError:
        print("the CPU validation needs torch: pip install '.[torch]'")
        return 2
    from planner_service.profiling.fingerprint import cpu_count, cpu_model

    RESULTS.mkdir(parents=True, exist_ok=True)
    cores = cpu_count()
    dp_world = 2 if cores >= 2 and not args.no_dp else 0
    PROFILES.mkdir(parents=True, exist_ok=True)
    wanted = set(args.cases.split(","))
    rows = []
    for case in (c for c in CASES if c["name"] in wanted):
        for dp in ([1, dp_world] if dp_world else [1]):
            # A fresh profile right before each case, so that profile and measurement see the
            # host in the same state (this VM's speed drifts by up to 2× over minutes).  A DP
            # rank is one core of a host whose other core runs the other rank: profile it so.
            if dp == 1:
                prof, ref = take_profile(cores, profile_path(case, dp), args.reuse_profiles)
            else:
                prof, ref = take_profile(1, profile_path(case, dp), args.reuse_profiles, concurrent=dp)
            for _attempt in range(3):
                busy = wait_for_quiet()
                speed_before = settle(ref)
                print(f"case {case['name']} dp={dp}: measuring…", flush=True)
                m = measure_single(case, cores, args.warmup, args.steps) if dp == 1 else measure_dp(case, dp, args.warmup, args.steps)
                speed_after = probe_speed(ref)
                if within_drift(speed_before, speed_after):
                    break
                print(f"  host speed vs profile {speed_before:.2f}/{speed_after:.2f}: outside ±{DRIFT_TOLERANCE:.0%}, measuring again", flush=True)
            with_p = predict(case, dp, prof)
            without = predict(case, dp, None)
            explained = explain_step(case, cores, prof, ref) if dp == 1 and not args.no_explain else None
            rows.append({
                "case": case["name"], "dp": dp, "config": case, "threads_per_process": m["threads"],
                "measured_step_s": m["median_s"], "measured_samples_s": m["samples_s"],
                "host_busy_cores": busy,
                "predicted_with_profile": with_p, "error_with_profile": _err(with_p, m["median_s"]),
                "predicted_without_profile": without, "error_without_profile": _err(without, m["median_s"]),
                "dropped_busy_steps": m.get("dropped_busy_steps"),
                "page_faulted_bytes_per_step": m.get("page_faulted_bytes_per_step"),
                "profile": {"file": str(profile_path(case, dp).relative_to(ROOT)), "profile_id": prof["fit"]["profile_id"],
                            "threads": prof["settings"]["threads"], "concurrent": prof["settings"].get("concurrent", 1),
                            "gemm_GFLOPs": prof["fit"]["rates"]["gemm_tflops"].get("fp32", 0) * 1e3,
                            "memory_bandwidth_GBps": prof["fit"]["rates"].get("memory_bandwidth_GBps"),
                            "probe_reference": asdict(ref)},
                "host_slowdown_vs_profile": [speed_before, speed_after],
                "explain": explained,
            })
            r = rows[-1]
            slow = [f"{x:.2f}" for x in (speed_before, speed_after) if x is not None]
            print(f"  host speed probe vs right after profiling, before/after: {'/'.join(slow) or 'n/a'}")
            print(f"  measured {m['median_s']:.3f} s; predicted {with_p.get('step_time_s', float('nan')):.3f} s with profile"
                  f" ({(r['error_with_profile'] or float('nan')) * 100:+.1f}%), "
                  f"{without.get('step_time_s', float('nan')):.3f} s without"
                  + (f" ({r['error_without_profile'] * 100:+.1f}%)" if r["error_without_profile"] is not None else f" [{without.get('error')}]"),
                  flush=True)

    host = {"cpu": cpu_model(), "cores": cores, "torch": torch.__version__}
    saved = RESULTS / "cpu_validation.json"
    previous = json.loads(saved.read_text()) if saved.exists() else None
    if wanted != {c["name"] for c in CASES} and previous is not None and previous.get("host") != host:
        print(f"the saved rows were measured on another host ({previous.get('host')}): keeping only this run's", flush=True)
    elif wanted != {c["name"] for c in CASES} and previous is not None:
        # a subset run (--cases): the other cases keep their saved rows (same host), in the table's order
        ran = {(r["case"], r["dp"]) for r in rows}
        kept = [r for r in previous["cases"] if (r["case"], r["dp"]) not in ran]
        order = [c["name"] for c in CASES]
        rows = sorted(kept + rows, key=lambda r: (order.index(r["case"]) if r["case"] in order else len(order), r["dp"]))
    return finish(rows, host)


def repredict() -> int:
    from cost_model.profiles import load_profile_file, with_fit

    saved = json.loads((RESULTS / "cpu_validation.json").read_text())
    rows = saved["cases"]
    for r in rows:
        path = ROOT / r["profile"]["file"]
        prof = dict(load_profile_file(path))
        prof.pop("fit", None)
        prof = with_fit(prof)
        path.write_text(json.dumps(prof, indent=1) + "\n")
        r["predicted_with_profile"] = predict(r["config"], r["dp"], prof)
        r["error_with_profile"] = _err(r["predicted_with_profile"], r["measured_step_s"])
        r["predicted_without_profile"] = predict(r["config"], r["dp"], None)
        r["error_without_profile"] = _err(r["predicted_without_profile"], r["measured_step_s"])
        if r.get("explain") and r["dp"] == 1:
            r["explain"]["note"] = "gemm_model_same_shapes_s is from the measuring run's fit"
    return finish(rows, saved["host"])


def finish(rows: list[dict[str, Any]], host: dict[str, Any]) -> int:
    """Summarise, write bench/results/cpu_validation.json and print the tables."""
    def med_abs(key):
        vals = [abs(r[key]) for r in rows if r[key] is not None]
        return statistics.median(vals) if vals else None

    summary = {
        "median_abs_error_with_profile": med_abs("error_with_profile"),
        "median_abs_error_without_profile": med_abs("error_without_profile"),
        "cases_without_profile_failed": sum(1 for r in rows if r["error_without_profile"] is None),
        "target_median_abs_error": TARGET_MEDIAN_ERROR,
    }
    summary["meets_target"] = summary["median_abs_error_with_profile"] is not None and summary["median_abs_error_with_profile"] <= TARGET_MEDIAN_ERROR
    out = {
        "host": host,
        "cases": rows,
        "summary": summary,
    }
    (RESULTS / "cpu_validation.json").write_text(json.dumps(out, indent=1) + "\n")

    head = (f"{'case':<5}{'dp':>3}{'h':>6}{'s':>6}{'b':>4}{'L':>4}  {'measured s':>10}  {'pred (profile)':>14}  {'err':>7}  "
            f"{'pred (catalog)':>14}  {'err':>8}  {'host slowdown':>13}")
    print("\n" + head + "\n" + "-" * len(head))
    for r in rows:
        c = r["config"]
        wp, wo = r["predicted_with_profile"], r["predicted_without_profile"]
        ew = f"{r['error_with_profile'] * 100:+.1f}%" if r["error_with_profile"] is not None else "n/a"
        eo = f"{r['error_without_profile'] * 100:+.1f}%" if r["error_without_profile"] is not None else "failed"
        print(f"{r['case']:<5}{r['dp']:>3}{c['hidden']:>6}{c['seq']:>6}{c['micro_batch']:>4}{c['layers']:>4}  {r['measured_step_s']:>10.3f}  "
              f"{wp.get('step_time_s', float('nan')):>14.3f}  {ew:>7}  {wo.get('step_time_s', float('nan')):>14.3f}  {eo:>8}  "
              f"{'/'.join(f'{x:.2f}' for x in r['host_slowdown_vs_profile'] if x is not None):>13}")
    explained = [r for r in rows if r.get("explain")]
    if explained:
        cols = ["gemm", "dropout_rng", "softmax", "layernorm", "gelu", "copies", "other_elementwise", "loss", "embedding", "optimizer", "outside_ops"]
        print("\nwhere one profiled step goes (s, self time; dp=1), vs the model's GEMM time on the same shapes:")
        print(f"{'case':<5}{'step':>7}{'ops':>6}{'gemm(model)':>12}" + "".join(f"{c[:9]:>10}" for c in cols))
        for r in explained:
            e = r["explain"]
            print(f"{r['case']:<5}{e['profiled_step_s']:>7.3f}{e['aten_ops']:>6}{e['gemm_model_same_shapes_s']:>12.3f}"
                  + "".join(f"{e['self_s'].get(c, 0.0):>10.3f}" for c in cols))
    fmt = lambda v: f"{v * 100:.1f}%" if v is not None else "n/a"  # noqa: E731
    print(f"\nmedian |error|: {fmt(summary['median_abs_error_with_profile'])} with the profile, "
          f"{fmt(summary['median_abs_error_without_profile'])} with catalog defaults (target ≤ {TARGET_MEDIAN_ERROR * 100:.0f}% with the profile)")
    print(f"wrote {(RESULTS / 'cpu_validation.json').relative_to(ROOT)}")
    return 0 if summary["meets_target"] else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--dp-worker":
        r, w, port, case_json, warm, steps = sys.argv[2:8]
        _dp_worker(int(r), int(w), int(port), json.loads(case_json), int(warm), int(steps))
        raise SystemExit(0)
    raise SystemExit(main(sys.argv[1:]))
