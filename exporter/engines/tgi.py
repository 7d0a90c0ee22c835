"""Text Generation Inference: ``tgi_*`` metrics of the router.

Source: ``router/src/server.rs`` and ``router/src/infer/`` (``metrics::`` calls rendered by the
``metrics-exporter-prometheus`` crate: counters without ``_total``, no ``_created``, duration
histograms with 35 buckets 0.0001 x 1.5^k s, k = 1..35) and
``docs/source/reference/metrics.md``. One model per router, so there is no model label: the
model is ``model_id`` of ``GET /info``.

The mapping is :data:`RULES` below, each source with its note; ``docs/engines.md`` shows
it as a table (``python build-tools/docgen.py``).

The token counters are histogram sums, so they only grow when a request passes validation or
finishes; ``rate()`` works on them as on any counter. TGI has no KV cache usage, TTFT or
per-request prefill/decode histograms (``tgi_batch_*_duration{method}`` time whole batches,
not requests).
"""

from __future__ import annotations

from exporter.engines.rules import Rule, Source, noted, rule
from exporter.engines.spec import EngineSpec, ModelName, Serving, Tokenize, Version

PREFIX = "tgi_"

RULES: tuple[Rule, ...] = (
    rule("inference_queue_depth", Source("tgi_queue_size")),
    rule("inference_requests_running", Source("tgi_batch_current_size")),
    rule(
        "inference_prompt_tokens_total",
        noted(
            Source("tgi_request_input_length_sum"),
            "the sum of the per-request input-length histogram: validated requests",
        ),
    ),
    rule(
        "inference_generation_tokens_total",
        noted(Source("tgi_request_generated_tokens_sum"), "finished requests"),
    ),
    rule(
        "inference_inter_token_latency_seconds",
        noted(
            Source("tgi_request_mean_time_per_token_duration"),
            "one observation per request: its mean time per token",
        ),
    ),
    rule("inference_e2e_request_latency_seconds", Source("tgi_request_duration")),
    rule("inference_queue_time_seconds", Source("tgi_request_queue_duration")),
    rule(
        "inference_tokenizer_latency_seconds",
        noted(
            Source("tgi_request_validation_duration"),
            "a proxy: validation is mostly tokenization, plus parameter checks",
        ),
    ),
)

SPEC = EngineSpec(
    name="tgi",
    title="TGI",
    prefixes=(PREFIX,),
    rules=RULES,
    tokenize=Tokenize(body=lambda text, model: {"inputs": text}),
    preallocates_memory=True,
    process="text-generation-launcher|text-generation-router|text-generation-server",
    model=ModelName("/info", (("model_id",),)),
    version=Version(path="/info"),
    # The image sets PORT=80; the launcher alone defaults to 3000.
    serving=Serving(
        images=(r"text-generation-inference",),
        port=80,
        port_flags=("--port", "-p"),
        port_env=("PORT",),
    ),
)
