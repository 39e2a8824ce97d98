"""Real Hugging Face ``config.json`` files (tests/costmodel/transformer/hf_configs/: the published
model repositories' config.json, transcribed; ``ernie-4.5-21b-a3b.json`` is the defaults of
transformers' ``Ernie4_5_MoeConfig``, whose docstring says they are baidu/ERNIE-4.5-21B-A3B-PT's)
plan as the published models.

Each case gives the model card's total (and for MoE active) parameter count and its source.
Counts are checked to ±0.5%; a card that rounds to two significant figures ("37B active") is
checked within its rounding interval widened by 0.5%.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_model import Training, estimate, from_hf_config, simple_cluster
from cost_model.errors import InvalidModel
from cost_model.strategy import Strategy
from cost_model.transformer.stage_cost import model_flops_per_step

CONFIGS = Path(__file__).parent / "hf_configs"


def load(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def within(value: float, card: float, rel: float = 0.005, rounding: float = 0.0) -> bool:
    return card - rounding - rel * card <= value <= card + rounding + rel * card


# (config, card total B, card active B or None, rounding of the card's active figure, source)
CARDS = [
    ("falcon-7b", 6.92, None, 0.0, "TII, Almazrouei et al. 2023 'The Falcon Series of Open Language Models' (6.9B, tied head)"),
    ("deepseek-v3", 671.0, 37.0, 0.5, "DeepSeek-V3 technical report / model card: 671B total, 37B activated (MTP excluded)"),
    ("gemma-2-27b", 27.2, None, 0.0, "Gemma 2 report (Gemma Team 2024) Table 1: 27.2B parameters"),
    ("qwen3-30b-a3b", 30.5, 3.3, 0.05, "Qwen3-30B-A3B model card: 30.5B total, 3.3B activated"),
    ("qwen2.5-72b", 72.7, None, 0.0, "Qwen2.5-72B model card: 72.7B parameters"),
    ("llama-3.1-8b", 8.03, None, 0.0, "Llama 3.1 8B model card (8.03B)"),
    ("llama-3.1-405b", 405.0, None, 0.0, "Llama 3.1 model card: 405B (405.9B counted, 0.2%)"),
    ("mixtral-8x7b", 46.7, 12.9, 0.05, "Mistral AI 'Mixtral of experts' announcement: 46.7B total, 12.9B per token"),
    ("phi-3.5-moe", 41.9, 6.6, 0.05, "Phi-3.5-MoE-instruct model card: 6.6B active, 41.9B total (16×3.8B)"),
    ("gpt2", 0.124, None, 0.0005, "GPT-2 small, OpenAI 2019 (124M as counted by Hugging Face)"),
    ("gpt-neox-20b", 20.55, None, 0.005, "Black et al. 2022 'GPT-NeoX-20B' Table 1: 20,554,567,680 parameters"),
    ("bloom", 176.25, None, 0.005, "bigscience/bloom model card: 176,247,271,424 parameters (less the embedding LayerNorm, 28,672)"),
    ("opt-66b", 66.0, None, 0.5, "Zhang et al. 2022 'OPT' Table 1: OPT-66B"),
    ("gpt-j-6b", 6.053, None, 0.0, "EleutherAI/gpt-j-6b model card: 6,053,381,344 parameters"),
    ("chatglm3-6b", 6.24, None, 0.005, "THUDM/chatglm3-6b: 6,243,584,000 parameters (GLM team, ChatGLM3 release)"),
    ("starcoder2-15b", 15.958, None, 0.0, "bigcode/starcoder2-15b: 15,957,889,024 parameters (its safetensors)"),
    ("phi-2", 2.7797, None, 0.0, "microsoft/phi-2: 2,779,683,840 parameters (its safetensors; 2.7B on the card)"),
    ("qwen-7b", 7.7213, None, 0.0, "Qwen/Qwen-7B: 7,721,324,544 parameters (its safetensors; 7.7B on the card)"),
    ("deepseek-moe-16b", 16.4, 2.8, 0.05, "Dai et al. 2024 'DeepSeekMoE': DeepSeekMoE 16B, 16.4B total, 2.8B activated"),
    ("mpt-7b", 6.6493, None, 0.0, "mosaicml/mpt-7b: 6,649,286,656 parameters (its safetensors; 6.7B on the card)"),
    ("dbrx-base", 132.0, 36.0, 0.5, "Databricks DBRX announcement / model card: 132B total, 36B active on any input"),
    ("llama-4-maverick-text", 400.0, 17.0, 0.5, "Llama 4 Maverick model card: 17B active, 400B total (128 experts)"),
    ("glm-4.5-air", 106.0, None, 0.5, "GLM-4.5 report / zai-org/GLM-4.5-Air card: 106B total parameters (MTP layer excluded)"),
]


@pytest.mark.parametrize("name, total_b, active_b, rounding, source", CARDS, ids=[c[0] for c in CARDS])
def test_parameter_counts_match_the_model_cards(name, total_b, active_b, rounding, source):
    spec = from_hf_config(load(name))
    assert within(spec.total_params() / 1e9, total_b, rounding=rounding if active_b is None else 0.0), (source, spec.total_params())
    if active_b is not None:
        assert spec.is_moe
        assert within(spec.active_params() / 1e9, active_b, rounding=rounding), (source, spec.active_params())


def test_falcon_40b_counts_its_tied_head_once():
    # TII's card gives 41.8B: that counts the checkpoint's separate lm_head matrix (65024×8192 =
    # 0.53B).  HF's FalconForCausalLM ties it to the embedding (tie_word_embeddings defaults to
    # true and falcon-40b's config.json does not set it), so the trained model has 41.3B; with
    # tie_word_embeddings false the count is the card's.
    cfg = load("falcon-40b")
    tied = from_hf_config(cfg)
    assert tied.tie_embeddings and tied.num_kv_heads == 8 and tied.norms_per_layer == 2
    assert tied.total_params() == pytest.approx(41.30e9, rel=0.001)
    untied = from_hf_config({**cfg, "tie_word_embeddings": False})
    assert within(untied.total_params() / 1e9, 41.8)


def test_every_spelling_of_grouped_and_multi_query_attention():
    f7 = from_hf_config(load("falcon-7b"))
    assert f7.num_kv_heads == 1 and f7.norms_per_layer == 1 and f7.position_embedding == "rope" and f7.tie_embeddings
    f40 = from_hf_config(load("falcon-40b"))
    assert f40.num_kv_heads == 8
    base = {"num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 2816, "model_type": "llama"}
    assert from_hf_config({**base, "num_key_value_heads": 4}).num_kv_heads == 4
    assert from_hf_config({**base, "num_kv_heads": 2}).num_kv_heads == 2
    assert from_hf_config({**base, "multi_query": True}).num_kv_heads == 1
    assert from_hf_config(base).num_kv_heads == 16
    # Falcon without new_decoder_architecture ignores num_kv_heads (HF FalconAttention).
    old = {**load("falcon-7b"), "multi_query": False}
    assert from_hf_config(old).num_kv_heads == 71


def test_head_dim_bias_and_norm_fields_are_costed():
    gemma = from_hf_config(load("gemma-2-27b"))
    assert gemma.head_dim == 128 and gemma.q_size == 4096 != gemma.hidden_size
    assert gemma.tie_embeddings and gemma.norms_per_layer == 4 and gemma.activation == "gelu_tanh" and gemma.gated_ffn
    assert gemma.sliding_window == 4096 and gemma.local_attention_layers == 23
    qwen3 = from_hf_config(load("qwen3-30b-a3b"))
    assert qwen3.head_dim == 128 and qwen3.qk_norm and qwen3.rope_theta == 1e6
    q72 = from_hf_config(load("qwen2.5-72b"))
    assert q72.has_qkv_bias and not q72.has_out_bias and q72.sliding_window == 0  # use_sliding_window false
    no_bias = from_hf_config({**load("qwen2.5-72b"), "model_type": "llama"})
    assert q72.total_params() - no_bias.total_params() == 80 * (8192 + 2 * 1024)
    phi = from_hf_config(load("phi-3.5-moe"))
    assert phi.has_qkv_bias and phi.has_out_bias and phi.head_bias and phi.norm == "layernorm"
    llama = from_hf_config(load("llama-3.1-8b"))
    assert llama.rope_theta == 500000.0 and dict(llama.rope_scaling)["rope_type"] == "llama3"
    assert not llama.tie_embeddings and llama.warnings == ()


def test_gpt_neox_bloom_opt_and_gpt_j_are_their_own_families():
    """The architectures of the calibration set's NeoX, BLOOM and OPT runs, read from their
    config.json: ungated biased FFNs, LayerNorm, and each family's positions and tying."""
    neox = from_hf_config(load("gpt-neox-20b"))
    assert not neox.gated_ffn and neox.bias and not neox.tie_embeddings and neox.position_embedding == "rope"
    assert neox.ffn_hidden_size == 24576 and neox.rope_theta == 10000.0 and neox.warnings == ()
    bloom = from_hf_config(load("bloom"))
    assert bloom.hidden_size == 14336 and bloom.num_layers == 70 and bloom.ffn_hidden_size == 4 * 14336
    assert bloom.position_embedding == "alibi" and bloom.learned_positions == 0 and bloom.tie_embeddings and bloom.warnings == ()
    opt = from_hf_config(load("opt-66b"))
    assert opt.ffn_hidden_size == 36864 and opt.activation == "relu" and opt.tie_embeddings
    assert opt.position_embedding == "learned" and opt.learned_positions == 2050 and opt.warnings == ()  # offset of 2
    assert not from_hf_config({**load("opt-66b"), "enable_bias": False}).bias
    projected = from_hf_config({**load("opt-66b"), "word_embed_proj_dim": 512})
    assert any("word_embed_proj_dim=512" in w for w in projected.warnings)
    gptj = from_hf_config(load("gpt-j-6b"))
    assert gptj.norms_per_layer == 1 and gptj.position_embedding == "rope" and gptj.learned_positions == 0
    assert gptj.mlp_bias and gptj.head_bias and not gptj.has_qkv_bias and not gptj.tie_embeddings and gptj.warnings == ()


