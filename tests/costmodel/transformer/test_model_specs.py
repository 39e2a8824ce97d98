import pytest

from cost_model import from_hf_config, get_preset
from cost_model.errors import InvalidModel, UnknownName


@pytest.mark.parametrize(
    "preset, published_b, tol",
    [
        ("gpt3-175b", 174.6, 0.005),  # Brown et al. 2020 / Narayanan 2021 Eq. 2
        ("llama3-8b", 8.03, 0.01),  # Llama 3 model card
        ("llama3-70b", 70.6, 0.01),
        ("llama3-405b", 405.9, 0.01),
        ("llama2-7b", 6.74, 0.01),
        ("llama2-70b", 68.98, 0.01),
        ("mixtral-8x7b", 46.7, 0.01),
        ("mixtral-8x22b", 140.6, 0.01),
    ],
)
def test_parameter_counts_match_published_sizes(preset, published_b, tol):
    params = get_preset(preset).total_params() / 1e9
    assert abs(params - published_b) / published_b <= tol, params


def test_gpt_params_match_narayanan_eq2():
    # Ψ = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)) for GPT with learned positions and tied head.
    m = get_preset("gpt3-175b")
    L, h, V, s = m.num_layers, m.hidden_size, m.vocab_size, m.learned_positions
    eq2 = 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))
    # Eq. 2 ignores the final LayerNorm (2h): everything else is counted identically.
    assert m.total_params() == pytest.approx(eq2 + 2 * h, rel=1e-9)


def test_hf_llama_config_with_gqa_and_gated_ffn():
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    }
    spec = from_hf_config(cfg)
    assert spec.gated_ffn and spec.kv_size == 1024 and not spec.tie_embeddings
    assert spec.total_params() == get_preset("llama3-8b").total_params()


def test_hf_gpt2_names_default_to_4h_ungated_ffn():
    spec = from_hf_config({"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024})
    assert spec.ffn_hidden_size == 3072 and not spec.gated_ffn and spec.tie_embeddings
    assert abs(spec.total_params() / 1e6 - 124.4) < 0.5  # GPT-2 small: 124M


def test_hf_mixtral_and_qwen_moe_fields():
    mix = from_hf_config({"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                          "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "num_local_experts": 8,
                          "num_experts_per_tok": 2})
    assert mix.is_moe and mix.total_params() == get_preset("mixtral-8x7b").total_params()
    assert mix.active_params() < mix.total_params() / 3
    qwen = from_hf_config({"model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
                           "num_key_value_heads": 16, "intermediate_size": 5632, "moe_intermediate_size": 1408, "num_experts": 60,
                           "num_experts_per_tok": 4, "shared_expert_intermediate_size": 5632, "vocab_size": 151936})
    assert qwen.num_experts == 60 and qwen.ffn_hidden_size == 1408 and qwen.shared_expert_ffn_hidden_size == 5632
    assert 13.5 < qwen.total_params() / 1e9 < 14.8  # Qwen1.5-MoE-A2.7B: 14.3B total


def test_layer_graph_has_embedding_layers_and_head():
    g = get_preset("llama3-8b").layer_graph()
    assert [x.kind for x in (g[0], g[1], g[-1])] == ["embedding", "decoder", "head"]
    assert len(g) == 34 and sum(x.params for x in g) == get_preset("llama3-8b").total_params()


@pytest.mark.parametrize(
    "cfg, field",
    [
        ({"hidden_size": 4096, "num_attention_heads": 32}, "num_hidden_layers"),
        ({"num_hidden_layers": 2, "hidden_size": 4096, "num_attention_heads": 30}, "num_attention_heads"),
        ({"num_hidden_layers": 2, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 5}, "num_key_value_heads"),
        ({"num_hidden_layers": -1, "hidden_size": 4096, "num_attention_heads": 32}, "num_hidden_layers"),
        ({"num_hidden_layers": 2, "hidden_size": "big", "num_attention_heads": 32}, "hidden_size"),
    ],
)
def test_bad_hf_configs_name_the_field(cfg, field):
    with pytest.raises(InvalidModel) as e:
        from_hf_config(cfg)
    assert e.value.field.endswith(field)


def test_unknown_preset():
    with pytest.raises(UnknownName) as e:
        get_preset("gpt5")
    assert "llama3-70b" in e.value.message
