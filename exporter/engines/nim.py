"""NVIDIA NIM for LLMs: vLLM-style metrics without a prefix, at ``/v1/metrics``.

Source: NVIDIA's "Observability for NVIDIA NIM for LLMs" page (the table of metric names) and
a captured scrape of NIM 1.0.0 (``tests/fixtures/engines/nim-llm-1.0.0-2024-10.txt``; label
``model_name``). NIM runs its own build of vLLM's server (``vllm_nvext``, later
``nim_llm_sdk``) and drops vLLM's ``vllm:`` prefix.

The mapping is :data:`RULES` below, each source with its note; ``docs/engines.md`` shows
it as a table (``python build-tools/docgen.py``).

Recognising NIM: unprefixed names are common, so NIM is recognised only after every prefixed
engine, and only by ``num_request_max`` (a NIM-only gauge) or by the three gauges
``num_requests_running``, ``num_requests_waiting`` and ``gpu_cache_usage_perc`` together; an
exposition with only some unprefixed latency histograms (early ``trtllm-serve``, or anything
else) is not NIM. No queue, prefill or decode time, KV capacity or tokenize endpoint in NIM
1.0; the version comes from ``GET /v1/version`` (``release``).
"""

from __future__ import annotations

from exporter.engines.rules import Rule, Source, noted, rule
from exporter.engines.spec import OPENAI_MODELS, EngineSpec, Serving, Version

MODEL_LABEL = "model_name"


def _s(metric: str) -> Source:
    return Source(metric, model_label=MODEL_LABEL)


RULES: tuple[Rule, ...] = (
    rule("inference_queue_depth", _s("num_requests_waiting")),
    rule("inference_requests_running", _s("num_requests_running")),
    rule(
        "inference_kv_cache_usage_ratio",
        noted(_s("gpu_cache_usage_perc"), "a ratio despite the name"),
        aggregate="max",
    ),
    rule("inference_prompt_tokens_total", _s("prompt_tokens_total")),
    rule("inference_generation_tokens_total", _s("generation_tokens_total")),
    rule("inference_time_to_first_token_seconds", _s("time_to_first_token_seconds")),
    rule(
        "inference_inter_token_latency_seconds",
        noted(
            _s("time_per_output_token_seconds"),
            "one observation per generated token, as vLLM's V0 engine",
        ),
    ),
    rule("inference_e2e_request_latency_seconds", _s("e2e_request_latency_seconds")),
)

SPEC = EngineSpec(
    name="nim",
    title="NVIDIA NIM",
    prefixes=(),
    rules=RULES,
    tokenize=None,
    preallocates_memory=True,
    process="vllm_nvext|nim_llm_sdk",
    metrics_path="/v1/metrics",
    signatures=(
        frozenset({"num_request_max"}),
        frozenset({"num_requests_running", "num_requests_waiting", "gpu_cache_usage_perc"}),
    ),
    model=OPENAI_MODELS,
    version=Version(path="/v1/version", keys=("release",)),
    serving=Serving(
        images=(r"(^|/)nim/",), port=8000, port_flags=(), port_env=("NIM_SERVER_PORT",)
    ),
)
