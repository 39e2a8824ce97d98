"""Megatron-Core's embedding/loss-aware pipeline split (``account_for_embedding_in_pipeline_split``,
``account_for_loss_in_pipeline_split``): the strategy option, its validation (4xx naming the
field) and the published rows that need it (pp·vpp = layers + 2)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cost_model import Strategy, Training, estimate, get_preset, simple_cluster
from cost_model.errors import InvalidStrategy
from cost_model.strategy import pipeline_split, strategy_from_dict, validate_strategy
from cost_model.validation.fidelity import evaluate_case
from cost_model.validation.published import PublishedCase, _case, load_rows

FLAGS = {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}


def test_split_counts_the_embedding_and_the_loss_as_a_layer_each():
    # Llama 3 405B: 126 + 2 = 128 = 16 stages x 8 chunks, the first chunk the embedding alone
    split = pipeline_split(126, 128, embedding=True, loss=True)
    assert split == (0,) + (1,) * 126 + (0,)
    assert pipeline_split(126, 64, embedding=True, loss=True) == (1,) + (2,) * 62 + (1,)
    assert pipeline_split(31, 8, embedding=True, loss=False) == (3,) + (4,) * 7
    assert pipeline_split(126, 16 * 4 + 1, embedding=True, loss=True) is None  # 128 not a multiple of 65


def _llama405():
    return get_preset("llama3-405b"), Training(global_batch_size=64, sequence_length=8192)


def test_pp16_vpp8_over_126_layers_costs_an_embedding_only_and_a_head_only_chunk():
    model, training = _llama405()
    s = Strategy(tp=8, pp=16, vpp=8, dp=1, micro_batch_size=1, sequence_parallel=True, recompute="full", **FLAGS)
    filled = validate_strategy(model, training, s)
    assert filled.layers_per_stage == pipeline_split(126, 128, embedding=True, loss=True)
    est = estimate(model, training, simple_cluster("H100-SXM5-80GB", 16), s)
    layers = [st.num_layers for st in est.stages]
    assert layers == [7] + [8] * 14 + [7]
    assert sum(layers) == 126
    first, middle, last = est.stages[0], est.stages[1], est.stages[-1]
    assert first.has_embedding and last.has_head
    # one decoder layer fewer on the first and last stage: fewer weights there than in the middle
    assert first.memory_GB["weights"] < middle.memory_GB["weights"]
    # chunk 0 (stage 0) is the embedding alone, so decoder layer 0 is on stage 1 and stage 0's
    # first layer is chunk 16's (layer 15); the last chunk (stage 15) is the head alone
    assert middle.layer_ranges[0] == (0, 0) and first.layer_ranges[0] == (15, 15)
    assert est.stages[-2].layer_ranges[-1] == (125, 125) and last.layer_ranges[-1] == (110, 110)
    # without the option the same layout is not a valid split
    with pytest.raises(InvalidStrategy) as err:
        validate_strategy(model, training, replace(s, account_for_embedding_in_pipeline_split=False, account_for_loss_in_pipeline_split=False))
    assert err.value.field == "strategy.pp"


def test_a_stage_of_only_the_embedding_is_costed():
    model = get_preset("llama2-7b")  # 32 layers
    training = Training(global_batch_size=16, sequence_length=4096)
    s = Strategy(pp=34, dp=1, micro_batch_size=1, **FLAGS)  # 32 + 2 = 34 stages of one unit each
    est = estimate(model, training, simple_cluster("H100-SXM5-80GB", 5), s)
    assert est.stages[0].num_layers == 0 and est.stages[-1].num_layers == 0
    assert est.stages[0].has_embedding and est.stages[-1].has_head
    assert est.stages[0].memory_GB["weights"] < est.stages[1].memory_GB["weights"]


@pytest.mark.parametrize(("data", "field"), [
    ({"pp": 1, "account_for_embedding_in_pipeline_split": True}, "strategy.account_for_embedding_in_pipeline_split"),
    ({"pp": 1, "account_for_loss_in_pipeline_split": True}, "strategy.account_for_loss_in_pipeline_split"),
    ({"pp": 5, "account_for_embedding_in_pipeline_split": True}, "strategy.account_for_embedding_in_pipeline_split"),  # 33 % 5
    ({"pp": 4, "account_for_loss_in_pipeline_split": "yes"}, "strategy.account_for_loss_in_pipeline_split"),
    ({"pp": 2, "layers_per_stage": [0, 32]}, "strategy.layers_per_stage"),  # a 0-layer chunk needs the flag
    ({"pp": 3, "layers_per_stage": [16, 0, 16], **FLAGS}, "strategy.layers_per_stage"),  # only first/last may be empty
    ({"pp": 2, "layers_per_stage": [-1, 33]}, "strategy.layers_per_stage"),
])
def test_bad_split_options_name_the_field(data, field):
    model = get_preset("llama2-7b")
    training = Training(global_batch_size=16, sequence_length=4096)
    with pytest.raises(InvalidStrategy) as err:
        validate_strategy(model, training, strategy_from_dict({"micro_batch_size": 1, **data}))
    assert err.value.field == field


def test_an_explicit_split_may_leave_the_first_chunk_to_the_embedding():
    model = get_preset("llama2-7b")
    training = Training(global_batch_size=16, sequence_length=4096)
    s = strategy_from_dict({"pp": 2, "micro_batch_size": 1, "layers_per_stage": [0, 32], "account_for_embedding_in_pipeline_split": True})
    assert validate_strategy(model, training, s).layers_per_stage == (0, 32)


def test_the_option_is_written_only_when_set():
    assert "account_for_embedding_in_pipeline_split" not in Strategy(pp=2).to_dict()
    assert Strategy(pp=2, **FLAGS).to_dict()["account_for_loss_in_pipeline_split"] is True


def test_published_rows_with_pp_vpp_equal_to_layers_plus_two_use_it_and_plan():
    row = next(r for r in load_rows() if r["id"] == "megatron-bridge-26.04.01-DGX-GB200-LLAMA3.1_405B-MXFP8-256gpu-tp4pp16cp1")
    case = _case(row)
    assert isinstance(case, PublishedCase)
    assert all(s.account_for_embedding_in_pipeline_split and s.account_for_loss_in_pipeline_split for s in case.candidates)
    result = evaluate_case(case)
    assert result.failure is None and result.fits
    assert result.strategy is not None and result.strategy.vpp == 8
    assert abs(result.error) < 0.25


def test_the_estimate_route_takes_the_option_and_names_a_bad_value(client):
    body = {
        "model": {"preset": "llama2-7b"},
        "training": {"global_batch_size": 16, "sequence_length": 2048},
        "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]},
        "strategy": {"pp": 2, "dp": 4, "micro_batch_size": 1, **FLAGS},
    }
    ok = client.post("/v1/estimate", json=body)
    assert ok.status_code == 200, ok.text
    assert [st["num_layers"] for st in ok.json()["stages"]] == [16, 16]  # (32 + 2)/2 = 17 units, one each for embedding and head
    bad = client.post("/v1/estimate", json={**body, "strategy": {**body["strategy"], "pp": 1, "dp": 8}})
    assert bad.status_code == 422
    assert bad.json()["error"]["field"] == "strategy.account_for_embedding_in_pipeline_split"


def _plan_body(constraints):
    return {
        "model": {"preset": "llama2-7b"},
        "training": {"global_batch_size": 32, "sequence_length": 4096},
        "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 2, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]},
        "constraints": constraints,
    }


def test_the_planner_honours_the_pinned_split_flags():
    from planner_service.planner import SolverSettings, plan
    from planner_service.planner.request import parse_plan_request

    req = parse_plan_request(_plan_body({**FLAGS, "pp": 2, "micro_batch_size": 1}))
    result = plan(req, SolverSettings(time_limit_s=20))
    best = result.best.strategy
    assert best.account_for_embedding_in_pipeline_split and best.account_for_loss_in_pipeline_split
    assert best.pp == 2
    chunks = best.pp * best.vpp
    assert best.layers_per_stage == pipeline_split(32, chunks, embedding=True, loss=True)
    # what the plan predicts is what estimate says for that strategy
    again = estimate(req.model, req.training, req.cluster, best)
    assert again.step_time_s == pytest.approx(result.best.prediction.step_time_s, rel=1e-9)


@pytest.mark.parametrize(("constraints", "field"), [
    ({"pp": 1, "account_for_embedding_in_pipeline_split": True}, "constraints.account_for_embedding_in_pipeline_split"),
    ({"pp": 4, "vpp": 3, **FLAGS}, "constraints.account_for_embedding_in_pipeline_split"),  # 34 over 12 chunks
    ({"account_for_loss_in_pipeline_split": 1}, "constraints.account_for_loss_in_pipeline_split"),
])
def test_bad_pinned_split_flags_name_the_constraint(constraints, field):
    from planner_service.planner.request import parse_plan_request
    from planner_service.planner.transformer.space import check_pins

    with pytest.raises(InvalidStrategy) as err:
        req = parse_plan_request(_plan_body(constraints))
        check_pins(req.model, req.training, req.constraints.pinned)
    assert err.value.field == field
