"""The discrete search space: every combination of parallel knobs, as a struct of arrays.

Knobs: tp, cp, ep, pp, dp, vpp, micro_batch_size, recompute, zero_stage, sequence_parallel.
Rules applied while enumerating (cheap, exact): tp divides the GPUs of a node and the
attention heads (KV heads split or replicated evenly) — TP groups stay inside one NVLink
domain; cp divides the sequence (and leaves ≥ 1024 tokens per rank); ep divides the experts and
dp·cp (tp·cp·dp under Megatron-Core's MoE parallel folding); pp ≤ layers; pp·vpp divides the layers when vpp > 1,
or near-even chunks at a depth with no even interleaving (or a pinned vpp; split flags: pp·vpp divides layers + flags), and the framework's interleaved schedule takes the micro-batch count
(:func:`cost_model.frameworks.interleaved_microbatches_run`); dp·micro_batch divides the
global batch; dp·tp·cp·pp ≤ the GPUs available; and what the framework can run
(:mod:`cost_model.frameworks`: no interleaving, context or tensor parallelism where the
framework has none, its ZeRO stages, sharding ≥ 2 with a pipeline only where supported,
DeepSpeed-Ulysses without TP or a pipeline; the all-to-all exchange with tp·cp dividing the heads).
Sequence parallelism only with tp > 1; selective recompute only where it differs from none
(unfused attention; FP8/FP4 beside a fused attention, whose 16-bit output it discards; torchtitan's op-level checkpointing, where it is its own trade-off; under
Megatron-Core, for a model with MoE or MLA layers, with the output-discarding recompute modules
that apply: :func:`_recompute_choices`).  Partial (block) recompute — the first N layers of each model chunk — is
searched where the framework has it (:func:`block_recompute_candidates`), for the layouts that
do not fit without recompute: where they do, no recompute is faster than any.  Pinned fields in the request's constraints replace the knob's range by the
single pinned value, checked first (:func:`check_pins`) and never pruned by a dominance rule.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from cost_model.errors import InvalidStrategy
from cost_model.frameworks import (
    WHOLE_LAYOUT_RULE_FRAMEWORKS,
    context_parallel_violation,
    cp_sequence_violation,
    deepspeed_moe_ok,
    deepspeed_moe_violation,
    dense_etp_note,
    effective_zero_stage,
    ep_group_divisor,
    expert_layout_ok,
    expert_parallel_dtype_violation,
    expert_parallel_runs_in,
    fp8_param_gather_zero_violation,
    interleaved_microbatches_run,
    interleaved_microbatches_violation,
    interleaved_schedule_violation,
    kv_heads_violation,
    muon_layout_violation,
    offload_layout_violation,
    one_rank_sharding_note,
    optimizer_in_backward_layout_violation,
    pinned_rule_violation,
    precision_aware_zero_violation,
    recompute_method_violation,
    recompute_modules_violation,
    required_expert_tensor_parallel,
    required_expert_tensor_parallel_violation,
    rules_for,
    torchtitan_layout_violation,
    tp_comm_overlap_layout_violation,
)
from cost_model.strategy import (
    SPLIT_FLAGS,
    Strategy,
    block_recompute_depths,
    expert_tensor_parallel_violation,
    layer_split_violation,
    recompute_depth_fits,
)
from cost_model.training import Training
from cost_model.transformer.layer_cost import (
    RECOMPUTE_CODE,
    StrategyArrays,
    core_attention_recompute_frees,
    lean_recompute_modules,
    op_level_selective,
    recompute_modules_mask,
    recompute_modules_of,
)
from cost_model.transformer.moe import expert_blocks_tile, experts_split_into_replicas
from cost_model.transformer.spec import TransformerSpec

MBS_CHOICES = (1, 2, 4, 8)
VPP_CHOICES = (1, 2, 3, 4, 6, 8)
CP_CHOICES = (1, 2, 4, 8, 16, 32)
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODE.items()}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pin(pins: Mapping[str, Any], key: str, values: Sequence[Any]) -> list[Any]:
    """The knob's range, or the pinned value alone: a pinned value is always kept (it was
    checked against the framework and the model by :func:`check_pins`), never pruned by a
    dominance rule of the enumeration."""
    if key in pins:
        return [pins[key]]
    return list(values)


def check_pins(model: TransformerSpec, training: Training, pins: Mapping[str, Any]) -> None:
    """Refuse, before any search, a pinned field that the framework cannot run
    (:func:`cost_model.frameworks.pinned_rule_violation`) or that the model rules out on its
    own, naming ``constraints.<field>`` and the rule (HTTP 422).  Sequence parallelism at tp=1 is
    accepted (a no-op, warned about by ``estimate``)."""
    rule = pinned_rule_violation(training.framework, pins)
    if rule is not None:
        raise InvalidStrategy(rule[1], field=f"constraints.{rule[0]}")
    if "recompute_modules" in pins:
        why = recompute_modules_violation(training.framework, pins["recompute_modules"] or ("core_attn",))
        if why is not None:
            raise InvalidStrategy(why, field="constraints.recompute_modules")
        if pins.get("recompute", "selective") != "selective":
            raise InvalidStrategy(f"recompute_modules choose what recompute: selective recomputes (pinned recompute {pins['recompute']!r})",
                                  field="constraints.recompute_modules")
    if pins.get("recompute_num_layers") and pins.get("recompute", "full") != "full":
        raise InvalidStrategy(f"recompute_num_layers={pins['recompute_num_layers']} needs recompute: full (pinned {pins['recompute']!r})",
                              field="constraints.recompute_num_layers")
    tp = pins.get("tp")
    if tp is not None and tp > 1 and model.num_heads % tp:
        raise InvalidStrategy(f"tp={tp} does not divide the {model.num_heads} attention heads", field="constraints.tp")
    why = kv_heads_violation(training.framework, tp, model.num_kv_heads)
    if why is not None:
        raise InvalidStrategy(why, field="constraints.tp")
    # torchtitan's checks that the pinned knobs alone can break (the rest wait for whole rows)
    m = _pinned_microbatches(training, pins)
    rule = optimizer_in_backward_layout_violation(training.optimizer_in_backward, pp=pins.get("pp"), ep=pins.get("ep"), num_microbatches=m)
    if rule is None:
        rule = torchtitan_layout_violation(training.framework, tp=tp, pp=pins.get("pp"), cp=pins.get("cp"), zero_stage=pins.get("zero_stage"),
                                           tied_embeddings=model.tie_embeddings, vpp=pins.get("vpp", 1) if m is not None else None,
                                           num_microbatches=m)
    if rule is None:  # DeepSpeed's engine's MoE checks the pinned knobs alone can break
        rule = deepspeed_moe_violation(training.framework, is_moe=model.is_moe, zero_stage=pins.get("zero_stage"),
                                       ep=pins.get("ep"), cp=pins.get("cp"))
    if rule is not None:
        raise InvalidStrategy(rule[1], field=f"constraints.{rule[0]}")
    why = (precision_aware_zero_violation(training.precision_aware_optimizer, pins.get("zero_stage"))
           or fp8_param_gather_zero_violation(training.fp8_param_gather, pins.get("zero_stage")))
    if why is not None:
        raise InvalidStrategy(why, field="constraints.zero_stage")
    shard, dp = pins.get("dp_shard") or 0, pins.get("dp")
    rule = muon_layout_violation(training.optimizer, pins.get("zero_stage", 1 if shard else None),
                                 partial=bool(shard) and (dp is None or shard < dp))
    if rule is not None:
        raise InvalidStrategy(rule[1], field=f"constraints.{rule[0]}")
    offload_rule = offload_layout_violation(training.framework, training.optimizer_offload_fraction, training.cpu_offload,
                                            pins.get("zero_stage"), pins.get("pp"), training.activation_offloading, pins.get("recompute"))
    if offload_rule is not None:
        raise InvalidStrategy(offload_rule[1], field=f"constraints.{offload_rule[0]}")
    if "sequence_parallel" in pins:
        why = tp_comm_overlap_layout_violation(training.tp_comm_overlap, tp, bool(pins["sequence_parallel"]))
        if why is not None:
            raise InvalidStrategy(why, field="constraints.sequence_parallel")
    ep = pins.get("ep")
    if ep is not None and ep > 1:
        if not model.is_moe:
            raise InvalidStrategy(f"ep={ep} needs a mixture-of-experts model; {model.name} is dense", field="constraints.ep")
        why = expert_parallel_dtype_violation(training.framework, training.dtype, ep)
        if why is not None:
            raise InvalidStrategy(why, field="constraints.ep")
        if model.num_experts % ep:
            raise InvalidStrategy(f"ep={ep} does not divide the {model.num_experts} experts", field="constraints.ep")
    etp = pins.get("etp")
    # at the pinned ep, else at every ep the search may choose (none or some: the rows decide)
    whys = [required_expert_tensor_parallel_violation(training.framework, model.is_moe, model.has_out_bias and model.has_mlp_bias,
                                                      etp or 0, e) for e in ((pins["ep"],) if "ep" in pins else (1, 2))]
    why = whys[0] if all(whys) else None
    if why is not None:
        raise InvalidStrategy(why, field="constraints.etp")
    if etp and model.is_moe:  # a dense model's etp is a no-op (pin_notes)
        # the layout's tiling is checked here when it is pinned whole, else row by row
        whole = {"tp", "dp", "ep"} <= set(pins) and ("cp" in pins or not rules_for(training.framework).context_parallel)
        layout = Strategy(tp=pins["tp"], cp=pins.get("cp", 1), dp=pins["dp"], ep=pins["ep"]) if whole else None
        why = expert_tensor_parallel_violation(model, training.framework, etp, layout)
        if why is not None:
            raise InvalidStrategy(why, field="constraints.etp")
    cp = pins.get("cp")
    why = cp_sequence_violation(training.framework, cp, training.sequence_length) if cp is not None else None
    if why is not None:
        raise InvalidStrategy(why, field="constraints.cp")
    why = context_parallel_violation(training.framework, cp=cp or 1, tp=pins.get("tp", 1), pp=pins.get("pp", 1),
                                     exchange=training.cp_comm_type, heads=model.num_heads, a2a_size=training.cp_a2a_size)
    if why is not None:
        raise InvalidStrategy(why, field="constraints.cp")
    if ep is not None and ep > 1 and "tp" in pins and "dp" in pins and ("cp" in pins or not rules_for(training.framework).context_parallel):
        group = ep_group_divisor(training.framework, tp=pins["tp"], dp=pins["dp"], cp=pins.get("cp", 1))
        if group % ep:
            where = "tp·cp·dp" if rules_for(training.framework).ep_folding else "dp·cp (experts are spread over the data-parallel ranks)"
            raise InvalidStrategy(f"{training.framework}: ep={ep} must divide {where} = {group} of the pinned layout", field="constraints.ep")
    units = model.num_layers + split_units(pins)
    pp = pins.get("pp")
    if pp is not None and pp > units:
        raise InvalidStrategy(f"pp={pp} exceeds the {model.num_layers} layers", field="constraints.pp")
    rl = pins.get("recompute_num_layers")
    if rl and pp is not None and not recompute_depth_fits(model.num_layers, rl, pp):
        raise InvalidStrategy(f"recompute_num_layers={rl}: needs at most the {-(-model.num_layers // pp)} layers of a pipeline stage "
                              f"at pp={pp} (Megatron-Core: 1 to num_layers_per_pipeline_rank)", field="constraints.recompute_num_layers")
    _check_batch_and_pipeline_pins(model, training, pins)
    for flag in SPLIT_FLAGS:
        if not pins.get(flag):
            continue
        if pp == 1:
            raise InvalidStrategy("counts the embedding or the loss as a pipeline layer: needs pp > 1", field=f"constraints.{flag}")
        chunks = (pp or 1) * pins.get("vpp", 1)
        # a pinned layer split says where every layer goes (Megatron-Core's pipeline layout); the
        # even split the flags otherwise ask for must divide (cost_model.strategy.validate_strategy)
        if pp is not None and "vpp" in pins and "layers_per_stage" not in pins and units % chunks:
            raise InvalidStrategy(
                f"{model.num_layers} layers + {split_units(pins)} (embedding/loss counted as layers) = {units} is not a multiple "
                f"of pp·vpp = {pp}·{pins['vpp']} = {chunks}", field=f"constraints.{flag}")


def _pinned_microbatches(training: Training, pins: Mapping[str, Any]) -> int | None:
    """Micro-batches a pipeline schedule runs when dp and micro_batch_size are pinned and share
    the global batch evenly — a step's, or under a pinned pipeline each of its
    ``training.pipeline_schedules_per_step`` schedules' —, else None (those that do not are
    refused by :func:`_check_batch_and_pipeline_pins`)."""
    dp, mbs, B = pins.get("dp"), pins.get("micro_batch_size"), training.global_batch_size
    if dp is None or mbs is None or B % (dp * mbs):
        return None
    k = training.pipeline_schedules(pins.get("pp") or 1)
    if (B // (dp * mbs)) % k:
        return None
    return int(B // (dp * mbs) // k)


def _check_batch_and_pipeline_pins(model: TransformerSpec, training: Training, pins: Mapping[str, Any]) -> None:
    """The pinned knobs that cannot share the global batch or the pipeline among themselves —
    which the search would otherwise meet as an empty space — refused by the field at fault:
    dp must divide the global batch (each data-parallel rank takes an equal share of a step's
    sequences), micro_batch_size that share; an interleaved schedule needs the framework's
    fewest stages (:func:`~cost_model.frameworks.interleaved_schedule_violation`) and a
    micro-batch count its schedule takes, in the group asked for if any
    (:func:`~cost_model.frameworks.interleaved_microbatches_violation`); a pinned layer split covers the model's layers
    once, one entry per model chunk."""
    B = training.global_batch_size
    dp, mbs, pp, vpp = pins.get("dp"), pins.get("micro_batch_size"), pins.get("pp"), pins.get("vpp", 1)
    if dp is not None and B % dp:
        raise InvalidStrategy(f"dp={dp} does not divide global_batch_size {B} (each data-parallel rank takes an equal share "
                              "of a step's sequences)", field="constraints.dp")
    share = B // dp if dp is not None else B
    if mbs is not None and share % mbs:
        of = f"the {share} sequences each of the dp={dp} ranks takes a step" if dp is not None else f"global_batch_size {B}"
        raise InvalidStrategy(f"micro_batch_size={mbs} does not divide {of}", field="constraints.micro_batch_size")
    k = training.pipeline_schedules(pp or 1)
    if pp is not None and dp is not None and mbs is not None and (share // mbs) % k:
        raise InvalidStrategy(f"the {share // mbs} micro-batches a step (global_batch_size {B} / dp {dp} / micro_batch_size {mbs}) "
                              f"do not fall into {k} pipeline schedules of equal size", field="training.pipeline_schedules_per_step")
    if vpp > 1 and pp is not None:
        why = interleaved_schedule_violation(training.framework, pp=pp, vpp=vpp)
        if why is not None:
            raise InvalidStrategy(why, field="constraints.vpp")
        m = _pinned_microbatches(training, pins)
        bad = (interleaved_microbatches_violation(training.framework, num_microbatches=m, pp=pp, group=training.microbatch_group_size_per_vp_stage)
               if m is not None else None)
        if bad is not None:
            raise InvalidStrategy(f"{bad[1]}; global_batch_size {B} / dp {dp} / micro_batch_size {mbs}",
                                  field="constraints.vpp" if bad[0] == "vpp" else f"training.{bad[0]}")
    lps = pins.get("layers_per_stage")
    why = layer_split_violation(lps, model.num_layers, pp, vpp) if lps is not None else None
    if why is not None:
        raise InvalidStrategy(why, field="constraints.layers_per_stage")


def check_pins_fit(pins: Mapping[str, Any], available_gpus: int, max_devices: int | None = None, max_tp: int | None = None,
                   max_pp: int | None = None) -> None:
    """Refuse pinned tp·cp·pp·dp (or an ep) that need more GPUs than the request offers (the
    cluster's available ones, or max_devices where fewer), and a pinned tp or pp above the
    request's own max_tp / max_pp, naming the pinned field."""
    gpus, where = available_gpus, "the cluster has available"
    if max_devices and max_devices < available_gpus:
        gpus, where = max_devices, "max_devices allows"
    for knob, bound in (("tp", max_tp), ("pp", max_pp)):
        if bound and pins.get(knob, 1) > bound:
            raise InvalidStrategy(f"{knob}={pins[knob]} exceeds max_{knob}={bound} of the same request", field=f"constraints.{knob}")
    ep = int(pins.get("ep", 1))
    if ep > gpus:  # expert ranks are carved from a stage's tp·cp·dp (or dp·cp) ranks
        raise InvalidStrategy(f"ep={ep} needs {ep} GPUs of one pipeline stage, more than the {gpus} {where}", field="constraints.ep")
    pinned = {k: int(pins[k]) for k in ("tp", "cp", "pp", "dp") if k in pins}
    need = math.prod(pinned.values())
    if need > gpus:
        field = max(pinned, key=lambda k: pinned[k])  # the largest pinned factor (the first of equals)
        names, values = "·".join(pinned), "·".join(str(v) for v in pinned.values())
        product = f"{names} = {values}" if len(pinned) > 1 else f"{names}={need}"
        raise InvalidStrategy(f"{product} needs {need} GPUs, more than the {gpus} {where}", field=f"constraints.{field}")


def pin_notes(model: TransformerSpec, training: Training, pins: Mapping[str, Any], strategy: Strategy) -> list[str]:
    """Warnings for pinned fields the framework runs as something else, which the plan's
    strategy shows as run: a sharding stage over a one-rank group (no sharding,
    :func:`cost_model.frameworks.effective_zero_stage`), a dense model's etp."""
    notes = []
    if "zero_stage" in pins and strategy.zero_stage != pins["zero_stage"]:
        notes.append(one_rank_sharding_note(training.framework, pins["zero_stage"]))
    if pins.get("etp") and not model.is_moe:
        notes.append(dense_etp_note(pins["etp"]))
    return notes


def split_units(pins: Mapping[str, Any]) -> int:
    """Pipeline units beyond the decoder layers that the pinned split flags add (the embedding
    and/or the loss counted as a layer: :func:`cost_model.strategy.pipeline_split`)."""
    return sum(1 for flag in SPLIT_FLAGS if pins.get(flag))


def pp_choices(num_layers: int) -> list[int]:
    """Pipeline depths searched: every divisor of the layer count (even splits) and every depth
    up to 16 (uneven splits, balanced by the solver)."""
    return sorted({p for p in range(1, num_layers + 1) if num_layers % p == 0 or p <= 16})


def enumerate_space(
    model: TransformerSpec,
    training: Training,
    max_gpus: int,
    gpus_per_node: int,
    pins: Mapping[str, Any],
    max_tp: int | None = None,
    max_pp: int | None = None,
) -> StrategyArrays:
    """All candidate strategies for a pool of ``max_gpus`` GPUs with ``gpus_per_node`` per node.

    Dominated settings are skipped unless pinned — under the cost model they are never better:
    sequence parallelism with tp > 1 (same communication volume, less memory and elementwise
    work), ZeRO 0 (stage 1 moves the same bytes with less memory and a shorter optimizer step).
    """
    L = model.num_layers
    B = training.global_batch_size
    s = training.sequence_length

    rules = rules_for(training.framework)
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if gpus_per_node % t == 0 and model.num_heads % t == 0
           and kv_heads_violation(training.framework, t, model.num_kv_heads) is None]
    if max_tp:
        tps = [t for t in tps if t <= max_tp]
    if not rules.tensor_parallel:
        tps = [1]
    tps = _pin(pins, "tp", tps)
    cps = _pin(pins, "cp", [c for c in CP_CHOICES if cp_sequence_violation(training.framework, c, s) is None
                            and (c == 1 or s // c >= 1024) and (c == 1 or rules.context_parallel)])
    units = L + split_units(pins)  # the embedding/loss counted as layers when pinned so
    pps = pp_choices(L) if rules.pipeline_parallel else [1]
    if units != L:  # Megatron-Core splits layers + flags evenly over pp·vpp chunks (pp > 1)
        pps = [p for p in sorted(set(pps) | {p for p in range(2, units + 1) if units % p == 0}) if p > 1 and units % p == 0]
    if max_pp:
        pps = [p for p in pps if p <= max_pp]
    pps = _pin(pins, "pp", pps)
    dps = _pin(pins, "dp", _divisors(B))
    mbss = _pin(pins, "micro_batch_size", MBS_CHOICES)
    vpps = _pin(pins, "vpp", VPP_CHOICES if rules.interleaved_pipeline else (1,))
    selective = core_attention_recompute_frees(training) or op_level_selective(model, training)
    rc_choices = _recompute_choices(model, training, pins, selective)
    ep_ok = model.is_moe and expert_parallel_runs_in(training.framework, training.dtype)
    eps = _pin(pins, "ep", _divisors(model.num_experts) if ep_ok else [1])

    outer: list[tuple[int, int, int, int, int]] = []
    for tp, cp, pp in itertools.product(tps, cps, pps):
        base = tp * cp * pp
        if base > max_gpus or pp > units:
            continue
        if context_parallel_violation(training.framework, cp=cp, tp=tp, pp=pp, exchange=training.cp_comm_type, heads=model.num_heads,
                                      a2a_size=training.cp_a2a_size):
            continue
        for dp in dps:
            if base * dp > max_gpus:
                continue
            for ep in eps:
                if ep_group_divisor(training.framework, tp=tp, dp=dp, cp=cp) % ep == 0:
                    outer.append((dp, tp, pp, cp, ep))
    if not outer:
        return _empty()
    # Inner knobs, vectorised: each step repeats every row once per value of the next knob
    # (rows stay in nested-loop order: outer knobs first, then mbs, vpp, recompute, zero).
    o = np.array(outer, dtype=np.int64)
    cols: dict[str, np.ndarray] = {"dp": o[:, 0], "tp": o[:, 1], "pp": o[:, 2], "cp": o[:, 3], "ep": o[:, 4]}
    if training.optimizer_in_backward:  # a step is one micro-batch (optimizer_in_backward_layout_violation)
        cols = _keep(cols, (cols["pp"] == 1) & (cols["ep"] == 1) & (B % cols["dp"] == 0))
        cols["mbs"] = B // cols["dp"]
        cols = _keep(cols, np.isin(cols["mbs"], mbss) if "micro_batch_size" in pins else np.ones(len(cols["dp"]), dtype=bool))
    else:
        cols = _cross(cols, "mbs", mbss)
    cols = _keep(cols, (B // cols["dp"]) % cols["mbs"] == 0)
    if training.pipeline_schedules_per_step > 1:  # several schedules a step share its micro-batches evenly
        cols = _keep(cols, (B // cols["dp"] // cols["mbs"]) % training.pipeline_schedules(cols["pp"]) == 0)
    cols = _cross(cols, "vpp", vpps)
    pp_col, vpp_col = cols["pp"], cols["vpp"]
    m = B // cols["dp"] // cols["mbs"]
    # Interleaved model chunks need not split the layers evenly: where pp·vpp does not divide them
    # the chunks are near-even, as the estimate costs them and each interleaving framework runs
    # them (Megatron-Core's --pipeline-model-parallel-layout, torchtitan's module_fqns_per_model_part,
    # Paddle's seg_method).  The search offers them at the depths that have no even interleaving —
    # at every depth for a prime layer count (DeepSeek-V3's 61) or 94 (Qwen3-235B), where
    # Megatron-Core's EP overlap, which needs an interleaved pipeline, would otherwise find none —
    # and a pinned vpp at any depth; where an even interleaving exists its near-even neighbours
    # differ from it by a layer a chunk and would only slow the search.  A pinned layers_per_stage
    # (one entry per model chunk) says its own split.
    pinned_vpp, pinned_split = pins.get("vpp", 1) > 1, "layers_per_stage" in pins
    if units != L:  # pinned split flags: layers + flags fill the pp·vpp chunks evenly or not at all — or as a pinned split says
        chunks_ok = (units % (pp_col * vpp_col) == 0) | pinned_split
        cols = _keep(cols, chunks_ok)
        pp_col, vpp_col, m, chunks_ok = cols["pp"], cols["vpp"], B // cols["dp"] // cols["mbs"], chunks_ok[chunks_ok]
    else:
        no_even = np.array([p > 0 and not any(L % (p * v) == 0 for v in vpps if v > 1) for p in range(max(pps, default=1) + 1)])
        chunks_ok = (L % (pp_col * vpp_col) == 0) | pinned_split | ((pinned_vpp | no_even[pp_col]) & (pp_col * vpp_col <= L))
    interleaved = (pp_col >= rules.min_interleaved_pp) & chunks_ok
    interleaved &= interleaved_microbatches_run(training.framework, m // training.pipeline_schedules(pp_col), pp_col,
                                                training.microbatch_group_size_per_vp_stage)
    cols = _keep(cols, (vpp_col == 1) | interleaved)
    if pins.get("recompute_num_layers"):  # a pinned depth or group the layout's chunks can hold
        cols = _keep(cols, recompute_depth_fits(L, pins["recompute_num_layers"], cols["pp"]))
        # the framework's rule at each row's pipeline depth, asked once per distinct pp (fsdp's and
        # paddle's partial recompute runs without a pipeline)
        depth, method = pins["recompute_num_layers"], pins.get("recompute_method", "")
        runs = [p for p in np.unique(cols["pp"]) if recompute_method_violation(training.framework, depth, method, pp=int(p)) is None]
        cols = _keep(cols, np.isin(cols["pp"], runs))
    cols = _cross(cols, "rc", list(range(len(rc_choices))))
    choice = cols.pop("rc")
    cols["recompute"] = np.array([c for c, _ in rc_choices], dtype=np.int64)[choice]
    cols["rc_mods"] = np.array([mask for _, mask in rc_choices], dtype=np.int64)[choice]
    if training.moe_comm_overlap and rules.moe_comm_overlap:
        # Megatron-Core's EP overlap (moe_overlap_layout_violation): interleaved with a pipeline, no full recompute (where ep > 1)
        moe_rows = cols["ep"] > 1
        cols = _keep(cols, ~(moe_rows & (((cols["pp"] > 1) & (cols["vpp"] == 1)) | (cols["recompute"] == RECOMPUTE_CODE["full"]))))
    if "zero_stage" in pins:
        cols = _cross(cols, "zero", [pins["zero_stage"]])
        # the pinned stage as each row runs it (Paddle's stage ≥ 2 over a one-rank group: none)
        cols["zero"] = effective_zero_stage(training.framework, cols["zero"], pins.get("dp_shard") or cols["dp"])
    else:
        # Stage 1 only with a pipeline (2/3 conflict with gradient accumulation across
        # micro-batches) — or, where the framework shards with a pipeline (fsdp), every stage.
        # Without a pipeline every stage competes: stage 2 moves the same bytes as 1 with less
        # memory, but per micro-batch, and the compute its hidden reduce-scatters overlap slows
        # (layer_cost.sharded_microbatch_exposed_s), so neither dominates.  Stage 0 competes
        # only under DeepSpeed's engine (``rules.deepspeed_engine``), whose ZeRO optimizer adds
        # buffers of its own — a full-size fp32 gradient partition where nothing shards (dp 1,
        # or experts of one EDP rank) and its IPG buckets — so that stage 1 can hold more than
        # stage 0; elsewhere stage 1 is stage 0's memory less the sharded state, for the same traffic.
        stages = [z for z in ((0, 1, 2, 3) if rules.deepspeed_engine else (1, 2, 3)) if z in rules.zero_stages]
        if training.precision_aware_optimizer:  # Megatron-Core's distributed optimizer only (precision_aware_zero_violation)
            stages = [1]
        if training.fp8_param_gather:  # a sharded optimizer (fp8_param_gather_zero_violation)
            stages = [z for z in stages if z >= 1]
        if training.muon:  # whole matrices a rank (muon_layout_violation); stage 0 competes: the
            # layer-wise optimizer all-reduces the gradients and all-gathers the weights (more traffic)
            stages = [0, 1]
        # the stages the request's offload runs at (offload_layout_violation)
        stages = [z for z in stages if offload_layout_violation(training.framework, training.optimizer_offload_fraction,
                                                                training.cpu_offload, z, None) is None]
        cols = _cross(cols, "zero", stages)
        if not rules.sharding_with_pipeline:
            cols = _keep(cols, (cols["pp"] == 1) | (cols["zero"] <= 1))
        elif not rules.sharded_gradients_in_pipeline:  # torchtitan: no ZeRO-2 across a pipeline's micro-batches
            cols = _keep(cols, (cols["pp"] == 1) | (cols["zero"] != 2))
    if not rules.sharding_with_pipeline:
        cols = _keep(cols, ~((cols["zero"] >= 2) & (cols["pp"] > 1)))
    if training.offload_field is not None:  # the layouts the request's offload runs in
        cols = _keep(cols, _offload_rows_ok(training, cols))
    if training.framework in WHOLE_LAYOUT_RULE_FRAMEWORKS:  # elsewhere every row passes: no pass over them
        cols = _keep(cols, _start_up_rules_hold(model, training, cols, B, bool(pins.get("sequence_parallel", rules.sequence_parallel))))
    # the framework's own ETP for this model at each row's ep (e.g. 1 for biased experts under
    # Megatron-Core, for Paddle's and torchtitan's expert groups), 0 where it has none (its
    # default), by table lookup
    linear_bias = model.has_out_bias and model.has_mlp_bias
    required = np.zeros(int(cols["ep"].max(initial=1)) + 1, dtype=np.int64)
    for e in np.unique(cols["ep"]):
        required[e] = required_expert_tensor_parallel(training.framework, model.is_moe, linear_bias, int(e)) or 0
    if required.any() and not pins.get("etp"):
        cols["etp"] = required[cols["ep"]]  # a required ETP of 1 tiles every row
    if pins.get("etp") and model.is_moe:
        # A pinned expert tensor parallelism: the rows whose EP × ETP blocks tile tp·cp·dp, and
        # where the framework requires an ETP of its own, that one.
        etp = int(pins["etp"])
        needed = required[cols["ep"]]
        runs = (needed == 0) | (needed == etp)
        if rules.unsplit_experts_under_ep:  # without expert parallelism its experts follow tp
            runs = runs & ((cols["ep"] > 1) | (cols["tp"] == etp))
        cols = _keep(cols, expert_blocks_tile(cols["tp"], cols["cp"], cols["dp"], cols["ep"], etp) & runs)
        cols["etp"] = np.full(len(cols["dp"]), etp, dtype=np.int64)
    cols = _partial_sharding(model, training, cols, gpus_per_node, pins)
    if rules.ep_over_sharding:  # expert_layout_violation, row by row (Paddle fleet's expert groups)
        cols = _keep(cols, expert_layout_ok(cols["tp"], cols["cp"], cols["ep"], cols["zero"], cols["dp"], cols["dp_shard"]))
    if model.is_moe and rules.deepspeed_engine:  # deepspeed_moe_violation, row by row
        cols = _keep(cols, deepspeed_moe_ok(training.framework, True, cols["zero"], cols["ep"], cols["cp"]))
    if rules.drops_one_rank_sharding:  # effective_zero_stage, row by row: what stage 0 already costs
        shard_ranks = np.where(cols["dp_shard"] > 0, cols["dp_shard"], cols["dp"])
        cols = _keep(cols, ~((cols["zero"] >= 2) & (shard_ranks == 1)))
    if "sequence_parallel" in pins:
        # Pinned: kept as asked (at tp=1 a no-op that ``estimate`` warns about).
        cols["sp"] = np.full(len(cols["dp"]), bool(pins["sequence_parallel"]))
    else:
        cols["sp"] = (cols["tp"] > 1) & rules.sequence_parallel
    if training.tp_comm_overlap:  # tp_comm_overlap_layout_violation, row by row: tp > 1 only with sequence parallelism
        cols = _keep(cols, (cols["tp"] == 1) | cols["sp"])
    if len(cols["dp"]) == 0:
        return _empty()
    f = {k: v.astype(float) for k, v in cols.items() if k != "sp"}
    rl = pins.get("recompute_num_layers")
    full = f["recompute"] == RECOMPUTE_CODE["full"]
    uniform = pins.get("recompute_method") == "uniform"  # groups of rl layers a checkpoint, every layer recomputed
    shard = f["dp_shard"] if f["dp_shard"].any() else None
    return StrategyArrays(
        etp=f.get("etp"),
        dp=f["dp"],
        tp=f["tp"],
        pp=f["pp"],
        cp=f["cp"],
        ep=f["ep"],
        vpp=f["vpp"],
        mbs=f["mbs"],
        sp=cols["sp"].astype(bool),
        recompute=f["recompute"],
        zero=f["zero"],
        recompute_layers=np.where(full, float(rl), 0.0) if rl and not uniform else None,
        dp_shard=shard,
        recompute_modules=f["rc_mods"] if f["rc_mods"].any() else None,
        recompute_group=np.where(full, float(rl or 1), 1.0) if uniform else None,
    )


def _start_up_rules_hold(model: TransformerSpec, training: Training, cols: dict[str, np.ndarray], global_batch: int,
                         sequence_parallel: bool) -> np.ndarray:
    """Row mask: the layout passes the checks the framework runs at start-up that need the whole
    row — torchtitan's (:func:`cost_model.frameworks.torchtitan_layout_violation`) and the
    sequence split over cp and tp under sequence parallelism — each distinct layout checked once."""
    if len(cols["dp"]) == 0:
        return np.zeros(0, dtype=bool)
    m = global_batch // cols["dp"] // cols["mbs"] // training.pipeline_schedules(cols["pp"])  # a schedule's micro-batches
    keys = np.stack([cols["tp"], cols["pp"], cols["vpp"], cols["ep"], cols["cp"], cols["zero"], m], axis=1)
    layouts, index = np.unique(keys, axis=0, return_inverse=True)
    fw, seq = training.framework, training.sequence_length
    ok = np.array([
        torchtitan_layout_violation(fw, tp=int(tp), pp=int(pp), vpp=int(vpp), ep=int(ep), cp=int(cp), zero_stage=int(z),
                                    num_microbatches=int(mb), tied_embeddings=model.tie_embeddings) is None
        and cp_sequence_violation(fw, int(cp), seq, int(tp), sequence_parallel) is None
        for tp, pp, vpp, ep, cp, z, mb in layouts
    ])
    out: np.ndarray = ok[np.asarray(index).reshape(-1)]
    return out


def _partial_sharding(model: TransformerSpec, training: Training, cols: dict[str, np.ndarray], gpus_per_node: int,
                      pins: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The ``dp_shard`` column (0: the ZeRO state shards over every dp rank).  Pinned: every row
    where the framework shards over part of dp at the row's stage (others dropped).  Else each
    such row spanning more than a node gets an HSDP twin that shards within a node —
    dp_shard = gpus_per_node/(tp·cp), the state replicated across nodes — beside full sharding:
    neither dominates (HSDP keeps the per-micro-batch gathers on NVLink and their latency
    flat in dp, full sharding holds dp/dp_shard times less state and syncs no replicas)."""
    # Muon's layer-wise optimizer owns whole matrices over the whole group (muon_layout_violation): none
    allowed = () if training.muon else rules_for(training.framework).partial_sharding_stages
    partial = np.isin(cols["zero"], np.array(allowed or (-1,)))
    dp = cols["dp"]
    if "dp_shard" in pins and pins["dp_shard"]:
        shard = int(pins["dp_shard"])
        keep = (dp == shard) | (partial & (dp % shard == 0))
        cols = _keep(cols, keep)
        cols["dp_shard"] = np.where(cols["dp"] == shard, 0, shard).astype(np.int64)
        return _keep(cols, _experts_split(model, cols))
    cols["dp_shard"] = np.zeros(len(dp), dtype=np.int64)
    if "dp_shard" in pins or not allowed:
        return cols
    inner = cols["tp"] * cols["cp"]
    node_shard = np.where(gpus_per_node % inner == 0, gpus_per_node // np.maximum(inner, 1), 0)
    twin = partial & (node_shard > 0) & (node_shard < dp) & (dp % np.maximum(node_shard, 1) == 0)
    if not twin.any():
        return cols
    extra = {k: v[twin] for k, v in cols.items()}
    extra["dp_shard"] = node_shard[twin]
    extra = _keep(extra, _experts_split(model, extra))
    return {k: np.concatenate([cols[k], extra[k]]) for k in cols}


def _experts_split(model: TransformerSpec, cols: dict[str, np.ndarray]) -> np.ndarray:
    """Rows whose experts' EDP replicas split into the dp/dp_shard replica groups
    (:func:`cost_model.transformer.moe.experts_split_into_replicas`)."""
    if not model.is_moe:
        return np.ones(len(cols["dp"]), dtype=bool)
    return experts_split_into_replicas(cols["tp"], cols["cp"], cols["dp"], cols["ep"], cols["dp_shard"], cols.get("etp", 0.0))


def layout_keys(S: StrategyArrays, *, recompute: bool = True) -> np.ndarray:
    """One row per candidate of the knobs that make it a distinct layout (not its split): dp, tp,
    pp, cp, ep, vpp, micro-batch, ZeRO stage, sequence parallelism, nesting order, ZeRO shard
    group (dp_shard) and — with
    ``recompute`` — the recompute mode, block depth, recompute modules and uniform group."""
    n = len(S)
    cols = [S.dp, S.tp, S.pp, S.cp, S.ep, S.vpp, S.mbs, S.zero, S.sp.astype(float), S.nest if S.nest is not None else np.zeros(n),
            S.dp_shard if S.dp_shard is not None else np.zeros(n)]
    if recompute:
        cols += [S.recompute, S.recompute_layers if S.recompute_layers is not None else np.zeros(n),
                 S.recompute_modules if S.recompute_modules is not None else np.zeros(n),
                 S.recompute_group if S.recompute_group is not None else np.ones(n)]
    return np.stack(cols, axis=1)


def block_recompute_candidates(model: TransformerSpec, training: Training, S: StrategyArrays, fits: np.ndarray,
                               pins: Mapping[str, Any], bound: np.ndarray | None = None, threshold: float = np.inf,
                               unfit: StrategyArrays | None = None, unfit_bound: np.ndarray | None = None) -> StrategyArrays:
    """Partial-recompute variants of the full-recompute rows of ``S`` (Megatron-Core's block
    method, :func:`cost_model.transformer.layer_cost.recompute_fraction`) whose twin without
    recompute — the same layout with ``recompute: none`` — does not fit (``fits``: per row of S,
    whether some split fits memory).  One row per depth of
    :func:`cost_model.strategy.block_recompute_depths`.  None where the framework has no block
    recompute, recompute or its depth is pinned, or the layout fits without recompute (then none is the faster).
    ``bound``: per row of S a lower bound of its objective over all splits; a layout whose twin
    without recompute is bounded at ``threshold`` or above is skipped (recomputing only adds
    time, so no depth of it can beat the answers found so far).  ``unfit``: more twins, layouts
    no split of which fits that are not among S's rows (on a topology, dropped before their
    nesting orders were costed: memory does not depend on the order, so each stands for its
    layout under every order), ``unfit_bound`` a bound of each over every order."""
    if not rules_for(training.framework).block_recompute or "recompute" in pins or "recompute_num_layers" in pins or len(S) == 0:
        return _empty()
    full = np.nonzero((S.recompute == RECOMPUTE_CODE["full"]) & fits)[0]
    lb = bound if bound is not None else np.full(len(S), -np.inf)
    # layouts without recompute that do not fit and whose bound can still enter the answers
    none = np.nonzero((S.recompute == RECOMPUTE_CODE["none"]) & ~fits & (lb < threshold))[0]
    knobs = layout_keys(S, recompute=False)
    wanted = _rows_in(knobs[full], knobs[none])
    if unfit is not None and len(unfit):
        u_bound = unfit_bound if unfit_bound is not None else np.full(len(unfit), -np.inf)
        twins = np.nonzero((unfit.recompute == RECOMPUTE_CODE["none"]) & (u_bound < threshold))[0]
        any_order = layout_keys(replace(S, nest=None), recompute=False)[full]
        wanted |= _rows_in(any_order, layout_keys(replace(unfit, nest=None), recompute=False)[twins])
    full_rows = [int(i) for i in full[wanted]]
    if not full_rows:
        return _empty()
    rows: list[int] = []
    depths: list[float] = []
    by_chunks: dict[int, list[int]] = {}
    for i in full_rows:
        chunks = int(S.pp[i] * S.vpp[i])
        if chunks not in by_chunks:
            by_chunks[chunks] = block_recompute_depths(model.num_layers, chunks)
        rows.extend([i] * len(by_chunks[chunks]))
        depths.extend(map(float, by_chunks[chunks]))
    if not rows:
        return _empty()
    return replace(S.take(np.array(rows)), recompute_layers=np.array(depths))


def _rows_in(rows: np.ndarray, among: np.ndarray) -> np.ndarray:
    """Whether each row of ``rows`` ([n, k]) is a row of ``among`` ([r, k])."""
    if len(rows) == 0 or len(among) == 0:
        return np.zeros(len(rows), dtype=bool)
    _, code = np.unique(np.concatenate([rows, among]), axis=0, return_inverse=True)
    code = code.reshape(-1)
    found: np.ndarray = np.isin(code[: len(rows)], code[len(rows):])
    return found


def _recompute_choices(model: TransformerSpec, training: Training, pins: Mapping[str, Any], selective: bool) -> list[tuple[int, int]]:
    """The (recompute mode, recompute-modules mask) pairs searched: none and full; selective at
    the framework's own scope where it differs from none (unfused attention, FP8/FP4 beside a
    fused one: :func:`~cost_model.transformer.layer_cost.core_attention_recompute_frees`; torchtitan's
    op-level policy) or is pinned; and under Megatron-Core, for a model with more to recompute,
    selective with :func:`~cost_model.transformer.layer_cost.lean_recompute_modules` — less
    memory than none for a little time, far less time than full.  Pinned modules: selective
    with those alone; a pinned block depth: full alone."""
    code = RECOMPUTE_CODE
    if "recompute_modules" in pins:
        return [(code["selective"], recompute_modules_mask(pins["recompute_modules"]))]
    if pins.get("recompute_num_layers"):
        return [(code["full"], 0)]
    lean = lean_recompute_modules(model, training) if rules_for(training.framework).recompute_modules else ()
    rcs = _pin(pins, "recompute", ["none", "full"] + (["selective"] if selective or lean else []))
    out: list[tuple[int, int]] = []
    for rc in rcs:
        if rc != "selective":
            out.append((code[rc], 0))
            continue
        if selective or "recompute" in pins:
            out.append((code["selective"], 0))
        if lean:
            out.append((code["selective"], recompute_modules_mask(lean)))
    return out


def _cross(cols: dict[str, np.ndarray], name: str, values: Sequence[Any]) -> dict[str, np.ndarray]:
    """Every row once per value of a new knob ``name`` (the new knob varies fastest)."""
    k = len(values)
    out = {key: np.repeat(v, k) for key, v in cols.items()}
    n = len(next(iter(cols.values())))
    out[name] = np.tile(np.asarray(values, dtype=np.int64), n)
    return out


def _offload_rows_ok(training: Training, cols: dict[str, np.ndarray]) -> np.ndarray:
    """The rows whose sharding stage, pipeline and recompute run the request's offload to the host:
    :func:`cost_model.frameworks.offload_layout_violation`, the strategy check's rule, asked once
    per distinct (zero, pp, recompute) of the rows."""
    keys = np.stack([cols["zero"], cols["pp"], cols["recompute"]], axis=1)
    distinct, row_key = np.unique(keys, axis=0, return_inverse=True)
    ok = np.array([offload_layout_violation(training.framework, training.optimizer_offload_fraction, training.cpu_offload, int(z), int(p),
                                            training.activation_offloading, RECOMPUTE_NAMES[int(r)]) is None for z, p, r in distinct], dtype=bool)
    out: np.ndarray = ok[np.reshape(row_key, -1)] if len(ok) else np.zeros(len(keys), dtype=bool)
    return out


def _keep(cols: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {key: v[mask] for key, v in cols.items()}


def _empty() -> StrategyArrays:
    z = np.zeros(0)
    return StrategyArrays(z, z, z, z, z, z, z, z.astype(bool), z, z)


def strategy_at(S: StrategyArrays, i: int, layers_per_stage: tuple[int, ...] | None = None) -> Strategy:
    group = int(S.recompute_group[i]) if S.recompute_group is not None else 1  # uniform recompute's layers a checkpoint
    return Strategy(
        dp=int(S.dp[i]),
        tp=int(S.tp[i]),
        pp=int(S.pp[i]),
        cp=int(S.cp[i]),
        ep=int(S.ep[i]),
        vpp=int(S.vpp[i]),
        micro_batch_size=int(S.mbs[i]),
        sequence_parallel=bool(S.sp[i]),
        recompute=RECOMPUTE_NAMES[int(S.recompute[i])],
        zero_stage=int(S.zero[i]),
        layers_per_stage=layers_per_stage,
        recompute_num_layers=int(S.recompute_layers[i]) if S.recompute_layers is not None else group if group > 1 else 0,
        recompute_method="uniform" if group > 1 else "",
        dp_shard=int(S.dp_shard[i]) if S.dp_shard is not None else 0,
        etp=int(S.etp[i]) if S.etp is not None else 0,
        recompute_modules=recompute_modules_of(int(S.recompute_modules[i])) if S.recompute_modules is not None else (),
    )

