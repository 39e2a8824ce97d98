"""Model builders for the graph tests and ``bench/graph_bench.py``: operator-graph JSON and ONNX
files made with ``onnx.helper`` directly (no torch)."""

from __future__ import annotations

from typing import Any


def gpt_graph(layers: int = 2, hidden: int = 256, heads: int = 4, vocab: int = 1024, positions: int = 2048,
              ffn: int | None = None, name: str = "gpt") -> dict[str, Any]:
    """A GPT (pre-LN, learned positions, GELU MLP, biases, dropout, untied head) as graph JSON."""
    h = hidden
    f = ffn or 4 * h
    ops: list[dict[str, Any]] = [
        {"name": "wte", "type": "Embedding", "inputs": ["input_ids"], "outputs": ["tok"], "params": {"weight": [vocab, h]}},
        {"name": "wpe", "type": "Embedding", "inputs": ["position_ids"], "outputs": ["pos"], "params": {"weight": [positions, h]}},
        {"name": "embed_add", "type": "Add", "inputs": ["tok", "pos"], "outputs": ["emb"]},
        {"name": "embed_drop", "type": "Dropout", "inputs": ["emb"], "outputs": ["x0"]},
    ]
    x = "x0"
    for i in range(layers):
        p = f"h{i}."
        ops += [
            {"name": p + "ln1", "type": "LayerNorm", "inputs": [x], "outputs": [p + "ln1"], "params": {"scale": [h], "bias": [h]}},
            {"name": p + "qkv", "type": "MatMul", "inputs": [p + "ln1"], "outputs": [p + "qkv"], "params": {"weight": [h, 3 * h], "bias": [3 * h]}},
            {"name": p + "split", "type": "Split", "inputs": [p + "qkv"], "outputs": [p + "q", p + "k", p + "v"], "attrs": {"axis": -1}},
            {"name": p + "attn", "type": "Attention", "inputs": [p + "q", p + "k", p + "v"], "outputs": [p + "ctx"],
             "attrs": {"num_heads": heads, "causal": 1}},
            {"name": p + "proj", "type": "MatMul", "inputs": [p + "ctx"], "outputs": [p + "proj"], "params": {"weight": [h, h], "bias": [h]}},
            {"name": p + "drop1", "type": "Dropout", "inputs": [p + "proj"], "outputs": [p + "d1"]},
            {"name": p + "res1", "type": "Add", "inputs": [x, p + "d1"], "outputs": [p + "r1"]},
            {"name": p + "ln2", "type": "LayerNorm", "inputs": [p + "r1"], "outputs": [p + "ln2"], "params": {"scale": [h], "bias": [h]}},
            {"name": p + "fc1", "type": "MatMul", "inputs": [p + "ln2"], "outputs": [p + "fc1"], "params": {"weight": [h, f], "bias": [f]}},
            {"name": p + "gelu", "type": "Gelu", "inputs": [p + "fc1"], "outputs": [p + "act"]},
            {"name": p + "fc2", "type": "MatMul", "inputs": [p + "act"], "outputs": [p + "fc2"], "params": {"weight": [f, h], "bias": [h]}},
            {"name": p + "drop2", "type": "Dropout", "inputs": [p + "fc2"], "outputs": [p + "d2"]},
            {"name": p + "res2", "type": "Add", "inputs": [p + "r1", p + "d2"], "outputs": [p + "out"]},
        ]
        x = p + "out"
    ops += [
        {"name": "ln_f", "type": "LayerNorm", "inputs": [x], "outputs": ["lnf"], "params": {"scale": [h], "bias": [h]}},
        {"name": "lm_head", "type": "MatMul", "inputs": ["lnf"], "outputs": ["logits"], "params": {"weight": [h, vocab]}},
        {"name": "loss", "type": "CrossEntropy", "inputs": ["logits", "labels"], "outputs": ["loss"]},
    ]
    return {
        "name": name,
        "inputs": [
            {"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64"},
            {"name": "position_ids", "shape": ["batch", "seq"], "dtype": "int64"},
            {"name": "labels", "shape": ["batch", "seq"], "dtype": "int64"},
        ],
        "ops": ops,
        "outputs": ["loss"],
    }


def megatron_shardings(layers: int) -> dict[str, str]:
    """Megatron-LM tensor parallelism (no sequence parallelism) for :func:`gpt_graph`:
    column-parallel QKV and FC1, row-parallel projection and FC2, heads split, vocab-parallel
    embedding, head and loss; everything else replicated over the TP ranks."""
    out = {"wte": "shard_embedding_rows", "wpe": "replicate", "embed_add": "replicate", "embed_drop": "replicate",
           "ln_f": "replicate", "lm_head": "split_weight_cols", "loss": "split_vocab"}
    for i in range(layers):
        p = f"h{i}."
        out.update({p + "ln1": "replicate", p + "qkv": "split_weight_cols", p + "split": "split_dim2",
                    p + "attn": "split_heads", p + "proj": "split_weight_rows", p + "drop1": "replicate",
                    p + "res1": "replicate", p + "ln2": "replicate", p + "fc1": "split_weight_cols",
                    p + "gelu": "split_dim2", p + "fc2": "split_weight_rows", p + "drop2": "replicate",
                    p + "res2": "replicate"})
    return out


