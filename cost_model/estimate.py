"""``estimate(model, training, cluster, strategy)``: the cost model's answer for one strategy.

Ranks are laid out in Megatron order (tensor fastest, then context, data, pipeline), so
pipeline stage i occupies the i-th block of dp·cp·tp devices.  By default the blocks are cut
from the cluster's available GPUs in the order its node groups and nodes are listed; the
planner passes ``stage_groups`` to put each stage on a node group of its choice.  A stage
whose block spans device types runs at the pace of its slowest device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_model.cluster import Cluster, NodeGroup
from cost_model.comm import Links
from cost_model.devices import DeviceSpec
from cost_model.errors import InvalidStrategy, InvalidTraining
from cost_model.frameworks import (
    dense_etp_note,
    grad_reduce_overlap_note,
    interleaved_group_sizes,
    microbatch_group_note,
    one_rank_sharding_note,
    pipeline_gradient_sharding_note,
    required_etp_reason,
    sequence_parallel_noop,
)
from cost_model.result import Estimate, StageEstimate
from cost_model.strategy import Strategy, uneven_split_warning, validate_strategy
from cost_model.topology import links_for_group, pp_crosses_node
from cost_model.training import Training
from cost_model.transformer.calibration import parallel_mix, prediction_intervals, single_source_spread, using
from cost_model.transformer.layer_cost import StrategyArrays, recompute_fraction, recompute_modules_notes
from cost_model.transformer.memory import PEAK_MEMORY_QUANTITY, fragmentation_reserve_GB, interval_GB, memory_fit
from cost_model.transformer.spec import TransformerSpec
from cost_model.transformer.stage_cost import (
    StageCost,
    combine_stages,
    device_costs,
    model_flops_per_step,
    recompute_flops_per_step,
    stage_cost,
)
from cost_model.units import bytes_to_gb, flops_to_tflops


@dataclass(frozen=True)
class StageSlot:
    """Where one stage runs: a node group (its device and links) and whether its boundary to
    the next stage crosses nodes."""

    group: NodeGroup
    links: Links
    cross_node_next: bool
    mixed: bool = False


def _slowest_group(groups: Sequence[NodeGroup], dtype: str) -> NodeGroup:
    return min(groups, key=lambda g: (g.device.peak_tflops(dtype) if dtype in g.device.supported_dtypes() else 0.0, g.device.memory_GB))


def _cross_node(block: int, group: NodeGroup, next_group: NodeGroup, strategy: Strategy | None = None) -> bool:
    """Whether a stage boundary's point-to-point traffic crosses the network: always when a
    stage fills whole nodes (block ≥ GPUs per node) or the next stage is on another node group;
    a boundary between two partial-node stages of one group is taken as intra-node (NVLink).
    With a nesting order other than Megatron's, when the pipeline's stride reaches a node
    (:func:`cost_model.topology.pp_crosses_node`)."""
    if strategy is not None and strategy.nesting is not None and next_group is group:
        return pp_crosses_node(strategy, group.gpus_per_node)
    return block >= group.gpus_per_node or next_group is not group


def default_stage_slots(cluster: Cluster, strategy: Strategy, dtype: str) -> list[StageSlot]:
    """Cut contiguous blocks of dp·cp·tp GPUs, in cluster order, one per stage."""
    gpus: list[NodeGroup] = []
    for g in cluster.node_groups:
        gpus.extend([g] * (g.gpus_per_node * len(cluster.available_nodes(g.name))))
    block = strategy.dp * strategy.cp * strategy.tp
    slots = []
    for i in range(strategy.pp):
        members = gpus[i * block : (i + 1) * block]
        groups = list(dict.fromkeys(members))
        slow = _slowest_group(groups, dtype)
        links = links_for_group(slow)
        for g in groups[1:]:
            links = links.slowest(links_for_group(g))
        nxt = gpus[(i + 1) * block] if (i + 1) * block < len(gpus) and i + 1 < strategy.pp else members[-1]
        cross = _cross_node(block, members[-1], nxt, strategy) or len(groups) > 1
        slots.append(StageSlot(slow, links, cross, mixed=len({g.device.name for g in groups}) > 1))
    return slots


def slots_for_groups(cluster: Cluster, strategy: Strategy, group_names: Sequence[str]) -> list[StageSlot]:
    """Stages placed on the named node groups (one name per stage), each group's GPUs used in
    order.  Raises when a group has too few available GPUs for its stages."""
    if len(group_names) != strategy.pp:
        raise InvalidStrategy(f"{len(group_names)} stage groups given for pp={strategy.pp}", field="stage_groups")
    block = strategy.dp * strategy.cp * strategy.tp
    groups = []
    for name in group_names:
        try:
            groups.append(cluster.group(name))
        except KeyError:
            raise InvalidStrategy(f"no node group named {name!r}", field="stage_groups") from None
    for g in set(groups):
        need = block * sum(1 for x in groups if x is g)
        have = cluster.available_gpus(g.name)
        if need > have:
            raise InvalidStrategy(f"node group {g.name} has {have} available GPUs, its stages need {need}", field="stage_groups")
    slots = []
    for i, g in enumerate(groups):
        nxt = groups[i + 1] if i + 1 < len(groups) else g
        slots.append(StageSlot(g, links_for_group(g), _cross_node(block, g, nxt, strategy)))
    return slots


def apply_profile_to_cluster(cluster: Cluster, profile: Mapping[str, Any] | None, field: str = "profile") -> Cluster:
    """The cluster with every node group of the profiled device calibrated by ``profile``
    (``cost_model.profiles.apply_profile``).  Raises when no node group has that device."""
    if profile is None:
        return cluster
    from dataclasses import replace

    from cost_model.errors import InvalidProfile
    from cost_model.profiles import apply_profile, profile_matches

    groups = tuple(replace(g, device=apply_profile(g.device, profile)) if profile_matches(g.device, profile) else g for g in cluster.node_groups)
    if all(a is b for a, b in zip(groups, cluster.node_groups, strict=True)):
        device = profile.get("device", {}).get("name") if isinstance(profile.get("device"), Mapping) else None
        raise InvalidProfile(
            f"the profile was taken on {device!r}, which no node group of the cluster has "
            f"({', '.join(sorted({g.device.name for g in cluster.node_groups}))})",
            field=field,
        )
    return replace(cluster, node_groups=groups)


def _stage_costs(
    model: TransformerSpec, training: Training, slots: list[StageSlot], S: StrategyArrays, layers: list[int], m: int
) -> list[StageCost]:
    """Per-stage costs, computed in a few vectorised calls: stages that share a node group,
    links and boundary kind are costed together with the stage index as an array."""
    p = len(slots)
    dcs: dict[tuple[str, Links], Any] = {}
    batches: dict[tuple[tuple[str, Links], bool, bool, bool], list[int]] = {}
    for i, slot in enumerate(slots):
        key = (slot.group.name, slot.links)  # Links is a frozen dataclass: equal links share costs
        if key not in dcs:
            dcs[key] = device_costs(model, training, slot.group.device, slot.links, S)
        batches.setdefault((key, slot.cross_node_next, i == 0, i == p - 1), []).append(i)
    out: list[Any] = [None] * p
    for (key, cross, first, last), idx in batches.items():
        n = np.array([layers[i] for i in idx], dtype=float)[:, None]
        index = np.array(idx, dtype=float)[:, None]
        st = stage_cost(model, training, dcs[key], S, n, index, first, last, m, cross)
        for r, i in enumerate(idx):
            out[i] = StageCost(
                **{f.name: np.broadcast_to(getattr(st, f.name), (len(idx), 1))[r] for f in dataclasses.fields(StageCost)}
            )
    return out


def estimate(
    model: Any,
    training: Training,
    cluster: Cluster,
    strategy: Strategy,
    profile: Mapping[str, Any] | None = None,
    stage_groups: Sequence[str] | None = None,
    spread_single_source: bool = True,
) -> Estimate:
    """Predict step time, throughput, MFU and memory for one strategy (contract v1).

    The :class:`Estimate` carries its units in its field names (``step_time_s``,
    ``tokens_per_s``, ``model_tflops_per_gpu``, ``peak_memory_GB``).  Stage costs come from
    ``cost_model.transformer.stage_cost`` (per-layer compute, communication and memory), the step
    from its ``combine_stages`` (the 1F1B/interleaved schedule of Narayanan et al. 2021); MFU as
    in Megatron-LM (model FLOPs over the mean peak of the devices used).

    The step-time interval is the regime's cross-validated one, widened to take in the step at
    the priors of any constant fitted on a single source that prices this run
    (:func:`cost_model.transformer.calibration.single_source_spread`), with a warning naming
    them where that widens it (:func:`with_single_source_spread`); ``spread_single_source=False``
    skips that second costing: the calibration benches, whose intervals are cross-validation's
    own, and the planner's search, which spreads its answers only."""
    cluster = apply_profile_to_cluster(cluster, profile)
    if not isinstance(model, TransformerSpec):
        from cost_model.graph.evaluate import estimate_graph

        return estimate_graph(model, training, cluster, strategy)
    total = cluster.total_gpus
    asked_etp, asked_split, asked_zero = strategy.etp, strategy.layers_per_stage, strategy.zero_stage
    asked_depth = strategy.recompute_num_layers if strategy.recompute_method != "uniform" else 0
    strategy = validate_strategy(model, training, strategy)
    if strategy.num_devices > total:
        raise InvalidStrategy(
            f"dp·tp·pp·cp = {strategy.dp}·{strategy.tp}·{strategy.pp}·{strategy.cp} = {strategy.num_devices} "
            f"devices but the cluster has {total} available",
            field="strategy.dp",
        )
    warnings = list(getattr(model, "warnings", ()))  # what the model's config.json held that is not costed
    sp_noop = sequence_parallel_noop(strategy.tp, strategy.sequence_parallel, training.framework)
    if sp_noop:
        warnings.append(sp_noop)
    if strategy.zero_stage != asked_zero:
        warnings.append(one_rank_sharding_note(training.framework, asked_zero))
    if asked_depth and not strategy.recompute_num_layers:
        warnings.append(f"strategy.recompute_num_layers: {asked_depth} covers every layer of each model chunk (at most "
                        f"{max(strategy.layers_per_stage or (0,))}): full recompute of every layer, costed so")
    zero2_pipeline = pipeline_gradient_sharding_note(training.framework, strategy.zero_stage, strategy.pp)
    if zero2_pipeline:
        warnings.append(zero2_pipeline)
    overlap_note = grad_reduce_overlap_note(training.framework, training.grad_reduce_overlap)
    if overlap_note:
        warnings.append(overlap_note)
    if training.pipeline_schedules_per_step > 1 and strategy.pp == 1:
        warnings.append(f"training.pipeline_schedules_per_step: {training.pipeline_schedules_per_step} schedules a step are a "
                        "pipeline's; without one (pp 1) the micro-batches run one after another either way (costed so)")
    if training.submodule_checkpointing and strategy.recompute != "full":
        warnings.append(f"training.submodule_checkpointing: checkpointing by submodule is the trainer's full recompute; under "
                        f"recompute {strategy.recompute} it changes nothing (costed so)")
    warnings += recompute_modules_notes(model, strategy.recompute_modules)
    uneven = uneven_split_warning(asked_split, strategy)
    if uneven:
        warnings.append(uneven)
    if strategy.etp and not asked_etp and strategy.tp > 1:
        warnings.append(f"{required_etp_reason(training.framework, strategy.etp)}: costed so")
    if asked_etp and not strategy.etp:
        warnings.append(dense_etp_note(asked_etp))
    scheduled = strategy.num_microbatches(training) // training.pipeline_schedules(strategy.pp)  # a schedule's micro-batches
    group_note = microbatch_group_note(training.framework, num_microbatches=scheduled, pp=strategy.pp,
                                       vpp=strategy.vpp, group=training.microbatch_group_size_per_vp_stage)
    groups = (interleaved_group_sizes(training.framework, num_microbatches=scheduled, pp=strategy.pp,
                                      group=training.microbatch_group_size_per_vp_stage) if strategy.vpp > 1 else None)
    if group_note:
        warnings.append(group_note)
    if strategy.num_devices < total:
        warnings.append(f"uses {strategy.num_devices} of the cluster's {total} available devices")
    slots = slots_for_groups(cluster, strategy, stage_groups) if stage_groups else default_stage_slots(cluster, strategy, training.dtype)
    offload_device_check(training, [slot.group.device for slot in slots])
    for note in dict.fromkeys(slot.group.split_nvlink_domain_note for slot in slots):
        if note:
            warnings.append(note)
    for i, slot in enumerate(slots):
        if slot.mixed:
            warnings.append(f"stage {i} spans several device types and runs at the pace of {slot.group.device.name}")
        if strategy.tp > slot.group.gpus_per_node:
            warnings.append(f"tp={strategy.tp} spans nodes of {slot.group.name}: TP collectives cross the network")
    S = StrategyArrays.from_strategies([strategy])
    m = strategy.num_microbatches(training)
    ranges = strategy.stage_layer_ranges()
    stage_costs = _stage_costs(model, training, slots, S, [sum(b - a + 1 for a, b in r) for r in ranges], m)
    stage_results = []
    for i, slot in enumerate(slots):
        st = stage_costs[i]
        mem = {
            "weights": bytes_to_gb(float(st.weights_bytes[0])),
            "gradients": bytes_to_gb(float(st.gradients_bytes[0])),
            "optimizer_state": bytes_to_gb(float(st.optimizer_state_bytes[0])),
            "activations": bytes_to_gb(float(st.activations_bytes[0])),
            "workspace": bytes_to_gb(float(st.workspace_bytes[0])),
        }
        stage_results.append(
            StageEstimate(
                index=i,
                # a stage of only the embedding / the head (pipeline_split) holds no decoder layer
                first_layer=ranges[i][0][0] if ranges[i] else 0,
                last_layer=ranges[i][-1][1] if ranges[i] else -1,
                device=slot.group.device.name,
                node_group=slot.group.name,
                has_embedding=i == 0,
                has_head=i == len(slots) - 1,
                forward_s=float(st.forward_s[0]),
                backward_s=float(st.backward_s[0]),
                peak_memory_GB=bytes_to_gb(float(st.peak_memory_bytes[0])),
                memory_capacity_GB=slot.group.device.memory_GB,
                memory_GB=mem,
                layer_ranges=tuple(ranges[i]),
                host_memory_GB=bytes_to_gb(float(st.host_state_bytes[0])),
            )
        )
    if training.offload_field is not None:
        warnings.append(host_offload_note(training, [(slot.group.device, s.host_memory_GB) for slot, s in zip(slots, stage_results, strict=True)]))
    step = combine_stages(stage_costs, S, m, training.pipeline_schedules(S.pp))
    step_s = float(step.step_time_s[0])
    n_dev = strategy.num_devices
    model_flops = model_flops_per_step(model, training)
    hw_flops = model_flops + recompute_flops_per_step(model, training, strategy.recompute, float(recompute_fraction(model, S)[0]),
                                                     strategy.recompute_modules)
    peaks = [slot.group.device.peak_tflops(training.dtype) for slot in slots]
    mean_peak = float(np.mean(peaks))
    model_tflops = flops_to_tflops(model_flops / step_s / n_dev)
    fits, tight, memory_warning = memory_verdict(stage_results, 0.0, training.framework)
    if memory_warning:
        warnings.append(memory_warning)
    breakdown = {k: float(v[0]) for k, v in step.breakdown_s.items()}
    bottleneck = max(breakdown, key=lambda k: breakdown[k])
    profile_ids = tuple(sorted({slot.group.device.profile_id for slot in slots if slot.group.device.profile_id}))
    est = Estimate(
        step_time_s=step_s,
        tokens_per_s=training.tokens_per_step / step_s,
        samples_per_s=training.global_batch_size / step_s,
        model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=flops_to_tflops(hw_flops / step_s / n_dev),
        mfu=model_tflops / mean_peak,
        fits=fits,
        peak_memory_GB=tuple(s.peak_memory_GB for s in stage_results),
        breakdown_s=breakdown,
        stages=tuple(stage_results),
        num_devices=n_dev,
        num_microbatches=m,
        bottleneck=bottleneck,
        profile_ids=profile_ids,
        warnings=tuple(warnings),
        model_params=float(model.total_params()),
        active_params=float(model.active_params()),
        tight=tight,
        peak_memory_quantity=PEAK_MEMORY_QUANTITY,
        microbatch_groups=groups,
        pipeline_schedules=int(training.pipeline_schedules(strategy.pp)),
        **prediction_intervals(training.framework, slots[0].group.device.family, step_s, max(stage_results, key=lambda s: s.peak_memory_GB),
                               parallel_mix(strategy.pp, strategy.zero_stage)),
    )
    est = with_offload_spread(est, training)
    return with_single_source_spread(est, model, training, cluster, strategy, stage_groups) if spread_single_source else est


