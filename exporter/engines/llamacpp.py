"""llama.cpp server (``llama-server --metrics``): ``llamacpp:*`` metrics.

Source: the ``/metrics`` handler of ``tools/server/server.cpp`` (``examples/server/server.cpp``
before 2025): plain lines written by hand, every value printed as a C++ double (so counters
above 999999 come out as e.g. ``1.23457e+06``), no labels, no histograms. One model per
server, named by ``GET /v1/models`` (the ``--alias``, else the model file's path).

The mapping is :data:`RULES` below, each source with its note; ``docs/engines.md`` shows
it as a table (``python build-tools/docgen.py``).

No latency histograms (only cumulative ``prompt_seconds_total`` and
``tokens_predicted_seconds_total``), no tokenizer latency.
"""

from __future__ import annotations

from exporter.engines.rules import Rule, Source, noted, rule
from exporter.engines.spec import OPENAI_MODELS, EngineSpec, Serving, Tokenize, Version

PREFIX = "llamacpp:"

RULES: tuple[Rule, ...] = (
    rule("inference_queue_depth", Source("llamacpp:requests_deferred")),
    rule("inference_requests_running", Source("llamacpp:requests_processing")),
    rule(
        "inference_kv_cache_usage_ratio",
        noted(
            Source("llamacpp:kv_cache_usage_ratio"),
            "builds before mid-2025; later builds dropped it and the series is absent",
        ),
        aggregate="max",
    ),
    rule(
        "inference_prompt_tokens_total",
        (
            Source("llamacpp:prompt_tokens_total"),
            noted(
                Source("llamacpp:prompt_tokens_cached_total"),
                "2026 builds: the first no longer counts the tokens reused from the prompt "
                "cache, the second does",
            ),
        ),
    ),
    rule("inference_prompt_tokens_cached_total", Source("llamacpp:prompt_tokens_cached_total")),
    rule("inference_generation_tokens_total", Source("llamacpp:tokens_predicted_total")),
)

SPEC = EngineSpec(
    name="llamacpp",
    title="llama.cpp",
    prefixes=(PREFIX,),
    rules=RULES,
    tokenize=Tokenize(body=lambda text, model: {"content": text}),
    process="llama-server",
    model=OPENAI_MODELS,
    version=Version(path="/props", keys=("build_info",)),
    serving=Serving(images=(r"llama\.cpp",), port=8080, port_env=("LLAMA_ARG_PORT",)),
)
