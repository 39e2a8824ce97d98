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


def llama_graph(layers: int = 2, hidden: int = 256, heads: int = 4, ffn: int = 688, vocab: int = 1024,
                name: str = "llama") -> dict[str, Any]:
    """A Llama-style decoder (RMSNorm, SwiGLU, no biases or dropout, untied head; no rotary
    embedding, which a graph spells as elementwise operators) as graph JSON."""
    h, f = hidden, ffn
    ops: list[dict[str, Any]] = [
        {"name": "embed", "type": "Embedding", "inputs": ["input_ids"], "outputs": ["x0"], "params": {"weight": [vocab, h]}},
    ]
    x = "x0"
    for i in range(layers):
        p = f"l{i}."
        ops += [
            {"name": p + "norm1", "type": "RMSNorm", "inputs": [x], "outputs": [p + "n1"], "params": {"scale": [h]}},
            *({"name": p + w, "type": "MatMul", "inputs": [p + "n1"], "outputs": [p + w], "params": {"weight": [h, h]}}
              for w in ("q", "k", "v")),
            {"name": p + "attn", "type": "Attention", "inputs": [p + "q", p + "k", p + "v"], "outputs": [p + "ctx"],
             "attrs": {"num_heads": heads, "causal": 1}},
            {"name": p + "o", "type": "MatMul", "inputs": [p + "ctx"], "outputs": [p + "o"], "params": {"weight": [h, h]}},
            {"name": p + "res1", "type": "Add", "inputs": [x, p + "o"], "outputs": [p + "r1"]},
            {"name": p + "norm2", "type": "RMSNorm", "inputs": [p + "r1"], "outputs": [p + "n2"], "params": {"scale": [h]}},
            {"name": p + "gate", "type": "MatMul", "inputs": [p + "n2"], "outputs": [p + "gate"], "params": {"weight": [h, f]}},
            {"name": p + "up", "type": "MatMul", "inputs": [p + "n2"], "outputs": [p + "up"], "params": {"weight": [h, f]}},
            {"name": p + "silu", "type": "Silu", "inputs": [p + "gate"], "outputs": [p + "act"]},
            {"name": p + "glu", "type": "Mul", "inputs": [p + "act", p + "up"], "outputs": [p + "glu"]},
            {"name": p + "down", "type": "MatMul", "inputs": [p + "glu"], "outputs": [p + "down"], "params": {"weight": [f, h]}},
            {"name": p + "res2", "type": "Add", "inputs": [p + "r1", p + "down"], "outputs": [p + "out"]},
        ]
        x = p + "out"
    ops += [
        {"name": "norm_f", "type": "RMSNorm", "inputs": [x], "outputs": ["nf"], "params": {"scale": [h]}},
        {"name": "lm_head", "type": "MatMul", "inputs": ["nf"], "outputs": ["logits"], "params": {"weight": [h, vocab]}},
        {"name": "loss", "type": "CrossEntropy", "inputs": ["logits", "labels"], "outputs": ["loss"]},
    ]
    return {"name": name, "inputs": [{"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64"},
                                     {"name": "labels", "shape": ["batch", "seq"], "dtype": "int64"}],
            "ops": ops, "outputs": ["loss"]}


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


# ---- ONNX models (onnx.helper, no torch) ----------------------------------------------------------
def _onnx():
    import onnx
    from onnx import TensorProto, helper

    return onnx, TensorProto, helper


def _init(name: str, shape, rng=None, dtype=None):
    """A small float initializer with real (deterministic) values."""
    import numpy as np
    from onnx import numpy_helper

    rng = rng or np.random.default_rng(0)
    arr = (rng.standard_normal(shape) * 0.02).astype(dtype or np.float32)
    return numpy_helper.from_array(arr, name)


def _save(model, path: str) -> str:
    import onnx

    onnx.save(model, path)
    return path


