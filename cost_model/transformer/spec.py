"""Model specifications: transformer shapes from presets or Hugging Face ``config.json``.

A :class:`TransformerSpec` is the per-layer representation the cost model works on: an
embedding (plus learned positions for GPT-style models), ``num_layers`` decoder layers, a final
norm and an LM head (tied or not).  Parameter counts follow the GEMM shapes exactly
(grouped/multi-query attention, an explicit ``head_dim``, multi-head latent attention, gated
FFNs, MoE routed and shared experts, dense-first layers, router, biases and norms), so that
e.g. GPT-3 175B counts 174.6B, Llama-3-8B 8.03B and DeepSeek-V3 671.0B (37.5B active).

Decoder layers need not be identical: MoE models may keep some layers dense
(``dense_layer_indices``), and sliding-window models use a window on some layers
(``local_attention_layers``).  :meth:`TransformerSpec.layer_variants` splits such a model into
uniform variants with the fraction of layers each covers; the per-layer cost model costs each
variant and weighs them (a stage is costed with the model's average layer).

:func:`from_hf_config` reads a Hugging Face ``config.json`` per architecture family
(:data:`FAMILIES`), refuses architectures the cost model cannot represent (state-space, RWKV,
encoder-decoder, vision/audio towers) and lists every field it does not know in
``TransformerSpec.warnings`` (which reach the plan's and the estimate's ``warnings``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cost_model.errors import InvalidModel, UnknownName
from cost_model.units import BILLION, MILLION

POSITION_EMBEDDINGS = ("rope", "learned", "alibi", "none")


@dataclass(frozen=True)
class LayerInfo:
    """One entry of the per-layer representation."""

    kind: str  # "embedding" | "decoder" | "head"
    index: int
    params: int


@dataclass(frozen=True)
class TransformerSpec:
    """A decoder-only transformer.  Fields beyond the first seven default to a plain
    Llama/GPT layer; see the module docstring for non-uniform layers."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int  # per expert for MoE models
    vocab_size: int
    gated_ffn: bool = False
    tie_embeddings: bool = False
    num_experts: int = 1
    experts_per_token: int = 1
    shared_expert_ffn_hidden_size: int = 0  # all shared experts together (gated like the routed ones)
    learned_positions: int = 0  # rows of a learned position table (GPT); 0 for RoPE
    bias: bool = False  # GPT-style: every linear layer and norm has a bias, trained with dropout
    norm: str = "layernorm"  # or "rmsnorm"
    model_type: str = "gpt"
    head_dim: int = 0  # 0: hidden_size // num_heads
    qkv_bias: bool = False  # biases on Q, K, V only (Qwen2) — implied by ``bias``
    out_bias: bool = False  # bias on the attention output projection — implied by ``bias``
    mlp_bias: bool = False  # biases on the FFN matrices — implied by ``bias``
    head_bias: bool = False  # a bias on the LM head (Phi-3.5-MoE)
    norms_per_layer: int = 2  # 1 for Falcon-7B's shared norm, 4 for Gemma-2's sandwich norms
    qk_norm: bool = False  # per-head RMSNorm of Q and K (Qwen3, OLMo-2 style)
    dense_layer_indices: tuple[int, ...] = ()  # MoE models: layers with a dense FFN
    dense_ffn_hidden_size: int = 0  # FFN width of those layers
    q_lora_rank: int = 0  # MLA (DeepSeek-V2/V3): low-rank query; 0 = full-rank query
    kv_lora_rank: int = 0  # MLA: compressed KV width; > 0 turns MLA on
    qk_rope_head_dim: int = 0  # MLA: rotary part of each query/key head (head_dim is the rest)
    v_head_dim: int = 0  # MLA: value head width
    position_embedding: str = ""  # rope | learned | alibi | none; "" → learned with a table, else rope
    rope_theta: float = 0.0  # 0: the framework's default
    rope_scaling: tuple[tuple[str, Any], ...] = ()
    activation: str = ""  # "silu", "gelu", "gelu_tanh", ...; "" → silu if gated else gelu
    sliding_window: int = 0
    local_attention_layers: int = 0  # layers that use ``sliding_window`` or chunks (the others attend globally)
    #: Chunked local attention (Llama 4's ``attention_chunk_size``): on the local layers each
    #: query attends causally within its own chunk of this many tokens; 0: none.
    attention_chunk_size: int = 0
    mtp_layers: int = 0  # multi-token-prediction modules (DeepSeek-V3), trained beside the model
    max_position_embeddings: int = 0
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // max(self.num_heads, 1))
        if not self.position_embedding:
            object.__setattr__(self, "position_embedding", "learned" if self.learned_positions else "rope")
        if not self.activation:
            object.__setattr__(self, "activation", "silu" if self.gated_ffn else "gelu")

    # ---- derived shapes -------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """Width of one query/key head (MLA: the no-position part plus the rotary part)."""
        return self.head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def kv_head_dim(self) -> float:
        """Mean of the key and value head widths: K and V together are ``2·kv_size`` wide."""
        return (self.qk_head_dim + self.value_head_dim) / 2 if self.is_mla else self.head_dim

    @property
    def q_size(self) -> int:
        """Width of Q (all heads)."""
        return self.num_heads * self.qk_head_dim

    @property
    def attn_out_size(self) -> int:
        """Input width of the attention output projection (all heads' values)."""
        return self.num_heads * self.value_head_dim

    @property
    def kv_size(self) -> float:
        """Width of K (and of V): kv heads × head dim (MLA: the up-projected heads, mean width)."""
        return self.num_kv_heads * self.kv_head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.gated_ffn else 2

    @property
    def moe_layers(self) -> int:
        return self.num_layers - len(self.dense_layer_indices) if self.is_moe else 0

    @property
    def has_qkv_bias(self) -> bool:
        return self.bias or self.qkv_bias

    @property
    def has_out_bias(self) -> bool:
        return self.bias or self.out_bias

    @property
    def has_mlp_bias(self) -> bool:
        return self.bias or self.mlp_bias

    # ---- parameter counts --------------------------------------------------------------------
    def qkv_weights(self) -> int:
        """Weights of the input projections (Q, K, V; MLA: the down and up projections)."""
        h = self.hidden_size
        if not self.is_mla:
            return h * (self.q_size + 2 * self.num_kv_heads * self.head_dim)
        q = h * self.q_lora_rank + self.q_lora_rank * self.q_size if self.q_lora_rank else h * self.q_size
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv += self.kv_lora_rank * self.num_heads * (self.head_dim + self.v_head_dim)
        return q + kv

    def attention_params(self) -> int:
        h = self.hidden_size
        p = self.qkv_weights() + self.attn_out_size * h
        if self.has_qkv_bias:
            p += self.q_size + 2 * self.num_kv_heads * self.head_dim
        if self.has_out_bias:
            p += h
        if self.qk_norm:
            p += 2 * self.head_dim
        if self.is_mla:  # RMSNorms of the compressed query and KV
            p += self.q_lora_rank + self.kv_lora_rank
        return p

    def expert_params(self, ffn_hidden_size: int | None = None) -> int:
        """Parameters of one expert (or of the dense FFN)."""
        h, f = self.hidden_size, ffn_hidden_size or self.ffn_hidden_size
        p = self.ffn_matrices * h * f
        if self.has_mlp_bias:
            p += f * (self.ffn_matrices - 1) + h
        return p

    def norm_params(self) -> int:
        return (2 if self.norm == "layernorm" else 1) * self.hidden_size

    def moe_ffn_params(self) -> int:
        """FFN of one MoE layer: the routed experts, the router and the shared experts."""
        p = self.num_experts * self.expert_params() + self.hidden_size * self.num_experts
        if self.shared_expert_ffn_hidden_size:
            p += self.expert_params(self.shared_expert_ffn_hidden_size)
        return p

    def dense_ffn_params(self) -> int:
        return self.expert_params(self.dense_ffn_hidden_size or self.ffn_hidden_size)

    def ffn_params(self) -> int:
        """FFN parameters of an MoE layer (MoE models) or of the dense layer."""
        return self.moe_ffn_params() if self.is_moe else self.expert_params()

    def _layer_params(self, ffn: int) -> int:
        return self.attention_params() + ffn + self.norms_per_layer * self.norm_params()

    def decoder_params(self) -> int:
        """All decoder layers together."""
        if not self.is_moe:
            return self.num_layers * self._layer_params(self.expert_params())
        dense = len(self.dense_layer_indices)
        return self.moe_layers * self._layer_params(self.moe_ffn_params()) + dense * self._layer_params(self.dense_ffn_params())

    def decoder_layer_params(self) -> int | float:
        """Parameters of the average decoder layer (exact for uniform layers)."""
        if self.is_moe and self.dense_layer_indices:
            return self.decoder_params() / self.num_layers
        return self._layer_params(self.ffn_params())

    def routed_expert_params_per_layer(self) -> int | float:
        """Routed-expert parameters of the average decoder layer (the part EP shards)."""
        if not self.is_moe:
            return 0
        per_moe_layer = self.num_experts * self.expert_params()
        return per_moe_layer if not self.dense_layer_indices else per_moe_layer * self.moe_layers / self.num_layers

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size + self.learned_positions * self.hidden_size

    def head_params(self) -> int:
        """Final norm plus the LM head (0 extra weights when tied to the embedding)."""
        head = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self.norm_params() + head + (self.vocab_size if self.head_bias else 0)

    def total_params(self) -> int:
        """Parameters of the model (the multi-token-prediction modules are :meth:`mtp_params`)."""
        return self.embedding_params() + self.decoder_params() + self.head_params()

    def active_params(self) -> int:
        """Parameters touched per token (MoE: only the top-k routed experts)."""
        if not self.is_moe:
            return self.total_params()
        inactive = (self.num_experts - self.experts_per_token) * self.expert_params()
        return self.total_params() - self.moe_layers * inactive

    def mtp_params(self) -> int:
        """DeepSeek-V3's multi-token-prediction modules: per module one decoder layer (MoE), two
        RMSNorms, a [2h, h] projection and a final norm; embedding and head are shared."""
        if not self.mtp_layers:
            return 0
        layer = self._layer_params(self.moe_ffn_params() if self.is_moe else self.expert_params())
        h = self.hidden_size
        return self.mtp_layers * (layer + 2 * h * h + 3 * self.norm_params())

    def mtp_routed_expert_params(self) -> int:
        """The routed experts of the MTP modules' MoE layers (the part of :meth:`mtp_params` EP shards)."""
        return self.mtp_layers * self.num_experts * self.expert_params() if self.is_moe else 0

    def layer_variants(self) -> tuple[tuple[float, TransformerSpec], ...]:
        """(fraction of the decoder layers, uniform spec) pairs that cover the model: MoE vs
        dense FFN and windowed vs global attention (assumed independent).  One pair, the model
        itself, for uniform layers."""
        L = self.num_layers
        ffns: list[tuple[float, dict[str, Any]]] = [(1.0, {})]
        if self.is_moe and self.dense_layer_indices:
            dense = len(self.dense_layer_indices)
            dense_kw = {"num_experts": 1, "experts_per_token": 1, "shared_expert_ffn_hidden_size": 0,
                        "ffn_hidden_size": self.dense_ffn_hidden_size or self.ffn_hidden_size}
            ffns = [((L - dense) / L, {}), (dense / L, dense_kw)]
        attns: list[tuple[float, dict[str, Any]]] = [(1.0, {})]
        if (self.sliding_window or self.attention_chunk_size) and 0 < self.local_attention_layers < L:
            local = self.local_attention_layers
            attns = [(local / L, {"local_attention_layers": L}),
                     ((L - local) / L, {"sliding_window": 0, "attention_chunk_size": 0, "local_attention_layers": 0})]
        if len(ffns) == 1 and len(attns) == 1:
            return ((1.0, self),)
        return tuple(
            (wf * wa, replace(self, dense_layer_indices=(), **kf, **ka)) for wf, kf in ffns for wa, ka in attns if wf * wa > 0
        )

    def attention_span(self, sequence_length: float) -> float:
        """Keys each query attends to in a uniform layer: the window when every layer is
        windowed, else the sequence (:meth:`layer_variants` separates mixed models).

        The attention cost reads a span W as a causal sliding window over s tokens, whose
        query-key pairs number W·s − W²/2 (``layer_cost``: causal fraction 1 − W/2s).  A chunked
        layer (chunks of C tokens, each causal within itself) has s·C/2 pairs when C divides s,
        so its span is the window with as many pairs: W = s − √(s² − C·s); with s ≤ C it is the
        plain causal sequence (HF ``Llama4TextAttention``: chunked attention on the RoPE layers)."""
        s = float(sequence_length)
        if self.local_attention_layers >= self.num_layers:
            if self.sliding_window:
                return float(min(self.sliding_window, s))
            if self.attention_chunk_size and s > self.attention_chunk_size:
                return s - math.sqrt(s * s - self.attention_chunk_size * s)
        return s

    def matmul_params_per_token(self) -> float:
        """Weights of the average decoder layer's GEMMs that one token multiplies (QKV and
        output projections, top-k routed and shared experts, router; no biases or norms):
        forward FLOPs per token = 2× this."""
        h = self.hidden_size
        total = 0.0
        for frac, v in self.layer_variants():
            per = v.qkv_weights() + v.attn_out_size * h
            k = v.experts_per_token if v.is_moe else 1
            per += k * v.ffn_matrices * h * v.ffn_hidden_size
            if v.is_moe:
                per += h * v.num_experts + v.ffn_matrices * h * v.shared_expert_ffn_hidden_size
            total += frac * per
        return total

    def attention_core_width(self, sequence_length: float) -> float:
        """Σ over heads of (QK width + PV width)/2 × keys attended, of the average layer: the
        attention core's forward FLOPs per token are 4× this (Q·Kᵀ and P·V)."""
        return sum(
            frac * v.num_heads * v.kv_head_dim * v.attention_span(sequence_length) for frac, v in self.layer_variants()
        )

    def layer_graph(self) -> tuple[LayerInfo, ...]:
        dense = set(self.dense_layer_indices) if self.is_moe else set()
        moe_layer = self._layer_params(self.ffn_params())
        dense_layer = self._layer_params(self.dense_ffn_params())
        layers = [LayerInfo("embedding", 0, self.embedding_params())]
        layers += [LayerInfo("decoder", i + 1, dense_layer if i in dense else moe_layer) for i in range(self.num_layers)]
        layers.append(LayerInfo("head", self.num_layers + 1, self.head_params()))
        return tuple(layers)

    def to_dict(self) -> dict[str, Any]:
        """The spec in Hugging Face ``config.json`` names (what the exporters read)."""
        out: dict[str, Any] = {
            "name": self.name,
            "model_type": self.model_type,
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.ffn_hidden_size,
            "gated_ffn": self.gated_ffn,
            "hidden_act": self.activation,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_embeddings,
            "num_local_experts": self.num_experts,
            "num_experts_per_tok": self.experts_per_token,
            "norm": self.norm,
            "position_embedding": self.position_embedding,
            "bias": self.bias,
            "qkv_bias": self.has_qkv_bias,
            "out_bias": self.has_out_bias,
            "mlp_bias": self.has_mlp_bias,
            "params": self.total_params(),
        }
        optional = {
            "learned_positions": self.learned_positions,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) or None,
            "shared_expert_intermediate_size": self.shared_expert_ffn_hidden_size,
            "dense_layer_indices": list(self.dense_layer_indices),
            "dense_intermediate_size": self.dense_ffn_hidden_size,
            "norms_per_layer": self.norms_per_layer if self.norms_per_layer != 2 else 0,
            "qk_norm": self.qk_norm,
            "lm_head_bias": self.head_bias,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "sliding_window": self.sliding_window,
            "attention_chunk_size": self.attention_chunk_size,
            "local_attention_layers": self.local_attention_layers,
            "num_nextn_predict_layers": self.mtp_layers,
        }
        out.update({k: v for k, v in optional.items() if v})
        if self.is_moe:
            out["active_params"] = self.active_params()
        if self.mtp_layers:
            out["mtp_params"] = self.mtp_params()
        return out


