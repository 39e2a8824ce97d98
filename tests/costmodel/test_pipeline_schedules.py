"""Several pipeline schedules a step (``training.pipeline_schedules_per_step``, ``fsdp``):
torchtitan's and NeMo Automodel's gradient accumulation with a pipeline run ``global_batch_size /
(local_batch_size × dp)`` whole schedules a step, each a ``pp_schedule.step`` over its own
micro-batches — each fills and drains the pipeline, so the bubble is paid k times, while each
holds only what an m/k schedule holds in flight, and ends in its own data-parallel sync.  One
formula for the estimate and the search: ``m·max_i t_i + k·(Σ_i t_i − max_i t_i)/v`` plus k
exposed syncs."""

from __future__ import annotations

import pytest

from cost_model.errors import InvalidStrategy, InvalidTraining
from cost_model.estimate import estimate
from cost_model.graph.evaluate import refuse_graph_unpriced
from cost_model.training import training_from_dict
from helpers.cli_estimate import cli_estimates_then_refuses
from planner_service.planner import SolverSettings, plan
from planner_service.planner.request import parse_estimate_request, parse_plan_request

H100 = "H100-SXM5-80GB"
CLUSTER = {"name": "c", "node_groups": [{"name": "n", "count": 2, "gpus_per_node": 8, "device": H100}]}
MODEL = {"preset": "llama3-8b"}
FSDP = {"global_batch_size": 64, "sequence_length": 4096, "framework": "fsdp"}
PIPE = {"dp": 4, "pp": 4, "zero_stage": 3, "micro_batch_size": 2, "recompute": "full"}  # 8 micro-batches a step


def _estimate(strategy=PIPE, **training):
    req = parse_estimate_request({"model": MODEL, "cluster": CLUSTER, "strategy": strategy, "training": {**FSDP, **training}})
    return estimate(req.model, req.training, req.cluster, req.strategy)


def test_each_schedule_fills_and_drains_the_pipeline_and_syncs_its_gradients():
    """FSDP2 inside a pipeline stage gathers the stage's weights at a schedule's first forward and
    reduce-scatters its gradients at the last backward: two schedules pay the bubble and the
    exposed data-parallel sync twice, the compute and the optimizer step once."""
    one, two = _estimate(), _estimate(pipeline_schedules_per_step=2)
    assert one.num_microbatches == two.num_microbatches == 8
    assert (one.pipeline_schedules, two.pipeline_schedules) == (1, 2)
    assert two.breakdown_s["bubble"] == pytest.approx(2 * one.breakdown_s["bubble"], rel=1e-9)
    assert one.breakdown_s["dp_comm_exposed"] > 0
    assert two.breakdown_s["dp_comm_exposed"] == pytest.approx(2 * one.breakdown_s["dp_comm_exposed"], rel=1e-9)
    assert two.step_time_s - one.step_time_s == pytest.approx(one.breakdown_s["bubble"] + one.breakdown_s["dp_comm_exposed"], rel=1e-9)
    for key in ("compute", "recompute", "optimizer"):
        assert two.breakdown_s[key] == pytest.approx(one.breakdown_s[key], rel=1e-9), key
    # 1F1B holds pp − i micro-batches whatever the schedule's length (4 of each schedule's 4)
    assert two.peak_memory_GB == pytest.approx(one.peak_memory_GB)


def test_an_interleaved_schedule_holds_what_its_own_micro_batches_do():
    """torchtitan's Interleaved1F1B over 8 micro-batches in two schedules of 4: each schedule
    warms up as a 4-micro-batch step does (its activations those of a step of half the batch),
    and its micro-batch groups are a 4-micro-batch schedule's."""
    inter = {**PIPE, "vpp": 2}
    two = _estimate(inter, pipeline_schedules_per_step=2)
    half = _estimate(inter, global_batch_size=32)
    assert [s.memory_GB["activations"] for s in two.stages] == pytest.approx([s.memory_GB["activations"] for s in half.stages])
    assert two.microbatch_groups == half.microbatch_groups == (4, 4)
    one = _estimate(inter)
    assert two.step_time_s > one.step_time_s


