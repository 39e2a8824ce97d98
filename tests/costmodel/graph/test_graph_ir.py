"""Operator-graph IR: parsing, symbolic shapes, validation errors, per-op FLOPs/bytes/memory."""

from __future__ import annotations

import copy

import pytest

from cost_model.errors import InvalidGraph
from cost_model.graph.ir import MAX_OPS, Dim, parse_dim
from cost_model.graph.op_cost import graph_op_costs
from cost_model.graph.parse import graph_from_dict
from cost_model.transformer.spec import model_from_dict
from helpers.graphs import gpt_graph


def _mlp(**over):
    g = {
        "name": "tiny",
        "inputs": [{"name": "x", "shape": ["batch", "seq", 64]}],
        "ops": [
            {"name": "fc1", "type": "MatMul", "inputs": ["x"], "outputs": ["h"], "params": {"weight": [64, 256], "bias": [256]}},
            {"name": "act", "type": "Gelu", "inputs": ["h"], "outputs": ["a"]},
            {"name": "fc2", "type": "MatMul", "inputs": ["a"], "outputs": ["y"], "params": {"weight": [256, 64]}},
        ],
    }
    g.update(over)
    return g


def test_shapes_are_inferred_symbolically_and_bound_from_batch_and_seq():
    g = graph_from_dict(_mlp())
    assert [str(d) for d in g.tensors["y"].shape] == ["batch", "seq", "64"]
    shapes = g.bind(batch=4, seq=128)
    assert shapes["h"] == (4, 128, 256)
    assert g.outputs == ("y",)
    assert g.total_params() == 64 * 256 + 256 + 256 * 64


def test_products_of_symbols_and_named_dims():
    assert parse_dim("batch*seq", {}, "f") == Dim(1, ("batch", "seq"))
    assert parse_dim("4*hidden", {"hidden": 8}, "f") == Dim(32)
    g = graph_from_dict({
        "dims": {"hidden": 64},
        "inputs": [{"name": "x", "shape": ["batch", "seq", "hidden"]}],
        "ops": [
            {"name": "flat", "type": "Reshape", "inputs": ["x"], "outputs": ["f"], "attrs": {"shape": [-1, "hidden"]}},
            {"name": "fc", "type": "MatMul", "inputs": ["f"], "outputs": [{"name": "y", "shape": ["batch*seq", 16]}],
             "params": {"weight": [64, 16]}},
        ],
    })
    assert str(g.tensors["f"].shape[0]) == "batch*seq"


def test_forward_flops_bytes_and_backward_of_a_gemm():
    g = graph_from_dict(_mlp())
    c = graph_op_costs(g, batch=2, seq=8, dtype="bf16")[0]
    m, k, n = 16, 64, 256
    assert c.fwd_flops == 2 * m * n * k
    assert c.bwd_flops == 2 * c.fwd_flops  # dX and dW
    assert c.fwd_bytes == (m * k + k * n + m * n) * 2
    assert c.params == 64 * 256 + 256
    assert c.saved_inputs == (0,)


def test_conv_with_groups_attention_pooling_and_zero_flop_layout_ops():
    g = graph_from_dict({
        "inputs": [{"name": "img", "shape": ["batch", 32, 56, 56]}, {"name": "q", "shape": ["batch", 4, 256]}],
        "ops": [
            {"name": "dw", "type": "Conv", "inputs": ["img"], "outputs": ["c"], "params": {"weight": [32, 1, 3, 3]},
             "attrs": {"group": 32, "pads": [1, 1, 1, 1]}},
            {"name": "pw", "type": "Conv2d", "inputs": ["c"], "outputs": ["d"], "params": {"weight": [64, 32, 1, 1]},
             "attrs": {"strides": [2, 2]}},
            {"name": "pool", "type": "MaxPool", "inputs": ["d"], "outputs": ["p"], "attrs": {"kernel_shape": [2, 2], "strides": [2, 2]}},
            {"name": "gap", "type": "GlobalAveragePool", "inputs": ["p"], "outputs": ["gp"]},
            {"name": "attn", "type": "Attention", "inputs": ["q", "q", "q"], "outputs": ["o"], "attrs": {"num_heads": 4, "causal": 1}},
            {"name": "t", "type": "Transpose", "inputs": ["o"], "outputs": ["ot"], "attrs": {"perm": [0, 2, 1]}},
            {"name": "r", "type": "Reshape", "inputs": ["ot"], "outputs": ["or"], "attrs": {"shape": [0, -1]}},
            {"name": "proj", "type": "MatMul", "inputs": ["or"], "outputs": ["z"], "params": {"weight": [1024, 8]}},
        ],
    })
    assert g.bind(2, 4)["d"] == (2, 64, 28, 28)
    assert g.bind(2, 4)["p"] == (2, 64, 14, 14)
    assert g.bind(2, 4)["gp"] == (2, 64, 1, 1)
    costs = {op.name: c for op, c in zip(g.ops, graph_op_costs(g, 2, 4, "bf16"), strict=True)}
    assert costs["dw"].fwd_flops == 2 * (2 * 56 * 56) * 32 * 9  # depthwise: one channel per group
    assert costs["pw"].fwd_flops == 2 * (2 * 28 * 28) * 64 * 32
    assert costs["attn"].fwd_flops == 4 * 2 * 4 * 4 * 4 * 64  # 4·b·heads·s·s·d
    assert costs["r"].fwd_flops == costs["r"].fwd_bytes == 0  # a view
    assert costs["t"].fwd_flops == 0 and costs["t"].fwd_bytes > 0  # a copy


