"""``inference-bottleneck-exporter diagnose`` through the real CLI.

``--target``: the real sidecar (bundled replay trace) in front of a fake engine whose
tokenizer is slow (per-token latency) or fast, with inter-token latencies of 20 ms in its
vLLM histogram. ``--prometheus.url``: a real Prometheus scraping that sidecar with the
``fast`` rule pack. Exit codes, the JSON document and one-line errors.
"""

from __future__ import annotations

import ast
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fakeengine import FakeEngine, FakeEngineThread, unused_port
from support.paths import FIXTURES, ROOT
from support.process import ExporterProcess
from support.promstack import (
    MODEL,
    Budget,
    Feeder,
    Load,
    Stack,
    address,
    query,
    sidecar,
    start_prometheus,
    wait_until,
)

from exporter.diagnose.datasources import scrape_samples
from exporter.diagnose.findings import Condition, Finding, Instance
from exporter.signatures import all_signatures, parse_config
from exporter.signatures.__main__ import profile_files
from exporter.signatures.render import runbook_url

PROG = "inference-bottleneck-exporter diagnose"
TOKENIZER = "InferenceTokenizerSlowerThanDecode"
# The probe prompt is ~385 words for the fake tokenizer: 38.5 ms at 100 us per token, in the
# histogram's 25-50 ms bucket (median 37.5 ms), against inter-token latencies of 20 ms
# (10-25 ms bucket, median 17.5 ms).
HOT = 0.0001
COOL = 0.00001