#: How far the host's share of the step may run from its priced time under offload: its DRAM and
#: link figures are vendor specifications, not fitted to a measured run (none of the calibration
#: set offloads), so the step-time interval takes in that share at half and at twice its priced
#: time.
OFFLOAD_TIME_FACTOR = 2.0


def with_offload_spread(est: Estimate, training: Training) -> Estimate:
    """``est`` with its step-time interval widened, under offload to the host, to take in the
    step with the host's share at 1/:data:`OFFLOAD_TIME_FACTOR` and :data:`OFFLOAD_TIME_FACTOR`
    times its priced time; ``est`` itself without offload or without an interval.  The host's
    share: the exposed host copies (``breakdown_s["offload_exposed"]``) and, where the optimizer
    state is offloaded, the optimizer term (the host's update and copies with the GPU's share)."""
    if training.offload_field is None or est.step_time_s_p10 is None or est.step_time_s_p90 is None:
        return est
    host_s = est.breakdown_s.get("offload_exposed", 0.0)
    if training.optimizer_offload_fraction > 0.0 or training.cpu_offload:
        host_s += est.breakdown_s.get("optimizer", 0.0)
    fast, slow = est.step_time_s - host_s * (1.0 - 1.0 / OFFLOAD_TIME_FACTOR), est.step_time_s + host_s * (OFFLOAD_TIME_FACTOR - 1.0)
    return dataclasses.replace(est, step_time_s_p10=min(est.step_time_s_p10, fast), step_time_s_p90=max(est.step_time_s_p90, slow))


