"""Parallel strategy and its validation.

Rank order (Megatron-LM's): tensor-parallel rank varies fastest, then context-parallel, then
data-parallel, then pipeline stage — so global rank ``r = ((pp_i·dp + dp_i)·cp + cp_i)·tp + tp_i``.
Expert parallelism reuses the data×context ranks of each stage (``ep`` divides ``dp·cp``), or,
under Megatron-Core's MoE parallel folding, the tensor×context×data ranks (``ep`` divides
``tp·cp·dp``; :mod:`cost_model.frameworks`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

from cost_model.errors import InvalidStrategy
from cost_model.frameworks import (
    ALL_RECOMPUTE_MODULES,
    PADDLE_RECOMPUTE_MODULES,
    RECOMPUTE_MODULES,
    canonical_recompute_modules,
    context_parallel_violation,
    cp_sequence_violation,
    deepspeed_moe_violation,
    effective_zero_stage,
    expert_parallel_dtype_violation,
    fp8_param_gather_zero_violation,
    interleaved_microbatches_violation,
    kv_heads_violation,
    layout_rule_violation,
    moe_overlap_layout_violation,
    muon_layout_violation,
    offload_layout_violation,
    optimizer_in_backward_layout_violation,
    precision_aware_zero_violation,
    recompute_modules_violation,
    required_expert_tensor_parallel,
    required_expert_tensor_parallel_violation,
    rules_for,
    torchtitan_layout_violation,
    tp_comm_overlap_layout_violation,
)
from cost_model.training import Training
from cost_model.transformer.moe import expert_blocks_tile
from cost_model.transformer.spec import TransformerSpec

RECOMPUTE = ("none", "selective", "full")
#: Megatron-Core's ``--recompute-method`` under full recompute (``Strategy.recompute_method``):
#: ``block`` recomputes the first ``recompute_num_layers`` layers of each model chunk and keeps
#: the rest; ``uniform`` checkpoints the input of every group of ``recompute_num_layers``
#: consecutive layers and recomputes the whole group in its backward.
RECOMPUTE_METHODS = ("block", "uniform")
INT_FIELDS = ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch_size")
#: The pipeline-split options of Megatron-Core (:func:`pipeline_split`).
SPLIT_FLAGS = ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")


def even_split(total: int, parts: int) -> tuple[int, ...]:
    """Near-even split of ``total`` items (decoder layers) into ``parts``: the first
    ``total mod parts`` parts take one item more.  Megatron-LM's default pipeline split when
    the layer count divides; the near-even rule otherwise."""
    if parts < 1:
        raise ValueError(f"parts must be positive, got {parts}")
    q, r = divmod(total, parts)
    return tuple(q + (1 if i < r else 0) for i in range(parts))


def uneven_split_warning(asked: tuple[int, ...] | None, resolved: Strategy) -> str | None:
    """Warning when a strategy that gave no ``layers_per_stage`` (``asked``) and counts neither
    the embedding nor the loss as a layer got a near-even split (``resolved``, validated) because
    pp does not divide the decoder layers (the first ``L mod pp`` stages one layer more), else
    None: each framework runs such a split (Megatron-Core with ``--pipeline-model-parallel-layout``,
    which the launch writes; DeepSpeed's and Paddle's partitioners and torchtitan's split by
    themselves), but a source's own split may differ."""
    split = resolved.layers_per_stage
    flags = resolved.account_for_embedding_in_pipeline_split or resolved.account_for_loss_in_pipeline_split
    if asked is not None or flags or not split or len(set(split)) == 1:
        return None
    chunks = f"pp={resolved.pp}" if resolved.vpp == 1 else f"pp·vpp = {resolved.pp}·{resolved.vpp} = {len(split)}"
    return (f"{chunks} does not divide the {sum(split)} layers: costed with the near-even split "
            f"{list(split)} (give layers_per_stage for another)")


