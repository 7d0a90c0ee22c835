"""Site configuration of the rule pack: validation, profiles, the generator's command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import ROOT

from exporter.config import format_duration as duration
from exporter.config import parse_duration
from exporter.signatures import (
    SignatureConfigError,
    all_signatures,
    load_config,
    parse_config,
    recording_rules,
)
from exporter.signatures.__main__ import main
from exporter.signatures.promql_text import split_matchers
from exporter.signatures.site import Source, fast_profile

STARVED = "InferenceGPUStarvedQueueGrowing"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (["a"], "config: must be a mapping, got a list"),
        (
            {"thresholds": {}},
            "thresholds: unknown key (known: runbook_url, join_labels, "
            "selectors, dcgm, gateway, windows, signatures, cost, slo, scaling, gpu_peaks)",
        ),
        (
            {"runbook_url": "https://wiki/runbooks"},
            "runbook_url: must be a string containing "
            "{alertname}, got string 'https://wiki/runbooks'",
        ),
        ({"join_labels": []}, "join_labels: must list at least one label"),
        ({"join_labels": "pod"}, "join_labels: must be a list of labels, got string 'pod'"),
        ({"join_labels": ["pod", "pod"]}, "join_labels[1]: 'pod' is listed twice"),
        (
            {"join_labels": ["pod", "gpu"]},
            "join_labels[1]: 'gpu' is a label the rules use themselves",
        ),
        (
            {"join_labels": ["k8s-pod"]},
            "join_labels[0]: must be a Prometheus label name, got string 'k8s-pod'",
        ),
        (
            {"selectors": {"exporter": ""}},
            'selectors.exporter: must select the exporter\'s scrape targets (e.g. job="...")',
        ),
        (
            {"selectors": {"sidecar": "cluster=prod"}},
            "selectors.sidecar: cannot read a matcher at 'cluster=prod' (want label=\"value\")",
        ),
        (
            {"selectors": {"sidecar": 'cluster="a" env="b"'}},
            "selectors.sidecar: expected ',' between matchers at 'env=\"b\"'",
        ),
        (
            {"selectors": {"node": ""}},
            "selectors.node: unknown key (known: exporter, sidecar, dcgm)",
        ),
        (
            {"dcgm": {"join": {"node": "Hostname"}}},
            "dcgm.join.node: 'node' is not one of join_labels (namespace, pod, instance, job)",
        ),
        ({"dcgm": {"join": {}}}, "dcgm.join: must map at least one join label"),
        (
            {"gateway": {"join": "namespace"}},
            "gateway.join: must be a list of labels, got string 'namespace'",
        ),
        (
            {"gateway": {"join": ["tenant"]}},
            "gateway.join[0]: 'tenant' is not one of join_labels (namespace, pod, instance, job)",
        ),
        (
            {"gateway": {"join": ["namespace", "job"]}},
            "gateway.join[1]: 'job' names one scrape target; a gateway and the engines of its "
            "pool are different targets",
        ),
        ({"gateway": {"pool": []}}, "gateway.pool: unknown key (known: join)"),
        (
            {"join_labels": ["namespace", "pod", "pool"]},
            "join_labels[2]: 'pool' is a label the rules use themselves",
        ),
        (
            {"windows": {"rate": "5 minutes"}},
            "windows.rate: '5 minutes' is not a duration (use e.g. 500ms, 15s, 1m30s, 1.5m: units "
            "ms, s, m, h, d, w, y, largest first)",
        ),
        (
            {"windows": {"rate": 300}},
            "windows.rate: must be a duration string such as 5m, got number 300",
        ),
        ({"windows": {"rate": "0s"}}, "windows.rate: must be longer than 0s"),
        (
            {"windows": {"hourly": "1h"}},
            "windows.hourly: unknown key (known: rate, latency, "
            "queue_trend, pulsing, xid, baseline, last_sample)",
        ),
        (
            {"signatures": {"InferenceGPUIdle": {}}},
            "signatures.InferenceGPUIdle: unknown alert (see docs/runbooks/ for the names)",
        ),
        (
            {"signatures": {STARVED: {"utilization_below": 1.5}}},
            f"signatures.{STARVED}.utilization_below: must be a ratio from 0 to 1, got 1.5",
        ),
        (
            {"signatures": {STARVED: {"utilization_below": "60%"}}},
            f"signatures.{STARVED}.utilization_below: must be a number, got string '60%'",
        ),
        (
            {"signatures": {STARVED: {"utilization_below": True}}},
            f"signatures.{STARVED}.utilization_below: must be a number, got boolean true",
        ),
        (
            {"signatures": {STARVED: {"queue_growth_above": -1}}},
            f"signatures.{STARVED}.queue_growth_above: must be 0 or more, got -1",
        ),
        (
            {"signatures": {STARVED: {"threshold": 0.5}}},
            f"signatures.{STARVED}.threshold: unknown key (known: for, utilization_below, "
            "queue_growth_above, queue_depth_at_least)",
        ),
        (
            {"signatures": {STARVED: {"for": "ten minutes"}}},
            f"signatures.{STARVED}.for: 'ten minutes' is not a duration (use e.g. 500ms, 15s, "
            "1m30s, 1.5m: units ms, s, m, h, d, w, y, largest first)",
        ),
        (
            {"signatures": {STARVED: 0.5}},
            f"signatures.{STARVED}: must be a mapping, got number 0.5",
        ),
        (
            {"signatures": {"InferenceTokenizerSlowerThanDecode": {"decode_step_factor": 0}}},
            "signatures.InferenceTokenizerSlowerThanDecode.decode_step_factor: must be more than "
            "0, got 0",
        ),
        (
            {"signatures": {"InferenceGPUUtilizationPulsing": {"idle_sample_at_most": 0.07}}},
            "signatures.InferenceGPUUtilizationPulsing.idle_sample_at_most: must be a bucket bound "
            "of inference_gpu_utilization_samples (0.05, 0.1, 0.25, 0.5, 0.6, 0.75, 0.9, 0.95), "
            "got 0.07",
        ),
        (
            {"signatures": {"InferenceGPUXidErrors": {"critical_xids": [79, "x"]}}},
            "signatures.InferenceGPUXidErrors.critical_xids[1]: must be a positive Xid number, got "
            "string 'x'",
        ),
        (
            {"signatures": {"InferenceGPUXidErrors": {"critical_xids": []}}},
            "signatures.InferenceGPUXidErrors.critical_xids: must not be empty",
        ),
        (
            {"signatures": {"InferenceGPUThrottled": {"reasons": ["hot"]}}},
            "signatures.InferenceGPUThrottled.reasons[0]: unknown clock event reason 'hot' (known: "
            "gpu_idle, applications_clocks_setting, power_cap, hw_slowdown, sync_boost, "
            "sw_thermal, hw_thermal, hw_power_brake, display_clock_setting)",
        ),
        (
            {"signatures": {"InferenceGPUMemoryHeadroomLow": {"preallocating_engines": ["vLLM"]}}},
            "signatures.InferenceGPUMemoryHeadroomLow.preallocating_engines[0]: 'vLLM' is not an "
            "engine name",
        ),
        ({"cost": 2.5}, "cost: must be a mapping, got number 2.5"),
        (
            {"cost": {"gpu_hour": 2.5}},
            "cost.gpu_hour: unknown key (known: gpu_hour_price, currency, "
            "gpu_hour_price_by_product)",
        ),
        (
            {"cost": {"gpu_hour_price": "$2.50"}},
            "cost.gpu_hour_price: must be a number, got string '$2.50'",
        ),
        ({"cost": {"gpu_hour_price": 0}}, "cost.gpu_hour_price: must be a price above 0, got 0"),
        (
            {"cost": {"gpu_hour_price": float("inf")}},
            "cost.gpu_hour_price: must be a finite number",
        ),
        (
            {"cost": {"gpu_hour_price": 2, "currency": "dollars"}},
            "cost.currency: must be an ISO 4217 code such as USD or EUR, got string 'dollars'",
        ),
        (
            {"cost": {"gpu_hour_price_by_product": {"NVIDIA H100 80GB HBM3": -3}}},
            "cost.gpu_hour_price_by_product.NVIDIA H100 80GB HBM3: must be a price above 0, got -3",
        ),
        (
            {"cost": {"gpu_hour_price_by_product": {"NVIDIA L4": 1, "nvidia  l4": 2}}},
            "cost.gpu_hour_price_by_product.nvidia  l4: is listed twice",
        ),
        (
            {"cost": {"gpu_hour_price_by_product": [3.9]}},
            "cost.gpu_hour_price_by_product: must be a mapping, got a list",
        ),
        (
            {"gpu_peaks": {"NVIDIA RTX PRO 6000": {"memory_bandwidth": 1.8e12}}},
            "gpu_peaks.NVIDIA RTX PRO 6000.memory_bandwidth: unknown key (known: "
            "memory_bandwidth_bytes_per_second, bf16_flops)",
        ),
        (
            {"gpu_peaks": {"NVIDIA RTX PRO 6000": {"bf16_flops": "fast"}}},
            "gpu_peaks.NVIDIA RTX PRO 6000.bf16_flops: must be a number, got string 'fast'",
        ),
        (
            {"gpu_peaks": {"NVIDIA RTX PRO 6000": {"bf16_flops": 0}}},
            "gpu_peaks.NVIDIA RTX PRO 6000.bf16_flops: must be a peak above 0, got 0",
        ),
        (
            {"gpu_peaks": {"NVIDIA RTX PRO 6000": {}}},
            "gpu_peaks.NVIDIA RTX PRO 6000: give at least one of "
            "memory_bandwidth_bytes_per_second, bf16_flops",
        ),
        (
            {"gpu_peaks": {"NVIDIA L4": {"bf16_flops": 1e14}, "nvidia  l4": {"bf16_flops": 2e14}}},
            "gpu_peaks.nvidia  l4: is listed twice",
        ),
    ],
)
def test_invalid_config_names_the_field(config: Any, message: str) -> None:
    with pytest.raises(SignatureConfigError) as err:
        parse_config(config)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_a_gateway_joins_its_pool_on_the_labels_that_name_no_target() -> None:
    """A gateway's queue belongs to the engines of its namespace (and cluster) that serve its
    model, whatever job scrapes them; a site may narrow or widen that."""
    assert parse_config({}).gateway.labels == ("namespace",)
    clusters = {"join_labels": ["cluster", "namespace", "pod", "instance", "job"]}
    assert parse_config(clusters).gateway.labels == ("cluster", "namespace")
    assert parse_config({"join_labels": ["instance", "job"]}).gateway.labels == ()
    tenant = {
        "join_labels": ["namespace", "pod", "tenant", "instance", "job"],
        "gateway": {"join": ["namespace", "tenant"]},
    }
    cfg = parse_config(tenant)
    assert cfg.gateway.labels == ("namespace", "tenant")
    assert cfg.with_profile("dcgm").gateway == cfg.gateway
    rules = {r.record: r.expr for r in recording_rules(cfg)}
    assert "count by (namespace, tenant, model) (" in rules["inference_gateway:pool_engines:count"]


def test_dcgm_join_must_use_join_labels() -> None:
    static_only = {"join_labels": ["instance", "job"]}
    assert parse_config(static_only, "sidecar").join_labels == ("instance", "job")
    message = (
        "dcgm.join: the dcgm profile joins on 'namespace', which is not in join_labels; "
        "set dcgm.join to join labels that dcgm-exporter series carry"
    )
    with pytest.raises(SignatureConfigError) as err:
        parse_config(static_only, "dcgm")
    assert str(err.value) == message
    with pytest.raises(SignatureConfigError):
        parse_config(static_only).with_profile("dcgm")


def test_a_cluster_join_label_joins_dcgm_series_by_cluster_too() -> None:
    """Many clusters in one store: dcgm-exporter series carry the cluster label as the
    sidecar's do, and two pods of one name in two clusters stay apart."""
    clusters = {"join_labels": ["cluster", "namespace", "pod", "instance", "job"]}
    cfg = parse_config(clusters, "dcgm")
    assert cfg.dcgm.target_labels == ("cluster", "namespace", "pod")
    rules = {r.record: r.expr for r in recording_rules(cfg)}
    util = rules["inference:gpu_utilization:mean5m"]
    assert util.startswith("avg by (cluster, namespace, pod) ((\navg_over_time(")
    assert "* on (cluster, namespace, pod) group_right ()" in util
    # Attributed to a pod is what is required of a dcgm series, not a cluster label: a
    # per-cluster Prometheus (which adds it only when it remote-writes) joins as well.
    assert '{namespace!="",pod!=""}' in util
    # Without a cluster join label, or with a dcgm.join of its own, nothing changes.
    assert parse_config({}, "dcgm").dcgm.target_labels == ("namespace", "pod")
    exported = {**clusters, "dcgm": {"join": {"namespace": "exported_namespace"}}}
    assert parse_config(exported, "dcgm").dcgm.labels == (("namespace", "exported_namespace"),)


