"""Floor arithmetic: the shortest time the hardware allows for a decode step or a prefill.

Decode is memory-bound: each step reads every weight once (shared by the whole batch) and
every live KV-cache byte, so a step cannot be shorter than those bytes over the peak DRAM
bandwidth. Prefill is compute-bound: about ``2 x parameters`` FLOPs per prompt token against
the dense tensor peak. Both are floors: real steps also launch kernels, schedule, all-reduce,
sample, and wait on the host; ``docs/roofline.md`` lists what the floors leave out.

Worked example: a 70B model in fp16 is ~140 GB of weights; an A100 80GB streams 2.039 TB/s, so
one decode step of that model on one such GPU takes at least 140e9 / 2.039e12 ≈ 69 ms.
"""

from __future__ import annotations


def decode_floor_seconds(weight_bytes: float, kv_bytes: float, peak_bandwidth: float) -> float:
    """Shortest possible decode step: ``(weight bytes + KV bytes in use) / peak bandwidth``.

    All three per GPU (under tensor parallelism each GPU streams its shard in parallel).
    Raises ``ValueError`` for a non-positive bandwidth or negative byte counts.
    """
    if peak_bandwidth <= 0:
        raise ValueError(f"peak bandwidth must be positive, got {peak_bandwidth}")
    if weight_bytes < 0 or kv_bytes < 0:
        raise ValueError("byte counts cannot be negative")
    return (weight_bytes + kv_bytes) / peak_bandwidth


def prefill_flops(params: float, tokens: float) -> float:
    """Forward FLOPs of a prefill: ``2 x parameters x tokens`` (one multiply and one add per
    weight per token; attention over the context comes on top, see ``docs/roofline.md``)."""
    if params < 0 or tokens < 0:
        raise ValueError("parameters and tokens cannot be negative")
    return 2.0 * params * tokens


def prefill_floor_seconds(flops: float, peak_flops: float) -> float:
    """Shortest possible prefill of ``flops`` on a GPU with ``peak_flops`` dense tensor peak."""
    if peak_flops <= 0:
        raise ValueError(f"peak FLOPs must be positive, got {peak_flops}")
    if flops < 0:
        raise ValueError("FLOPs cannot be negative")
    return flops / peak_flops


def experts_read(experts: int, experts_per_token: int, tokens: int) -> float:
    """Expected distinct experts of one MoE layer a decode step touches with ``tokens`` in the
    batch, if routing were uniform: ``E x (1 - (1 - k/E)^B)``.

    Mixtral (E=8, k=2): 2.0 at batch 1, 5.5 at 4, 7.9 at 16, i.e. from about 16 decode tokens
    a step reads every expert. Real routers are skewed, which lowers the count.
    """
    if experts <= 0 or not 0 < experts_per_token <= experts or tokens < 0:
        raise ValueError("need experts > 0, 0 < experts_per_token <= experts, tokens >= 0")
    return experts * (1.0 - (1.0 - experts_per_token / experts) ** tokens)