def _gpt(name: str, layers: int, hidden: int, heads: int, vocab: int = 50257, positions: int = 2048) -> TransformerSpec:
    return TransformerSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=4 * hidden,
        vocab_size=vocab,
        gated_ffn=False,
        tie_embeddings=True,
        learned_positions=positions,
        bias=True,
        norm="layernorm",
        model_type="gpt",
        max_position_embeddings=positions,
    )


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, **kw: Any) -> TransformerSpec:
    return TransformerSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=ffn,
        vocab_size=vocab,
        gated_ffn=True,
        tie_embeddings=False,
        bias=False,
        norm="rmsnorm",
        model_type=kw.pop("model_type", "llama"),
        **kw,
    )


#: Shapes from the GPT-3 paper (Brown et al. 2020, Table 2.1; 13B uses h=5120 as in Megatron),
#: the Llama 2 and Llama 3 model cards / config.json files, and Mixtral's config.json.
PRESETS: dict[str, TransformerSpec] = {
    p.name: p
    for p in (
        _gpt("gpt3-125m", 12, 768, 12),
        _gpt("gpt3-350m", 24, 1024, 16),
        _gpt("gpt3-1.3b", 24, 2048, 16),
        _gpt("gpt3-2.7b", 32, 2560, 32),
        _gpt("gpt3-6.7b", 32, 4096, 32),
        _gpt("gpt3-13b", 40, 5120, 40),
        _gpt("gpt3-175b", 96, 12288, 96),
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, rope_theta=10000.0, max_position_embeddings=4096),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, rope_theta=10000.0, max_position_embeddings=4096),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, rope_theta=10000.0, max_position_embeddings=4096),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, rope_theta=500000.0, max_position_embeddings=8192),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, rope_theta=500000.0, max_position_embeddings=8192),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, rope_theta=500000.0, max_position_embeddings=8192),
        _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, num_experts=8, experts_per_token=2, model_type="mixtral",
               rope_theta=1e6, max_position_embeddings=32768),
        _llama("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, num_experts=8, experts_per_token=2, model_type="mixtral",
               rope_theta=1e6, max_position_embeddings=65536),
    )
}


