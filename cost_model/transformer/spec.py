"""Model specifications: transformer shapes from presets or Hugging Face ``config.json``.

A :class:`TransformerSpec` is the per-layer representation the cost model works on: an
embedding (plus learned positions for GPT-style models), ``num_layers`` identical decoder
layers, a final norm and an LM head (tied or not).  Parameter counts follow the GEMM shapes
exactly (grouped-query attention, gated FFNs, MoE experts and router, biases and norms), so
that e.g. GPT-3 175B counts 174.6B and Llama-3-8B 8.03B.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from cost_model.errors import InvalidModel, UnknownName


@dataclass(frozen=True)
class LayerInfo:
    """One entry of the per-layer representation."""

    kind: str  # "embedding" | "decoder" | "head"
    index: int
    params: int


@dataclass(frozen=True)
class TransformerSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    gated_ffn: bool = False
    tie_embeddings: bool = False
    num_experts: int = 1
    experts_per_token: int = 1
    shared_expert_ffn_hidden_size: int = 0
    learned_positions: int = 0  # rows of a learned position table (GPT); 0 for RoPE
    bias: bool = False
    norm: str = "layernorm"  # or "rmsnorm"
    model_type: str = "gpt"

    # ---- derived shapes -------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_size(self) -> int:
        """Width of K (and of V): kv heads × head dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.gated_ffn else 2

    # ---- parameter counts --------------------------------------------------------------------
    def attention_params(self) -> int:
        h, kv = self.hidden_size, self.kv_size
        p = h * h + 2 * h * kv + h * h
        if self.bias:
            p += h + 2 * kv + h
        return p

    def expert_params(self) -> int:
        """Parameters of one expert (or of the dense FFN)."""
        h, f = self.hidden_size, self.ffn_hidden_size
        p = self.ffn_matrices * h * f
        if self.bias:
            p += f * (self.ffn_matrices - 1) + h
        return p

    def norm_params(self) -> int:
        return (2 if self.norm == "layernorm" else 1) * self.hidden_size

    def ffn_params(self) -> int:
        p = self.num_experts * self.expert_params()
        if self.is_moe:
            p += self.hidden_size * self.num_experts  # router
            if self.shared_expert_ffn_hidden_size:
                p += self.ffn_matrices * self.hidden_size * self.shared_expert_ffn_hidden_size
        return p

    def decoder_layer_params(self) -> int:
        return self.attention_params() + self.ffn_params() + 2 * self.norm_params()

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size + self.learned_positions * self.hidden_size

    def head_params(self) -> int:
        """Final norm plus the LM head (0 extra weights when tied to the embedding)."""
        return self.norm_params() + (0 if self.tie_embeddings else self.vocab_size * self.hidden_size)

    def total_params(self) -> int:
        return self.embedding_params() + self.num_layers * self.decoder_layer_params() + self.head_params()

    def active_params(self) -> int:
        """Parameters touched per token (MoE: only top-k experts)."""
        if not self.is_moe:
            return self.total_params()
        inactive = (self.num_experts - self.experts_per_token) * self.expert_params()
        return self.total_params() - self.num_layers * inactive

    def layer_graph(self) -> tuple[LayerInfo, ...]:
        layers = [LayerInfo("embedding", 0, self.embedding_params())]
        layers += [LayerInfo("decoder", i + 1, self.decoder_layer_params()) for i in range(self.num_layers)]
        layers.append(LayerInfo("head", self.num_layers + 1, self.head_params()))
        return tuple(layers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model_type": self.model_type,
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "intermediate_size": self.ffn_hidden_size,
            "gated_ffn": self.gated_ffn,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_embeddings,
            "num_local_experts": self.num_experts,
            "num_experts_per_tok": self.experts_per_token,
            "params": self.total_params(),
        }


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
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256),
        _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, num_experts=8, experts_per_token=2, model_type="mixtral"),
        _llama("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, num_experts=8, experts_per_token=2, model_type="mixtral"),
    )
}


def get_preset(name: str, field_path: str = "model.preset") -> TransformerSpec:
    key = name.lower() if isinstance(name, str) else name
    if key in PRESETS:
        return PRESETS[key]
    raise UnknownName(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}", field=field_path)