def test_chatglm_reads_its_own_field_names():
    """THUDM's modeling_chatglm.py names: num_layers, padded_vocab_size, ffn_hidden_size (the
    SwiGLU width), kv_channels, multi_query_group_num, add_qkv_bias, rmsnorm, seq_length."""
    glm = from_hf_config(load("chatglm3-6b"))
    assert glm.num_layers == 28 and glm.vocab_size == 65024 and glm.gated_ffn and glm.ffn_hidden_size == 13696
    assert glm.num_kv_heads == 2 and glm.head_dim == 128 and glm.has_qkv_bias and not glm.has_out_bias
    assert glm.norm == "rmsnorm" and glm.max_position_embeddings == 8192 and glm.warnings == ()
    assert from_hf_config({**load("chatglm3-6b"), "multi_query_attention": False}).num_kv_heads == 32
    assert from_hf_config({**load("chatglm3-6b"), "rmsnorm": False}).norm == "layernorm"
    with pytest.raises(InvalidModel) as err:
        from_hf_config({**load("chatglm3-6b"), "rmsnorm": "yes"})
    assert err.value.field == "model.transformer.rmsnorm"
    # a field only ChatGLM's parser reads is not costed for another family, so it is named
    llama = from_hf_config({**load("llama-3.1-8b"), "add_bias_linear": True})
    assert any("add_bias_linear" in w for w in llama.warnings)
    # and Falcon's bias switch and decoder variant are Falcon's alone
    llama = from_hf_config({**load("llama-3.1-8b"), "bias": True, "new_decoder_architecture": True})
    assert not llama.has_mlp_bias and any("bias, new_decoder_architecture" in w for w in llama.warnings)


