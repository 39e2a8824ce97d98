"""The cost model's answer for one strategy (contract v1 ``prediction``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BREAKDOWN_KEYS = (
    "compute",
    "recompute",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "pp_comm",
    "dp_comm_exposed",
    "offload_exposed",
    "bubble",
    "optimizer",
)

MEMORY_KEYS = ("weights", "gradients", "optimizer_state", "activations", "workspace")


@dataclass(frozen=True)
class StageEstimate:
    """One pipeline stage: its decoder layers [first_layer, last_layer] (0-based, inclusive),
    the device type it runs on, time per micro-batch and memory per device."""

    index: int
    first_layer: int
    last_layer: int
    device: str
    node_group: str
    has_embedding: bool
    has_head: bool
    forward_s: float
    backward_s: float
    peak_memory_GB: float
    memory_capacity_GB: float
    memory_GB: dict[str, float]
    layer_ranges: tuple[tuple[int, int], ...] = ()
    #: host memory per GPU of the state and activations offloaded to it
    #: (``training.optimizer_offload_fraction``, ``cpu_offload``, ``activation_offloading``), not
    #: part of ``peak_memory_GB``; 0 without offload
    host_memory_GB: float = 0.0

    @property
    def num_layers(self) -> int:
        if self.layer_ranges:
            return sum(b - a + 1 for a, b in self.layer_ranges)
        return self.last_layer - self.first_layer + 1

    @property
    def time_per_microbatch_s(self) -> float:
        return self.forward_s + self.backward_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "first_layer": self.first_layer,
            "last_layer": self.last_layer,
            "num_layers": self.num_layers,
            "layer_ranges": [list(r) for r in self.layer_ranges] or [[self.first_layer, self.last_layer]],
            "device": self.device,
            "node_group": self.node_group,
            "has_embedding": self.has_embedding,
            "has_head": self.has_head,
            "forward_s": self.forward_s,
            "backward_s": self.backward_s,
            "time_per_microbatch_s": self.time_per_microbatch_s,
            "peak_memory_GB": self.peak_memory_GB,
            "memory_capacity_GB": self.memory_capacity_GB,
            "memory_GB": dict(self.memory_GB),
            **({"host_memory_GB": self.host_memory_GB} if self.host_memory_GB else {}),
        }


@dataclass(frozen=True)
class Estimate:
    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    fits: bool
    peak_memory_GB: tuple[float, ...]
    breakdown_s: dict[str, float]
    stages: tuple[StageEstimate, ...]
    num_devices: int
    num_microbatches: int
    bottleneck: str
    profile_ids: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())
    step_time_s_p10: float | None = None
    step_time_s_p90: float | None = None
    peak_memory_GB_p10: float | None = None
    peak_memory_GB_p90: float | None = None
    #: memory.INTERVAL_BASES: the framework's measured peaks, or those widened by the
    #: fragmentation's range (no measured peak under the framework); None without an interval
    memory_interval_basis: str | None = None
    interval_regime: str | None = None
    model_params: float | None = None
    active_params: float | None = None  # parameters one token uses (MoE: top-k experts); = model_params when dense
    #: Some stage's p90 peak exceeds the usable memory while every p10 fits (kept, flagged).
    tight: bool = False
    peak_memory_quantity: str = "max_reserved"
    #: An interleaved schedule's micro-batch groups (frameworks.interleaved_group_sizes): the
    #: first group's size and each later one's; None without interleaving.
    microbatch_groups: tuple[int, int] | None = None
    #: Pipeline schedules the step runs (Training.pipeline_schedules: 1 without a pipeline).
    pipeline_schedules: int = 1

    @property
    def memory_breakdown_GB(self) -> tuple[dict[str, float], ...]:
        return tuple(s.memory_GB for s in self.stages)

    def to_dict(self) -> dict[str, Any]:
        """Contract v1 ``prediction``.  Intervals: ``step_time_s_p10``/``step_time_s_p90`` — the
        10th/90th percentiles of the step time, from the leave-one-source-out residuals of the
        prediction's regime (``interval_regime``: framework/device family; null where the cost
        model is uncalibrated, e.g. operator graphs); ``peak_memory_GB_p10``/``_p90`` — the
        same for the largest stage's peak memory (``peak_memory_GB`` is what PyTorch's caching
        allocator reserves, ``torch.cuda.max_memory_reserved``, plus CUDA context and NCCL
        buffers: ``peak_memory_quantity`` ``max_reserved``; the band comes from the residuals of
        the measured peaks, widened by the allocator's fragmentation range under a framework
        without measured peaks: ``memory_interval_basis``, :mod:`cost_model.transformer.memory`).  ``fits``: every stage's p10
        is within its memory; ``tight``: it fits but some stage's p90 is not."""
        return {
            "step_time_s": self.step_time_s,
            "step_time_s_p10": self.step_time_s_p10,
            "step_time_s_p90": self.step_time_s_p90,
            "peak_memory_GB_p10": self.peak_memory_GB_p10,
            "peak_memory_GB_p90": self.peak_memory_GB_p90,
            "memory_interval_basis": self.memory_interval_basis,
            "interval_regime": self.interval_regime,
            "tokens_per_s": self.tokens_per_s,
            "samples_per_s": self.samples_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu,
            "fits": self.fits,
            "tight": self.tight,
            "peak_memory_quantity": self.peak_memory_quantity,
            "peak_memory_GB": list(self.peak_memory_GB),
            "breakdown_s": dict(self.breakdown_s),
            "memory_breakdown_GB": [dict(m) for m in self.memory_breakdown_GB],
            "stages": [s.to_dict() for s in self.stages],
            "num_devices": self.num_devices,
            "num_microbatches": self.num_microbatches,
            "microbatch_groups": ({"first": self.microbatch_groups[0], "later": self.microbatch_groups[1]}
                                  if self.microbatch_groups else None),
            "pipeline_schedules": self.pipeline_schedules,
            "bottleneck": self.bottleneck,
            "profile_ids": list(self.profile_ids),
            "warnings": list(self.warnings),
            **({"model_params": self.model_params, "active_params": self.active_params} if self.model_params is not None else {}),
        }
