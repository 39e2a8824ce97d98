"""Published measured runs (``cost_model/data/published_runs.json``) as estimate requests.

Every end-to-end row (``measured.status`` ``ok`` or ``OOM``) becomes either a
:class:`PublishedCase` — (model, training, cluster, candidate strategies) plus the measured step
time derived with the *source's own* FLOP convention (``data/SOURCES.md``) — or an
:class:`Unplannable` naming why the cost model cannot express it (a device or number format
the catalog lacks).  FLOP conventions by source:

* Eq. 3 of Narayanan et al. 2021, F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) (counts the
  recompute forward): Narayanan 2021 Tables 1 and 2, BLOOM's logged TFLOPs.
* Model FLOPs (no recompute; :func:`cost_model.transformer.stage_cost.model_flops_per_step`,
  72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) for GPT shapes): Megatron-LM's H100 MFU, Llama 3
  Table 4, the NeMo / Megatron-Bridge "Model TFLOP/sec/GPU" (FP8 rows too).
* Iteration times where the source gives them (Korthikanti 2022, Megatron-LM 2020, BLOOM,
  MT-NLG) — used in preference to any FLOP rate.
* Unstated conventions (OPT-175B, GPT-NeoX-20B): Megatron-LM's logging formula, Eq. 3 with
  recompute (both codebases derive from Megatron-LM and trained with activation checkpointing).

What a source leaves unstated is filled by documented rules, the same for every row:

* framework by source: Megatron-LM rows ``megatron-core`` (with the era's kernels: runs before
  FlashAttention — 2020–2022 — use ``attention="unfused"`` and reduce gradients after the
  backward pass); Narayanan Table 2's ZeRO-3 rows ``deepspeed`` (ZeRO-3, no model parallelism);
  BLOOM, MT-NLG and GPT-NeoX ``megatron-deepspeed``; OPT ``fsdp`` (metaseq FSDP + TP);
  Llama 3 ``fsdp`` (Meta's in-house 4D parallelism: FSDP with TP, CP and an interleaved
  pipeline; its "ZeRO-2-like" sharding is zero_stage 2); NeMo ``megatron-core``;
* micro-batch size, interleaving depth, recompute mode, sequence parallelism and the
  distributed optimizer, when unstated, are chosen as an expert tuning the run would: the
  fastest setting that fits in memory under the cost model (the planner's pinned search); a
  source that says it used the interleaved schedule (Narayanan 2021 Table 1, Llama 3) without
  its depth gets only interleaved depths (v ≥ 2);
  a TP/PP split that is not stated (Narayanan Table 2 PTD-P: only tp·pp) likewise;
* a recompute mode stated for one sequence length holds for rows of that length only (Llama 3:
  "none at 8K sequence", not stated for 128K);
* sequence parallelism and selective recompute are off for runs published before they existed
  (Korthikanti et al. 2022; Megatron-DeepSpeed forks of 2021–22);
* FFN width 4·h when unstated (GPT); heads = h/128 when unstated (BLOOM sweep); vocabulary
  50,257 (GPT-2 BPE) when unstated (OPT); GPT models use learned positions, biases, LayerNorm and
  tied embeddings; BLOOM ALiBi (no position table) with tied embeddings; NeoX rotary, untied;
  Llama SwiGLU, RMSNorm, RoPE, GQA, no biases, untied;
* global batch from ``tokens_per_batch`` when only that is given: the multiple of dp nearest
  tokens/sequence length (OPT: 2M tokens on dp 124 → 992 sequences);
* the NICs per node from the row's hardware text where it states them (Jean Zay: 4 × 100 Gb/s
  Omni-Path; NeoX: 4 ConnectX-6 HCAs at HDR 200 Gb/s) and the fabric (InfiniBand, RoCE,
  Omni-Path); else the device's typical node (DGX);
* DeepSpeed's ``type:transformer|embedding`` pipeline partition (BLOOM): the embedding counts
  as a layer on the first and last stage, layers+2 split evenly;
* the embedding and the loss counted as one pipeline layer each (Megatron-Core's
  ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``: one
  layer fewer on the first and the last model chunk) where the decoder layers do not split
  evenly over the pp·vpp chunks but layers + 2 do: Llama 3 with pp=16 and 126 layers (the paper,
  §3.3.2: the first chunk holds only the embedding, the last only the output projection and
  loss, 128 = 16 × 8 chunks) and Megatron-Bridge's Llama 3.1 405B recipes.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

from cost_model.cluster import Cluster, cluster_from_dict
from cost_model.devices import DTYPES
from cost_model.frameworks import rules_for, runs_deepspeed_engine
from cost_model.strategy import SPLIT_FLAGS, Strategy, block_recompute_depths
from cost_model.training import Training
from cost_model.transformer.spec import TransformerSpec
from cost_model.units import BITS_PER_BYTE, FLOPS_PER_TFLOPS, tflops_to_flops

UNFUSED_GROUPS = ("Narayanan2021_Table1", "Narayanan2021_Table2", "Korthikanti2022_Table5", "Korthikanti2022_Sec6.3", "Korthikanti2022_abstract", "MegatronLM_README_2020", "Korthikanti2022_Table4", "BLOOM176B_production", "BLOOM176B_topology_sweep", "MT-NLG530B", "OPT175B", "GPT-NeoX-20B")
NO_SP_GROUPS = ("Narayanan2021_Table1", "Narayanan2021_Table2", "MegatronLM_README_2020", "BLOOM176B_production", "BLOOM176B_topology_sweep", "MT-NLG530B", "OPT175B", "GPT-NeoX-20B")
#: Source (for leave-one-source-out validation) of each group: one paper or table family.
SOURCE_OF_GROUP = {
    "Korthikanti2022_Table5": "Korthikanti2022",
    "Korthikanti2022_Sec6.3": "Korthikanti2022",
    "Korthikanti2022_abstract": "Korthikanti2022",
    "MegatronLM_README_H100_weak_scaling": "MegatronLM_README_H100",
    "MegatronLM_README_H100_strong_scaling": "MegatronLM_README_H100",
    "BLOOM176B_production": "BLOOM176B",
    "BLOOM176B_topology_sweep": "BLOOM176B",
}
GBps_PER_Gbps = 1.0 / BITS_PER_BYTE


@dataclass(frozen=True)
class PublishedCase:
    row_id: str
    group: str
    source: str
    model: TransformerSpec
    training: Training
    cluster: Cluster
    candidates: tuple[Strategy, ...]  # the published layout with unknown knobs enumerated
    measured_step_s: float | None  # None for a measured OOM
    measured_status: str  # "ok" or "OOM"
    measured_from: str
    assumptions: tuple[str, ...]
    measured_tflops: float | None = None  # the source's own TFLOP/s figure, when given
    measured_memory_GB: float | None = None  # BLOOM sweep: max memory of the first/last stage GPUs
    section: str | None = None  # BLOOM sweep: the chronicle's section (one software state and date)

    def stated_pins(self) -> dict[str, Any]:
        """Every knob of :data:`PIN_FIELDS` with one value over the row's candidate layouts: what
        the source (or its documented convention) fixes — the constraints a platform engineer
        reproducing the run would pin, the planner filling in the rest.  A split flag that is
        off is not a pin."""
        pins: dict[str, Any] = {}
        for name in PIN_FIELDS:
            values = {getattr(s, name) for s in self.candidates}
            if len(values) == 1:
                v = values.pop()
                if v is not None and not (name in SPLIT_FLAGS and v is False):
                    pins[name] = v
        return pins


#: The strategy fields a published row can state (:meth:`PublishedCase.stated_pins`).
PIN_FIELDS = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "sequence_parallel", "recompute", "zero_stage", "dp_shard",
              "layers_per_stage") + SPLIT_FLAGS


@dataclass(frozen=True)
class Unplannable:
    row_id: str
    group: str
    source: str
    reason: str


def load_rows() -> list[dict[str, Any]]:
    text = resources.files("cost_model").joinpath("data/published_runs.json").read_text()
    rows: list[dict[str, Any]] = json.loads(text)
    return rows


def device_for(hardware: dict[str, Any]) -> tuple[str, int] | None:
    """Catalog device and GPUs per node for a row's hardware description (None: not in the
    catalog)."""
    gpu = hardware.get("gpu") or ""
    gpn = hardware.get("gpus_per_node")
    if gpu.startswith("GB200"):
        return "GB200-NVL72-186GB", gpn or 72  # NVL72: the rack is one NVLink domain
    if gpu.startswith("GB300"):
        return "GB300-NVL72-288GB", gpn or 72
    if "80GB" in gpu and gpu.startswith("A100"):
        return "A100-SXM4-80GB", gpn or 8
    if gpu.startswith("A100"):
        return "A100-SXM4-40GB", gpn or 8  # DGX A100 of 2020 shipped 40 GB
    if gpu.startswith("H100"):
        return "H100-SXM5-80GB", gpn or 8
    if gpu.startswith("B200"):
        return "B200-SXM-192GB", gpn or 8
    if gpu.startswith("V100"):
        return "V100-SXM2-32GB", gpn or 16  # DGX-2: 16 GPUs on NVSwitch
    return None


def fabric_for(hardware: dict[str, Any]) -> tuple[str, float | None]:
    """(fabric, NIC bandwidth per node in GB/s or None for the device's typical node) from the
    row's ``inter_node`` text."""
    text = (hardware.get("inter_node") or "").lower()
    gpn = hardware.get("gpus_per_node") or 8
    if "omni-path" in text or "opa" in text:
        # Jean Zay (data/SOURCES.md): 4 Omni-Path links of 100 Gb/s per node.
        return "omnipath", 4 * 100 * GBps_PER_Gbps
    if "roce" in text:
        m = re.search(r"(\d+)\s*gbps per gpu", text)
        return "roce", (float(m.group(1)) * GBps_PER_Gbps * gpn) if m else None
    m = re.search(r"each gpu reaches the fabric through one of (\d+) connectx-6", text)
    if m:
        return "infiniband", int(m.group(1)) * 200 * GBps_PER_Gbps  # ConnectX-6: HDR 200 Gb/s
    return "infiniband", None


def gpt_model(row_model: dict[str, Any]) -> TransformerSpec:
    h = row_model["hidden"]
    return TransformerSpec(
        name=row_model.get("name") or "gpt",
        num_layers=row_model["layers"],
        hidden_size=h,
        num_heads=row_model.get("heads") or h // 128,
        num_kv_heads=row_model.get("kv_heads") or row_model.get("heads") or h // 128,
        ffn_hidden_size=row_model.get("ffn_hidden") or 4 * h,
        vocab_size=row_model.get("vocab") or 50257,
        gated_ffn=False,
        tie_embeddings=True,
        learned_positions=row_model["seq_len"],
        bias=True,
        norm="layernorm",
        model_type="gpt",
    )


def model_for(group: str, row_model: dict[str, Any]) -> TransformerSpec:
    """The architecture family of a source's models (module docstring)."""
    base = gpt_model(row_model)
    from dataclasses import replace

    # (the position scheme is set with the table removed: the GPT base resolved it to "learned")
    if group.startswith("BLOOM"):
        return replace(base, learned_positions=0, position_embedding="alibi", model_type="bloom")
    if group == "GPT-NeoX-20B":
        return replace(base, learned_positions=0, position_embedding="rope", tie_embeddings=False, model_type="gpt-neox")
    if group.startswith(("Llama3", "MegatronBridge")):
        return replace(base, learned_positions=0, position_embedding="rope", tie_embeddings=False, gated_ffn=True, bias=False,
                       norm="rmsnorm", model_type="llama")
    return base


def eq3_flops(B: int, s: int, layers: int, h: int, V: int, recompute: bool) -> float:
    """Narayanan et al. 2021 Eq. 3 (96·…·V/16lh with recompute; 72·…·V/12lh without)."""
    if recompute:
        return 96.0 * B * s * layers * h * h * (1 + s / (6 * h) + V / (16 * layers * h))
    return 72.0 * B * s * layers * h * h * (1 + s / (6 * h) + V / (12 * layers * h))


def _recompute(value: str | None, seq_len: int | None = None) -> str | None:
    """The recompute mode a row's text states; None when unstated — also when the text states
    it for another sequence length only ("none at 8K sequence ...; not stated for 128K": a
    128K row's mode is unknown)."""
    if value is None:
        return None
    v = value.lower()
    at = re.match(r"\w+ at (\d+)k sequence", v)
    if at and seq_len is not None and int(at.group(1)) * 1024 != seq_len:
        return None
    for mode in ("full", "selective", "none"):
        if v.startswith(mode):
            return mode
    return None


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def framework_for(group: str, parallel: dict[str, Any]) -> str:
    opt = (parallel.get("optimizer_sharding") or "").lower()
    if group == "Narayanan2021_Table2" and "zero-3" in opt:
        return "deepspeed"
    if group.startswith("BLOOM") or group in ("MT-NLG530B", "GPT-NeoX-20B"):
        return "megatron-deepspeed"
    if group in ("OPT175B", "Llama3_Table4"):
        return "fsdp"
    return "megatron-core"


def dtype_for(group: str, parallel: dict[str, Any], device: str) -> str | None:
    """Training dtype; None when the row's number format is not one the catalog has.  NVFP4 is
    ``fp4`` (Transformer Engine's NVFP4BlockScaling through Megatron-Bridge's
    ``bf16_with_nvfp4_mixed``); MXFP8 and FP8 current/delayed scaling are ``fp8``."""
    prec = (parallel.get("precision") or "").upper()
    if "NVFP4" in prec:
        return "fp4"
    if "FP4" in prec:
        return None  # MXFP4: no training recipe in Transformer Engine / Megatron-Core
    if "FP8" in prec:
        return "fp8"
    if device.startswith("V100") or group in ("MegatronLM_README_2020", "Narayanan2021_Table1", "Narayanan2021_Table2") or group.startswith("Korthikanti") or "FP16" in prec:
        return "fp16"
    return "bf16"


def all_rows(kind: str = "end_to_end_iteration") -> Iterator[PublishedCase | Unplannable]:
    """Every row of ``kind`` whose run was measured (``ok``) or measured to run out of memory
    (``OOM``), as a case or as an :class:`Unplannable` with the reason."""
    for row in load_rows():
        if row["kind"] != kind or row["measured"].get("status") not in ("ok", "OOM"):
            continue
        yield _case(row)


def measured(rows: Iterable[PublishedCase | Unplannable]) -> list[PublishedCase]:
    """The plannable ones of ``rows`` with a measured step time (status ``ok``): the rows the
    calibration fits and cross-validates."""
    return [c for c in rows if isinstance(c, PublishedCase) and c.measured_status == "ok"]


def cases(kind: str = "end_to_end_iteration") -> Iterator[PublishedCase]:
    """Every plannable row with a measured step time (status ``ok``)."""
    yield from measured(all_rows(kind))


def _global_batch(row: dict[str, Any], dp: int) -> tuple[int | None, str | None]:
    p = row["parallel"]
    if p.get("global_batch_size"):
        return int(p["global_batch_size"]), None
    if row["id"] == "korthikanti22-530B-dp8-fullrecompute":
        return 2240, "B=2240 as the selective run"  # the source's companion run (same 2240 GPUs)
    tokens = p.get("tokens_per_batch")
    if tokens:
        k = max(1, round(tokens / row["model"]["seq_len"] / dp))
        return k * dp, f"B = {k * dp} (tokens per batch / sequence, nearest multiple of dp)"
    return None, None


def _stage_split(group: str, layers: int, pp: int, vpp: int) -> tuple[int, ...] | None:
    """Uneven layer splits the sources state (module docstring); None: an even split or the
    embedding/loss split of :func:`_embedding_loss_split`."""
    if pp == 1:
        return None
    if group.startswith("BLOOM"):
        # DeepSpeed type:transformer|embedding: layers+2 units over pp stages, the embedding unit
        # on the first and the last stage.
        units = layers + 2
        base, extra = divmod(units, pp)
        parts = [base + (1 if i < extra else 0) for i in range(pp)]
        parts[0] -= 1
        parts[-1] -= 1
        return tuple(parts) if min(parts) >= 1 else None
    return None


def _embedding_loss_split(group: str, layers: int, pp: int, vpp: int) -> bool:
    """Whether the run counts the embedding and the loss as one pipeline layer each
    (Megatron-Core's ``account_for_embedding_in_pipeline_split`` and
    ``account_for_loss_in_pipeline_split``, :func:`cost_model.strategy.pipeline_split`): the
    layers do not split evenly over the pp·vpp model chunks but layers + 2 do — Megatron-Bridge's
    Llama 3.1 405B recipes (126 + 2 = 128 over 16·8 or 8·4·... chunks) and Llama 3's own pipeline
    (§3.3.2: the first chunk the embedding alone, the last the output projection and loss)."""
    if pp == 1 or group.startswith("BLOOM"):
        return False
    chunks = pp * vpp
    return layers % chunks != 0 and (layers + 2) % chunks == 0


def _candidates(row: dict[str, Any], model: TransformerSpec, training: Training, assumptions: list[str]) -> list[Strategy]:
    p, group, m = row["parallel"], row["group"], row["model"]
    n_gpus = row["hardware"]["num_gpus"]
    B = training.global_batch_size
    framework = training.framework
    cp = p.get("cp") or 1
    if p.get("tp") is None and p.get("model_parallel_size"):
        # Only tp·pp given: the split its authors prescribe and their stated layouts follow —
        # tensor parallelism over a node's GPUs, the pipeline across nodes (Narayanan et al.
        # 2021 §3.3, Takeaway #1) — where it divides; else the fastest split that fits.
        mp = p["model_parallel_size"]
        found = device_for(row["hardware"])
        gpn = found[1] if found else 8
        if mp % gpn == 0 and model.num_heads % gpn == 0:
            tpp = [(gpn, mp // gpn)]
            assumptions.append("tp/pp split of tp·pp: tp = GPUs per node, pipeline across nodes (Narayanan 2021 Takeaway #1)")
        else:
            tpp = [(t, mp // t) for t in (8, 4, 2, 1) if mp % t == 0 and model.num_heads % t == 0]
            assumptions.append("tp/pp split of tp·pp: best that fits")
    elif p.get("tp") is None and p.get("pp") is None and p.get("dp") is None:
        tpp = [(t, q) for t in (4, 8) for q in (1, 2, 4, 6, 8, 12, 16) if n_gpus % (t * q * cp) == 0 and B % (n_gpus // (t * q * cp)) == 0]
        assumptions.append("tp, pp: best that fits")
    else:
        tpp = [(p.get("tp") or 1, p.get("pp") or 1)]
    rc = _recompute(p.get("activation_recompute"), m["seq_len"])
    if rc is None and row["measured"].get("iteration_time_s") and row["measured"].get("tflops_per_gpu"):
        # Both a time and a FLOP rate: the FLOP formula that reconciles them tells whether the
        # forward was recomputed (Eq. 3's 96-form counts it, the 72-form does not).
        rate = eq3_flops(B, m["seq_len"], m["layers"], m["hidden"], model.vocab_size, True) / (row["measured"]["iteration_time_s"] * n_gpus * FLOPS_PER_TFLOPS)
        if abs(rate / row["measured"]["tflops_per_gpu"] - 1) < 0.03:
            rc = "full"
            assumptions.append("recompute=full (reported TFLOP/s = Eq. 3 with recompute / iteration time)")
    if rc is None:
        assumptions.append("recompute: best that fits")
    # Selective recompute and sequence parallelism arrived together (Korthikanti et al. 2022).
    rcs = [rc] if rc else (["none", "full"] if group in NO_SP_GROUPS else ["none", "selective", "full"])
    sp = p.get("sequence_parallel")
    mbs = p.get("micro_batch_size")
    if not mbs:
        assumptions.append("micro-batch: best that fits")
    opt = (p.get("optimizer_sharding") or "").lower()
    if "zero-3" in opt or (framework == "fsdp" and "zero-2-like" not in opt) or ("fsdp (sharding" in opt):
        zeros = [3]
    elif "zero-2-like" in opt:
        zeros = [2]  # Llama 3: optimizer state and gradients sharded, weights kept after forward
    elif "zero-1" in opt or "zero stage 1" in opt or "zero_stage=0 flag" in opt:
        zeros = [1]
    elif opt.startswith("ddp"):
        zeros = [0, 1]  # NeMo's "DDP (FSDP=0)": Megatron DDP, with or without the distributed optimizer
    elif opt.startswith("none") or group in NO_SP_GROUPS or group.startswith("Korthikanti"):
        zeros = [0]
    else:
        zeros = [0, 1]
    # Megatron-LM's block recompute (--recompute-method) came with selective recompute and
    # sequence parallelism (Korthikanti et al. 2022); the 2020–2021 code recomputed every layer.
    block = rules_for(framework).block_recompute and group not in NO_SP_GROUPS
    fw_text = (p.get("framework") or "").lower()
    stated_interleaving = "interleaved" in fw_text and "non-interleaved" not in fw_text
    out: list[Strategy] = []
    for tp, pp in tpp:
        dp = p.get("dp") or n_gpus // (tp * pp * cp)
        sps = ([False] if (group in NO_SP_GROUPS or tp == 1) else [False, True]) if sp is None else [bool(sp) and tp > 1]
        v = p.get("virtual_pipeline_stages")
        if runs_deepspeed_engine(framework) or pp == 1:
            vpps = [1]
        elif v:
            vpps = [v]
        elif group.startswith(("Narayanan2021", "MegatronLM_README_H100", "Llama3")):
            vpps = [x for x in (1, 2, 3, 4, 6, 8) if model.num_layers % (pp * x) == 0 or _stage_split(group, model.num_layers, pp, x)
                    or _embedding_loss_split(group, model.num_layers, pp, x)]
            if stated_interleaving and len(vpps) > 1:
                vpps = [x for x in vpps if x > 1]  # the source says it interleaved: depth unknown, not whether
        else:
            vpps = [1]
        per_dp = B // dp
        mbss = [mbs] if mbs else _divisors(per_dp, 16)
        for r, spv, b, vv, z in itertools.product(rcs, sps, mbss, vpps, zeros):
            # the sources' interleaved schedules (Megatron-LM 2021's, before Megatron-Core's micro-batch
            # groups; Llama 3's) took whole groups of pp micro-batches
            if vv > 1 and (B // (dp * b)) % pp:
                continue
            if z >= 2 and pp > 1 and framework != "fsdp":
                continue
            lps = _stage_split(group, model.num_layers, pp, vv)
            el = _embedding_loss_split(group, model.num_layers, pp, vv)
            # Recompute unknown: Megatron-Core's block recompute of the first N layers of each
            # chunk competes with full recompute of every layer (as in the planner's search).
            depths = [0] + (block_recompute_depths(model.num_layers, pp * vv) if r == "full" and rc is None and block else [])
            for d in depths:
                out.append(Strategy(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vv, micro_batch_size=b, sequence_parallel=spv, recompute=r, zero_stage=z,
                                    layers_per_stage=lps, account_for_embedding_in_pipeline_split=el, account_for_loss_in_pipeline_split=el,
                                    recompute_num_layers=d))
    if len(tpp) == 1 and len({s.vpp for s in out}) > 1:
        assumptions.append("interleaving: best")
    if len({s.zero_stage for s in out}) > 1:
        assumptions.append("distributed optimizer: best")
    return out


def _measured_step(row: dict[str, Any], model: TransformerSpec, training: Training, device: str) -> tuple[float | None, str]:
    from cost_model.transformer.stage_cost import model_flops_per_step

    meas, group = row["measured"], row["group"]
    m = row["model"]
    n_gpus = row["hardware"]["num_gpus"]
    B, s = training.global_batch_size, m["seq_len"]
    nl, h, V = m["layers"], m["hidden"], model.vocab_size
    if meas.get("iteration_time_s"):
        return float(meas["iteration_time_s"]), "iteration_time_s"
    tf = meas.get("tflops_per_gpu")
    if tf and group.startswith(("Narayanan2021", "BLOOM")) or tf and group in ("OPT175B", "GPT-NeoX-20B"):
        return eq3_flops(B, s, nl, h, V, recompute=True) / (tflops_to_flops(tf) * n_gpus), "tflops_per_gpu (Eq. 3, with recompute)"
    if tf and group.startswith(("Llama3", "MegatronBridge")):
        return model_flops_per_step(model, training) / (tflops_to_flops(tf) * n_gpus), "tflops_per_gpu (model FLOPs)"
    if tf:
        return eq3_flops(B, s, nl, h, V, recompute=False) / (tflops_to_flops(tf) * n_gpus), "tflops_per_gpu (model FLOPs)"
    if meas.get("mfu"):
        peak = tflops_to_flops(312.0 if device.startswith("A100") else 989.4)  # the sources' stated peaks
        return eq3_flops(B, s, nl, h, V, recompute=False) / (meas["mfu"] * peak * n_gpus), "mfu (model FLOPs)"
    return None, "nothing measured"


def _case(row: dict[str, Any]) -> PublishedCase | Unplannable:
    m, p, hw, meas = row["model"], row["parallel"], row["hardware"], row["measured"]
    group = row["group"]
    source = SOURCE_OF_GROUP.get(group, group)
    assumptions: list[str] = []
    dev = device_for(hw)
    if dev is None:
        return Unplannable(row["id"], group, source, f"no catalog device for {hw.get('gpu')!r}")
    device, gpn = dev
    dtype = dtype_for(group, p, device)
    if dtype is None:
        return Unplannable(row["id"], group, source, f"number format {p.get('precision')!r} is not a catalog dtype ({', '.join(DTYPES)})")
    model = model_for(group, m)
    if not m.get("ffn_hidden"):
        assumptions.append("ffn=4h")
    if not m.get("vocab"):
        assumptions.append("vocab 50257 (GPT-2 BPE)")
    n_gpus = hw["num_gpus"]
    tp = p.get("tp") or 1
    mp = p.get("model_parallel_size") or tp * (p.get("pp") or 1)
    cp = p.get("cp") or 1
    dp = p.get("dp") or n_gpus // (mp * cp)
    B, note = _global_batch(row, dp)
    if B is None:
        return Unplannable(row["id"], group, source, "no global batch size or tokens per batch")
    if note:
        assumptions.append(note)
    unfused = group in UNFUSED_GROUPS
    modern = group.startswith(("MegatronLM_README_H100", "MegatronBridge", "Llama3"))
    training = Training(
        global_batch_size=B,
        sequence_length=m["seq_len"],
        dtype=dtype,
        attention="unfused" if unfused else "flash",
        tp_comm_overlap=modern,
        # Megatron-LM before Megatron-Core's DDP (2023) and DeepSpeed's BF16 optimizer reduce
        # gradients after the backward pass; FSDP and ZeRO-3 overlap by construction.
        grad_reduce_overlap=modern or framework_for(group, p) in ("fsdp", "deepspeed"),
        framework=framework_for(group, p),
        # DeepSpeed's BF16_Optimizer where the row states fp32 gradient accumulation (BLOOM's
        # "new BF16 optimizer"); otherwise DeepSpeed's default, bf16 accumulation
        grad_accum_dtype="fp32" if dtype == "bf16" and "fp32 grad accumulation" in (p.get("precision") or "") else None,
        # Megatron-Bridge's FP8 precision recipes (bf16_with_fp8_mixed, ..._current_scaling_mixed,
        # bf16_with_mxfp8_mixed: training/mixed_precision.py) all set fp8_param_gather = True
        fp8_param_gather=dtype == "fp8" and group.startswith("MegatronBridge"),
        # and its performance scripts reduce the gradients in bf16 (scripts/performance/configs/llama:
        # set_llama3_common_configs, set_llama31_common_configs — grad_reduce_in_fp32 = False)
        main_grads_dtype="bf16" if group.startswith("MegatronBridge") else Training.main_grads_dtype,
    )
    nodes = max(1, math.ceil(n_gpus / gpn))
    fabric, nic_node_GBps = fabric_for(hw)
    ng: dict[str, Any] = {"name": "g", "count": nodes, "gpus_per_node": min(gpn, n_gpus), "device": device, "fabric": fabric}
    if nic_node_GBps:
        ng["inter_node_bandwidth_GBps"] = nic_node_GBps
        assumptions.append(f"{fabric}, {nic_node_GBps:.0f} GB/s NICs per node")
    cluster = cluster_from_dict({"name": row["id"], "node_groups": [ng]})
    candidates = _candidates(row, model, training, assumptions)
    if not candidates:
        return Unplannable(row["id"], group, source, "no candidate layout is valid")
    status = meas.get("status")
    if status == "OOM":
        return PublishedCase(row["id"], group, source, model, training, cluster, tuple(candidates), None, "OOM", "measured OOM", tuple(assumptions))
    step, src = _measured_step(row, model, training, device)
    if step is None:
        return Unplannable(row["id"], group, source, "no step time, TFLOP/s or MFU measured")
    mem = re.search(r"'Mem' column='(\d+(?:\.\d+)?)GB'", row.get("notes") or "")
    section = re.search(r"section '([^']+)'", row.get("source") or "")
    date = re.search(r"date (\d\d-\d\d)", row.get("notes") or "")
    where = f"{section.group(1)} {date.group(1) if date else ''}".strip() if section else None
    return PublishedCase(row["id"], group, source, model, training, cluster, tuple(candidates), step, "ok", src, tuple(assumptions),
                         meas.get("tflops_per_gpu"), float(mem.group(1)) if mem else None, where)
