"""Evaluate an operator graph under a per-operator sharding and a pipeline split: the exact step
time and memory of one assignment (:func:`evaluate`, the one objective both the planner's
CP-SAT model and its brute-force check reproduce) and the contract-v1 estimate of one strategy
(:func:`estimate_graph`).

Parallel layout (Alpa-style, Zheng et al. 2022, with the data-parallel axis fixed): ``pp``
pipeline stages, each a contiguous range of operators in the analysis order
(:mod:`cost_model.graph.analysis`), run on a mesh of ``dp × t`` GPUs of one node group
(:mod:`cost_model.graph.mesh`).  Along ``dp`` every operator is data parallel (each replica gets
``micro_batch`` samples); along ``t`` each operator picks a sharding
(:mod:`cost_model.graph.layouts`), priced per micro-batch in :mod:`cost_model.graph.tables`.

Step time (the schedule of :mod:`cost_model.schedule`, ``vpp = 1``; Narayanan et al. 2021)::

    step = m·max_k T_k + Σ_k T_k − max_k T_k + max_k exposed_dp_k + max_k optimizer_k
    T_k  = Σ_{ops in k} (fwd + bwd + internal comm + incoming resharding) + p2p sends of k
    exposed_dp_k = max(0, dp_sync_k − w·backward_compute_k − k·backward_compute_k)

with ``w`` = :func:`cost_model.transformer.layer_cost.dp_overlap_fraction` of the mesh's device
(0.8 with ``grad_reduce_overlap``, 0 without).  A CPU parameter-server stage (embedding tables
on CPU nodes) is one more term ``T`` of the pipeline; its sparse optimizer update runs with the
GPUs' optimizer step.  Memory per GPU of stage k: weights, gradients, optimizer state, saved
activations × the 1F1B in-flight count, plus workspace and fragmentation as the transformer
path counts them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_model.cluster import Cluster
from cost_model.errors import InvalidStrategy, InvalidTraining
from cost_model.frameworks import (
    effective_zero_stage,
    layout_rule_violation,
    one_rank_sharding_note,
    precision_aware_zero_violation,
)
from cost_model.graph.assign import assignment_from_names, split_stages, stage_from_names
from cost_model.graph.ir import GraphSpec
from cost_model.graph.mesh import bucket_bytes, inflight, mesh_for, pick_group
from cost_model.graph.tables import CostTables, build_tables, p2p_stage_times, sync_ranks
from cost_model.result import Estimate, StageEstimate
from cost_model.schedule import exposed_dp_sync_s, pipeline_time_s
from cost_model.training import Training
from cost_model.transformer.layer_cost import (
    WORKSPACE_BYTES,
    deepspeed_step_gradient_bytes,
    dp_overlap_fraction,
    fragmentation_fraction,
)
from cost_model.transformer.memory import churned_gradients, memory_interval_fields
from cost_model.units import bytes_to_gb, flops_to_tflops, s_to_ms

#: Kernel launches of a fused multi-tensor optimizer step, as
#: :func:`cost_model.transformer.layer_cost.optimizer_kernels` counts them ("a handful").
_OPTIMIZER_STEP_KERNELS = 4


@dataclass(frozen=True, kw_only=True)
class StageResult:
    """One pipeline stage of an evaluated assignment: seconds per micro-batch, bytes per GPU."""

    index: int
    ops: tuple[int, ...]  # op indices
    forward_s: float
    backward_s: float
    compute_s: float
    bwd_compute_s: float
    tp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    optimizer_s: float
    weights_bytes: float
    gradients_bytes: float
    optimizer_state_bytes: float
    activation_bytes: float  # per micro-batch
    inflight: int
    workspace_bytes: float
    peak_bytes: float

    @property
    def time_s(self) -> float:
        return self.forward_s + self.backward_s + self.pp_comm_s


@dataclass(frozen=True, kw_only=True)
class GraphEval:
    """The step of one assignment: seconds, and bytes on the CPU parameter servers."""

    step_time_s: float
    pipeline_s: float
    dp_exposed_s: float
    optimizer_s: float
    stages: tuple[StageResult, ...]
    cpu_stage_s: float
    cpu_comm_s: float
    cpu_memory_bytes: float
    cpu_fits: bool
    fits: bool
    breakdown_s: dict[str, float]
    bottleneck: str


@dataclass(frozen=True, kw_only=True)
class _StageSums:
    """Per-stage sums of the chosen rows (arrays over stages) and the CPU parameter-server
    totals."""

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    comm_fwd_s: np.ndarray
    comm_bwd_s: np.ndarray
    sync_s: np.ndarray
    opt_s: np.ndarray
    weights_bytes: np.ndarray
    gradients_bytes: np.ndarray
    optimizer_state_bytes: np.ndarray
    activation_bytes: np.ndarray
    #: trainable parameters of the GPU's ZeRO partition (DeepSpeed's step copy: layer_cost.deepspeed_step_gradient_bytes)
    shard_params: np.ndarray
    p2p_s: np.ndarray
    cpu_s: float
    cpu_comm_s: float
    cpu_memory_bytes: float
    cpu_opt_s: float


def _stage_sums(tables: CostTables, choice: np.ndarray, stage: np.ndarray) -> _StageSums:
    pp = tables.mesh.pp
    rows = tables.row_start[:-1] + choice
    # edge resharding charged to the consumer
    edge_fwd = np.zeros(tables.graph.num_ops)
    edge_bwd = np.zeros(tables.graph.num_ops)
    for e, (u, v, _, _) in enumerate(tables.edges):
        edge_fwd[v] += tables.edge_fwd_s[e][choice[u], choice[v]]
        edge_bwd[v] += tables.edge_bwd_s[e][choice[u], choice[v]]

    def per_stage(arr: np.ndarray) -> np.ndarray:
        return np.bincount(stage, weights=arr, minlength=pp)

    return _StageSums(
        fwd_s=per_stage(tables.fwd_s[rows]), bwd_s=per_stage(tables.bwd_s[rows]),
        comm_fwd_s=per_stage(tables.comm_fwd_s[rows] + edge_fwd), comm_bwd_s=per_stage(tables.comm_bwd_s[rows] + edge_bwd),
        sync_s=per_stage(tables.sync_s[rows]), opt_s=per_stage(tables.opt_s[rows]),
        weights_bytes=per_stage(tables.weights_bytes[rows]), gradients_bytes=per_stage(tables.gradients_bytes[rows]),
        optimizer_state_bytes=per_stage(tables.optimizer_state_bytes[rows]),
        activation_bytes=per_stage(tables.activation_bytes[rows]), p2p_s=p2p_stage_times(tables, stage),
        shard_params=per_stage(tables.params_dev[rows] / sync_ranks(tables, tables.mesh)[rows]),
        cpu_s=float(tables.cpu_s[rows].sum()), cpu_comm_s=float(tables.cpu_comm_s[rows].sum()),
        cpu_memory_bytes=float(tables.cpu_memory_bytes[rows].sum()), cpu_opt_s=float(tables.cpu_opt_s[rows].sum()),
    )


def _stage_results(tables: CostTables, sums: _StageSums, stage: np.ndarray) -> list[StageResult]:
    stages: list[StageResult] = []
    buckets = bucket_bytes(tables.training, tables.mesh)  # DeepSpeed's gradient buckets, counted as gradients
    for k in range(tables.mesh.pp):
        fl = inflight(tables.mesh, k)
        grads = sums.gradients_bytes[k] + buckets
        acts = fl * sums.activation_bytes[k]
        # DeepSpeed ZeRO-2/3's fp32 copy of the step, reserved beside the backward's blocks (as for transformer stages)
        grads = grads + float(deepspeed_step_gradient_bytes(tables.training, tables.mesh.zero_stage, sums.shard_params[k]))
        state = sums.weights_bytes[k] + grads + sums.optimizer_state_bytes[k] + acts
        # The allocator's fragmentation of what is freed during a step (gradients, activations),
        # not of the resident weights and optimizer state (allocated once), a persistent gradient
        # buffer, nor the fixed-size buckets, as for transformer stages.
        ws = WORKSPACE_BYTES + fragmentation_fraction() * (churned_gradients(sums.gradients_bytes[k], tables.training.framework) + acts)
        f, b, cf, cb = sums.fwd_s[k], sums.bwd_s[k], sums.comm_fwd_s[k], sums.comm_bwd_s[k]
        stages.append(StageResult(
            index=k, ops=tuple(int(i) for i in np.nonzero(stage == k)[0]),
            forward_s=float(f + cf), backward_s=float(b + cb), compute_s=float(f + b),
            bwd_compute_s=float(b), tp_comm_s=float(cf + cb), pp_comm_s=float(sums.p2p_s[k]),
            dp_comm_s=float(sums.sync_s[k]), optimizer_s=float(sums.opt_s[k]),
            weights_bytes=float(sums.weights_bytes[k]), gradients_bytes=float(grads),
            optimizer_state_bytes=float(sums.optimizer_state_bytes[k]), activation_bytes=float(sums.activation_bytes[k]),
            inflight=fl, workspace_bytes=ws, peak_bytes=state + ws,
        ))
    return stages


def evaluate(tables: CostTables, choice: Sequence[int] | np.ndarray, stage_of_op: Sequence[int] | np.ndarray) -> GraphEval:
    """Exact step time (seconds) and memory (bytes per GPU) of one assignment: ``choice[i]`` is
    the index of op i's sharding among its choices, ``stage_of_op[i]`` its pipeline stage
    (contiguous in the analysis order).  The formula is the module docstring's (the 1F1B
    schedule of Narayanan et al. 2021, :mod:`cost_model.schedule`)."""
    mesh = tables.mesh
    m = mesh.num_microbatches
    stage = np.asarray(stage_of_op, dtype=np.int64)
    sums = _stage_sums(tables, np.asarray(choice, dtype=np.int64), stage)
    stages = _stage_results(tables, sums, stage)
    times = [st.time_s for st in stages]
    cpu_stage = sums.cpu_s + sums.cpu_comm_s
    all_times = times + ([cpu_stage] if cpu_stage > 0 else [])
    pipeline_s, _ = pipeline_time_s(all_times, m)
    pipeline = float(pipeline_s)
    window_frac = dp_overlap_fraction(tables.training, mesh.device, mesh.pp)
    # Without the overlap slowdown of the transformer path (combine_stages): the graph search's
    # CP-SAT model and its lower bounds price the exposed sync linearly, and this must be the
    # step time they optimise.
    dp_exposed = float(exposed_dp_sync_s(sums.sync_s, window_frac * sums.bwd_s, sums.bwd_s, 1, slowdown=0.0))
    optimizer = max(float(max(sums.opt_s)), sums.cpu_opt_s) + _OPTIMIZER_STEP_KERNELS * mesh.device.efficiency.kernel_overhead_s
    step = pipeline + dp_exposed + optimizer
    cap = mesh.device.memory_bytes
    fits = all(s.peak_bytes <= cap for s in stages)
    cpu_fits = mesh.cpu is None or sums.cpu_memory_bytes <= mesh.cpu.memory_bytes
    # breakdown along the critical path
    if cpu_stage > 0 and cpu_stage >= max(times):
        compute, tp_c, pp_c = m * sums.cpu_s, 0.0, m * sums.cpu_comm_s
    else:
        s = stages[int(np.argmax(times))]
        compute, tp_c, pp_c = m * s.compute_s, m * s.tp_comm_s, m * s.pp_comm_s
    breakdown = {
        "compute": compute, "recompute": 0.0, "tp_comm": tp_c, "cp_comm": 0.0, "ep_comm": 0.0, "pp_comm": pp_c,
        "dp_comm_exposed": dp_exposed, "offload_exposed": 0.0, "bubble": max(0.0, pipeline - compute - tp_c - pp_c),
        "optimizer": optimizer,
    }
    bottleneck = max(breakdown, key=lambda key: breakdown[key])
    return GraphEval(step_time_s=step, pipeline_s=pipeline, dp_exposed_s=dp_exposed, optimizer_s=optimizer,
                     stages=tuple(stages), cpu_stage_s=cpu_stage, cpu_comm_s=sums.cpu_comm_s,
                     cpu_memory_bytes=sums.cpu_memory_bytes, cpu_fits=cpu_fits, fits=fits and cpu_fits,
                     breakdown_s=breakdown, bottleneck=bottleneck)


def refuse_graph_unpriced(training: Training) -> None:
    """Offload to the host, the 8-bit AdamW, LoRA and an interleaved schedule's micro-batch group are priced on transformer layers only (the host
    update and copies, :func:`cost_model.transformer.layer_cost.offloaded_optimizer_s`, the saved
    activations' copies, :func:`cost_model.transformer.layer_cost.activation_offload_s`; the 8-bit
    moments beside a graph's CPU tables): an operator graph's request with one gets a 422 naming
    the field, not a plan that prices something else."""
    field = training.offload_field
    if field is not None:
        raise InvalidTraining("offload to the host is priced for transformer models (a preset or config.json), not for operator "
                              f"graphs; leave {field} out", field=f"training.{field}")
    # priced on a transformer's layers alone: (asked, what, field, what to do instead), checked in this order
    on_layers = (
        (training.eight_bit_moments, "the 8-bit AdamW", "optimizer", "use adam or adamw"),
        (training.reference_model, "the frozen reference model", "reference_model", ""),
        (training.optimizer_in_backward, "the optimizer step inside the backward", "optimizer_in_backward", ""),
        (training.muon, "Muon (on the weight matrices)", "optimizer", "use adam or adamw"),
        (training.loss_kernel != "unfused", "the fused loss kernels (on the LM head)", "loss_kernel", ""),
        (training.pipeline_schedules_per_step > 1, "several pipeline schedules a step", "pipeline_schedules_per_step", ""),
        (training.submodule_checkpointing, "checkpointing by submodule (of the decoder layers)", "submodule_checkpointing", ""),
        (training.fp8_param_gather, "FP8 weights (of the linear layers)", "fp8_param_gather", ""),
    )
    for asked, what, key, instead in on_layers:
        if asked:
            raise InvalidTraining(f"{what} is priced for transformer models (a preset or config.json), not for operator graphs; "
                                  f"{instead or f'leave {key} out'}", field=f"training.{key}")
    if training.microbatch_group_size_per_vp_stage:
        raise InvalidTraining("operator graphs run no interleaved pipeline (vpp 1), so no micro-batch group per virtual stage; "
                              "leave microbatch_group_size_per_vp_stage out", field="training.microbatch_group_size_per_vp_stage")
    if training.frozen_base:
        raise InvalidTraining("LoRA is priced for transformer models (a preset or config.json), whose linear layers it adapts, not "
                              "for operator graphs; leave lora_rank out", field="training.lora_rank")


def estimate_graph(
    graph: GraphSpec,
    training: Training,
    cluster: Cluster,
    strategy: Any,
    op_shardings: Mapping[str, str] | None = None,
    stages: Sequence[Sequence[str]] | None = None,
    node_group: str | None = None,
) -> Estimate:
    """Estimate one strategy on an operator graph (contract v1 ``prediction``: seconds, GB,
    TFLOP/s per GPU; the model of the module docstring).

    ``strategy`` supplies dp, tp (the size of the sharding axis), pp, micro_batch_size and
    zero_stage (cp, ep and vpp must be 1).  ``op_shardings`` maps op names to sharding names
    (see :mod:`cost_model.graph.layouts`); ops not named get the greedy choice given the others.
    ``stages`` lists the op names of each stage; by default the balanced contiguous split."""
    refuse_graph_unpriced(training)
    for key in ("cp", "ep", "vpp"):
        if getattr(strategy, key, 1) != 1:
            raise InvalidStrategy(f"{key} must be 1 for operator graphs (got {getattr(strategy, key)})", field=f"strategy.{key}")
    if getattr(strategy, "recompute", "none") != "none":
        raise InvalidStrategy("recompute is not modelled for operator graphs; use 'none'", field="strategy.recompute")
    if getattr(strategy, "dp_shard", 0):
        raise InvalidStrategy("operator graphs shard ZeRO over the whole data-parallel group (omit dp_shard)", field="strategy.dp_shard")
    dp, t, pp, mbs = strategy.dp, strategy.tp, strategy.pp, strategy.micro_batch_size
    asked_zero = getattr(strategy, "zero_stage", 0)
    zero = effective_zero_stage(training.framework, asked_zero, dp)
    notes = [one_rank_sharding_note(training.framework, asked_zero)] if zero != asked_zero else []
    rule = layout_rule_violation(training.framework, tp=t, pp=pp, vpp=1, cp=1, ep=1, dp=dp, zero_stage=zero, sequence_parallel=False)
    if rule is not None:  # the framework's rules hold for operator graphs as for transformer layers
        raise InvalidStrategy(rule[1], field=f"strategy.{rule[0]}")
    why = precision_aware_zero_violation(training.precision_aware_optimizer, zero)
    if why is not None:
        raise InvalidStrategy(why, field="strategy.zero_stage")
    if dp * t * pp > cluster.total_gpus:
        raise InvalidStrategy(f"dp·tp·pp = {dp * t * pp} devices but the cluster has {cluster.total_gpus} available", field="strategy.dp")
    if pp > graph.num_ops:
        raise InvalidStrategy(f"pp={pp} exceeds the {graph.num_ops} operators", field="strategy.pp")
    group = pick_group(cluster, dp * t * pp, training.dtype, node_group)
    mesh = mesh_for(training, cluster, dp, t, pp, mbs, zero, group,
                    use_cpu="embedding_on_cpu" in set((op_shardings or {}).values()))
    tables = build_tables(graph, training, mesh)
    choice = assignment_from_names(tables, op_shardings or {})
    if stages is not None:
        stage_of_op = stage_from_names(tables, stages)
    else:
        split = split_stages(tables, choice)
        if split is None:
            split = split_stages(tables, choice, headroom_fraction=-1e9)  # best split ignoring memory
        if split is None:  # pragma: no cover - pp ≤ operators was checked above
            raise InvalidStrategy(f"no split of the operators into pp={pp} stages", field="strategy.pp")
        stage_of_op = split
    return to_estimate(tables, evaluate(tables, choice, stage_of_op), notes)


def _stage_estimate(tables: CostTables, s: StageResult) -> StageEstimate:
    mesh, g = tables.mesh, tables.graph
    order_pos = tables.analysis.position
    ops = sorted(s.ops, key=lambda i: order_pos[i])
    has_emb = any(g.ops[i].category in ("embedding",) or (g.ops[i].category == "gather" and g.ops[i].params) for i in ops)
    mem = {
        "weights": bytes_to_gb(s.weights_bytes),
        "gradients": bytes_to_gb(s.gradients_bytes),
        "optimizer_state": bytes_to_gb(s.optimizer_state_bytes),
        "activations": bytes_to_gb(s.activation_bytes * s.inflight),
        "workspace": bytes_to_gb(s.workspace_bytes),
    }
    return StageEstimate(
        index=s.index,
        first_layer=int(order_pos[ops[0]]) if ops else 0,
        last_layer=int(order_pos[ops[-1]]) if ops else -1,
        device=mesh.device.name,
        node_group=mesh.group.name,
        has_embedding=has_emb,
        has_head=s.index == mesh.pp - 1,
        forward_s=s.forward_s + s.pp_comm_s / 2,
        backward_s=s.backward_s + s.pp_comm_s / 2,
        peak_memory_GB=bytes_to_gb(s.peak_bytes),
        memory_capacity_GB=mesh.device.memory_GB,
        memory_GB=mem,
    )


def _memory_warnings(tables: CostTables, ev: GraphEval, stage_results: Sequence[StageEstimate]) -> list[str]:
    mesh = tables.mesh
    warn: list[str] = []
    if not ev.fits:
        worst = max(stage_results, key=lambda s: s.peak_memory_GB - s.memory_capacity_GB)
        if worst.peak_memory_GB > worst.memory_capacity_GB:
            warn.append(f"does not fit: stage {worst.index} needs {worst.peak_memory_GB:.1f} GB per GPU, "
                        f"{worst.device} has {worst.memory_capacity_GB:.0f} GB")
        if not ev.cpu_fits and mesh.cpu is not None:
            warn.append(f"does not fit: CPU parameter servers need {bytes_to_gb(ev.cpu_memory_bytes):.1f} GB, "
                        f"the CPU nodes have {bytes_to_gb(mesh.cpu.memory_bytes):.0f} GB")
    if ev.cpu_stage_s > 0 and mesh.cpu is not None:
        warn.append(f"embedding tables on {mesh.cpu.nodes} CPU node(s): {bytes_to_gb(ev.cpu_memory_bytes):.1f} GB, "
                    f"{s_to_ms(ev.cpu_stage_s):.2f} ms per micro-batch (lookup and row transfer)")
    return warn


def to_estimate(tables: CostTables, ev: GraphEval, warnings: Sequence[str] = ()) -> Estimate:
    """The contract-v1 estimate of an evaluated assignment (seconds, GB, TFLOP/s per GPU, MFU
    against the device's peak in the training dtype)."""
    mesh = tables.mesh
    training = tables.training
    stage_results = [_stage_estimate(tables, s) for s in ev.stages]
    peak_stage = max(stage_results, key=lambda st: st.peak_memory_GB)
    step = ev.step_time_s
    n_dev = mesh.num_devices
    model_flops = tables.model_flops_per_microbatch * mesh.dp * mesh.num_microbatches
    peak = mesh.device.peak_tflops(training.dtype)
    model_tflops = flops_to_tflops(model_flops / step / n_dev)
    return Estimate(
        step_time_s=step,
        tokens_per_s=training.tokens_per_step / step,
        samples_per_s=training.global_batch_size / step,
        model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=model_tflops,
        mfu=model_tflops / peak,
        fits=ev.fits,
        peak_memory_GB=tuple(s.peak_memory_GB for s in stage_results),
        breakdown_s={k: float(v) for k, v in ev.breakdown_s.items()},
        stages=tuple(stage_results),
        num_devices=n_dev,
        num_microbatches=mesh.num_microbatches,
        bottleneck=ev.bottleneck,
        profile_ids=tuple(x for x in (mesh.device.profile_id,) if x),
        warnings=(*warnings, *_memory_warnings(tables, ev, stage_results)),
        # the peak's interval as for transformer stages (the same memory terms and reserve); the
        # step time has none here: no measured run of an operator graph calibrates it
        **memory_interval_fields(peak_stage.peak_memory_GB, peak_stage.memory_GB, training.framework),
    )
