"""Every metric an engine says it exports is read by its rules or left out with a reason.

Each engine's own list of its metrics is vendored at a named commit in
``tests/fixtures/upstream/`` (line one names repository, path and commit; then name, type,
help). A new upstream release is one file to replace: these tests then name each metric that
appeared (to map, or to leave out with a reason in the engine's ``left_out``) and each one
left out that is gone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter.engines import BY_ENGINE, source_keys
from exporter.engines.scan import family_key
from exporter.engines.spec import EngineSpec

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "tests" / "fixtures" / "upstream"
#: Vendored catalogue -> the engine whose rules read it.
CATALOGUES = {
    "vllm.tsv": "vllm",
    "sglang.tsv": "sglang",
    "tensorrt-llm.tsv": "trtllm",
    "dynamo-frontend.tsv": "dynamo",
    "llm-d-router.tsv": "llmd-epp",
}
_SOURCE = re.compile(r"# source: \S+/\S+ \S+ @[0-9a-f]{40}\b")


def catalogue(name: str) -> list[str]:
    """The metric names of a vendored catalogue."""
    lines = (UPSTREAM / name).read_text(encoding="utf-8").splitlines()
    assert _SOURCE.match(lines[0]), f"{name}: line one must name repository, path and commit"
    names = [line.split("\t")[0] for line in lines[1:] if line.strip()]
    assert len(names) == len(set(names)), name
    return names


def coverage(names: list[str], spec: EngineSpec) -> tuple[list[str], list[str], list[str]]:
    """(neither read nor left out, left out but read anyway, left out but not upstream)."""
    keys = source_keys(spec.name)
    read = {n for n in names if n in keys or family_key(n) in keys}
    left = {family_key(n) for n, _ in spec.left_out}
    upstream = {family_key(n) for n in names}
    neither = sorted(n for n in names if n not in read and family_key(n) not in left)
    both = sorted(n for n in read if family_key(n) in left)
    gone = sorted(n for n, _ in spec.left_out if family_key(n) not in upstream)
    return neither, both, gone


@pytest.mark.parametrize(("name", "engine"), sorted(CATALOGUES.items()))
def test_every_upstream_metric_is_read_or_left_out_with_its_reason(name: str, engine: str) -> None:
    spec = BY_ENGINE[engine]
    neither, both, gone = coverage(catalogue(name), spec)
    assert not neither, (
        f"{engine}: {name} lists metrics no rule reads and left_out does not name (map them, "
        f"or leave them out with a reason): {neither}"
    )
    assert not both, f"{engine}: read by a rule and left out too: {both}"
    assert not gone, f"{engine}: left out, but {name} no longer lists them: {gone}"
    assert all(reason.strip() for _, reason in spec.left_out)


def test_a_new_upstream_metric_is_named_by_the_test() -> None:
    """What a new release does: a metric the catalogue gains fails the check by its name."""
    spec = BY_ENGINE["vllm"]
    names = [*catalogue("vllm.tsv"), "vllm:brand_new_total"]
    neither, _, gone = coverage(names, spec)
    assert neither == ["vllm:brand_new_total"] and gone == []
    dropped = [n for n in catalogue("vllm.tsv") if n != "vllm:lora_requests_info"]
    assert coverage(dropped, spec)[2] == ["vllm:lora_requests_info"]


def test_only_engines_with_a_catalogue_leave_metrics_out() -> None:
    """A reason to leave a metric out is checked against the engine's own list."""
    for spec in BY_ENGINE.values():
        assert not spec.left_out or spec.name in CATALOGUES.values(), spec.name


# --- dcgm-exporter: what the dcgm profile reads --------------------------------------------------

DCGM_DEFAULTS = "dcgm-exporter-4.8-default-counters.csv"
#: dcgm-exporter 4.10's default counters: 4.8's with the renames of 4.9.0 and 4.10.0
#: (hand-written; tests/signatures/test_dcgm_generations.py checks each generation).
DCGM_DEFAULTS_4_10 = "dcgm-exporter-4.10-default-counters-handwritten.csv"
#: Fields the dcgm profile reads that dcgm-exporter does not export by default: a counters
#: file of one's own must add them (the clock-event reasons under either name, SM activity, a
#: profiling field, under either generation's name; the NVLink profiling fields that
#: InferenceInterconnectBound reads, in both the counter and the per-second form; the enforced
#: power limit that names a throttle's cause).
NOT_BY_DEFAULT = {
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_UTIL_RATIO",
}


def test_the_dcgm_profile_reads_dcgm_exporter_s_default_counters() -> None:
    lines = (UPSTREAM / DCGM_DEFAULTS).read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# source: NVIDIA/dcgm-exporter etc/default-counters.csv @")
    newer = (UPSTREAM / DCGM_DEFAULTS_4_10).read_text(encoding="utf-8").splitlines()
    defaults = {
        line.split(",")[0].strip() for line in (*lines[1:], *newer[1:]) if line.startswith("DCGM")
    }
    assert len(defaults) >= 40
    rules = "".join(p.read_text() for p in sorted((ROOT / "alert_rules" / "dcgm").glob("*.yaml")))
    read = set(re.findall(r"\bDCGM_[A-Z0-9_]+\b", rules))
    assert read, "the dcgm profile reads no DCGM field"
    assert read - defaults == NOT_BY_DEFAULT
