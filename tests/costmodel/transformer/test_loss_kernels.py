"""The loss kernels that never hold the whole logits (``training.loss_kernel``): torchtune's
chunked loss (``chunked``: the fp32 log-probabilities alone), Liger Kernel's fused linear
cross-entropy (``liger``) and Cut Cross-Entropy (``cce``).  The unfused loss holds
the 16-bit logits and the loss's fp32 copy for the backward (T·V·6 bytes: 6.3 GB for Llama 3's
128K vocabulary at 8,192 tokens); Liger holds the head's input gradient and one chunk, Cut
Cross-Entropy a log-sum-exp a token and computes the logits again in the backward; Transformer
Engine's parallel cross-entropy under Megatron-Core (``te``) keeps the 16-bit logits and writes
their gradient over them.  Frameworks whose trainers do not run them refuse them by name."""

from __future__ import annotations

import pytest

from cost_model.cluster import simple_cluster
from cost_model.comm import Links
from cost_model.compute import gemm_time_s
from cost_model.devices import get_device
from cost_model.errors import InvalidTraining
from cost_model.estimate import estimate
from cost_model.graph.evaluate import refuse_graph_unpriced
from cost_model.strategy import Strategy
from cost_model.training import training_from_dict
from cost_model.transformer.layer_cost import StrategyArrays, embedding_head_costs
from cost_model.transformer.spec import get_preset
from helpers.cli_estimate import cli_estimates_then_refuses

FSDP = {"global_batch_size": 64, "sequence_length": 8192, "framework": "fsdp"}
H100 = "H100-SXM5-80GB"
CLUSTER = {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]}


def _tr(**kw) -> object:
    return training_from_dict({**FSDP, **kw})


def test_the_fused_kernels_do_not_hold_the_logits():
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=3, micro_batch_size=1, recompute="full")
    acts = {k: estimate(model, _tr(loss_kernel=k), cluster, s).stages[0].memory_GB["activations"]
            for k in ("unfused", "chunked", "liger", "cce")}
    T, V, h = 8192, 128256, 4096
    assert acts["unfused"] - acts["chunked"] == pytest.approx(T * V * 2 / 1e9, rel=0.01)  # the 16-bit logits freed
    assert acts["unfused"] - acts["liger"] == pytest.approx(T * (V * 6 - h * 8) / 1e9, rel=0.01)
    assert acts["unfused"] - acts["cce"] == pytest.approx(T * (V * 6 - 4) / 1e9, rel=0.01)


def test_cut_cross_entropy_computes_the_logits_again_and_passes_nothing_through_hbm():
    model, dev = get_preset("llama3-8b"), get_device(H100)
    S = StrategyArrays.from_strategies([Strategy(dp=8, micro_batch_size=1)])
    links = Links(450.0, 50.0, 8, 5e-6)
    heads = {k: float(embedding_head_costs(model, _tr(loss_kernel=k), dev, links, S)[1][0]) for k in ("unfused", "chunked", "liger", "cce")}
    assert heads["liger"] == heads["chunked"] == heads["unfused"]  # the same GEMMs and passes, chunk by chunk
    one_gemm = float(gemm_time_s(8192, 128256, 4096, dev, "bf16", fresh_output=False))
    assert heads["cce"] == pytest.approx(4 * one_gemm)


