"""The few global constants fitted against published runs, per framework, fabric and format.

Loaded from ``cost_model/data/calibration.json`` (written by ``bench/calibrate.py`` with its
provenance: data file hash, rows, objective, date).  Each constant has a physical meaning and a
prior — the value used when nothing has been fitted, and the value leave-one-source-out
validation falls back to when the held-out source is the only one that informs it:

* ``framework_gemm_efficiency[framework]`` — the framework's kernels' large-GEMM rate relative
  to Megatron-Core with Transformer Engine (the family constants of
  :data:`cost_model.devices.FAMILY_EFFICIENCY` were set on Megatron-LM runs, so megatron-core is
  1 by definition).  DeepSpeed-era stacks (``megatron-deepspeed``, ``deepspeed``: BLOOM, MT-NLG,
  GPT-NeoX, Narayanan's ZeRO-3 runs) share one value: the same Megatron-LM 2021 model code
  under DeepSpeed's engine, whose unfused kernels, engine dispatch and unfused optimizer steps
  add to every GEMM's time (DeepSpeed issue tracker; BLOOM chronicles report the same code
  10–20% below Megatron-LM); the pipeline engine's per-layer cost and the stage-3 hooks are
  constants of their own (below).  Prior 1.
* ``fabric_fraction[fabric]`` — achieved NCCL bus bandwidth over an inter-node fabric relative to
  InfiniBand (whose fraction the device family carries, ≈ 0.88): RoCE with a tuned
  congestion control reaches IB parity at large messages (Llama 3 §3.3.1: Meta's RoCE and IB
  clusters); Omni-Path has no GPUDirect-RDMA NCCL transport of its own (PSM2 via the OFI plugin,
  host-staged), prior 0.7.
* ``sharded_collective_efficiency`` — the achieved fraction of the ring bus bandwidth of the
  per-layer parameter all-gathers and gradient reduce-scatters of ZeRO-3 / FSDP (issued per
  module from hooks, flattened and copied into the gathered buffer, each a separate NCCL call
  that cannot run at the full ring rate): prior 1, fitted.  DeepSpeed's stage 3
  (``sharded_collective_efficiency.megatron-deepspeed``, shared by ``deepspeed``) has its own:
  it gathers every parameter on its own into a list of per-rank partitions
  (``torch.distributed.all_gather`` with a tensor list, after a ``torch.cuda.synchronize()``)
  and reduce-scatters gradient buckets from lists as well, where FSDP and Megatron-Core's FSDP
  gather one flat buffer per unit in place (``all_gather_into_tensor``) — the two
  implementations reach different fractions of the same links.  The list gather's copy-out, n
  launch-bound copies per gathered tensor, is costed on its own
  (``layer_cost.deepspeed_gather_copy_out_s``), not folded into this fraction.
* ``fp8_gemm_efficiency`` — FP8 GEMM rate as a fraction of the FP8 dense peak relative to the
  family's BF16 large-GEMM fraction of the BF16 peak.  Large cuBLASLt FP8 GEMMs on H100 reach
  ≈ 1.3–1.45 PFLOP/s of 1.98 (0.66–0.73) where BF16 ones reach ≈ 0.70–0.75 of 0.99, so the
  relative fraction is ≈ 0.9 (scale-factor loads and the FP8 epilogue); the end-to-end
  1.3–1.6× speed-ups NVIDIA quotes for Transformer Engine are lower because attention, the LM
  head, the casts/amax and elementwise work stay 16-bit — those are costed separately
  (``layer_cost.fp8_cast_s``, BF16 attention and head), not folded into this constant.
  Prior 0.9, bounds [0.6, 1].  FP4 (NVFP4) training uses the same constant against the FP4
  peak: on Blackwell both are block-scaled tensor-core GEMMs of cuBLASLt (MXFP8: one E8M0 scale
  per 32 elements, NVFP4: one E4M3 scale per 16), whose departure from the BF16 fraction is the
  same kind of cost (scale-factor loads, the dequantising epilogue); no separate FP4 constant
  is fitted (four FP4 rows could not tell one apart from it).

  Bounds (``calibration_fit.LOWER_BOUND``/``UPPER_BOUND``): the fabric fractions ≥ 0.5 (an
  Omni-Path 100 Gb/s HFI reaches 9–11 GB/s of its 12.5 in OSU/NCCL benchmarks), framework
  kernel efficiencies in [0.6, 1].

  The device family's own large-GEMM fraction (:data:`cost_model.devices.FAMILY_EFFICIENCY`)
  is not fitted: against the FP8 efficiency it is not identified.  Hopper's BF16 rows
  (Megatron-LM's H100 table, Llama 3) and its FP8 rows (Megatron-Bridge) constrain little
  more than their product, and a fitted Hopper correction moved from 0.92 in-sample to 1.10
  with Megatron-LM's H100 table left out — 0.81 of the BF16 peak, above the 0.70–0.75 that
  large BF16 GEMMs reach (see ``fp8_gemm_efficiency``) — a constant the data cannot pin down.
  Blackwell's rows are all FP8/FP4 Megatron-Bridge rows: the same confound, so neither family
  is corrected.

* ``pipeline_layer_overhead_s[framework]`` — fixed seconds per checkpointed decoder layer per
  micro-batch of DeepSpeed's pipeline engine (``megatron-deepspeed``, ``deepspeed``; pp > 1).  Its
  ``PipelineModule`` runs a stage's layers one at a time from Python and checkpoints each on its
  own (``activation_checkpoint_interval`` 1, Megatron-DeepSpeed's default): per layer and
  micro-batch it saves and restores the CPU/CUDA RNG states, partitions the checkpointed input
  across the TP group and, in backward, all-gathers it again (a blocking, latency-bound
  collective) before recomputing; the schedule itself interprets one instruction at a time
  with a blocking call each.  None of it scales with the micro-batch, so a smaller micro-batch
  pays it more often, and it follows the layers a stage holds (a deep pipeline of thin stages
  pays less per micro-batch than a shallow one of thick stages).  Megatron-Core's schedule
  (batched isend/irecv, the block's own checkpointing inside one module) has none.  Since the
  per-layer work is the checkpoint's, a layer that is not checkpointed does not pay it: every
  layer under full recompute (the engine has no partial recompute) and under selective
  recompute (Megatron-DeepSpeed checkpoints the attention core through the same function), none
  without recompute (every row it is fitted on recomputes every layer).  Prior 0.01 s.  (Fitted per stage instead, as a first version did, it left the BLOOM sweep's thin
  24- and 48-stage pipelines and MT-NLG's 3-layer stages 15–35% too slow and its 2-stage ones
  too fast.)  The engine's per-micro-batch gradient accumulation, which follows the stage's parameters
  rather than its layer count (BF16_Optimizer's fp32 accumulation above all), is priced on its
  own (``stage_cost.grad_accumulation_s``), not folded in here.
* ``sharded_compute_efficiency[framework]`` — the fraction of its compute rate a layer keeps
  under DeepSpeed's ZeRO stage 3 (``megatron-deepspeed``, ``deepspeed``; zero_stage 3): every
  submodule's forward and backward runs between stage-3 pre/post hooks that coordinate the
  parameter fetch (the partition bookkeeping of each parameter, the prefetch queue, waits on
  the gather's CUDA event, releasing the gathered copy), issued from Python on the compute
  stream's critical path.  FSDP wraps whole units in one flat buffer and pays no per-module
  hook of this kind (1).  Prior 1.  (Folded into the framework's kernel efficiency, as a first
  version did, Narayanan's ZeRO-3 rows dragged the kernel constant of the ZeRO-1 pipeline runs
  of BLOOM and MT-NLG with them.)  One source fits it: Narayanan et al. 2021 Table 2 (DeepSpeed
  of 2021, fp16, 175B and 530B on 384–2,240 A100s), to about 0.67 — more than per-module hook
  work alone explains for layers that large (milliseconds of CPU work per module against tens
  of milliseconds of GEMMs), so the fitted value also carries whatever else that stage 3 paid
  beside compute, and a small model's ZeRO-3 step under today's DeepSpeed may run faster than
  it says; with one source, its leave-one-source-out value is the prior, and an estimate it
  prices has a step-time interval that spans the step at the prior (:func:`single_source_spread`).
* ``misaligned_gemm_fraction`` — the rate of a 16-bit GEMM whose reduction dimension is not a
  multiple of 8 elements (e.g. a head dimension of 108) relative to the aligned one: cuBLAS's
  tensor-core kernels need 16-byte aligned rows; the fallback runs far below them (NVIDIA's
  matrix-multiplication performance guide: dimensions multiple of 8 for FP16/BF16).  Prior 0.25.

* ``sharded_prefetch_overlap[framework]`` — the fraction of the DP overlap window
  (``DP_OVERLAP_WINDOW`` of a micro-batch's compute) behind which DeepSpeed's stage-3 gathers
  and reduce-scatters actually hide: its prefetch is bounded by ``stage3_prefetch_bucket_size``
  and issued from module hooks on the compute stream's schedule, so less than FSDP's (which
  keeps the full window, 1).  Prior 1.

* ``overlap_compute_slowdown`` — the fraction by which compute slows while a data-parallel
  collective runs beside it: NCCL's channels hold SMs (a GEMM sized in full waves spills into
  a tail wave) and both stream through HBM, so the overlapped time costs this fraction of
  itself — the per-micro-batch ZeRO-2/3 (FSDP) traffic (``layer_cost.sharded_microbatch_exposed_s``)
  and the bucketed gradient sync a framework overlaps with the last backward at any ZeRO stage
  (Megatron-Core's ``--overlap-grad-reduce``, :func:`cost_model.schedule.exposed_dp_sync_s`);
  Lee et al. 2025 characterise 10–40% GEMM slowdowns under concurrent collectives.  Prior 0.15, bounds [0.02, 0.6].

Constants are global: never per model, per row or per run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from cost_model.devices import NARROW_DTYPES, DeviceSpec
from cost_model.frameworks import runs_deepspeed_engine
from cost_model.result import StageEstimate

PRIORS: dict[str, float] = {
    "framework_gemm_efficiency.megatron-deepspeed": 1.0,
    "framework_gemm_efficiency.fsdp": 1.0,
    "framework_gemm_efficiency.paddle": 1.0,
    "fabric_fraction.roce": 1.0,
    "fabric_fraction.omnipath": 0.7,
    "sharded_collective_efficiency": 1.0,
    "sharded_collective_efficiency.megatron-deepspeed": 1.0,
    "fp8_gemm_efficiency": 0.9,
    "pipeline_layer_overhead_s.megatron-deepspeed": 0.01,
    "sharded_compute_efficiency.megatron-deepspeed": 1.0,
    "misaligned_gemm_fraction": 0.25,
    "sharded_prefetch_overlap.megatron-deepspeed": 1.0,
    "overlap_compute_slowdown": 0.15,
}
#: The suffix of the constants DeepSpeed's engine shares (``deepspeed`` and ``megatron-deepspeed``
#: run the same engine: module docstring).
DEEPSPEED = "megatron-deepspeed"


def _deepspeed_engine(name: str, framework: str, otherwise: float) -> float:
    """Constant ``name`` of DeepSpeed's engine (``name.megatron-deepspeed``, which ``deepspeed``
    shares) for a DeepSpeed framework; ``otherwise`` for the frameworks that lack that part."""
    return current().get(f"{name}.{DEEPSPEED}") if runs_deepspeed_engine(framework) else otherwise


#: The constants of DeepSpeed's stage 3 (its collectives, prefetch and hooks).
DEEPSPEED_STAGE3 = frozenset({"sharded_collective_efficiency.megatron-deepspeed", "sharded_prefetch_overlap.megatron-deepspeed",
                              "sharded_compute_efficiency.megatron-deepspeed"})


def constant_applies(name: str, model: Any, training: Any, cluster: Any, strategies: Iterable[Any]) -> bool:
    """Whether constant ``name`` can change the cost of ``model`` trained as ``training`` on
    ``cluster`` under any of ``strategies`` — the part of the step each constant prices (module
    docstring).  The fit uses it to tabulate only the rows a constant moves
    (``calibration_fit.affects``), the estimate to name the constants its step rests on
    (:func:`single_source_spread`)."""
    fw = training.framework
    strategies = tuple(strategies)
    if name == "framework_gemm_efficiency.megatron-deepspeed":
        return runs_deepspeed_engine(fw)
    if name.startswith("framework_gemm_efficiency."):
        return bool(fw == name.split(".", 1)[1])
    if name.startswith("fabric_fraction."):  # a node group on that fabric, and traffic between nodes
        fabric = name.split(".", 1)[1]
        return any(g.fabric == fabric for g in cluster.node_groups) and cluster.total_gpus > min(g.gpus_per_node for g in cluster.node_groups)
    if name == "sharded_collective_efficiency":
        return not runs_deepspeed_engine(fw) and any(s.zero_stage >= 3 for s in strategies)
    if name in DEEPSPEED_STAGE3:
        return runs_deepspeed_engine(fw) and any(s.zero_stage >= 3 for s in strategies)
    if name == "fp8_gemm_efficiency":
        return training.dtype in NARROW_DTYPES  # FP8 and FP4 (calibrated_device)
    if name == "pipeline_layer_overhead_s.megatron-deepspeed":
        return runs_deepspeed_engine(fw) and any(s.pp > 1 for s in strategies)
    if name == "overlap_compute_slowdown":  # per-micro-batch ZeRO-2/3 traffic or an overlapped step sync
        return bool(training.grad_reduce_overlap) and any(s.dp * s.cp > 1 for s in strategies)
    if name == "misaligned_gemm_fraction":
        return bool(training.attention == "unfused" and model.head_dim % 8 != 0)
    return False


def sharded_prefetch_overlap(framework: str) -> float:
    """Multiplier of the DP overlap window for ZeRO-3 traffic (1 except DeepSpeed's stage 3)."""
    return _deepspeed_engine("sharded_prefetch_overlap", framework, 1.0)


def sharded_collective_efficiency(framework: str) -> float:
    """Achieved fraction of the ring bus bandwidth of the framework's ZeRO-3 / FSDP collectives."""
    return _deepspeed_engine("sharded_collective_efficiency", framework, current().get("sharded_collective_efficiency"))


def pipeline_layer_overhead_s(framework: str) -> float:
    """Fixed seconds per decoder layer per micro-batch of the framework's pipeline engine (0 for
    Megatron-Core, FSDP and Paddle)."""
    return _deepspeed_engine("pipeline_layer_overhead_s", framework, 0.0)


def overlap_compute_slowdown() -> float:
    """Fraction of the overlapped time a kernel loses while a collective runs beside it."""
    return current().get("overlap_compute_slowdown")


def sharded_compute_efficiency(framework: str) -> float:
    """Fraction of its compute rate a layer keeps under the framework's ZeRO-3 hooks (1 except
    DeepSpeed's stage 3)."""
    return _deepspeed_engine("sharded_compute_efficiency", framework, 1.0)


@dataclass(frozen=True)
class Constants:
    """Flat ``name → value`` for the keys of :data:`PRIORS`, plus the step-time intervals
    (``regime → (q10, q90)`` of log(predicted/measured) from cross-validation)."""

    values: Mapping[str, float] = field(default_factory=lambda: dict(PRIORS))
    intervals: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    #: constant → the one source that informs it (``calibration_fit.informing_sources``)
    single_source: Mapping[str, str] = field(default_factory=dict)

    def get(self, name: str) -> float:
        return float(self.values.get(name, PRIORS.get(name, 1.0)))

    def framework_gemm_efficiency(self, framework: str) -> float:
        fw = DEEPSPEED if runs_deepspeed_engine(framework) else framework
        return 1.0 if fw == "megatron-core" else self.get(f"framework_gemm_efficiency.{fw}")

    def fabric_fraction(self, fabric: str) -> float:
        return 1.0 if fabric == "infiniband" else self.get(f"fabric_fraction.{fabric}")


@lru_cache(maxsize=1)
def _stored() -> Constants:
    path = resources.files("cost_model").joinpath("data/calibration.json")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return Constants()
    return Constants({**PRIORS, **data.get("constants", {})}, {k: (float(v[0]), float(v[1])) for k, v in data.get("step_time_log_interval", {}).items()},
                     {k: str(v) for k, v in data.get("single_source_constants", {}).items()})


_override: list[Constants] = []


def current() -> Constants:
    """The constants in force: the innermost :func:`using` block's, else the stored ones."""
    return _override[-1] if _override else _stored()


@contextmanager
def using(constants: Constants) -> Iterator[Constants]:
    """Cost with ``constants`` inside the block (calibration and cross-validation)."""
    _override.append(constants)
    try:
        yield constants
    finally:
        _override.pop()


def stored_document() -> dict[str, Any]:
    path = resources.files("cost_model").joinpath("data/calibration.json")
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc
    except FileNotFoundError:
        return {}


def calibrated_device(device: DeviceSpec, framework: str, dtype: str) -> DeviceSpec:
    """The device as the framework drives it: the large-GEMM fraction scaled by the
    framework's kernel efficiency and, for FP8 training, by the FP8 GEMM efficiency
    (:class:`Constants`).  GPU devices only; CPUs and profiled devices keep their figures."""
    if device.kind != "gpu" or device.profile_id:
        return device
    c = current()
    k = c.framework_gemm_efficiency(framework)
    if dtype in NARROW_DTYPES:
        k *= c.get("fp8_gemm_efficiency")
    if k == 1.0:
        return device
    eff = device.efficiency
    return replace(device, efficiency=replace(eff, gemm_max_fraction=eff.gemm_max_fraction * k))


def parallel_mix(pp: int, zero_stage: int) -> str:
    """The parallel mix of a layout, for the interval regimes: ``zero3`` (parameters gathered
    per layer: communication-bound at scale), ``pp`` (a pipeline: bubble and p2p), else
    ``tp-dp``."""
    if zero_stage >= 3:
        return "zero3"
    return "pp" if pp > 1 else "tp-dp"


def regime(framework: str, device_family: str, mix: str | None = None) -> str:
    """The interval regime of a prediction: framework × device family (× parallel mix)."""
    return f"{framework}/{device_family}" + (f"/{mix}" if mix else "")


#: Used when a regime has too few cross-validated rows: a symmetric bound over the sources' CV
#: residuals (calibration_fit.pooled_interval).
POOLED = "*"


def regime_key(intervals: Mapping[str, tuple[float, float]], framework: str, device_family: str, mix: str | None = None) -> str | None:
    """The most specific regime with an interval: framework/family/mix, then framework/family,
    then the pooled one (None: uncalibrated)."""
    for key in ((regime(framework, device_family, mix),) if mix else ()) + (regime(framework, device_family), POOLED):
        if key in intervals:
            return key
    return None


def step_interval_log(framework: str, device_family: str, mix: str | None = None) -> tuple[float, float] | None:
    """(q10, q90) of log(predicted/measured) step time for the regime, None when uncalibrated."""
    iv = current().intervals
    key = regime_key(iv, framework, device_family, mix)
    return iv[key] if key is not None else None


def single_source_spread(model: Any, training: Any, cluster: Any, strategy: Any) -> tuple[Constants, dict[str, str]] | None:
    """The constants in force with every constant that (a) only one source of the calibration
    set informs, (b) was fitted away from its prior and (c) prices part of this run
    (:func:`constant_applies`) put back at its prior, and those constants → their source; None
    when there is none.

    Leave-one-source-out cross-validation predicts a run of any other source at exactly those
    priors (``calibration_fit``: a constant only the held-out source informs falls back to its
    prior), so the step-time residuals behind the regime intervals say nothing about how far
    the fitted value carries beyond its source.  The estimate's interval therefore spans the
    step at both values (``cost_model.estimate``): e.g. DeepSpeed's stage-3 constants, fitted on
    Narayanan et al. 2021's ZeRO-3 runs of 2021's DeepSpeed alone."""
    c = current()
    names = {n: src for n, src in sorted(c.single_source.items())
             if n in PRIORS and abs(c.get(n) - PRIORS[n]) > 1e-9 and constant_applies(n, model, training, cluster, (strategy,))}
    if not names:
        return None
    return Constants({**c.values, **{n: PRIORS[n] for n in names}}, c.intervals), names


def prediction_intervals(framework: str, device_family: str, step_time_s: float, peak_stage: StageEstimate, mix: str | None = None) -> dict[str, Any]:
    """The interval fields of an estimate (:class:`cost_model.result.Estimate`).

    Step time: ``step·exp(q10)``, ``step·exp(q90)`` with (q10, q90) the leave-one-source-out
    quantiles of log(predicted/measured) of the regime (framework × device family × parallel
    mix, :func:`regime_key` falling back to coarser ones) (a p10 of the prediction error is a
    p90 of the true step relative to it, so the bounds are swapped: the true step lies in
    [step/exp(q90), step/exp(q10)] 80% of the time).  Memory: the same from the residuals of
    the measured peaks, widened by the fragmentation's range for a framework without measured
    peaks (``memory_interval_basis``, :mod:`cost_model.transformer.memory`), of ``peak_stage``
    (the stage with the largest predicted peak).
    """
    from cost_model.transformer.memory import memory_interval_fields

    q = step_interval_log(framework, device_family, mix)
    out = memory_interval_fields(peak_stage.peak_memory_GB, peak_stage.memory_GB, framework)
    if q is None:
        return out
    return {
        **out,
        "step_time_s_p10": step_time_s / math.exp(q[1]),
        "step_time_s_p90": step_time_s / math.exp(q[0]),
        "interval_regime": regime_key(current().intervals, framework, device_family, mix),
    }


def reload() -> None:
    """Forget the cached constants (after ``bench/calibrate.py`` rewrote the file)."""
    _stored.cache_clear()
