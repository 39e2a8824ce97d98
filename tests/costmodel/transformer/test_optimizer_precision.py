"""Megatron-Core's optimizer precision (``training.precision_aware_optimizer``,
``main_grads_dtype``, ``main_params_dtype``, ``exp_avg_dtype``, ``exp_avg_sq_dtype``): the bytes
each setting keeps and moves (layer_cost.megatron_optimizer_state_bytes, gradient_reduce_bytes,
optimizer_bytes_per_param), Megatron-Core's own checks, the distributed-optimizer rule in the
estimate, the pins and the search, the Megatron launch, and the field through HTTP and the CLI."""

import json

import pytest
from typer.testing import CliRunner

from cost_model import Strategy, estimate, simple_cluster
from cost_model.errors import InvalidStrategy, InvalidTraining
from cost_model.training import training_from_dict
from cost_model.transformer.layer_cost import (
    gradient_reduce_bytes,
    megatron_optimizer_state_bytes,
    model_state_bytes_per_param,
    optimizer_bytes_per_param,
)
from cost_model.transformer.spec import get_preset
from helpers.megatron_args import megatron_words, parse_as_megatron
from helpers.plans import homogeneous_plan
from planner_service.exporters import LaunchParams, render
from planner_service.planner import SolverSettings, plan
from planner_service.planner.request import parse_plan_request