def _int_field(cfg: Mapping[str, Any], keys: tuple[str, ...], path: str, required: bool = True, default: int | None = None) -> int | None:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            val = cfg[key]
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise InvalidModel(f"must be a positive integer, got {val!r}", field=f"{path}.{key}")
            if val > 10_000_000:
                raise InvalidModel(f"is implausibly large ({val})", field=f"{path}.{key}")
            return val
    if required:
        raise InvalidModel(f"is required (one of: {', '.join(keys)})", field=f"{path}.{keys[0]}")
    return default


def from_hf_config(cfg: Mapping[str, Any], name: str | None = None, field_path: str = "model.transformer") -> TransformerSpec:
    """Build a spec from a Hugging Face ``config.json`` dict (Llama/Mistral/Mixtral/Qwen names
    and GPT-2 names).  Without ``intermediate_size`` the FFN is 4×hidden and not gated."""
    if not isinstance(cfg, Mapping):
        raise InvalidModel("must be an object of Hugging Face config.json keys", field=field_path)
    layers = _int_field(cfg, ("num_hidden_layers", "n_layer", "num_layers"), field_path)
    hidden = _int_field(cfg, ("hidden_size", "n_embd", "d_model"), field_path)
    heads = _int_field(cfg, ("num_attention_heads", "n_head"), field_path)
    kv = _int_field(cfg, ("num_key_value_heads",), field_path, required=False, default=heads)
    vocab = _int_field(cfg, ("vocab_size",), field_path, required=False, default=50257)
    inter = _int_field(cfg, ("intermediate_size",), field_path, required=False)
    n_inner = _int_field(cfg, ("n_inner", "ffn_hidden_size"), field_path, required=False)
    model_type = str(cfg.get("model_type") or ("gpt2" if "n_embd" in cfg else "llama"))
    gpt_style = inter is None
    if hidden % heads:
        raise InvalidModel(
            f"hidden size {hidden} is not divisible by {heads} attention heads", field=f"{field_path}.num_attention_heads"
        )
    if heads % kv:
        raise InvalidModel(
            f"{heads} attention heads are not a multiple of {kv} key/value heads",
            field=f"{field_path}.num_key_value_heads",
        )
    experts = _int_field(cfg, ("num_local_experts", "num_experts", "n_routed_experts"), field_path, required=False, default=1)
    top_k = _int_field(cfg, ("num_experts_per_tok", "moe_topk"), field_path, required=False, default=min(2, experts))
    if top_k > experts:
        raise InvalidModel(
            f"num_experts_per_tok {top_k} exceeds the {experts} experts", field=f"{field_path}.num_experts_per_tok"
        )
    moe_ffn = _int_field(cfg, ("moe_intermediate_size",), field_path, required=False)
    shared = _int_field(cfg, ("shared_expert_intermediate_size",), field_path, required=False, default=0)
    ffn = (n_inner or 4 * hidden) if gpt_style else (moe_ffn if (experts > 1 and moe_ffn) else inter)
    tie_default = model_type in ("gpt2", "gpt", "gpt_neox") and gpt_style
    tie = cfg.get("tie_word_embeddings", tie_default)
    if not isinstance(tie, bool):
        raise InvalidModel("must be true or false", field=f"{field_path}.tie_word_embeddings")
    positions = 0
    if gpt_style:
        positions = _int_field(cfg, ("n_positions", "max_position_embeddings"), field_path, required=False, default=2048)
    return TransformerSpec(
        name=name or str(cfg.get("name") or cfg.get("_name_or_path") or model_type),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=ffn,
        vocab_size=vocab,
        gated_ffn=not gpt_style,
        tie_embeddings=tie,
        num_experts=experts,
        experts_per_token=top_k if experts > 1 else 1,
        shared_expert_ffn_hidden_size=shared,
        learned_positions=positions,
        bias=gpt_style,
        norm="layernorm" if gpt_style else "rmsnorm",
        model_type=model_type,
    )


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
    from cost_model.graph.ir import (
        graph_from_dict,  # local import: the graph IR is optional for transformer users
    )

    return graph_from_dict(data["graph"], name=name, field_path=f"{field_path}.graph")