@pytest.mark.parametrize("body, needle", [
    ({**FSDP, "framework": "megatron-core", "loss_kernel": "liger"}, "no liger loss kernel"),
    ({**FSDP, "framework": "paddle", "loss_kernel": "cce"}, "Cut Cross-Entropy"),
    ({**FSDP, "loss_kernel": "fused"}, "must be one of unfused, chunked, liger, cce, te, compiled"),
    ({**FSDP, "framework": "deepspeed", "loss_kernel": "compiled"}, "runs under fsdp (compiled: torch.compile's cross-entropy"),
    ({**FSDP, "loss_kernel": "te"}, "runs under megatron-core (te: Transformer Engine's parallel cross-entropy"),
    ({**FSDP, "framework": "megatron-deepspeed", "loss_kernel": "te"}, "megatron-deepspeed: no te loss kernel"),
    ({**FSDP, "framework": "deepspeed", "loss_kernel": "chunked"}, "runs under fsdp (chunked: torchtune's CEWithChunkedOutputLoss"),
])
def test_a_kernel_the_framework_does_not_run_is_refused(body, needle):
    with pytest.raises(InvalidTraining) as err:
        training_from_dict(body)
    assert err.value.field == "training.loss_kernel" and needle in str(err.value), str(err.value)


def test_an_operator_graph_refuses_it():
    with pytest.raises(InvalidTraining) as err:
        refuse_graph_unpriced(_tr(loss_kernel="cce"))
    assert err.value.field == "training.loss_kernel"


def test_the_planner_plans_with_it_and_the_launches_say_so(client):
    req = {"model": {"preset": "llama3-8b"}, "training": {**FSDP, "global_batch_size": 16, "loss_kernel": "liger"},
           "cluster": CLUSTER, "constraints": {"pp": 1}}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    plan = r.json()
    assert plan["training"]["loss_kernel"] == "liger"
    launch = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "torchtitan"})
    assert launch.status_code == 422 and launch.json()["error"]["field"] == "target" and "Liger" in launch.json()["error"]["message"]
    r = client.post("/v1/plans", json={**req, "training": {**req["training"], "framework": "deepspeed"}})
    assert r.status_code in (200, 201), r.text
    launch = client.get(f"/v1/plans/{r.json()['id']}/launch", params={"target": "deepspeed-config"})
    assert any("Liger Kernel's fused linear cross-entropy" in n for n in launch.json()["notes"])


def test_transformer_engines_loss_keeps_the_16_bit_logits_alone_and_passes_over_them_twice():
    """Megatron-Core's loss holds the fp32 softmax (T·V/t·4 bytes) with the 16-bit logits live
    beside it; Transformer Engine's online softmax keeps only the 16-bit logits (and three fp32
    numbers a token) and writes the gradient in place: T·V/t·4 − T·12 bytes less at the head, and
    fewer passes."""
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    mc = {**FSDP, "framework": "megatron-core", "global_batch_size": 16}
    s = Strategy(dp=4, tp=2, micro_batch_size=1, recompute="full")
    acts = {k: estimate(model, training_from_dict({**mc, "loss_kernel": k}), cluster, s).stages[0].memory_GB["activations"]
            for k in ("unfused", "te")}
    T, V, t = 8192, 128256, 2
    assert acts["unfused"] - acts["te"] == pytest.approx((T * V / t * 4 - T * 12) / 1e9, rel=0.01)
    dev, links = get_device(H100), Links(450.0, 50.0, 8, 5e-6)
    S = StrategyArrays.from_strategies([s])
    heads = {k: float(embedding_head_costs(model, training_from_dict({**mc, "loss_kernel": k}), dev, links, S)[1][0])
             for k in ("unfused", "te")}
    three_gemms = 3 * float(gemm_time_s(T, V / t, 4096, dev, "bf16", fresh_output=False))
    assert three_gemms < heads["te"] < heads["unfused"]
    # its passes: 2 B read, 2 B read and 2 B written (the gradient in place), 2 + 2 B scaling it,
    # against the unfused loss's 18 B
    assert heads["te"] - three_gemms < 0.65 * (heads["unfused"] - three_gemms)


