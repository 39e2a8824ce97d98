"""The launch files checked by the real tools where they install on CPU (``pip install
deepspeed``; the tests skip with the reason where the package is missing): DeepSpeed's own
runner accepts the generated command and hostfile, and DeepSpeedConfig accepts ds_config.json
with the plan's mpu sizes."""

from __future__ import annotations

import json
import shlex

import pytest

from helpers.launch_sim import plan_mapping
from helpers.plans import ALL_PLANS, cp_plan, hsdp_plan, moe_plan
from planner_service.exporters import InvalidPlan, LaunchParams, render

PARAMS = LaunchParams(image="img", command="train.py --config cfg.yaml", smoke_test=False)


class _Reached(Exception):
    """Raised where DeepSpeed's runner would first touch the network (its ssh check)."""


def _deepspeed_words(art, plan_dir) -> list[str]:
    line = next(x for x in art.files["launch_deepspeed.sh"].splitlines() if x.startswith("deepspeed "))
    return [w.replace("$PLAN_DIR", str(plan_dir)) for w in shlex.split(line)][1:]


@pytest.mark.parametrize("plan_name", list(ALL_PLANS))
def test_deepspeed_runner_accepts_the_command_and_hostfile(plan_name, tmp_path, monkeypatch):
    runner = pytest.importorskip("deepspeed.launcher.runner", reason="deepspeed is not installed (pip install deepspeed)")
    plan = ALL_PLANS[plan_name]()
    art = render(plan, "deepspeed", PARAMS)
    (tmp_path / "hostfile").write_text(art.files["hostfile"])
    words = _deepspeed_words(art, tmp_path)
    args = runner.parse_args(words)
    pool = runner.fetch_hostfile(args.hostfile)
    active = runner.parse_inclusion_exclusion(pool, args.include, args.exclude)
    mapping = plan_mapping(plan)
    hosts = list(dict.fromkeys(host for host, _ in (mapping[r] for r in sorted(mapping))))
    assert list(active) == hosts  # hostfile order = plan node order
    for host, gpus in active.items():
        assert sorted(gpus) == sorted(g for h, g in mapping.values() if h == host)
    # main() runs every argument rule (no --include with --num_nodes/--num_gpus) before its ssh check.
    monkeypatch.setattr(runner.subprocess, "check_call", lambda *a, **k: (_ for _ in ()).throw(_Reached()))
    with pytest.raises(_Reached):
        runner.main(words)


@pytest.mark.parametrize("plan_name", list(ALL_PLANS))
def test_deepspeed_config_loads_with_the_plans_mpu_sizes(plan_name, monkeypatch):
    config = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed (pip install deepspeed)")
    _check_deepspeed_config(config, ALL_PLANS[plan_name](), monkeypatch)


def test_deepspeed_config_of_a_ulysses_plan_loads_over_its_data_parallel_ranks(monkeypatch):
    # cp is DeepSpeed-Ulysses: the sequence-parallel ranks share samples, so batch sizes count dp alone
    config = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed (pip install deepspeed)")
    _check_deepspeed_config(config, cp_plan("deepspeed", pp=1), monkeypatch)


def _check_deepspeed_config(config, plan, monkeypatch):
    s = plan["best"]["strategy"]
    ds = json.loads(render(plan, "deepspeed-config", PARAMS).files["ds_config.json"])

    class Mpu:  # what DeepSpeed asks of Megatron's mpu
        def get_data_parallel_world_size(self):
            return s["dp"]

        def get_model_parallel_world_size(self):
            return s["tp"]

        def get_pipeline_model_parallel_world_size(self):
            return s["pp"]

    # DeepSpeedConfig asks torch.distributed for this process's rank before it reads the mpu.
    monkeypatch.setattr(config.dist, "get_rank", lambda *a, **k: 0)
    cfg = config.DeepSpeedConfig(ds, mpu=Mpu())
    assert cfg.world_size == s["dp"]
    assert cfg.train_batch_size == cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * s["dp"]
    assert cfg.zero_optimization_stage == s.get("zero_stage", 0)
    return cfg


