"""``training.tp_comm_overlap`` (and ``attention``) is priced only where the framework has the overlap and only as it
runs: Megatron-Core's ``--tp-comm-overlap`` and torchtitan's async tensor parallelism (under
torch.compile), both with sequence parallelism; the launches write what was priced (and the
data-parallel overlap flags follow ``grad_reduce_overlap``)."""

import shlex

import pytest

from cost_model import Strategy, estimate, get_preset, simple_cluster
from cost_model.errors import InvalidStrategy, InvalidTraining
from cost_model.training import training_from_dict
from helpers.megatron_args import megatron_words, parse_as_megatron
from helpers.plans import homogeneous_plan
from planner_service.exporters import LaunchParams, render
from planner_service.planner import SolverSettings, plan
from planner_service.planner.request import parse_plan_request

CLUSTER = {"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]}


def _tr(**kw):
    return training_from_dict({"global_batch_size": 64, "sequence_length": 4096, **kw})


@pytest.mark.parametrize("framework", ["megatron-deepspeed", "deepspeed", "paddle"])
def test_a_framework_without_the_overlap_refuses_it_by_name(framework):
    with pytest.raises(InvalidTraining) as exc:
        _tr(framework=framework, tp_comm_overlap=True)
    assert exc.value.field == "training.tp_comm_overlap" and "--tp-comm-overlap" in str(exc.value)


@pytest.mark.parametrize("framework", ["megatron-core", "fsdp"])
def test_the_overlap_needs_sequence_parallelism_and_hides_tp_time_with_it(framework):
    model, cluster = get_preset("llama3-8b"), simple_cluster("H100-SXM5-80GB", 1)
    s = Strategy(dp=2, tp=4, zero_stage=1 if framework == "megatron-core" else 3, sequence_parallel=True)
    on = estimate(model, _tr(framework=framework, tp_comm_overlap=True), cluster, s)
    off = estimate(model, _tr(framework=framework), cluster, s)
    assert on.breakdown_s["tp_comm"] < off.breakdown_s["tp_comm"]
    with pytest.raises(InvalidStrategy) as exc:
        estimate(model, _tr(framework=framework, tp_comm_overlap=True), cluster, Strategy(dp=2, tp=4, zero_stage=s.zero_stage))
    assert exc.value.field == "strategy.sequence_parallel" and "sequence parallelism is enabled" in str(exc.value)
    body = {"model": {"preset": "llama3-8b"}, "training": {"global_batch_size": 64, "sequence_length": 4096, "framework": framework,
                                                           "tp_comm_overlap": True}, "cluster": CLUSTER, "top_k": 5}
    with pytest.raises(InvalidStrategy) as exc:
        plan(parse_plan_request({**body, "constraints": {"tp": 2, "sequence_parallel": False}}), SolverSettings())
    assert exc.value.field == "constraints.sequence_parallel"
    res = plan(parse_plan_request({**body, "constraints": {"sequence_parallel": False}}), SolverSettings())
    assert all(e.strategy.tp == 1 for e in (res.best, *res.alternatives))  # without SP only tp 1 runs the overlap


def test_the_megatron_launch_writes_the_overlaps_that_were_priced():
    p = homogeneous_plan()
    p["best"]["strategy"].update(zero_stage=1, sequence_parallel=True)
    p["training"]["tp_comm_overlap"] = True
    args = parse_as_megatron(megatron_words(p))
    assert args.tp_comm_overlap and args.overlap_grad_reduce and args.overlap_param_gather and args.sequence_parallel
    off = homogeneous_plan()
    off["training"]["grad_reduce_overlap"] = False
    words = megatron_words(off)
    assert not {"--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather"} & set(words)


def test_a_megatron_deepspeed_plan_leaves_sharding_to_deepspeeds_engine():
    """Under Megatron-DeepSpeed the ZeRO stage and the reduction overlap are DeepSpeed's
    (ds_config.json): the megatron target writes none of Megatron-LM's distributed-optimizer,
    Megatron-FSDP or overlap flags, and says what to pass instead."""
    p = homogeneous_plan()
    p["training"]["framework"] = "megatron-deepspeed"
    p["best"]["strategy"]["zero_stage"] = 1
    words = megatron_words(p)
    assert not {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--use-megatron-fsdp"} & set(words)
    notes = render(p, "megatron", LaunchParams(image="img", command="pretrain_gpt.py", smoke_test=False)).notes
    assert any("--zero-stage 1" in n and "ds_config.json" in n for n in notes)
    assert any("--use-flash-attn-v2" in n for n in notes)  # priced with FlashAttention, which it runs only when asked
    p["training"]["attention"] = "unfused"
    assert not any("--use-flash-attn-v2" in n for n in render(p, "megatron", LaunchParams(image="img", command="x", smoke_test=False)).notes)


def test_torchtitan_refuses_an_sgd_plan():
    """torchtitan's optimizers are Adam, AdamW and Muon: an SGD plan does not launch with it."""
    from planner_service.exporters.plan_view import InvalidPlan

    p = homogeneous_plan()
    p["training"].update(framework="fsdp", optimizer="sgd")
    p["best"]["strategy"]["zero_stage"] = 3
    with pytest.raises(InvalidPlan) as exc:
        render(p, "torchtitan", LaunchParams(image="img", command="train.py", smoke_test=False))
    assert exc.value.field == "target" and "SGD" in str(exc.value)


def test_an_unfused_attention_plan_launches_megatron_cores_own_attention():
    """Priced with the score matrix materialised (``attention: unfused``), launched with
    Megatron-Core's local attention rather than Transformer Engine's fused kernels."""
    p = homogeneous_plan()
    p["training"]["attention"] = "unfused"
    assert parse_as_megatron(megatron_words(p)).attention_backend == "local"
    assert "--attention-backend" not in megatron_words(homogeneous_plan())
    p["training"]["framework"] = "fsdp"  # torchtitan has no unfused attention: its launch says what differs
    p["best"]["strategy"]["zero_stage"] = 3
    notes = render(p, "torchtitan", LaunchParams(image="img", command="train.py", smoke_test=False)).notes
    assert any("unfused attention" in n and "less memory and time" in n for n in notes)


def test_torchtitan_runs_async_tensor_parallelism_under_compile():
    manager = pytest.importorskip("torchtitan.config.manager", reason="torchtitan is not installed (pip install torchtitan)")
    p = homogeneous_plan()
    p["training"].update(framework="fsdp", tp_comm_overlap=True)
    p["best"]["strategy"].update(sequence_parallel=True, zero_stage=3)
    art = render(p, "torchtitan", LaunchParams(image="img", command="train.py", smoke_test=False))
    text = art.files["torchtitan_overrides.txt"]
    args = shlex.split("\n".join(x for x in text.splitlines() if not x.startswith("#")))
    cfg = manager.ConfigManager().parse_args(args)  # torchtitan's own check: async TP needs compile of the model
    assert cfg.compile.enable and cfg.compile.enable_async_tensor_parallel and "model" in cfg.compile.components
    assert "enable_async_tensor_parallel = true" in art.files["torchtitan.toml"]
    plain = render(homogeneous_plan() | {"training": {**p["training"], "tp_comm_overlap": False}}, "torchtitan",
                   LaunchParams(image="img", command="train.py", smoke_test=False))
    assert "--compile.enable" not in plain.files["torchtitan_overrides.txt"]


def test_fsdp_without_gradient_overlap_is_costed_as_asked_and_says_its_launch_overlaps():
    """FSDP reduces each unit's gradients from its post-backward hook and cannot defer them:
    grad_reduce_overlap false is priced as asked (more exposed DP time) with a warning that
    the launch overlaps; frameworks with the switch (Megatron-Core's --overlap-grad-reduce,
    DeepSpeed's overlap_comm) get no warning."""
    model, cluster = get_preset("llama3-8b"), simple_cluster("H100-SXM5-80GB", 2)
    s = Strategy(dp=16, zero_stage=3, micro_batch_size=1)
    on = estimate(model, _tr(framework="fsdp"), cluster, s)
    off = estimate(model, _tr(framework="fsdp", grad_reduce_overlap=False), cluster, s)
    assert off.breakdown_s["dp_comm_exposed"] >= on.breakdown_s["dp_comm_exposed"]
    assert any("cannot defer them" in w for w in off.warnings) and not any("cannot defer them" in w for w in on.warnings)
    mc = estimate(model, _tr(grad_reduce_overlap=False), cluster, Strategy(dp=16, zero_stage=1))
    assert not any("cannot defer them" in w for w in mc.warnings)