def mlp_onnx(path: str, layers: int = 4, width: int = 1024, in_features: int = 784, classes: int = 10) -> str:
    onnx, TP, h = _onnx()
    nodes, inits = [], []
    x = "input"
    d = in_features
    for i in range(layers):
        out = width if i < layers - 1 else classes
        inits += [_init(f"fc{i}.weight", (d, out)), _init(f"fc{i}.bias", (out,))]
        nodes += [h.make_node("MatMul", [x, f"fc{i}.weight"], [f"mm{i}"], name=f"fc{i}"),
                  h.make_node("Add", [f"mm{i}", f"fc{i}.bias"], [f"z{i}"], name=f"fc{i}.add")]
        x = f"z{i}"
        if i < layers - 1:
            nodes.append(h.make_node("Relu", [x], [f"a{i}"], name=f"relu{i}"))
            x = f"a{i}"
        d = out
    nodes.append(h.make_node("SoftmaxCrossEntropyLoss", [x, "labels"], ["loss"], name="loss", reduction="mean"))
    g = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("input", TP.FLOAT, ["batch_size", in_features]),
                                    h.make_tensor_value_info("labels", TP.INT64, ["batch_size"])],
                     [h.make_tensor_value_info("loss", TP.FLOAT, [])], inits)
    return _save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)