def get_preset(name: str, field_path: str = "model.preset") -> TransformerSpec:
    key = name.lower() if isinstance(name, str) else name
    if key in PRESETS:
        return PRESETS[key]
    raise UnknownName(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}", field=field_path)


# ---- Hugging Face config.json --------------------------------------------------------------

#: model_type → family.  Each family fixes what its config.json leaves implicit (HF modelling
#: code: which biases, norms, activation, tying and positions the architecture has).
FAMILIES: dict[str, str] = {
    "gpt2": "gpt2", "gpt": "gpt2",
    "falcon": "falcon", "RefinedWeb": "falcon", "RefinedWebModel": "falcon",
    "llama": "llama", "mistral": "llama", "mixtral": "llama", "phi3": "llama",
    "qwen2": "qwen2", "qwen2_moe": "qwen2",
    "qwen3": "qwen3", "qwen3_moe": "qwen3",
    "gemma": "gemma", "gemma2": "gemma", "gemma3_text": "gemma",
    "phimoe": "phimoe",
    "deepseek_v2": "deepseek", "deepseek_v3": "deepseek",
    "gpt_neox": "gpt_neox", "bloom": "bloom", "opt": "opt", "gptj": "gptj",
    "chatglm": "chatglm",
    "ernie4_5": "ernie", "ernie4_5_moe": "ernie",
    "deepseek": "deepseek",
    "starcoder2": "starcoder2", "phi": "phi", "qwen": "qwen", "internlm2": "internlm2",
    "olmo2": "olmo2", "olmoe": "olmo2", "granite": "granite", "minicpm": "minicpm", "cohere": "cohere",
    "nemotron": "nemotron", "stablelm": "stablelm", "glm": "glm", "glm4": "glm", "gpt_oss": "gpt_oss",
    "glm4_moe": "glm4_moe", "llama4_text": "llama4", "mpt": "mpt", "dbrx": "dbrx",
    "olmo": "olmo", "baichuan": "baichuan",
}

#: Architectures the cost model cannot represent, by kind.
UNSUPPORTED: dict[str, tuple[str, ...]] = {
    "a state-space / recurrent model": (
        "mamba", "mamba2", "falcon_mamba", "falcon_h1", "jamba", "zamba", "zamba2", "bamba", "nemotron_h",
        "rwkv", "rwkv5", "rwkv6", "rwkv7", "recurrent_gemma", "xlstm", "lfm2",
        # hybrids of linear-attention (recurrent-state) layers and softmax attention
        "qwen3_next", "minimax", "minimax_m1", "kimi_linear", "granitemoehybrid",
    ),
    "an encoder-decoder model": (
        "t5", "mt5", "umt5", "longt5", "switch_transformers", "bart", "mbart", "pegasus", "pegasus_x", "marian",
        "whisper", "led", "prophetnet", "fsmt", "blenderbot", "m2m_100", "nllb_moe", "seamless_m4t", "encoder-decoder",
    ),
    "an encoder-only model": ("bert", "roberta", "xlm-roberta", "deberta", "deberta-v2", "electra", "albert",
                              "distilbert", "modernbert"),
    "a multimodal model (vision/audio tower)": (
        "llava", "llava_next", "qwen2_vl", "qwen2_5_vl", "mllama", "idefics", "idefics2", "idefics3", "paligemma",
        "gemma3", "clip", "siglip", "blip", "blip-2", "pixtral", "llama4", "qwen2_audio", "whisper",
        "ernie4_5_moe_vl", "ernie4_5_vl_moe",
    ),
}

#: Fields that do not change FLOPs, bytes or memory of training: tokenizer ids, dropout and
#: initialisation, numerical epsilons, router loss coefficients and routing rules (top-k is
#: what costs), inference-cache switches, bookkeeping.  ``attn_logit_softcapping`` /
#: ``final_logit_softcapping`` (Gemma-2) add one tanh per attention score / logit, and
#: ``query_pre_attn_scalar`` is a constant scale: elementwise work beside the GEMMs they follow.
HARMLESS_FIELDS = frozenset({
    "architectures", "model_type", "_name_or_path", "name", "transformers_version", "torch_dtype", "dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "unk_token_id",
    "initializer_range", "initializer_factor", "use_cache", "attention_dropout", "hidden_dropout", "resid_pdrop",
    "embd_pdrop", "attn_pdrop", "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "layer_norm_epsilon", "layer_norm_eps", "rms_norm_eps", "norm_epsilon",
    "output_attentions", "output_hidden_states", "return_dict", "output_router_logits", "router_aux_loss_coef",
    "aux_loss_alpha", "router_z_loss_coef", "seq_aux", "task_specific_params", "auto_map", "pretraining_tp",
    "gradient_checkpointing", "tokenizer_class", "id2label", "label2id", "problem_type", "attn_implementation",
    "_attn_implementation", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
    "n_ctx", "norm_topk_prob", "routed_scaling_factor", "scoring_func", "topk_method", "n_group", "topk_group",
    "ep_size", "input_jitter_noise", "router_jitter_noise", "query_pre_attn_scalar", "attn_logit_softcapping",
    "final_logit_softcapping", "cache_implementation", "original_max_position_embeddings",
    "apply_residual_connection_post_layernorm", "is_decoder", "max_window_layers", "use_sliding_window",
    "tie_word_embeddings", "sliding_window_pattern", "layer_types", "rope_local_base_freq", "embedding_multiplier",
    "use_return_dict", "chunk_size_feed_forward", "torchscript", "use_bfloat16", "prefix", "finetuning_task",
    "bad_words_ids", "num_beams", "max_length", "min_length", "do_sample", "temperature", "top_k", "top_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "early_stopping", "num_return_sequences",
    "tf_legacy_loss", "pruned_heads", "torch_compile", "mlp_only_layers", "decoder_sparse_step", "moe_layer_freq",
    "rope_scaling", "rope_parameters", "rope_theta", "lm_head_bias",
    # GPT-NeoX, BLOOM, OPT, GPT-J: a parallel residual, a partial rotary width, post-LN, fused
    # kernels and fp32 softmax switches, dropout rates and init scales cost nothing the family does
    # not already cost
    "use_parallel_residual", "rotary_pct", "rotary_dim", "classifier_dropout", "slow_but_exact",
    "masked_softmax_fusion", "offset_alibi", "attention_softmax_in_fp32", "bias_dropout_fusion",
    "skip_bias_add", "skip_bias_add_qkv", "do_layer_norm_before", "_remove_final_layer_norm",
    "layer_norm_elementwise_affine", "init_std", "layerdrop", "dropout", "activation_dropout", "rotary",
    # ChatGLM/GLM-4 (THUDM modeling_chatglm.py): query-key layer scaling, an fp32 residual, the
    # rotary variant and its base ratio, the final norm's presence
    "apply_query_key_layer_scaling", "fp32_residual_connection", "original_rope", "rope_ratio", "post_layer_norm",
    "layernorm_epsilon",
})

#: Fields the parser reads (shape, positions, biases, MoE, MLA, windows, MTP).
COSTED_FIELDS = frozenset({
    "num_hidden_layers", "n_layer", "num_layers", "hidden_size", "n_embd", "d_model", "num_attention_heads", "n_head",
    "num_key_value_heads", "num_kv_heads", "multi_query", "head_dim", "intermediate_size",
    "n_inner", "ffn_hidden_size", "vocab_size", "n_positions", "max_position_embeddings", "hidden_act",
    "hidden_activation", "activation_function", "attention_bias", "mlp_bias", "alibi", "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
    "moe_topk", "moe_intermediate_size", "shared_expert_intermediate_size", "n_shared_experts", "q_lora_rank",
    "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "sliding_window", "num_nextn_predict_layers",
    "n_embed", "ffn_dim", "rotary_emb_base", "padded_vocab_size", "kv_channels", "seq_length", "first_k_dense_replace",
    "n_layers", "n_heads", "max_seq_len",
})

