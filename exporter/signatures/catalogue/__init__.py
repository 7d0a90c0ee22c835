"""The signature catalogue: every alert of the pack, built from a :class:`SiteConfig`.

Each builder turns one rule of thumb of LLM serving into an alert: the condition over the
recording rules (:mod:`exporter.signatures.sources`), the evidence it quotes, and the runbook
whose prose lives in ``exporter/signatures/runbooks/<Alert>.md``. Thresholds, windows and
``for`` come from the config through :class:`Context`, never from literals here, so a site's
config regenerates the whole pack. One module per ``signature`` label value (``cpu``,
``network``, ``memory``, ``queue``, ``gpu``, ``roofline``, ``meta``).
``python -m exporter.signatures`` renders the pack; ``diagnose`` evaluates the same expressions
and evidence.
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.signatures.catalogue import cpu, gpu, memory, meta, network, queue, roofline
from exporter.signatures.catalogue.context import Context
from exporter.signatures.config import SiteConfig
from exporter.signatures.model import Signature

# The order of the rule files, the runbook index and the dashboards' rows.
BUILDERS: tuple[Callable[[Context], Signature], ...] = (
    cpu.gpu_starved_queue_growing,
    cpu.tokenizer_slower_than_decode,
    cpu.frontend_cpu_saturated,
    network.softirq_cpu_high,
    memory.hbm_bandwidth_saturated,
    memory.gpu_memory_headroom_low,
    queue.queue_wait_dominates_latency,
    cpu.gpu_utilization_pulsing,
    gpu.gpu_underutilized,
    roofline.decode_overhead_bound,
    roofline.gpu_busy_sms_idle,
    roofline.host_latency_share_high,
    meta.exporter_down,
    meta.collector_failing,
    meta.engine_metrics_down,
    meta.nvml_unavailable,
    gpu.gpu_lost,
    gpu.gpu_xid_errors,
    gpu.gpu_throttled,
    gpu.gpu_contended,
)


def builder_path(group: str) -> str:
    """The module that builds the signatures of one ``signature`` label value."""
    return f"exporter/signatures/catalogue/{group}.py"


def catalogue(cfg: SiteConfig) -> tuple[Signature, ...]:
    """Every signature of the pack, in the order of :data:`BUILDERS`, each rule behind the
    cold-start guard of the windows it reads (:meth:`Context.guarded`)."""
    ctx = Context(cfg)
    return tuple(ctx.guarded(build(ctx)) for build in BUILDERS)


__all__ = ["BUILDERS", "Context", "builder_path", "catalogue"]
