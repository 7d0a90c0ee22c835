"""Reading a Hugging Face model directory: config, safetensors index and headers, never tensors.

Directories are built in ``tmp_path`` from the real configs (``tests/fixtures/models``); the
safetensors files are written here with the format's layout (8-byte little-endian header length,
JSON header, then data), which is all the reader may look at.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from support.paths import FIXTURES

from exporter.backends.hfmodel import (
    ModelDirError,
    load_model,
    model_name,
    read_safetensors_header,
    stored_weight_bytes,
    tensor_bytes,
)

MODELS = FIXTURES / "models"
LLAMA_8B_TOTAL = 16_060_522_496  # published model.safetensors.index.json total_size
LLAMA_8B_EMBEDDING = 128_256 * 4096 * 2


def model_dir(tmp_path: Path, name: str = "meta-llama__Llama-3.1-8B") -> Path:
    directory = tmp_path / name
    directory.mkdir()
    shutil.copy(MODELS / name / "config.json", directory / "config.json")
    return directory


def write_safetensors(
    path: Path, tensors: dict[str, tuple[str, list[int], int]], data: bool
) -> None:
    """A safetensors file: ``tensors`` maps name -> (dtype, shape, bytes). With ``data`` False
    only the header is written, as if the tensor bytes were unreadable."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, size) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        if data:
            fh.write(b"\0" * offset)