def resnet_onnx(path: str, blocks: tuple[int, ...] = (2, 2, 2, 2), width: int = 64, image: int = 224, classes: int = 1000) -> str:
    """A ResNet-18-style CNN: stem conv + BN + ReLU + max-pool, basic residual blocks with
    stride-2 downsampling (1×1 projection), global average pool, FC."""
    onnx, TP, h = _onnx()
    nodes, inits = [], []
    cnt = [0]

    def conv_bn(x, cin, cout, k, stride, relu=True):
        i = cnt[0]
        cnt[0] += 1
        inits.extend([_init(f"conv{i}.w", (cout, cin, k, k)), _init(f"bn{i}.scale", (cout,)), _init(f"bn{i}.bias", (cout,)),
                      _init(f"bn{i}.mean", (cout,)), _init(f"bn{i}.var", (cout,))])
        nodes.append(h.make_node("Conv", [x, f"conv{i}.w"], [f"c{i}"], name=f"conv{i}", kernel_shape=[k, k],
                                 strides=[stride, stride], pads=[k // 2] * 4))
        nodes.append(h.make_node("BatchNormalization", [f"c{i}", f"bn{i}.scale", f"bn{i}.bias", f"bn{i}.mean", f"bn{i}.var"],
                                 [f"n{i}"], name=f"bn{i}"))
        if relu:
            nodes.append(h.make_node("Relu", [f"n{i}"], [f"r{i}"], name=f"relu{i}"))
            return f"r{i}"
        return f"n{i}"

    x = conv_bn("image", 3, width, 7, 2)
    nodes.append(h.make_node("MaxPool", [x], ["pool0"], name="maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, c = "pool0", width
    for stage, n in enumerate(blocks):
        cout = width * 2 ** stage
        for b in range(n):
            stride = 2 if (b == 0 and stage > 0) else 1
            y = conv_bn(x, c, cout, 3, stride)
            y = conv_bn(y, cout, cout, 3, 1, relu=False)
            skip = conv_bn(x, c, cout, 1, stride, relu=False) if (stride != 1 or c != cout) else x
            nodes.append(h.make_node("Add", [y, skip], [f"s{stage}_{b}"], name=f"add{stage}_{b}"))
            nodes.append(h.make_node("Relu", [f"s{stage}_{b}"], [f"o{stage}_{b}"], name=f"out{stage}_{b}"))
            x, c = f"o{stage}_{b}", cout
    nodes.append(h.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(h.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1))
    inits += [_init("fc.w", (classes, c)), _init("fc.b", (classes,))]
    nodes.append(h.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc", transB=1))
    nodes.append(h.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"], name="loss"))
    g = h.make_graph(nodes, "resnet", [h.make_tensor_value_info("image", TP.FLOAT, ["N", 3, image, image]),
                                       h.make_tensor_value_info("labels", TP.INT64, ["N"])],
                     [h.make_tensor_value_info("loss", TP.FLOAT, [])], inits)
    return _save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)


def sparse_initializer(name: str, shape, data_file: str, offset: int):
    """A float32 initializer declared as external data at ``offset`` of ``data_file`` without
    writing its bytes (the caller truncates the file to the total length: a sparse file)."""
    import onnx

    t = onnx.TensorProto()
    t.name = name
    t.data_type = onnx.TensorProto.FLOAT
    t.dims.extend(list(shape))
    t.data_location = onnx.TensorProto.EXTERNAL
    length = 4
    for d in shape:
        length *= d
    for k, v in (("location", data_file), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t, length


def gpt_onnx(path: str, layers: int = 4, hidden: int = 768, heads: int = 12, vocab: int = 50257, positions: int = 1024,
             external_data: bool = False, sparse: bool = False) -> str:
    """A GPT block stack with the opset-23 Attention operator; reshapes computed from the input
    shape (Shape → Gather → Concat) as exporters emit them.  ``external_data``: weights saved
    to a side file; ``sparse``: weights declared in a sparse side file (nothing written —
    for billion-parameter benchmarks)."""
    onnx, TP, h = _onnx()
    H = hidden

    def W(name, shape):
        if not sparse:
            return _init(name, shape)
        t = onnx.TensorProto()  # dims only; turned into a sparse external reference below
        t.name = name
        t.data_type = TP.FLOAT
        t.dims.extend(list(shape))
        return t

    nodes, inits = [], []
    inits += [W("wte", (vocab, H)), W("wpe", (positions, H))]
    nodes += [h.make_node("Gather", ["wte", "input_ids"], ["tok"], name="wte"),
              h.make_node("Gather", ["wpe", "position_ids"], ["pos"], name="wpe"),
              h.make_node("Add", ["tok", "pos"], ["x0"], name="embed_add")]
    # dynamic shape plumbing: [batch, seq, H] from the input
    inits.append(onnx.numpy_helper.from_array(__import__("numpy").array([0], dtype="int64"), "idx0"))
    inits.append(onnx.numpy_helper.from_array(__import__("numpy").array([1], dtype="int64"), "idx1"))
    inits.append(onnx.numpy_helper.from_array(__import__("numpy").array([H], dtype="int64"), "hid"))
    nodes += [h.make_node("Shape", ["input_ids"], ["ids_shape"], name="shape"),
              h.make_node("Gather", ["ids_shape", "idx0"], ["b_dim"], name="get_b", axis=0),
              h.make_node("Gather", ["ids_shape", "idx1"], ["s_dim"], name="get_s", axis=0),
              h.make_node("Concat", ["b_dim", "s_dim", "hid"], ["bsh"], name="bsh", axis=0)]
    x = "x0"
    for i in range(layers):
        p = f"h{i}."
        inits += [W(p + "ln1.s", (H,)), W(p + "ln1.b", (H,)), W(p + "qkv.w", (H, 3 * H)), W(p + "qkv.b", (3 * H,)),
                  W(p + "proj.w", (H, H)), W(p + "proj.b", (H,)), W(p + "ln2.s", (H,)), W(p + "ln2.b", (H,)),
                  W(p + "fc1.w", (H, 4 * H)), W(p + "fc1.b", (4 * H,)), W(p + "fc2.w", (4 * H, H)), W(p + "fc2.b", (H,))]
        nodes += [
            h.make_node("LayerNormalization", [x, p + "ln1.s", p + "ln1.b"], [p + "ln1"], name=p + "ln1", axis=-1),
            h.make_node("MatMul", [p + "ln1", p + "qkv.w"], [p + "qkv_mm"], name=p + "qkv"),
            h.make_node("Add", [p + "qkv_mm", p + "qkv.b"], [p + "qkv_o"], name=p + "qkv_bias"),
            h.make_node("Split", [p + "qkv_o"], [p + "q", p + "k", p + "v"], name=p + "split", axis=-1, num_outputs=3),
            h.make_node("Attention", [p + "q", p + "k", p + "v"], [p + "ctx"], name=p + "attn", is_causal=1,
                        q_num_heads=heads, kv_num_heads=heads),
            h.make_node("Reshape", [p + "ctx", "bsh"], [p + "ctx2"], name=p + "merge"),
            h.make_node("MatMul", [p + "ctx2", p + "proj.w"], [p + "proj_mm"], name=p + "proj"),
            h.make_node("Add", [p + "proj_mm", p + "proj.b"], [p + "proj_o"], name=p + "proj_bias"),
            h.make_node("Add", [x, p + "proj_o"], [p + "r1"], name=p + "res1"),
            h.make_node("LayerNormalization", [p + "r1", p + "ln2.s", p + "ln2.b"], [p + "ln2"], name=p + "ln2", axis=-1),
            h.make_node("MatMul", [p + "ln2", p + "fc1.w"], [p + "fc1_mm"], name=p + "fc1"),
            h.make_node("Add", [p + "fc1_mm", p + "fc1.b"], [p + "fc1_o"], name=p + "fc1_bias"),
            h.make_node("Gelu", [p + "fc1_o"], [p + "act"], name=p + "gelu"),
            h.make_node("MatMul", [p + "act", p + "fc2.w"], [p + "fc2_mm"], name=p + "fc2"),
            h.make_node("Add", [p + "fc2_mm", p + "fc2.b"], [p + "fc2_o"], name=p + "fc2_bias"),
            h.make_node("Add", [p + "r1", p + "fc2_o"], [p + "out"], name=p + "res2"),
        ]
        x = p + "out"
    inits += [W("lnf.s", (H,)), W("lnf.b", (H,)), W("head.w", (H, vocab))]
    nodes += [h.make_node("LayerNormalization", [x, "lnf.s", "lnf.b"], ["lnf"], name="ln_f", axis=-1),
              h.make_node("MatMul", ["lnf", "head.w"], ["logits"], name="lm_head"),
              h.make_node("Transpose", ["logits"], ["logits_t"], name="to_nc", perm=[0, 2, 1]),
              h.make_node("SoftmaxCrossEntropyLoss", ["logits_t", "labels"], ["loss"], name="loss")]
    g = h.make_graph(nodes, "gpt", [h.make_tensor_value_info("input_ids", TP.INT64, ["batch", "sequence"]),
                                    h.make_tensor_value_info("position_ids", TP.INT64, ["batch", "sequence"]),
                                    h.make_tensor_value_info("labels", TP.INT64, ["batch", "sequence"])],
                     [h.make_tensor_value_info("loss", TP.FLOAT, [])], inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 23)])
    if sparse:
        import os

        data_name = os.path.basename(path) + ".weights"
        offset = 0
        new_inits = []
        for t in model.graph.initializer:
            if t.data_type == TP.FLOAT and not t.raw_data and not t.float_data:
                st, length = sparse_initializer(t.name, list(t.dims), data_name, offset)
                offset += length
                new_inits.append(st)
            else:
                new_inits.append(t)
        del model.graph.initializer[:]
        model.graph.initializer.extend(new_inits)
        with open(os.path.join(os.path.dirname(os.path.abspath(path)), data_name), "wb") as fh:
            fh.truncate(offset)
        return _save(model, path)
    if external_data:
        onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="gpt.data",
                  size_threshold=1024)
        return path
    return _save(model, path)


def recommender_onnx(path: str, num_tables: int = 4, rows: int = 40_000_000, dim: int = 128, lookups: int = 8,
                     dense_features: int = 13) -> str:
    """A DLRM-style recommender whose embedding tables are external data in one *sparse* file:
    the tensors are declared (dims, offsets) but never written, so tens of GB take no disk."""
    import os

    onnx, TP, h = _onnx()
    nodes, inits = [], []
    data_name = os.path.basename(path) + ".tables"
    offset = 0
    for i in range(num_tables):
        t = onnx.TensorProto()
        t.name = f"table{i}.weight"
        t.data_type = TP.FLOAT
        t.dims.extend([rows, dim])
        t.data_location = onnx.TensorProto.EXTERNAL
        length = rows * dim * 4
        for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(length))):
            e = t.external_data.add()
            e.key, e.value = k, v
        offset += length
        inits.append(t)
        nodes += [h.make_node("Gather", [f"table{i}.weight", f"ids{i}"], [f"rows{i}"], name=f"table{i}", axis=0),
                  h.make_node("ReduceSum", [f"rows{i}", "axis1"], [f"e{i}"], name=f"pool{i}", keepdims=0)]
    inits.append(onnx.numpy_helper.from_array(__import__("numpy").array([1], dtype="int64"), "axis1"))
    with open(os.path.join(os.path.dirname(os.path.abspath(path)), data_name), "wb") as fh:
        fh.truncate(offset)  # sparse: no blocks allocated
    inits += [_init("bot1.w", (dense_features, 512)), _init("bot1.b", (512,)), _init("bot2.w", (512, dim)), _init("bot2.b", (dim,))]
    nodes += [h.make_node("Gemm", ["dense", "bot1.w", "bot1.b"], ["b1"], name="bot1"),
              h.make_node("Relu", ["b1"], ["b1r"], name="bot1_relu"),
              h.make_node("Gemm", ["b1r", "bot2.w", "bot2.b"], ["b2"], name="bot2"),
              h.make_node("Relu", ["b2"], ["b2r"], name="bot2_relu"),
              h.make_node("Concat", ["b2r"] + [f"e{i}" for i in range(num_tables)], ["z"], name="interact", axis=1)]
    width = dim * (num_tables + 1)
    inits += [_init("top1.w", (width, 1024)), _init("top1.b", (1024,)), _init("top2.w", (1024, 512)), _init("top2.b", (512,)),
              _init("top3.w", (512, 2)), _init("top3.b", (2,))]
    nodes += [h.make_node("Gemm", ["z", "top1.w", "top1.b"], ["t1"], name="top1"),
              h.make_node("Relu", ["t1"], ["t1r"], name="top1_relu"),
              h.make_node("Gemm", ["t1r", "top2.w", "top2.b"], ["t2"], name="top2"),
              h.make_node("Relu", ["t2"], ["t2r"], name="top2_relu"),
              h.make_node("Gemm", ["t2r", "top3.w", "top3.b"], ["logits"], name="top3"),
              h.make_node("SoftmaxCrossEntropyLoss", ["logits", "label"], ["loss"], name="loss")]
    ins = [h.make_tensor_value_info("dense", TP.FLOAT, ["batch", dense_features]),
           h.make_tensor_value_info("label", TP.INT64, ["batch"])]
    ins += [h.make_tensor_value_info(f"ids{i}", TP.INT64, ["batch", lookups]) for i in range(num_tables)]
    g = h.make_graph(nodes, "dlrm", ins, [h.make_tensor_value_info("loss", TP.FLOAT, [])], inits)
    return _save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)


def four_onnx_models(directory: str) -> dict[str, str]:
    """The four ONNX model families of the done-when list, small enough for tests: an MLP, a
    ResNet-style CNN, a GPT block stack and a recommender whose 40M-row tables are external data."""
    import os

    return {
        "mlp": mlp_onnx(os.path.join(directory, "mlp.onnx"), layers=3, width=256),
        "resnet": resnet_onnx(os.path.join(directory, "resnet.onnx"), blocks=(1, 1, 1, 1), width=16, image=64, classes=100),
        "gpt": gpt_onnx(os.path.join(directory, "gpt.onnx"), layers=2, hidden=128, heads=4, vocab=1000, positions=256),
        "rec": recommender_onnx(os.path.join(directory, "rec.onnx"), num_tables=4, rows=40_000_000, dim=128, lookups=8),
    }
