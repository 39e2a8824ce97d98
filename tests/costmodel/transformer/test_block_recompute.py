"""Partial (block) activation recompute — Megatron-Core ``--recompute-method block
--recompute-num-layers N``: the first N layers of each model chunk recompute their forward, the
others keep their activations (cost_model.transformer.layer_cost.recompute_fraction), so the
activation memory falls and the recompute time rises linearly in N between no recompute and
full recompute of every layer.  The planner searches N where a layout fits only with recompute
(planner_service.planner.transformer.space.block_recompute_candidates), the Megatron exporter
writes it, and frameworks without it refuse it naming the field.  Under ``fsdp`` and ``paddle``,
without a pipeline, the same field is fms-fsdp's ``selective_checkpointing`` (N of the L blocks,
p = N/L) and PaddleNLP's ``no_recompute_layers`` (the other L − N): costed and pinned, not
searched, refused with pp > 1, and refused by the torchtitan target, whose activation
checkpointing has no such setting."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from cost_model import Strategy, Training, estimate, simple_cluster
from cost_model.errors import InvalidStrategy
from cost_model.strategy import block_recompute_depths, strategy_from_dict
from cost_model.transformer.spec import get_preset
from planner_service.planner import SolverSettings, plan
from planner_service.planner.request import parse_plan_request

MODEL = get_preset("llama3-70b")  # 80 layers
TRAINING = Training(global_batch_size=64, sequence_length=8192)
CLUSTER = simple_cluster("H100-SXM5-80GB", 8)
LAYOUT = {"dp": 2, "tp": 4, "pp": 8}  # 10 layers per stage


def _est(**kw):
    return estimate(MODEL, TRAINING, CLUSTER, Strategy(**LAYOUT, **kw))


def test_memory_is_linear_and_time_monotone_in_the_depth():
    none, full = _est(recompute="none"), _est(recompute="full")
    depths = (2, 5, 8)
    parts = [_est(recompute="full", recompute_num_layers=n) for n in depths]
    # activations: n of the 10 layers keep only their input; the others keep everything
    for n, e in zip(depths, parts, strict=True):
        for st_none, st_full, st in zip(none.stages, full.stages, e.stages, strict=True):
            expect = st_none.peak_memory_GB + n / 10 * (st_full.peak_memory_GB - st_none.peak_memory_GB)
            # the working set of a recomputed layer comes with any recompute (in full, not in none)
            assert st.peak_memory_GB == pytest.approx(expect, rel=0.03)
            assert st_full.peak_memory_GB < st.peak_memory_GB < st_none.peak_memory_GB
    steps = [none.step_time_s] + [e.step_time_s for e in parts] + [full.step_time_s]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    # the recomputed forward FLOPs count in the hardware FLOP rate in proportion to the depth
    hw = [none.hardware_tflops_per_gpu * none.step_time_s] + [e.hardware_tflops_per_gpu * e.step_time_s for e in parts]
    hw.append(full.hardware_tflops_per_gpu * full.step_time_s)
    extra = [h - hw[0] for h in hw]
    assert extra[2] == pytest.approx(extra[-1] * 5 / 10, rel=1e-6)


def test_the_depths_searched_are_eighths_of_a_chunk_below_its_layers():
    assert block_recompute_depths(80, 8) == [2, 3, 4, 5, 7, 8, 9]
    assert block_recompute_depths(126, 64) == [1]  # chunks of 2 (and 1) layers: one of each recomputed
    assert block_recompute_depths(32, 32) == []  # one layer per chunk: none or all
    assert block_recompute_depths(4, 1) == [1, 2, 3]


def test_a_depth_covering_each_chunk_is_full_recompute_of_every_layer():
    """Megatron-Core takes a block depth up to a stage's layers; once it reaches a model chunk's
    (10 here) every layer is recomputed: costed as the plain full recompute, and said so."""
    covered = estimate(MODEL, TRAINING, CLUSTER, strategy_from_dict({**LAYOUT, "recompute": "full", "recompute_num_layers": 10}))
    plain = estimate(MODEL, TRAINING, CLUSTER, strategy_from_dict({**LAYOUT, "recompute": "full"}))
    assert covered.step_time_s == pytest.approx(plain.step_time_s) and covered.peak_memory_GB == pytest.approx(plain.peak_memory_GB)
    assert any("10 covers every layer of each model chunk" in w for w in covered.warnings)


@pytest.mark.parametrize(
    ("strategy", "field", "words"),
    [
        ({**LAYOUT, "recompute": "none", "recompute_num_layers": 3}, "strategy.recompute_num_layers", "needs recompute: full"),
        ({**LAYOUT, "recompute": "full", "recompute_num_layers": 11}, "strategy.recompute_num_layers", "1 to the 10 layers of a pipeline stage"),
        ({**LAYOUT, "recompute": "full", "recompute_num_layers": -2}, "strategy.recompute_num_layers", "non-negative"),
    ],
)
def test_bad_depths_name_the_field(strategy, field, words):
    with pytest.raises(InvalidStrategy) as e:
        estimate(MODEL, TRAINING, CLUSTER, strategy_from_dict(strategy))
    assert e.value.field == field and words in str(e.value)


def test_frameworks_without_block_recompute_refuse_it():
    t = Training(global_batch_size=64, sequence_length=8192, framework="megatron-deepspeed")
    with pytest.raises(InvalidStrategy) as e:
        estimate(MODEL, t, CLUSTER, Strategy(**LAYOUT, recompute="full", recompute_num_layers=4))
    assert e.value.field == "strategy.recompute_num_layers" and "--recompute-method block" in str(e.value)


def _body(constraints):
    # The depths that fit here fit only at the low end of their peak's interval (predicted up
    # to 100 GB on 80 GB; recomputing every layer: 80 GB; none: 110 GB, p10 87 GB, does not
    # fit), which the default ranks after a layout whose predicted peak fits: ranked by the
    # objective, the search's choice of depth is what these tests see.
    return {"model": {"preset": "llama3-8b"}, "training": {"global_batch_size": 64, "sequence_length": 6144},
            "cluster": {"name": "c", "node_groups": [{"name": "h", "count": 1, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]},
            "constraints": {"tp": 1, "pp": 1, "dp": 8, "micro_batch_size": 1, "zero_stage": 1, "tight_memory": "by_objective", **constraints}}


def test_the_search_recomputes_only_the_layers_memory_needs():
    settings = SolverSettings(time_limit_s=30.0)
    searched = plan(parse_plan_request(_body({})), settings)
    s = searched.best.strategy
    assert s.recompute == "full" and 0 < s.recompute_num_layers < 32, s
    all_layers = plan(parse_plan_request(_body({"recompute": "full"})), settings).best
    assert all_layers.strategy.recompute_num_layers == 0
    assert searched.best.prediction.step_time_s < all_layers.prediction.step_time_s
    # one depth shallower does not fit (the search keeps the first depth that does)
    shallower = [n for n in block_recompute_depths(32, 1) if n < s.recompute_num_layers]
    assert shallower
    est = estimate(get_preset("llama3-8b"), Training(global_batch_size=64, sequence_length=6144), simple_cluster("H100-SXM5-80GB", 1),
                   Strategy(dp=8, zero_stage=1, recompute="full", recompute_num_layers=shallower[-1]))
    assert max(est.peak_memory_GB) > max(searched.best.prediction.peak_memory_GB)
    # a pinned depth is costed as asked
    pinned = plan(parse_plan_request(_body({"recompute_num_layers": 30})), settings).best.strategy
    assert pinned.recompute == "full" and pinned.recompute_num_layers == 30


def test_the_plan_and_its_megatron_launch_file_carry_the_depth_over_http(client):
    r = client.post("/v1/plans", json=_body({}))
    assert r.status_code == 201, r.text
    best = r.json()["best"]["strategy"]
    n = best["recompute_num_layers"]
    assert best["recompute"] == "full" and 0 < n < 32
    art = client.get(f"/v1/plans/{r.json()['id']}/launch", params={"target": "megatron"}).json()
    text = art["files"]["megatron_args.sh"]
    words = shlex.split(text[text.index("MEGATRON_ARGS=(") + len("MEGATRON_ARGS=("): text.rindex(")")])
    assert words[words.index("--recompute-method") + 1] == "block"
    assert words[words.index("--recompute-num-layers") + 1] == str(n)
    bad = client.post("/v1/plans", json={**_body({"recompute_num_layers": 3}), "training": {**_body({})["training"], "framework": "deepspeed"}})
    assert bad.status_code == 422 and "recompute_num_layers" in bad.text


def test_the_cli_plans_and_pins_the_depth(tmp_path):
    from planner_service.cli.main import _register_all, app

    if not any(getattr(c, "name", None) == "launch" for c in app.registered_commands):
        _register_all()
    for constraints, expect in (({}, None), ({"recompute_num_layers": 30}, 30)):
        (tmp_path / "req.json").write_text(json.dumps(_body(constraints)))
        res = CliRunner().invoke(app, ["plan", str(tmp_path / "req.json"), "--json"])
        assert res.exit_code == 0, res.output
        s = json.loads(res.output)["best"]["strategy"]
        assert s["recompute"] == "full" and (s["recompute_num_layers"] == expect if expect else 0 < s["recompute_num_layers"] < 32)
    (tmp_path / "req.json").write_text(json.dumps({**_body({"recompute_num_layers": 3}), "training": {**_body({})["training"], "framework": "deepspeed"}}))
    res = CliRunner().invoke(app, ["plan", str(tmp_path / "req.json"), "--json"])
    assert res.exit_code != 0 and "recompute_num_layers" in res.output


def test_published_rows_search_the_depths_as_costing_them_all_would():
    """cost_model.validation.fidelity.predict_case bisects a layout's block depths and skips
    layouts that cannot win; on published rows with depths to search it picks what costing
    every candidate picks."""
    from cost_model.errors import PlannerError
    from cost_model.validation.fidelity import predict_case
    from cost_model.validation.published import PublishedCase, all_rows

    def exhaustive(case):
        best = None
        for s in case.candidates:
            try:
                e = estimate(case.model, case.training, case.cluster, s)
            except PlannerError:
                continue
            if e.fits and (best is None or e.step_time_s < best[0].step_time_s):
                best = (e, s)
        return best

    rows = [c for c in all_rows() if isinstance(c, PublishedCase) and any(s.recompute_num_layers for s in c.candidates)
            and len(c.candidates) <= 120][:6]
    assert len(rows) >= 3
    for case in rows:
        est, strategy = predict_case(case)
        want = exhaustive(case)
        assert (est is None) == (want is None), case.row_id
        if want is not None:
            assert est.step_time_s == pytest.approx(want[0].step_time_s, rel=1e-9), case.row_id


def _fsdp(strategy: dict) -> dict:
    """Llama 2 13B (40 layers) under FSDP full sharding on 16 nodes of A100s, as fms-fsdp trains it."""
    return {"model": {"preset": "llama2-13b"}, "training": {"global_batch_size": 256, "sequence_length": 4096, "framework": "fsdp"},
            "cluster": {"name": "c", "node_groups": [{"name": "a", "count": 16, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]},
            "strategy": {"dp": 128, "micro_batch_size": 2, "zero_stage": 3, **strategy}}


def test_fsdp_recomputes_a_fraction_of_its_blocks_as_fms_fsdp_selective_checkpointing_does(client):
    """fms-fsdp's selective_checkpointing p checkpoints p of the blocks: recompute_num_layers
    N = p·L under recompute full, between no recompute and every layer in memory and time, and
    linear in N (the layers are alike, so which N does not matter)."""
    runs = {n: client.post("/v1/estimate", json=_fsdp({"recompute": "full", "recompute_num_layers": n} if n else {"recompute": "full"}))
            for n in (10, 20, 30, 0)}
    runs[-1] = client.post("/v1/estimate", json=_fsdp({"recompute": "none"}))
    assert all(r.status_code == 200 for r in runs.values()), {n: r.text for n, r in runs.items()}
    step = {n: r.json()["step_time_s"] for n, r in runs.items()}
    peak = {n: max(r.json()["peak_memory_GB"]) for n, r in runs.items()}
    assert step[-1] < step[10] < step[20] < step[30] < step[0]
    assert peak[-1] > peak[10] > peak[20] > peak[30] > peak[0]
    # a quarter of the blocks, a half, three quarters: the same recompute time and memory each
    # quarter (beyond the recomputed layer's working set, which any recompute brings)
    assert step[30] - step[20] == pytest.approx(step[20] - step[10], rel=0.05)
    assert peak[20] - peak[30] == pytest.approx(peak[10] - peak[20], rel=0.05)


def test_fsdp_plans_a_pinned_fraction_but_does_not_search_one_and_torchtitan_refuses_to_launch_it(client):
    body = {**{k: v for k, v in _fsdp({}).items() if k != "strategy"}, "constraints": {"recompute": "full", "recompute_num_layers": 10}}
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    best = r.json()["best"]["strategy"]
    assert (best["recompute"], best["recompute_num_layers"]) == ("full", 10)
    launch = client.get(f"/v1/plans/{r.json()['id']}/launch", params={"target": "torchtitan"})
    assert launch.status_code == 422 and launch.json()["error"]["field"] == "target"
    assert "selective_checkpointing 10/40" in launch.json()["error"]["message"]
    assert client.get(f"/v1/plans/{r.json()['id']}/launch", params={"target": "torchrun"}).status_code == 200
    # unpinned, the search does not offer a depth (no fsdp launch target writes one)
    body["constraints"] = {"dp": 128, "micro_batch_size": 2, "zero_stage": 3}
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    assert all("recompute_num_layers" not in c["strategy"] for c in [r.json()["best"], *r.json()["alternatives"]])
    # grouped (uniform) recompute stays Megatron-Core's
    bad = client.post("/v1/estimate", json=_fsdp({"recompute": "full", "recompute_num_layers": 2, "recompute_method": "uniform"}))
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "strategy.recompute_method"


def test_paddle_recomputes_all_but_its_no_recompute_layers_and_neither_it_nor_fsdp_does_so_in_a_pipeline(client):
    """PaddleNLP's no_recompute_layers under recompute_granularity full: N of the L layers
    recomputed, the L − N it lists keeping their activations — between no and full recompute,
    its fleet launch naming the list; its pipeline models refuse it, and fms-fsdp has no pipeline,
    so both are a 422 naming recompute_num_layers with pp > 1."""
    def body(framework, **strategy):
        return {"model": {"preset": "llama2-13b"}, "training": {"global_batch_size": 64, "sequence_length": 4096, "framework": framework},
                "cluster": {"name": "c", "node_groups": [{"name": "a", "count": 1, "gpus_per_node": 8, "device": "A800-SXM4-80GB"}]},
                "strategy": {"dp": 2, "tp": 4, "zero_stage": 1, **strategy}}
    runs = [client.post("/v1/estimate", json=body("paddle", recompute=r, **extra)).json()
            for r, extra in (("none", {}), ("full", {"recompute_num_layers": 20}), ("full", {}))]
    assert runs[0]["step_time_s"] < runs[1]["step_time_s"] < runs[2]["step_time_s"]
    assert max(runs[0]["peak_memory_GB"]) > max(runs[1]["peak_memory_GB"]) > max(runs[2]["peak_memory_GB"])
    for framework, zero in (("paddle", 1), ("fsdp", 3)):
        bad = client.post("/v1/estimate", json=body(framework, recompute="full", recompute_num_layers=10, pp=2, dp=1, zero_stage=zero))
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "strategy.recompute_num_layers", bad.text
        assert "without a pipeline" in bad.json()["error"]["message"]
    plan_body = {**{k: v for k, v in body("paddle").items() if k != "strategy"}, "constraints": {"recompute": "full", "recompute_num_layers": 30}}
    r = client.post("/v1/plans", json=plan_body)
    assert r.status_code == 201, r.text
    assert r.json()["best"]["strategy"]["pp"] == 1 and r.json()["best"]["strategy"]["recompute_num_layers"] == 30
    notes = client.get(f"/v1/plans/{r.json()['id']}/launch", params={"target": "paddle-fleet"}).json()["notes"]
    assert any(f"no_recompute_layers {list(range(30, 40))}" in n for n in notes), notes
    r = client.post("/v1/plans", json={**plan_body, "constraints": {**plan_body["constraints"], "pp": 2}})
    assert r.status_code == 422 and r.json()["error"]["field"] == "constraints.recompute_num_layers"
