"""ONNX import: the four model families import and plan; symbolic dims survive computed reshapes;
external data is referenced by path and never read; bad files get clear errors fast."""

from __future__ import annotations

import os
import time

import pytest

from cost_model import Training, cluster_from_dict, simple_cluster
from cost_model.errors import InvalidGraph
from cost_model.graph.ir import MAX_OPS
from cost_model.graph.parse import graph_from_dict
from helpers.graphs import four_onnx_models, gpt_onnx
from planner_service.importers.onnx import (
    count_onnx_nodes,
    load_onnx_bytes,
    load_onnx_graph,
)
from planner_service.planner.graph.search import plan_graph


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory):
    return four_onnx_models(str(tmp_path_factory.mktemp("onnx")))


CASES = {
    "mlp": (Training(4096, 1), simple_cluster("A100-SXM4-80GB", 1)),
    "resnet": (Training(512, 1), simple_cluster("A100-SXM4-80GB", 1)),
    "gpt": (Training(64, 256), simple_cluster("A100-SXM4-80GB", 1)),
    "rec": (Training(65536, 1), simple_cluster("A100-SXM4-80GB", 1)),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_the_four_onnx_models_import_and_plan(onnx_dir, kind):
    data = load_onnx_graph(onnx_dir[kind])
    graph = graph_from_dict(data)
    training, cluster = CASES[kind]
    out = plan_graph(graph, training, cluster, None, top_k=1, time_limit_s=6).to_dict()
    assert out["best"]["prediction"]["fits"]
    assert set(out["best"]["strategy"]["op_shardings"]) == {op.name for op in graph.ops}
    assert str(graph.tensors[graph.inputs[0]].shape[0]) == "batch"


def test_weights_become_parameters_with_their_shapes(onnx_dir):
    g = graph_from_dict(load_onnx_graph(onnx_dir["mlp"]))
    assert g.total_params() == (784 * 256 + 256) + (256 * 256 + 256) + (256 * 10 + 10)
    r = graph_from_dict(load_onnx_graph(onnx_dir["resnet"]))
    convs = [op for op in r.ops if op.type == "Conv"]
    assert convs and all(op.param("weight") is not None for op in convs)
    assert r.bind(8, 1)[r.ops[-1].inputs[0]][0] == 8


def test_computed_reshapes_keep_batch_and_sequence_symbolic(onnx_dir):
    data = load_onnx_graph(onnx_dir["gpt"])
    merge = next(op for op in data["ops"] if op["name"] == "h0.merge")
    assert merge["attrs"]["shape"] == ["batch", "seq", 128]  # from Shape → Gather → Concat
    g = graph_from_dict(data)
    assert g.bind(3, 64)["h0.ctx2"] == (3, 64, 128)
    attn = next(op for op in g.ops if op.type == "Attention")
    assert attn.attr("num_heads") == 4 and attn.attr("causal") == 1
    assert {op.type for op in g.ops} >= {"Embedding", "LayerNorm", "MatMul", "Split", "Attention", "Gelu", "CrossEntropy"}


def test_external_data_is_referenced_by_path_and_never_read(onnx_dir):
    path = onnx_dir["rec"]
    tables = path + ".tables"
    assert os.path.getsize(tables) == 4 * 40_000_000 * 128 * 4  # 82 GB declared ...
    assert os.stat(tables).st_blocks * 512 < 1e6  # ... and sparse: nothing on disk
    g = graph_from_dict(load_onnx_graph(path))
    embeddings = [op for op in g.ops if op.type == "Embedding"]
    assert len(embeddings) == 4 and all(op.param("weight").shape == (40_000_000, 128) for op in embeddings)
    assert g.total_params() > 20e9


def test_gpt_with_weights_in_external_data(tmp_path):
    path = gpt_onnx(str(tmp_path / "gpt.onnx"), layers=1, hidden=64, heads=2, vocab=500, positions=64, external_data=True)
    assert os.path.exists(tmp_path / "gpt.data")
    g = graph_from_dict(load_onnx_graph(path))
    assert g.total_params() > 500 * 64


def test_unsupported_operators_are_reported_together(tmp_path):
    from onnx import TensorProto, helper

    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk1"),
             helper.make_node("NonZero", ["x"], ["nz"], name="nz1"),
             helper.make_node("TopK", ["x", "k"], ["v2", "i2"], name="topk2")]
    g = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
                          [helper.make_tensor_value_info("v", TensorProto.FLOAT, None)],
                          [helper.make_tensor("k", TensorProto.INT64, [1], [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidGraph) as ei:
        load_onnx_bytes(model.SerializeToString())
    msg = ei.value.message
    assert "3 ONNX node(s) of unsupported operator types" in msg
    assert "TopK ×2 (topk1, topk2)" in msg and "NonZero ×1 (nz1)" in msg


def test_garbage_and_empty_files_are_refused(tmp_path):
    with pytest.raises(InvalidGraph):
        load_onnx_bytes(b"")
    with pytest.raises(InvalidGraph):
        load_onnx_bytes(b"\xff\xff\xff\xff not a protobuf")
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    with pytest.raises(InvalidGraph):
        load_onnx_graph(str(p))
    with pytest.raises(InvalidGraph):
        load_onnx_graph(str(tmp_path / "missing.onnx"))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


@pytest.mark.slow  # wall-clock sensitive: compares two timings on a possibly busy host
def test_a_ten_million_node_file_is_refused_before_parsing(tmp_path):
    body = b"\x0a\x00" * 10_000_000  # GraphProto.node × 10M (empty NodeProto each)
    blob = b"\x08\x08" + b"\x3a" + _varint(len(body)) + body  # ir_version, then ModelProto.graph
    assert count_onnx_nodes(blob, limit=MAX_OPS) == MAX_OPS + 1  # stops right after the limit
    t0 = time.perf_counter()
    with pytest.raises(InvalidGraph) as ei:
        load_onnx_bytes(blob)
    elapsed = time.perf_counter() - t0
    assert f"more than {MAX_OPS} nodes" in ei.value.message
    small = b"\x0a\x00" * 1000
    t1 = time.perf_counter()
    count_onnx_nodes(b"\x3a" + _varint(len(small)) + small, limit=MAX_OPS)
    per_node = (time.perf_counter() - t1) / 1000
    assert elapsed < 5 * per_node * MAX_OPS + 1.0  # scanned up to the limit, never parsed
    path = tmp_path / "huge.onnx"
    path.write_bytes(blob)
    with pytest.raises(InvalidGraph):
        load_onnx_graph(str(path))


def test_extra_symbolic_dims_must_be_bound(tmp_path):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.zeros((16, 4), dtype=np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "seq", "experts", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    blob = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(InvalidGraph) as ei:
        load_onnx_bytes(blob)
    assert "'experts'" in ei.value.message and "dims" in ei.value.message
    data = load_onnx_bytes(blob, dims={"experts": 8})
    graph = graph_from_dict(data)
    assert graph.bind(2, 5)["y"] == (2, 5, 8, 4)


def test_cpu_nodes_host_the_onnx_recommender_tables(onnx_dir):
    g = graph_from_dict(load_onnx_graph(onnx_dir["rec"]))
    cluster = cluster_from_dict({"name": "c", "node_groups": [
        {"name": "gpu", "count": 1, "gpus_per_node": 4, "device": "A100-SXM4-40GB"},
        {"name": "ps", "count": 8, "gpus_per_node": 1, "inter_node_bandwidth_GBps": 25.0,
         "device": {"name": "cpu-host", "family": "cpu", "memory_GB": 512, "memory_bandwidth_GBps": 200, "fp32_tflops": 3}},
    ]})
    out = plan_graph(g, Training(65536, 1), cluster, None, top_k=0, time_limit_s=6).to_dict()
    shard = out["best"]["strategy"]["op_shardings"]
    assert all(shard[f"table{i}"] == "embedding_on_cpu" for i in range(4))