def with_single_source_spread(est: Estimate, model: TransformerSpec, training: Training, cluster: Cluster, strategy: Strategy,
                              stage_groups: Sequence[str] | None = None) -> Estimate:
    """``est`` with its step-time interval widened to take in the step at the priors of the
    constants fitted on a single source that price this run
    (:func:`cost_model.transformer.calibration.single_source_spread`: what leave-one-source-out
    cross-validation predicts another source's run with), and a warning naming them where that
    widens it; ``est`` itself when none does.  A second costing of the strategy: the planner
    applies it to its answers only, not to every candidate it estimates."""
    if est.step_time_s_p10 is None or est.step_time_s_p90 is None:
        return est
    at_priors = step_at_single_source_priors(model, training, cluster, strategy, stage_groups)
    if at_priors is None:
        return est
    alt_s, names = at_priors
    if abs(alt_s / est.step_time_s - 1.0) <= SINGLE_SOURCE_SPREAD_MIN or est.step_time_s_p10 <= alt_s <= est.step_time_s_p90:
        return est
    return dataclasses.replace(est, step_time_s_p10=min(est.step_time_s_p10, alt_s), step_time_s_p90=max(est.step_time_s_p90, alt_s),
                               warnings=(*est.warnings, _single_source_warning(names, est.step_time_s, alt_s)))


