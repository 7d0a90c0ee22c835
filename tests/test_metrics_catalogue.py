"""The metric catalogue (``exporter/metrics.py``) against what the exporter really emits.

The catalogue is the one source of truth: everything the running exporter emits under
``inference_`` must be in it with the same type and labels, everything in it must be emitted
(except what the fixtures cannot produce, named below), its names must follow CONVENTIONS.md,
and ``docs/metrics.md`` must be its current rendering.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from support.paths import FIXTURES, ROOT, TRACE, build_tool
from support.process import ExporterProcess

from exporter.collectors import serve_options
from exporter.metrics import BY_NAME, CATALOGUE, MetricSpec

_docgen_module = build_tool("docgen")
FLAGS_BEGIN, FLAGS_END = _docgen_module.FLAGS_BEGIN, _docgen_module.FLAGS_END
METRICS_MD, generated = _docgen_module.METRICS_MD, _docgen_module.generated

PROC = FIXTURES / "proc" / "two-cpu"
# The shared-GPU traces: MIG devices, per-process shares (the 2-GPU trace has neither); and a
# Grace-Blackwell GPU: C2C, power smoothing, workload power profiles, fabric health summary.
SHARED_TRACES = (
    ROOT / "tests" / "fixtures" / "traces" / "replay-mig-7slice-synthetic.jsonl",
    ROOT / "tests" / "fixtures" / "traces" / "replay-timesliced-2tenant-synthetic.jsonl",
    ROOT / "tests" / "fixtures" / "traces" / "replay-gb200-synthetic.jsonl",
)
SHARED_ONLY = {
    "inference_gpu_mig_info",
    "inference_gpu_mig_instance_info",
    "inference_gpu_processes",
    "inference_gpu_engine_utilization_ratio",
    "inference_gpu_engine_busy_seconds_total",
    "inference_gpu_engine_memory_used_bytes",
    "inference_gpu_power_smoothing_enabled",
    "inference_gpu_power_smoothing_floor_watts",
    "inference_gpu_power_profile_info",
    "inference_gpu_c2c_transmit_bytes_total",
    "inference_gpu_c2c_receive_bytes_total",
    "inference_gpu_c2c_links",
    "inference_gpu_c2c_peak_bytes_per_second",
    "inference_gpu_fabric_health",
}
# The collectors this test runs (the others need an engine to scrape).
RUN = ("self", "nvml", "cpu")

# Catalogue entries the replay trace and fixture procfs cannot make the exporter emit.
NOT_PRODUCIBLE = {
    "inference_gpu_xid_errors_total": "needs an Xid event; the shipped trace has none",
    "inference_cpu_softirq_hottest_core_ratio": (
        "needs two procfs reads that differ; the fixture tree never changes"
    ),
    # Per-pod shares are mapped on the live node only (tests/collectors/test_nvml.py covers them).
    **dict.fromkeys(
        (
            "inference_gpu_pod_utilization_ratio",
            "inference_gpu_pod_memory_used_bytes",
            "inference_gpu_pod_unattributed_processes",
            "inference_gpu_pod_busy_seconds_total",
        ),
        "a replayed trace's PIDs are another machine's: never mapped to this one's pods",
    ),
    # Each link's series only with --gpu.nvlink-per-link (tests/collectors/test_nvml_links.py).
    **dict.fromkeys(
        (
            "inference_gpu_nvlink_link_transmit_bytes_total",
            "inference_gpu_nvlink_link_receive_bytes_total",
            "inference_gpu_nvlink_link_peak_bytes_per_second",
        ),
        "per-link series need --gpu.nvlink-per-link, which this scrape does not pass",
    ),
}

NAME_RE = re.compile(r"^inference_[a-z0-9_]+$")
# unit field -> the suffix the name must carry (before ``_total`` on counters)
UNIT_SUFFIX = {
    "seconds": "_seconds",
    "bytes": "_bytes",
    "bytes per second": "_bytes_per_second",
    "watts": "_watts",
    "joules": "_joules",
    "hertz": "_hertz",
    "celsius": "_celsius",
    "ratio": "_ratio",
}
UNIT_WORDS = ("seconds", "bytes", "watts", "joules", "hertz", "celsius", "ratio", "percent")
# Sample suffixes a family adds, by type; labels a type adds to its samples.
SAMPLE_SUFFIXES = {
    "gauge": ("",),
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}
TYPE_LABELS = {"histogram": {"le"}}

BY_FAMILY: dict[str, MetricSpec] = {spec.family_name: spec for spec in CATALOGUE}


def _scrape_replay(exporter_process: Callable[..., ExporterProcess], trace: Path) -> str:
    """One scrape of the real CLI on a replay trace, once GPM values are in (2nd poll)."""
    proc = exporter_process(
        "--gpu.replay-file",
        str(trace),
        "--gpu.poll-interval",
        "500ms",
        "--path.procfs",
        str(PROC.relative_to(ROOT)),
    )
    proc.wait_ready()
    texts: list[str] = []

    def has_gpm() -> bool:
        texts.append(proc.get("/metrics")[2].decode())
        return "inference_gpu_memory_bandwidth_utilization_ratio{" in texts[-1]

    proc.wait_for(has_gpm, timeout=10, step=0.25)
    proc.terminate()
    return texts[-1]


@pytest.fixture
def exposition(exporter_process: Callable[..., ExporterProcess]) -> str:
    return _scrape_replay(exporter_process, TRACE)


@pytest.fixture
def shared_expositions(exporter_process: Callable[..., ExporterProcess]) -> list[str]:
    return [_scrape_replay(exporter_process, trace) for trace in SHARED_TRACES]


def _families(text: str) -> dict[str, tuple[str, list[Sample]]]:
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}


@pytest.mark.parametrize("trace", [TRACE, *SHARED_TRACES], ids=lambda p: p.name)
def test_everything_emitted_is_catalogued_with_type_and_labels(
    exporter_process: Callable[..., ExporterProcess], trace: Path
) -> None:
    exposition = _scrape_replay(exporter_process, trace)
    families = {n: v for n, v in _families(exposition).items() if n.startswith("inference_")}
    assert families, "no inference_ metrics emitted"
    for name, (kind, samples) in families.items():
        assert name in BY_FAMILY, f"{name} is emitted but not in exporter/metrics.py"
        spec = BY_FAMILY[name]
        assert spec.name in BY_NAME
        assert kind == spec.type, f"{name}: emitted as {kind}, catalogued as {spec.type}"
        assert samples, name
        for sample in samples:
            suffix = sample.name.removeprefix(name)
            assert suffix in SAMPLE_SUFFIXES[kind], f"{name}: unexpected sample {sample.name}"
            expected = set(spec.labels) | (
                TYPE_LABELS.get(kind, set()) if suffix == "_bucket" else set()
            )
            assert set(sample.labels) == expected, f"{sample.name}: labels {sample.labels}"
        if kind == "counter":
            assert any(s.name == spec.name for s in samples), f"{spec.name} sample missing"


def test_every_catalogued_metric_is_emitted(exposition: str, shared_expositions: list[str]) -> None:
    emitted = set(_families(exposition))
    for text in shared_expositions:
        emitted |= set(_families(text))
    missing = [
        spec.name
        for spec in CATALOGUE
        if spec.collector in RUN
        and spec.family_name not in emitted
        and spec.name not in NOT_PRODUCIBLE
    ]
    assert missing == []
    # and the exceptions really are absent: an exception that is no longer needed goes
    for name in NOT_PRODUCIBLE:
        assert name in BY_NAME
        assert BY_NAME[name].family_name not in emitted, f"{name} is emitted now: drop it here"


def test_every_gpu_is_covered(exposition: str) -> None:
    # the trace has two GPUs with GPM: every per-GPU gauge has a series for each
    families = _families(exposition)
    for spec in CATALOGUE:
        if spec.collector != "nvml" or spec.labels[:2] != ("gpu", "uuid"):
            continue
        if spec.name in NOT_PRODUCIBLE or spec.name in SHARED_ONLY:
            continue
        _, samples = families[spec.family_name]
        assert {s.labels["gpu"] for s in samples} == {"0", "1"}, spec.name


# Names of the metric contract that other code depends on; they keep their name even where the
# unit suffix rule would ask for another (the histogram of driver samples is
# inference_gpu_utilization_samples; the roofline figures name FLOPs, which is no Prometheus
# base unit, and the KV-cache bytes per token).
CONTRACT_NAMES = frozenset(
    {
        "inference_gpu_utilization_samples",
        "inference_gpu_peak_flops",
        "inference_model_flops_per_token",
        "inference_model_kv_cache_bytes_per_token",
    }
)


@pytest.mark.parametrize("spec", CATALOGUE, ids=lambda s: s.name)
def test_catalogue_names_follow_conventions(spec: MetricSpec) -> None:
    name = spec.name
    assert NAME_RE.match(name), name
    assert "__" not in name and not name.endswith("_")
    assert "percent" not in name
    assert spec.type in {"gauge", "counter", "histogram"}
    assert (spec.type == "counter") == name.endswith("_total"), name
    base = name.removesuffix("_total")
    if name in CONTRACT_NAMES:
        return
    if spec.unit:
        assert spec.unit in UNIT_SUFFIX, f"{name}: unknown unit {spec.unit!r}"
        assert base.endswith(UNIT_SUFFIX[spec.unit]), (
            f"{name}: unit {spec.unit!r} but the name does not end in {UNIT_SUFFIX[spec.unit]}"
        )
    else:
        # a name without a unit field must not claim one
        assert not base.endswith(tuple(f"_{w}" for w in UNIT_WORDS)), name
    if base.endswith("_ratio"):
        assert spec.unit == "ratio", name
    for label in spec.labels:
        assert re.match(r"^[a-z][a-z0-9_]*$", label), label
        # The node agent names the pod that holds a GPU (kept by honorLabels); every other
        # series gets its pod from Prometheus' target labels.
        if spec.collector == "podresources" and label in {"namespace", "pod", "container"}:
            continue
        assert label not in {"pod", "namespace", "hostname", "instance", "job"}, label
    assert spec.help and spec.collector


def test_catalogue_has_no_duplicates() -> None:
    assert len(BY_NAME) == len(CATALOGUE)
    assert len(BY_FAMILY) == len(CATALOGUE)


def _docgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "build-tools" / "docgen.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _copy_of_repo_docs(tmp: Path) -> Path:
    """A copy of every file docgen writes to, in a tree of its own."""
    for path in generated():
        copy = tmp / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    return tmp


def test_docs_are_generated_from_the_catalogue(tmp_path: Path) -> None:
    result = _docgen("--check")
    assert result.returncode == 0, result.stderr
    current = METRICS_MD.read_text(encoding="utf-8")
    for spec in CATALOGUE:
        assert f"`{spec.name}`" in current

    root = _copy_of_repo_docs(tmp_path)
    assert _docgen("--check", "--root", str(root)).returncode == 0

    copy = root / "docs" / "metrics.md"
    copy.write_text(current.replace("Board power draw.", "Board power draw (edited)."))
    result = _docgen("--check", "--root", str(root))
    assert result.returncode == 1
    assert result.stderr == (f"out of date: {copy}; run python build-tools/docgen.py\n")
    assert _docgen("--root", str(root)).returncode == 0
    assert copy.read_text(encoding="utf-8") == current

    copy.unlink()
    assert _docgen("--check", "--root", str(root)).returncode == 1
    assert not copy.exists()


def test_readme_flag_table_is_generated_from_the_options(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index(FLAGS_BEGIN) : readme.index(FLAGS_END)]
    for option in serve_options():
        assert f"`--{option.name}`" in table
        assert f"`{option.env}`" in table
    for flag in ("--config.file", "--config.check", "--version"):
        assert f"`{flag}`" in table

    root = _copy_of_repo_docs(tmp_path)
    edited = readme.replace("| `--gpu.poll-interval` | `3s` |", "| `--gpu.poll-interval` | `5s` |")
    assert edited != readme
    (root / "README.md").write_text(edited, encoding="utf-8")
    result = _docgen("--check", "--root", str(root))
    assert result.returncode == 1 and "README.md" in result.stderr
    assert _docgen("--root", str(root)).returncode == 0
    assert (root / "README.md").read_text(encoding="utf-8") == readme