#: Fields only one family's parser reads: under another family they are not costed and so are
#: listed in the warnings like any unknown field.
FAMILY_FIELDS: dict[str, frozenset[str]] = {
    "opt": frozenset({"enable_bias", "word_embed_proj_dim"}),
    # HF FalconConfig: the one bias switch, the decoder variant and its norms
    "falcon": frozenset({"bias", "new_decoder_architecture", "parallel_attn", "num_ln_in_parallel_attn"}),
    "chatglm": frozenset({"multi_query_attention", "multi_query_group_num", "add_bias_linear", "add_qkv_bias", "rmsnorm"}),
    # ERNIE 4.5 (HF Ernie4_5Config / Ernie4_5_MoeConfig): one switch for every projection's bias,
    # the MoE shape and layer range under its own names; moe_norm_min (a routing epsilon),
    # moe_gate and moe_use_aux_free (routing rules) cost nothing
    "ernie": frozenset({"use_bias", "moe_num_experts", "moe_k", "moe_num_shared_experts", "moe_layer_start_index",
                        "moe_layer_end_index", "moe_layer_interval", "moe_norm_min", "moe_gate", "moe_use_aux_free"}),
    # HF Starcoder2Config: one bias switch for every linear layer; the residual and embedding
    # dropout of a biased (GPT-style) model are costed with it; BigCode's checkpoints also carry
    # mlp_type and norm_type, which HF's Starcoder2 does not read (always c_fc/c_proj, LayerNorm)
    "starcoder2": frozenset({"use_bias", "residual_dropout", "embedding_dropout", "mlp_type", "norm_type"}),
    # HF PhiConfig: the rotary width and an optional per-head q/k LayerNorm
    "phi": frozenset({"partial_rotary_factor", "qk_layernorm"}),
    # Qwen-1 (remote code modeling_qwen.py): the projections' bias switch; the rest are dtype and
    # kernel switches, dropout rates, and inference-time context extension (dynamic NTK, log-n
    # query scaling past seq_length)
    "qwen": frozenset({"no_bias", "bf16", "fp16", "fp32", "use_flash_attn", "use_dynamic_ntk", "use_logn_attn",
                       "emb_dropout_prob", "attn_dropout_prob", "softmax_in_fp32", "use_cache_quantization",
                       "use_cache_kernel", "onnx_safe"}),
    "internlm2": frozenset({"bias"}),  # remote code: the packed wqkv's and wo's bias
    # Gemma-2's checkpoints repeat sliding_window (which is read) as sliding_window_size
    "gemma": frozenset({"sliding_window_size"}),
    "olmo2": frozenset({"clip_qkv"}),  # OLMoE: a clamp of q, k and v (elementwise)
    "olmo": frozenset({"clip_qkv"}),  # a clamp of q, k and v (elementwise)
    # remote code (modeling_baichuan.py): the tokenizer's length and the z-loss weight (a scalar
    # term of the loss over the logits it already has)
    "baichuan": frozenset({"model_max_length", "z_loss_weight"}),
    # HF GraniteConfig: scalar scales of the residual branches, the attention scores and the logits
    "granite": frozenset({"attention_multiplier", "residual_multiplier", "logits_scaling"}),
    "minicpm": frozenset({"scale_emb", "dim_model_base", "scale_depth"}),  # remote code: μP scales
    "cohere": frozenset({"logit_scale", "use_qk_norm"}),
    "nemotron": frozenset({"partial_rotary_factor", "norm_eps"}),
    "stablelm": frozenset({"use_qkv_bias", "qk_layernorm", "use_parallel_residual", "partial_rotary_factor"}),
    "glm": frozenset({"partial_rotary_factor"}),
    # HF GptOssConfig: the experts' clamped SwiGLU constants (elementwise); the original
    # checkpoint's config.json also spells top-k experts_per_token and names its pre-YaRN length
    "gpt_oss": frozenset({"swiglu_limit", "swiglu_alpha", "experts_per_token", "initial_context_length"}),
    # HF Glm4MoeConfig: a partial rotary width and an optional per-head q/k RMSNorm
    "glm4_moe": frozenset({"partial_rotary_factor", "use_qk_norm"}),
    # HF Llama4TextConfig: the MoE layers (a list, or every interleave_moe_layer_step-th), the
    # dense layers' FFN width, the NoPE layers (the others use RoPE and chunked attention), an
    # L2 norm of q and k; the attention temperature tuning is a scalar per query
    "llama4": frozenset({"moe_layers", "interleave_moe_layer_step", "intermediate_size_mlp", "no_rope_layers",
                         "no_rope_layer_interval", "attention_chunk_size", "use_qk_norm", "attn_temperature_tuning",
                         "floor_scale", "attn_scale", "for_llm_compressor"}),
}


def _int_field(cfg: Mapping[str, Any], keys: tuple[str, ...], path: str, required: bool = True, default: int | None = None,
               minimum: int = 1) -> int | None:
    """The first of ``keys`` present (not null) as an integer of at least ``minimum`` (0 for the
    counts and widths a config writes as 0 to say "none": shared experts, a query rank, MTP
    modules)."""
    for key in keys:
        if key in cfg and cfg[key] is not None:
            val = cfg[key]
            if isinstance(val, bool) or not isinstance(val, int) or val < minimum:
                what = "a positive integer" if minimum >= 1 else "a non-negative integer"
                raise InvalidModel(f"must be {what}, got {val!r}", field=f"{path}.{key}")
            if val > 100_000_000:  # Llama 4 Scout's context is 10,485,760 positions
                raise InvalidModel(f"is implausibly large ({val})", field=f"{path}.{key}")
            return val
    if required:
        raise InvalidModel(f"is required (one of: {', '.join(keys)})", field=f"{path}.{keys[0]}")
    return default


def _layer_index(cfg: Mapping[str, Any], key: str, layers: int, path: str, default: int) -> int:
    """A layer index in [0, layers), -1 meaning the last layer (ERNIE's MoE layer range)."""
    val = cfg.get(key)
    if val is None:
        return default
    if isinstance(val, bool) or not isinstance(val, int) or not -1 <= val < layers:
        raise InvalidModel(f"must be a layer index from 0 to {layers - 1} (or -1: the last), got {val!r}", field=f"{path}.{key}")
    return layers - 1 if val == -1 else val


