"""On instances small enough to enumerate, the plan equals the brute-force optimum of the same
cost model (strategies × stage splits × placements)."""

import pytest

from helpers.bruteforce import brute_force
from planner_service.planner import SolverSettings, plan
from planner_service.planner.request import parse_plan_request
from planner_service.planner.transformer.search import normalise_cluster

GPT_SMALL = {"transformer": {"n_layer": 4, "n_embd": 1024, "n_head": 16, "vocab_size": 32000, "n_positions": 2048}, "name": "gpt-4l"}
LLAMA_SMALL = {"transformer": {"num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4,
                               "intermediate_size": 2816, "vocab_size": 32000}, "name": "llama-4l"}
SMALL_GPU = {"name": "small-gpu", "memory_GB": 4, "memory_bandwidth_GBps": 1500, "bf16_tflops": 300, "family": "ampere",
             "intra_node_bandwidth_GBps": 300, "inter_node_bandwidth_GBps": 100}
FAST_GPU = {"name": "fast-gpu", "memory_GB": 4, "memory_bandwidth_GBps": 3000, "bf16_tflops": 900, "family": "hopper",
            "intra_node_bandwidth_GBps": 450, "inter_node_bandwidth_GBps": 200}


def _check(body):
    req = parse_plan_request(body)
    result = plan(req, SolverSettings(time_limit_s=30, max_refinements=10_000))
    cluster = normalise_cluster(req.cluster, None)
    ref, ref_strategy, ref_place = brute_force(req.model, req.training, cluster)
    got = result.best.prediction.step_time_s
    assert result.search["solver_status"] == "OPTIMAL"
    assert got == pytest.approx(ref, rel=1e-6), (result.best.strategy, result.best.stage_groups, ref_strategy, ref_place)
    return result


@pytest.mark.slow
@pytest.mark.parametrize("model", [GPT_SMALL, LLAMA_SMALL], ids=["gpt", "llama"])
def test_one_device_type_matches_brute_force(model):
    _check({
        "model": model,
        "training": {"global_batch_size": 8, "sequence_length": 2048},
        "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 2, "gpus_per_node": 4, "device": SMALL_GPU}]},
    })


GPT_WIDE = {"transformer": {"n_layer": 4, "n_embd": 4096, "n_head": 32, "vocab_size": 32000, "n_positions": 2048}, "name": "gpt-wide"}
LLAMA_WIDE = {"transformer": {"num_hidden_layers": 4, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                              "intermediate_size": 11008, "vocab_size": 32000}, "name": "llama-wide"}


@pytest.mark.slow
@pytest.mark.parametrize("model", [GPT_WIDE, LLAMA_WIDE], ids=["gpt", "llama"])
def test_two_device_types_match_brute_force(model):
    # 6 GB devices: the model does not fit on either 4-GPU node alone, so the optimum is a
    # pipeline over both device types.
    result = _check({
        "model": model,
        "training": {"global_batch_size": 4, "sequence_length": 2048},
        "cluster": {"name": "c", "node_groups": [
            {"name": "fast", "count": 1, "gpus_per_node": 4, "device": {**FAST_GPU, "memory_GB": 6}},
            {"name": "slow", "count": 1, "gpus_per_node": 4, "device": {**SMALL_GPU, "memory_GB": 6}}]},
    })
    assert set(result.best.stage_groups) == {"fast", "slow"}


@pytest.mark.slow
def test_pools_that_do_and_do_not_overlap_gradient_reduction_match_brute_force():
    # The slow pool is of the cpu family: its DP all-reduce cannot hide behind its backward
    # (comm_overlap_fraction 0) while the fast pool's can, so the split model's exposed-sync
    # terms differ per pool.  The optimum is a data-parallel pipeline over both pools.
    result = _check({
        "model": GPT_WIDE,
        "training": {"global_batch_size": 32, "sequence_length": 2048},
        "cluster": {"name": "c", "node_groups": [
            {"name": "fast", "count": 1, "gpus_per_node": 4, "device": {**FAST_GPU, "memory_GB": 10}},
            {"name": "cpu-like", "count": 1, "gpus_per_node": 4, "device": {**SMALL_GPU, "name": "cpu-like", "family": "cpu", "memory_GB": 10}}]},
    })
    assert set(result.best.stage_groups) == {"fast", "cpu-like"} and result.best.strategy.dp > 1