def diagnose(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", "diagnose", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


@pytest.fixture
def engine_with(request: pytest.FixtureRequest) -> Iterator[Callable[..., FakeEngineThread]]:
    stack = Stack()

    def start(per_token_latency: float, load: Load | None = None) -> FakeEngineThread:
        engine = FakeEngine.run_in_thread(per_token_latency=per_token_latency)
        stack.add(engine.stop)
        feeder = Feeder([(engine, load or Load())])
        stack.add(feeder.stop)
        return engine

    try:
        yield start
    finally:
        stack.close()


def warm(proc: ExporterProcess) -> None:
    """Until the sidecar has tokenizer probes and engine histograms to rate."""
    proc.wait_for(
        lambda: (
            "inference_tokenizer_latency_seconds_count" in proc.get("/metrics")[2].decode()
            and "inference_inter_token_latency_seconds_count" in proc.get("/metrics")[2].decode()
        ),
        timeout=15,
    )


def sample(proc: ExporterProcess, *extra: str) -> subprocess.CompletedProcess[str]:
    return diagnose("--target", proc.base, "--duration", "4s", "--interval", "1s", *extra)


# --- --target ---------------------------------------------------------------------------------


def test_target_hot_tokenizer_ranked_first(
    exporter_process: Callable[..., ExporterProcess],
    engine_with: Callable[..., FakeEngineThread],
) -> None:
    proc = sidecar(exporter_process, engine_with(HOT))
    warm(proc)
    result = sample(proc)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == (
        f"diagnose {proc.base}/metrics, 5 samples over 4s (every window is the sampling span); "
        "profile sidecar"
    )
    first = next(line for line in lines if line.startswith("1. "))
    assert re.fullmatch(rf"1\. HOLDS  warning  {TOKENIZER} \[cpu\]", first), first
    text = result.stdout
    assert re.search(
        r"evidence: median tokenizer latency (\d+\.\d) ms; median inter-token latency 17\.5 ms",
        text,
    )
    tok = float(re.search(r"median tokenizer latency (\d+\.\d) ms", text)[1])  # type: ignore[index]
    assert 25 < tok < 50
    assert f"Tokenizer slower than a decode step on {proc.base}/metrics" in text
    assert (
        "fires after holding for 15m; runbook: " + runbook_url(parse_config({}), TOKENIZER) in text
    )
    assert "InferenceHBMBandwidthSaturated: needs Prometheus history (offset 1h)" in text


def test_target_healthy_exits_0(
    exporter_process: Callable[..., ExporterProcess],
    engine_with: Callable[..., FakeEngineThread],
) -> None:
    proc = sidecar(exporter_process, engine_with(COOL))
    warm(proc)
    result = sample(proc)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 signature instance(s) hold, 0 nearly hold" in result.stdout
    assert "No signature holds or nearly holds." in result.stdout


def test_target_nearly_holds_and_json_schema(
    exporter_process: Callable[..., ExporterProcess],
    engine_with: Callable[..., FakeEngineThread],
) -> None:
    # Inter-token latency 40 ms: the same histogram bucket as the tokenizer's 38.5 ms, so
    # both medians are 37.5 ms: the tokenizer is not slower (no '>'), but within 10 %.
    proc = sidecar(exporter_process, engine_with(HOT, Load(itl=0.04)))
    warm(proc)
    result = sample(proc, "--output", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    assert set(report) == {
        "mode",
        "source",
        "profile",
        "evaluated_at",
        "nearly_within",
        "verdict",
        "holds",
        "nearly",
        "checked_rules",
        "findings",
        "not_evaluated",
        "no_data",
        "missing_inputs",
        "roofline",
        "pools",
        "scaling_advice",
        "samples",
        "span_seconds",
    }
    assert report["mode"] == "target" and report["source"] == proc.base + "/metrics"
    assert report["pools"] == []  # one colocated engine: no budget per pool
    assert report["scaling_advice"] == []  # nothing holds: nothing to advise
    assert report["verdict"] == "none" and report["holds"] == 0 and report["nearly"] == 1
    assert report["samples"] == 5 and 3.5 < report["span_seconds"] < 5
    assert report["nearly_within"] == 0.1 and report["profile"] == "sidecar"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", report["evaluated_at"])
    (finding,) = report["findings"]
    assert finding["rank"] == 1 and finding["alert"] == TOKENIZER
    assert finding["status"] == "nearly" and finding["severity"] == "warning"
    assert finding["signature"] == "cpu" and finding["for"] == "15m"
    assert finding["target"] == proc.base + "/metrics" and finding["labels"] == {}
    assert finding["alert_state"] is None
    assert finding["runbook_url"] == runbook_url(parse_config({}), TOKENIZER)
    assert [e["key"] for e in finding["evidence"]] == ["tok", "itl"]
    assert finding["evidence"][0]["value"] == pytest.approx(37.5)
    assert finding["evidence"][0]["text"] == "37.5" and finding["evidence"][0]["unit"] == "ms"
    comparison, traffic, guard = finding["conditions"]
    assert comparison["op"] == ">" and comparison["holds"] is False and comparison["nearly"]
    assert comparison["value"] == pytest.approx(0.0375)
    assert comparison["threshold"] == pytest.approx(0.0375)
    assert comparison["relative_gap"] == pytest.approx(0.0)
    assert comparison["threshold_expr"] == "inference:inter_token_latency_seconds:median5m"
    assert traffic == {
        "expr": "inference:traffic:active",
        "op": None,
        "value": 1.0,
        "threshold": None,
        "threshold_expr": None,
        "holds": True,
        "nearly": False,
        "relative_gap": None,
    }
    # the cold-start guard: sampled from the sidecar, its window is the span sampled
    assert guard["expr"] == "inference:exporter_build_info:history5m" and guard["holds"] is True
    assert "Median tokenizer latency 37.5 ms" in finding["description"]
    assert {
        "alert": "InferenceHBMBandwidthSaturated",
        "reason": "needs Prometheus history (offset 1h)",
    } in report["not_evaluated"]
    assert "InferenceQueueWaitDominatesLatency" in report["no_data"]
    # no model facts and no request histograms: nothing to set against the roofline, but the
    # GPUs' energy over the tokens generated (all of it: no phase times to split it by)
    (row,) = report["roofline"]
    assert row["decode"]["efficiency"] is None and row["latency_budget"]["e2e_seconds"] is None
    assert row["energy"]["joules_per_generated_token"] > 0
    assert row["energy"]["joules_per_prompt_token"] is None
    # the threshold of "nearly" is a flag
    strict = sample(proc, "--output", "json", "--nearly", "0")
    assert json.loads(strict.stdout)["findings"] == []


# --- roofline and latency budget --------------------------------------------------------------

MODEL_DIR = FIXTURES / "models" / "meta-llama__Llama-3.1-8B"
# Steps of 45 ms for 3 running requests; 2 requests a second of 6 s each: 1 % queue, 5 %
# prefill, 50 % decode, so 44 % on the host; 3000-token prompts, a fifth of them cached.
SLOW_STEPS = Load(itl=0.045, tokens_per_second=3 / 0.045, budget=Budget())
BUDGET_LINE = "of 6.0 s end to end: queue 1 %, prefill 5 %, decode 50 %, host 44 %"


def _share_masked(summary: str) -> str:
    """A roofline summary with its communication share (a sampled NVLink rate) as ``N``."""
    share = r"at least \d+ % of a step \(NVLink of its (\d+) GPUs at \d+ %"
    masked = re.sub(share, r"at least N % of a step (NVLink of its \1 GPUs at N %", summary)
    assert masked != summary, summary
    return masked


def expected_floor(proc: ExporterProcess) -> float:
    """The decode floor from the sidecar's own figures: (weights + 0.6 x KV pool) / peak."""
    samples = scrape_samples(proc.get("/metrics")[2].decode())

    def one(name: str) -> float:
        values = {v for k, v in samples.items() if dict(k)["__name__"] == name}
        assert len(values) == 1, (name, values)
        return values.pop()

    kv = 0.6 * one("inference_kv_cache_capacity_tokens")
    kv *= one("inference_model_kv_cache_bytes_per_token")
    peak = one("inference_gpu_peak_memory_bandwidth_bytes_per_second")
    return (one("inference_model_weight_bytes") + kv) / peak


def roofline_sidecar(
    exporter_process: Callable[..., ExporterProcess],
    engine_with: Callable[..., FakeEngineThread],
) -> ExporterProcess:
    proc = sidecar(exporter_process, engine_with(COOL, SLOW_STEPS), "--model.path", str(MODEL_DIR))
    proc.wait_for(
        lambda: all(
            name in proc.get("/metrics")[2].decode()
            for name in (
                "inference_model_weight_bytes",
                "inference_kv_cache_capacity_tokens",
                "inference_decode_time_seconds_count",
            )
        ),
        timeout=15,
    )
    return proc


def test_target_prints_the_roofline_and_the_latency_budget(
    exporter_process: Callable[..., ExporterProcess],
    engine_with: Callable[..., FakeEngineThread],
) -> None:
    proc = roofline_sidecar(exporter_process, engine_with)
    floor = expected_floor(proc)
    efficiency = floor / 0.045
    assert 0.1 < efficiency < 0.33  # an 8B model's floor on the replayed H100: ~9 ms

    text = sample(proc)
    assert text.stderr == ""
    lines = text.stdout.splitlines()
    at = lines.index("Roofline and latency budget:")
    assert lines[at + 1] == f"  {proc.base}/metrics {MODEL}"
    # the replayed HGX pair's NVLink carries 15 % of its peak times each GPU's utilisation
    summary = re.fullmatch(
        re.escape(
            f"    decode at {100 * efficiency:.0f} % of its HBM floor ({1000 * floor:.1f} ms "
            f"floor, 45.0 ms observed); {BUDGET_LINE}; communication at least "
        )
        + r"(\d+) % of a step \(NVLink of its 2 GPUs at \1 % of its peak\)",
        lines[at + 2],
    )
    assert summary, lines[at + 2]
    assert 1 <= int(summary[1]) <= 15
    # 3 requests per 45 ms step: 67 tokens/s, the roofline's share as the efficiency's
    throughput = re.fullmatch(
        r"    throughput: (\d+) tokens/s, (\d+) % of the (\d+) tokens/s its batch would reach "
        r"with every step at the floor",
        lines[at + 3],
    )
    assert throughput, lines[at + 3]
    # the roofline's tokens/s come from gauges (exact); the generated ones are a rate over the
    # few seconds sampled of a page rewritten every 200 ms (close, on a busy machine not exact)
    assert int(throughput[3]) == round(3 / floor)
    assert abs(int(throughput[1]) - int(throughput[2]) / 100 * int(throughput[3])) <= 2
    assert 0.75 < int(throughput[1]) / (3 / 0.045) < 1.25
    assert lines[at + 4].startswith("    prefill at ")
    assert lines[at + 5].startswith(
        "    workload: 3000 prompt and 33 output tokens per request, prefill 9 % and decode 91 % "
        "of the engine's time; long prompts (> 2048 tokens): this pod is prefill-bound"
    )
    # the replayed GPUs' energy counters over the engine's tokens, split by its phase times
    energy = re.fullmatch(
        r"    energy: ([\d.e+-]+) J per generated token, ([\d.e+-]+) J per prompt token "
        r"\((\d+) W over 2 GPUs, (\d+) % of the energy idle\)",
        lines[at + 6],
    )
    assert energy, lines[at + 6]
    assert float(energy[1]) > 0 and float(energy[2]) > 0 and 0 < int(energy[3]) <= 1400
    # the budget's host share is a signature of its own, and holds
    assert re.search(
        r"^1\. HOLDS  warning  InferenceHostLatencyShareHigh \[roofline\]$", text.stdout, re.M
    )

    report = json.loads(sample(proc, "--output", "json").stdout)
    (entry,) = report["roofline"]
    assert entry["target"] == f"{proc.base}/metrics" and entry["labels"] == {"model": MODEL}
    # the text and the JSON are two samplings of the replay: the NVLink share may move by a point
    assert _share_masked(entry["summary"]) == _share_masked(lines[at + 2].strip())
    decode = entry["decode"]
    assert decode["source"] == "floor"
    assert decode["floor_seconds"] == pytest.approx(floor, rel=1e-9)
    assert decode["observed_seconds"] == pytest.approx(0.045, rel=1e-3)
    assert decode["efficiency"] == pytest.approx(efficiency, rel=1e-3)
    budget = entry["latency_budget"]
    assert budget["e2e_seconds"] == pytest.approx(6.0, rel=1e-3)
    for part, share in (("queue", 0.01), ("prefill", 0.05), ("decode", 0.5), ("host", 0.44)):
        assert budget[part] == pytest.approx(share, abs=1e-3), part
    # FLOPs of the 2400 computed prompt tokens of each of 2 requests a second per 0.6 s of
    # prefill a second, against the replayed H100's bf16 peak
    samples = scrape_samples(proc.get("/metrics")[2].decode())
    flops = next(
        v for k, v in samples.items() if dict(k)["__name__"] == "inference_model_flops_per_token"
    )
    peak = min(
        v
        for k, v in samples.items()
        if dict(k)["__name__"] == "inference_gpu_peak_flops" and dict(k)["precision"] == "bf16"
    )
    assert entry["prefill_efficiency"] == pytest.approx(flops * 4800 / 0.6 / peak, rel=1e-3)
    workload = entry["workload"]
    assert workload["prompt_tokens"] == pytest.approx(3000, rel=1e-3)
    assert workload["prefill_time_share"] == pytest.approx(0.05 / 0.55, rel=1e-3)
    assert workload["advice"].startswith("long prompts (> 2048 tokens)")
    tokens = entry["throughput"]
    # a rate over the seconds sampled of a page rewritten every 200 ms: close; ratios of two
    # counters of one page (the shares, the means) are exact
    assert tokens["tokens_per_second"] == pytest.approx(3 / 0.045, rel=0.25)
    assert tokens["tokens_per_second"] == pytest.approx(
        tokens["share"] * tokens["roofline_tokens_per_second"], rel=1e-9
    )
    assert tokens["roofline_tokens_per_second"] == pytest.approx(3 / floor, rel=1e-3)
    joules = entry["energy"]
    # prefill 0.05 and decode 0.5 of each request's time: a tenth of the energy to prompts
    prompt_energy = joules["joules_per_prompt_token"] * 4800  # 2 x 2400 tokens computed a second
    generated_energy = joules["joules_per_generated_token"] * tokens["tokens_per_second"]
    assert prompt_energy / (prompt_energy + generated_energy) == pytest.approx(0.05 / 0.55, rel=0.3)
    assert joules["cost_per_million_generated_tokens"] is None  # no price: no cost
    links = entry["interconnect"]
    assert links["gpus"] == 2
    assert links["communication_share_at_least"] == links["nvlink_utilization"]
    assert 0.01 <= links["nvlink_utilization"] <= 0.15


# --- errors -----------------------------------------------------------------------------------


def _one_line_error(result: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{PROG}: error: "), lines[0]
    for part in parts:
        assert part in lines[0], lines[0]


def test_unreachable_target_and_prometheus_exit_2() -> None:
    port = unused_port()
    _one_line_error(
        diagnose("--target", f"http://127.0.0.1:{port}/metrics", "--duration", "1s"),
        f"cannot read http://127.0.0.1:{port}/metrics",
    )
    _one_line_error(
        diagnose("--prometheus.url", f"http://127.0.0.1:{port}"),
        f"cannot query http://127.0.0.1:{port}/api/v1/query",
    )


def test_target_that_is_not_the_sidecar_exits_2(
    engine_with: Callable[..., FakeEngineThread],
) -> None:
    engine = engine_with(COOL)
    _one_line_error(
        diagnose("--target", engine.url + "/metrics", "--duration", "1s"),
        "is not an inference-bottleneck-exporter /metrics page",
    )


@pytest.mark.parametrize(
    ("args", "part"),
    [
        ((), "one of the arguments --prometheus.url --target is required"),
        (("--target", "http://a", "--prometheus.url", "http://b"), "not allowed with"),
        (("--target", "ftp://example.org/metrics"), "is not an http(s) URL"),
        (("--prometheus.url", "localhost:9090"), "is not an http(s) URL"),
        (("--target", "http://127.0.0.1:1", "--duration", "soon"), "--duration: 'soon'"),
        (("--target", "http://127.0.0.1:1", "--interval", "0s"), "--interval: must be longer"),
        (("--target", "http://127.0.0.1:1", "--nearly", "1.5"), "--nearly"),
        (("--target", "http://127.0.0.1:1", "--profile", "dcgm"), "needs --prometheus.url"),
        (("--target", "http://127.0.0.1:1", "--output", "yaml"), "invalid choice"),
    ],
)
def test_usage_errors_exit_2_in_one_line(args: tuple[str, ...], part: str) -> None:
    _one_line_error(diagnose(*args), part)


def test_config_errors_exit_2_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "site.yaml"
    bad.write_text(
        "signatures:\n  InferenceTokenizerSlowerThanDecode:\n    decode_step_factor: 0\n"
    )
    _one_line_error(
        diagnose("--target", "http://127.0.0.1:1", "--config", str(bad)),
        "signatures.InferenceTokenizerSlowerThanDecode.decode_step_factor: must be more than 0",
    )
    _one_line_error(
        diagnose("--target", "http://127.0.0.1:1", "--config", str(tmp_path / "missing.yaml")),
        "missing.yaml: cannot read",
    )


def test_site_config_thresholds_apply(
    tmp_path: Path,
    exporter_process: Callable[..., ExporterProcess],
    engine_with: Callable[..., FakeEngineThread],
) -> None:
    """The same thresholds as the rules: a tokenizer must be 3x a decode step at this site."""
    site = tmp_path / "site.yaml"
    site.write_text(
        "signatures:\n  InferenceTokenizerSlowerThanDecode:\n    decode_step_factor: 3\n"
    )
    proc = sidecar(exporter_process, engine_with(HOT))
    warm(proc)
    result = sample(proc, "--config", str(site), "--output", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["findings"] == []


# --- --prometheus.url -------------------------------------------------------------------------

# The fast profile with its rate and latency windows at 10 s (100 s before the profile's 1/10
# scale), generated as a site would: what diagnose reads from Prometheus is under test, not the
# shipped windows, and the cold-start guard then takes 10 s of real time instead of 30 s.
SITE = {"windows": {"rate": "100s", "latency": "100s"}}


@pytest.fixture
def site_pack(tmp_path: Path) -> tuple[Path, list[Path]]:
    """:data:`SITE` as a file for diagnose's ``--config``, and its fast rule files."""
    config = tmp_path / "site.yaml"
    config.write_text(json.dumps(SITE), encoding="utf-8")  # JSON is YAML
    files = profile_files(parse_config(SITE, "fast"), tmp_path / "rules")
    (tmp_path / "rules").mkdir()
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    return config, sorted(files)


@pytest.mark.timeout(90)
def test_prometheus_mode(
    tmp_path: Path,
    exporter_process: Callable[..., ExporterProcess],
    engine_with: Callable[..., FakeEngineThread],
    site_pack: tuple[Path, list[Path]],
) -> None:
    site, rules = site_pack
    proc = sidecar(exporter_process, engine_with(HOT))
    target = address(proc)
    stack = Stack()
    try:
        bare = start_prometheus(tmp_path / "bare", [target], [])
        stack.add(bare.stop)
        prometheus = start_prometheus(tmp_path / "pack", [target], rules)
        stack.add(prometheus.stop)
        # latency windows of this pack are 10s: two scrapes with probes in between do; the
        # alert goes pending once the target has 10s of history (the cold-start guard)
        wait_until(
            lambda: (
                bool(query(prometheus, "inference:tokenizer_latency_seconds:median10s"))
                and bool(query(prometheus, "inference:inter_token_latency_seconds:median10s"))
                and bool(query(prometheus, f'ALERTS{{alertname="{TOKENIZER}"}}'))
                and bool(query(bare, "inference_exporter_build_info"))
            ),
            75,
            "tokenizer and decode medians in Prometheus, the alert pending",
        )
        fast = ("--prometheus.url", prometheus.url, "--config", str(site), "--profile", "fast")
        result = diagnose(*fast, "--output", "json")
        assert result.returncode == 1, result.stdout + result.stderr
        report = json.loads(result.stdout)
        assert report["mode"] == "prometheus" and report["source"] == prometheus.url
        assert "samples" not in report and report["verdict"] == "found"
        first = report["findings"][0]
        assert first["alert"] == TOKENIZER and first["status"] == "holds"
        assert first["target"] == target
        assert first["labels"] == {"instance": target, "job": "inference-bottleneck-exporter"}
        # the alerting rules are loaded too: the alert waits out its 1m30s 'for'
        assert first["alert_state"] == "pending"
        tok, itl = (e["value"] for e in first["evidence"])
        assert 25 < tok < 50 and itl == pytest.approx(17.5)
        assert first["summary"] == f"Tokenizer slower than a decode step on {target}"
        # the HBM comparison is evaluated here (Prometheus has the history, 6m in 'fast')
        assert all(n["alert"] != "InferenceHBMBandwidthSaturated" for n in report["not_evaluated"])

        text = diagnose(*fast)
        assert text.returncode == 1
        assert re.search(
            rf"^1\. HOLDS  warning  {TOKENIZER} \[cpu\], alert pending$", text.stdout, re.M
        )

        _one_line_error(
            diagnose("--prometheus.url", prometheus.url),
            "holds recording rules of another profile or site config",
            "--profile",
        )
        _one_line_error(
            diagnose("--prometheus.url", bare.url),
            "scrapes 1 sidecar(s) but has none of the pack's recording rules",
        )
    finally:
        stack.close()


@pytest.mark.timeout(90)
def test_prometheus_mode_prints_the_roofline_and_the_latency_budget(
    tmp_path: Path,
    exporter_process: Callable[..., ExporterProcess],
    engine_with: Callable[..., FakeEngineThread],
    site_pack: tuple[Path, list[Path]],
) -> None:
    site, rules = site_pack
    proc = roofline_sidecar(exporter_process, engine_with)
    floor = expected_floor(proc)
    target = address(proc)
    stack = Stack()
    try:
        prometheus = start_prometheus(tmp_path / "pack", [target], rules)
        stack.add(prometheus.stop)
        # Records over a full 10 s window: over the first scrapes the engine's token count
        # (printed to 0.1) grows by tens per scrape, and its rounding alone moves the mean
        # inter-token latency by 0.1 %.
        wait_until(
            lambda: (
                bool(query(prometheus, "inference:exporter_build_info:history10s"))
                and bool(query(prometheus, "inference:decode_roofline_efficiency:ratio10s"))
                and bool(query(prometheus, "inference:latency_budget_host:ratio10s"))
            ),
            75,
            "the roofline and latency budget records in Prometheus over a full window",
        )
        fast = ("--prometheus.url", prometheus.url, "--config", str(site), "--profile", "fast")
        result = diagnose(*fast, "--output", "json")
        report = json.loads(result.stdout)
        (entry,) = report["roofline"]
        assert entry["target"] == target
        assert entry["labels"] == {
            "instance": target,
            "job": "inference-bottleneck-exporter",
            "model": MODEL,
        }
        assert entry["decode"]["floor_seconds"] == pytest.approx(floor, rel=1e-9)
        assert entry["decode"]["efficiency"] == pytest.approx(floor / 0.045, rel=1e-3)
        # the target's figures (its GPUs, their NVLink) join each model's row by its labels
        assert f"{BUDGET_LINE}; communication at least " in entry["summary"]
        assert entry["interconnect"]["gpus"] == 2

        text = diagnose(*fast)
        lines = text.stdout.splitlines()
        at = lines.index("Roofline and latency budget:")
        assert lines[at + 1] == f"  {target} {MODEL}"
        assert _share_masked(lines[at + 2]) == _share_masked(f"    {entry['summary']}")
        assert lines[at + 2].startswith(
            f"    decode at {100 * floor / 0.045:.0f} % of its HBM floor ({1000 * floor:.1f} ms "
            "floor, 45.0 ms observed); "
        )
    finally:
        stack.close()


def test_diagnose_is_a_subcommand() -> None:
    result = diagnose("--help")
    assert result.returncode == 0
    assert result.stdout.startswith(f"usage: {PROG} ")
    for flag in ("--prometheus.url", "--target", "--duration", "--config", "--output"):
        assert flag in result.stdout


def test_scrape_samples_keep_what_prometheus_stores() -> None:
    """NaN and infinities are samples too (Prometheus stores them); ``_created`` is not, nor
    is a label whose value is empty (the llm-d picker's engine info has ``version=""``)."""
    text = (
        '# TYPE g gauge\ng{a="1"} NaN\ng{a="2"} +Inf\n'
        "# TYPE c counter\nc_total 3\nc_created 1.7e9\n"
        '# TYPE i gauge\ni{engine="llmd-epp",version=""} 1\n'
    )
    samples = scrape_samples(text)
    assert set(samples) == {
        (("__name__", "g"), ("a", "1")),
        (("__name__", "g"), ("a", "2")),
        (("__name__", "c_total"),),
        (("__name__", "i"), ("engine", "llmd-epp")),
    }
    assert math.isnan(samples[(("__name__", "g"), ("a", "1"))])
    assert samples[(("__name__", "g"), ("a", "2"))] == math.inf
    with pytest.raises(ValueError, match="malformed exposition"):
        scrape_samples("not an exposition {\n")


def test_a_cause_ranks_above_where_the_time_goes() -> None:
    """At equal severity a cause (a saturated front-end thread, just over its threshold and
    pending) ranks above a roofline measure (the host's share of latency, far over and
    firing): the measure says where the time goes, the cause why."""
    sigs = {sig.alert: sig for sig in all_signatures(parse_config({}))}

    def finding(alert: str, gap: float, state: str) -> Finding:
        sig = sigs[alert]
        cond = Condition("x", ">", 1.0 + gap, 1.0, holds=True, gap=gap)
        instance = Instance((), holds=True, nearly=False, value=1.0, conditions=[cond])
        return Finding(sig, sig.rules[0], instance, "t", [], state=state)

    host = finding("InferenceHostLatencyShareHigh", 2.9, "firing")
    frontend = finding("InferenceFrontendCPUSaturated", 0.04, "pending")
    assert sigs["InferenceHostLatencyShareHigh"].family == "roofline"
    assert host.rule.severity == frontend.rule.severity
    assert sorted([host, frontend], key=Finding.sort_key) == [frontend, host]
    # within one kind, firing still ranks above pending
    gil = finding("InferenceFrontendCPUSaturated", 0.04, "firing")
    tokenizer = finding("InferenceTokenizerSlowerThanDecode", 3.0, "pending")
    assert sorted([tokenizer, gil], key=Finding.sort_key) == [gil, tokenizer]


def test_diagnose_modules_import_no_circle_even_for_type_checking() -> None:
    # import-linter leaves out `if TYPE_CHECKING:` imports; a circle hidden there (the error
    # type beside the report, the report beside its timeline) is still one meaning too many.
    package = ROOT / "exporter" / "diagnose"
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        found = ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        graph[path.stem] = {
            node.module.rsplit(".", 1)[1]
            for node in found
            if isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("exporter.diagnose.")
        }

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(
            d == goal or (d not in seen and reaches(d, goal, seen | {d}))
            for d in graph.get(start, ())
        )

    assert [m for m in graph if reaches(m, m)] == []
