"""The discrete search space: every combination of parallel knobs, as a struct of arrays.

Knobs: tp, cp, ep, pp, dp, vpp, micro_batch_size, recompute, zero_stage, sequence_parallel.
Rules applied while enumerating (cheap, exact): tp divides the GPUs of a node and the
attention heads (KV heads split or replicated evenly) — TP groups stay inside one NVLink
domain; cp divides the sequence (and leaves ≥ 1024 tokens per rank); ep divides the experts and
dp·cp; pp ≤ layers; pp·vpp divides the layers when vpp > 1 and the micro-batch count is a
multiple of pp; dp·micro_batch divides the global batch; dp·tp·cp·pp ≤ the GPUs available;
ZeRO 2/3 only without pipelining; sequence parallelism only with tp > 1; selective recompute
only where it differs from none (unfused attention).  Pinned fields in the request's
constraints replace the knob's range by the single pinned value.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cost_model.strategy import Strategy
from cost_model.training import Training
from cost_model.transformer.layer_cost import RECOMPUTE_CODE, StrategyArrays
from cost_model.transformer.spec import TransformerSpec

MBS_CHOICES = (1, 2, 4, 8)
VPP_CHOICES = (1, 2, 3, 4, 6, 8)
CP_CHOICES = (1, 2, 4, 8, 16, 32)
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODE.items()}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pin(pins: Mapping[str, Any], key: str, values: Sequence[Any]) -> list[Any]:
    if key in pins:
        v = pins[key]
        return [v] if v in values or key in ("dp", "pp", "micro_batch_size", "vpp") else []
    return list(values)


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
    work), ZeRO 0 (stage 1 moves the same bytes with less memory and a shorter optimizer step),
    ZeRO 1 without pipelining (stage 2 also shards gradients at no extra traffic).
    """
    L = model.num_layers
    B = training.global_batch_size
    s = training.sequence_length
    unfused = training.attention == "unfused"

    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if gpus_per_node % t == 0 and model.num_heads % t == 0 and (model.num_kv_heads % t == 0 or t % model.num_kv_heads == 0)]
    if max_tp:
        tps = [t for t in tps if t <= max_tp]
    if "tp" in pins:
        tps = [pins["tp"]]
    cps = _pin(pins, "cp", [c for c in CP_CHOICES if s % c == 0 and (c == 1 or s // c >= 1024)])
    pps = pp_choices(L)
    if max_pp:
        pps = [p for p in pps if p <= max_pp]
    if "pp" in pins:
        pps = [pins["pp"]]
    dps = _pin(pins, "dp", _divisors(B))
    mbss = _pin(pins, "micro_batch_size", MBS_CHOICES)
    vpps = _pin(pins, "vpp", VPP_CHOICES)
    rcs = _pin(pins, "recompute", ["none", "full"] + (["selective"] if unfused else []))
    eps = _pin(pins, "ep", _divisors(model.num_experts) if model.is_moe else [1])

    outer: list[tuple[int, int, int, int, int]] = []
    for tp, cp, pp in itertools.product(tps, cps, pps):
        base = tp * cp * pp
        if base > max_gpus or pp > L:
            continue
        for dp in dps:
            if base * dp > max_gpus:
                continue
            for ep in eps:
                if (dp * cp) % ep == 0:
                    outer.append((dp, tp, pp, cp, ep))
    if not outer:
        return _empty()
    # Inner knobs, vectorised: each step repeats every row once per value of the next knob
    # (rows stay in nested-loop order: outer knobs first, then mbs, vpp, recompute, zero).
    o = np.array(outer, dtype=np.int64)
    cols: dict[str, np.ndarray] = {"dp": o[:, 0], "tp": o[:, 1], "pp": o[:, 2], "cp": o[:, 3], "ep": o[:, 4]}
    cols = _cross(cols, "mbs", mbss)
    cols = _keep(cols, (B // cols["dp"]) % cols["mbs"] == 0)
    cols = _cross(cols, "vpp", vpps)
    pp_col, vpp_col = cols["pp"], cols["vpp"]
    m = B // cols["dp"] // cols["mbs"]
    cols = _keep(cols, (vpp_col == 1) | ((pp_col > 1) & (L % (pp_col * vpp_col) == 0) & (m % pp_col == 0)))
    cols = _cross(cols, "recompute", [RECOMPUTE_CODE[rc] for rc in rcs])
    if "zero_stage" in pins:
        cols = _cross(cols, "zero", [pins["zero_stage"]])
        cols = _keep(cols, ~((cols["zero"] >= 2) & (cols["pp"] > 1)))
    else:
        cols = _cross(cols, "zero", [1, 2, 3])
        cols = _keep(cols, (cols["pp"] > 1) == (cols["zero"] == 1))
    if "sequence_parallel" in pins:
        sp = np.full(len(cols["dp"]), bool(pins["sequence_parallel"]))
        cols = _keep({**cols, "sp": sp}, (cols["tp"] > 1) | ~sp)
    else:
        cols["sp"] = cols["tp"] > 1
    if len(cols["dp"]) == 0:
        return _empty()
    f = {k: v.astype(float) for k, v in cols.items() if k != "sp"}
    return StrategyArrays(
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
    )


def _cross(cols: dict[str, np.ndarray], name: str, values: Sequence[Any]) -> dict[str, np.ndarray]:
    """Every row once per value of a new knob ``name`` (the new knob varies fastest)."""
    k = len(values)
    out = {key: np.repeat(v, k) for key, v in cols.items()}
    n = len(next(iter(cols.values())))
    out[name] = np.tile(np.asarray(values, dtype=np.int64), n)
    return out


def _keep(cols: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {key: v[mask] for key, v in cols.items()}


def _empty() -> StrategyArrays:
    z = np.zeros(0)
    return StrategyArrays(z, z, z, z, z, z, z, z.astype(bool), z, z)


def strategy_at(S: StrategyArrays, i: int, layers_per_stage: tuple[int, ...] | None = None) -> Strategy:
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
    )