LOWERED = {"precision_aware_optimizer": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16", "main_grads_dtype": "bf16"}
CLUSTER = {"name": "c", "node_groups": [{"name": "g", "count": 2, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]}


def _tr(**kw):
    return training_from_dict({"global_batch_size": 64, "sequence_length": 4096, **kw})


@pytest.mark.parametrize(("settings", "grads", "state", "step_bytes", "reduce_bytes"), [
    ({}, 4, 12, 34, 4),  # fp32 gradient buffer, fp32 master + two fp32 moments
    ({"precision_aware_optimizer": True}, 4, 10, 32, 4),  # TE keeps the master as 16 low bits beside the bf16 weight
    ({"precision_aware_optimizer": True, "main_params_dtype": "fp16"}, 4, 10, 30, 4),  # an fp16 master
    ({"precision_aware_optimizer": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, 4, 6, 24, 4),
    ({"precision_aware_optimizer": True, "exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "fp8"}, 4, 4, 20, 4),
    (LOWERED, 2, 6, 20, 2),
    ({"main_grads_dtype": "bf16"}, 2, 12, 30, 2),  # --grad-reduce-in-bf16: the buffer and its reduction in bf16
    ({"dtype": "fp16", "precision_aware_optimizer": True}, 4, 12, 34, 2),  # fp16 weights hold no master bits
])
def test_each_setting_keeps_and_moves_its_own_bytes(settings, grads, state, step_bytes, reduce_bytes):
    tr = _tr(**settings)
    assert megatron_optimizer_state_bytes(tr) == (grads, state)
    assert optimizer_bytes_per_param(tr) == step_bytes
    assert gradient_reduce_bytes(tr) == reduce_bytes
    w, g, o = model_state_bytes_per_param(tr, 1, 8.0, 1)
    assert (float(w), float(g), float(o)) == (2.0, grads, state / 8)  # the distributed optimizer shards the state over dp


def test_the_estimate_frees_what_the_bytes_say_and_the_step_moves_less():
    """Llama 3 8B, tp 2, dp 8, distributed optimizer: bf16 moments and gradients free
    (4 − 2) B of gradient and (12 − 6)/8 B of state per parameter on each GPU — exactly; the
    gradient reduction and the optimizer step move fewer bytes, so the step is no slower."""
    model, cluster = get_preset("llama3-8b"), simple_cluster("H100-SXM5-80GB", 2)
    s = Strategy(dp=8, tp=2, zero_stage=1, sequence_parallel=True)
    base = estimate(model, _tr(), cluster, s, spread_single_source=False)
    low = estimate(model, _tr(**LOWERED), cluster, s, spread_single_source=False)
    params = base.stages[0].memory_GB["weights"] / 2  # GB of parameters on the GPU (2 B each)
    assert base.stages[0].memory_GB["gradients"] - low.stages[0].memory_GB["gradients"] == pytest.approx(2 * params)
    assert base.stages[0].memory_GB["optimizer_state"] - low.stages[0].memory_GB["optimizer_state"] == pytest.approx(6 / 8 * params)
    assert low.breakdown_s["optimizer"] < base.breakdown_s["optimizer"]
    assert low.step_time_s <= base.step_time_s


@pytest.mark.parametrize(("body", "field", "says"), [
    ({"framework": "fsdp", "precision_aware_optimizer": True}, "precision_aware_optimizer", "Megatron-Core's --use-precision-aware-optimizer"),
    ({"framework": "paddle", "exp_avg_dtype": "bf16"}, "exp_avg_dtype", "no exp_avg_dtype setting"),
    ({"exp_avg_dtype": "bf16"}, "exp_avg_dtype", "needs precision_aware_optimizer"),
    ({"main_params_dtype": "fp16"}, "main_params_dtype", "needs precision_aware_optimizer"),
    ({"optimizer": "sgd", "precision_aware_optimizer": True}, "precision_aware_optimizer", "Adam only"),
    ({"dtype": "fp16", "main_grads_dtype": "bf16"}, "main_grads_dtype", "with fp16 training leave it out"),
    ({"dtype": "bf16", "main_grads_dtype": "fp16"}, "main_grads_dtype", "give bf16 or leave it out"),
    ({"dtype": "fp32", "main_grads_dtype": "bf16"}, "main_grads_dtype", "with fp32 training leave it out"),
    ({"framework": "paddle", "dtype": "fp16", "main_grads_dtype": "bf16"}, "main_grads_dtype", "holds in fp16: give fp16"),
    ({"exp_avg_dtype": "int4", "precision_aware_optimizer": True}, "exp_avg_dtype", "must be one of fp32, fp16, bf16, fp8"),
    ({"precision_aware_optimizer": "yes"}, "precision_aware_optimizer", "true or false"),
])
def test_megatron_cores_own_checks_name_the_field(body, field, says):
    with pytest.raises(InvalidTraining) as exc:
        _tr(**body)
    assert exc.value.field == f"training.{field}" and says in str(exc.value)


def test_paddle_has_the_gradients_dtype_alone_and_its_launch_runs_what_was_priced(tmp_path, monkeypatch):
    """Paddle's AMP O2 keeps 16-bit gradients unless ``paddle.amp.decorate(master_grad=True)``:
    its plans are priced with fp32 gradients by default and its launch asks for them
    (fleet_strategy.json ``master_grad``, passed to decorate by fleet_init.wrap);
    ``main_grads_dtype: bf16`` prices and launches 16-bit ones; its optimizer state has no
    precision setting."""
    assert model_state_bytes_per_param(_tr(framework="paddle"), 1, 8.0, 1)[1] == 4.0
    assert model_state_bytes_per_param(_tr(framework="paddle", main_grads_dtype="bf16"), 1, 8.0, 1)[1] == 2.0
    # fp16 training without master_grad keeps fp16 gradients (PaddleNLP's O2 default, amp_master_grad false)
    assert model_state_bytes_per_param(_tr(framework="paddle", dtype="fp16", main_grads_dtype="fp16"), 1, 8.0, 1)[1] == 2.0
    # FP8 training's 16-bit gradients are bf16 (Megatron-Bridge's grad_reduce_in_fp32 false)
    assert model_state_bytes_per_param(_tr(dtype="fp8", main_grads_dtype="bf16"), 1, 8.0, 1)[1] == 2.0
    with pytest.raises(InvalidTraining) as exc:
        _tr(framework="fsdp", main_grads_dtype="bf16")
    assert exc.value.field == "training.main_grads_dtype" and "master_grad" in str(exc.value)
    paddle = pytest.importorskip("paddle", reason="paddlepaddle is not installed (pip install paddlepaddle)")
    import importlib.util
    import inspect

    from paddle.distributed import fleet

    assert "master_grad" in inspect.signature(paddle.amp.decorate).parameters  # the real decorate takes what wrap passes
    seen = {}

    def decorate(**kw):
        seen.update(kw)
        return kw["models"], kw["optimizers"]

    monkeypatch.setattr(paddle.amp, "decorate", decorate)
    monkeypatch.setattr(fleet, "distributed_model", lambda m: m)
    monkeypatch.setattr(fleet, "distributed_optimizer", lambda o: o)
    for grads, master in (("fp32", True), ("bf16", False)):
        plan_dict = homogeneous_plan()
        plan_dict["training"].update(framework="paddle", main_grads_dtype=grads)
        art = render(plan_dict, "paddle-fleet", LaunchParams(image="img", command="train.py", smoke_test=False))
        (tmp_path / "fleet_init.py").write_text(art.files["fleet_init.py"])
        spec = importlib.util.spec_from_file_location("fleet_init", tmp_path / "fleet_init.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        cfg = json.loads(art.files["fleet_strategy.json"])
        assert cfg["master_grad"] is master
        mod.wrap(cfg, "model", "optimizer")
        assert seen["master_grad"] is master and seen["level"] == "O2" and seen["dtype"] == "bfloat16"


def test_the_precision_aware_optimizer_runs_under_the_distributed_optimizer_only():
    """Estimated at another stage: refused on strategy.zero_stage; pinned: on
    constraints.zero_stage; searched: every plan at zero_stage 1 (a bf16 gradient buffer alone
    runs at any stage)."""
    model, cluster = get_preset("llama3-8b"), simple_cluster("H100-SXM5-80GB", 2)
    for z in (0, 2, 3):
        with pytest.raises(InvalidStrategy) as exc:
            estimate(model, _tr(precision_aware_optimizer=True), cluster, Strategy(dp=16, zero_stage=z))
        assert exc.value.field == "strategy.zero_stage" and "distributed optimizer" in str(exc.value)
    assert estimate(model, _tr(main_grads_dtype="bf16"), cluster, Strategy(dp=16, zero_stage=3)).step_time_s > 0
    body = {"model": {"preset": "llama3-8b"}, "training": {"global_batch_size": 64, "sequence_length": 4096, **LOWERED},
            "cluster": CLUSTER, "top_k": 5}
    with pytest.raises(InvalidStrategy) as exc:
        plan(parse_plan_request({**body, "constraints": {"zero_stage": 3}}), SolverSettings())
    assert exc.value.field == "constraints.zero_stage"
    res = plan(parse_plan_request(body), SolverSettings())
    assert {e.strategy.zero_stage for e in (res.best, *res.alternatives)} == {1}


def test_the_megatron_launch_writes_megatron_cores_flags():
    plan_dict = homogeneous_plan()
    plan_dict["best"]["strategy"]["zero_stage"] = 1
    plan_dict["training"].update(LOWERED)
    args = parse_as_megatron(megatron_words(plan_dict))
    assert args.use_precision_aware_optimizer and args.use_distributed_optimizer
    assert (args.exp_avg_dtype, args.exp_avg_sq_dtype, args.main_grads_dtype) == ("bf16", "bf16", "bf16")
    assert not hasattr(args, "main_params_dtype")  # the default is not written
    plain = homogeneous_plan()
    plain["training"]["main_grads_dtype"] = "bf16"  # without the precision-aware optimizer Megatron refuses --main-grads-dtype
    args = parse_as_megatron(megatron_words(plain))
    assert args.grad_reduce_in_bf16 and not hasattr(args, "main_grads_dtype") and not hasattr(args, "use_precision_aware_optimizer")
    assert "--use-precision-aware-optimizer" not in megatron_words(homogeneous_plan())


def test_through_http_and_the_cli(client, cli, tmp_path):
    """The fields through POST /v1/estimate (the memory falls), a stored plan that keeps them,
    another framework's request refused naming the field, and `planner estimate`."""
    body = {"model": {"preset": "llama3-8b"}, "training": {"global_batch_size": 64, "sequence_length": 4096},
            "cluster": CLUSTER, "strategy": {"dp": 8, "tp": 2, "zero_stage": 1, "sequence_parallel": True}}
    base = client.post("/v1/estimate", json=body)
    low = client.post("/v1/estimate", json={**body, "training": {**body["training"], **LOWERED}})
    assert base.status_code == low.status_code == 200, low.text
    assert low.json()["peak_memory_GB"][0] < base.json()["peak_memory_GB"][0] - 10
    stored = client.post("/v1/plans", json={k: v for k, v in {**body, "training": {**body["training"], **LOWERED}}.items() if k != "strategy"})
    assert stored.status_code == 201, stored.text
    assert {k: stored.json()["training"][k] for k in LOWERED} == LOWERED
    assert stored.json()["best"]["strategy"]["zero_stage"] == 1
    bad = client.post("/v1/estimate", json={**body, "training": {**body["training"], "framework": "fsdp", "exp_avg_dtype": "bf16"}})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "training.exp_avg_dtype"
    (tmp_path / "est.json").write_text(json.dumps({**body, "training": {**body["training"], **LOWERED}}))
    res = CliRunner().invoke(cli, ["estimate", str(tmp_path / "est.json"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["peak_memory_GB"] == low.json()["peak_memory_GB"]
    (tmp_path / "bad.json").write_text(json.dumps({**body, "training": {**body["training"], "precision_aware_optimizer": True},
                                                   "strategy": {**body["strategy"], "zero_stage": 3}}))
    res = CliRunner().invoke(cli, ["estimate", str(tmp_path / "bad.json")])
    assert res.exit_code == 2 and "strategy.zero_stage" in res.output


def test_operator_graphs_keep_the_distributed_optimizer_too():
    """An operator graph under the precision-aware optimizer: a pinned or estimated ZeRO 0 is
    refused as for transformer layers, and the plan runs the distributed optimizer even where
    one rank would shard nothing (its state bytes are the precision-aware ones)."""
    from cost_model.graph.evaluate import estimate_graph
    from cost_model.graph.parse import graph_from_dict
    from helpers.graphs import gpt_graph
    from planner_service.planner.graph.search import plan_graph

    g = graph_from_dict(gpt_graph(layers=2, hidden=256, heads=4, vocab=1024, positions=256))
    tr = training_from_dict({"global_batch_size": 8, "sequence_length": 256, **LOWERED})
    one_gpu = simple_cluster("A100-SXM4-80GB", 1, gpus_per_node=1)
    with pytest.raises(InvalidStrategy) as exc:
        plan_graph(g, tr, one_gpu, {"zero_stage": 0}, top_k=0, time_limit_s=3)
    assert exc.value.field == "constraints.zero_stage"
    with pytest.raises(InvalidStrategy) as exc:
        estimate_graph(g, tr, one_gpu, Strategy(zero_stage=0))
    assert exc.value.field == "strategy.zero_stage"
    out = plan_graph(g, tr, one_gpu, None, top_k=0, time_limit_s=3).to_dict()
    assert out["best"]["strategy"]["zero_stage"] == 1


def test_adamw_is_priced_as_adam_and_launched_as_megatrons_adam():
    """AdamW keeps Adam's state and moves its bytes (decoupled weight decay changes the update,
    not the state): the same estimate; Megatron's --optimizer adam is AdamW by default; the
    precision-aware optimizer takes it."""
    model, cluster = get_preset("llama3-8b"), simple_cluster("H100-SXM5-80GB", 2)
    s = Strategy(dp=8, tp=2, zero_stage=1, sequence_parallel=True)
    adam, adamw = (estimate(model, _tr(optimizer=o), cluster, s, spread_single_source=False) for o in ("adam", "adamw"))
    assert adamw.step_time_s == adam.step_time_s and adamw.peak_memory_GB == adam.peak_memory_GB
    assert _tr(optimizer="adamw", precision_aware_optimizer=True).precision_aware_optimizer
    plan_dict = homogeneous_plan()
    plan_dict["training"]["optimizer"] = "adamw"
    assert parse_as_megatron(megatron_words(plan_dict)).optimizer == "adam"
