"""Muon (``training.optimizer`` ``muon``, Megatron-Core's TensorParallelMuon): the decoder's weight
matrices keep one fp32 momentum (8 bytes a parameter with the master copy, where Adam keeps 12)
and are orthogonalised every step by five Newton-Schulz iterations, each rank on its own
tensor-parallel shard; the embedding and head are Adam's.  Without the distributed optimizer
(zero_stage 0) every data-parallel rank orthogonalises every matrix; with the layer-wise one
(zero_stage 1, ``--optimizer dist_muon``) each rank its 1/dp, the gradients all-reduced and the
weights all-gathered.  Elsewhere it is a 422 naming the field."""

from __future__ import annotations

import pytest

from cost_model.cluster import simple_cluster
from cost_model.compute import gemm_time_s
from cost_model.devices import get_device
from cost_model.errors import InvalidStrategy, InvalidTraining
from cost_model.estimate import estimate
from cost_model.strategy import Strategy
from cost_model.training import training_from_dict
from cost_model.transformer.layer_cost import StrategyArrays, step_sync_ring_passes
from cost_model.transformer.muon import MUON_NS_STEPS, layer_matrices, newton_schulz_s
from cost_model.transformer.spec import get_preset
from helpers.cli_estimate import cli_estimates_then_refuses
from helpers.megatron_args import megatron_words, parse_as_megatron

H100 = "H100-SXM5-80GB"
BASE = {"global_batch_size": 64, "sequence_length": 4096}


def _tr(**kw):
    return training_from_dict({**BASE, **kw})


def _arrays(**kw) -> StrategyArrays:
    return StrategyArrays.from_strategies([Strategy(**kw)])


def test_newton_schulz_is_three_gemms_an_iteration_on_the_short_side():
    dev = get_device(H100)
    # a 28672 x 4096 matrix is orthogonalised as 4096 x 28672: X·Xᵀ, A·A and B·X
    t = float(newton_schulz_s(28672.0, 4096.0, dev)[()])
    one = gemm_time_s(4096, 4096, 28672, dev, "bf16") + gemm_time_s(4096, 4096, 4096, dev, "bf16") + gemm_time_s(4096, 28672, 4096, dev, "bf16")
    assert MUON_NS_STEPS == 5 and t == pytest.approx(5 * float(one))
    assert float(newton_schulz_s(4096.0, 28672.0, dev)[()]) == pytest.approx(t)
    assert float(newton_schulz_s(4096.0, 4096.0, dev, count=3)[()]) == pytest.approx(3 * float(newton_schulz_s(4096.0, 4096.0, dev)[()]))


def test_the_layer_matrices_are_the_tensor_parallel_shards_with_q_k_v_apart():
    model = get_preset("llama3-8b")  # h 4096, 32 heads, 8 KV heads, FFN 14336 gated
    shapes = {(float(r[0]), float(c[0]), float(n[0])) for r, c, n, _ in layer_matrices(model, _arrays(dp=1, tp=4))}
    assert shapes == {(1024.0, 4096.0, 1.0), (256.0, 4096.0, 2.0), (4096.0, 1024.0, 1.0), (7168.0, 4096.0, 1.0), (4096.0, 3584.0, 1.0)}
    # the parameters they hold are the decoder layer's weights on one GPU (norms aside)
    held = sum(float(r[0] * c[0] * n[0]) for r, c, n, _ in layer_matrices(model, _arrays(dp=1, tp=4)))
    assert held == pytest.approx((model.decoder_layer_params() - 2 * model.norm_params()) / 4)
    # an MoE layer: the router, and the routed experts on this GPU (E/EP of them), marked as experts'
    moe = get_preset("mixtral-8x7b")
    mats = layer_matrices(moe, _arrays(dp=4, tp=1, ep=4))
    experts = [(float(r[0]), float(c[0]), float(n[0])) for r, c, n, e in mats if e]
    assert experts == [(28672.0, 4096.0, 2.0), (4096.0, 14336.0, 2.0)]
    assert (8.0, 4096.0, 1.0) in {(float(r[0]), float(c[0]), float(n[0])) for r, c, n, e in mats if not e}