def test_ernie_4_5_reads_its_own_moe_field_names():
    """HF Ernie4_5_MoeConfig names the MoE moe_num_experts, moe_k, moe_num_shared_experts (shared
    experts of moe_intermediate_size each) and its layer range moe_layer_start_index/_end_index
    (-1: the last layer)/_interval; use_bias switches every projection's bias."""
    ernie = from_hf_config(load("ernie-4.5-21b-a3b"))
    assert ernie.is_moe and ernie.num_experts == 64 and ernie.experts_per_token == 6
    assert ernie.ffn_hidden_size == 1536 and ernie.shared_expert_ffn_hidden_size == 2 * 1536
    assert ernie.dense_layer_indices == (0,) and ernie.dense_ffn_hidden_size == 12288 and ernie.moe_layers == 27
    assert ernie.tie_embeddings and ernie.gated_ffn and ernie.norm == "rmsnorm" and ernie.warnings == ()
    assert not (ernie.has_qkv_bias or ernie.has_out_bias or ernie.has_mlp_bias or ernie.head_bias)
    # Baidu names its models by truncated counts (21B total, 3B activated: model card)
    assert 21.0 <= ernie.total_params() / 1e9 < 22.0 and 3.0 <= ernie.active_params() / 1e9 < 4.0
    every_other = from_hf_config({**load("ernie-4.5-21b-a3b"), "moe_layer_interval": 2, "moe_layer_end_index": 25})
    # MoE where (i + 1) % 2 == 0 and 1 <= i <= 25: layers 1, 3, ..., 25
    assert every_other.moe_layers == 13
    assert from_hf_config({**load("ernie-4.5-21b-a3b"), "use_bias": True}).has_mlp_bias
    dense = from_hf_config({**load("ernie-4.5-21b-a3b"), "model_type": "ernie4_5", "moe_num_experts": None})
    assert not dense.is_moe and dense.ffn_hidden_size == 12288
    for bad in ({"moe_layer_start_index": 28}, {"moe_layer_end_index": -2}, {"moe_layer_start_index": [1, 1]}):
        with pytest.raises(InvalidModel) as err:
            from_hf_config({**load("ernie-4.5-21b-a3b"), **bad})
        assert err.value.field == f"model.transformer.{next(iter(bad))}"
    # ERNIE-4.5-300B-A47B's config.json writes moe_num_shared_experts 0: no shared expert, not a bad count;
    # so do other configs for a query rank, MTP modules and shared-expert widths
    none_shared = from_hf_config({**load("ernie-4.5-21b-a3b"), "moe_num_shared_experts": 0})
    assert none_shared.is_moe and none_shared.shared_expert_ffn_hidden_size == 0
    for zero in ({"shared_expert_intermediate_size": 0}, {"num_nextn_predict_layers": 0}):
        assert from_hf_config({**load("qwen3-30b-a3b"), **zero}).shared_expert_ffn_hidden_size == 0
    with pytest.raises(InvalidModel) as err:
        from_hf_config({**load("ernie-4.5-21b-a3b"), "moe_num_shared_experts": -1})
    assert err.value.field == "model.transformer.moe_num_shared_experts" and "non-negative" in err.value.message
    # ERNIE's names are not read for another family, so there they are named in the warnings
    qwen = from_hf_config({**load("qwen3-30b-a3b"), "moe_k": 2})
    assert qwen.experts_per_token == 8 and any("moe_k" in w for w in qwen.warnings)


