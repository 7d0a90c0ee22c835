"""The floor arithmetic, on the worked examples."""

from __future__ import annotations

import pytest

from exporter.hardware.floors import (
    decode_floor_seconds,
    experts_read,
    prefill_floor_seconds,
    prefill_flops,
)


def test_70b_fp16_on_an_a100_is_69_ms_per_token() -> None:
    # 70B parameters in fp16 ~ 140 GB; an A100 80GB streams 2.039 TB/s.
    assert decode_floor_seconds(140e9, 0, 2.039e12) == pytest.approx(0.0687, abs=0.0005)
    # With Llama-3.1-70B's real 141,107,412,992 bytes: 69.2 ms.
    assert decode_floor_seconds(141_107_412_992, 0, 2.039e12) == pytest.approx(0.0692, abs=5e-5)


def test_live_kv_cache_adds_to_the_floor() -> None:
    # Llama-3.1-8B in bf16 (16.06 GB) with 26 GB of live KV on an H100 SXM (3.35 TB/s): ~12.6 ms.
    floor = decode_floor_seconds(16.06e9, 26e9, 3.35e12)
    assert floor == pytest.approx(0.01255, abs=5e-5)
    assert floor > decode_floor_seconds(16.06e9, 0, 3.35e12)


def test_tensor_parallel_halves_the_floor() -> None:
    one = decode_floor_seconds(141e9, 0, 2.039e12)
    two = decode_floor_seconds(141e9 / 2, 0, 2.039e12)
    assert two == pytest.approx(one / 2)


def test_prefill_flops_and_floor() -> None:
    # Llama-3.1-8B: 2 x 6.98e9 non-embedding parameters x 2048 prompt tokens on an H100 SXM
    # (989.4 TFLOPS bf16): 29 ms.
    flops = prefill_flops(6_979_588_096, 2048)
    assert flops == pytest.approx(28.59e12, rel=1e-3)
    assert prefill_floor_seconds(flops, 989.4e12) == pytest.approx(0.0289, abs=1e-4)


def test_experts_read_per_step() -> None:
    assert experts_read(8, 2, 1) == pytest.approx(2.0)
    assert experts_read(8, 2, 4) == pytest.approx(5.47, abs=0.01)
    assert experts_read(8, 2, 16) == pytest.approx(7.92, abs=0.01)
    assert experts_read(256, 8, 1) == pytest.approx(8.0)
    assert experts_read(8, 2, 0) == 0.0


@pytest.mark.parametrize(
    "call",
    [
        lambda: decode_floor_seconds(1, 0, 0),
        lambda: decode_floor_seconds(-1, 0, 1),
        lambda: decode_floor_seconds(1, -1, 1),
        lambda: prefill_flops(-1, 1),
        lambda: prefill_floor_seconds(1, 0),
        lambda: experts_read(8, 9, 1),
        lambda: experts_read(0, 0, 1),
    ],
)
def test_nonsense_is_refused(call: object) -> None:
    with pytest.raises(ValueError):
        call()  # type: ignore[operator]