def test_unknown_profile() -> None:
    with pytest.raises(SignatureConfigError, match=r"^profile: unknown profile 'gpu' \(known: "):
        parse_config({}, "gpu")


def test_empty_config_is_the_default_pack(tmp_path: Path) -> None:
    empty = tmp_path / "site.yaml"
    empty.write_text("# nothing overridden\n", encoding="utf-8")
    assert load_config(empty) == load_config(None) == parse_config({})


def test_overrides_reach_the_rules() -> None:
    cfg = parse_config(
        {
            "selectors": {"sidecar": 'cluster="prod"'},
            "windows": {"rate": "2m"},
            "signatures": {STARVED: {"utilization_below": 0.5, "for": "20m"}},
        }
    )
    (starved,) = all_signatures(cfg)[0].rules
    assert starved.expr.startswith("(\ninference:gpu_own_utilization:mean2m < 0.5\n")
    assert starved.for_seconds == 1200
    exprs = {r.record: r.expr for r in recording_rules(cfg)}
    assert exprs["inference:gpu_utilization:mean2m"] == (
        "avg by (namespace, pod, instance, job) "
        '(rate(inference_gpu_busy_seconds_total{cluster="prod"}[2m]))'
    )


def test_xid_list_is_normalised() -> None:
    cfg = parse_config({"signatures": {"InferenceGPUXidErrors": {"critical_xids": [95, 79, 79]}}})
    assert cfg.ints("InferenceGPUXidErrors", "critical_xids") == (79, 95)


