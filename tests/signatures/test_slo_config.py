"""The site config's objectives (``slo:``) and scaling advice (``scaling:``).

Every mistake exits 2 with one line naming the field; a latency threshold between two bucket
bounds of an engine's histogram is refused with the nearest bounds and the error each would
bring.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.signatures import parse_config
from exporter.signatures.__main__ import main
from exporter.signatures.site import SignatureConfigError
from exporter.signatures.slo.burn_alerts import slo_alerts
from exporter.signatures.slo.slo_signals import slo_rules
from exporter.signatures.slo_config import SRE_WORKBOOK, Objective

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _slo(*objectives: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"slo": {"objectives": list(objectives), **extra}}


def test_the_shipped_objective() -> None:
    cfg = parse_config({})
    (slo,) = cfg.slo.objectives
    assert slo.name == "default" and slo.model is None
    assert slo.ttft == Objective(0.99, 10.0)
    assert slo.availability == Objective(0.99)
    assert slo.itl is None and slo.e2e is None
    assert slo.engines == ("vllm", "sglang", "trtllm", "nim", "ray", "dynamo")
    assert cfg.slo.burn_alerts == SRE_WORKBOOK
    assert cfg.slo.period == 28 * 86400
    assert [a.burn_rate for a in SRE_WORKBOOK] == [14.4, 6.0, 3.0, 1.0]
    # The workbook's share of a 30-day budget each pair spends over its long window.
    assert [round(a.budget_spent, 4) for a in SRE_WORKBOOK] == [0.02, 0.05, 0.1, 0.1]


def test_objectives_of_a_site() -> None:
    cfg = parse_config(
        _slo(
            {
                "name": "chat",
                "model": MODEL,
                "selector": 'namespace="prod"',
                "engines": ["vllm"],
                "ttft": "500ms @ 99%",
                "itl": "50ms @ 99.5%",
                "e2e": "20s @ 0.99",
                "availability": "99.9%",
            },
            {"ttft": "10s @ 95%"},
        )
    )
    chat, rest = cfg.slo.objectives
    assert chat.ttft == Objective(0.99, 0.5)
    assert chat.itl == Objective(0.995, 0.05)
    assert chat.e2e == Objective(0.99, 20.0)
    assert chat.availability == Objective(0.999)
    assert chat.selector == ('namespace="prod"',)
    assert rest.name == "default" and rest.engines == (
        "vllm",
        "sglang",
        "trtllm",
        "nim",
        "ray",
        "dynamo",
    )
    assert chat.ttft.text() == "500ms @ 99%" and chat.availability.text() == "99.9%"
    # Every kind set somewhere has its alert; the model's own name is its objective's.
    assert [a.alert for a in slo_alerts(cfg)] == [
        "InferenceTTFTBudgetBurn",
        "InferenceITLBudgetBurn",
        "InferenceE2ELatencyBudgetBurn",
        "InferenceAvailabilityBudgetBurn",
    ]
    exprs = {(r.record, r.labels): r.expr for r in slo_rules(cfg)}
    good = exprs[("inference_pool:slo_ttft_good:rate5m", (("slo", "chat"),))]
    assert 'le="0.5"' in good and f'model="{MODEL}"' in good and 'namespace="prod"' in good
    assert 'engine=~"vllm"' in good and 'role!="prefill"' in good
    # The objective without a model reads every model the others do not name.
    other = exprs[("inference_pool:slo_ttft_good:rate5m", (("slo", "default"),))]
    assert 'model!~"meta-llama/Llama-3\\\\.1-8B-Instruct"' in other and 'le="10.0"' in other


def test_no_objectives_no_slo_rules() -> None:
    cfg = parse_config({"slo": {"objectives": []}})
    assert slo_rules(cfg) == [] and slo_alerts(cfg) == ()


def test_own_buckets_allow_a_threshold_the_engines_lack() -> None:
    cfg = parse_config(
        _slo(
            {
                "model": MODEL,
                "engines": ["tgi"],
                "buckets": {"itl": [0.02, 0.045, 0.1]},
                "itl": "45ms @ 99%",
            }
        )
    )
    assert 'le="0.045"' in next(r.expr for r in slo_rules(cfg) if "itl_good" in r.record)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            _slo({"model": MODEL, "engines": ["vllm"], "ttft": "450ms @ 99%"}),
            "slo.objectives[0].ttft: 450ms is not a bucket bound of vllm's time to first token "
            "histogram (inference_time_to_first_token_seconds); the nearest are 250ms, which "
            "would count requests up to 200ms (44 %) faster as bad, and 500ms, which would "
            "count requests up to 50ms (11 %) slower as good: pick a bound, or give the engine "
            "buckets that include 450ms",
        ),
        (
            _slo({"model": MODEL, "ttft": "500ms @ 99%"}),
            "slo.objectives[0].ttft: 500ms is not a bucket bound of sglang's time to first "
            "token histogram (inference_time_to_first_token_seconds); the nearest are 400ms, "
            "which would count requests up to 100ms (20 %) faster as bad, and 600ms, which "
            "would count requests up to 100ms (20 %) slower as good: pick a bound, or give the "
            "engine buckets that include 500ms",
        ),
        (
            _slo({"model": MODEL, "engines": ["vllm"], "e2e": "3h @ 99%"}),
            "slo.objectives[0].e2e: 3h is not a bucket bound of vllm's end-to-end latency "
            "histogram (inference_e2e_request_latency_seconds); the nearest is 2h8m, which "
            "would count requests up to 52m (29 %) faster as bad: pick a bound, or give the "
            "engine buckets that include 3h",
        ),
        (
            _slo({"model": MODEL, "engines": ["tgi"], "itl": "50ms @ 99%"}),
            "slo.objectives[0].itl: the bucket bounds of tgi's inter-token latency histogram "
            "(inference_inter_token_latency_seconds) are not known (no captured scrape (the "
            "fixture is hand-written), and its inter-token histogram holds one mean per "
            "request); name them in buckets.itl of this objective",
        ),
        (
            _slo({"model": MODEL, "ttft": "500ms"}),
            "slo.objectives[0].ttft: must be 'threshold @ target' (500ms @ 99%), got '500ms'",
        ),
        (
            _slo({"model": MODEL, "ttft": "10s @ 100%"}),
            "slo.objectives[0].ttft: the target must be above 0% and below 100% (a budget to "
            "spend), got '100%'",
        ),
        (
            _slo({"model": MODEL, "availability": "99.9"}),
            "slo.objectives[0].availability: the target must be above 0% and below 100% (a "
            "budget to spend), got '99.9'",
        ),
        (
            _slo({"model": MODEL, "availability": "10s @ 99%"}),
            "slo.objectives[0].availability: availability has no threshold: write only the "
            "target, got '10s @ 99%'",
        ),
        (
            _slo({"model": MODEL}),
            "slo.objectives[0]: sets no objective (any of ttft, itl, e2e, availability)",
        ),
        (
            _slo({"model": MODEL, "ttft": "10s @ 99%", "latency": "1s"}),
            "slo.objectives[0].latency: unknown key (known: name, model, selector, engines, "
            "buckets, ttft, itl, e2e, availability)",
        ),
        (
            _slo({"model": MODEL, "engines": ["vlm"], "ttft": "10s @ 99%"}),
            "slo.objectives[0].engines[0]: unknown engine string 'vlm' (known: vllm, sglang, "
            "tgi, triton, llamacpp, nim, trtllm, dynamo, lmdeploy, ray, llmd-epp, custom)",
        ),
        (
            _slo({"model": MODEL, "selector": 'model="x"', "ttft": "10s @ 99%"}),
            "slo.objectives[0].selector: 'model' is set by the objective itself (model, "
            "engines), not a selector",
        ),
        (
            _slo({"model": MODEL, "ttft": "10s @ 99%"}, {"model": MODEL, "ttft": "10s @ 95%"}),
            "slo.objectives[1].name: 'meta-llama/Llama-3.1-8B-Instruct' is the name of "
            "objectives[0] too; give each a name",
        ),
        (
            _slo({"model": MODEL, "buckets": {"ttft": [0.5, 0.25]}, "ttft": "500ms @ 99%"}),
            "slo.objectives[0].buckets.ttft: must list each bound once, in ascending order",
        ),
        (
            _slo({"model": MODEL, "ttft": "10s @ 99%"}, period="1d"),
            "slo.period: must be at least the longest burn-rate window (3d)",
        ),
        (
            _slo(
                {"model": MODEL, "ttft": "10s @ 99%"},
                burn_alerts=[
                    {"long": "5m", "short": "1h", "burn_rate": 14.4, "severity": "critical"}
                ],
            ),
            "slo.burn_alerts[0].short: must be shorter than long",
        ),
        (
            _slo(
                {"model": MODEL, "ttft": "10s @ 99%"},
                burn_alerts=[{"long": "1h", "short": "5m", "burn_rate": 14.4, "severity": "page"}],
            ),
            "slo.burn_alerts[0].severity: must be critical (page) or warning (ticket), got "
            "string 'page'",
        ),
        (
            {"slo": {"objective": []}},
            "slo.objective: unknown key (known: period, burn_alerts, objectives)",
        ),
        (
            {"scaling": {"kv_cache_above": 1.5}},
            "scaling.kv_cache_above: must be from 0 to 1, got 1.5",
        ),
        (
            {"scaling": {"cause_hold": 300}},
            "scaling.cause_hold: must be a duration string such as 5m, got number 300",
        ),
    ],
)
def test_bad_objectives_name_the_field(config: dict[str, Any], message: str) -> None:
    with pytest.raises(SignatureConfigError) as caught:
        parse_config(config)
    assert str(caught.value) == message


def test_a_bad_threshold_exits_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(
        yaml.safe_dump(_slo({"model": MODEL, "engines": ["vllm"], "itl": "60ms @ 99%"})),
        encoding="utf-8",
    )
    assert main(["--config", str(site), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        f"python -m exporter.signatures: error: {site}: slo.objectives[0].itl: 60ms is not a "
        "bucket bound of vllm's inter-token latency histogram"
    )
    assert "the nearest are 50ms" in err and "and 75ms" in err
    assert not (tmp_path / "out").exists()


def test_scaling_defaults_and_overrides() -> None:
    shipped = parse_config({}).scaling
    assert (shipped.queue_depth_at_least, shipped.kv_cache_above) == (1.0, 0.9)
    assert (shipped.gpu_utilization_at_least, shipped.blocked_pods_share_at_least) == (0.6, 0.5)
    assert shipped.cause_hold == 300.0
    site = parse_config({"scaling": {"gpu_utilization_at_least": 0.8, "cause_hold": "10m"}})
    assert site.scaling.gpu_utilization_at_least == 0.8 and site.scaling.cause_hold == 600.0
    # The fast profile scales the hold like every window.
    from exporter.signatures.slo.verdict_signals import verdict_rules  # noqa: PLC0415

    fast = {r.record: r.expr for r in verdict_rules(parse_config({}, "fast"))}
    assert "[30s]" in fast["inference:scale_out_blocked:flag"]