def _bool_field(cfg: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    val = cfg.get(key)
    if val is None:
        return default
    if not isinstance(val, bool):
        raise InvalidModel(f"must be true or false, got {val!r}", field=f"{path}.{key}")
    return val


def _refuse_unsupported(cfg: Mapping[str, Any], model_type: str, path: str) -> None:
    supported = ", ".join(sorted({k for k in FAMILIES if k[0].islower()}))
    kind = next((k for k, types in UNSUPPORTED.items() if model_type in types), None)
    if kind is None and (cfg.get("is_encoder_decoder") is True or "encoder_layers" in cfg):
        kind = "an encoder-decoder model"
    if kind is None and any(k in cfg for k in ("vision_config", "audio_config", "text_config", "vision_tower")):
        kind = "a multimodal model (vision/audio tower)"
    if kind is None and any(k in cfg for k in ("state_size", "d_state", "ssm_cfg", "attn_layer_indices")):
        kind = "a state-space / recurrent model"
    types = cfg.get("layer_types")
    if kind is None and isinstance(types, list) and any(t in ("linear_attention", "mamba", "conv") for t in types):
        kind = "a state-space / recurrent model"  # a hybrid: some layers keep a recurrent state
    if kind is not None:
        hint = " (to plan its language model alone, submit its text_config)" if "text_config" in cfg else ""
        raise InvalidModel(
            f"model_type {model_type or '(none)'!r} is {kind}, which the cost model cannot represent{hint}; "
            f"supported: decoder-only transformers of the families {supported}",
            field=f"{path}.model_type",
        )


def _family(cfg: Mapping[str, Any], path: str) -> tuple[str, str, list[str]]:
    """(model_type, family, warnings).  A config without ``model_type`` is read by its keys."""
    raw = cfg.get("model_type")
    if raw is not None and not isinstance(raw, str):
        raise InvalidModel("must be a string", field=f"{path}.model_type")
    model_type = raw or ("gpt2" if "n_embd" in cfg else "llama")
    _refuse_unsupported(cfg, model_type, path)
    if model_type in FAMILIES:
        return model_type, FAMILIES[model_type], []
    return model_type, "gpt2" if "n_embd" in cfg else "llama", [
        f"model_type {model_type!r} is not a family the service knows; costed as a "
        + ("GPT-2" if "n_embd" in cfg else "Llama")
        + "-style decoder (check biases, norms, activation and tying)"
    ]


def _attention_heads(cfg: Mapping[str, Any], family: str, hidden: int, path: str) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dim) under every spelling of GQA/MQA."""
    heads = _int_field(cfg, ("num_attention_heads", "n_head", "n_heads"), path)
    assert heads is not None
    if family == "chatglm":  # multi_query_group_num groups when multi_query_attention
        multi_query = _bool_field(cfg, "multi_query_attention", path, False)
        kv = _int_field(cfg, ("multi_query_group_num",), path, required=False, default=1) if multi_query else heads
    elif family == "falcon":
        # HF FalconAttention: new_decoder_architecture reads num_kv_heads; else multi_query → 1.
        if cfg.get("new_decoder_architecture"):
            kv = _int_field(cfg, ("num_kv_heads",), path, required=False, default=heads)
        else:
            kv = 1 if cfg.get("multi_query") else heads
    else:
        kv = _int_field(cfg, ("num_key_value_heads", "num_kv_heads"), path, required=False, default=None)
        if kv is None:
            kv = 1 if cfg.get("multi_query") else heads
    assert kv is not None
    head_dim = _int_field(cfg, ("head_dim", "kv_channels"), path, required=False)
    if head_dim is None and family != "deepseek":
        if hidden % heads:
            raise InvalidModel(
                f"hidden size {hidden} is not divisible by {heads} attention heads (and no head_dim is given)",
                field=f"{path}.num_attention_heads",
            )
        head_dim = hidden // heads
    if heads % kv:
        key = "num_kv_heads" if "num_kv_heads" in cfg else "num_key_value_heads"
        raise InvalidModel(f"{heads} attention heads are not a multiple of {kv} key/value heads", field=f"{path}.{key}")
    return heads, kv, head_dim or 0


def _dense_layers(cfg: Mapping[str, Any], family: str, layers: int, path: str) -> tuple[int, ...]:
    """Indices of the dense (non-MoE) layers of an MoE model."""
    if family == "ernie":
        # HF Ernie4_5_MoeDecoderLayer: experts where (i + 1) % interval == 0 and start <= i <= end
        # (end -1: the last layer).
        start = _layer_index(cfg, "moe_layer_start_index", layers, path, default=0)
        end = _layer_index(cfg, "moe_layer_end_index", layers, path, default=layers - 1)
        interval = _int_field(cfg, ("moe_layer_interval",), path, required=False, default=1)
        assert interval is not None
        return tuple(i for i in range(layers) if not ((i + 1) % interval == 0 and start <= i <= end))
    if family == "deepseek":
        k = cfg.get("first_k_dense_replace") or 0
        freq = cfg.get("moe_layer_freq") or 1
        if not isinstance(k, int) or not isinstance(freq, int) or k < 0 or freq < 1:
            raise InvalidModel("first_k_dense_replace and moe_layer_freq must be non-negative integers", field=f"{path}.first_k_dense_replace")
        return tuple(i for i in range(layers) if not (i >= k and i % freq == 0))
    if family == "llama4":
        # HF Llama4TextConfig: moe_layers, else every interleave_moe_layer_step-th layer counting
        # from step − 1 (Scout: step 1, every layer; Maverick: step 2, the odd layers)
        step = _int_field(cfg, ("interleave_moe_layer_step",), path, required=False, default=1)
        assert step is not None
        moe = cfg.get("moe_layers")
        if moe is None:
            moe = list(range(step - 1, layers, step))
        if not isinstance(moe, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers for i in moe):
            raise InvalidModel(f"must be a list of layer indices below {layers}", field=f"{path}.moe_layers")
        return tuple(i for i in range(layers) if i not in set(moe))
    only = cfg.get("mlp_only_layers") or []
    step = cfg.get("decoder_sparse_step") or 1
    first = cfg.get("first_k_dense_replace") or 0  # GLM-4.5 and other DeepSeek-style MoEs: dense first layers
    if not isinstance(only, list) or not all(isinstance(i, int) and 0 <= i < layers for i in only):
        raise InvalidModel(f"must be a list of layer indices below {layers}", field=f"{path}.mlp_only_layers")
    if not isinstance(step, int) or step < 1:
        raise InvalidModel("must be a positive integer", field=f"{path}.decoder_sparse_step")
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise InvalidModel("must be a non-negative integer", field=f"{path}.first_k_dense_replace")
    return tuple(i for i in range(layers) if i in only or (i + 1) % step or i < first)


#: The config names of an MoE's expert count, top-k and shared-expert count: every family's
#: spellings, or ERNIE 4.5's own (its names are known only for it: ``FAMILY_FIELDS``).
_MOE_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "": {"experts": ("num_local_experts", "num_experts", "n_routed_experts"), "top_k": ("num_experts_per_tok", "moe_topk"),
         "shared_experts": ("n_shared_experts",)},
    "ernie": {"experts": ("moe_num_experts",), "top_k": ("moe_k",), "shared_experts": ("moe_num_shared_experts",)},
}


def _moe(cfg: Mapping[str, Any], family: str, layers: int, inter: int | None, path: str) -> dict[str, Any]:
    names = _MOE_NAMES.get(family, _MOE_NAMES[""])
    experts = _int_field(cfg, names["experts"], path, required=False, default=1)
    assert experts is not None
    if experts <= 1:
        return {}
    top_k = _int_field(cfg, names["top_k"], path, required=False, default=min(2, experts))
    assert top_k is not None
    if top_k > experts:
        raise InvalidModel(f"num_experts_per_tok {top_k} exceeds the {experts} experts", field=f"{path}.num_experts_per_tok")
    expert_ffn = _int_field(cfg, ("moe_intermediate_size",), path, required=False) or inter
    if expert_ffn is None:
        raise InvalidModel("is required for an MoE model (or moe_intermediate_size)", field=f"{path}.intermediate_size")
    shared = _int_field(cfg, ("shared_expert_intermediate_size",), path, required=False, default=0, minimum=0) or 0
    n_shared = _int_field(cfg, names["shared_experts"], path, required=False, default=0, minimum=0) or 0
    if family == "llama4":  # Llama4TextMoe: one shared expert, Llama4TextMLP of intermediate_size
        n_shared = 1
    shared += n_shared * expert_ffn
    dense = _dense_layers(cfg, family, layers, path)
    if len(dense) == layers:
        raise InvalidModel("every layer is dense: no layer would use the experts", field=f"{path}.mlp_only_layers")
    dense_ffn = _int_field(cfg, ("intermediate_size_mlp",), path, required=False) if family == "llama4" else None
    return {
        "num_experts": experts,
        "experts_per_token": top_k,
        "ffn_hidden_size": expert_ffn,
        "shared_expert_ffn_hidden_size": shared,
        "dense_layer_indices": dense,
        "dense_ffn_hidden_size": (dense_ffn or inter or expert_ffn) if dense else 0,
    }


def _mla(cfg: Mapping[str, Any], heads: int, path: str) -> dict[str, Any]:
    """DeepSeek multi-head latent attention (HF DeepseekV3Attention shapes)."""
    kv_rank = _int_field(cfg, ("kv_lora_rank",), path, required=False)
    if not kv_rank:
        return {}
    return {
        "q_lora_rank": _int_field(cfg, ("q_lora_rank",), path, required=False, default=0, minimum=0),
        "kv_lora_rank": kv_rank,
        "qk_rope_head_dim": _int_field(cfg, ("qk_rope_head_dim",), path),
        "head_dim": _int_field(cfg, ("qk_nope_head_dim",), path),
        "v_head_dim": _int_field(cfg, ("v_head_dim",), path),
        "num_kv_heads": heads,
    }


def _rope(cfg: Mapping[str, Any], path: str) -> dict[str, Any]:
    """RoPE base and scaling under both spellings (``rope_theta``/``rope_scaling`` and
    transformers v5's ``rope_parameters``)."""
    raw_params, raw_scaling = cfg.get("rope_parameters"), cfg.get("rope_scaling")
    params: Mapping[str, Any] = raw_params if isinstance(raw_params, Mapping) else {}
    scaling: Mapping[str, Any] = raw_scaling if isinstance(raw_scaling, Mapping) else {}
    theta = cfg.get("rope_theta", params.get("rope_theta", cfg.get("rotary_emb_base")))  # GPT-NeoX: rotary_emb_base
    if theta is not None and (isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0):
        raise InvalidModel(f"must be a positive number, got {theta!r}", field=f"{path}.rope_theta")
    extra = {k: v for k, v in {**params, **scaling}.items() if k != "rope_theta" and isinstance(v, (str, int, float))}
    if extra.get("rope_type") == "default" and len(extra) == 1:
        extra = {}
    return {"rope_theta": float(theta or 0.0), "rope_scaling": tuple(sorted(extra.items()))}


def _windows(cfg: Mapping[str, Any], model_type: str, layers: int, path: str) -> dict[str, Any]:
    """Sliding-window attention: the window and how many layers use it (``layer_types`` when
    given; else Gemma-2 alternates local/global, Gemma-3 has 5 local per global, Qwen2 windows
    the layers after ``max_window_layers`` only with ``use_sliding_window``, Mistral/Mixtral
    window every layer)."""
    if model_type == "llama4_text":
        return _chunks(cfg, layers, path)
    window = _int_field(cfg, ("sliding_window",), path, required=False)
    if not window:
        return {}
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        local = sum(1 for t in types if t == "sliding_attention")
    elif model_type == "gemma2":
        local = (layers + 1) // 2
    elif model_type == "gemma3_text":
        pattern = cfg.get("sliding_window_pattern") or 6
        local = sum(1 for i in range(layers) if (i + 1) % pattern)
    elif model_type.startswith("qwen"):
        if not cfg.get("use_sliding_window"):
            return {}
        local = max(0, layers - int(cfg.get("max_window_layers") or 0))
    else:
        local = layers
    return {"sliding_window": window, "local_attention_layers": local} if local else {}


def _chunks(cfg: Mapping[str, Any], layers: int, path: str) -> dict[str, Any]:
    """Llama 4's chunked attention: ``attention_chunk_size`` on the RoPE layers (HF
    ``Llama4TextConfig``: ``layer_types`` "chunked_attention", else ``no_rope_layers`` 1, by
    default every layer but each ``no_rope_layer_interval``-th (4)); the NoPE layers attend
    globally."""
    chunk = _int_field(cfg, ("attention_chunk_size",), path, required=False)
    if not chunk:
        return {}
    types, no_rope = cfg.get("layer_types"), cfg.get("no_rope_layers")
    if isinstance(types, list) and len(types) == layers:
        local = sum(1 for t in types if t == "chunked_attention")
    elif no_rope is not None:
        if not isinstance(no_rope, list) or len(no_rope) != layers or not all(v in (0, 1) for v in no_rope):
            raise InvalidModel(f"must be a list of {layers} 0/1 flags (1: the layer uses RoPE)", field=f"{path}.no_rope_layers")
        local = sum(no_rope)
    else:
        interval = _int_field(cfg, ("no_rope_layer_interval",), path, required=False, default=4)
        assert interval is not None
        local = sum(1 for i in range(layers) if (i + 1) % interval)
    return {"attention_chunk_size": chunk, "local_attention_layers": local} if local else {}


#: MosaicML MPT (llm-foundry ``MPTConfig``, HF ``MptConfig``) and Databricks DBRX (HF
#: ``DbrxConfig``): the fields nested under ``attn_config`` / ``ffn_config`` that cost nothing
#: (dropout, kernels, init, routing rules and loss weights, clamps of q/k/v).
_MOSAIC_HARMLESS = frozenset({
    "attn_pdrop", "attn_impl", "prefix_lm", "attn_uses_sequence_id", "alibi_bias_max", "softmax_scale", "clip_qkv",
    "rope_impl", "rope_dail_config", "rope_hf_config", "fused_qkv", "model_type", "moe_jitter_eps", "moe_loss_weight",
    "moe_normalize_expert_weights", "uniform_expert_assignment", "moe_weight_parallelism", "moe_world_size",
    "fc_type", "bias", "init_device",
})
#: Their top-level fields that cost nothing.
_MOSAIC_TOP_HARMLESS = frozenset({
    "emb_pdrop", "embedding_fraction", "logit_scale", "init_config", "verbose", "tokenizer_name", "use_pad_tok_in_ffn",
    "fc_type", "init_device", "output_router_logits", "use_train_metrics",
})


def _mosaic(cfg: Mapping[str, Any], family: str, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An MPT or DBRX ``config.json`` in the standard names the parser reads, and the family
    defaults it overrides.

    MPT (llm-foundry ``mpt/configuration_mpt.py``, ``layers/ffn.py``): ``d_model``, ``n_heads``,
    ``n_layers``, an FFN of ``expansion_ratio``·d_model (or ``ffn_config.ffn_hidden_size``),
    ungated GELU ``mptmlp`` or gated ``mptglu``, MegaBlocks experts ``mb_moe``/``mb_dmoe``
    (``moe_num_experts``, ``moe_top_k``), ``attn_config`` multi-head, multi-query or grouped
    (``kv_n_heads``), ALiBi or RoPE (a learned position table only without either:
    ``learned_pos_emb`` is turned off when they are on), ``sliding_window_size``, a LayerNorm of q
    and k (``qk_ln``); ``no_bias`` (default true) drops every bias; tied embeddings by default.
    DBRX (HF ``modeling_dbrx``): RoPE, grouped-query attention, GLU experts of
    ``ffn_hidden_size`` (SiLU), bias-free LayerNorms, an untied head."""
    sections: dict[str, Mapping[str, Any]] = {}
    for section in ("attn_config", "ffn_config"):
        raw = cfg.get(section) or {}
        if not isinstance(raw, Mapping):
            raise InvalidModel("must be an object", field=f"{path}.{section}")
        sections[section] = raw
    attn, ffn = sections["attn_config"], sections["ffn_config"]
    out: dict[str, Any] = {k: v for k, v in cfg.items() if k not in sections}
    hidden = _int_field(cfg, ("d_model",), path)
    assert hidden is not None
    defaults: dict[str, Any] = {}
    read = {"kv_n_heads", "attn_type", "alibi", "rope", "rope_theta", "sliding_window_size", "qk_ln", "qk_gn",
            "ffn_type", "ffn_hidden_size", "ffn_act_fn", "moe_num_experts", "moe_top_k", "mlp_type"}
    if family == "dbrx":
        kv = attn.get("kv_n_heads")
        defaults.update(gated=True, act="silu")
    else:
        kind = attn.get("attn_type", "multihead_attention")
        kinds = ("multihead_attention", "multiquery_attention", "grouped_query_attention")
        if kind not in kinds:
            raise InvalidModel(f"must be one of {', '.join(kinds)}, got {kind!r}", field=f"{path}.attn_config.attn_type")
        kv = 1 if kind == "multiquery_attention" else attn.get("kv_n_heads") if kind == "grouped_query_attention" else None
        ffn_type = ffn.get("ffn_type", "mptmlp")
        types = ("mptmlp", "mptglu", "te_ln_mlp", "mb_moe", "mb_dmoe")
        if ffn_type not in types:
            raise InvalidModel(f"must be one of {', '.join(types)}, got {ffn_type!r}", field=f"{path}.ffn_config.ffn_type")
        # MegaBlocks experts are GLU only with mlp_type "glu" (its default is a plain MLP)
        defaults["gated"] = ffn_type == "mptglu" or (ffn_type in ("mb_moe", "mb_dmoe") and ffn.get("mlp_type") == "glu")
        if attn.get("qk_ln") or attn.get("qk_gn"):
            defaults["qk_norm"] = True
        alibi, rope = bool(attn.get("alibi", False)), bool(attn.get("rope", False))
        out["alibi"] = alibi
        if not rope and not alibi and _bool_field(cfg, "learned_pos_emb", path, True):
            defaults["learned_positions"] = True
        defaults["bias"] = not _bool_field(cfg, "no_bias", path, True)
        norm = str(cfg.get("norm_type", "low_precision_layernorm"))
        defaults["norm"] = "rmsnorm" if "rmsnorm" in norm else "layernorm"
        window = attn.get("sliding_window_size", -1)
        if isinstance(window, int) and not isinstance(window, bool) and window > 0:
            out["sliding_window"] = window
    if kv is not None:
        out["num_key_value_heads"] = kv
    if "rope_theta" in attn:
        out["rope_theta"] = attn["rope_theta"]
    act = ffn.get("ffn_act_fn")
    if isinstance(act, Mapping) and act.get("name"):
        name = str(act["name"])
        defaults["act"] = "gelu_tanh" if name == "gelu" and act.get("approximate") == "tanh" else name
    width = ffn.get("ffn_hidden_size")
    if width is None:
        ratio = cfg.get("expansion_ratio", 4)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0:
            raise InvalidModel(f"must be a positive number, got {ratio!r}", field=f"{path}.expansion_ratio")
        width = int(ratio * hidden)
    out["intermediate_size"] = width
    if "moe_num_experts" in ffn:
        out["num_local_experts"] = ffn["moe_num_experts"]
        out["num_experts_per_tok"] = ffn.get("moe_top_k", 1)
    for key in ("expansion_ratio", "learned_pos_emb", "no_bias", "norm_type", "resid_pdrop", "layer_norm_epsilon"):
        out.pop(key, None)
    for key in _MOSAIC_TOP_HARMLESS:
        out.pop(key, None)
    # nested fields neither read nor harmless are named in the warnings like unknown top-level ones
    out.update({f"{section}.{k}": v for section, raw in sections.items() for k, v in raw.items() if k not in read | _MOSAIC_HARMLESS})
    return out, defaults


def _activation(cfg: Mapping[str, Any], default: str) -> str:
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or cfg.get("activation_function") or default
    act = str(act)
    if act in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_tanh"):
        return "gelu_tanh"
    return act


#: A Llama-style decoder: SwiGLU FFN, RMSNorm, untied head, SiLU.
_LLAMA: dict[str, Any] = {"gated": True, "norm": "rmsnorm", "tie": False, "act": "silu"}
#: What each family's architecture has that its config.json does not say (HF modelling code):
#: gated FFN, norm, tied-embedding default, norms per layer, default activation.
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {"gated": False, "norm": "layernorm", "tie": True, "act": "gelu_new"},
    "falcon": {"gated": False, "norm": "layernorm", "tie": True, "act": "gelu"},
    "llama": _LLAMA,
    "qwen2": {**_LLAMA, "qkv_bias": True},
    "qwen3": {**_LLAMA, "qk_norm": True},
    "gemma": {"gated": True, "norm": "rmsnorm", "tie": True, "act": "gelu_tanh"},
    "phimoe": {**_LLAMA, "norm": "layernorm", "head_bias": True},
    "deepseek": _LLAMA,
    # HF GPTNeoXForCausalLM: biased linears, rotary, untied embed_out
    "gpt_neox": {"gated": False, "norm": "layernorm", "tie": False, "act": "gelu"},
    # HF BloomForCausalLM: biased linears, ALiBi (no position table), lm_head tied to the embedding
    "bloom": {"gated": False, "norm": "layernorm", "tie": True, "act": "gelu_tanh"},
    # HF OPTForCausalLM: biased linears, a learned position table offset by 2 rows, ReLU, tied head
    "opt": {"gated": False, "norm": "layernorm", "tie": True, "act": "relu"},
    # HF GPTJForCausalLM: unbiased attention, biased MLP and lm_head, rotary, one shared norm
    "gptj": {"gated": False, "norm": "layernorm", "tie": False, "act": "gelu_tanh"},
    # THUDM ChatGLM2/3, GLM-4 (modeling_chatglm.py): SwiGLU of ffn_hidden_size, multi-query groups,
    # RMSNorm unless rmsnorm is false, a QKV bias (add_qkv_bias), untied output layer
    "chatglm": _LLAMA,
    # HF Ernie4_5 / Ernie4_5_Moe: Llama attention and SwiGLU MLPs, shared experts of
    # moe_intermediate_size × moe_num_shared_experts, an fp32 router, tied embeddings by default
    "ernie": {**_LLAMA, "tie": True},
    # HF Starcoder2: c_fc → GELU → c_proj, biased LayerNorms, GQA with RoPE, tied by default
    "starcoder2": {"gated": False, "norm": "layernorm", "tie": True, "act": "gelu_tanh"},
    # HF Phi (1, 1.5, 2): one LayerNorm feeding attention and MLP in parallel, fc1 → GELU → fc2,
    # biases on every projection and on the LM head, untied
    "phi": {"gated": False, "norm": "layernorm", "tie": False, "act": "gelu_tanh", "head_bias": True},
    # Qwen-1 (modeling_qwen.py): SwiGLU over w1/w2 of intermediate_size // 2, a biased c_attn
    "qwen": {**_LLAMA, "qkv_bias": True},
    "internlm2": _LLAMA,
    # HF Olmo2 / OLMoE: full-width RMSNorm of q and k, always on
    "olmo2": {**_LLAMA, "qk_norm": True},
    # HF Olmo (OLMo 1): Llama attention and SwiGLU, weight-free LayerNorms (costed as LayerNorms)
    "olmo": {**_LLAMA, "norm": "layernorm"},
    # Baichuan 2 (remote code): W_pack's fused bias-free q/k/v, SwiGLU, RMSNorm, an untied head
    # (NormHead: the head's rows normalised, a pass over its weights), ALiBi on the 13B (a bias the
    # fused attention adds)
    "baichuan": _LLAMA,
    "granite": _LLAMA,
    "minicpm": {**_LLAMA, "tie": True},
    # HF Cohere: one weight-only LayerNorm feeding attention and MLP in parallel, tied
    "cohere": {**_LLAMA, "norm": "layernorm", "tie": True},
    # HF Nemotron: up_proj → squared ReLU → down_proj (no gate), LayerNorm1P
    "nemotron": {"gated": False, "norm": "layernorm", "tie": False, "act": "relu2"},
    "stablelm": {**_LLAMA, "norm": "layernorm"},
    # HF Glm / Glm4: fused gate_up_proj, biased q/k/v (attention_bias, default true), o_proj unbiased
    "glm": _LLAMA,
    # HF GptOss: biased attention projections (attention_bias, default true), biased experts
    "gpt_oss": _LLAMA,
    # HF Glm4Moe: Llama attention (q/k/v biased by attention_bias, default false), SwiGLU experts
    # and shared experts, dense-first layers
    "glm4_moe": _LLAMA,
    # HF Llama4Text: Llama attention, SwiGLU experts plus one shared expert, untied
    "llama4": _LLAMA,
    # llm-foundry MPT: ungated GELU FFN, LayerNorm, tied (``_mosaic`` reads what its config varies)
    "mpt": {"gated": False, "norm": "layernorm", "tie": True, "act": "gelu"},
    # HF Dbrx: GLU experts with SiLU, bias-free LayerNorms, untied
    "dbrx": {"gated": True, "norm": "layernorm", "tie": False, "act": "silu"},
}


def _unknown_fields(cfg: Mapping[str, Any], family: str) -> list[str]:
    known = HARMLESS_FIELDS | COSTED_FIELDS | FAMILY_FIELDS.get(family, frozenset())
    falsy_ok = ("is_encoder_decoder", "add_cross_attention", "tie_encoder_decoder", "cross_attention_hidden_size")
    return sorted(
        k for k, v in cfg.items()
        if k not in known and not k.startswith("summary_") and not (k in falsy_ok and not v)
    )


def _size_label(params: int) -> str:
    return f"{params / BILLION:.1f}B" if params >= BILLION else f"{params / MILLION:.0f}M"


def _biases(cfg: Mapping[str, Any], family: str, defaults: Mapping[str, Any], path: str) -> dict[str, Any]:
    if family in ("gpt2", "bloom"):
        return {"bias": True}
    if family == "gpt_neox":  # HF GPTNeoXConfig.attention_bias (default true); the MLP is always biased
        return {"bias": True} if _bool_field(cfg, "attention_bias", path, True) else {"mlp_bias": True}
    if family == "opt":
        return {"bias": _bool_field(cfg, "enable_bias", path, True)}
    if family == "gptj":
        return {"mlp_bias": True, "head_bias": True}
    if family == "chatglm":
        linear = _bool_field(cfg, "add_bias_linear", path, False)
        return {"qkv_bias": linear or _bool_field(cfg, "add_qkv_bias", path, False), "out_bias": linear, "mlp_bias": linear}
    if family == "falcon":
        b = _bool_field(cfg, "bias", path, False)
        return {"qkv_bias": b, "out_bias": b, "mlp_bias": b}
    if family == "ernie":  # use_bias: the q/k/v/o projections, every MLP's and the lm_head
        b = _bool_field(cfg, "use_bias", path, False)
        return {"qkv_bias": b, "out_bias": b, "mlp_bias": b, "head_bias": b}
    if family == "starcoder2":  # use_bias: q/k/v/o, c_fc and c_proj, and the LayerNorms
        return {"bias": _bool_field(cfg, "use_bias", path, True)}
    if family == "phi":  # every projection and the LM head, no switch
        return {"bias": True, "head_bias": True}
    if family == "qwen":  # c_attn always; c_proj and the MLP unless no_bias (default true)
        linear = not _bool_field(cfg, "no_bias", path, True)
        return {"qkv_bias": True, "out_bias": linear, "mlp_bias": linear}
    if family == "internlm2":
        b = _bool_field(cfg, "bias", path, True)
        return {"qkv_bias": b, "out_bias": b}
    if family == "stablelm":  # q/k/v only
        return {"qkv_bias": _bool_field(cfg, "use_qkv_bias", path, False)}
    if family == "glm":  # q/k/v by attention_bias (default true); o_proj never
        return {"qkv_bias": _bool_field(cfg, "attention_bias", path, True)}
    if family in ("mpt", "dbrx"):  # MPT: every linear layer and norm unless no_bias; DBRX: none
        return {"bias": bool(defaults.get("bias"))}
    if family == "glm4_moe":  # q/k/v by attention_bias (default false)
        return {"qkv_bias": _bool_field(cfg, "attention_bias", path, False)}
    if family == "gpt_oss":  # q/k/v/o by attention_bias (default true); the experts always
        b = _bool_field(cfg, "attention_bias", path, True)
        return {"qkv_bias": b, "out_bias": b, "mlp_bias": True}
    attn = _bool_field(cfg, "attention_bias", path, False)
    return {
        "qkv_bias": attn or bool(defaults.get("qkv_bias")),
        "out_bias": attn,
        "mlp_bias": _bool_field(cfg, "mlp_bias", path, False),
        "head_bias": _bool_field(cfg, "lm_head_bias", path, bool(defaults.get("head_bias"))),
    }


def _norms_per_layer(cfg: Mapping[str, Any], family: str, model_type: str) -> int:
    if family == "falcon":
        # HF FalconDecoderLayer: new_decoder_architecture keeps ln_attn and ln_mlp; the older
        # parallel block shares one input_layernorm; the sequential block has two.
        if cfg.get("new_decoder_architecture"):
            return int(cfg.get("num_ln_in_parallel_attn") or 2)
        return 1 if cfg.get("parallel_attn", True) else 2
    if family in ("gptj", "phi", "cohere"):  # attention and MLP in parallel read one norm
        return 1
    if family == "stablelm" and cfg.get("use_parallel_residual"):
        return 1
    return 4 if model_type in ("gemma2", "gemma3_text", "glm4") else 2


def from_hf_config(cfg: Mapping[str, Any], name: str | None = None, field_path: str = "model.transformer") -> TransformerSpec:
    """Build a spec from a Hugging Face ``config.json`` dict.

    The family (:data:`FAMILIES`, by ``model_type``; by its keys when absent) fixes what the
    file leaves implicit; every field that changes FLOPs, bytes or memory is read
    (:data:`COSTED_FIELDS`), known-harmless ones are accepted quietly (:data:`HARMLESS_FIELDS`)
    and any other is named in the spec's ``warnings``.  Architectures the cost model cannot
    represent raise :class:`InvalidModel` naming ``model_type``."""
    path = field_path
    if not isinstance(cfg, Mapping):
        raise InvalidModel("must be an object of Hugging Face config.json keys", field=path)
    model_type, family, warnings = _family(cfg, path)
    defaults = _FAMILY_DEFAULTS[family]
    if family in ("mpt", "dbrx"):
        cfg, overrides = _mosaic(cfg, family, path)
        defaults = {**defaults, **overrides}
    layers = _int_field(cfg, ("num_hidden_layers", "n_layer", "num_layers", "n_layers"), path)
    hidden = _int_field(cfg, ("hidden_size", "n_embd", "n_embed", "d_model"), path)
    assert layers is not None and hidden is not None
    heads, kv, head_dim = _attention_heads(cfg, family, hidden, path)
    vocab = _int_field(cfg, ("vocab_size", "padded_vocab_size"), path, required=False, default=50257)
    inter = _int_field(cfg, ("intermediate_size", "ffn_hidden_size") if family == "chatglm" else ("intermediate_size",), path, required=False)
    n_inner = _int_field(cfg, ("n_inner", "ffn_hidden_size", "ffn_dim"), path, required=False)
    # A plain shape dict without intermediate_size is GPT-style (4h, ungated, biases, learned
    # positions), as before families existed.
    gpt_style = family == "gpt2" or (family == "llama" and inter is None and "model_type" not in cfg)
    if gpt_style:
        family, defaults = "gpt2", _FAMILY_DEFAULTS["gpt2"]
    gated = defaults["gated"]
    if family == "qwen" and inter is not None:  # modeling_qwen.QWenMLP: w1, w2 of intermediate_size // 2
        inter //= 2
    ffn = inter if gated else (n_inner or inter or 4 * hidden)
    if ffn is None:
        raise InvalidModel("is required (the FFN width)", field=f"{path}.intermediate_size")
    kw: dict[str, Any] = {"head_dim": head_dim, **_biases(cfg, family, defaults, path), **_mla(cfg, heads, path)}
    kw.update(_moe(cfg, family, layers, inter, path))
    kw.setdefault("ffn_hidden_size", ffn)
    positions = 0
    max_pos = _int_field(cfg, ("n_positions", "max_position_embeddings", "seq_length", "max_seq_len"), path, required=False, default=0)
    if family == "gpt2":
        positions = max_pos or 2048
        kw["position_embedding"] = "learned"
    elif family == "opt":  # OPTLearnedPositionalEmbedding: max_position_embeddings + 2 rows
        positions = (max_pos or 2048) + 2
        kw["position_embedding"] = "learned"
    elif defaults.get("learned_positions"):  # MPT without ALiBi or RoPE: a max_seq_len table
        positions = max_pos or 2048
        kw["position_embedding"] = "learned"
    else:
        alibi = family == "bloom" or _bool_field(cfg, "alibi", path, False)
        kw["position_embedding"] = "alibi" if alibi else "rope"
        if not alibi:
            kw.update(_rope(cfg, path))
    kw.update(_windows(cfg, model_type, layers, path))
    mtp = _int_field(cfg, ("num_nextn_predict_layers",), path, required=False, default=0, minimum=0) or 0
    tie = _bool_field(cfg, "tie_word_embeddings", path, defaults["tie"])
    spec = TransformerSpec(
        name="",
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kw.pop("num_kv_heads", kv),
        vocab_size=vocab or 50257,
        gated_ffn=gated,
        tie_embeddings=tie,
        learned_positions=positions,
        norm=defaults["norm"] if family != "chatglm" or _bool_field(cfg, "rmsnorm", path, True) else "layernorm",
        model_type=model_type,
        norms_per_layer=_norms_per_layer(cfg, family, model_type),
        qk_norm=bool(defaults.get("qk_norm")) or model_type == "gemma3_text" or any(
            _bool_field(cfg, k, path, False) for k in ("qk_layernorm", "use_qk_norm") if k in FAMILY_FIELDS.get(family, ())),
        activation=_activation(cfg, defaults["act"]),
        mtp_layers=mtp,
        max_position_embeddings=max_pos or 0,
        **kw,
    )
    proj = cfg.get("word_embed_proj_dim")
    if family == "opt" and proj not in (None, hidden):
        warnings.append(f"word_embed_proj_dim={proj}: OPT's project_in/project_out matrices ({proj}×{hidden} each) are not costed")
    unknown = _unknown_fields(cfg, family)
    if unknown:
        warnings.append(f"config fields the service does not know, not costed: {', '.join(unknown)}")
    label = name or cfg.get("name") or cfg.get("_name_or_path")
    label = str(label) if label else f"{model_type} {_size_label(spec.total_params())}"
    return replace(spec, name=label, warnings=tuple(warnings))


def model_from_dict(data: Mapping[str, Any], field_path: str = "model") -> Any:
    """Resolve the v1 ``model`` object: exactly one of preset / transformer / graph.

    Returns a :class:`TransformerSpec` or a ``cost_model.graph.ir.GraphSpec``.  ``model_id``
    (stored ONNX models) is resolved by the service before calling this.
    """
    if not isinstance(data, Mapping):
        raise InvalidModel("must be an object with one of 'preset', 'transformer', 'graph'", field=field_path)
    kinds = [k for k in ("preset", "transformer", "graph") if k in data]
    if len(kinds) != 1:
        raise InvalidModel(
            f"give exactly one of 'preset', 'transformer', 'graph' (got {', '.join(kinds) or 'none'})", field=field_path
        )
    name = data.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidModel("must be a string", field=f"{field_path}.name")
    kind = kinds[0]
    if kind == "preset":
        if not isinstance(data["preset"], str):
            raise InvalidModel("must be a preset name", field=f"{field_path}.preset")
        spec = get_preset(data["preset"], f"{field_path}.preset")
        return replace(spec, name=name) if name else spec
    if kind == "transformer":
        return from_hf_config(data["transformer"], name=name, field_path=f"{field_path}.transformer")
    from cost_model.graph.parse import (
        graph_from_dict,  # local import: the graph IR is optional for transformer users
    )

    return graph_from_dict(data["graph"], name=name, field_path=f"{field_path}.graph")