def pipeline_split(num_layers: int, chunks: int, *, embedding: bool, loss: bool) -> tuple[int, ...] | None:
    """Decoder layers per model chunk (pp·vpp chunks, model order) when the embedding and/or
    the loss count as a layer of the split; None when ``num_layers + embedding + loss`` is not
    a multiple of ``chunks`` (Megatron-Core asserts it).

    Megatron-Core ``transformer_block.get_num_layers_to_build`` / ``get_transformer_layer_offset``
    (flags ``--account-for-embedding-in-pipeline-split``, ``--account-for-loss-in-pipeline-split``):
    the layer count grows by one per flag, each chunk gets ``(L + e + l)/(pp·vpp)`` and the first
    chunk of the first stage builds ``e`` layers fewer, the last chunk of the last stage ``l``
    fewer.  With one layer per chunk the first chunk is the embedding alone and the last the
    output layer and loss alone — Llama 3 405B's split (126 + 2 = 128 = 16 stages × 8 chunks;
    Llama Team 2024, "The Llama 3 Herd of Models", §3.3.2: "the first model chunk on the first
    stage has only the embedding, and the last model chunk on the last stage has only output
    projection and loss calculation").
    """
    units = num_layers + int(embedding) + int(loss)
    if chunks < 1 or units % chunks:
        return None
    per = units // chunks
    parts = [per] * chunks
    parts[0] -= int(embedding)
    parts[-1] -= int(loss)
    if min(parts) < 0:
        return None
    return tuple(parts)


class RankCoords(NamedTuple):
    """A global rank's coordinates on the four parallel axes."""

    pp: int
    dp: int
    cp: int
    tp: int


def rank_of(
    pp_i: int, dp_i: int, cp_i: int, tp_i: int, *, dp: int, cp: int, tp: int, pp: int = 1, nesting: Sequence[str] | None = None
) -> int:
    """Global rank of the given coordinates in Megatron-LM's order (tensor fastest, then
    context, data, pipeline): ``r = ((pp_i·dp + dp_i)·cp + cp_i)·tp + tp_i``; with a
    ``nesting`` (inner to outer, e.g. ``("tp", "cp", "pp", "dp")``) the mixed-radix number of
    the coordinates in that order instead (Megatron-Core's ``order`` argument of its rank
    generator; ranks fill hosts in order, so this decides which dimension crosses nodes)."""
    if nesting is None:
        return ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i
    coord = {"tp": tp_i, "cp": cp_i, "dp": dp_i, "pp": pp_i}
    size = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    rank = 0
    for d in reversed(tuple(nesting)):
        rank = rank * size[d] + coord[d]
    return rank


