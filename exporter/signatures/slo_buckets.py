"""The bucket bounds of each engine's latency histograms, as the sidecar exposes them.

A latency objective (``500ms @ 99%``) counts the requests at or under its threshold from the
cumulative bucket whose upper bound is the threshold: ``le="0.5"``. A threshold between two
bounds has no bucket; interpolating (``histogram_fraction``) guesses how the requests spread
inside the bucket that holds it, and the guess is the error the objective would carry. So the
site config refuses such a threshold (:mod:`.slo_config`), naming the nearest bounds.

The sidecar keeps each engine's own bounds (:class:`~exporter.engines.rules.Source` converts
only units), so the bounds are the engine's. Each set below is the one of the newest captured
scrape of that engine in ``tests/fixtures/engines`` (named in :attr:`EngineBuckets.fixture`),
and ``tests/signatures/test_slo_buckets.py`` normalises that scrape and compares: a release
that changes its buckets is a new capture and a failing test, not a silent mismatch.
Engines without a captured histogram are listed in :data:`NOT_KNOWN` with the reason; an
objective over them names its bounds itself (``buckets:``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

#: The latency objectives, each read from one histogram of the sidecar.
LatencySli = Literal["ttft", "itl", "e2e"]
LATENCY_SLIS: tuple[LatencySli, ...] = ("ttft", "itl", "e2e")
HISTOGRAM: Mapping[LatencySli, str] = {
    "ttft": "inference_time_to_first_token_seconds",
    "itl": "inference_inter_token_latency_seconds",
    "e2e": "inference_e2e_request_latency_seconds",
}
#: What people call each one (error messages, alerts).
SLI_TITLE: Mapping[LatencySli, str] = {
    "ttft": "time to first token",
    "itl": "inter-token latency",
    "e2e": "end-to-end latency",
}

# vLLM V1 (vllm/v1/metrics/loggers.py); TensorRT-LLM's serve metrics copy them.
_VLLM_TTFT = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_VLLM_ITL = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
_VLLM_E2E = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# vLLM V0 (0.4-0.6): the prefix of V1's TTFT and ITL bounds; NIM 1.0 and Ray Serve 2.32 run it.
_V0_TTFT = _VLLM_TTFT[:16]
_V0_ITL = _VLLM_ITL[:13]
_V0_E2E = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


@dataclass(frozen=True)
class EngineBuckets:
    """One engine's latency bucket bounds (seconds, +Inf left out) and where they were seen."""

    engine: str
    #: The captured scrape of ``tests/fixtures/engines`` the bounds are read from.
    fixture: str
    #: The release it shows.
    release: str
    bounds: Mapping[LatencySli, tuple[float, ...]]


# fmt: off
ENGINE_BUCKETS: tuple[EngineBuckets, ...] = (
    EngineBuckets(
        "vllm",
        "dynamo-worker-vllm-2026-01.txt",
        "vLLM V1, 0.13-0.14",
        {"ttft": _VLLM_TTFT, "itl": _VLLM_ITL, "e2e": _VLLM_E2E},
    ),
    EngineBuckets(
        "sglang",
        "dynamo-worker-sglang-2026-01.txt",
        "SGLang 0.5 (defaults of --bucket-time-to-first-token and its siblings)",
        {
            "ttft": (
                0.1,
                0.2,
                0.4,
                0.6,
                0.8,
                1.0,
                2.0,
                4.0,
                6.0,
                8.0,
                10.0,
                20.0,
                40.0,
                60.0,
                80.0,
                100.0,
                200.0,
                400.0,
            ),
            "itl": (
                0.002,
                0.004,
                0.006,
                0.008,
                0.01,
                0.015,
                0.02,
                0.025,
                0.03,
                0.035,
                0.04,
                0.06,
                0.08,
                0.1,
                0.2,
                0.4,
                0.6,
                0.8,
                1.0,
                2.0,
                4.0,
                6.0,
                8.0,
            ),
            "e2e": (
                0.1,
                0.2,
                0.4,
                0.6,
                0.8,
                1.0,
                2.0,
                4.0,
                6.0,
                8.0,
                10.0,
                20.0,
                40.0,
                60.0,
                80.0,
                100.0,
                200.0,
                400.0,
                600.0,
                1200.0,
                1800.0,
                2400.0,
            ),
        },
    ),
    EngineBuckets(
        "trtllm",
        "dynamo-worker-trtllm-2026-01.txt",
        "TensorRT-LLM serve metrics, 2026-01",
        {"ttft": _VLLM_TTFT, "itl": _VLLM_ITL, "e2e": _VLLM_E2E},
    ),
    EngineBuckets(
        "nim",
        "nim-llm-1.0.0-2024-10.txt",
        "NIM for LLMs 1.0.0",
        {"ttft": _V0_TTFT, "itl": _V0_ITL, "e2e": _V0_E2E},
    ),
    EngineBuckets(
        "ray",
        "ray-2.32-vllm-v0-2024-12.txt",
        "Ray Serve LLM 2.32 with vLLM V0 (no end-to-end histogram in the capture)",
        {"ttft": _V0_TTFT, "itl": _V0_ITL},
    ),
    EngineBuckets(
        "dynamo",
        "dynamo-frontend-2026-01.txt",
        "Dynamo frontend, 2026-01 (the latency a client sees; its workers are the engines')",
        {
            "ttft": (
                0.0,
                0.0022,
                0.0047,
                0.01,
                0.022,
                0.047,
                0.1,
                0.22,
                0.47,
                1.0,
                2.2,
                4.7,
                10.0,
                22.0,
                48.0,
                100.0,
                220.0,
                480.0,
            ),
            "itl": (
                0.0,
                0.0019,
                0.0035,
                0.0067,
                0.013,
                0.024,
                0.045,
                0.084,
                0.16,
                0.3,
                0.56,
                1.1,
                2.0,
            ),
            "e2e": (0.0, 1.9, 3.4, 6.3, 12.0, 22.0, 40.0, 75.0, 140.0, 260.0),
        },
    ),
)
# fmt: on