@pytest.mark.parametrize(
    ("source", "profile"), [("sidecar", "fast"), ("node", "fast-node"), ("dcgm", "fast-dcgm")]
)
def test_fast_profiles_scale_windows_and_for_by_a_tenth(source: Source, profile: str) -> None:
    # fast-node and fast-dcgm (what the demo and the drills load in those layouts) are their
    # source's profile as fast is the sidecar's.
    assert fast_profile(source) == profile
    normal = all_signatures(parse_config({}, source))
    fast = all_signatures(parse_config({}, profile))
    for a, b in zip(normal, fast, strict=True):
        for ra, rb in zip(a.rules, b.rules, strict=True):
            assert rb.for_seconds == pytest.approx(ra.for_seconds / 10), a.alert
    scaled = {r.record: r.expr for r in recording_rules(parse_config({}, profile))}
    unscaled = {r.record: r.expr for r in recording_rules(parse_config({}, source))}
    assert len(scaled) == len(unscaled)
    assert scaled["inference:gpu_utilization:mean30s"] == unscaled[
        "inference:gpu_utilization:mean5m"
    ].replace("[5m]", "[30s]").replace(":mean5m", ":mean30s")


def test_fast_profile_records_and_shipped_alerts() -> None:
    records = {r.record for r in recording_rules(parse_config({}, "fast"))}
    assert {
        "inference:gpu_utilization:mean30s",
        "inference:queue_depth:deriv1m",
        "inference:gpu_utilization_idle_samples:ratio1m",
        "inference_gpu:xid_errors:increase1m",
    } <= records
    text = (ROOT / "alert_rules" / "fast" / "alerts.yaml").read_text(encoding="utf-8")
    assert "offset 6m" in text and "for: 1m\n" in text and "for: 6s\n" in text
    assert "[1h]" not in text and "offset 1h" not in text