def test_bloom_and_neox_configs_cost_as_the_calibration_set_models():
    """A BLOOM or NeoX run given as its config.json costs what the fidelity bench's model of the
    same run costs (cost_model.validation.published.model_for), so the calibrated figures hold."""
    from cost_model.validation.published import model_for

    t = Training(global_batch_size=8, sequence_length=2048)
    cases = [("bloom", "BLOOM176B_production", {"name": "bloom", "layers": 70, "hidden": 14336, "heads": 112, "vocab": 250880, "seq_len": 2048}),
             ("gpt-neox-20b", "GPT-NeoX-20B", {"name": "neox", "layers": 44, "hidden": 6144, "heads": 64, "vocab": 50432, "seq_len": 2048})]
    for name, group, row in cases:
        hf, cal = from_hf_config(load(name)), model_for(group, row)
        assert hf.total_params() == cal.total_params(), name
        assert model_flops_per_step(hf, t) == pytest.approx(model_flops_per_step(cal, t), rel=1e-9), name
        s = Strategy(dp=1, tp=8, micro_batch_size=1, recompute="full")
        a, b = estimate(hf, t, simple_cluster("A100-SXM4-80GB", 1), s), estimate(cal, t, simple_cluster("A100-SXM4-80GB", 1), s)
        assert a.peak_memory_GB == pytest.approx(b.peak_memory_GB, rel=1e-9), name
        # NeoX's config says gelu_fast (tanh-approximated), the bench's model the exact GELU: the
        # activation's elementwise cost is the only difference
        assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-9 if name == "bloom" else 0.005), name


def test_rope_parameters_spelling_of_transformers_v5():
    cfg = load("llama-3.1-8b")
    scaling = cfg.pop("rope_scaling")
    v5 = {**{k: v for k, v in cfg.items() if k != "rope_theta"}, "rope_parameters": {"rope_theta": 500000.0, **scaling}}
    v5["dtype"] = v5.pop("torch_dtype")
    spec = from_hf_config(v5)
    assert spec.rope_theta == 500000.0 and dict(spec.rope_scaling)["factor"] == 8.0 and spec.warnings == ()


def test_deepseek_v3_mla_shared_experts_dense_first_layers_and_mtp():
    ds = from_hf_config(load("deepseek-v3"))
    assert ds.is_mla and ds.q_lora_rank == 1536 and ds.kv_lora_rank == 512
    assert ds.qk_head_dim == 192 and ds.value_head_dim == 128 and ds.num_kv_heads == 128
    assert ds.dense_layer_indices == (0, 1, 2) and ds.moe_layers == 58 and ds.dense_ffn_hidden_size == 18432
    assert ds.ffn_hidden_size == 2048 and ds.shared_expert_ffn_hidden_size == 2048 and ds.experts_per_token == 8
    assert ds.mtp_layers == 1 and 11e9 < ds.mtp_params() < 12.5e9
    assert sum(layer.params for layer in ds.layer_graph()) == ds.total_params()
    assert not any("nextn" in w for w in ds.warnings)  # costed (test_mtp_modules_are_costed_on_the_last_stage)
    assert any("quantization_config" in w for w in ds.warnings)