def test_deepspeed_checkpoints_activations_as_priced(monkeypatch):
    """A megatron-deepspeed plan with tp > 1 and recompute: DeepSpeed's activation checkpointing
    keeps each layer's input whole on every tensor-parallel rank, as its memory was priced (a
    layer's input splits over tp only under sequence parallelism) — not partitioned."""
    config = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed (pip install deepspeed)")
    plan = _bf16_deepspeed_plan(1, 2)
    plan["best"]["strategy"].update(recompute="full", sequence_parallel=False)
    assert plan["best"]["strategy"]["tp"] > 1
    cfg = _check_deepspeed_config(config, plan, monkeypatch)
    assert cfg.activation_checkpointing_config.partition_activations is False


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_deepspeed_offloads_checkpointed_activations_as_priced(recompute, monkeypatch):
    """training.activation_offloading under full recompute is DeepSpeed's cpu_checkpointing (the
    checkpointed inputs in host memory, layer_cost.activation_offload_s), which its config parser
    takes; otherwise DeepSpeed has no setting for it and the launch says which trainers do."""
    config = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed (pip install deepspeed)")
    plan = hsdp_plan("deepspeed", 3, dp_shard=16)
    plan["best"]["strategy"].pop("dp_shard")
    plan["best"]["strategy"]["recompute"] = recompute
    plan["training"]["activation_offloading"] = True
    cfg = _check_deepspeed_config(config, plan, monkeypatch)
    assert cfg.activation_checkpointing_config.cpu_checkpointing is (recompute == "full")
    notes = render(plan, "deepspeed-config", PARAMS).notes
    assert any("TRL's activation_offloading" in n for n in notes)
    assert any("offloads only checkpointed inputs" in n for n in notes) is (recompute != "full")


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_deepspeed_takes_the_8_bit_adamw_as_an_allowed_client_optimizer(zero_stage, monkeypatch):
    """training.optimizer adamw_8bit is a client optimizer (bitsandbytes' AdamW8bit), which
    DeepSpeed's ZeRO accepts only with zero_allow_untested_optimizer: its config parser reads the
    flag the launch writes wherever ZeRO runs."""
    config = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed (pip install deepspeed)")
    plan = hsdp_plan("deepspeed", 3, dp_shard=16)
    plan["best"]["strategy"].pop("dp_shard")
    plan["best"]["strategy"]["zero_stage"] = zero_stage
    plan["training"]["optimizer"] = "adamw_8bit"
    cfg = _check_deepspeed_config(config, plan, monkeypatch)
    assert cfg.zero_allow_untested_optimizer is (zero_stage > 0)
    with pytest.raises(InvalidPlan) as err:
        render({**plan, "training": {**plan["training"], "framework": "fsdp"}}, "torchtitan", PARAMS)
    assert err.value.field == "target" and "8-bit AdamW" in err.value.message


def test_deepspeed_keeps_the_8_bit_adamw_on_the_host_when_told_to(monkeypatch):
    """The 8-bit AdamW with the state offloaded (axolotl's ALST examples: torchao's AdamW8bit,
    ZeRO-3 with offload_optimizer and offload_param): the launch tells DeepSpeed to keep the client
    optimizer (zero_force_ds_cpu_optimizer false, which its config parser reads) instead of
    forcing its CPU Adam."""
    config = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed (pip install deepspeed)")
    plan = hsdp_plan("deepspeed", 3, dp_shard=16)
    plan["best"]["strategy"].pop("dp_shard")
    plan["training"].update(optimizer="adamw_8bit", cpu_offload=True, optimizer_offload_fraction=1.0)
    cfg = _check_deepspeed_config(config, plan, monkeypatch)
    assert cfg.zero_force_ds_cpu_optimizer is False and cfg.zero_allow_untested_optimizer is True
    assert any("zero_force_ds_cpu_optimizer" in n for n in render(plan, "deepspeed-config", PARAMS).notes)


def test_torchtitan_refuses_an_activation_offloading_plan():
    # torchtitan has no activation offloading: a plan priced with it is not launched as if it did
    plan = ALL_PLANS["homogeneous"]()
    plan["training"]["framework"] = "fsdp"
    plan["training"]["activation_offloading"] = True
    with pytest.raises(InvalidPlan) as err:
        render(plan, "torchtitan", PARAMS)
    assert err.value.field == "target" and "enable_activation_offloading" in err.value.message


def test_deepspeed_refuses_partial_sharding_as_the_planner_does(monkeypatch):
    # DeepSpeed removed MiCS (ZeRO-3 over part of the dp ranks): its config refuses the key, and
    # the planner refuses dp_shard under deepspeed for the reason it gives
    config = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed (pip install deepspeed)")
    from cost_model.frameworks import partial_sharding_violation

    ds = json.loads(render(hsdp_plan("deepspeed", 3), "deepspeed-config", PARAMS).files["ds_config.json"])
    assert "mics_shard_size" not in ds["zero_optimization"]
    monkeypatch.setattr(config.dist, "get_rank", lambda *a, **k: 0)
    with pytest.raises(config.DeepSpeedConfigError, match="mics_shard_size"):
        config.DeepSpeedConfig({**ds, "zero_optimization": {**ds["zero_optimization"], "mics_shard_size": 8}})
    assert "MiCS" in partial_sharding_violation("deepspeed", dp=16, dp_shard=8, zero_stage=3)


