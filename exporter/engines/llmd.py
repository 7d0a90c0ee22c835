"""llm-d's endpoint picker (the inference scheduler, later the llm-d router's EPP): its
disaggregation decisions, ``llm_d_epp_disagg_decision_total`` and the names before it.

Source: llm-d/llm-d-router, the ``disagg`` package's ``metrics.go`` (2026): for every
request the picker routes it counts which stages ran, label ``decision_type`` =
``decode-only``, ``prefill-decode``, ``encode-decode`` or ``encode-prefill-decode``, and
``model_name`` (``unknown`` when the request names none: model ``""`` here, as is every
count of the first release, which had no ``model_name``). Each counter is written twice while
its old name is deprecated (dual emission), and two plugins write two counters: the
``disagg-profile-handler`` ``disagg_decision_total`` (all four decisions), the deprecated
``pd-profile-handler`` ``pd_decision_total`` (the first two). The prefix moved from
``llm_d_inference_scheduler_`` (llm-d-inference-scheduler, whose first release had no
``model_name``) to ``llm_d_router_epp_`` and then ``llm_d_epp_``. A rule takes the first
alternative that has series, newest first, so a request is counted once whatever the picker
emits.

The mapping is :data:`RULES` below, each source with its note; ``docs/engines.md`` shows
it as a table (``python build-tools/docgen.py``).

The picker routes; it runs no model. Its endpoint is of layer ``frontend`` (nothing it
exports is counted twice against the engines polled with it) and its ``role`` is what
``--engine.role`` says (``both`` by default). It serves ``/metrics`` on port 9090. Not read:
the picker's pool averages (``*_average_queue_size``, ``*_average_kv_cache_utilization``),
means over pods that the engines' own series give per pod.
"""

from __future__ import annotations

from exporter.engines.rules import LabelMatcher, Rule, Source, rule
from exporter.engines.spec import EngineSpec

#: Newest first.
PREFIXES = ("llm_d_epp_", "llm_d_router_epp_", "llm_d_inference_scheduler_")
MODEL_LABEL = "model_name"
#: ``decision_type`` -> the contract's ``decision``.
DECISIONS = (
    ("prefill-decode", "prefill_decode"),
    ("decode-only", "decode_only"),
    ("encode-decode", "encode_decode"),
    ("encode-prefill-decode", "encode_prefill_decode"),
)


def _decisions(metric: str) -> tuple[Source, ...]:
    """One source per decision of one counter."""
    return tuple(
        Source(
            metric,
            (LabelMatcher("decision_type", "=", theirs),),
            model_label=MODEL_LABEL,
            blank_models=("unknown",),
            fixed=(("decision", ours),),
        )
        for theirs, ours in DECISIONS
    )


RULES: tuple[Rule, ...] = (
    rule(
        "inference_pd_decisions_total",
        *(_decisions(prefix + "disagg_decision_total") for prefix in PREFIXES),
        *(_decisions(prefix + "pd_decision_total") for prefix in PREFIXES),
    ),
)

SPEC = EngineSpec(
    name="llmd-epp",
    title="llm-d endpoint picker",
    prefixes=PREFIXES,
    rules=RULES,
    tokenize=None,
    process=r"(^|/)epp( |$)",
    frontend_prefixes=PREFIXES,
)
