"""A Hugging Face model directory as a source of roofline facts, read without loading a tensor.

What is read: ``config.json`` (shapes, :mod:`exporter.hardware.model_shapes` does the arithmetic)
and, for the bytes of the weights, ``model.safetensors.index.json``'s
``metadata.total_size`` or else the header of every ``*.safetensors`` file: its first 8 bytes
(the header length, little-endian) and the JSON header itself, whose ``data_offsets`` give each
tensor's size. Tensor data is never read, so a 700 GB checkpoint costs a few reads of a few MB.
Quantised checkpoints (GPTQ, AWQ, FP8) count their real stored bytes: packed integer weights,
scales and zero points as they are in the files.

Weight bytes *read per decode step* are the stored bytes less the input-embedding table when
it is not tied to the LM head (a step gathers a few of its rows; the LM head it reads whole)
and less a learned position table (GPT-2's ``wpe``, gathered likewise):
Llama-3.1-8B stores 16.06 GB and reads 15.01 GB per step. Without safetensors (``.bin``
checkpoints, or a directory holding only ``config.json``) the figure is estimated as parameters
x ``torch_dtype`` bytes for unquantised models, and absent for quantised ones.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.hardware.model_shapes import (
    ModelConfigError,
    ModelShape,
    flops_per_token,
    kv_cache_bytes_per_token,
    param_count,
    shape_of,
)

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
# The safetensors format caps its header at 100 MB (safetensors' MAX_HEADER_SIZE); anything
# larger is not a safetensors file.
MAX_HEADER_BYTES = 100_000_000
MAX_JSON_BYTES = 64 * 1024 * 1024


class ModelDirError(ValueError):
    """The model directory cannot be read; the message names the file and the problem."""


@dataclass(frozen=True)
class ModelFacts:
    """Roofline facts of the served model, per GPU of the engine (see :func:`load_model`).

    ``None`` where the directory does not tell; ``notes`` say where each figure came from.
    """

    name: str
    weight_bytes: float | None
    kv_cache_bytes_per_token: float | None
    flops_per_token: float | None
    notes: list[str] = field(default_factory=list)


def _read_json(path: Path) -> Any:
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise ModelDirError(f"{path}: larger than {MAX_JSON_BYTES // 2**20} MiB")
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelDirError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ModelDirError(f"{path}: cannot read ({err})") from None
    except json.JSONDecodeError as err:
        raise ModelDirError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (8-byte length, then the header; nothing else)."""
    try:
        with path.open("rb") as fh:
            prefix = fh.read(8)
            if len(prefix) != 8:
                raise ModelDirError(f"{path}: shorter than a safetensors header")
            (length,) = struct.unpack("<Q", prefix)
            if not 2 <= length <= MAX_HEADER_BYTES:
                raise ModelDirError(
                    f"{path}: header length {length} is not a safetensors header "
                    "(a git-lfs pointer instead of the file?)"
                )
            raw = fh.read(length)
    except OSError as err:
        raise ModelDirError(f"{path}: cannot read ({err.strerror or err})") from None
    if len(raw) != length:
        raise ModelDirError(f"{path}: header cut short ({len(raw)} of {length} bytes)")
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ModelDirError(f"{path}: header is not JSON") from None
    if not isinstance(header, dict):
        raise ModelDirError(f"{path}: header is not a JSON object")
    return header


def tensor_bytes(header: dict[str, Any], source: str = "header") -> int:
    """Bytes of every tensor a safetensors header describes (``data_offsets`` end - start)."""
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise ModelDirError(f"{source}: tensor {name!r} has no valid data_offsets")
        total += offsets[1] - offsets[0]
    return total