def _bf16_deepspeed_plan(zero_stage: int, pp: int, grad_accum_dtype: str | None = None) -> dict:
    """A bf16 megatron-deepspeed plan at ``zero_stage``: the homogeneous plan (pp 2), or with pp 1
    data parallelism alone over its 16 GPUs."""
    if pp == 1:
        plan = hsdp_plan("megatron-deepspeed", zero_stage, dp_shard=16)
        plan["best"]["strategy"].pop("dp_shard")
    else:
        plan = ALL_PLANS["homogeneous"]()
        plan["training"]["framework"] = "megatron-deepspeed"
        plan["best"]["strategy"]["zero_stage"] = zero_stage
    if grad_accum_dtype:
        plan["training"]["grad_accum_dtype"] = grad_accum_dtype
    return plan


def _deepspeed_optimizer(config, plan, monkeypatch) -> str:
    """The optimizer wrapper DeepSpeed's engine picks for the plan's ds_config.json: its own
    ``_do_optimizer_sanity_check`` on an engine that holds only the parsed config."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from deepspeed.runtime.engine import DeepSpeedEngine

    cfg = _check_deepspeed_config(config, plan, monkeypatch)
    engine = object.__new__(DeepSpeedEngine)  # no model, no process group: the selection reads the config alone
    engine.__dict__.update(_config=cfg, pipeline_parallelism=plan["best"]["strategy"]["pp"] > 1, global_rank=0)
    return str(engine._do_optimizer_sanity_check(torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])))


@pytest.mark.parametrize("zero_stage, pp, accum, expected", [
    (1, 2, None, "zero_optimization"), (1, 1, None, "zero_optimization"), (1, 2, "fp32", "bf16"), (1, 1, "fp32", "bf16"), (1, 1, "bf16", "zero_optimization"),
    (0, 2, None, "bf16"), (0, 2, "fp32", "bf16"), (0, 1, None, "ddp_bf16"), (2, 1, None, "zero_optimization"),
    (2, 1, "fp32", "zero_optimization")])
def test_deepspeed_runs_the_optimizer_the_plan_priced(zero_stage, pp, accum, expected, monkeypatch):
    # bf16 is priced as DeepSpeed's BF16_Optimizer (fp32 gradient buffer and accumulation, the
    # state partitioned even at stage 0: layer_cost.bf16_optimizer) at stage 0 under a pipeline and
    # at stage 1 with fp32 accumulation asked for (training.grad_accum_dtype), as its ZeRO optimizer
    # (bf16 accumulation, DeepSpeed's default) at stages 1-2 otherwise, and at stage 0 without a
    # pipeline as its FP16 optimizer in bf16 (DDP_BFLOAT16, whole fp32 state); the emitted config
    # must make DeepSpeed pick the optimizer the plan priced
    from cost_model.training import Training
    from cost_model.transformer.layer_cost import bf16_optimizer

    config = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed (pip install deepspeed)")
    assert _deepspeed_optimizer(config, _bf16_deepspeed_plan(zero_stage, pp, accum), monkeypatch) == expected
    priced = bool(bf16_optimizer(Training(64, 8192, framework="megatron-deepspeed", grad_accum_dtype=accum), zero_stage, pp))
    assert priced == (expected == "bf16")  # what the cost model prices is what DeepSpeed runs


@pytest.mark.parametrize("zero_stage, fraction", [(1, 1.0), (2, 1.0), (3, 1.0), (3, 0.25)])
def test_deepspeed_runs_the_optimizer_offload_the_plan_priced(zero_stage, fraction, monkeypatch):
    # training.optimizer_offload_fraction is ZeRO-Offload: DeepSpeed's config parser takes the
    # offload_optimizer section the launch writes, its engine sees CPU offload at the priced ratio
    # and keeps its ZeRO optimizer even where fp32 accumulation at stage 1 would run BF16_Optimizer
    # (layer_cost.bf16_optimizer prices the same)
    from cost_model.training import Training
    from cost_model.transformer.layer_cost import bf16_optimizer

    config = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed (pip install deepspeed)")
    from deepspeed.runtime.engine import DeepSpeedEngine

    plan = _bf16_deepspeed_plan(zero_stage, 1, "fp32")
    plan["training"]["optimizer_offload_fraction"] = fraction
    cfg = _check_deepspeed_config(config, plan, monkeypatch)
    engine = object.__new__(DeepSpeedEngine)
    engine.__dict__.update(_config=cfg)
    assert engine.zero_cpu_offload() and engine.zero_partial_offload() == fraction
    assert _deepspeed_optimizer(config, plan, monkeypatch) == "zero_optimization"
    priced = Training(64, 8192, framework="megatron-deepspeed", grad_accum_dtype="fp32", optimizer_offload_fraction=fraction)
    assert not bool(bf16_optimizer(priced, zero_stage, 1))


def test_deepspeed_takes_the_zero3_offload_sections_the_launch_writes(monkeypatch):
    # training.cpu_offload under DeepSpeed is its ZeRO-3 Offload: offload_param and
    # offload_optimizer to the CPU, which DeepSpeed's config parser takes at stage 3
    config = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed (pip install deepspeed)")
    plan = hsdp_plan("deepspeed", 3, dp_shard=16)
    plan["best"]["strategy"].pop("dp_shard")
    plan["training"]["cpu_offload"] = True
    zero = _check_deepspeed_config(config, plan, monkeypatch).zero_config
    assert zero.offload_param.device == "cpu" and zero.offload_optimizer.device == "cpu" and zero.offload_optimizer.ratio == 1.0


@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_deepspeed_autoep_accepts_the_expert_parallel_section(zero_stage, monkeypatch):
    """A ``deepspeed`` plan's expert parallelism is DeepSpeed's AutoEP: DeepSpeedConfig parses its
    ``expert_parallel`` section, AutoEP's own validation (config and rank folding at the plan's
    world, pipeline and ZeRO stage) accepts it, and the preset is one DeepSpeed registers for the
    model's model_type; under ``megatron-deepspeed`` it is the model code's flag, no section."""
    config = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed (pip install deepspeed)")
    from deepspeed.module_inject.auto_ep_config import validate_autoep_config
    from deepspeed.module_inject.auto_ep_presets.registry import preset_name_for_hf_model_type

    from planner_service.exporters.frameworks import AUTOEP_PRESETS

    # DeepSpeed's pipeline engine runs stage 0-1: at stages 2-3 the 16 ranks as dp alone
    plan = moe_plan("deepspeed", dp=8 if zero_stage < 2 else 16, ep=4, zero_stage=zero_stage, pp=2 if zero_stage < 2 else 1)
    s = plan["best"]["strategy"]
    cfg = _check_deepspeed_config(config, plan, monkeypatch)
    ep = cfg.expert_parallel_config
    assert ep.enabled and ep.autoep_size == 4 and ep.preset_model == "qwen3_moe"
    validate_autoep_config(ep, world_size=s["dp"] * s["pp"], pp_size=s["pp"], tp_size=1, sp_size=1, zero_stage=zero_stage)
    assert all(preset_name_for_hf_model_type(t) == name for t, name in AUTOEP_PRESETS.items())
    art = render(moe_plan("megatron-deepspeed", dp=8, ep=4), "deepspeed-config", PARAMS)
    assert "expert_parallel" not in json.loads(art.files["ds_config.json"])
    assert any("--moe-expert-parallel-size 4" in n for n in art.notes)


def test_deepspeed_engine_refuses_the_moe_layouts_the_planner_refuses():
    """DeepSpeed's engine's own MoE check (``_validate_zero3_moe_compatibility``) on an engine
    holding only the layers: native MoE (Megatron-DeepSpeed's) refused under ZeRO-3, AutoEP's
    refused beside sequence parallelism — the rules ``deepspeed_moe_violation`` states."""
    pytest.importorskip("deepspeed.runtime.engine", reason="deepspeed is not installed (pip install deepspeed)")
    from deepspeed.module_inject.auto_ep_layer import AutoEPMoELayer
    from deepspeed.moe.layer import MoE
    from deepspeed.runtime.engine import DeepSpeedEngine

    from cost_model.frameworks import deepspeed_moe_violation

    def engine(layer, sp):
        class Module:
            def named_modules(self):
                return [("layers.0.mlp", layer)]
        e = object.__new__(DeepSpeedEngine)
        e.__dict__.update(module=Module(), has_moe_layers=True, sequence_parallel_size=sp)
        return e

    with pytest.raises(AssertionError, match="Native DeepSpeed MoE is not supported with ZeRO Stage 3"):
        engine(object.__new__(MoE), 1)._validate_zero3_moe_compatibility()
    assert deepspeed_moe_violation("megatron-deepspeed", is_moe=True, zero_stage=3, ep=1, cp=1)[0] == "zero_stage"
    with pytest.raises(AssertionError, match="does not support sequence parallelism"):
        engine(object.__new__(AutoEPMoELayer), 2)._validate_zero3_moe_compatibility()
    assert deepspeed_moe_violation("deepspeed", is_moe=True, zero_stage=3, ep=4, cp=2)[0] == "cp"
    assert deepspeed_moe_violation("deepspeed", is_moe=True, zero_stage=3, ep=4, cp=1) is None
    assert deepspeed_moe_violation("deepspeed", is_moe=True, zero_stage=3, ep=1, cp=2) is None  # ep 1: no AutoEP, plain modules


def _overrides(art) -> list[str]:
    text = art.files["torchtitan_overrides.txt"]
    return shlex.split("\n".join(x for x in text.splitlines() if not x.startswith("#")))


@pytest.mark.parametrize("plan_name", list(ALL_PLANS))
def test_torchtitan_config_manager_accepts_the_arguments(plan_name):
    manager = pytest.importorskip("torchtitan.config.manager", reason="torchtitan is not installed (pip install torchtitan)")
    plan = ALL_PLANS[plan_name]()
    s = plan["best"]["strategy"]
    art = render(plan, "torchtitan", PARAMS)
    args = _overrides(art)
    assert args[:4] == ["--module", "llama3", "--config", "llama3_8b"]  # the plans are Llama-3-8B: a registered model
    cfg = manager.ConfigManager().parse_args(args)
    par = cfg.parallelism
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree) == (s["tp"], s["pp"], s.get("cp", 1))
    assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == s["dp"]
    layers = [sum(1 for m in part if m.startswith("layers.")) for part in par.module_fqns_per_model_part]
    assert layers == s["layers_per_stage"]
    assert cfg.training.global_batch_size == plan["training"]["global_batch_size"]
    # torchtitan's own check of the degrees against the world the launch starts (ParallelDims._validate)
    dims = pytest.importorskip("torchtitan.distributed.parallel_dims")
    world = len(plan["best"]["ranks"])
    dims.ParallelDims(dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                      cp=par.context_parallel_degree, tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree,
                      ep=par.expert_parallel_degree, world_size=world)


def test_torchtitan_accumulates_over_the_pipeline_schedules_the_plan_priced():
    """training.pipeline_schedules_per_step: the launch's local_batch_size makes torchtitan run that
    many pipeline schedules a step (its gradient accumulation steps, global / (local × dp)), as
    ConfigManager parses the arguments."""
    manager = pytest.importorskip("torchtitan.config.manager", reason="torchtitan is not installed (pip install torchtitan)")
    plan = next(p for p in (make() for make in ALL_PLANS.values()) if p["best"]["strategy"]["pp"] > 1)
    s = plan["best"]["strategy"]
    plan["training"].update(framework="fsdp", pipeline_schedules_per_step=2)
    cfg = manager.ConfigManager().parse_args(_overrides(render(plan, "torchtitan", PARAMS)))
    assert cfg.training.global_batch_size // (cfg.training.local_batch_size * s["dp"]) == 2
    assert cfg.training.local_batch_size % cfg.parallelism.pipeline_parallel_microbatch_size == 0


def test_torchtitan_config_manager_accepts_a_context_parallel_plan():
    manager = pytest.importorskip("torchtitan.config.manager", reason="torchtitan is not installed (pip install torchtitan)")
    par = manager.ConfigManager().parse_args(_overrides(render(cp_plan("fsdp"), "torchtitan", PARAMS))).parallelism
    assert par.context_parallel_degree == 4 and par.tensor_parallel_degree == 1


def test_torchtitan_config_manager_accepts_an_hsdp_plan():
    manager = pytest.importorskip("torchtitan.config.manager", reason="torchtitan is not installed (pip install torchtitan)")
    par = manager.ConfigManager().parse_args(_overrides(render(hsdp_plan("fsdp", 3), "torchtitan", PARAMS))).parallelism
    assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == (2, 8)


def test_torchtitan_selective_recompute_is_its_op_level_checkpointing():
    # what the cost model prices for recompute: selective under fsdp (layer_cost.op_level_selective)
    import tomllib

    manager = pytest.importorskip("torchtitan.config.manager", reason="torchtitan is not installed (pip install torchtitan)")
    plan = ALL_PLANS["homogeneous"]()
    plan["best"]["strategy"]["recompute"] = "selective"
    art = render(plan, "torchtitan", PARAMS)
    assert tomllib.loads(art.files["torchtitan.toml"])["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    ac = manager.ConfigManager().parse_args(_overrides(art)).activation_checkpoint
    # torchtitan >= 0.3: the selective subcommand is the op-level policy (it has no layer option)
    assert type(ac).__qualname__ == "SelectiveAC.Config" and hasattr(ac, "force_recompute_mm_shapes_by_fqns"), ac


def test_torchtitan_toml_names_a_registered_flavor():
    import tomllib

    art = render(ALL_PLANS["homogeneous"](), "torchtitan", PARAMS)
    assert tomllib.loads(art.files["torchtitan.toml"])["model"] == {"name": "llama3", "flavor": "8B"}
    llama = pytest.importorskip("torchtitan.models.llama3", reason="torchtitan is not installed")
    assert "8B" in llama.llama3_configs


def _fleet_strategy(plan, tmp_path):
    import importlib.util

    art = render(plan, "paddle-fleet", PARAMS)
    (tmp_path / "fleet_strategy.json").write_text(art.files["fleet_strategy.json"])
    (tmp_path / "fleet_init.py").write_text(art.files["fleet_init.py"])
    spec = importlib.util.spec_from_file_location("fleet_init", tmp_path / "fleet_init.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert callable(mod.wrap) and callable(mod.auto_cast)
    return art, mod.build_strategy(mod.load_config(str(tmp_path / "fleet_strategy.json")))


PADDLE_PLANS = {**ALL_PLANS, "hsdp": lambda: hsdp_plan("paddle", 2)}


@pytest.mark.parametrize("plan_name", list(PADDLE_PLANS))
def test_paddle_distributed_strategy_takes_every_part_of_the_plan(plan_name, tmp_path):
    pytest.importorskip("paddle", reason="paddlepaddle is not installed (pip install paddlepaddle)")
    plan = PADDLE_PLANS[plan_name]()
    s = plan["best"]["strategy"]
    art, strategy = _fleet_strategy(plan, tmp_path)
    cfg = json.loads(art.files["fleet_strategy.json"])
    hc = strategy.hybrid_configs
    assert (hc["mp_degree"], hc["pp_degree"]) == (s["tp"], s["pp"])
    assert hc["dp_degree"] * hc["sharding_degree"] == s["dp"]
    if s.get("dp_shard"):  # HSDP: sharded over dp_shard ranks inside each dp replica
        assert (hc["sharding_degree"], hc["dp_degree"]) == (s["dp_shard"], s["dp"] // s["dp_shard"])
        assert strategy.hybrid_parallel_order.index("sharding") > strategy.hybrid_parallel_order.index("dp")
    assert strategy.pipeline_configs["accumulate_steps"] * strategy.pipeline_configs["micro_batch_size"] * s["dp"] == plan["training"]["global_batch_size"]
    assert strategy.pipeline_configs["schedule_mode"] == "1F1B"
    assert strategy.recompute == (s.get("recompute", "none") != "none")
    assert strategy.amp == (plan["training"].get("dtype", "bf16") != "fp32")
    assert cfg["sharding_stage"] == s.get("zero_stage", 0) and cfg["amp_level"] in ("O0", "O2")


@pytest.mark.parametrize(("dp", "tp", "ep", "degrees"), [(8, 1, 4, (1, 8, 4, 2)), (4, 2, 4, (1, 4, 4, 2)), (4, 2, 8, (1, 4, 8, 1))],
                         ids=["ep-over-dp", "ep-over-dp-and-tp", "ep-spans-the-stage"])
def test_paddle_fleet_builds_the_plans_expert_groups(tmp_path, monkeypatch, dp, tp, ep, degrees):
    """A Paddle plan with expert parallelism gets fleet's expert axes, and Paddle's own
    EPHybridCommunicateGroup — run on the written strategy with only the NCCL group creation
    stubbed — builds expert groups of the plan's ranks: ep consecutive ranks of a stage (its
    tensor-parallel ranks inside each group when tp > 1, the experts whole on each: the etp 1 the
    planner costs for Paddle), the sharding group every dp rank of it, the experts' sharding
    group dp·tp/ep ranks."""
    pytest.importorskip("paddle", reason="paddlepaddle is not installed (pip install paddlepaddle)")
    import paddle.distributed as dist
    from paddle.distributed.fleet.base import topology

    plan = moe_plan("paddle", dp=dp, ep=ep, tp=tp)
    art, strategy = _fleet_strategy(plan, tmp_path)
    hc, order = strategy.hybrid_configs, strategy.hybrid_parallel_order
    assert (hc["dp_degree"], hc["sharding_degree"], hc["ep_degree"], hc["moe_sharding_degree"]) == degrees
    assert hc["mp_degree"] == tp
    names = {"dp": "data", "pp": "pipe", "sharding": "sharding", "mp": "model", "sep": "sep", "cp": "context", "ep": "expert",
             "moe_sharding": "moe_sharding"}
    groups: dict[str, list[list[int]]] = {}

    def no_nccl(self, name, topo, *args, **kwargs):
        groups[name] = topo.get_comm_list(name)
        return None, None

    monkeypatch.setattr(topology.HybridCommunicateGroup, "_set_comm_group", no_nccl)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: len(plan["best"]["ranks"]))
    monkeypatch.setattr(dist, "get_rank", lambda *a: 0)
    monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: None)
    monkeypatch.setattr(dist, "new_group", lambda ranks=None, *a, **k: ranks)
    hcg = topology.EPHybridCommunicateGroup([names[k] for k in order], [max(hc[f"{k}_degree"], 1) for k in order], hc)
    assert (hcg.get_expert_parallel_world_size(), hcg.get_sharding_parallel_world_size(),
            hcg.get_moe_sharding_parallel_world_size(), hcg.get_model_parallel_world_size()) == (ep, dp, degrees[3], tp)
    ranks = plan["best"]["ranks"]

    def block(r):  # the plan's expert group: ep consecutive (dp, tp) ranks of a stage
        return r["pp"], (r["dp"] * tp + r["tp"]) // ep

    want = sorted(sorted(r["rank"] for r in ranks if block(r) == key) for key in {block(r) for r in ranks})
    assert sorted(groups["expert"]) == want
    # the tensor-parallel groups are the plan's too
    assert sorted(groups["model"]) == sorted(sorted(r["rank"] for r in ranks if (r["pp"], r["dp"]) == key)
                                            for key in {(r["pp"], r["dp"]) for r in ranks})
    assert any("get_expert_parallel_group" in n for n in art.notes)


def test_paddle_fleet_writes_no_expert_axes_for_a_layout_it_cannot_build(tmp_path):
    """A stored plan outside fleet's expert layout (here zero_stage 0: dp_degree would not be 1)
    gets no expert axes, and a note says why."""
    art, _ = _fleet_strategy(moe_plan("paddle", dp=4, ep=4, tp=1, zero_stage=0), tmp_path)
    hybrid = json.loads(art.files["fleet_strategy.json"])["hybrid_configs"]
    assert "ep_degree" not in hybrid and "moe_sharding" not in hybrid["order"]
    assert any("not this plan's layout" in n for n in art.notes)


def test_paddle_fleet_notes_the_paddlenlp_offloads_the_plan_priced(tmp_path):
    """Paddle's offloads are PaddleNLP Trainer arguments, not fleet strategy fields: the strategy
    still builds with Paddle, and the notes name tensorwise_offload_optimizer and recompute_offload."""
    plan = moe_plan("paddle", dp=4, ep=4, tp=1, zero_stage=1)
    plan["training"].update(optimizer_offload_fraction=1.0, activation_offloading=True)
    art, _ = _fleet_strategy(plan, tmp_path)
    assert any("tensorwise_offload_optimizer: true" in n for n in art.notes)
    assert any("recompute_offload: true" in n for n in art.notes)


@pytest.mark.parametrize("plan_name", list(ALL_PLANS))
def test_torchtitan_launch_runs_the_installed_torchtitans_arguments(plan_name):
    """launch_torchtitan.sh passes the arguments torchtitan >= 0.3 takes (not the TOML era's
    --job.config_file), and every module a pipeline part names is one of the model's own (0.3's
    head is lm_head: a name its split does not know is dropped, leaving the last stage headless)."""
    import torch

    manager = pytest.importorskip("torchtitan.config.manager", reason="torchtitan is not installed (pip install torchtitan)")
    art = render(ALL_PLANS[plan_name](), "torchtitan", LaunchParams(image="img", smoke_test=False))
    line = next(x for x in art.files["launch_torchtitan.sh"].splitlines() if "-m torchtitan.train" in x)
    words = shlex.split(line)
    args = words[words.index("torchtitan.train") + 1:]
    assert "--job.config_file" not in args and args == _overrides(art)
    cfg = manager.ConfigManager().parse_args(args)
    with torch.device("meta"):
        children = {name for name, _ in cfg.model_spec.model.build().named_children()}
    for part in cfg.parallelism.module_fqns_per_model_part or []:
        assert {m.split(".")[0] for m in part} <= children, part


def test_torchtitan_refuses_fp16_and_turns_cuda_graphs_off_for_experts():
    from planner_service.exporters.plan_view import InvalidPlan

    plan = ALL_PLANS["homogeneous"]()
    plan["training"].update(framework="fsdp", dtype="fp16")
    with pytest.raises(InvalidPlan) as exc:
        render(plan, "torchtitan", PARAMS)
    assert exc.value.field == "target" and "bfloat16 or float32" in str(exc.value)
    from helpers.plans import _ranks

    moe = ALL_PLANS["homogeneous"]()
    moe["best"]["strategy"].update(ep=2, pp=1, dp=4, layers_per_stage=[32])
    moe["best"]["ranks"] = _ranks(4, 4, 1, 1, lambda p, d, c, t: ("node7" if d < 2 else "node66", (d % 2) * 4 + t, "h100", "H100-SXM5-80GB"))
    moe["best"].pop("stages")
    assert "--training.disable-cuda-graphs" in _overrides(render(moe, "torchtitan", PARAMS))


def test_torchtitan_runs_a_cpu_offloaded_plan_with_its_cpu_offload():
    # a plan priced with FSDP's CPU offload (training.cpu_offload) launches as torchtitan's
    # training.enable_cpu_offload (FSDP2's CPUOffloadPolicy), which its ConfigManager parses
    import tomllib

    manager = pytest.importorskip("torchtitan.config.manager", reason="torchtitan is not installed (pip install torchtitan)")
    plan = ALL_PLANS["homogeneous"]()
    plan["training"]["cpu_offload"] = True
    art = render(plan, "torchtitan", PARAMS)
    assert tomllib.loads(art.files["torchtitan.toml"])["training"]["enable_cpu_offload"] is True
    assert manager.ConfigManager().parse_args(_overrides(art)).training.enable_cpu_offload is True
    plan["training"].pop("cpu_offload")
    assert "enable_cpu_offload" not in tomllib.loads(render(plan, "torchtitan", PARAMS).files["torchtitan.toml"])["training"]


def test_torchtitan_compiles_the_loss_a_plan_priced_compiled():
    # training.loss_kernel "compiled" (torch.compile's cross-entropy, layer_cost.embedding_head_costs)
    # launches as torchtitan's compile.components with "loss", which its ConfigManager parses
    import tomllib

    manager = pytest.importorskip("torchtitan.config.manager", reason="torchtitan is not installed (pip install torchtitan)")
    plan = ALL_PLANS["homogeneous"]()
    plan["training"]["loss_kernel"] = "compiled"
    art = render(plan, "torchtitan", PARAMS)
    assert tomllib.loads(art.files["torchtitan.toml"])["compile"] == {"enable": True, "components": ["model", "loss"]}
    cfg = manager.ConfigManager().parse_args(_overrides(art))
    assert cfg.compile.enable is True and list(cfg.compile.components) == ["model", "loss"]
    plan["training"]["loss_kernel"] = "liger"  # a loss torchtitan does not run: refused by target
    with pytest.raises(InvalidPlan) as err:
        render(plan, "torchtitan", PARAMS)
    assert err.value.field == "target"


def test_torchtitan_runs_a_pure_bf16_plan_in_bf16():
    # a plan priced without fp32 master weights (training.master_weights false) launches as torchtitan's
    # training.dtype = "bfloat16": "all parameters, gradients, and optimizer states in bfloat16"
    import tomllib

    manager = pytest.importorskip("torchtitan.config.manager", reason="torchtitan is not installed (pip install torchtitan)")
    plan = ALL_PLANS["homogeneous"]()
    plan["training"]["master_weights"] = False
    art = render(plan, "torchtitan", PARAMS)
    assert tomllib.loads(art.files["torchtitan.toml"])["training"]["dtype"] == "bfloat16"
    assert manager.ConfigManager().parse_args(_overrides(art)).training.dtype == "bfloat16"
    plan["training"].pop("master_weights")
    assert "dtype" not in tomllib.loads(render(plan, "torchtitan", PARAMS).files["torchtitan.toml"])["training"]