def step_at_single_source_priors(model: TransformerSpec, training: Training, cluster: Cluster, strategy: Strategy,
                                 stage_groups: Sequence[str] | None = None) -> tuple[float, dict[str, str]] | None:
    """(the step time with the single-source constants that price this run at their priors,
    those constants → their source), None when no such constant prices it
    (:func:`cost_model.transformer.calibration.single_source_spread`)."""
    spread = single_source_spread(model, training, cluster, strategy)
    if spread is None:
        return None
    with using(spread[0]):
        return estimate(model, training, cluster, strategy, stage_groups=stage_groups, spread_single_source=False).step_time_s, spread[1]


#: The relative difference below which the step at the single-source constants' priors is
#: taken as the same step (the interval is not widened, no warning; nor is it where the regime's
#: interval already holds that step).
SINGLE_SOURCE_SPREAD_MIN = 0.01


#: How the warning of a step-time interval widened for single-source constants begins.
SINGLE_SOURCE_WARNING = "the step time rests on constants fitted on a single source"


def _single_source_warning(names: Mapping[str, str], step_s: float, alt_s: float) -> str:
    by_source: dict[str, list[str]] = {}
    for name, source in names.items():
        by_source.setdefault(source, []).append(name)
    rests = "; ".join(f"{', '.join(ns)} on {src}" for src, ns in sorted(by_source.items()))
    return (f"{SINGLE_SOURCE_WARNING} ({rests}): at their priors, what cross-validation "
            f"predicts runs of other sources with, it is {alt_s:.3g} s rather than {step_s:.3g} s, and the p10–p90 interval spans both")