def test_torch_compiles_loss_keeps_the_16_bit_logits_and_recomputes_the_softmax():
    """torch.compile's cross-entropy (torchtitan's compile.components with "loss"): AOTAutograd
    saves the 16-bit logits and two fp32 numbers a token, not the fp32 upcast — T·V·4 − T·8 bytes
    less than eager PyTorch's loss — and one fused pass each way (2 B forward, 4 B backward a
    logit) instead of the eager loss's 18 B."""
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=3, micro_batch_size=1, recompute="full")
    acts = {k: estimate(model, _tr(loss_kernel=k), cluster, s).stages[0].memory_GB["activations"] for k in ("unfused", "compiled")}
    T, V = 8192, 128256
    assert acts["unfused"] - acts["compiled"] == pytest.approx((T * V * 4 - T * 8) / 1e9, rel=0.01)
    dev, links = get_device(H100), Links(450.0, 50.0, 8, 5e-6)
    S = StrategyArrays.from_strategies([s])
    heads = {k: float(embedding_head_costs(model, _tr(loss_kernel=k), dev, links, S)[1][0]) for k in ("unfused", "compiled")}
    three_gemms = 3 * float(gemm_time_s(T, V, 4096, dev, "bf16", fresh_output=False))
    assert three_gemms < heads["compiled"] < heads["unfused"]
    assert heads["compiled"] - three_gemms < 0.45 * (heads["unfused"] - three_gemms)


def test_a_compiled_loss_plan_launches_torchtitan_with_the_loss_compiled(client):
    """Through the HTTP API: the plan keeps the kernel it priced, and torchtitan's launch compiles
    the loss with the model (one comma-separated word, as torchtitan's list options take) — the
    eager plan's launch compiles nothing."""
    req = {"model": {"preset": "llama3-8b"}, "training": {**FSDP, "global_batch_size": 16, "loss_kernel": "compiled"},
           "cluster": CLUSTER, "constraints": {"pp": 1}}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    assert r.json()["training"]["loss_kernel"] == "compiled"
    launch = client.get(f"/v1/plans/{r.json()['id']}/launch", params={"target": "torchtitan"})
    assert launch.status_code == 200, launch.text
    words = launch.json()["files"]["torchtitan_overrides.txt"].splitlines()[1].split()
    assert "--compile.enable" in words and words[words.index("--compile.components") + 1] == "model,loss"
    eager = client.post("/v1/plans", json={**req, "training": {**req["training"], "loss_kernel": "unfused"}})
    launch = client.get(f"/v1/plans/{eager.json()['id']}/launch", params={"target": "torchtitan"})
    assert "--compile." not in launch.json()["files"]["torchtitan_overrides.txt"]


def test_megatron_launch_turns_on_the_kernel_the_plan_priced(client):
    req = {"model": {"preset": "llama3-8b"}, "cluster": CLUSTER, "constraints": {"pp": 1, "tp": 2},
           "training": {**FSDP, "framework": "megatron-core", "global_batch_size": 16, "loss_kernel": "te"}}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    launch = client.get(f"/v1/plans/{r.json()['id']}/launch", params={"target": "megatron"})
    assert launch.status_code == 200, launch.text
    assert "--cross-entropy-loss-fusion\n  --cross-entropy-fusion-impl te\n" in launch.json()["files"]["megatron_args.sh"]
    plain = client.post("/v1/plans", json={**req, "training": {**req["training"], "loss_kernel": "unfused"}})
    launch = client.get(f"/v1/plans/{plain.json()['id']}/launch", params={"target": "megatron"})
    assert "--cross-entropy" not in launch.json()["files"]["megatron_args.sh"]


def test_the_cli_estimates_with_transformer_engines_loss(cli, tmp_path):
    body = {"model": {"preset": "llama3-8b"}, "cluster": CLUSTER,
            "training": {**FSDP, "framework": "megatron-core", "global_batch_size": 16, "loss_kernel": "te"},
            "strategy": {"dp": 4, "tp": 2, "zero_stage": 1, "micro_batch_size": 1, "recompute": "full", "sequence_parallel": True}}
    out = cli_estimates_then_refuses(cli, tmp_path, body, {**body["training"], "framework": "deepspeed"}, "training.loss_kernel")
    assert out["memory_breakdown_GB"][0]["activations"] > 0
