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

# The latency budget and decode records are per served model; the GPU records per target.
MODEL = ("model",)
TARGET_ONLY: tuple[str, ...] = ()


def _milliseconds(key: str, label: str, record: str) -> Evidence:
    return Evidence(key, label, f"1000 * {record}{TARGET}", "ms", "%.1f")


def decode_overhead_bound(ctx: Context) -> Signature:
    alert = "InferenceDecodeOverheadBound"
    records = ctx.records
    below = ctx.ratio(alert, "efficiency_below")
    bandwidth = ctx.ratio(alert, "bandwidth_below")
    join = on(ctx.join)
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{records.decode_efficiency} < {num(below)}\n"
            f"and {join}\n{records.requests_running} > 0\n"
            f"and {join}\n{records.hbm_bandwidth} < {num(bandwidth)}"
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
            percent("eff", "decode roofline efficiency", records.decode_efficiency),
            _milliseconds("itl", "mean inter-token latency", records.inter_token_mean),
            _milliseconds("floor", "HBM floor of a decode step", records.decode_floor),
            Evidence(
                "running",
                "requests running",
                f"{records.requests_running}{TARGET}",
                "requests",
                "%.1f",
                scope=TARGET_ONLY,
            ),
            Evidence(
                "bw",
                "HBM bandwidth utilisation",
                f"100 * {records.hbm_bandwidth}{TARGET}",
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
                    records.roofline_throughput,
                ),
                ("mean SM activity (small kernels keep it low)", records.sm_active),
            ),
        ),
    )


def gpu_busy_sms_idle(ctx: Context) -> Signature:
    alert = "InferenceGPUBusySMsIdle"
    records = ctx.records
    util = ctx.ratio(alert, "utilization_above")
    sm_active_below = ctx.ratio(alert, "sm_active_below")
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{records.gpu_utilization} > {num(util)}\n"
            f"and\n{records.sm_active} < {num(sm_active_below)}\n"
            f"and\n{records.traffic}"
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
            percent("util", "mean GPU utilisation", records.gpu_utilization),
            percent("sm", "mean SM activity", records.sm_active),
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
                ("decode roofline efficiency per model", records.decode_efficiency),
                ("requests running", records.requests_running),
            ),
        ),
    )


def host_latency_share_high(ctx: Context) -> Signature:
    alert = "InferenceHostLatencyShareHigh"
    records = ctx.records
    share = ctx.ratio(alert, "host_share_above")
    rule = AlertRule(
        severity="warning",
        expr=f"{records.budget_host} > {num(share)}\nand {on(ctx.join)}\n{records.traffic}",
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
            percent("host", "latency share outside queue, prefill and decode", records.budget_host),
            Evidence("e2e", "mean end-to-end latency", f"{records.e2e_mean}{TARGET}", "s", "%.2f"),
            percent("queue", "latency share in the queue", records.budget_queue),
            percent("prefill", "latency share in prefill", records.budget_prefill),
            percent("decode", "latency share in decode", records.budget_decode),
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
                ("mean prompt tokens per request", records.prompt_tokens),
                ("mean generated tokens per request", records.output_tokens),
                (
                    "engine front-end CPU, per process (a process near 1 core is saturated)",
                    ctx.rate("inference_engine_process_cpu_seconds_total"),
                ),
            ),
        ),
    )