def test_qwen_moe_layer_frequency_and_mlp_only_layers():
    cfg = {**load("qwen3-30b-a3b"), "decoder_sparse_step": 2, "mlp_only_layers": [1]}
    spec = from_hf_config(cfg)
    # layer i is MoE when i is not in mlp_only_layers and (i + 1) % step == 0: 1, 3, ..., 47 minus layer 1
    assert spec.moe_layers == 23 and len(spec.dense_layer_indices) == 25 and spec.dense_ffn_hidden_size == 6144


def test_flops_per_token_follow_the_architecture():
    # Forward GEMM FLOPs per token are twice the active matmul weights; for a model with
    # uniform layers that is 2·(active params − embedding − norms − biases) per layer.
    training = Training(global_batch_size=1, sequence_length=4096)
    ds = from_hf_config({**load("deepseek-v3"), "num_nextn_predict_layers": None})  # MTP: test_mtp_modules_...
    flops = model_flops_per_step(ds, training)
    per_token_gemm = ds.num_layers * ds.matmul_params_per_token() + ds.vocab_size * ds.hidden_size
    # 6 × active matmul params per token (Kaplan et al. 2020's 6N), plus attention
    assert flops / 4096 == pytest.approx(6 * per_token_gemm + 12 * ds.num_layers * ds.attention_core_width(4096), rel=1e-12)
    assert 6 * per_token_gemm / 4096 < flops / 4096
    assert ds.num_layers * ds.matmul_params_per_token() == pytest.approx(
        ds.active_params() - 2 * ds.vocab_size * ds.hidden_size, rel=0.001)
    # Gemma-2's windowed layers attend to 4096 keys at sequence 8192: half the layers' core.
    gemma = from_hf_config(load("gemma-2-27b"))
    full = from_hf_config({**load("gemma-2-27b"), "sliding_window": None})
    assert gemma.attention_core_width(8192) == pytest.approx(0.75 * full.attention_core_width(8192), rel=0.03)


def test_non_uniform_models_estimate_end_to_end():
    ds = from_hf_config(load("deepseek-v3"))
    est = estimate(ds, Training(global_batch_size=4096, sequence_length=4096), simple_cluster("H100-SXM5-80GB", 128),
                   Strategy(dp=2, tp=8, pp=8, ep=2, micro_batch_size=1, zero_stage=1, recompute="full",
                            layers_per_stage=(7, 8, 8, 8, 8, 8, 8, 6)))
    assert est.step_time_s > 0 and not any("nextn" in w for w in est.warnings)
    gemma = from_hf_config(load("gemma-2-27b"))
    est = estimate(gemma, Training(global_batch_size=64, sequence_length=8192), simple_cluster("H100-SXM5-80GB", 1),
                   Strategy(dp=1, tp=8, micro_batch_size=1, recompute="full"))
    assert est.step_time_s > 0


def test_mtp_modules_are_costed_on_the_last_stage():
    """DeepSeek-V3's multi-token-prediction module (num_nextn_predict_layers, trained by the
    Megatron launch's --mtp-num-layers) runs after the decoder on the last stage: one more MoE
    layer, the [2h, h] projection and a second head and loss — in its time, memory (parameters,
    their gradients and optimizer state, its logits) and FLOPs; the other stages do not change."""
    with_mtp = from_hf_config(load("deepseek-v3"))
    without = from_hf_config({**load("deepseek-v3"), "num_nextn_predict_layers": None})
    training = Training(global_batch_size=1024, sequence_length=4096)
    cluster = simple_cluster("H100-SXM5-80GB", 256)
    strategy = Strategy(dp=16, tp=1, pp=16, ep=16, micro_batch_size=1, zero_stage=1, recompute="full",
                        layers_per_stage=(3,) + (4,) * 14 + (2,))
    a, b = estimate(with_mtp, training, cluster, strategy), estimate(without, training, cluster, strategy)
    first, last = (slice(0, 15), -1)
    assert [s.forward_s for s in a.stages[first]] == [s.forward_s for s in b.stages[first]]
    assert [s.peak_memory_GB for s in a.stages[first]] == [s.peak_memory_GB for s in b.stages[first]]
    # the last stage: its 2 decoder layers and head, plus the MTP module's layer, projection and head
    layer_s = (b.stages[1].forward_s + b.stages[1].backward_s) / 4
    extra_s = a.stages[last].forward_s + a.stages[last].backward_s - b.stages[last].forward_s - b.stages[last].backward_s
    assert layer_s < extra_s < 3 * layer_s
    extra_weights = a.stages[last].memory_GB["weights"] - b.stages[last].memory_GB["weights"]
    # 11.6B MTP parameters: dense part over tp=1, routed experts over ep=16, 2 bytes each
    dense, routed = with_mtp.mtp_params() - 256 * with_mtp.expert_params(), 256 * with_mtp.expert_params()
    assert extra_weights == pytest.approx(2 * (dense + routed / 16) / 1e9, rel=1e-6)
    assert a.stages[last].memory_GB["activations"] > b.stages[last].memory_GB["activations"]
    # FLOPs as Megatron-LM counts MTP: the layer, the projection and the head again, ×3
    s, h = 4096, with_mtp.hidden_size
    added = model_flops_per_step(with_mtp, training) - model_flops_per_step(without, training)
    layer = (model_flops_per_step(without, training) / 3 / 1024 - 2 * s * h * with_mtp.vocab_size) / with_mtp.num_layers
    assert added == pytest.approx(3 * 1024 * (layer + 2 * s * 2 * h * h + 2 * s * h * with_mtp.vocab_size), rel=1e-9)


