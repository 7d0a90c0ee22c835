"""The roofline figures ``diagnose`` prints: the summary line, its variants, the workload advice."""

from __future__ import annotations

from exporter.diagnose.findings import Roofline, workload_advice
from exporter.diagnose.report import energy_line, roofline_summary
from exporter.signatures.params import LONG_OUTPUT_TOKENS, LONG_PROMPT_TOKENS

LABELS = (("instance", "10.0.0.1:10960"), ("job", "j"), ("model", "m"))
# Llama-3.1-8B in bf16 (16.06 GB) with 26 GB of live KV on an H100 SXM (3.35 TB/s), steps of
# 45 ms; a 6 s request: 1 % queue, 5 % prefill, 50 % decode.
FLOOR = (16.06e9 + 26e9) / 3.35e12
WORKED = {
    "floor": FLOOR,
    "itl": 0.045,
    "efficiency": FLOOR / 0.045,
    "e2e": 6.0,
    "queue": 0.01,
    "prefill": 0.05,
    "decode": 0.5,
    "host": 0.44,
}


def test_the_worked_example() -> None:
    r = Roofline("llm/vllm-0", LABELS, dict(WORKED))
    assert r.model == "m" and r.decode_source == "floor"
    assert roofline_summary(r) == (
        "decode at 28 % of its HBM floor (12.6 ms floor, 45.0 ms observed); "
        "of 6.0 s end to end: queue 1 %, prefill 5 %, decode 50 %, host 44 %"
    )
    split = r.engine_time_split
    assert split is not None
    assert split[0] == 0.05 / 0.55 and split[1] == 0.5 / 0.55


def test_a_decode_pod_of_disaggregated_serving_shows_its_transfer() -> None:
    """The numbers of tests/promtool/sidecar/split.yaml's decode engine: 2.4 s a request, the
    queue's own wait 2 %, the KV transfer 8 %; no decode roofline without model facts."""
    values = {"e2e": 2.4, "queue": 0.0208, "prefill": 0.0083, "transfer": 0.0833}
    values |= {"decode": 0.8333, "host": 0.0542}
    assert roofline_summary(Roofline("d/decode-0", LABELS, values)) == (
        "of 2.4 s end to end: queue 2 %, prefill 1 %, KV transfer 8 %, decode 83 %, host 5 %"
    )


def test_without_model_facts_the_engines_read_bytes_stand_in() -> None:
    r = Roofline("t", LABELS, {"efficiency": 0.2, "itl": 0.045})
    assert r.decode_source == "read_bytes"
    assert roofline_summary(r) == (
        "decode reads 20 % of the peak HBM bandwidth (the engine's estimate; no model facts "
        "for the floor)"
    )


def test_a_tensor_parallel_pod_shows_its_communication() -> None:
    """The link-bound pair of tests/promtool/sidecar/signatures.yaml: NVLink at 88 % of its
    peak is at least 88 % of each step moving data; one GPU, or no link read, shows none."""
    bound = Roofline("llm/vllm-tp-0", LABELS, {**WORKED, "gpus": 2.0, "nvlink": 0.88})
    assert bound.communication_share == 0.88
    assert roofline_summary(bound).endswith(
        "host 44 %; communication at least 88 % of a step (NVLink of its 2 GPUs at 88 % of its "
        "peak)"
    )
    single = Roofline("t", LABELS, {**WORKED, "gpus": 1.0, "nvlink": 0.88})
    assert single.communication_share is None
    assert "communication" not in roofline_summary(single)
    pcie = Roofline("t", LABELS, {**WORKED, "gpus": 2.0})
    assert pcie.communication_share is None


def test_what_a_token_costs() -> None:
    """The numbers of tests/promtool/sidecar/energy.yaml's pod A and of the gpu-cost site's:
    1000 W over two GPUs, 10 % idle, 0.8 J per generated token, 0.0667 per prompt token,
    7.20 an hour, 1.60 and 0.133 per million tokens."""
    figures = {"joules_generated": 0.8, "joules_prompt": 0.0667, "power": 1000.0}
    figures |= {"idle_energy": 0.1, "gpus": 2.0}
    r = Roofline("llm/vllm-tp-0", LABELS, figures)
    assert energy_line(r, "USD") == (
        "energy: 0.8 J per generated token, 0.0667 J per prompt token (1000 W over 2 GPUs, "
        "10 % of the energy idle)"
    )
    priced = Roofline("t", LABELS, {**figures, "cost_generated": 1.6, "cost_prompt": 0.1333})
    priced.values["cost_per_hour"] = 7.2
    assert energy_line(priced, "EUR") == (
        "energy: 0.8 J per generated token, 0.0667 J per prompt token (1000 W over 2 GPUs, "
        "10 % of the energy idle); cost: 1.6 EUR per million generated tokens, 0.133 EUR per "
        "million prompt tokens (the GPUs: 7.20 EUR an hour)"
    )
    # an engine without phase times: generated tokens only; no energy figure: no line
    only = Roofline("t", LABELS, {"joules_generated": 1.0})
    assert energy_line(only, "USD") == "energy: 1 J per generated token"
    assert energy_line(Roofline("t", LABELS, dict(WORKED)), "USD") is None


def test_a_budget_needs_every_part() -> None:
    values = {k: v for k, v in WORKED.items() if k != "queue"}
    summary = roofline_summary(Roofline("t", LABELS, values))
    assert summary == "decode at 28 % of its HBM floor (12.6 ms floor, 45.0 ms observed)"
    only_budget = {k: WORKED[k] for k in ("e2e", "queue", "prefill", "decode", "host")}
    assert roofline_summary(Roofline("t", LABELS, only_budget)).startswith("of 6.0 s end to end")
    empty = Roofline("t", LABELS, {"prompt_tokens": 100.0})
    assert roofline_summary(empty).startswith("no roofline figures")
    assert empty.decode_source is None and empty.tokens_per_second is None
    assert empty.engine_time_split is None


def test_workload_advice() -> None:
    assert workload_advice(None, 100) is None and workload_advice(100, None) is None
    long_prompt, long_output = LONG_PROMPT_TOKENS + 1, LONG_OUTPUT_TOKENS + 1
    assert "prefill-bound" in str(workload_advice(long_prompt, 100))
    assert "decode-bound" in str(workload_advice(100, long_output))
    both = str(workload_advice(long_prompt, long_output))
    assert "compete" in both and "disaggregated serving" in both
    # the thresholds themselves are not long
    short = str(workload_advice(LONG_PROMPT_TOKENS, LONG_OUTPUT_TOKENS))
    assert short.startswith("prompts up to 2048 tokens and outputs up to 512")
    assert "would not pay" in short