def test_index_total_size_less_the_embedding(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    index = {"metadata": {"total_size": LLAMA_8B_TOTAL}, "weight_map": {"lm_head.weight": "x"}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    facts = load_model(directory)
    assert facts.name == "meta-llama__Llama-3.1-8B"
    # 16.06 GB stored; the input embedding (1.05 GB) is gathered, not streamed, per step
    assert facts.weight_bytes == LLAMA_8B_TOTAL - LLAMA_8B_EMBEDDING == 15_009_849_344
    assert facts.kv_cache_bytes_per_token == 131_072
    assert facts.flops_per_token == 2 * 6_979_588_096
    assert "model.safetensors.index.json metadata.total_size" in facts.notes[0]


def test_a_learned_position_table_is_not_streamed(tmp_path: Path) -> None:
    directory = tmp_path / "gpt2"
    directory.mkdir()
    config = (FIXTURES / "models" / "openai-community__gpt2" / "config.json").read_text()
    (directory / "config.json").write_text(config)
    total = 124_439_808 * 4
    index = {"metadata": {"total_size": total}, "weight_map": {"transformer.wpe.weight": "x"}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    facts = load_model(directory)
    # The tied token table is the LM head, read whole; the 1024-row position table is gathered.
    assert facts.weight_bytes == total - 1024 * 768 * 4
    # Without safetensors: the same figure from the shapes (float32 in the config).
    (directory / "model.safetensors.index.json").unlink()
    assert load_model(directory).weight_bytes == total - 1024 * 768 * 4


def test_index_total_size_written_as_a_float(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    index = {"metadata": {"total_size": float(LLAMA_8B_TOTAL)}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    assert stored_weight_bytes(directory) == (
        LLAMA_8B_TOTAL,
        "model.safetensors.index.json metadata.total_size",
    )


def test_headers_only_are_read(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    gib = 2**30
    # Two shards whose tensors are not in the files at all: the reader never gets that far.
    write_safetensors(
        directory / "model-00001-of-00002.safetensors",
        {
            "model.embed_tokens.weight": ("BF16", [128256, 4096], LLAMA_8B_EMBEDDING),
            "model.layers.0.mlp.up_proj.weight": ("BF16", [14336, 4096], 3 * gib),
        },
        data=False,
    )
    write_safetensors(
        directory / "model-00002-of-00002.safetensors",
        {"lm_head.weight": ("BF16", [128256, 4096], LLAMA_8B_EMBEDDING)},
        data=False,
    )
    assert all(f.stat().st_size < 4096 for f in directory.glob("*.safetensors"))
    size, source = stored_weight_bytes(directory) or (0, "")
    assert size == 2 * LLAMA_8B_EMBEDDING + 3 * gib
    assert source == "headers of 2 safetensors file(s)"
    assert load_model(directory).weight_bytes == LLAMA_8B_EMBEDDING + 3 * gib


def test_quantised_weights_count_their_real_bytes(tmp_path: Path) -> None:
    # A GPTQ 4-bit layer: int32-packed weights (8 per int32), fp16 scales, packed zero points.
    directory = model_dir(tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (directory / "config.json").write_text(json.dumps(config))
    qweight = 4096 // 8 * 14336 * 4
    scales = 4096 // 128 * 14336 * 2
    qzeros = 4096 // 128 * 14336 // 8 * 4
    write_safetensors(
        directory / "model.safetensors",
        {
            "model.layers.0.mlp.up_proj.qweight": ("I32", [512, 14336], qweight),
            "model.layers.0.mlp.up_proj.scales": ("F16", [32, 14336], scales),
            "model.layers.0.mlp.up_proj.qzeros": ("I32", [32, 1792], qzeros),
        },
        data=True,
    )
    assert stored_weight_bytes(directory) == (
        qweight + scales + qzeros,
        "headers of 1 safetensors file(s)",
    )
    # about a quarter of the bf16 matrix (4096 x 14336 x 2 bytes)
    assert 0.25 < (qweight + scales + qzeros) / (4096 * 14336 * 2) < 0.27


def test_without_safetensors_an_unquantised_model_is_estimated(tmp_path: Path) -> None:
    facts = load_model(model_dir(tmp_path))
    assert facts.weight_bytes == LLAMA_8B_TOTAL - LLAMA_8B_EMBEDDING
    assert "estimated from config.json" in facts.notes[0]


def test_without_safetensors_a_quantised_model_has_no_weight_bytes(tmp_path: Path) -> None:
    facts = load_model(model_dir(tmp_path, "deepseek-ai__DeepSeek-V3"))  # fp8 weights
    assert facts.weight_bytes is None
    assert facts.kv_cache_bytes_per_token == 70_272
    assert facts.flops_per_token == pytest.approx(2 * 35_698_939_392)


def test_tensor_parallel_and_overrides(tmp_path: Path) -> None:
    directory = model_dir(tmp_path, "meta-llama__Llama-3.1-70B")
    facts = load_model(
        directory, weight_bytes=140_000_000_000, kv_cache_dtype="fp8", tensor_parallel=4
    )
    assert facts.weight_bytes == 35_000_000_000  # the override is the whole model's
    assert facts.kv_cache_bytes_per_token == 163_840 / 4  # 2 of the 8 KV heads per GPU
    assert facts.flops_per_token == pytest.approx(2 * 68_452_360_192 / 4)
    assert "--model.weight-bytes" in facts.notes[0]


def test_weight_bytes_without_a_directory() -> None:
    facts = load_model(None, weight_bytes=16_000_000_000, tensor_parallel=2)
    assert facts.weight_bytes == 8_000_000_000
    assert facts.kv_cache_bytes_per_token is None and facts.flops_per_token is None


def test_hugging_face_cache_snapshot_names_the_model(tmp_path: Path) -> None:
    snapshot = tmp_path / "models--meta-llama--Llama-3.1-8B" / "snapshots" / "0e9e39f249a1"
    snapshot.mkdir(parents=True)
    assert model_name(snapshot) == "meta-llama/Llama-3.1-8B"
    assert model_name(tmp_path / "Qwen2.5-7B-Instruct") == "Qwen2.5-7B-Instruct"


def test_broken_directories_say_which_file(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match="not a directory"):
        load_model(tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelDirError, match=r"config\.json: no such file"):
        load_model(empty)
    (empty / "config.json").write_text("{not json")
    with pytest.raises(ModelDirError, match=r"config\.json: not JSON"):
        load_model(empty)
    (empty / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ModelDirError, match="num_hidden_layers"):
        load_model(empty)
    (empty / "config.json").write_text(
        '{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 0, "vocab_size": 9}'
    )
    with pytest.raises(ModelDirError, match="num_attention_heads / n_head must be positive"):
        load_model(empty)
    (empty / "config.json").write_text("[]")
    with pytest.raises(ModelDirError, match="not a JSON object"):
        load_model(empty)


def test_a_git_lfs_pointer_is_not_a_safetensors_file(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 4976698672\n"
    (directory / "model-00001-of-00004.safetensors").write_text(pointer)
    with pytest.raises(ModelDirError, match="git-lfs pointer"):
        load_model(directory)


def test_bad_headers(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\x05\0\0")
    with pytest.raises(ModelDirError, match="shorter than a safetensors header"):
        read_safetensors_header(path)
    path.write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(ModelDirError, match="cut short"):
        read_safetensors_header(path)
    path.write_bytes(struct.pack("<Q", 4) + b"[1] ")
    with pytest.raises(ModelDirError, match="not a JSON object"):
        read_safetensors_header(path)
    with pytest.raises(ModelDirError, match="data_offsets"):
        tensor_bytes({"w": {"dtype": "F16", "shape": [2], "data_offsets": [8, 4]}})
    with pytest.raises(ModelDirError, match="data_offsets"):
        tensor_bytes({"w": {"dtype": "F16", "shape": [2]}})