def test_profiles_differ_only_in_gpu_records() -> None:
    side = {r.record: r.expr for r in recording_rules(parse_config({}, "sidecar"))}
    dcgm = {r.record: r.expr for r in recording_rules(parse_config({}, "dcgm"))}
    # Records of one profile only are GPU records (dcgm's per-GPU booleans, the sidecar's
    # sample count) and the target info that joins dcgm-exporter series.
    only = (set(side) ^ set(dcgm)) - {"inference:exporter_build_info:group"}
    assert all("gpu" in name for name in only), only
    assert "inference:exporter_build_info:group" in set(dcgm) - set(side)
    differ = {name for name in side if name in dcgm and side[name] != dcgm[name]}
    assert all("gpu" in name for name in differ), differ
    # The dcgm profile reads no GPU series of the sidecar but its peak figures, which
    # dcgm-exporter does not report (the roofline records need them in every profile, the
    # NVLink record the links' peak).
    peaks = (
        "inference_gpu_peak_memory_bandwidth_bytes_per_second",
        "inference_gpu_peak_flops",
        "inference_gpu_nvlink_peak_bytes_per_second",
    )
    for name, expr in dcgm.items():
        read = set(re.findall(r"\binference_gpu_[a-z0-9_]+", expr))
        assert read <= set(peaks), (name, read)
    assert any(peak in expr for peak in peaks for expr in dcgm.values())
    # The alert expressions themselves are the same in every profile.
    pairs = zip(
        all_signatures(parse_config({}, "sidecar")),
        all_signatures(parse_config({}, "dcgm")),
        strict=True,
    )
    for a, b in pairs:
        assert [r.expr for r in a.rules] == [r.expr for r in b.rules]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("1h30m", 5400), ("500ms", 0.5), ("1d", 86400)],
)
def test_durations_round_trip(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert duration(seconds) == text


def test_duration_formatting() -> None:
    assert duration(90) == "1m30s"
    assert duration(360) == "6m"
    assert duration(0) == "0s"


def test_matchers() -> None:
    assert split_matchers('{job=~"a.*", mode != "idle",}') == ['job=~"a.*"', 'mode!="idle"']
    assert split_matchers("") == []


# --- the generator ----------------------------------------------------------------------------


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter.signatures", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def test_cli_config_error_is_one_line(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"signatures": {STARVED: {"for": 10}}}), encoding="utf-8")
    result = _cli("--config", str(site), "--profile", "dcgm", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"python -m exporter.signatures: error: {site}: signatures.{STARVED}.for: must be a "
        "duration string such as 5m, got number 10\n"
    )
    assert not (tmp_path / "out").exists()


def test_cli_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("signatures: [\n", encoding="utf-8")
    result = _cli("--config", str(site))
    assert result.returncode == 2
    assert re.fullmatch(
        r"python -m exporter\.signatures: error: .*site\.yaml: not valid YAML at line \d+\n",
        result.stderr,
    )
    result = _cli("--config", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert result.stderr.endswith("missing.yaml: cannot read (No such file or directory)\n")


def test_check_reports_stale_and_changed_files(tmp_path: Path) -> None:
    out, books = tmp_path / "rules", tmp_path / "runbooks"
    args = ["--out", str(out), "--runbooks", str(books)]
    assert main(args) == 0
    assert main([*args, "--check"]) == 0
    assert (out / "dcgm" / "alerts.yaml").is_file() and (out / "fast" / "alerts.yaml").is_file()
    assert (books / f"{STARVED}.md").is_file()
    alerts = out / "alerts.yaml"
    alerts.write_text(alerts.read_text(encoding="utf-8").replace("0.6", "0.7"), encoding="utf-8")
    old = books / "InferenceGPUIdle.md"
    old.write_text("Generated by `python -m exporter.signatures`\n", encoding="utf-8")
    mine = books / "notes.md"
    mine.write_text("my own notes\n", encoding="utf-8")
    result = _cli(*args, "--check")
    assert result.returncode == 1
    assert f"{alerts} is out of date" in result.stderr
    assert f"{old} belongs to no alert of the catalogue" in result.stderr
    assert "notes.md" not in result.stderr
    assert main(args) == 0
    assert main([*args, "--check"]) == 0
    assert not old.exists() and mine.exists()


def test_single_profile_into_a_directory(tmp_path: Path) -> None:
    assert main(["--profile", "dcgm", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alerts.yaml", "recording_rules.yaml"]
    text = (tmp_path / "recording_rules.yaml").read_text(encoding="utf-8")
    assert "DCGM_FI_DEV_GPU_UTIL" in text and "inference_gpu_busy_seconds_total" not in text


def test_documented_defaults_are_a_valid_config() -> None:
    index = (ROOT / "docs" / "runbooks" / "README.md").read_text(encoding="utf-8")
    example = index.split("```yaml\n", 1)[1].split("```", 1)[0]
    documented = parse_config(yaml.safe_load(example))
    defaults = parse_config({})
    assert documented.join_labels == defaults.join_labels
    assert documented.selectors == defaults.selectors
    assert documented.windows == defaults.windows
    assert documented.dcgm == defaults.dcgm
    assert documented.gateway == defaults.gateway
    assert documented.cost == defaults.cost
    assert documented.runbook_url == defaults.runbook_url


def test_cost_records_exist_only_with_a_price() -> None:
    """Without a price (the shipped pack) there are no cost records; with one, every layout
    has them, and a product's price comes before the default."""
    names = ("inference:gpu_cost_per_hour:mean5m", "inference:cost_per_million_generated_tokens")
    for profile in ("sidecar", "node", "dcgm"):
        shipped = [r.record for r in recording_rules(parse_config({}, profile))]
        assert not any(name.startswith(names) for name in shipped), profile
        site = {"cost": {"gpu_hour_price": 2, "gpu_hour_price_by_product": {"NVIDIA L4": 0.8}}}
        rules = {r.record: r.expr for r in recording_rules(parse_config(site, profile))}
        cost = rules["inference:gpu_cost_per_hour:mean5m"]
        assert cost.index("0.8 * group") < cost.index("2 * group"), profile
        assert "inference_pool:cost_per_million_prompt_tokens:ratio5m" in rules
    cfg = parse_config({"cost": {"gpu_hour_price_by_product": {" NVIDIA  L4 ": 0.8}}})
    assert cfg.cost.priced and cfg.cost.gpu_hour_price is None and cfg.cost.currency == "USD"
    assert cfg.cost.by_product == (("NVIDIA L4", 0.8),)
    assert not parse_config({}).cost.priced


def test_gpu_peaks_name_products_the_dcgm_layout_reads_peaks_of() -> None:
    """A site's peaks for a product (``gpu_peaks``) come before the product table's in the
    dcgm layout (dcgm-exporter reports none); the other layouts read theirs from NVML."""
    site = {
        "gpu_peaks": {
            " NVIDIA  RTX PRO 6000 ": {"memory_bandwidth_bytes_per_second": "1.792e12"},
            "NVIDIA H100 80GB HBM3": {"bf16_flops": 9.0e14},
        }
    }
    cfg = parse_config(site, "dcgm")
    assert [(p.name, p.memory_bandwidth, p.flops) for p in cfg.gpu_peaks] == [
        ("NVIDIA RTX PRO 6000", 1.792e12, ()),
        ("NVIDIA H100 80GB HBM3", None, (("bf16", 9.0e14),)),
    ]
    rules = {r.record: r.expr for r in recording_rules(cfg)}
    bandwidth = rules["inference:gpu_peak_memory_bandwidth_bytes_per_second:min"]
    # the site's figure first, then the table's (an L4's the slowest)
    assert bandwidth.index("1792000000000 * group") < bandwidth.index('"(?i)nvidia +l4"')
    assert 'modelName=~"(?i)NVIDIA +RTX +PRO +6000"' in bandwidth
    flops = rules["inference:gpu_peak_bf16_flops:min"]
    # the site's H100 figure first: `or` keeps it for the H100s, the table's for the rest
    assert flops.index("900000000000000 * group") < flops.index('"(?i)nvidia +h100 +80gb +hbm3')
    for profile in ("sidecar", "node"):
        other = {r.record: r.expr for r in recording_rules(parse_config(site, profile))}
        assert other == {r.record: r.expr for r in recording_rules(parse_config({}, profile))}


def test_a_bad_price_exits_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("cost:\n  gpu_hour_price: -1\n", encoding="utf-8")
    assert main(["--config", str(site), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"python -m exporter.signatures: error: {site}: cost.gpu_hour_price: must be a price "
        "above 0, got -1\n"
    )
    assert not (tmp_path / "out").exists()