def test_unknown_fields_are_listed_and_harmless_ones_are_not():
    cfg = {**load("llama-3.1-8b"), "my_new_attention_trick": 3, "pad_token_id": 0, "initializer_range": 0.01}
    spec = from_hf_config(cfg)
    assert len(spec.warnings) == 1 and "my_new_attention_trick" in spec.warnings[0] and "pad_token_id" not in spec.warnings[0]
    for name, _, _, _, _ in CARDS:
        spec = from_hf_config(load(name))
        assert not any("does not know" in w for w in spec.warnings if name != "deepseek-v3"), (name, spec.warnings)


def test_unknown_model_type_is_costed_llama_style_with_a_warning():
    spec = from_hf_config({**load("llama-3.1-8b"), "model_type": "brand_new"})
    assert any("brand_new" in w for w in spec.warnings)


@pytest.mark.parametrize(
    "cfg, kind",
    [
        ({"model_type": "mamba", "hidden_size": 2560, "num_hidden_layers": 64, "state_size": 16, "vocab_size": 50280,
          "num_attention_heads": 32}, "state-space"),
        ({"model_type": "rwkv", "hidden_size": 2048, "num_hidden_layers": 24, "vocab_size": 50277}, "state-space"),
        ({"model_type": "t5", "d_model": 1024, "num_layers": 24, "num_heads": 16, "is_encoder_decoder": True}, "encoder-decoder"),
        ({"model_type": "llava", "text_config": {"model_type": "llama"}, "vision_config": {"model_type": "clip_vision_model"}},
         "multimodal"),
        ({"model_type": "custom_seq2seq", "is_encoder_decoder": True, "d_model": 512}, "encoder-decoder"),
        ({"model_type": "ernie4_5_moe_vl", "hidden_size": 2560, "num_hidden_layers": 28}, "multimodal"),
        # hybrids whose linear-attention layers keep a recurrent state: costed as full attention
        # by the Llama fallback before, now refused by type or by their layer_types
        ({"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
          "layer_types": ["linear_attention"] * 3 + ["full_attention"]}, "state-space"),
        ({"model_type": "my_hybrid", "hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 16,
          "intermediate_size": 5632, "layer_types": ["linear_attention", "full_attention"] * 2}, "state-space"),
    ],
)
def test_unsupported_architectures_are_refused_naming_model_type(cfg, kind):
    with pytest.raises(InvalidModel) as e:
        from_hf_config(cfg)
    assert cfg["model_type"] in e.value.message and kind in e.value.message and "llama" in e.value.message
    assert e.value.field.endswith("model_type")


def test_plans_are_named_by_name_then_name_or_path_then_architecture_and_size():
    cfg = load("llama-3.1-8b")
    assert from_hf_config(cfg).name == "llama 8.0B"
    assert from_hf_config({**cfg, "_name_or_path": "meta-llama/Llama-3.1-8B"}).name == "meta-llama/Llama-3.1-8B"
    assert from_hf_config({**cfg, "_name_or_path": "x", "name": "mine"}).name == "mine"
    assert from_hf_config(load("llama-3.1-405b")).name == "llama 405.9B"
    assert from_hf_config(load("gpt2")).name == "gpt2 124M"