def test_memory_keeps_one_momentum_for_the_matrices_and_adam_for_the_embedding_and_head():
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=0, micro_batch_size=1, recompute="full")
    adam, muon = (estimate(model, _tr(optimizer=o), cluster, s) for o in ("adam", "muon"))
    scalar = model.embedding_params() + model.head_params()
    matrices = model.total_params() - scalar
    assert muon.stages[0].memory_GB["optimizer_state"] == pytest.approx((matrices * 8 + scalar * 12) / 1e9, rel=1e-3)
    assert adam.stages[0].memory_GB["optimizer_state"] - muon.stages[0].memory_GB["optimizer_state"] == pytest.approx(matrices * 4 / 1e9, rel=1e-3)
    for key in ("weights", "gradients", "activations"):
        assert muon.stages[0].memory_GB[key] == pytest.approx(adam.stages[0].memory_GB[key], rel=1e-9), key
    # the layer-wise distributed optimizer shards it over dp
    sharded = estimate(model, _tr(optimizer="muon"), cluster, Strategy(dp=8, zero_stage=1, micro_batch_size=1, recompute="full"))
    assert sharded.stages[0].memory_GB["optimizer_state"] == pytest.approx(muon.stages[0].memory_GB["optimizer_state"] / 8, rel=1e-3)


def test_the_mtp_modules_matrices_keep_muons_momentum():
    """DeepSeek-V3-style multi-token prediction: the MTP module's layer and projection are
    matrices (one momentum), only the embedding and head Adam's."""
    from dataclasses import replace

    base = get_preset("llama3-8b")
    model = replace(base, mtp_layers=1)
    cluster = simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=0, micro_batch_size=1, recompute="full")
    adam, muon = (estimate(model, _tr(optimizer=o), cluster, s) for o in ("adam", "muon"))
    scalar = model.embedding_params() + model.head_params()
    saved = adam.stages[0].memory_GB["optimizer_state"] - muon.stages[0].memory_GB["optimizer_state"]
    assert saved == pytest.approx((model.total_params() + model.mtp_params() - scalar) * 4 / 1e9, rel=1e-3)


def test_the_orthogonalisation_runs_on_every_rank_unless_the_layer_wise_optimizer_shares_it():
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s0 = Strategy(dp=8, zero_stage=0, micro_batch_size=1, recompute="full")
    s1 = Strategy(dp=8, zero_stage=1, micro_batch_size=1, recompute="full")
    adam0, muon0 = (estimate(model, _tr(optimizer=o), cluster, s0) for o in ("adam", "muon"))
    adam1, muon1 = (estimate(model, _tr(optimizer=o), cluster, s1) for o in ("adam", "muon"))
    # Llama 3 8B's 32 layers: 32 · 5 · (4m²n + 2m³) over its matrices ≈ 6.4·10¹⁴ FLOPs, about a
    # second on one H100 — the cost of stepping every matrix on every rank
    ns0 = muon0.breakdown_s["optimizer"] - adam0.breakdown_s["optimizer"]
    ns1 = muon1.breakdown_s["optimizer"] - adam1.breakdown_s["optimizer"]
    assert 0.5 < ns0 < 2.0
    assert ns1 == pytest.approx(ns0 / 8, rel=0.15)
    assert muon1.step_time_s < muon0.step_time_s


def test_the_layer_wise_optimizer_all_reduces_the_gradients_then_gathers_the_weights():
    import numpy as np

    z = np.array([0, 1])
    g_adam, w_adam = step_sync_ring_passes(_tr(), z, np.ones(2))
    g_muon, w_muon = step_sync_ring_passes(_tr(optimizer="muon"), z, np.ones(2))
    assert list(g_adam) == [2.0, 1.0] and list(w_adam) == [0.0, 1.0]
    assert list(g_muon) == [2.0, 2.0] and list(w_muon) == [0.0, 1.0]


