"""Roofline: far from what the hardware allows, and where the time goes instead.

Decode steps several times longer than their HBM floor while the bus idles, a GPU "busy" whose
SMs idle, requests whose latency is mostly outside the engine's queue, prefill and decode. The
arithmetic is in the recording rules (:mod:`exporter.signatures.records.roofline_records`)
and ``docs/roofline.md``. Alerts carry ``signature="roofline"``.
"""

from __future__ import annotations

from exporter.signatures.catalogue.context import Context, percent
from exporter.signatures.definitions import TARGET, AlertRule, Evidence, Signature
from exporter.signatures.promql_text import num, on, pct
from exporter.signatures.signals.engine_signals import REQUESTS_RUNNING, TRAFFIC
from exporter.signatures.signals.gpu_signals import GPU_UTILIZATION, HBM_BANDWIDTH, SM_ACTIVE
from exporter.signatures.signals.roofline_signals import (
    BUDGET_DECODE,
    BUDGET_HOST,
    BUDGET_PREFILL,
    BUDGET_QUEUE,
    DECODE_EFFICIENCY,
    DECODE_FLOOR,
    E2E_MEAN,
    INTER_TOKEN_MEAN,
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    ROOFLINE_THROUGHPUT,
)

# The latency budget and decode records are per served model; the GPU records per target.
MODEL = ("model",)
TARGET_ONLY: tuple[str, ...] = ()


def _milliseconds(key: str, label: str, record: str) -> Evidence:
    return Evidence(key, label, f"1000 * {record}{TARGET}", "ms", "%.1f")


def decode_overhead_bound(ctx: Context) -> Signature:
    alert = "InferenceDecodeOverheadBound"
    below = ctx.ratio(alert, "efficiency_below")
    bandwidth = ctx.ratio(alert, "bandwidth_below")
    join = on(ctx.join)
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{ctx.name(DECODE_EFFICIENCY)} < {num(below)}\n"
            f"and {join}\n{ctx.name(REQUESTS_RUNNING)} > 0\n"
            f"and {join}\n{ctx.name(HBM_BANDWIDTH)} < {num(bandwidth)}"
        ),
        for_seconds=ctx.for_seconds(alert),
        summary="Decode steps far above their HBM floor for {labels.model} on {target}",
        description=(
            f"Decode runs at {{eff}} % of its HBM roofline (threshold {pct(below)} %): a step "
            "takes {itl} ms where moving the weights and live KV cache needs {floor} ms, with "
            f"{{running}} requests running and HBM bandwidth at {{bw}} % of peak (below "
            f"{pct(bandwidth)} %): the GPU waits on kernel launches, the scheduler or the host "
            "between steps, not on memory."
        ),
        scope=MODEL,
        evidence=(
            percent("eff", "decode roofline efficiency", ctx.name(DECODE_EFFICIENCY)),
            _milliseconds("itl", "mean inter-token latency", ctx.name(INTER_TOKEN_MEAN)),
            _milliseconds("floor", "HBM floor of a decode step", ctx.name(DECODE_FLOOR)),
            Evidence(
                "running",
                "requests running",
                f"{ctx.name(REQUESTS_RUNNING)}{TARGET}",
                "requests",
                "%.1f",
                scope=TARGET_ONLY,
            ),
            Evidence(
                "bw",
                "HBM bandwidth utilisation",
                f"100 * {ctx.name(HBM_BANDWIDTH)}{TARGET}",
                "%",
                scope=TARGET_ONLY,
            ),
        ),
        when=(
            f"decode roofline efficiency < {pct(below)} % (steps take "
            f"{num(round(1 / below, 1))}x their HBM floor or more) while requests are running "
            f"and measured HBM bandwidth utilisation < {pct(bandwidth)} %"
        ),
    )
    return Signature(
        alert=alert,
        family="roofline",
        title="Decode bound by overhead, not by memory",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                (
                    "generated tokens/s as a share of the roofline's at the current batch",
                    ctx.name(ROOFLINE_THROUGHPUT),
                ),
                ("mean SM activity (small kernels keep it low)", ctx.name(SM_ACTIVE)),
            ),
        ),
    )


