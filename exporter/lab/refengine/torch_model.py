"""A decoder-only transformer with random weights and a slot-major KV cache (needs torch).

Pre-norm GPT blocks (LayerNorm, causal multi-head attention, GELU MLP), learned position
embeddings, an LM head tied to the token embedding. The weights are random (seeded): the
engine does the real work of a language model - the same matrix products, attention over a
growing KV cache, sampling - without downloading one, and its output is fluent nonsense.

KV cache: two tensors per layer, ``[slots, heads, max_len, head_dim]``, allocated once. A
running sequence owns one slot; prefill writes its prompt's keys and values, every decode
step appends one position. A batched decode step reads each sequence's slot up to the longest
sequence in the batch, with a mask for the shorter ones.

The architecture is GPT-2's (the same blocks, tied LM head, learned positions), so the model
describes itself in GPT-2's Hugging Face format (:func:`hf_config`, :func:`hf_index`) and the
sidecar's model collector reads its roofline facts as it reads those of any served model.

torch is imported here and in :mod:`exporter.lab.refengine.worker` only; everything is typed
``Any`` at the torch boundary (mypy does not follow torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    layers: int = 4
    d_model: int = 256
    heads: int = 4
    max_len: int = 1024
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def parameters(self) -> int:
        d = self.d_model
        return (
            self.vocab_size * d + self.max_len * d + self.layers * self.layer_parameters() + 2 * d
        )

    def layer_parameters(self) -> int:
        """One block: qkv, out, fc1, fc2 with biases, two LayerNorms (weight and bias)."""
        d = self.d_model
        return 12 * d * d + 13 * d

    def streamed_parameters(self) -> int:
        """Parameters one forward pass reads whole: every block, the final norm and the LM head
        (the tied token embedding). The position table is gathered a row per token."""
        d = self.d_model
        return self.layers * self.layer_parameters() + 2 * d + self.vocab_size * d

    def matmul_parameters(self) -> int:
        """Weights a token is multiplied through, less the LM head (2 x this: its FLOPs)."""
        return self.layers * 12 * self.d_model * self.d_model

    def kv_bytes_per_token(self, element_size: int) -> int:
        """Keys and values of one position, all layers."""
        return 2 * self.layers * self.d_model * element_size


class Model:
    """The weights, the KV cache and the two forward passes (prefill, batched decode)."""

    def __init__(self, cfg: ModelConfig, *, slots: int, device: str, dtype: Any) -> None:
        if cfg.d_model % cfg.heads:
            raise ValueError("d_model must be a multiple of heads")
        self.cfg = cfg
        self.reserve: Any = None  # memory-pressure: device memory held for the KV pool
        self.device = torch.device(device)
        self.dtype = dtype
        gen = torch.Generator().manual_seed(cfg.seed)
        d, f = cfg.d_model, 4 * cfg.d_model
        std = 0.02

        def w(*shape: int, scale: float = std) -> Any:
            t = torch.randn(*shape, generator=gen) * scale
            return t.to(device=self.device, dtype=dtype)

        def ones(n: int) -> Any:
            return torch.ones(n, device=self.device, dtype=dtype)

        def zeros(n: int) -> Any:
            return torch.zeros(n, device=self.device, dtype=dtype)

        self.embed = w(cfg.vocab_size, d)
        self.pos = w(cfg.max_len, d)
        out_scale = std / math.sqrt(2 * cfg.layers)
        self.blocks = [
            {
                "ln1_w": ones(d),
                "ln1_b": zeros(d),
                "qkv_w": w(3 * d, d),
                "qkv_b": zeros(3 * d),
                "out_w": w(d, d, scale=out_scale),
                "out_b": zeros(d),
                "ln2_w": ones(d),
                "ln2_b": zeros(d),
                "fc1_w": w(f, d),
                "fc1_b": zeros(f),
                "fc2_w": w(d, f, scale=out_scale),
                "fc2_b": zeros(d),
            }
            for _ in range(cfg.layers)
        ]
        self.lnf_w = ones(d)
        self.lnf_b = zeros(d)
        shape = (cfg.layers, slots, cfg.heads, cfg.max_len, cfg.head_dim)
        self.k_cache = torch.zeros(shape, device=self.device, dtype=dtype)
        self.v_cache = torch.zeros(shape, device=self.device, dtype=dtype)

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cached positions of slot ``src`` into slot ``dst``."""
        if length > 0 and src != dst:
            self.k_cache[:, dst, :, :length] = self.k_cache[:, src, :, :length]
            self.v_cache[:, dst, :, :length] = self.v_cache[:, src, :, :length]

    def export_kv(self, slot: int, tokens: int) -> bytes:
        """The first ``tokens`` cached positions of ``slot`` as bytes, laid out
        ``[layers, 2 (keys, values), heads, tokens, head_dim]`` in the cache's dtype: what a
        disaggregated prefill server hands to the decode server."""
        k = self.k_cache[:, slot, :, :tokens]
        v = self.v_cache[:, slot, :, :tokens]
        both = torch.stack((k, v), dim=1).contiguous().cpu()
        return bytes(both.view(torch.uint8).numpy().tobytes())

    def import_kv(self, slot: int, tokens: int, payload: bytes) -> None:
        """Write a cache laid out as :meth:`export_kv` gives it into ``slot``'s first
        ``tokens`` positions; ValueError if its size is not this model's for ``tokens``."""
        cfg = self.cfg
        shape = (cfg.layers, 2, cfg.heads, tokens, cfg.head_dim)
        want = math.prod(shape) * self.k_cache.element_size()
        if len(payload) != want:
            raise ValueError(f"KV cache of {len(payload)} bytes, this model needs {want}")
        raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        both = raw.view(self.dtype).view(shape).to(self.device)
        self.k_cache[:, slot, :, :tokens] = both[:, 0]
        self.v_cache[:, slot, :, :tokens] = both[:, 1]

    def cache_bytes(self) -> int:
        return int(self.k_cache.numel() * self.k_cache.element_size() * 2)

    @property
    def element_size(self) -> int:
        return int(self.embed.element_size())

    def weight_bytes(self) -> int:
        """Bytes of every stored weight (what a checkpoint of this model holds)."""
        return sum(int(t.numel()) for t in hf_tensors(self).values()) * self.element_size

    # --- forward -------------------------------------------------------------------------------
    def _mlp(self, blk: dict[str, Any], x: Any) -> Any:
        fn = torch.nn.functional
        h = fn.layer_norm(x, (self.cfg.d_model,), blk["ln2_w"], blk["ln2_b"])
        h = fn.gelu(fn.linear(h, blk["fc1_w"], blk["fc1_b"]), approximate="tanh")
        return x + fn.linear(h, blk["fc2_w"], blk["fc2_b"])

    def _logits(self, x: Any) -> Any:
        fn = torch.nn.functional
        x = fn.layer_norm(x, (self.cfg.d_model,), self.lnf_w, self.lnf_b)
        return fn.linear(x, self.embed).float()

    def prefill(self, tokens: list[int], slot: int) -> Any:
        """Run the prompt, fill ``slot``'s cache positions 0..n-1; logits of the last token."""
        cfg, fn = self.cfg, torch.nn.functional
        n = len(tokens)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        x = self.embed[ids] + self.pos[:n]
        for layer, blk in enumerate(self.blocks):
            h = fn.layer_norm(x, (cfg.d_model,), blk["ln1_w"], blk["ln1_b"])
            qkv = fn.linear(h, blk["qkv_w"], blk["qkv_b"]).view(n, 3, cfg.heads, cfg.head_dim)
            q, k, v = (qkv[:, i].transpose(0, 1) for i in range(3))  # [heads, n, head_dim]
            self.k_cache[layer, slot, :, :n] = k
            self.v_cache[layer, slot, :, :n] = v
            att = fn.scaled_dot_product_attention(q, k, v, is_causal=True)
            att = att.transpose(0, 1).reshape(n, cfg.d_model)
            x = x + fn.linear(att, blk["out_w"], blk["out_b"])
            x = self._mlp(blk, x)
        return self._logits(x[-1:])[0]

    def decode(self, tokens: list[int], slots: list[int], positions: list[int]) -> Any:
        """One step for a batch: token ``i`` sits at ``positions[i]`` of ``slots[i]``.

        Returns logits ``[batch, vocab]``."""
        cfg, fn = self.cfg, torch.nn.functional
        b = len(tokens)
        dev = self.device
        ids = torch.tensor(tokens, dtype=torch.long, device=dev)
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        slot_ids = torch.tensor(slots, dtype=torch.long, device=dev)
        span = max(positions) + 1
        # Keys at or before each sequence's own position are visible.
        visible = torch.arange(span, device=dev)[None, :] <= pos[:, None]
        mask = visible[:, None, None, :]  # [b, 1, 1, span]
        contiguous = slots == list(range(slots[0], slots[0] + b))
        x = self.embed[ids] + self.pos[pos]
        for layer, blk in enumerate(self.blocks):
            h = fn.layer_norm(x, (cfg.d_model,), blk["ln1_w"], blk["ln1_b"])
            qkv = fn.linear(h, blk["qkv_w"], blk["qkv_b"]).view(b, 3, cfg.heads, cfg.head_dim)
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # [b, heads, head_dim]
            kc, vc = self.k_cache[layer], self.v_cache[layer]
            kc[slot_ids, :, pos] = k
            vc[slot_ids, :, pos] = v
            if contiguous:
                keys = kc[slots[0] : slots[0] + b, :, :span]
                values = vc[slots[0] : slots[0] + b, :, :span]
            else:
                keys = kc[slot_ids, :, :span]
                values = vc[slot_ids, :, :span]
            att = fn.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=mask)
            x = x + fn.linear(att.reshape(b, cfg.d_model), blk["out_w"], blk["out_b"])
            x = self._mlp(blk, x)
        return self._logits(x)


