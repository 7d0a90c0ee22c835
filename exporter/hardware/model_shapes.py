"""A transformer's roofline facts from its Hugging Face ``config.json``.

From the shapes alone (no weights): parameter counts (total, non-embedding, active per token
for mixture-of-experts), KV-cache bytes per token and forward FLOPs per token. The formulas
were checked against the published ``model.safetensors.index.json`` ``metadata.total_size`` of
Llama-3.1-8B/70B, Mixtral-8x7B and Qwen2.5-7B (bf16: total size = 2 x parameters) and against
DeepSeek's "671B total, 37B activated" (``tests/hardware/test_models.py``).

Conventions (``docs/roofline.md`` explains why):

* Non-embedding parameters exclude the input embedding and the LM head (Kaplan et al.); forward
  FLOPs per token are ``2 x`` the non-embedding parameters a token passes through: the LM head
  (2 x hidden x vocab per *sampled* token) and attention over the context are not included.
* Mixture-of-experts: FLOPs count the routed experts a token uses (``num_experts_per_tok``) and
  the shared ones; stored parameters count every expert.
* KV cache per token: ``2 x layers x KV heads x head dim x bytes`` (GQA/MQA through
  ``num_key_value_heads``). Multi-head latent attention (DeepSeek-V2/V3, ``kv_lora_rank`` in the
  config) caches one latent of ``kv_lora_rank + qk_rope_head_dim`` per layer shared by all heads,
  with no separate V, hence no factor 2 (vLLM ``MLAAttentionSpec``, SGLang
  ``MLATokenToKVPool``). Sliding-window layers hold the same bytes per token but at most
  ``sliding_window`` tokens per sequence; the per-token figure does not change.
* Per GPU under tensor parallelism N: parameters, FLOPs and weight bytes are divided by N; the KV
  cache per token counts the KV heads one GPU holds (``max(1, kv_heads // N)``: vLLM replicates
  KV heads when N exceeds them); an MLA latent is replicated on every GPU.
* GPT-2 (``model_type`` ``gpt2``; the reference engine's architecture) differs from the Llama
  family in three ways the counts follow: a plain two-matrix MLP (``n_inner``, default 4 x
  hidden) instead of a gated one, biases on every projection and LayerNorm, and a learned
  position table (``n_positions`` rows), which counts as embedding: gathered, never streamed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Bytes per element of each ``--kv-cache-dtype`` value vLLM and SGLang accept; ``auto`` is the
#: model's own dtype. ``fp8_ds_mla`` is vLLM's FlashMLA-sparse layout: 656 bytes per token and
#: layer (512 fp8 latent + 4 fp32 scales + 64 bf16 RoPE), MLA models only.
KV_CACHE_DTYPES: dict[str, float | None] = {
    "auto": None,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp32": 4,
    "float32": 4,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
    "int8": 1,
    "fp4_e2m1": 0.5,
}
FP8_DS_MLA_BYTES_PER_LAYER = 656

#: ``torch_dtype`` (newer transformers: ``dtype``) of a config, in bytes per element.
TORCH_DTYPES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


#: Model types with GPT-2's layout (see the module docstring).
GPT2_TYPES = frozenset({"gpt2"})


class ModelConfigError(ValueError):
    """The config lacks what the arithmetic needs; the message names the key."""


@dataclass(frozen=True)
class ModelShape:
    """The shapes of a decoder-only transformer, read from its config."""

    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    # Mixture of experts (experts == 0: dense).
    experts: int
    experts_per_token: int
    moe_intermediate: int
    shared_intermediate: int
    moe_layers: int
    router_bias: bool
    # Multi-head latent attention (kv_lora_rank is None: standard attention).
    kv_lora_rank: int | None
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    sliding_window: int | None
    dtype_bytes: int | None
    quant_method: str | None
    # GPT-2 style: ungated MLP, LayerNorm with bias, learned absolute positions (rows).
    gated_mlp: bool = True
    norm_bias: bool = False
    positions: int = 0

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None


def _int(config: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    if default is None:
        raise ModelConfigError(f"config.json has no integer {' / '.join(keys)}")
    return default


def _positive(config: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    value = _int(config, *keys, default=default)
    if value <= 0:
        raise ModelConfigError(f"config.json {' / '.join(keys)} must be positive, got {value}")
    return value


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a multimodal config (``text_config``), else the config."""
    inner = config.get("text_config")
    if isinstance(inner, Mapping) and "num_hidden_layers" in inner:
        return {**{k: v for k, v in config.items() if k != "text_config"}, **inner}
    return config


