"""Parameters, KV-cache bytes and FLOPs per token from real ``config.json`` files.

The configs are the published ones (``tests/fixtures/models/SOURCES.md``); the expected figures
are published too: bf16 ``metadata.total_size`` = 2 x parameters, DeepSeek-V3's "671B total,
37B activated", and the KV formula's 327,680 bytes for Llama-3.1-70B.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.paths import FIXTURES

from exporter.hardware.model_shapes import (
    KV_CACHE_DTYPES,
    ModelConfigError,
    flops_per_token,
    kv_cache_bytes_per_token,
    param_count,
    shape_of,
)

MODELS = FIXTURES / "models"


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((MODELS / name / "config.json").read_text())
    return data


# directory, published total_size (bf16) or None, bf16 KV bytes/token, non-embedding params,
# active non-embedding params
DENSE_AND_MOE = [
    ("meta-llama__Llama-3.1-8B", 16_060_522_496, 131_072, 6_979_588_096, 6_979_588_096),
    ("meta-llama__Llama-3.1-70B", 141_107_412_992, 327_680, 68_452_360_192, 68_452_360_192),
    ("mistralai__Mixtral-8x7B-v0.1", 93_405_585_408, 131_072, 46_440_648_704, 12_617_781_248),
    ("Qwen__Qwen2.5-7B-Instruct", 15_231_233_024, 57_344, 6_525_621_760, 6_525_621_760),
    ("Qwen__Qwen2-7B", 15_231_233_024, 57_344, 6_525_621_760, 6_525_621_760),
]


@pytest.mark.parametrize(("name", "total_size", "kv", "non_emb", "active"), DENSE_AND_MOE)
def test_published_sizes(name: str, total_size: int, kv: int, non_emb: int, active: int) -> None:
    shape = shape_of(config(name))
    params = param_count(shape)
    assert params.total * 2 == total_size  # bf16 checkpoints: 2 bytes per parameter
    assert params.non_embedding == non_emb
    assert params.active_non_embedding == active
    assert kv_cache_bytes_per_token(shape) == kv
    assert flops_per_token(shape) == 2 * active


def test_deepseek_v3_mla_and_moe() -> None:
    shape = shape_of(config("deepseek-ai__DeepSeek-V3"))
    assert shape.mla and shape.moe_layers == 58 and shape.experts == 256
    params = param_count(shape)
    # "671B total parameters with 37B activated for each token" (main model, no MTP module)
    assert params.total == 671_026_419_200
    assert params.active_non_embedding + params.embedding + params.lm_head == 37_552_297_472
    # MLA: one 512 + 64 latent per layer, no factor 2, whatever num_key_value_heads says (128)
    assert kv_cache_bytes_per_token(shape) == 61 * 576 * 2 == 70_272
    assert kv_cache_bytes_per_token(shape, "fp8") == 35_136
    assert kv_cache_bytes_per_token(shape, "fp8_ds_mla") == 61 * 656
    naive = 2 * shape.layers * shape.kv_heads * (shape.qk_nope_head_dim + 64) * 2
    assert naive / kv_cache_bytes_per_token(shape) > 80  # what a GQA formula would claim
    # the latent is replicated on every tensor-parallel GPU
    assert kv_cache_bytes_per_token(shape, "auto", 8) == 70_272
    assert flops_per_token(shape, 8) == pytest.approx(2 * params.active_non_embedding / 8)


def test_kv_cache_dtype_and_tensor_parallel() -> None:
    shape = shape_of(config("meta-llama__Llama-3.1-70B"))
    assert kv_cache_bytes_per_token(shape, "fp8") == 163_840
    assert kv_cache_bytes_per_token(shape, "bfloat16") == 327_680
    assert kv_cache_bytes_per_token(shape, "fp32") == 655_360
    # 8 KV heads over 4 GPUs: 2 heads each
    assert kv_cache_bytes_per_token(shape, "auto", 4) == 327_680 / 4
    # over 16 GPUs each still holds one (replicated) head
    assert kv_cache_bytes_per_token(shape, "auto", 16) == 327_680 / 8
    assert flops_per_token(shape, 4) == pytest.approx(flops_per_token(shape) / 4)
    with pytest.raises(ValueError):
        kv_cache_bytes_per_token(shape, "fp7")
    with pytest.raises(ValueError):
        flops_per_token(shape, 0)


def test_every_kv_dtype_has_a_size() -> None:
    shape = shape_of(config("meta-llama__Llama-3.1-8B"))
    for dtype in KV_CACHE_DTYPES:
        assert kv_cache_bytes_per_token(shape, dtype) > 0


def test_sliding_window_and_gqa_are_read() -> None:
    qwen = shape_of(config("Qwen__Qwen2-7B"))
    assert qwen.sliding_window is None  # use_sliding_window: false
    assert qwen.kv_heads == 4 and qwen.head_dim == 128 and qwen.qkv_bias
    mistral = shape_of({**config("mistralai__Mixtral-8x7B-v0.1"), "sliding_window": 4096})
    assert mistral.sliding_window == 4096
    # the window bounds tokens per sequence, not bytes per token
    assert kv_cache_bytes_per_token(mistral) == 131_072


def test_multimodal_text_config() -> None:
    inner = config("meta-llama__Llama-3.1-8B")
    wrapped = {"model_type": "llava", "torch_dtype": "bfloat16", "text_config": inner}
    assert param_count(shape_of(wrapped)) == param_count(shape_of(inner))


def test_tied_embeddings_have_no_separate_lm_head() -> None:
    tied = {**config("Qwen__Qwen2-7B"), "tie_word_embeddings": True}
    params = param_count(shape_of(tied))
    assert params.lm_head == 0
    assert params.total == 7_615_616_512 - 152_064 * 3584


def test_gpt2_plain_mlp_biases_and_learned_positions() -> None:
    shape = shape_of(config("openai-community__gpt2"))
    assert not shape.gated_mlp and shape.norm_bias and shape.positions == 1024
    assert shape.tie_embeddings  # GPT2Config's default: the key is absent from the file
    params = param_count(shape)
    # GPT2LMHeadModel's 124,439,808 parameters: token and position tables, 12 blocks, ln_f
    assert params.total == 124_439_808
    assert params.embedding == (50_257 + 1_024) * 768 and params.lm_head == 0
    assert params.non_embedding == 12 * (12 * 768 * 768 + 13 * 768) + 2 * 768 == 85_056_000
    assert kv_cache_bytes_per_token(shape, "fp32") == 2 * 12 * 768 * 4
    assert flops_per_token(shape) == 2 * 85_056_000


def test_missing_key_is_named() -> None:
    broken = config("meta-llama__Llama-3.1-8B")
    del broken["hidden_size"]
    with pytest.raises(ModelConfigError, match="hidden_size"):
        shape_of(broken)