#: Engines whose latency bucket bounds the pack does not know, and why: an objective over
#: them says its bounds itself (``buckets:`` of the objective).
NOT_KNOWN: Mapping[str, str] = {
    "tgi": "no captured scrape (the fixture is hand-written), and its inter-token histogram "
    "holds one mean per request",
    "lmdeploy": "no captured scrape (the fixture is hand-written, its bucket lists shortened)",
    "triton": "its histograms are opt-in (--metrics-config histogram_latencies=true) with "
    "bounds of the site's choosing",
    "llamacpp": "it keeps no latency histograms",
    "llmd-epp": "the gateway's latency is not read (the engines behind it measure the same "
    "requests)",
    "custom": "a custom mapping's histograms have the bounds of the server it maps",
}

_BY_ENGINE = {entry.engine: entry for entry in ENGINE_BUCKETS}


def known_bounds(engine: str, sli: LatencySli) -> tuple[float, ...] | None:
    """The bounds of ``engine``'s histogram of ``sli``, or ``None`` when the pack has none."""
    entry = _BY_ENGINE.get(engine)
    return None if entry is None else entry.bounds.get(sli)


def engines_with(slis: tuple[LatencySli, ...]) -> tuple[str, ...]:
    """The engines whose bounds are known for every one of ``slis``, in table order."""
    return tuple(
        entry.engine for entry in ENGINE_BUCKETS if all(sli in entry.bounds for sli in slis)
    )


def is_bound(value: float, bounds: tuple[float, ...]) -> bool:
    """Whether ``value`` is one of ``bounds`` (to a float's rounding)."""
    return any(math.isclose(value, bound, rel_tol=1e-9, abs_tol=1e-12) for bound in bounds)


def neighbours(value: float, bounds: tuple[float, ...]) -> tuple[float | None, float | None]:
    """The largest bound under ``value`` and the smallest above it (``None`` where none is)."""
    below = [b for b in bounds if b < value]
    above = [b for b in bounds if b > value]
    return (max(below) if below else None, min(above) if above else None)


def le_label(bound: float) -> str:
    """A bound as the sidecar writes its ``le`` label (Go's and prometheus_client's float
    format: ``0.5``, ``1.0``, ``2560.0``; exponents from 1e6, as Go switches to them)."""
    text = repr(float(bound))
    dot = text.find(".")
    if bound > 0 and "e" not in text and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _bound_text(bound: float) -> str:
    """A bound as the site config writes a threshold: ``250ms``, ``2.5s``, ``2560s``."""
    if bound < 1:
        return f"{round(bound * 1000, 3):g}ms"
    return f"{bound:g}s"


def bucket_table() -> str:
    """The bounds of every engine known, as Markdown (``docs/slo.md``, by docgen)."""
    head = " | ".join(SLI_TITLE[sli] for sli in LATENCY_SLIS)
    out = [
        f"| engine | captured from | {head} |",
        "|---|---|" + "---|" * len(LATENCY_SLIS),
    ]
    for entry in ENGINE_BUCKETS:
        cells = [
            ", ".join(_bound_text(b) for b in entry.bounds[sli] if b > 0)
            if sli in entry.bounds
            else "(not captured)"
            for sli in LATENCY_SLIS
        ]
        out.append(
            f"| `{entry.engine}` | `{entry.fixture}` ({entry.release}) | {' | '.join(cells)} |"
        )
    out += ["", "Not known, and why (an objective over them names its `buckets`):", ""]
    out += [f"- `{engine}`: {why}." for engine, why in NOT_KNOWN.items()]
    return "\n".join(out) + "\n"