def offload_device_check(training: Training, devices: Sequence[DeviceSpec]) -> None:
    """Refuse offload (``optimizer_offload_fraction``, ``cpu_offload``, ``activation_offloading``)
    where a stage runs on a CPU device: its state and activations already live in host memory, so
    there is nothing to offload to (a 422 naming the field)."""
    cpu = next((d.name for d in devices if d.kind != "gpu"), None)
    field = training.offload_field
    if field is not None and cpu is not None:
        raise InvalidTraining(f"{cpu} is a CPU device: its state and activations are in host memory already, there is nothing to "
                              f"offload; leave {field} out", field=f"training.{field}")


def host_offload_note(training: Training, stages: Sequence[tuple[DeviceSpec, float]]) -> str:
    """The warning every offloading estimate carries: the host memory (GB) the busiest GPU's
    offloaded state takes (``StageEstimate.host_memory_GB``) against its share of the reference
    server's (``DeviceSpec.host_memory_GB``), and that the host side is not calibrated."""
    device, need_GB = max(stages, key=lambda x: x[1] / max(x[0].host_memory_GB, 1e-9))
    have_GB = device.host_memory_GB
    share = ("all of the state" if training.optimizer_offload_fraction >= 1.0 else f"{training.optimizer_offload_fraction:g} of the state")
    parts = ["CPU offload of the sharded parameters, gradients and optimizer state" if training.cpu_offload
             else f"optimizer offload ({share})" if training.optimizer_offload_fraction > 0.0 else None,
             (f"activation offloading (the saved tensors of {', '.join(training.offload_modules)})" if training.offload_modules
              else "activation offloading (every layer's saved activations)") if training.activation_offloading else None]
    what = " and ".join(p for p in parts if p)
    verdict = "more than" if need_GB > have_GB else "within"
    return (f"{what}: {need_GB:.1f} GB of host memory per GPU, {verdict} the {have_GB:.0f} GB per GPU of "
            f"{device.name}'s reference server{' (the host runs out of memory)' if need_GB > have_GB else ''}; the host's work "
            f"is priced at {device.host_memory_bandwidth_GBps:.0f} GB/s of DRAM and {device.host_link_GBps:.0f} GB/s of host link "
            f"per GPU, figures not calibrated against measured runs: the step's p10–p90 takes in the host's share at half and twice "
            "its priced time")


