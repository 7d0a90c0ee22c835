"""llama.cpp server (``llama-server --metrics``): ``llamacpp:*`` metrics.

Source: the ``/metrics`` handler of ``tools/server/server.cpp`` (``examples/server/server.cpp``
before 2025): plain lines written by hand, every value printed as a C++ double (so counters
above 999999 come out as e.g. ``1.23457e+06``), no labels, no histograms. One model per
server: model ``""``.

=====================================  =======================================================
normalised                             llama.cpp
=====================================  =======================================================
inference_queue_depth                  llamacpp:requests_deferred
inference_requests_running             llamacpp:requests_processing
inference_kv_cache_usage_ratio         llamacpp:kv_cache_usage_ratio (builds before mid-2025;
                                       later builds dropped it and the series is absent)
inference_prompt_tokens_total          llamacpp:prompt_tokens_total +
                                       llamacpp:prompt_tokens_cached_total (2026 builds: the
                                       first no longer counts the tokens reused from the
                                       prompt cache, the second does; both read live)
inference_prompt_tokens_cached_total   llamacpp:prompt_tokens_cached_total
inference_generation_tokens_total      llamacpp:tokens_predicted_total
=====================================  =======================================================

No latency histograms (only cumulative ``prompt_seconds_total`` and
``tokens_predicted_seconds_total``), no tokenizer latency.
"""

from __future__ import annotations

from exporter.engines.rules import Rule, Source, rule
from exporter.engines.snapshot import EngineSpec, Serving, Tokenize, Version

PREFIX = "llamacpp:"

RULES: tuple[Rule, ...] = (
    rule("inference_queue_depth", Source("llamacpp:requests_deferred")),
    rule("inference_requests_running", Source("llamacpp:requests_processing")),
    rule(
        "inference_kv_cache_usage_ratio",
        Source("llamacpp:kv_cache_usage_ratio"),
        aggregate="max",
    ),
    rule(
        "inference_prompt_tokens_total",
        (Source("llamacpp:prompt_tokens_total"), Source("llamacpp:prompt_tokens_cached_total")),
    ),
    rule("inference_prompt_tokens_cached_total", Source("llamacpp:prompt_tokens_cached_total")),
    rule("inference_generation_tokens_total", Source("llamacpp:tokens_predicted_total")),
)

SPEC = EngineSpec(
    name="llamacpp",
    prefixes=(PREFIX,),
    rules=RULES,
    tokenize=Tokenize(body=lambda text, model: {"content": text}),
    process="llama-server",
    version=Version(path="/props", keys=("build_info",)),
    serving=Serving(images=(r"llama\.cpp",), port=8080, port_env=("LLAMA_ARG_PORT",)),
)
