"""Published measured runs (``cost_model/data/published_runs.json``) as estimate requests.

Each end-to-end row becomes (model, training, cluster, candidate strategies) plus the measured
step time derived with the *source's own* FLOP convention (see ``data/SOURCES.md``):

* Narayanan et al. 2021 Table 1 reports hardware TFLOP/s with Eq. 3,
  F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) (includes the recompute forward).
* Megatron-LM's 2024 H100 table reports model TFLOP/s (MFU),
  F = 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)).
* Korthikanti et al. 2022 and the 2020 Megatron README give iteration times; the one abstract
  row gives only MFU (model FLOPs as above).

What a source leaves unstated is filled by documented rules, the same for every row:

* software stack by publication date: runs before FlashAttention (2020–2022 Megatron-LM) use
  ``attention="unfused"`` and reduce gradients after the backward pass (no overlap);
  Megatron-Core 2024 uses fused attention and, as its README states, TP and DP communication
  overlap;
* micro-batch size, interleaving depth, recompute mode, sequence parallelism and the
  distributed optimizer, when unstated, are chosen as an expert tuning the run would: the
  fastest setting that fits in memory under the cost model (the planner's pinned search);
* sequence parallelism is off for runs published before it existed (2020, 2021);
* FFN width 4·h when unstated (GPT architecture); GPT models use learned positions, biases,
  LayerNorm and tied embeddings (Megatron-LM's GPT).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

from cost_model.cluster import Cluster, cluster_from_dict
from cost_model.strategy import Strategy
from cost_model.training import Training
from cost_model.transformer.spec import TransformerSpec

UNFUSED_GROUPS = ("Narayanan2021_Table1", "Korthikanti2022_Table5", "Korthikanti2022_abstract", "MegatronLM_README_2020", "Korthikanti2022_Table4")
NO_SP_GROUPS = ("Narayanan2021_Table1", "MegatronLM_README_2020")


@dataclass(frozen=True)
class PublishedCase:
    row_id: str
    group: str
    model: TransformerSpec
    training: Training
    cluster: Cluster
    candidates: tuple[Strategy, ...]  # the published layout with unknown knobs enumerated
    measured_step_s: float
    measured_from: str
    assumptions: tuple[str, ...]


def load_rows() -> list[dict[str, Any]]:
    text = resources.files("cost_model").joinpath("data/published_runs.json").read_text()
    return json.loads(text)


def device_for(hardware: dict[str, Any]) -> tuple[str, int]:
    """Catalog device and GPUs per node for a row's hardware description."""
    gpu = hardware.get("gpu") or ""
    if "A100-SXM4-80GB" in gpu:
        return "A100-SXM4-80GB", hardware.get("gpus_per_node") or 8
    if gpu.startswith("A100"):
        return "A100-SXM4-40GB", hardware.get("gpus_per_node") or 8  # DGX A100 of 2020 shipped 40 GB
    if gpu.startswith("H100"):
        return "H100-SXM5-80GB", hardware.get("gpus_per_node") or 8
    if gpu.startswith("V100"):
        return "V100-SXM2-32GB", hardware.get("gpus_per_node") or 16  # DGX-2: 16 GPUs on NVSwitch
    raise ValueError(f"no catalog device for {gpu!r}")


def gpt_model(row_model: dict[str, Any]) -> TransformerSpec:
    h = row_model["hidden"]
    return TransformerSpec(
        name=row_model.get("name") or "gpt",
        num_layers=row_model["layers"],
        hidden_size=h,
        num_heads=row_model["heads"],
        num_kv_heads=row_model.get("kv_heads") or row_model["heads"],
        ffn_hidden_size=row_model.get("ffn_hidden") or 4 * h,
        vocab_size=row_model["vocab"],
        gated_ffn=False,
        tie_embeddings=True,
        learned_positions=row_model["seq_len"],
        bias=True,
        norm="layernorm",
        model_type="gpt",
    )


def eq3_flops(B: int, s: int, l: int, h: int, V: int, recompute: bool) -> float:
    """Narayanan et al. 2021 Eq. 3 (96·…·V/16lh with recompute; 72·…·V/12lh without)."""
    if recompute:
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def _recompute(value: str | None) -> str | None:
    if value is None:
        return None
    v = value.lower()
    if v.startswith("full"):
        return "full"
    if v.startswith("selective"):
        return "selective"
    if v.startswith("none"):
        return "none"
    return None


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def cases(kind: str = "end_to_end_iteration") -> Iterator[PublishedCase]:
    """Every usable row of ``kind`` as a :class:`PublishedCase`."""
    for row in load_rows():
        if row["kind"] != kind or row["measured"].get("status") != "ok":
            continue
        case = _case(row)
        if case is not None:
            yield case