def test_more_families_read_what_their_modelling_code_fixes():
    """Families added from the Hugging Face modelling code (and the remote code of Qwen-1,
    DeepSeek-MoE, InternLM2, MiniCPM): each fixes what its config.json leaves implicit."""
    sc = from_hf_config(load("starcoder2-15b"))  # c_fc → GELU → c_proj, biased, untied here
    assert not sc.gated_ffn and sc.bias and sc.norm == "layernorm" and not sc.tie_embeddings and sc.local_attention_layers == 40
    phi = from_hf_config(load("phi-2"))  # one shared LayerNorm, biased projections and LM head
    assert not phi.gated_ffn and phi.bias and phi.head_bias and phi.norms_per_layer == 1
    qwen = from_hf_config(load("qwen-7b"))  # w1, w2 of intermediate_size // 2; only c_attn biased
    assert qwen.gated_ffn and qwen.ffn_hidden_size == 11008 and qwen.has_qkv_bias and not qwen.has_out_bias and not qwen.mlp_bias
    ds = from_hf_config(load("deepseek-moe-16b"))
    assert ds.num_experts == 64 and ds.experts_per_token == 6 and ds.dense_layer_indices == (0,)
    assert ds.shared_expert_ffn_hidden_size == 2 * 1408 and ds.dense_ffn_hidden_size == 10944
    for spec in (sc, phi, qwen, ds):
        assert not spec.warnings, spec.warnings
    base = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 4, "num_attention_heads": 16, "vocab_size": 32000}
    internlm2 = from_hf_config({**base, "model_type": "internlm2", "bias": False})
    assert not internlm2.has_qkv_bias and from_hf_config({**base, "model_type": "internlm2"}).has_out_bias
    assert from_hf_config({**base, "model_type": "olmo2"}).qk_norm and from_hf_config({**base, "model_type": "olmoe", "num_experts": 8}).is_moe
    olmo = from_hf_config({**base, "model_type": "olmo", "clip_qkv": 8.0, "attention_bias": False})  # OLMo 1: weight-free LayerNorms
    assert olmo.norm == "layernorm" and olmo.gated_ffn and not olmo.bias and not olmo.qk_norm and not olmo.warnings
    baichuan = from_hf_config({**base, "model_type": "baichuan", "model_max_length": 4096, "z_loss_weight": 0})  # Baichuan 2
    assert baichuan.norm == "rmsnorm" and baichuan.gated_ffn and not baichuan.bias and not baichuan.tie_embeddings and not baichuan.warnings
    cohere = from_hf_config({**base, "model_type": "cohere", "logit_scale": 0.0625})
    assert cohere.norms_per_layer == 1 and cohere.norm == "layernorm" and cohere.tie_embeddings and not cohere.qk_norm
    assert from_hf_config({**base, "model_type": "cohere", "use_qk_norm": True}).qk_norm
    glm4 = from_hf_config({**base, "model_type": "glm4", "partial_rotary_factor": 0.5})
    assert glm4.norms_per_layer == 4 and glm4.has_qkv_bias and not glm4.has_out_bias
    assert not from_hf_config({**base, "model_type": "nemotron"}).gated_ffn
    assert from_hf_config({**base, "model_type": "stablelm", "use_parallel_residual": True}).norms_per_layer == 1
    oss = from_hf_config({**base, "model_type": "gpt_oss", "num_local_experts": 32, "num_experts_per_tok": 4, "swiglu_limit": 7.0})
    assert oss.is_moe and oss.has_qkv_bias and oss.has_out_bias and oss.mlp_bias
    granite = from_hf_config({**base, "model_type": "granite", "attention_multiplier": 0.0078125, "residual_multiplier": 0.22})
    minicpm = from_hf_config({**base, "model_type": "minicpm", "scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256})
    assert minicpm.tie_embeddings
    for spec in (internlm2, cohere, glm4, oss, granite, minicpm):
        assert not spec.warnings, spec.warnings


def test_an_ungated_family_costs_two_ffn_matrices():
    """StarCoder2 run as a Llama-style decoder would cost a third FFN matrix: 1.5× its FFN."""
    sc = load("starcoder2-15b")
    t = Training(global_batch_size=8, sequence_length=4096)
    own = model_flops_per_step(from_hf_config(sc), t)
    as_llama = model_flops_per_step(from_hf_config({**sc, "model_type": "llama"}), t)
    assert as_llama > 1.25 * own


def test_mpt_reads_llm_foundry_nested_configs():
    """MPT (llm-foundry ``MPTConfig``): ``attn_config``/``ffn_config`` decide the attention, the
    positions, the FFN and the biases; nested fields it does not know are warned about."""
    mpt = from_hf_config(load("mpt-7b"))
    assert mpt.position_embedding == "alibi" and mpt.learned_positions == 0  # learned_pos_emb is off under ALiBi
    assert not mpt.gated_ffn and mpt.ffn_hidden_size == 4 * 4096 and mpt.activation == "gelu"
    assert mpt.tie_embeddings and not (mpt.bias or mpt.has_qkv_bias or mpt.has_mlp_bias) and mpt.num_kv_heads == 32
    assert not mpt.warnings
    base = load("mpt-7b")
    gqa = from_hf_config({**base, "no_bias": False,
                          "attn_config": {"attn_type": "grouped_query_attention", "kv_n_heads": 8, "rope": True, "rope_theta": 10000, "qk_ln": True},
                          "ffn_config": {"ffn_type": "mptglu", "ffn_hidden_size": 11008, "ffn_act_fn": {"name": "silu"}}})
    assert gqa.num_kv_heads == 8 and gqa.position_embedding == "rope" and gqa.qk_norm and gqa.bias
    assert gqa.gated_ffn and gqa.ffn_hidden_size == 11008 and gqa.activation == "silu"
    learned = from_hf_config({**base, "attn_config": {"alibi": False}})
    assert learned.position_embedding == "learned" and learned.learned_positions == 2048
    assert from_hf_config({**base, "attn_config": {"attn_type": "multiquery_attention"}}).num_kv_heads == 1
    odd = from_hf_config({**base, "attn_config": {"alibi": True, "new_kernel_knob": 3}})
    assert any("attn_config.new_kernel_knob" in w for w in odd.warnings)
    with pytest.raises(InvalidModel) as err:
        from_hf_config({**base, "attn_config": {"attn_type": "linear_attention"}})
    assert err.value.field == "model.transformer.attn_config.attn_type"
    with pytest.raises(InvalidModel) as err:
        from_hf_config({k: v for k, v in base.items() if k != "n_layers"})
    assert "n_layers" in str(err.value)


def test_dbrx_is_a_gated_mixture_of_experts_with_grouped_queries():
    dbrx = from_hf_config(load("dbrx-base"))
    assert dbrx.is_moe and dbrx.num_experts == 16 and dbrx.experts_per_token == 4 and dbrx.ffn_hidden_size == 10752
    assert dbrx.gated_ffn and dbrx.num_kv_heads == 8 and dbrx.rope_theta == 500000 and not dbrx.tie_embeddings
    assert not dbrx.bias and not dbrx.dense_layer_indices and not dbrx.warnings


def test_llama_4_interleaves_moe_layers_with_a_shared_expert_and_chunked_attention():
    """HF ``Llama4TextConfig``: MoE every ``interleave_moe_layer_step``-th layer (Maverick: the odd
    ones) with one shared expert of ``intermediate_size``; dense layers of
    ``intermediate_size_mlp``; chunked attention on the RoPE layers (3 in 4), global on the NoPE."""
    mav = from_hf_config(load("llama-4-maverick-text"))
    assert mav.dense_layer_indices == tuple(range(0, 48, 2)) and mav.dense_ffn_hidden_size == 16384
    assert mav.shared_expert_ffn_hidden_size == 8192 and mav.num_experts == 128 and mav.experts_per_token == 1
    assert mav.attention_chunk_size == 8192 and mav.local_attention_layers == 36 and not mav.warnings
    scout = from_hf_config({**load("llama-4-maverick-text"), "interleave_moe_layer_step": 1, "num_local_experts": 16})
    assert not scout.dense_layer_indices and within(scout.active_params() / 1e9, 17.0, rounding=0.5)  # "17B active"
    explicit = from_hf_config({**load("llama-4-maverick-text"), "no_rope_layers": [1] * 40 + [0] * 8})
    assert explicit.local_attention_layers == 40
    unchunked = from_hf_config({**load("llama-4-maverick-text"), "attention_chunk_size": None})
    # a chunk of C tokens costs s·C/2 query-key pairs: the same as global attention up to C tokens
    for seq, fewer in ((8192, False), (65536, True)):
        t = Training(global_batch_size=8, sequence_length=seq)
        chunked, full = model_flops_per_step(mav, t), model_flops_per_step(unchunked, t)
        assert (chunked < 0.9 * full) if fewer else chunked == pytest.approx(full)
    local = next(v for _, v in mav.layer_variants() if v.attention_chunk_size)
    s, c = 65536.0, 8192.0
    w = local.attention_span(s)
    assert w * s - w * w / 2 == pytest.approx(s * c / 2)


def test_glm_4_5_keeps_its_first_layers_dense():
    air = from_hf_config(load("glm-4.5-air"))
    assert air.dense_layer_indices == (0,) and air.dense_ffn_hidden_size == 10944 and air.ffn_hidden_size == 1408
    assert air.has_qkv_bias and not air.has_out_bias and air.norms_per_layer == 2 and air.mtp_layers == 1
    assert not air.warnings
    assert not from_hf_config({k: v for k, v in load("glm-4.5-air").items() if k != "attention_bias"}).has_qkv_bias
    # first_k_dense_replace in any MoE family's config keeps those layers dense
    qwen = from_hf_config({**load("qwen3-30b-a3b"), "first_k_dense_replace": 2})
    assert qwen.dense_layer_indices == (0, 1)
