"""The demo's screen laid out: it fits 80x24 and uses a larger terminal, sparklines scale,
reasons wrap at word boundaries, ``d``'s verdict replaces the signatures."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from exporter.lab.screen import (
    BLOCKS,
    GAUGES,
    Alert,
    ScreenState,
    lines,
    renderable,
    sparkline,
)

REASON = (
    "The busiest engine thread uses 98 % of a core (threshold 90 %) while mean GPU utilisation "
    "is 40 % (below 60 %): a single GIL-bound thread (HTTP handling, tokenization, scheduling) "
    "caps throughput however many cores the node has."
)


def state(alerts: int = 3) -> ScreenState:
    s = ScreenState(
        title="inference-bottleneck-exporter demo - injected: frontend-gil",
        places=[
            ("engine", "127.0.0.1:8000", "http://127.0.0.1:8000  (/v1/completions, /tokenize)"),
            ("sidecar", "127.0.0.1:10960", "http://127.0.0.1:10960/  and  /metrics"),
            ("Prometheus", "127.0.0.1:9090", "http://127.0.0.1:9090/alerts  (fast rules)"),
        ],
        gpu="replay of the 'starved' drill trace (synthetic, ~40 %)",
    )
    for i in range(300):
        late = i >= 150
        s.record(
            {
                "gpu": 0.4 if late else 0.85,
                "queue": float(i - 150) if late else 0.0,
                "thread": 0.98 if late else 0.45,
                "tokenizer": 0.004,
                "decode": 0.02,
                "latency": 1.5 + (i - 150) * 0.08 if late else 1.5,
            }
        )
    s.alerts = [
        Alert("firing", "warning", f"InferenceFrontendCPUSaturated{i or ''}", "03:21:07", REASON)
        for i in range(alerts)
    ]
    s.page = "[warning] Engine front-end thread saturated on demo/reference-0 (2 sent)"
    s.load = "2 req/s offered, 300 sent, 240 done, 0 failed, 60 open"
    return s


def plain(text_lines: list[object]) -> list[str]:
    return [str(line) for line in text_lines]


@pytest.mark.parametrize(("width", "height"), [(80, 24), (100, 30), (160, 48)])
def test_fits_the_terminal(width: int, height: int) -> None:
    out = lines(state(), width, height)
    assert len(out) == height
    assert all(line.cell_len <= width for line in out)
    text = plain(out)
    assert text[0].startswith("inference-bottleneck-exporter demo - injected: frontend-gil")
    assert text[-2].startswith(" last page: [warning] Engine front-end thread saturated")
    assert "q quits" in text[-1]
    for gauge in GAUGES:
        assert any(line.startswith(f" {gauge.label}") for line in text), gauge.label


def test_small_terminal_shortens_and_large_one_shows_more() -> None:
    small = plain(lines(state(), 80, 24))
    large = plain(lines(state(), 160, 48))
    # addresses on one line when small, one per line with their paths when large
    assert any("engine 127.0.0.1:8000 · sidecar 127.0.0.1:10960" in line for line in small)
    assert any(line.startswith(" engine       http://127.0.0.1:8000") for line in large)
    spark_small = next(line for line in small if line.startswith(" GPU util"))
    spark_large = next(line for line in large if line.startswith(" GPU util"))
    assert spark_large.count("█") + spark_large.count("▄") > spark_small.count("█") + (
        spark_small.count("▄")
    )
    # the whole reason fits on the large screen, only its start on the small one
    joined_large = " ".join(line.strip() for line in large)
    assert REASON in joined_large
    assert REASON not in " ".join(line.strip() for line in small)


def test_reasons_wrap_at_word_boundaries() -> None:
    words = set(REASON.split()) | {"…"}
    for width, height in ((80, 24), (160, 48)):
        text = plain(lines(state(alerts=1), width, height))
        reason = [line for line in text if line.startswith(" " * 20) and line.strip()]
        assert reason, text
        for line in reason:
            assert set(line.split()) <= words, line


def test_more_signatures_than_room_are_counted() -> None:
    text = plain(lines(state(alerts=12), 80, 24))
    assert len(text) == 24
    assert any(re.fullmatch(r" … \d+ more", line) for line in text), text


def test_sparkline_scales_and_marks_gaps() -> None:
    assert sparkline([0.0, 0.5, 1.0, None], 4, top=1.0) == f"{BLOCKS[0]}{BLOCKS[4]}{BLOCKS[7]} "
    assert sparkline([1.0], 3, top=1.0) == f"  {BLOCKS[7]}"  # right-aligned: newest at the edge
    assert sparkline([2.0, 4.0], 2) == f"{BLOCKS[4]}{BLOCKS[7]}"  # own maximum
    assert sparkline([5.0] * 10, 4, top=10.0) == BLOCKS[4] * 4


def test_verdict_replaces_the_signatures() -> None:
    s = state()
    s.verdict = [
        "2 hold, 0 nearly hold (23 rules)",
        "1. HOLDS  warning  InferenceFrontendCPUSaturated",
    ]
    text = plain(lines(s, 80, 24))
    assert " diagnose (d):" in text
    assert " 1. HOLDS  warning  InferenceFrontendCPUSaturated" in text
    assert not any(line.startswith(" firing") for line in text)


def test_svg_export_of_the_screen() -> None:
    console = Console(record=True, width=100, height=30, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable(state(), 100, 30))
    svg = console.export_svg(title="make demo INJECT=frontend-gil")
    console.file.close()
    assert svg.startswith("<svg") and "InferenceFrontendCPUSaturated" in svg
