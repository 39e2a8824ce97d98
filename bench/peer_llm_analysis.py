"""The same published rows through llm-analysis (https://github.com/cli99/llm-analysis), the peer
the README compares against on identical inputs.

Optional: installed with the ``bench`` extra (``pip install -e '.[bench]'``, version pinned in
pyproject.toml).  :func:`available` is false when it is not installed and ``bench/fidelity.py``
then skips the comparison.

Inputs per row: the model shape (layers, hidden, heads, KV heads, FFN width, vocabulary,
sequence), the GPU's datasheet figures from our catalog (memory, HBM bandwidth, NVLink and NIC
bandwidth per GPU, the dense peak of the training dtype), and the parallel layout our cost model
costed for the row (tp, pp, dp, micro-batch, recompute, ZeRO stage).  llm-analysis is run as its
README describes for training: one fixed ``flops_efficiency`` (0.5, its documented Megatron-LM
figure) and HBM efficiency 0.9; it has no pipeline bubble and no data-parallel term, so it is an
honest "roofline at a fixed efficiency" baseline.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
from typing import Any

#: llm-analysis's documented training efficiency for Megatron-LM ("~0.5 for LLM training").
FLOPS_EFFICIENCY = 0.5
HBM_EFFICIENCY = 0.9


def available() -> bool:
    try:
        import llm_analysis  # noqa: F401
    except ImportError:
        return False
    return True


def version() -> str | None:
    try:
        from importlib.metadata import version as v

        return v("llm-analysis")
    except Exception:  # noqa: BLE001 - not installed
        return None


def predict_step_s(case: Any, strategy: Any) -> float | None:
    """llm-analysis's ``latency_per_iter`` for one :class:`PublishedCase` under ``strategy``
    (None when it rejects the configuration)."""
    from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
    from llm_analysis.config import DtypeConfig, GPUConfig, ModelConfig, ParallelismConfig

    m, t = case.model, case.training
    g = case.cluster.node_groups[0]
    dev = g.device
    dtype = "bf16" if t.dtype == "fp8" and dev.fp8_tflops is None else t.dtype
    peak16 = dev.bf16_tflops or dev.fp16_tflops or dev.fp32_tflops

    def model_cfg() -> Any:
        # llm-analysis asserts an FFN width that is a whole multiple of the hidden size (it
        # cannot express Llama 3's 3.25·h): such rows get no peer prediction.
        return ModelConfig(
            name=m.name, num_layers=m.num_layers, n_head=m.num_heads, hidden_dim=m.hidden_size, vocab_size=m.vocab_size,
            max_seq_len=t.sequence_length, num_key_value_heads=m.num_kv_heads, ffn_embed_dim=m.ffn_hidden_size,
            model_type=m.model_type,
        )
    gpu_cfg = GPUConfig(
        name=dev.name, mem_per_GPU_in_GB=dev.memory_GB, hbm_bandwidth_in_GB_per_sec=dev.memory_bandwidth_GBps,
        intra_node_bandwidth_in_GB_per_sec=g.intra_node_bandwidth_GBps, intra_node_min_message_latency=8e-6,
        peak_fp16_TFLOPS=peak16, peak_i8_TFLOPS=dev.fp8_tflops or peak16, peak_i4_TFLOPS=dev.fp8_tflops or peak16,
        inter_node_bandwidth_in_GB_per_sec=g.nic_per_gpu_GBps,
    )
    dtype_cfg = DtypeConfig(name="w8a8e16", weight_bits=8, activation_bits=8, embedding_bits=16) if dtype == "fp8" else DtypeConfig()
    par = ParallelismConfig(tp_size=strategy.tp, pp_size=strategy.pp, dp_size=strategy.dp * strategy.cp,
                            sp_size=strategy.tp if strategy.sequence_parallel else 1)
    rc = {"none": ActivationRecomputation.NONE, "selective": ActivationRecomputation.SELECTIVE, "full": ActivationRecomputation.FULL}
    zero = {0: DSZeRO.NONE, 1: DSZeRO.STAGE_1, 2: DSZeRO.STAGE_2, 3: DSZeRO.STAGE_3}
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            analysis = LLMAnalysis(model_cfg(), gpu_cfg, dtype_cfg, par, flops_efficiency=FLOPS_EFFICIENCY, hbm_memory_efficiency=HBM_EFFICIENCY)
            out = analysis.training(
                batch_size_per_gpu=strategy.micro_batch_size, global_batch_size=t.global_batch_size, seq_len=t.sequence_length,
                activation_recomputation=rc.get(strategy.recompute, ActivationRecomputation.NONE),
                ds_zero=zero.get(int(strategy.zero_stage), DSZeRO.NONE), flash_attn=t.attention != "unfused",
                mlp_gated_linear_units=m.gated_ffn,
            )
    except Exception:  # noqa: BLE001 - the peer rejects some shapes and layouts (its own asserts)
        return None
    finally:
        logging.disable(logging.NOTSET)
    step = out.get("latency_per_iter")
    return float(step) if isinstance(step, (int, float)) and math.isfinite(step) and step > 0 else None