def stored_weight_bytes(directory: Path) -> tuple[int, str] | None:
    """Bytes of the stored weights and where they came from; None without safetensors."""
    index = directory / INDEX_FILE
    if index.is_file():
        data = _read_json(index)
        metadata = data.get("metadata") if isinstance(data, dict) else None
        size = metadata.get("total_size") if isinstance(metadata, dict) else None
        # Some converters write the size as a float (``16060522496.0``).
        if (
            isinstance(size, (int, float))
            and not isinstance(size, bool)
            and size > 0
            and float(size).is_integer()
        ):
            return int(size), f"{INDEX_FILE} metadata.total_size"
        # An index without total_size (some converters omit it): fall through to the headers.
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    total = sum(tensor_bytes(read_safetensors_header(f), str(f)) for f in files)
    return total, f"headers of {len(files)} safetensors file(s)"


_HF_CACHE = re.compile(r"^models--(?P<org>[^/]+?)--(?P<name>[^/]+)$")


def model_name(directory: Path) -> str:
    """The model's name from its directory: ``org/name`` for a Hugging Face cache snapshot
    (``models--org--name/snapshots/<revision>``), else the directory's own name."""
    resolved = directory.resolve() if directory.exists() else directory
    parts = resolved.parts
    if len(parts) >= 3 and parts[-2] == "snapshots":
        match = _HF_CACHE.match(parts[-3])
        if match:
            return f"{match['org']}/{match['name']}"
    return resolved.name


def _gathered_params(shape: ModelShape) -> int:
    """Input-embedding parameters a step gathers a few rows of instead of reading whole: the
    token table unless tied to the LM head, and a learned position table (GPT-2)."""
    tables = param_count(shape).embedding
    return shape.positions * shape.hidden if shape.tie_embeddings else tables


def _embedding_bytes(shape: ModelShape) -> int:
    """Bytes of the input-embedding tables a step does not read whole (see above)."""
    return _gathered_params(shape) * (shape.dtype_bytes or 2)


def _weights(
    directory: Path, shape: ModelShape, override: int | None, notes: list[str]
) -> float | None:
    if override is not None:
        notes.append(f"weight bytes {override} from --model.weight-bytes")
        return float(override)
    stored = stored_weight_bytes(directory)
    if stored is not None:
        size, source = stored
        embedding = _embedding_bytes(shape)
        if 0 < embedding < size:
            notes.append(f"weight bytes {size} from {source}, less the {embedding}-byte embedding")
            return float(size - embedding)
        notes.append(f"weight bytes {size} from {source}")
        return float(size)
    if shape.quant_method is None and shape.dtype_bytes:
        estimate = (param_count(shape).total - _gathered_params(shape)) * shape.dtype_bytes
        notes.append(f"weight bytes {estimate} estimated from config.json shapes (no safetensors)")
        return float(estimate)
    notes.append("weight bytes unknown: no safetensors and a quantised or untyped config")
    return None


def load_model(
    directory: Path | None,
    *,
    weight_bytes: int | None = None,
    kv_cache_dtype: str = "auto",
    tensor_parallel: int = 1,
) -> ModelFacts:
    """Roofline facts per GPU of an engine serving the model in ``directory`` with
    ``tensor_parallel`` GPUs. Without a directory only ``weight_bytes`` is known.

    Raises :class:`ModelDirError` when the directory or its files cannot be read or understood.
    """
    notes: list[str] = []
    if directory is None:
        per_gpu = None if weight_bytes is None else weight_bytes / tensor_parallel
        return ModelFacts("", per_gpu, None, None, notes)
    if not directory.is_dir():
        raise ModelDirError(f"{directory}: not a directory")
    config = _read_json(directory / CONFIG_FILE)
    if not isinstance(config, dict):
        raise ModelDirError(f"{directory / CONFIG_FILE}: not a JSON object")
    try:
        shape = shape_of(config)
    except ModelConfigError as err:
        raise ModelDirError(f"{directory / CONFIG_FILE}: {err}") from None
    total = _weights(directory, shape, weight_bytes, notes)
    if tensor_parallel > 1:
        notes.append(f"per GPU of {tensor_parallel} (tensor parallel)")
    return ModelFacts(
        name=model_name(directory),
        weight_bytes=None if total is None else total / tensor_parallel,
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(shape, kv_cache_dtype, tensor_parallel),
        flops_per_token=flops_per_token(shape, tensor_parallel),
        notes=notes,
    )
