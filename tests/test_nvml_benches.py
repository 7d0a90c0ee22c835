"""The NVML benchmarks measure what they say (their numbers are not tested): the stand-in poll
benchmark's boards make the calls docs/nvml.md counts, and the GPU timing script, run over the
stand-in, times the new calls and keeps what they answered."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pynvml
import pytest
from support.paths import bench_script
from support.pynvml_fake import L4_LINKLESS, fake_pynvml, gb200


def test_poll_benchmark_boards_make_the_counted_calls() -> None:
    bench = bench_script("nvml_poll", "nvml_poll_bench")
    before = bench.measure("h100 (before)", 20)
    assert before["calls_per_poll"] == 10 and before["new_calls_per_poll"] == {}
    after = bench.measure("h100", 20)
    # one field-values call per poll, the fabric every tenth (reads 10 and 20 of 3..22)
    assert after["new_calls_per_poll"] == {"field_values": 1.0, "fabric_info": 0.1}
    assert after["calls_per_poll"] == pytest.approx(11.1)
    # the power limits (no power smoothing before driver 570), each link's state and speed
    assert after["field_values_per_poll"] == 2 + 2 * 18
    per_link = bench.measure("h100 per-link", 20)
    assert per_link["gpm_metrics_per_poll"] == 7 + 2 + 36


def test_gpu_timing_script_times_the_new_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_pynvml([gb200(), L4_LINKLESS], driver="590.48.01")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    timing = bench_script("gpu/nvml_timing", "nvml_timing_bench")
    out = tmp_path / "timing.json"
    monkeypatch.setattr(sys, "argv", ["nvml_timing.py", "--calls", "3", "--out", str(out)])
    assert timing.main() == 0
    gb, l4 = json.loads(out.read_text())["gpus"]
    assert {"fabric_info", "power_profiles", "enforced_power_limit"} <= set(gb["calls"])
    # power state 4, 18 NVLink states and speeds, 10 C2C statuses and bandwidths; GPM's 7, the
    # NVLink totals and each link's two, C2C's two
    assert "field_values_60" in gb["calls"] and "gpm_metrics_47" in gb["calls"]
    assert gb["links"]["links"] == {"nvlink": 18, "c2c": 10}
    assert gb["links"]["fields"]["power_smoothing_floor_w"] == 600
    assert gb["links"]["power_profiles"] == [pynvml.NVML_POWER_PROFILE_LLM_INFERENCE]
    # a GPU without any of it: timed all the same, each call's error said
    assert l4["calls"]["fabric_info"]["error"] == "NOT_SUPPORTED"
    assert l4["links"]["fabric"] == {"error": "NOT_SUPPORTED"}
