"""Writes examples/model.onnx: a three-layer MLP classifier (64 → 128 → 128 → 10) with a
cross-entropy loss, the model the README's ONNX commands plan.  Needs the ``onnx`` package;
run ``python examples/make_model_onnx.py`` to regenerate it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTHS = (64, 128, 128, 10)


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "input"
    for i, (d_in, d_out) in enumerate(zip(WIDTHS, WIDTHS[1:], strict=False)):
        inits.append(numpy_helper.from_array((rng.standard_normal((d_in, d_out)) * 0.02).astype(np.float32), f"fc{i}.weight"))
        inits.append(numpy_helper.from_array(np.zeros(d_out, np.float32), f"fc{i}.bias"))
        nodes.append(helper.make_node("MatMul", [x, f"fc{i}.weight"], [f"mm{i}"], name=f"fc{i}"))
        nodes.append(helper.make_node("Add", [f"mm{i}", f"fc{i}.bias"], [f"z{i}"], name=f"fc{i}.add"))
        x = f"z{i}"
        if i < len(WIDTHS) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"a{i}"], name=f"relu{i}"))
            x = f"a{i}"
    nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", [x, "labels"], ["loss"], name="loss", reduction="mean"))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch_size", WIDTHS[0]]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, ["batch_size"])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="planner-examples")


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("model.onnx")
    onnx.save(build(), str(out))
    print(f"wrote {out}")