def test_the_count_must_share_the_micro_batches_evenly_and_the_framework_must_run_it():
    with pytest.raises(InvalidStrategy) as e:
        _estimate(pipeline_schedules_per_step=3)
    assert e.value.field == "training.pipeline_schedules_per_step" and "8 micro-batches" in e.value.message
    # torchtitan's 1F1B needs pp micro-batches in each schedule: 8 in 4 schedules leave 2 for pp 4
    with pytest.raises(InvalidStrategy) as e:
        _estimate(pipeline_schedules_per_step=4)
    assert e.value.field == "strategy.micro_batch_size" and "2 micro-batches for pp=4" in e.value.message
    for framework in ("megatron-core", "megatron-deepspeed", "deepspeed", "paddle"):
        with pytest.raises(InvalidTraining) as e:
            training_from_dict({**FSDP, "framework": framework, "pipeline_schedules_per_step": 2})
        assert e.value.field == "training.pipeline_schedules_per_step" and "torchtitan" in e.value.message, framework
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(InvalidTraining) as e:
            training_from_dict({**FSDP, "pipeline_schedules_per_step": bad})
        assert e.value.field == "training.pipeline_schedules_per_step", bad
    with pytest.raises(InvalidTraining) as e:
        refuse_graph_unpriced(training_from_dict({**FSDP, "pipeline_schedules_per_step": 2}))
    assert e.value.field == "training.pipeline_schedules_per_step"
    # without a pipeline the micro-batches run one after another either way: costed so, and said
    flat = {"dp": 16, "zero_stage": 3, "micro_batch_size": 2, "recompute": "full"}
    no_pp, base = _estimate(flat, pipeline_schedules_per_step=2), _estimate(flat)
    assert no_pp.step_time_s == pytest.approx(base.step_time_s) and no_pp.pipeline_schedules == 1
    assert any(w.startswith("training.pipeline_schedules_per_step:") for w in no_pp.warnings)


def test_the_search_prices_the_schedules_as_the_estimate_does():
    """A plan with the pipeline pinned and the split searched: its step time is the estimate of
    the strategy it returns, under both one and two schedules a step, and two cost more."""
    steps = []
    for k in (1, 2):
        body = {"model": MODEL, "cluster": CLUSTER, "training": {**FSDP, "pipeline_schedules_per_step": k},
                "constraints": {"pp": 4, "dp": 4, "micro_batch_size": 2, "vpp": 1}}
        res = plan(parse_plan_request(body), SolverSettings(time_limit_s=30))
        again = parse_estimate_request({"model": MODEL, "cluster": CLUSTER, "training": body["training"], "strategy": res.best.strategy.to_dict()})
        est = estimate(again.model, again.training, again.cluster, again.strategy)
        assert res.best.prediction.step_time_s == pytest.approx(est.step_time_s, rel=1e-9)
        steps.append(est.step_time_s)
    assert steps[1] > steps[0]


def test_the_http_api_plans_it_and_torchtitan_runs_local_batches_of_one_schedule(client):
    req = {"model": MODEL, "cluster": CLUSTER, "training": {**FSDP, "pipeline_schedules_per_step": 2},
           "constraints": {"pp": 4, "dp": 4, "micro_batch_size": 2, "vpp": 1, "tp": 1}}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    plan_body = r.json()
    assert plan_body["training"]["pipeline_schedules_per_step"] == 2 and plan_body["best"]["prediction"]["pipeline_schedules"] == 2
    launch = client.get(f"/v1/plans/{plan_body['id']}/launch", params={"target": "torchtitan"})
    assert launch.status_code == 200, launch.text
    words = launch.json()["files"]["torchtitan_overrides.txt"].splitlines()[1].split()
    # 64 sequences over dp 4 in 2 schedules: 8 sequences a schedule, torchtitan accumulating 64 / (8 × 4) = 2
    assert words[words.index("--training.local-batch-size") + 1] == "8"
    assert words[words.index("--training.global-batch-size") + 1] == "64"
    bad = client.post("/v1/plans", json={**req, "training": {**req["training"], "pipeline_schedules_per_step": 3}})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "training.pipeline_schedules_per_step"


def test_the_cli_estimates_with_it(cli, tmp_path):
    body = {"model": MODEL, "cluster": CLUSTER, "training": {**FSDP, "pipeline_schedules_per_step": 2}, "strategy": PIPE}
    out = cli_estimates_then_refuses(cli, tmp_path, body, {**body["training"], "framework": "megatron-core"},
                                     "training.pipeline_schedules_per_step")
    assert out["breakdown_s"]["bubble"] > 0