def test_gpt_layer_saves_korthikanti_34sbh_plus_attention_state():
    h, s, b = 256, 128, 2
    g = graph_from_dict(gpt_graph(layers=1, hidden=h, heads=4, vocab=512, positions=s))
    costs = graph_op_costs(g, b, s, "bf16")
    layer = [i for i, op in enumerate(g.ops) if op.name.startswith("h0.")]
    saved_tensors = set()
    extra = 0.0
    for i in layer:
        op = g.ops[i]
        for j in costs[i].saved_inputs:
            saved_tensors.add(op.inputs[j])
        extra += costs[i].extra_saved_bytes
    shapes = g.bind(b, s)
    tensor_bytes = sum(2 * __import__("math").prod(shapes[t]) for t in saved_tensors)
    masks = 2 * s * b * h  # two dropout masks of 1 byte
    attn_state = extra - masks
    # Korthikanti et al. 2022 Table 2: norms 4, attention 11 (QKV input 2, Q K V 6, projection
    # input 2, dropout mask 1), MLP 19 (FC1 input 2, GELU input 8, FC2 input 8, mask 1) → 34·s·b·h;
    # the 5·a·s²·b score terms vanish with fused attention, which keeps its output and fp32 row
    # statistics instead.
    assert tensor_bytes + masks == 34 * s * b * h
    assert 0 < attn_state <= 3 * s * b * h


def test_custom_operator_needs_flops_and_bytes_and_output_shapes():
    base = _mlp()
    base["ops"].append({"name": "mine", "type": "FancyThing", "inputs": ["y"], "outputs": [{"name": "z", "shape": ["batch", "seq", 8]}],
                        "flops": 1e6, "bytes": 2e4})
    g = graph_from_dict(base)
    c = graph_op_costs(g, 3, 16, "bf16")[-1]
    assert c.fwd_flops == 3e6 and c.fwd_bytes == 6e4  # per sample × batch


def _err(data) -> InvalidGraph:
    with pytest.raises(InvalidGraph) as ei:
        graph_from_dict(data)
    return ei.value


BAD = [
    # (mutation, expected words in the message, expected field prefix)
    (lambda g: g["ops"].reverse(), "before it is produced", "model.graph.ops[0].inputs[0]"),
    (lambda g: g["ops"][1].update(inputs=["nowhere"]), "dangling", "model.graph.ops[1].inputs[0]"),
    (lambda g: g["ops"][2]["params"].update(weight=[128, 64]), "inner dimension", "model.graph.ops[2]"),
    (lambda g: g["ops"][0].update(outputs=[{"name": "h", "shape": ["batch", "seq", 255]}]), "declares", "model.graph.ops[0].outputs[0].shape"),
    (lambda g: g["ops"][1].update(outputs=["h"]), "defined twice", "model.graph.ops[1].outputs[0]"),
    (lambda g: g["ops"][1].update(name="fc1"), "duplicate operator", "model.graph.ops[1].name"),
    (lambda g: g["inputs"][0].update(shape=["batch", "tokens", 64]), "unknown symbolic dimension 'tokens'", "model.graph.inputs[0].shape[1]"),
    (lambda g: g["inputs"][0].update(shape=["batch", 0, 64]), "between 1 and", "model.graph.inputs[0].shape[1]"),
    (lambda g: g["ops"][0]["params"].update(weight=[64, -2]), "positive integers", "model.graph.ops[0].params.weight[1]"),
    (lambda g: g.update(ops=[{"name": "r", "type": "Relu", "inputs": ["x"], "outputs": ["y"]}]), "no parameters", "model.graph.ops"),
    (lambda g: g.update(ops=[]), "non-empty list", "model.graph.ops"),
    (lambda g: g["ops"][1].update(type="Softmax", attrs={"axis": 5}), "out of range", "model.graph.ops[1]"),
    (lambda g: g["ops"].append({"name": "r", "type": "Reshape", "inputs": ["y"], "outputs": ["r"], "attrs": {"shape": [7, -1]}}),
     "not divisible", "model.graph.ops[3]"),
    (lambda g: g["ops"].append({"name": "c", "type": "Concat", "inputs": ["y", "h"], "outputs": ["c"], "attrs": {"axis": 0}}),
     "differ in dimension", "model.graph.ops[3]"),
    (lambda g: g["ops"].append({"name": "a", "type": "Add", "inputs": ["y", "h"], "outputs": ["c"]}), "do not broadcast", "model.graph.ops[3]"),
    (lambda g: g.update(outputs=["missing"]), "not a tensor", "model.graph.outputs[0]"),
]


