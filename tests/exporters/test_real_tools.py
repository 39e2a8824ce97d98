"""The launch files checked by the real tools where they install on CPU (``pip install
deepspeed``; the tests skip with the reason where the package is missing): DeepSpeed's own
runner accepts the generated command and hostfile, and DeepSpeedConfig accepts ds_config.json
with the plan's mpu sizes."""

from __future__ import annotations

import json
import shlex

import pytest

from helpers.launch_sim import plan_mapping
from helpers.plans import ALL_PLANS
from planner_service.exporters import LaunchParams, render

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
    plan = ALL_PLANS[plan_name]()
    s = plan["best"]["strategy"]
    if s.get("cp", 1) > 1:
        pytest.skip("deepspeed-config refuses context parallelism")
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