def synthetic_graph(num_ops: int = 5000, hidden: int = 1024, seed: int = 0) -> dict[str, Any]:
    """A deterministic random DAG of about ``num_ops`` operators: residual blocks of norms,
    GEMMs, activations, gates and skip connections (a stand-in for an exported model with many
    small operators)."""
    import random

    rnd = random.Random(seed)
    h = hidden
    ops: list[dict[str, Any]] = []
    x = "x"
    i = 0
    while len(ops) < num_ops - 3:
        p = f"b{i}."
        w = rnd.choice([h, 2 * h, 4 * h])
        act = rnd.choice(["Relu", "Gelu", "Silu", "Tanh"])
        block = [
            {"name": p + "norm", "type": rnd.choice(["LayerNorm", "RMSNorm"]), "inputs": [x], "outputs": [p + "n"], "params": {"scale": [h]}},
            {"name": p + "up", "type": "MatMul", "inputs": [p + "n"], "outputs": [p + "u"], "params": {"weight": [h, w]}},
            {"name": p + "act", "type": act, "inputs": [p + "u"], "outputs": [p + "a"]},
        ]
        if rnd.random() < 0.5:
            block += [
                {"name": p + "gate", "type": "MatMul", "inputs": [p + "n"], "outputs": [p + "g"], "params": {"weight": [h, w]}},
                {"name": p + "sig", "type": "Sigmoid", "inputs": [p + "g"], "outputs": [p + "gs"]},
                {"name": p + "mul", "type": "Mul", "inputs": [p + "a", p + "gs"], "outputs": [p + "m"]},
            ]
            mid = p + "m"
        else:
            mid = p + "a"
        block += [
            {"name": p + "down", "type": "MatMul", "inputs": [mid], "outputs": [p + "d"], "params": {"weight": [w, h]}},
            {"name": p + "scale", "type": "Mul", "inputs": [p + "d"], "outputs": [p + "s"], "params": {"gamma": [h]}},
            {"name": p + "drop", "type": "Dropout", "inputs": [p + "s"], "outputs": [p + "dr"]},
            {"name": p + "res", "type": "Add", "inputs": [x, p + "dr"], "outputs": [p + "out"]},
        ]
        ops += block
        x = p + "out"
        i += 1
    ops += [
        {"name": "final_norm", "type": "LayerNorm", "inputs": [x], "outputs": ["fn"], "params": {"scale": [h]}},
        {"name": "classifier", "type": "MatMul", "inputs": ["fn"], "outputs": ["logits"], "params": {"weight": [h, 1000]}},
        {"name": "loss", "type": "CrossEntropy", "inputs": ["logits", "labels"], "outputs": ["loss"]},
    ]
    return {
        "name": f"synthetic-{len(ops)}",
        "inputs": [{"name": "x", "shape": ["batch", "seq", h]}, {"name": "labels", "shape": ["batch", "seq"], "dtype": "int64"}],
        "ops": ops,
        "outputs": ["loss"],
    }


def recommender_graph(num_tables: int = 4, rows: int = 10_000_000, dim: int = 128, lookups: int = 1,
                      dense_features: int = 13, name: str = "dlrm") -> dict[str, Any]:
    """A DLRM-style recommender: embedding-bag tables (declared by shape, nothing materialised),
    a bottom MLP on dense features, concatenation and a top MLP with a 2-class loss."""
    ops: list[dict[str, Any]] = [
        {"name": "bot1", "type": "MatMul", "inputs": ["dense"], "outputs": ["b1"], "params": {"weight": [dense_features, 512], "bias": [512]}},
        {"name": "bot1_relu", "type": "Relu", "inputs": ["b1"], "outputs": ["b1r"]},
        {"name": "bot2", "type": "MatMul", "inputs": ["b1r"], "outputs": ["b2"], "params": {"weight": [512, dim], "bias": [dim]}},
        {"name": "bot2_relu", "type": "Relu", "inputs": ["b2"], "outputs": ["b2r"]},
    ]
    inputs = [{"name": "dense", "shape": ["batch", dense_features]}, {"name": "label", "shape": ["batch"], "dtype": "int64"}]
    feats = ["b2r"]
    for i in range(num_tables):
        inputs.append({"name": f"ids{i}", "shape": ["batch", lookups], "dtype": "int64"})
        ops.append({"name": f"table{i}", "type": "EmbeddingBag", "inputs": [f"ids{i}"], "outputs": [f"e{i}"],
                    "params": {"weight": [rows, dim]}, "attrs": {"mode": "sum"}})
        feats.append(f"e{i}")
    width = dim * (num_tables + 1)
    ops += [
        {"name": "interact", "type": "Concat", "inputs": feats, "outputs": ["z"], "attrs": {"axis": 1}},
        {"name": "top1", "type": "MatMul", "inputs": ["z"], "outputs": ["t1"], "params": {"weight": [width, 1024], "bias": [1024]}},
        {"name": "top1_relu", "type": "Relu", "inputs": ["t1"], "outputs": ["t1r"]},
        {"name": "top2", "type": "MatMul", "inputs": ["t1r"], "outputs": ["t2"], "params": {"weight": [1024, 512], "bias": [512]}},
        {"name": "top2_relu", "type": "Relu", "inputs": ["t2"], "outputs": ["t2r"]},
        {"name": "top3", "type": "MatMul", "inputs": ["t2r"], "outputs": ["logits"], "params": {"weight": [512, 2], "bias": [2]}},
        {"name": "loss", "type": "CrossEntropy", "inputs": ["logits", "label"], "outputs": ["loss"]},
    ]
    return {"name": name, "inputs": inputs, "ops": ops, "outputs": ["loss"]}


def cpu_group(count: int, memory_GB: float = 512.0, name: str = "cpu") -> dict[str, Any]:
    """A node group of CPU parameter-server hosts (inline device, family "cpu")."""
    return {"name": name, "count": count, "gpus_per_node": 1, "inter_node_bandwidth_GBps": 25.0,
            "device": {"name": "xeon-ps", "family": "cpu", "kind": "cpu", "memory_GB": memory_GB,
                       "memory_bandwidth_GBps": 200.0, "fp32_tflops": 3.0, "cores": 64}}