def rank_coords(rank: int, *, dp: int, cp: int, tp: int, pp: int = 1, nesting: Sequence[str] | None = None) -> RankCoords:
    """Inverse of :func:`rank_of`: the (pp, dp, cp, tp) coordinates of a global rank."""
    if nesting is None:
        return RankCoords(pp=rank // (tp * cp * dp), dp=(rank // (tp * cp)) % dp, cp=(rank // tp) % cp, tp=rank % tp)
    size = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    coord: dict[str, int] = {}
    for d in nesting:
        rank, coord[d] = divmod(rank, size[d])
    return RankCoords(pp=coord["pp"], dp=coord["dp"], cp=coord["cp"], tp=coord["tp"])


#: Block recompute depths the planner searches, in eighths of a model chunk's layers (every depth
#: below 8 layers per chunk): memory falls and time rises linearly in the depth, so the first
#: depth that fits is the best, found within an eighth of a chunk.
BLOCK_RECOMPUTE_EIGHTHS = (1, 2, 3, 4, 5, 6, 7)


def block_recompute_depths(num_layers: int, chunks: int) -> list[int]:
    """The ``recompute_num_layers`` values searched for a model of ``num_layers`` decoder layers in
    ``chunks`` = pp·vpp model chunks: N = ⌈k/8 · chunk⌉ for k in :data:`BLOCK_RECOMPUTE_EIGHTHS`,
    distinct and below the largest chunk's ⌈layers/chunks⌉ (N = chunk is full recompute of every
    layer; a chunk of fewer than N layers recomputes all of its own)."""
    chunk = -(-num_layers // max(chunks, 1))
    out: list[int] = []
    for k in BLOCK_RECOMPUTE_EIGHTHS:
        n = -(-k * chunk // 8)
        if (not out or n > out[-1]) and 0 < n < chunk:
            out.append(n)
    return out


def layer_split_violation(layers_per_stage: Sequence[int], num_layers: int, pp: int | None, vpp: int) -> str | None:
    """Why a ``layers_per_stage`` split cannot be the model's, else None: one entry per model
    chunk (pp, or pp·vpp in model order when interleaved; unchecked while pp is not known) and
    the model's layers once."""
    chunks = None if pp is None else pp * vpp
    if chunks is not None and len(layers_per_stage) != chunks:
        what = f"pp={pp}" if vpp == 1 else f"pp·vpp = {pp}·{vpp} = {chunks} (one entry per model chunk, in model order)"
        return f"has {len(layers_per_stage)} entries but needs {what}"
    if sum(layers_per_stage) != num_layers:
        return f"sums to {sum(layers_per_stage)} but the model has {num_layers} layers"
    return None


def recompute_depth_fits(num_layers: int, depth: int, pp: Any) -> Any:
    """Whether a full recompute's ``recompute_num_layers`` = ``depth`` fits a near-even split of
    ``num_layers`` over pp stages (scalars or arrays): Megatron-Core takes 1 to a stage's ⌈L/pp⌉
    layers (TransformerConfig: between 1 and num_layers_per_pipeline_rank) — the block method's
    first N layers of each model chunk, all of a chunk's once N reaches its size (full recompute of
    every layer, :func:`validate_strategy`), uniform groups stopping at their chunk's end
    (:func:`cost_model.transformer.layer_cost.uniform_recompute_groups`)."""
    return depth <= -(-num_layers // pp)


@dataclass(frozen=True)
class Strategy:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    micro_batch_size: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"
    zero_stage: int = 0
    layers_per_stage: tuple[int, ...] | None = None
    #: With ``recompute: full``: recompute only the first N decoder layers of every model chunk
    #: (Megatron-Core ``--recompute-method block --recompute-num-layers N``); the other layers
    #: keep their activations.  0: every layer (``--recompute-method uniform``).
    recompute_num_layers: int = 0
    #: ZeRO / FSDP sharding over only ``dp_shard`` of the dp data-parallel ranks (with the cp
    #: ranks), the state replicated over the dp/dp_shard such groups and their gradients
    #: all-reduced across them: HSDP (FSDP HYBRID_SHARD, torchtitan
    #: ``data_parallel_shard_degree``), Megatron-Core's partial distributed optimizer, Paddle's
    #: ``sharding_degree`` beside ``dp_degree``.  0: all dp ranks (full sharding).
    #: The shard group is the innermost dp_shard·cp ranks of the data-parallel group.
    dp_shard: int = 0
    #: Nesting order of the parallel dimensions over the GPUs, inner to outer (tp first);
    #: None: Megatron-LM's (tp, cp, dp, pp).  ``cost_model.topology``.
    nesting: tuple[str, ...] | None = None
    #: Megatron-Core ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-
    #: pipeline-split``: the embedding (the output layer and loss) counts as one layer of the
    #: pipeline split, so the first (last) model chunk holds one decoder layer fewer
    #: (:func:`pipeline_split`).
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    #: The experts' tensor-parallel size, Megatron-Core's ``--expert-tensor-parallel-size``
    #: (MoE parallel folding: the experts run ETP-way tensor parallel over EP ranks carved out
    #: of tp·cp·dp, ETP·EP·EDP = TP·CP·DP).  0: Megatron-Core's default — TP, or under folding
    #: the largest that fits (:func:`cost_model.transformer.moe.expert_tensor_parallel`).
    etp: int = 0
    #: With ``recompute: selective`` under Megatron-Core: the submodules recomputed, its
    #: ``--recompute-modules`` (:data:`cost_model.frameworks.RECOMPUTE_MODULES`, in that order);
    #: empty: its default, the attention core alone.
    recompute_modules: tuple[str, ...] = ()
    #: With ``recompute: full``: ``uniform`` — Megatron-Core's ``--recompute-method uniform
    #: --recompute-num-layers N`` with N = ``recompute_num_layers`` ≥ 2: one checkpoint per group
    #: of N consecutive layers, the group recomputed whole in its backward; empty: block when
    #: ``recompute_num_layers`` is set (:func:`normalize_recompute_method`), else every layer.
    recompute_method: str = ""

    @property
    def num_devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def num_microbatches(self, training: Training) -> int:
        return training.global_batch_size // (self.dp * self.micro_batch_size)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["layers_per_stage"] = list(self.layers_per_stage) if self.layers_per_stage else None
        if self.nesting is None:
            del out["nesting"]
        else:
            out["nesting"] = list(self.nesting)
        for flag in (*SPLIT_FLAGS, "recompute_num_layers", "dp_shard", "etp", "recompute_modules", "recompute_method"):  # written only when set: requests and plans without them unchanged
            if not out[flag]:
                del out[flag]
        if "recompute_modules" in out:
            out["recompute_modules"] = list(out["recompute_modules"])
        return out

    def stage_layer_ranges(self) -> list[list[tuple[int, int]]]:
        """Per pipeline stage, the [first, last] decoder-layer ranges of its model chunks.
        ``layers_per_stage`` lists pp entries, or pp·vpp chunks in model order when
        interleaved (chunk k runs on stage k mod pp)."""
        lps = self.layers_per_stage
        if lps is None:
            raise ValueError("validate the strategy first")
        out: list[list[tuple[int, int]]] = [[] for _ in range(self.pp)]
        start = 0
        for k, n in enumerate(lps):
            if n > 0:  # a chunk of only the embedding or only the head holds no decoder layer
                out[k % self.pp].append((start, start + n - 1))
            start += n
        return out

    def key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


def strategy_from_dict(data: Mapping[str, Any], field_path: str = "strategy") -> Strategy:
    """Parse types only; :func:`validate_strategy` checks the rules against model and cluster."""
    if not isinstance(data, Mapping):
        raise InvalidStrategy("must be an object", field=field_path)
    known = {f.name for f in fields(Strategy)}
    unknown = set(data) - known
    if unknown:
        raise InvalidStrategy(f"unknown strategy fields: {', '.join(sorted(unknown))}", field=f"{field_path}.{sorted(unknown)[0]}")
    out: dict[str, Any] = {}
    for key in INT_FIELDS:
        if key in data and data[key] is not None:
            val = data[key]
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise InvalidStrategy(f"must be a positive integer, got {val!r}", field=f"{field_path}.{key}")
            if val > 1_000_000:
                raise InvalidStrategy(f"must be at most 1000000, got {val}", field=f"{field_path}.{key}")
            out[key] = val
    if "sequence_parallel" in data and data["sequence_parallel"] is not None:
        if not isinstance(data["sequence_parallel"], bool):
            raise InvalidStrategy("must be true or false", field=f"{field_path}.sequence_parallel")
        out["sequence_parallel"] = data["sequence_parallel"]
    if "recompute" in data and data["recompute"] is not None:
        if data["recompute"] not in RECOMPUTE:
            raise InvalidStrategy(f"must be one of {', '.join(RECOMPUTE)}, got {data['recompute']!r}", field=f"{field_path}.recompute")
        out["recompute"] = data["recompute"]
    rnl = data.get("recompute_num_layers")
    if rnl is not None:
        if isinstance(rnl, bool) or not isinstance(rnl, int) or not 0 <= rnl <= 1_000_000:
            raise InvalidStrategy(f"must be a non-negative integer (0: every layer), got {rnl!r}", field=f"{field_path}.recompute_num_layers")
        out["recompute_num_layers"] = rnl
    method = data.get("recompute_method")
    if method is not None:
        if method not in RECOMPUTE_METHODS:
            raise InvalidStrategy(f"must be one of {', '.join(RECOMPUTE_METHODS)}, got {method!r}", field=f"{field_path}.recompute_method")
        out["recompute_method"], out["recompute_num_layers"] = normalize_recompute_method(method, out.get("recompute_num_layers", 0), field_path)
    modules = data.get("recompute_modules")
    if modules is not None:
        if not isinstance(modules, (list, tuple)) or not modules or not all(isinstance(m, str) for m in modules) or len(set(modules)) != len(modules):
            raise InvalidStrategy(f"must be a non-empty list of distinct module names, got {modules!r}", field=f"{field_path}.recompute_modules")
        strange = [m for m in modules if m not in ALL_RECOMPUTE_MODULES]
        if strange:
            raise InvalidStrategy(f"{strange[0]!r} is not a recompute module: Megatron-Core's are {', '.join(RECOMPUTE_MODULES)}; "
                                  f"PaddleNLP's recompute_granularity {', '.join(PADDLE_RECOMPUTE_MODULES)}",
                                  field=f"{field_path}.recompute_modules")
        out["recompute_modules"] = tuple(modules)
    shard = data.get("dp_shard")
    if shard is not None:
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard <= 1_000_000:
            raise InvalidStrategy(f"must be a non-negative integer (0: all dp ranks), got {shard!r}", field=f"{field_path}.dp_shard")
        out["dp_shard"] = shard
    etp = data.get("etp")
    if etp is not None:
        if isinstance(etp, bool) or not isinstance(etp, int) or not 0 <= etp <= 1_000_000:
            raise InvalidStrategy(f"must be a non-negative integer (0: the framework's default), got {etp!r}", field=f"{field_path}.etp")
        out["etp"] = etp
    if "zero_stage" in data and data["zero_stage"] is not None:
        z = data["zero_stage"]
        if isinstance(z, bool) or z not in (0, 1, 2, 3):
            raise InvalidStrategy(f"must be 0, 1, 2 or 3, got {z!r}", field=f"{field_path}.zero_stage")
        out["zero_stage"] = z
    for flag in SPLIT_FLAGS:
        if data.get(flag) is not None:
            if not isinstance(data[flag], bool):
                raise InvalidStrategy("must be true or false", field=f"{field_path}.{flag}")
            out[flag] = data[flag]
    lps = data.get("layers_per_stage")
    if lps is not None:
        # 0 is allowed only for a chunk that holds the embedding or the head alone (checked
        # against the split flags in validate_strategy)
        if not isinstance(lps, list) or not lps or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in lps):
            raise InvalidStrategy("must be a non-empty list of positive integers", field=f"{field_path}.layers_per_stage")
        out["layers_per_stage"] = tuple(lps)
    nesting = data.get("nesting")
    if nesting is not None:
        from cost_model.topology import MEGATRON_NESTING, nesting_code

        if not isinstance(nesting, (list, tuple)) or not all(isinstance(x, str) for x in nesting):
            raise InvalidStrategy("must be a list of tp, cp, dp, pp (inner to outer)", field=f"{field_path}.nesting")
        nesting_code(nesting, f"{field_path}.nesting")
        out["nesting"] = None if tuple(nesting) == MEGATRON_NESTING else tuple(nesting)
    return Strategy(**out)


def normalize_recompute_method(method: str, num_layers: int, field_path: str = "strategy") -> tuple[str, int]:
    """One spelling of a full recompute's method (``Strategy.recompute_method``,
    ``recompute_num_layers``): ``block`` is what ``recompute_num_layers`` alone means (it needs
    N ≥ 1); ``uniform`` over groups of one layer (N 0 or 1) is the plain full recompute of every
    layer; ``uniform`` with N ≥ 2 stays."""
    if method == "block":
        if num_layers < 1:
            raise InvalidStrategy("recompute_method block recomputes the first recompute_num_layers layers of each model chunk: "
                                  "give recompute_num_layers (1 or more)", field=f"{field_path}.recompute_num_layers")
        return "", num_layers
    if method == "uniform" and num_layers <= 1:
        return "", 0
    return method, num_layers


def expert_sharding_violation(model: TransformerSpec, s: Strategy) -> str | None:
    """Reason when an MoE model's expert weights cannot follow a partial sharding
    (:func:`cost_model.transformer.moe.experts_split_into_replicas`); else None."""
    if not s.dp_shard or not model.is_moe:
        return None
    from cost_model.transformer.moe import expert_data_parallel, experts_split_into_replicas

    if bool(experts_split_into_replicas(s.tp, s.cp, s.dp, s.ep, s.dp_shard, s.etp)):
        return None
    edp = round(float(expert_data_parallel(s.tp, s.cp, s.dp, s.ep, s.etp)))
    return (f"dp_shard={s.dp_shard}: the experts' {edp} data-parallel replicas (tp·cp·dp/(ep·etp)) cannot split into "
            f"dp/dp_shard = {s.dp // s.dp_shard} replica groups")


def expert_tensor_parallel_violation(model: TransformerSpec, framework: str, etp: int, layout: Strategy | None = None) -> str | None:
    """Why a pinned ``etp`` cannot run, else None: only Megatron-Core sets the experts' tensor
    parallelism apart from TP (``--expert-tensor-parallel-size``, its MoE parallel folding); the
    experts must exist and ETP must divide each expert's FFN width (its matrices split
    column-/row-wise as a dense FFN's under TP); with a ``layout``, its EP × ETP blocks must tile
    the tp·cp·dp ranks of a stage (ETP·EP·EDP = TP·CP·DP)."""
    if not model.is_moe:
        return f"etp={etp} needs a mixture-of-experts model; {model.name} is dense"
    r = rules_for(framework)
    if not r.ep_folding:
        return f"{framework}: the experts' tensor parallelism follows tp (etp is Megatron-Core's --expert-tensor-parallel-size)"
    if r.unsplit_experts_under_ep and (etp != 1 or (layout is not None and layout.ep == 1 and layout.tp > 1)):
        return (f"{framework} runs the experts unsplit under expert parallelism (etp 1) and their tensor parallelism follows tp "
                f"without it: etp={etp}{f' at ep={layout.ep}, tp={layout.tp}' if layout is not None else ''} is Megatron-Core's "
                "--expert-tensor-parallel-size")
    if model.ffn_hidden_size % etp:
        return f"etp={etp} does not divide the experts' FFN width {model.ffn_hidden_size}"
    if layout is not None:
        ranks = layout.tp * layout.cp * layout.dp
        if not expert_blocks_tile(layout.tp, layout.cp, layout.dp, layout.ep, etp):
            return f"ep·etp = {layout.ep}·{etp} does not divide tp·cp·dp = {ranks} (the expert blocks must tile a stage's ranks)"
    return None


def validate_strategy(model: TransformerSpec, training: Training, strategy: Strategy, num_devices: int | None = None, field_path: str = "strategy") -> Strategy:
    """Check every divisibility and consistency rule; return the strategy with
    ``layers_per_stage`` filled (an even split when not given).  Errors name the rule and the
    numbers."""
    s = strategy
    f = field_path
    if effective_zero_stage(training.framework, s.zero_stage, s.dp_shard or s.dp) != s.zero_stage:
        s = replace(s, zero_stage=0, dp_shard=0)  # what the framework runs; the estimate says so
    if s.etp and not model.is_moe:
        s = replace(s, etp=0)  # no experts to split: Megatron takes the flag and ignores it (dense_etp_note)
    if s.tp > 1 and model.num_heads % s.tp:
        raise InvalidStrategy(f"tp={s.tp} does not divide the {model.num_heads} attention heads", field=f"{f}.tp")
    why = kv_heads_violation(training.framework, s.tp, model.num_kv_heads)
    if why is not None:
        raise InvalidStrategy(why, field=f"{f}.tp")
    why = cp_sequence_violation(training.framework, s.cp, training.sequence_length, s.tp, s.sequence_parallel)
    if why is not None:
        raise InvalidStrategy(why, field=f"{f}.cp" if s.cp > 1 else f"{f}.tp")
    why = context_parallel_violation(training.framework, cp=s.cp, tp=s.tp, pp=s.pp, exchange=training.cp_comm_type, heads=model.num_heads,
                                     a2a_size=training.cp_a2a_size)
    if why is not None:
        raise InvalidStrategy(why, field=f"{f}.cp")
    why = expert_parallel_dtype_violation(training.framework, training.dtype, s.ep)
    if why is not None:
        raise InvalidStrategy(why, field=f"{f}.ep")
    overlap_rule = moe_overlap_layout_violation(training.framework, training.moe_comm_overlap, ep=s.ep, pp=s.pp, vpp=s.vpp,
                                                recompute=s.recompute)
    if overlap_rule is not None:
        raise InvalidStrategy(overlap_rule[1], field=f"{f}.{overlap_rule[0]}")
    if s.ep > 1:
        if not model.is_moe:
            raise InvalidStrategy(f"ep={s.ep} needs a mixture-of-experts model; {model.name} is dense", field=f"{f}.ep")
        if model.num_experts % s.ep:
            raise InvalidStrategy(f"ep={s.ep} does not divide the {model.num_experts} experts", field=f"{f}.ep")
    linear_bias = model.has_out_bias and model.has_mlp_bias
    why = required_expert_tensor_parallel_violation(training.framework, model.is_moe, linear_bias, s.etp, s.ep)
    if why is not None:
        raise InvalidStrategy(why, field=f"{f}.etp")
    required = required_expert_tensor_parallel(training.framework, model.is_moe, linear_bias, s.ep)
    if required is not None and not s.etp:
        s = replace(s, etp=required)  # costed as the framework runs it; the estimate says so
    if s.etp:
        why = expert_tensor_parallel_violation(model, training.framework, s.etp, s)
        if why is not None:
            raise InvalidStrategy(why, field=f"{f}.etp")
    if s.vpp > 1 and s.pp == 1:
        raise InvalidStrategy("vpp > 1 (interleaved pipeline) needs pp > 1", field=f"{f}.vpp")
    emb, loss = s.account_for_embedding_in_pipeline_split, s.account_for_loss_in_pipeline_split
    if s.pp > model.num_layers + int(emb) + int(loss):  # the embedding / the head may be a stage of its own
        raise InvalidStrategy(f"pp={s.pp} exceeds the {model.num_layers} layers", field=f"{f}.pp")
    chunks = s.pp * s.vpp
    for flag, on in zip(SPLIT_FLAGS, (emb, loss), strict=True):
        if on and s.pp == 1:
            raise InvalidStrategy("counts the embedding or the loss as a pipeline layer: needs pp > 1", field=f"{f}.{flag}")
    if s.layers_per_stage is not None:
        lps = s.layers_per_stage
        for k, n in enumerate(lps):
            if n < 1 and not ((k == 0 and emb) or (k == len(lps) - 1 and loss)):
                raise InvalidStrategy(
                    f"entry {k} is {n}: every model chunk needs a decoder layer, except a first chunk of only the embedding "
                    "(account_for_embedding_in_pipeline_split) and a last chunk of only the head (account_for_loss_in_pipeline_split)",
                    field=f"{f}.layers_per_stage",
                )
        why = layer_split_violation(lps, model.num_layers, s.pp, s.vpp)
        if why is not None:
            raise InvalidStrategy(why, field=f"{f}.layers_per_stage")
    elif emb or loss:
        split = pipeline_split(model.num_layers, chunks, embedding=emb, loss=loss)
        if split is None:
            units = model.num_layers + int(emb) + int(loss)
            raise InvalidStrategy(
                f"{model.num_layers} layers + {int(emb) + int(loss)} (embedding/loss counted as layers) = {units} is not a multiple "
                f"of pp·vpp = {s.pp}·{s.vpp} = {chunks} (Megatron-Core splits them evenly)",
                field=f"{f}.{SPLIT_FLAGS[0] if emb else SPLIT_FLAGS[1]}",
            )
        s = replace(s, layers_per_stage=split)
    else:
        # the near-even split over the pp·vpp model chunks where they do not divide the layers, as
        # the search's rows and every framework's own splitter (Megatron-Core through
        # --pipeline-model-parallel-layout, which the launch writes); estimate warns (uneven_split_warning)
        if chunks > model.num_layers:
            raise InvalidStrategy(
                f"pp·vpp = {s.pp}·{s.vpp} = {chunks} model chunks for {model.num_layers} layers: every chunk needs a decoder "
                "layer (or count the embedding and the loss as layers: account_for_embedding_in_pipeline_split, "
                "account_for_loss_in_pipeline_split)",
                field=f"{f}.pp",
            )
        s = replace(s, layers_per_stage=even_split(model.num_layers, chunks))
    per_step = s.dp * s.micro_batch_size
    if training.global_batch_size % per_step:
        raise InvalidStrategy(
            f"global_batch_size {training.global_batch_size} is not divisible by dp·micro_batch_size = "
            f"{s.dp}·{s.micro_batch_size} = {per_step}",
            field=f"{f}.micro_batch_size",
        )
    m = training.global_batch_size // per_step
    k = training.pipeline_schedules(s.pp)
    if m % k:
        raise InvalidStrategy(f"{m} micro-batches a step do not fall into {k} pipeline schedules of equal size "
                              f"(global_batch_size / (dp·micro_batch_size) = {m})", field="training.pipeline_schedules_per_step")
    bad = (interleaved_microbatches_violation(training.framework, num_microbatches=m // k, pp=s.pp, group=training.microbatch_group_size_per_vp_stage)
           if s.vpp > 1 else None)
    if bad is not None:
        raise InvalidStrategy(bad[1], field=f"{f}.vpp" if bad[0] == "vpp" else f"training.{bad[0]}")
    if s.recompute_modules:
        why = recompute_modules_violation(training.framework, s.recompute_modules)
        if why is not None:
            raise InvalidStrategy(why, field=f"{f}.recompute_modules")
        if s.recompute != "selective":
            raise InvalidStrategy(f"recompute_modules choose what recompute: selective recomputes (got recompute {s.recompute!r})",
                                  field=f"{f}.recompute_modules")
        s = replace(s, recompute_modules=canonical_recompute_modules(s.recompute_modules))
    if s.recompute_method == "uniform":
        if s.recompute != "full":
            raise InvalidStrategy(f"recompute_method uniform groups the layers a full recompute checkpoints (got recompute {s.recompute!r})",
                                  field=f"{f}.recompute_method")
        per_rank = max(sum(last - first + 1 for first, last in chunks) for chunks in s.stage_layer_ranges())
        if s.recompute_num_layers > per_rank:
            raise InvalidStrategy(
                f"recompute_num_layers={s.recompute_num_layers}: Megatron-Core takes 1 to the {per_rank} layers of a pipeline "
                "stage (TransformerConfig: between 1 and num_layers_per_pipeline_rank); a group stops at its model chunk's end",
                field=f"{f}.recompute_num_layers")
    elif s.recompute_num_layers:
        if s.recompute != "full":
            raise InvalidStrategy(
                f"recompute_num_layers={s.recompute_num_layers} needs recompute: full (got {s.recompute!r})", field=f"{f}.recompute_num_layers")
        per_rank = max(sum(last - first + 1 for first, last in chunks) for chunks in s.stage_layer_ranges())
        if s.recompute_num_layers > per_rank:
            raise InvalidStrategy(
                f"recompute_num_layers={s.recompute_num_layers}: Megatron-Core takes 1 to the {per_rank} layers of a pipeline "
                "stage (TransformerConfig: between 1 and num_layers_per_pipeline_rank)", field=f"{f}.recompute_num_layers")
        if s.recompute_num_layers >= max(s.layers_per_stage or ()):
            # the first N layers of every model chunk are all of them: full recompute of every layer
            # (what Megatron-Core runs; estimate says so)
            s = replace(s, recompute_num_layers=0)
    # What the framework can run (cost_model.frameworks: one rule table per framework).
    rule = layout_rule_violation(training.framework, tp=s.tp, pp=s.pp, vpp=s.vpp, cp=s.cp, ep=s.ep, dp=s.dp,
                                 zero_stage=s.zero_stage, sequence_parallel=s.sequence_parallel,
                                 recompute_num_layers=s.recompute_num_layers, dp_shard=s.dp_shard, recompute_method=s.recompute_method)
    if rule is not None:
        raise InvalidStrategy(rule[1], field=f"{f}.{rule[0]}")
    rule = optimizer_in_backward_layout_violation(training.optimizer_in_backward, pp=s.pp, ep=s.ep, num_microbatches=m)
    if rule is None:
        rule = torchtitan_layout_violation(training.framework, tp=s.tp, pp=s.pp, vpp=s.vpp, ep=s.ep, cp=s.cp, zero_stage=s.zero_stage,
                                           num_microbatches=m // k, tied_embeddings=model.tie_embeddings)
    if rule is None:
        rule = deepspeed_moe_violation(training.framework, is_moe=model.is_moe, zero_stage=s.zero_stage, ep=s.ep, cp=s.cp)
    if rule is not None:
        raise InvalidStrategy(rule[1], field=f"{f}.{rule[0]}")
    why = (precision_aware_zero_violation(training.precision_aware_optimizer, s.zero_stage)
           or fp8_param_gather_zero_violation(training.fp8_param_gather, s.zero_stage))
    if why is not None:
        raise InvalidStrategy(why, field=f"{f}.zero_stage")
    rule = muon_layout_violation(training.optimizer, s.zero_stage, partial=0 < s.dp_shard < s.dp)
    if rule is not None:
        raise InvalidStrategy(rule[1], field=f"{f}.{rule[0]}")
    offload_rule = offload_layout_violation(training.framework, training.optimizer_offload_fraction, training.cpu_offload, s.zero_stage, s.pp,
                                            training.activation_offloading, s.recompute)
    if offload_rule is not None:
        raise InvalidStrategy(offload_rule[1], field=f"{f}.{offload_rule[0]}")
    why = tp_comm_overlap_layout_violation(training.tp_comm_overlap, s.tp, s.sequence_parallel)
    if why is not None:
        raise InvalidStrategy(why, field=f"{f}.sequence_parallel")
    if s.dp_shard == s.dp:  # the whole group: full sharding, one spelling
        s = replace(s, dp_shard=0)
    why = expert_sharding_violation(model, s)
    if why is not None:
        raise InvalidStrategy(why, field=f"{f}.dp_shard")
    if num_devices is not None and s.num_devices != num_devices:
        raise InvalidStrategy(
            f"dp·tp·pp·cp = {s.dp}·{s.tp}·{s.pp}·{s.cp} = {s.num_devices} but the cluster has {num_devices} devices",
            field=f"{f}.dp",
        )
    return s
