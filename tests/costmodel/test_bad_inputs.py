"""At least 20 invalid strategies, models, trainings and clusters: each a typed error naming the
field and the reason, never a traceback."""

import pytest

from cost_model import estimate
from cost_model.errors import PlannerError
from planner_service.planner.request import parse_estimate_request

GOOD = {
    "model": {"preset": "llama3-8b"},
    "training": {"global_batch_size": 64, "sequence_length": 4096},
    "cluster": {"name": "c", "node_groups": [{"name": "h", "count": 2, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]},
    "strategy": {"dp": 4, "tp": 4, "pp": 1, "micro_batch_size": 1},
}


def with_(path, value):
    import copy

    body = copy.deepcopy(GOOD)
    cur = body
    keys = path.split(".")
    for k in keys[:-1]:
        cur = cur[int(k)] if isinstance(cur, list) else cur[k]
    last = keys[-1]
    if isinstance(cur, list):
        cur[int(last)] = value
    elif value is ...:
        cur.pop(last)
    else:
        cur[last] = value
    return body


CASES = [
    (with_("strategy.tp", 3), "strategy.tp", "does not divide the 32 attention heads"),
    (with_("strategy.tp", 0), "strategy.tp", "positive integer"),
    (with_("strategy.tp", "8"), "strategy.tp", "positive integer"),
    (with_("strategy.pp", 64), "strategy.pp", "exceeds"),
    (with_("strategy.dp", 8), "strategy.dp", "cluster has 16"),
    (with_("strategy.micro_batch_size", 3), "strategy.micro_batch_size", "not divisible"),
    (with_("strategy.cp", 3), "strategy.cp", "sequence_length"),
    (with_("strategy.ep", 2), "strategy.ep", "mixture-of-experts"),
    (with_("strategy.recompute", "some"), "strategy.recompute", "one of"),
    (with_("strategy.zero_stage", 4), "strategy.zero_stage", "0, 1, 2 or 3"),
    ({**GOOD, "strategy": {"dp": 2, "tp": 4, "pp": 2, "layers_per_stage": [10, 10]}}, "strategy.layers_per_stage", "sums to 20"),
    ({**GOOD, "strategy": {"dp": 2, "tp": 4, "pp": 2, "layers_per_stage": [16, 8, 8]}}, "strategy.layers_per_stage", "3 entries"),
    ({**GOOD, "strategy": {"dp": 2, "tp": 4, "pp": 2, "vpp": 17}}, "strategy.pp", "every chunk needs a decoder layer"),
    ({**GOOD, "strategy": {"dp": 16, "vpp": 2}}, "strategy.vpp", "needs pp > 1"),
    ({**GOOD, "strategy": {"dp": 4, "tp": 4, "zero_stage": 3, "pp": 1, "bogus": 1}}, "strategy.bogus", "unknown strategy fields"),
    ({**GOOD, "strategy": {"dp": 2, "tp": 4, "pp": 2, "zero_stage": 3}}, "strategy.zero_stage", "pipeline"),
    (with_("model", {"preset": "gpt-9"}), "model.preset", "unknown preset"),
    (with_("model", {"preset": "llama3-8b", "transformer": {}}), "model", "exactly one"),
    (with_("model", {"transformer": {"hidden_size": 64}}), "model.transformer.num_hidden_layers", "required"),
    (with_("training.global_batch_size", 0), "training.global_batch_size", "positive integer"),
    (with_("training.sequence_length", ...), "training.sequence_length", "required"),
    (with_("training.dtype", "int4"), "training.dtype", "one of"),
    (with_("training.optimizer", "lamb"), "training.optimizer", "one of"),
    (with_("training.fused_kernels", "no"), "training.fused_kernels", "true or false"),
    # a field the cost model neither prices nor refuses by name would be dropped without a word
    (with_("training.offload_optimizer", "cpu"), "training.offload_optimizer", "optimizer_offload_fraction"),
    (with_("training.offload_optimiser", "cpu"), "training.offload_optimiser", "unknown training field"),
    (with_("cluster.node_groups.0.device", "TPU-v5"), "cluster.node_groups[0].device", "unknown device"),
    (with_("cluster.node_groups.0.count", 0), "cluster.node_groups[0].count", "positive integer"),
    (with_("cluster.node_groups.0.intra_node_bandwidth_GBps", -5), "cluster.node_groups[0].intra_node_bandwidth_GBps", "positive"),
    (with_("cluster.node_groups", []), "cluster.node_groups", "non-empty"),
    (with_("cluster.nodes", [{"hostname": "nope", "available": False}]), "cluster.nodes[0].hostname", "in no node group"),
    (with_("cluster.nodes", [{"hostname": "h-0", "available": False}, {"hostname": "h-1", "available": False}]), "cluster.nodes", "unavailable"),
    (with_("cluster.node_groups.0.device", {"name": "x", "memory_GB": 80}), "cluster.node_groups[0].device.memory_bandwidth_GBps", "positive"),
    (with_("training.dtype", "fp8") | {"cluster": {"name": "c", "node_groups": [{"name": "a", "count": 2, "device": "A100-SXM4-80GB"}]}}, "training.dtype", "no fp8 peak"),
]


@pytest.mark.parametrize("body, field, reason", CASES, ids=[c[1] + ":" + c[2][:20] for c in CASES])
def test_bad_input_names_field_and_reason(body, field, reason):
    with pytest.raises(PlannerError) as e:
        req = parse_estimate_request(body)
        estimate(req.model, req.training, req.cluster, req.strategy)
    assert e.value.field == field, e.value.to_dict()
    assert reason in e.value.message, e.value.message


def test_table_is_large_enough():
    assert len(CASES) >= 20


def test_pp_that_does_not_divide_the_layers_is_costed_with_the_near_even_split_and_says_so(client):
    """A layout every framework runs (Megatron-Core through --pipeline-model-parallel-layout, the
    others' own splitters) is costed, not refused: pp=5 over 32 layers takes 7, 7, 6, 6, 6 and
    the answer names the split; a given layers_per_stage is costed as given, silently."""
    body = {**GOOD, "strategy": {"dp": 2, "tp": 1, "pp": 5, "micro_batch_size": 1}, "cluster": {
        "name": "c", "node_groups": [{"name": "h", "count": 2, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]}}
    req = parse_estimate_request(body)
    est = estimate(req.model, req.training, req.cluster, req.strategy)
    assert [st.last_layer - st.first_layer + 1 for st in est.stages] == [7, 7, 6, 6, 6]
    assert any("near-even split [7, 7, 6, 6, 6]" in w for w in est.warnings), est.warnings
    given = parse_estimate_request({**body, "strategy": {**body["strategy"], "layers_per_stage": [6, 6, 6, 7, 7]}})
    est2 = estimate(given.model, given.training, given.cluster, given.strategy)
    assert not any("near-even" in w for w in est2.warnings) and est2.step_time_s > 0
    resp = client.post("/v1/estimate", json=body)
    assert resp.status_code == 200, resp.text
    assert any("near-even split" in w for w in resp.json()["warnings"])
    # so are the interleaved schedule's model chunks (Megatron-MoE's DeepSeek-V3 and Qwen3 layouts: pp·vpp = 32 over 61
    # and 94 layers), chunk by chunk in model order; more chunks than layers leave a chunk without one
    inter = parse_estimate_request({**body, "strategy": {"dp": 2, "tp": 4, "pp": 2, "vpp": 3}})
    est3 = estimate(inter.model, inter.training, inter.cluster, inter.strategy)
    assert any("pp·vpp = 2·3 = 6 does not divide the 32 layers" in w and "[6, 6, 5, 5, 5, 5]" in w for w in est3.warnings), est3.warnings
    assert sorted(b - a + 1 for st in est3.stages for a, b in st.layer_ranges) == [5, 5, 5, 5, 6, 6]
    with pytest.raises(PlannerError) as e:
        bad = parse_estimate_request({**body, "strategy": {"dp": 2, "tp": 4, "pp": 2, "vpp": 17}})
        estimate(bad.model, bad.training, bad.cluster, bad.strategy)
    assert e.value.field == "strategy.pp" and "every chunk needs a decoder layer" in e.value.message