def usable_memory_ratio(stages: Sequence[StageEstimate], headroom_fraction: float) -> float:
    """The tightest stage's predicted peak (the interval's centre) over its usable memory,
    memory × (1 − headroom)."""
    return max(s.peak_memory_GB / (s.memory_capacity_GB * (1.0 - headroom_fraction)) for s in stages)


def peak_over_usable(stages: Sequence[StageEstimate], headroom_fraction: float) -> bool:
    """Whether some stage's predicted peak exceeds its usable memory
    (:func:`usable_memory_ratio` above 1): a layout that fits then only at the low end of its
    interval — more likely to run out of memory than not."""
    return usable_memory_ratio(stages, headroom_fraction) > 1.0 + 1e-9


def memory_verdict(stages: Sequence[StageEstimate], headroom_fraction: float, framework: str) -> tuple[bool, bool, str | None]:
    """(fits, tight, warning) of the stages against their memory × (1 − headroom): fits when
    every stage's p10 peak is within it, tight when it fits but some stage's p90 is not
    (:mod:`cost_model.transformer.memory`; the interval is ``framework``'s)."""
    verdicts = [memory_fit(s.peak_memory_GB, fragmentation_reserve_GB(s.memory_GB), s.memory_capacity_GB * (1.0 - headroom_fraction), framework)
                for s in stages]
    fits = "does_not_fit" not in verdicts
    tight = fits and "tight" in verdicts
    if fits and not tight:
        return True, False, None
    worst = max(stages, key=lambda s: s.peak_memory_GB / s.memory_capacity_GB)
    usable = worst.memory_capacity_GB * (1.0 - headroom_fraction)
    p10, p90 = interval_GB(worst.peak_memory_GB, fragmentation_reserve_GB(worst.memory_GB), framework)
    room = f"{worst.device} has {worst.memory_capacity_GB:.0f} GB" + (f" ({usable:.1f} GB usable with {headroom_fraction:.0%} headroom)" if headroom_fraction else "")
    if not fits:
        return False, False, (f"does not fit: stage {worst.index} needs {worst.peak_memory_GB:.1f} GB per GPU "
                              f"(p10 {p10:.1f} GB), {room}")
    odds = "more likely than not to run out of memory" if worst.peak_memory_GB > usable + 1e-9 else "may run out of memory"
    return True, True, (f"memory tight: stage {worst.index} peaks at {worst.peak_memory_GB:.1f} GB per GPU "
                        f"(p10–p90 {p10:.1f}–{p90:.1f} GB), {room}: {odds}")