def sample(logits: Any, temperatures: list[float], generators: list[Any], banned: int) -> list[int]:
    """One token per row: greedy where the temperature is 0, else sampled at that temperature.

    ``banned`` (the end-of-text id) is never produced: the engine stops on max_tokens, as
    vLLM does with ``ignore_eos``."""
    logits = logits.float()
    logits[:, banned] = float("-inf")
    out: list[int] = []
    for row, temperature, gen in zip(logits, temperatures, generators, strict=True):
        if temperature <= 0:
            out.append(int(torch.argmax(row)))
            continue
        probs = torch.softmax(row / temperature, dim=-1).cpu()
        out.append(int(torch.multinomial(probs, 1, generator=gen)))
    return out


def hf_tensors(model: Model) -> dict[str, Any]:
    """The stored weights under GPT-2's Hugging Face names (``GPT2LMHeadModel``), with its
    ``Conv1D`` layout (``[in, out]``: the transposes of the ``[out, in]`` tensors here). The LM
    head is the token embedding, tied, and not stored again."""
    out: dict[str, Any] = {
        "transformer.wte.weight": model.embed,
        "transformer.wpe.weight": model.pos,
    }
    names = {
        "ln_1": ("ln1_w", "ln1_b"),
        "attn.c_attn": ("qkv_w", "qkv_b"),
        "attn.c_proj": ("out_w", "out_b"),
        "ln_2": ("ln2_w", "ln2_b"),
        "mlp.c_fc": ("fc1_w", "fc1_b"),
        "mlp.c_proj": ("fc2_w", "fc2_b"),
    }
    for i, blk in enumerate(model.blocks):
        for hf, (weight, bias) in names.items():
            w = blk[weight]
            out[f"transformer.h.{i}.{hf}.weight"] = w if w.dim() == 1 else w.t()
            out[f"transformer.h.{i}.{hf}.bias"] = blk[bias]
    out["transformer.ln_f.weight"] = model.lnf_w
    out["transformer.ln_f.bias"] = model.lnf_b
    return out


def hf_config(model: Model, *, eos_id: int) -> dict[str, Any]:
    """``config.json`` of the model in GPT-2's Hugging Face format: the real shapes."""
    cfg = model.cfg
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.max_len,
        "n_embd": cfg.d_model,
        "n_layer": cfg.layers,
        "n_head": cfg.heads,
        "n_inner": 4 * cfg.d_model,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": True,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "torch_dtype": str(model.dtype).removeprefix("torch."),
    }


def hf_index(model: Model) -> dict[str, Any]:
    """``model.safetensors.index.json``: every stored tensor in one ``model.safetensors`` and
    ``metadata.total_size``, the bytes of the stored weights."""
    tensors = hf_tensors(model)
    return {
        "metadata": {"total_size": model.weight_bytes()},
        "weight_map": dict.fromkeys(tensors, "model.safetensors"),
    }


def generator(seed: int) -> Any:
    return torch.Generator().manual_seed(seed)


def pick_device(requested: str) -> str:
    """``auto``: CUDA when torch sees a GPU, else CPU."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {requested}: torch sees no CUDA device")
    return requested


def default_dtype(device: str) -> Any:
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def set_threads(threads: int) -> None:
    if threads > 0:
        torch.set_num_threads(threads)
