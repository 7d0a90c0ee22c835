"""LMDeploy's ``api_server``: ``lmdeploy:*`` metrics at ``/metrics`` (port 23333).

Source: ``lmdeploy/metrics/loggers.py`` at 0.9.1 (the first release with metrics) and 0.16.0:
prometheus_client, labels ``model_name`` and ``engine`` (the data-parallel rank; with DP above
1 each rank has its own ``api_server`` and ``/metrics``). On by default since late 2025
(``--disable-metrics``), ``--enable-metrics`` before. **No captured scrape exists publicly**:
``tests/fixtures/engines/lmdeploy.txt`` is written from the declarations, and says so.

The mapping is :data:`RULES` below, each source with its note; ``docs/engines.md`` shows
it as a table (``python build-tools/docgen.py``).

Several ``engine`` values of one model are summed (KV usage: the fullest). Tokenize endpoint
``POST /v1/encode`` (``{"input": ..., "add_bos": ...}`` answering ``input_ids`` and
``length``); no version endpoint or series.
"""

from __future__ import annotations

from typing import Any

from exporter.engines.rules import Rule, Source, noted, rule
from exporter.engines.spec import OPENAI_MODELS, EngineSpec, Serving, Tokenize

PREFIX = "lmdeploy:"
MODEL_LABEL = "model_name"


def _s(metric: str) -> Source:
    return Source(metric, model_label=MODEL_LABEL)


def _encode_body(text: str, model: str) -> dict[str, Any]:
    # add_bos as a chat request would; do_preprocess off: the raw text, no chat template.
    return {"input": text, "do_preprocess": False, "add_bos": True}


RULES: tuple[Rule, ...] = (
    rule(
        "inference_queue_depth",
        noted(
            _s("lmdeploy:num_requests_waiting"),
            "the engine's queue; lmdeploy:num_api_requests_waiting, requests waiting for a "
            "request handle in the API server, is a queue before this one and not added",
        ),
    ),
    rule("inference_requests_running", _s("lmdeploy:num_requests_running")),
    rule(
        "inference_kv_cache_usage_ratio",
        noted(_s("lmdeploy:gpu_cache_usage_perc"), 'a ratio: "1 means 100 percent usage"'),
        aggregate="max",
    ),
    rule("inference_prompt_tokens_total", _s("lmdeploy:prompt_tokens_total")),
    rule(
        "inference_prompt_tokens_cached_total",
        noted(_s("lmdeploy:cached_tokens_total"), "later releases"),
    ),
    rule("inference_generation_tokens_total", _s("lmdeploy:generation_tokens_total")),
    rule("inference_time_to_first_token_seconds", _s("lmdeploy:time_to_first_token_seconds")),
    rule(
        "inference_inter_token_latency_seconds",
        noted(_s("lmdeploy:iter_token_latency"), "later releases, per token"),
        noted(_s("lmdeploy:time_per_output_token_seconds"), "a per-request mean"),
    ),
    rule("inference_e2e_request_latency_seconds", _s("lmdeploy:e2e_request_latency_seconds")),
    rule("inference_queue_time_seconds", _s("lmdeploy:request_queue_time_seconds")),
    rule("inference_prefill_time_seconds", _s("lmdeploy:request_prefill_time_seconds")),
    rule("inference_decode_time_seconds", _s("lmdeploy:request_decode_time_seconds")),
)

SPEC = EngineSpec(
    name="lmdeploy",
    title="LMDeploy",
    prefixes=(PREFIX,),
    rules=RULES,
    tokenize=Tokenize(path="/v1/encode", body=_encode_body),
    preallocates_memory=True,
    process="lmdeploy",
    model=OPENAI_MODELS,
    serving=Serving(images=(r"openmmlab/lmdeploy",), port=23333, port_flags=("--server-port",)),
)