@pytest.mark.parametrize("mutate,words,field", BAD, ids=[b[1] for b in BAD])
def test_malformed_graphs_get_clear_errors(mutate, words, field):
    g = copy.deepcopy(_mlp())
    mutate(g)
    e = _err(g)
    assert words in e.message
    assert e.field.startswith(field), e.field


def test_unsupported_operators_are_listed_together():
    g = _mlp()
    g["ops"] += [
        {"name": "u1", "type": "NonMaxSuppression", "inputs": ["y"], "outputs": ["u1"]},
        {"name": "u2", "type": "TopK", "inputs": ["y"], "outputs": ["u2"]},
        {"name": "u3", "type": "TopK", "inputs": ["y"], "outputs": ["u3"]},
    ]
    e = _err(g)
    assert "3 operator(s) of unsupported type" in e.message
    for name in ("u1 (NonMaxSuppression)", "u2 (TopK)", "u3 (TopK)"):
        assert name in e.message
    assert "flops" in e.message


def test_a_ten_million_node_body_is_refused_fast_without_building_anything(monkeypatch):
    """The size is checked before any per-op work: nothing is built (no wall-clock bound, which a
    busy host breaks; the builder is replaced by one that fails if it is ever constructed)."""
    import cost_model.graph.parse as parse

    def no_builder(*args: object, **kwargs: object) -> None:
        raise AssertionError("the graph builder ran on an oversized body")

    monkeypatch.setattr(parse, "_GraphBuilder", no_builder)
    op = {"name": "x", "type": "Relu", "inputs": ["a"], "outputs": ["b"]}
    e = _err({"inputs": [], "ops": [op] * 10_000_000})
    assert f"the limit is {MAX_OPS}" in e.message and e.field == "model.graph.ops"
    e = _err({"inputs": [{"name": "a", "shape": [1]}] * (MAX_OPS + 1), "ops": [op]})
    assert f"the limit is {MAX_OPS}" in e.message and e.field == "model.graph.inputs"


def test_model_from_dict_routes_graphs_and_names_them():
    spec = model_from_dict({"graph": _mlp(), "name": "renamed"})
    assert spec.name == "renamed" and spec.num_ops == 3
    with pytest.raises(InvalidGraph) as ei:
        model_from_dict({"graph": {"ops": "nope"}})
    assert ei.value.field == "model.graph.ops"


def test_round_trip_through_to_dict():
    g = graph_from_dict(gpt_graph(layers=2, hidden=64, heads=4, vocab=100, positions=32))
    again = graph_from_dict(g.to_dict())
    assert again.num_ops == g.num_ops and again.total_params() == g.total_params()
    assert again.bind(2, 16) == g.bind(2, 16)


def test_json_schema_describes_the_documents_the_validator_accepts():
    import jsonschema

    from cost_model.graph.parse import GRAPH_EXAMPLE, GRAPH_JSON_SCHEMA
    from helpers.graphs import recommender_graph, synthetic_graph

    for doc in (GRAPH_EXAMPLE, gpt_graph(layers=1, hidden=64, heads=2, vocab=100, positions=16),
                recommender_graph(num_tables=2, rows=100, dim=8), synthetic_graph(50)):
        jsonschema.validate(doc, GRAPH_JSON_SCHEMA)
        graph_from_dict(doc)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"ops": []}, GRAPH_JSON_SCHEMA)
