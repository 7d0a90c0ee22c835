"""``diagnose`` names why a throttled GPU's clocks are held down, as the alert's description does:
the cause is a name evidence (a label of the cause record), the power figures numbers.

The pages are hand-written, one sidecar with two GPUs booting with a 700 W limit: GPU 0 in a
hardware slowdown, GPU 1 idle; what differs between the cases is GPU 0's power state (its
draw, the limit it enforces, power smoothing) and thermal reasons.
"""

from __future__ import annotations

import asyncio

import pytest

from exporter.diagnose.datasources import TargetBackend, scrape_samples, target_evaluator
from exporter.diagnose.diagnosis import Report
from exporter.diagnose.evaluate import evaluate
from exporter.diagnose.promql_eval import Scrape
from exporter.diagnose.report import as_text, texts
from exporter.signatures import parse_config

UUIDS = ("GPU-0a1b2c3d4-0000-4000-8000-000000000000", "GPU-1a1b2c3d4-0000-4000-8000-000000000001")


def _page(power: float, thermal: bool, smoothing: bool, limit: float, default: float) -> str:
    lines = ['inference_exporter_build_info{version="0.1.0"} 1']
    for gpu, uuid in enumerate(UUIDS):
        key = f'gpu="{gpu}",uuid="{uuid}"'
        throttled = gpu == 0
        for reason, active in (
            ("hw_slowdown", throttled),
            ("sw_thermal", throttled and thermal),
            ("power_cap", False),
        ):
            lines.append(
                f'inference_gpu_clock_event_active{{{key},reason="{reason}"}} {int(active)}'
            )
        # the same readings' throttling bits: hw_slowdown 0x8, sw_thermal 0x20
        mask = (8 if throttled else 0) + (32 if throttled and thermal else 0)
        lines.append(f"inference_gpu_clock_throttle_reasons{{{key}}} {mask}")
        lines += [
            f"inference_gpu_temperature_celsius{{{key}}} {86 if thermal else 64}",
            f"inference_gpu_sm_clock_hertz{{{key}}} 1.41e9",
            f"inference_gpu_power_watts{{{key}}} {power if throttled else 90}",
            f"inference_gpu_power_limit_watts{{{key}}} {limit:.0f}",
            f"inference_gpu_power_default_limit_watts{{{key}}} {default:.0f}",
            f"inference_gpu_power_smoothing_enabled{{{key}}} {int(smoothing)}",
        ]
    return "\n".join(lines) + "\n"


def _diagnose(power: float, *, thermal: bool, smoothing: bool, limit: float) -> Report:
    cfg = parse_config({}, "sidecar")
    page = scrape_samples(_page(power, thermal, smoothing, limit, default=700.0))
    scrapes = [Scrape(1_700_000_000.0 + 5 * i, dict(page)) for i in range(4)]
    report = Report("target", "http://127.0.0.1:1/metrics", cfg, 0.1, scrapes[-1].time)
    backend = TargetBackend(target_evaluator(scrapes, cfg))
    asyncio.run(evaluate(backend, report, "t"))
    return report


@pytest.mark.parametrize(
    ("power", "thermal", "smoothing", "limit", "cause"),
    [
        (697.0, False, False, 700.0, "power cap"),
        (497.0, False, False, 500.0, "power cap below its default"),
        (697.0, True, False, 700.0, "thermal"),
        (400.0, False, True, 700.0, "power smoothing"),
        (400.0, False, False, 700.0, "hardware slowdown"),
    ],
)
def test_the_finding_names_the_cause(
    power: float, thermal: bool, smoothing: bool, limit: float, cause: str
) -> None:
    report = _diagnose(power, thermal=thermal, smoothing=smoothing, limit=limit)
    findings = [f for f in report.findings if f.sig.alert == "InferenceGPUThrottled"]
    # the slowdown holds on GPU 0 (and, when hot, its thermal reason beside it), never GPU 1
    assert {f.instance.get("gpu") for f in findings} == {"0"}
    slowdown = next(f for f in findings if f.instance.get("reason") == "hw_slowdown")
    evidence = {e.key: e for e in slowdown.evidence}
    assert evidence["cause"].text == cause and evidence["cause"].value is None
    assert evidence["power"].text == f"{power:.0f}" and evidence["limit"].text == f"{limit:.0f}"
    _, description = texts(slowdown)
    assert description.startswith(
        f"GPU 0 ({UUIDS[0]}) has been slowed by hw_slowdown for 10m, cause: {cause}; die at "
    )
    assert f"drawing {power:.0f} W of the {limit:.0f} W limit it enforces" in description
    assert f"what holds the clocks down {cause};" in as_text(report)