@pytest.mark.parametrize("extra, words", [
    ({"framework": "fsdp"}, "muon is priced for megatron-core"),
    ({"framework": "deepspeed"}, "muon is priced for megatron-core"),
    ({"lora_rank": 16}, "LoRA"),
    ({"dtype": "fp16"}, "muon with fp16 is not supported"),
])
def test_where_it_cannot_run_it_is_refused_by_field(extra, words):
    with pytest.raises(InvalidTraining) as err:
        _tr(optimizer="muon", **extra)
    assert err.value.field == "training.optimizer" and words in err.value.message


@pytest.mark.parametrize("zero", [2, 3])
def test_sharded_weights_are_refused_by_zero_stage(zero):
    with pytest.raises(InvalidStrategy) as err:
        estimate(get_preset("llama3-8b"), _tr(optimizer="muon"), simple_cluster(H100, 1), Strategy(dp=8, zero_stage=zero))
    assert err.value.field == "strategy.zero_stage" and "whole weight matrices" in err.value.message


def test_partial_sharding_is_refused_by_dp_shard():
    with pytest.raises(InvalidStrategy) as err:
        estimate(get_preset("llama3-8b"), _tr(optimizer="muon"), simple_cluster(H100, 2), Strategy(dp=16, zero_stage=1, dp_shard=8))
    assert err.value.field == "strategy.dp_shard" and "whole data-parallel group" in err.value.message


def test_an_operator_graph_refuses_it():
    from cost_model.graph.evaluate import refuse_graph_unpriced

    with pytest.raises(InvalidTraining) as err:
        refuse_graph_unpriced(_tr(optimizer="muon"))
    assert err.value.field == "training.optimizer"


def test_the_planner_plans_with_it_and_megatron_takes_the_launch(client):
    cluster = {"name": "c", "node_groups": [{"name": "n", "count": 2, "gpus_per_node": 8, "device": H100}]}
    req = {"model": {"preset": "llama3-8b"}, "training": {**BASE, "optimizer": "muon"}, "cluster": cluster}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    plan = r.json()
    assert plan["training"]["optimizer"] == "muon" and plan["best"]["strategy"]["zero_stage"] in (0, 1)
    assert not plan["best"]["strategy"].get("dp_shard")  # no partial sharding: the layer-wise optimizer spans the group
    for zero, name in ((0, "muon"), (1, "dist_muon")):
        pinned = client.post("/v1/plans", json={**req, "constraints": {"zero_stage": zero, "tp": 4, "pp": 1}})
        assert pinned.status_code in (200, 201), pinned.text
        words = megatron_words(pinned.json())
        args = parse_as_megatron(words)
        assert args.optimizer == name and "--use-distributed-optimizer" not in words
    refused = client.post("/v1/plans", json={**req, "constraints": {"zero_stage": 3}})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "constraints.zero_stage", refused.text
    partial = client.post("/v1/plans", json={**req, "constraints": {"dp": 16, "dp_shard": 8}})
    assert partial.status_code == 422 and partial.json()["error"]["field"] == "constraints.dp_shard", partial.text


def test_the_cli_estimates_with_it(cli, tmp_path):
    body = {"model": {"preset": "llama3-8b"}, "training": {**BASE, "optimizer": "muon"},
            "cluster": {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]},
            "strategy": {"dp": 8, "zero_stage": 1, "micro_batch_size": 1, "recompute": "full"}}
    out = cli_estimates_then_refuses(cli, tmp_path, body, {**body["training"], "framework": "fsdp"}, "training.optimizer")
    assert out["memory_breakdown_GB"][0]["optimizer_state"] < 9.0