def gpu_busy_sms_idle(ctx: Context) -> Signature:
    alert = "InferenceGPUBusySMsIdle"
    util = ctx.ratio(alert, "utilization_above")
    sm_active_below = ctx.ratio(alert, "sm_active_below")
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{ctx.name(GPU_UTILIZATION)} > {num(util)}\n"
            f"and\n{ctx.name(SM_ACTIVE)} < {num(sm_active_below)}\n"
            f"and\n{ctx.name(TRAFFIC)}"
        ),
        for_seconds=ctx.for_seconds(alert),
        summary="GPU busy but its SMs idle on {target}",
        description=(
            f"Mean GPU utilisation {{util}} % (above {pct(util)} %) while the SMs had work "
            f"{{sm}} % of the time (below {pct(sm_active_below)} %), with traffic: GPU-Util "
            "counts any kernel "
            "running, so a stream of tiny serial kernels keeps it near 100 % while most SMs "
            "idle - launch-bound decode, small batches."
        ),
        evidence=(
            percent("util", "mean GPU utilisation", ctx.name(GPU_UTILIZATION)),
            percent("sm", "mean SM activity", ctx.name(SM_ACTIVE)),
        ),
        when=(
            f"mean GPU utilisation > {pct(util)} % while mean SM activity "
            f"< {pct(sm_active_below)} %, with traffic"
        ),
    )
    return Signature(
        alert=alert,
        family="roofline",
        title="GPU-Util high, SMs idle",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("decode roofline efficiency per model", ctx.name(DECODE_EFFICIENCY)),
                ("requests running", ctx.name(REQUESTS_RUNNING)),
            ),
        ),
    )


def host_latency_share_high(ctx: Context) -> Signature:
    alert = "InferenceHostLatencyShareHigh"
    share = ctx.ratio(alert, "host_share_above")
    rule = AlertRule(
        severity="warning",
        expr=f"{ctx.name(BUDGET_HOST)} > {num(share)}\nand {on(ctx.join)}\n{ctx.name(TRAFFIC)}",
        for_seconds=ctx.for_seconds(alert),
        summary="Host-side work takes a large share of request latency for {labels.model} on "
        "{target}",
        description=(
            f"{{host}} % of the end-to-end latency of {{labels.model}} requests ({{e2e}} s on "
            f"average) is outside the engine's queue ({{queue}} %), prefill ({{prefill}} %) and "
            f"decode ({{decode}} %) (threshold {pct(share)} %): tokenization, detokenization, "
            "post-processing and streaming on the host take that time."
        ),
        scope=MODEL,
        evidence=(
            percent(
                "host", "latency share outside queue, prefill and decode", ctx.name(BUDGET_HOST)
            ),
            Evidence(
                "e2e", "mean end-to-end latency", f"{ctx.name(E2E_MEAN)}{TARGET}", "s", "%.2f"
            ),
            percent("queue", "latency share in the queue", ctx.name(BUDGET_QUEUE)),
            percent("prefill", "latency share in prefill", ctx.name(BUDGET_PREFILL)),
            percent("decode", "latency share in decode", ctx.name(BUDGET_DECODE)),
        ),
        when=(
            f"more than {pct(share)} % of end-to-end latency outside queue + prefill + decode "
            "(rates of histogram sums), with traffic"
        ),
    )
    return Signature(
        alert=alert,
        family="roofline",
        title="Host work dominates request latency",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("mean prompt tokens per request", ctx.name(PROMPT_TOKENS)),
                ("mean generated tokens per request", ctx.name(OUTPUT_TOKENS)),
                (
                    "engine front-end CPU, per process (a process near 1 core is saturated)",
                    ctx.rate("inference_engine_process_cpu_seconds_total"),
                ),
            ),
        ),
    )
