"""The signature catalogue: every alert of the pack, built from a :class:`SiteConfig`.

Each builder turns one rule of thumb of LLM serving into an alert: the condition over the
recording rules (:mod:`exporter.signatures.records`), the evidence it quotes, and the runbook
whose prose lives in ``exporter/signatures/runbooks/<Alert>.md``. Thresholds, windows and
``for`` come from the config through :class:`Context`, never from literals here, so a site's
config regenerates the whole pack. One module per ``signature`` label value (``cpu``,
``network``, ``memory``, ``queue``, ``gpu``, ``roofline``, ``pool``, ``meta``).
``python -m exporter.signatures`` renders the pack; ``diagnose`` evaluates the same expressions
and evidence.
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.signatures.catalogue import (
    cpu_signatures,
    gpu_signatures,
    memory_signatures,
    meta_signatures,
    network_signatures,
    pool_signatures,
    queue_signatures,
    roofline_signatures,
)
from exporter.signatures.catalogue.context import Context
from exporter.signatures.definitions import Signature
from exporter.signatures.site import SiteConfig

# The order of the rule files, the runbook index and the dashboards' rows.
BUILDERS: tuple[Callable[[Context], Signature], ...] = (
    cpu_signatures.gpu_starved_queue_growing,
    cpu_signatures.tokenizer_slower_than_decode,
    cpu_signatures.frontend_cpu_saturated,
    network_signatures.softirq_cpu_high,
    memory_signatures.hbm_bandwidth_saturated,
    memory_signatures.gpu_memory_headroom_low,
    queue_signatures.queue_wait_dominates_latency,
    queue_signatures.engine_stalled,
    queue_signatures.requests_rejected,
    queue_signatures.gateway_stale_endpoints,
    cpu_signatures.gpu_utilization_pulsing,
    gpu_signatures.gpu_underutilized,
    roofline_signatures.decode_overhead_bound,
    roofline_signatures.gpu_busy_sms_idle,
    roofline_signatures.host_latency_share_high,
    pool_signatures.kv_transfer_bound,
    pool_signatures.kv_transfer_failing,
    pool_signatures.prefill_pool_short,
    pool_signatures.decode_pool_short,
    meta_signatures.exporter_down,
    meta_signatures.collector_failing,
    meta_signatures.engine_metrics_down,
    meta_signatures.nvml_unavailable,
    meta_signatures.gpu_attribution_uncertain,
    meta_signatures.gpu_metrics_missing,
    gpu_signatures.gpu_lost,
    gpu_signatures.gpu_xid_errors,
    gpu_signatures.gpu_throttled,
    gpu_signatures.gpu_contended,
    gpu_signatures.interconnect_bound,
)


def builder_path(family: str) -> str:
    """The module that builds the signatures of one ``signature`` label value."""
    return f"exporter/signatures/catalogue/{family}_signatures.py"


def all_signatures(cfg: SiteConfig) -> tuple[Signature, ...]:
    """Every signature of the pack, in the order of :data:`BUILDERS`, each rule behind the
    cold-start guard of the windows it reads (:meth:`Context.guarded`)."""
    ctx = Context(cfg)
    return tuple(ctx.guarded(build(ctx)) for build in BUILDERS)


__all__ = ["BUILDERS", "Context", "all_signatures", "builder_path"]