def _case(row: dict[str, Any]) -> PublishedCase | None:
    m = row["model"]
    p = row["parallel"]
    hw = row["hardware"]
    meas = row["measured"]
    group = row["group"]
    assumptions: list[str] = []
    model = gpt_model(m)
    if not m.get("ffn_hidden"):
        assumptions.append("ffn=4h")
    device, gpn = device_for(hw)
    n_gpus = hw["num_gpus"]
    B = p.get("global_batch_size")
    if B is None:
        if row["id"] == "korthikanti22-530B-dp8-fullrecompute":
            B = 2240  # the source's companion selective-recompute run (same 2240 GPUs)
            assumptions.append("B=2240 as the selective run")
        else:
            return None
    s = m["seq_len"]
    unfused = group in UNFUSED_GROUPS
    training = Training(
        global_batch_size=B,
        sequence_length=s,
        dtype="fp16" if device.startswith("V100") or unfused else "bf16",
        attention="unfused" if unfused else "flash",
        tp_comm_overlap=group.startswith("MegatronLM_README_H100"),
        # Megatron-LM before Megatron-Core's DDP (2023) reduced gradients after the backward pass.
        grad_reduce_overlap=group.startswith("MegatronLM_README_H100"),
    )
    nodes = max(1, math.ceil(n_gpus / gpn))
    per_node = min(gpn, n_gpus)
    cluster = cluster_from_dict(
        {"name": row["id"], "node_groups": [{"name": "g", "count": nodes, "gpus_per_node": per_node, "device": device}]}
    )
    tp = p.get("tp") or 1
    pp = p.get("pp") or 1
    cp = p.get("cp") or 1
    dp = p.get("dp") or n_gpus // (tp * pp * cp)
    rc = _recompute(p.get("activation_recompute"))
    l, h, V = m["layers"], m["hidden"], m["vocab"]
    if rc is None and meas.get("iteration_time_s") and meas.get("tflops_per_gpu"):
        # Both a time and a FLOP rate: the FLOP formula that reconciles them tells whether the
        # forward was recomputed (Eq. 3's 96-form counts it, the 72-form does not).
        rate_full = eq3_flops(B or 0, s, l, h, V, True) / (meas["iteration_time_s"] * n_gpus) / 1e12
        if abs(rate_full / meas["tflops_per_gpu"] - 1) < 0.03:
            rc = "full"
            assumptions.append("recompute=full (reported TFLOP/s = Eq. 3 with recompute / iteration time)")
    rcs = [rc] if rc else ["none", "selective", "full"]
    if rc is None:
        assumptions.append("recompute: best that fits")
    sp = p.get("sequence_parallel")
    if sp is None:
        sps = [False] if (group in NO_SP_GROUPS or tp == 1) else [False, True]
        if len(sps) > 1:
            assumptions.append("sequence parallel: best")
    else:
        sps = [bool(sp) and tp > 1]
    mbs = p.get("micro_batch_size")
    per_dp = B // dp
    mbss = [mbs] if mbs else _divisors(per_dp, 16)
    if not mbs:
        assumptions.append("micro-batch: best that fits")
    v = p.get("virtual_pipeline_stages")
    if v:
        vpps = [v]
    elif pp > 1 and group == "Narayanan2021_Table1" or (pp > 1 and group.startswith("MegatronLM_README_H100")):
        vpps = [x for x in (1, 2, 3, 4, 6, 8) if model.num_layers % (pp * x) == 0]
        assumptions.append("interleaving: best")
    else:
        vpps = [1]
    opt = (p.get("optimizer_sharding") or "").lower()
    zeros = [0] if (opt.startswith("none") or group in NO_SP_GROUPS or group.startswith("Korthikanti")) else [0, 1]
    candidates = []
    for r, spv, b, vv, z in itertools.product(rcs, sps, mbss, vpps, zeros):
        if vv > 1 and (B // (dp * b)) % pp:
            continue
        candidates.append(Strategy(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vv, micro_batch_size=b, sequence_parallel=spv, recompute=r, zero_stage=z))
    if not candidates:
        return None
    if meas.get("iteration_time_s"):
        step = float(meas["iteration_time_s"])
        src = "iteration_time_s"
    elif meas.get("tflops_per_gpu") and group == "Narayanan2021_Table1":
        step = eq3_flops(B, s, l, h, V, recompute=True) / (meas["tflops_per_gpu"] * 1e12 * n_gpus)
        src = "tflops_per_gpu (Eq. 3, with recompute)"
    elif meas.get("tflops_per_gpu"):
        step = eq3_flops(B, s, l, h, V, recompute=False) / (meas["tflops_per_gpu"] * 1e12 * n_gpus)
        src = "tflops_per_gpu (model FLOPs)"
    elif meas.get("mfu"):
        peak = 312e12 if device.startswith("A100") else 989.4e12
        step = eq3_flops(B, s, l, h, V, recompute=False) / (meas["mfu"] * peak * n_gpus)
        src = "mfu (model FLOPs)"
    else:
        return None
    return PublishedCase(row["id"], group, model, training, cluster, tuple(candidates), step, src, tuple(assumptions))