def _moe_layers(config: Mapping[str, Any], layers: int, experts: int) -> int:
    if not experts:
        return 0
    first_dense = _int(config, "first_k_dense_replace", default=0)
    freq = max(1, _int(config, "moe_layer_freq", "decoder_sparse_step", default=1))
    dense_only = config.get("mlp_only_layers") or []
    return sum(
        1 for i in range(layers) if i >= first_dense and i % freq == 0 and i not in dense_only
    )


def shape_of(config: Mapping[str, Any]) -> ModelShape:
    """Read the shapes; raises :class:`ModelConfigError` naming a missing key."""
    c = _text_config(config)
    layers = _positive(c, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _positive(c, "hidden_size", "n_embd", "d_model")
    heads = _positive(c, "num_attention_heads", "n_head")
    kv_heads = _positive(c, "num_key_value_heads", "num_kv_heads", default=heads)
    head_dim = _positive(c, "head_dim", default=hidden // heads)
    intermediate = _int(c, "intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)
    experts = _int(c, "num_local_experts", "num_experts", "n_routed_experts", default=0)
    shared = _int(c, "n_shared_experts", default=0)
    moe_intermediate = _int(c, "moe_intermediate_size", default=intermediate)
    shared_intermediate = shared * moe_intermediate or _int(
        c, "shared_expert_intermediate_size", default=0
    )
    kv_lora = c.get("kv_lora_rank")
    q_lora = c.get("q_lora_rank")
    model_type = str(c.get("model_type", ""))
    window = c.get("sliding_window")
    use_window = c.get("use_sliding_window", True) is not False
    dtype = c.get("torch_dtype", c.get("dtype"))
    quant = c.get("quantization_config")
    gpt2 = model_type in GPT2_TYPES
    return ModelShape(
        model_type=model_type,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=_positive(c, "vocab_size", "padded_vocab_size"),
        # transformers' default: GPT2Config ties the LM head to the embedding, Llama's does not.
        tie_embeddings=bool(c.get("tie_word_embeddings", gpt2)),
        # Qwen2 (and Qwen2-MoE) put biases on q, k and v without a config key.
        qkv_bias=bool(c.get("attention_bias", False))
        or model_type in {"qwen2", "qwen2_moe"}
        or gpt2,
        o_bias=bool(c.get("attention_bias", False)) or gpt2,
        mlp_bias=bool(c.get("mlp_bias", False)) or gpt2,
        qk_norm=model_type in {"qwen3", "qwen3_moe"},
        experts=experts,
        experts_per_token=_int(
            c, "num_experts_per_tok", "moe_topk", default=0 if not experts else 1
        ),
        moe_intermediate=moe_intermediate,
        shared_intermediate=shared_intermediate,
        moe_layers=_moe_layers(c, layers, experts),
        # DeepSeek-V3's auxiliary-loss-free balancing adds a per-expert score bias.
        router_bias=c.get("topk_method") == "noaux_tc",
        kv_lora_rank=int(kv_lora) if isinstance(kv_lora, int) else None,
        q_lora_rank=int(q_lora) if isinstance(q_lora, int) else None,
        qk_nope_head_dim=_int(c, "qk_nope_head_dim", default=0),
        qk_rope_head_dim=_int(c, "qk_rope_head_dim", default=0),
        v_head_dim=_int(c, "v_head_dim", default=head_dim),
        sliding_window=window if isinstance(window, int) and use_window else None,
        dtype_bytes=TORCH_DTYPES.get(str(dtype)) if dtype is not None else None,
        quant_method=str(quant.get("quant_method")) if isinstance(quant, Mapping) else None,
        gated_mlp=not gpt2,
        norm_bias=gpt2,
        positions=_positive(c, "n_positions", "max_position_embeddings") if gpt2 else 0,
    )


@dataclass(frozen=True)
class ParamCount:
    """Parameters by role (whole model, no parallelism)."""

    #: Input embeddings: the token table and, for learned positions, the position table.
    embedding: int
    lm_head: int
    #: Everything else: attention, MLP or every expert, norms, routers.
    non_embedding: int
    #: What one token passes through: like ``non_embedding`` with only its experts.
    active_non_embedding: int

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.non_embedding


def _attention_params(s: ModelShape) -> int:
    d = s.hidden
    if s.mla:
        assert s.kv_lora_rank is not None
        qk_dim = s.qk_nope_head_dim + s.qk_rope_head_dim
        if s.q_lora_rank:
            q = d * s.q_lora_rank + s.q_lora_rank + s.q_lora_rank * s.heads * qk_dim
        else:
            q = d * s.heads * qk_dim
        kv = (
            d * (s.kv_lora_rank + s.qk_rope_head_dim)
            + s.kv_lora_rank
            + s.kv_lora_rank * s.heads * (s.qk_nope_head_dim + s.v_head_dim)
        )
        return q + kv + s.heads * s.v_head_dim * d
    q_width, kv_width = s.heads * s.head_dim, s.kv_heads * s.head_dim
    params = d * q_width + 2 * d * kv_width + q_width * d
    if s.qkv_bias:
        params += q_width + 2 * kv_width
    if s.o_bias:
        params += d
    if s.qk_norm:
        params += 2 * s.head_dim
    return params


def _mlp_params(hidden: int, intermediate: int, bias: bool, gated: bool = True) -> int:
    """A gated MLP (gate, up, down projections), or GPT-2's plain one (up, down)."""
    if not gated:
        return 2 * hidden * intermediate + ((intermediate + hidden) if bias else 0)
    return 3 * hidden * intermediate + ((2 * intermediate + hidden) if bias else 0)


def param_count(s: ModelShape) -> ParamCount:
    """Parameters from the shapes (multi-token-prediction layers are not part of the model)."""
    d = s.hidden
    norm = 2 * d if s.norm_bias else d
    attention = _attention_params(s) + 2 * norm  # two norms per layer
    dense_mlp = _mlp_params(d, s.intermediate, s.mlp_bias, s.gated_mlp)
    expert = _mlp_params(d, s.moe_intermediate, s.mlp_bias, s.gated_mlp)
    shared = (
        _mlp_params(d, s.shared_intermediate, s.mlp_bias, s.gated_mlp)
        if s.shared_intermediate
        else 0
    )
    router = d * s.experts + (s.experts if s.router_bias else 0)
    dense_layers = s.layers - s.moe_layers
    stored = (
        s.layers * attention
        + dense_layers * dense_mlp
        + s.moe_layers * (router + s.experts * expert + shared)
        + norm  # final norm
    )
    active = (
        s.layers * attention
        + dense_layers * dense_mlp
        + s.moe_layers * (router + s.experts_per_token * expert + shared)
        + norm
    )
    embedding = (s.vocab + s.positions) * d
    return ParamCount(
        embedding=embedding,
        lm_head=0 if s.tie_embeddings else s.vocab * d,
        non_embedding=stored,
        active_non_embedding=active,
    )


def kv_dtype_bytes(kv_cache_dtype: str, s: ModelShape) -> float:
    """Bytes per cached element for ``--model.kv-cache-dtype`` (``auto``: the model's dtype,
    2 bytes when the config does not say)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown KV cache dtype {kv_cache_dtype!r}")
    size = KV_CACHE_DTYPES[kv_cache_dtype]
    if size is None:
        # An fp8-weight model (DeepSeek-V3) still computes, and caches, in its torch_dtype.
        return float(s.dtype_bytes if s.dtype_bytes and s.dtype_bytes >= 2 else 2)
    return float(size)


def kv_cache_bytes_per_token(
    s: ModelShape, kv_cache_dtype: str = "auto", tensor_parallel: int = 1
) -> float:
    """KV-cache bytes one token occupies on one GPU, all layers together."""
    if tensor_parallel < 1:
        raise ValueError("tensor_parallel must be >= 1")
    if s.mla:
        assert s.kv_lora_rank is not None
        if kv_cache_dtype == "fp8_ds_mla":
            return float(s.layers * FP8_DS_MLA_BYTES_PER_LAYER)
        latent = s.kv_lora_rank + s.qk_rope_head_dim
        return s.layers * latent * kv_dtype_bytes(kv_cache_dtype, s)
    heads_per_gpu = max(1, s.kv_heads // tensor_parallel)
    return 2 * s.layers * heads_per_gpu * s.head_dim * kv_dtype_bytes(kv_cache_dtype, s)


def flops_per_token(s: ModelShape, tensor_parallel: int = 1) -> float:
    """Forward FLOPs of one token on one GPU: 2 x active non-embedding parameters / TP."""
    if tensor_parallel < 1:
        raise ValueError("tensor_parallel must be >= 1")
    return 2.0 * param_count(s).active_non_embedding / tensor_parallel
