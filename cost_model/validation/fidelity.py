"""Predictions for published runs (shared by ``bench/fidelity.py`` and the tests)."""

from __future__ import annotations

from cost_model.errors import PlannerError
from cost_model.estimate import estimate
from cost_model.result import Estimate
from cost_model.strategy import Strategy
from cost_model.training import Training
from cost_model.validation.published import PublishedCase, gpt_model


def predict_case(case: PublishedCase) -> tuple[Estimate | None, Strategy | None]:
    """The fastest fitting candidate of the published layout (unknown knobs enumerated)."""
    best: Estimate | None = None
    best_s: Strategy | None = None
    for strategy in case.candidates:
        try:
            est = estimate(case.model, case.training, case.cluster, strategy)
        except PlannerError:
            continue
        if not est.fits:
            continue
        if best is None or est.step_time_s < best.step_time_s:
            best, best_s = est, strategy
    return best, best_s


def layer_table4() -> list[dict]:
    """Korthikanti et al. 2022 Table 4: one 22B layer (tp 8, mbs 4) forward/backward times."""
    from cost_model.cluster import cluster_from_dict
    from cost_model.comm import Links
    from cost_model.transformer.layer_cost import StrategyArrays, layer_costs

    out = []
    from cost_model.validation.published import load_rows

    for row in load_rows():
        if row["kind"] != "single_layer_fwd_bwd_time":
            continue
        p = row["parallel"]
        model = gpt_model(row["model"])
        training = Training(global_batch_size=p["micro_batch_size"], sequence_length=row["model"]["seq_len"], dtype="fp16", attention="unfused")
        cluster = cluster_from_dict({"name": "dgx", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]})
        g = cluster.node_groups[0]
        rc = p["activation_recompute"]
        strategy = Strategy(tp=p["tp"], micro_batch_size=p["micro_batch_size"], sequence_parallel=bool(p["sequence_parallel"]), recompute=rc)
        S = StrategyArrays.from_strategies([strategy])
        lc = layer_costs(model, training, g.device, Links.for_group(g), S)
        n_coll = 4 + (2 if rc == "full" else 0)
        fwd = float(lc.forward_compute_s[0] + 2 * lc.tp_comm_s[0] / n_coll)
        bwd = float(lc.total_s[0]) - fwd
        other = row["measured"]["other"]
        out.append(
            {
                "config": row["id"].split("layer-")[-1],
                "forward_ms": round(fwd * 1e3, 3),
                "backward_ms": round(bwd * 1e3, 3),
                "measured_forward_ms": other["forward_ms"],
                "measured_backward_ms": other["backward_ms"],
                "forward_error": round(fwd * 1e3 / other["forward_ms"] - 1, 4),
                "backward_error": round(bwd * 1e3 / other["backward_ms"] - 1, 4),
            }
        )
    return out
