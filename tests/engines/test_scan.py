"""The engine poll's fast path (``exporter.engines.scan``) against prometheus_client's parser.

The reference is what the poll did before: keep the read families' lines
(``select_families``), parse them with prometheus_client (``parse_exposition``: merged,
cleaned) and index the samples (``index_samples``). The fast path must give the same index,
the same family and sample names, and fail (``ValueError``) exactly when the reference fails:
on every fixture, with every family kept, and on fuzzed expositions.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.engines import parse_exposition, poll_keys, select_families
from exporter.engines.rules import SampleIndex, index_samples
from exporter.engines.scan import Scanned, family_key, scan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
ALL_FIXTURES = sorted(p.name for p in FIXTURES.glob("*.txt"))
KEYS = poll_keys()

settings.register_profile(
    "ci", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "nightly", max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def reference(text: str, keys: frozenset[str]) -> Scanned:
    selected, families, samples = select_families(text, keys)
    return Scanned(dict(index_samples(parse_exposition(selected))), families, samples)


def same(a: SampleIndex, b: SampleIndex) -> bool:
    """Equal indexes, NaN-free by construction; -0.0 and 0.0 told apart."""
    if a.keys() != b.keys():
        return False
    for name in a:
        if a[name].keys() != b[name].keys():
            return False
        for labels, value in a[name].items():
            other = b[name][labels]
            if value != other or math.copysign(1, value) != math.copysign(1, other):
                return False
    return True


def check(text: str, keys: frozenset[str] = KEYS) -> Scanned | None:
    """Both paths agree; the fast result (None when both refused the text)."""
    try:
        expected = reference(text, keys)
    except ValueError:
        with pytest.raises(ValueError):
            scan(text, keys)
        return None
    got = scan(text, keys)
    assert same(got.index, expected.index), (got.index, expected.index)
    assert got.families == expected.families
    assert got.samples == expected.samples
    return got


@pytest.mark.parametrize("fixture", ALL_FIXTURES)
def test_every_fixture_takes_the_fast_path_and_matches(fixture: str) -> None:
    text = (FIXTURES / fixture).read_text(encoding="utf-8")
    got = check(text)
    assert got is not None and got.fast


@pytest.mark.parametrize("fixture", ALL_FIXTURES)
def test_every_fixture_read_whole_matches_the_full_parse(fixture: str) -> None:
    text = (FIXTURES / fixture).read_text(encoding="utf-8")
    every = frozenset(
        key for family in parse_exposition(text) for s in family.samples for key in (s.name,)
    )
    keys = frozenset(every | {family_key(n) for n in every})
    got = check(text, keys)
    assert got is not None
    assert same(got.index, dict(index_samples(parse_exposition(text))))


@pytest.mark.parametrize(
    "text",
    [
        # shapes the fast path leaves to prometheus_client, each still read the same way
        'vllm:num_requests_waiting{ model_name = "m" } 1\n',
        'vllm:num_requests_waiting{model_name="m"}\t2\n',
        'vllm:num_requests_waiting{model_name="a\\\\b\\"c\\nd\\te"} 3\n',
        'vllm:num_requests_waiting{,model_name="m"} 4\n',
        "vllm:num_requests_waiting 1_000\n",
        "vllm:num_requests_waiting 0x10\n",
        "vllm:num_requests_waiting nan\n",
        "vllm:num_requests_waiting 1 2 3\n",
        "vllm:num_requests_waiting " + "9" * 400 + "\n",
        "vllm:num_requests_waiting -0\n",
        'vllm:num_requests_waiting{model_name="m",model_name="n"} 1\n',
        'vllm:num_requests_waiting{__name__="x"} 1\n',
        'vllm:num_requests_waiting{model_name="m"b="c"} 1\n',
        "# TYPE vllm:num_requests_waiting bogus\nvllm:num_requests_waiting 1\n",
        "# TYPE vllm:num_requests_waiting counter extra\nvllm:num_requests_waiting 1\n",
        "# TYPE vllm:num_requests_waiting\n",
        '# HELP "vllm:num_requests_waiting" quoted\nvllm:num_requests_waiting 1\n',
        "# TYPE _total counter\n_total 1\n",
        # family grouping: counters renamed, samples outside the family, split families
        "# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens 5\nvllm:prompt_tokens_total 7\n",
        "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total 1\n"
        "vllm:num_requests_waiting 2\nvllm:prompt_tokens_total 3\n"
        "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total 4\n",
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{le="1.0"} NaN\n'
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 1\n'
        "vllm:e2e_request_latency_seconds_sum 1\n"
        "vllm:e2e_request_latency_seconds_count 1\n"
        "vllm:e2e_request_latency_seconds_created 1\n",
        "# HELP vllm:num_requests_waiting a\n# TYPE vllm:num_requests_waiting gauge\n"
        "# HELP vllm:num_requests_waiting b\nvllm:num_requests_waiting 1\n",
    ],
)
def test_unusual_shapes_agree(text: str) -> None:
    check(text)


def test_a_malformed_kept_line_fails_like_the_reference() -> None:
    with pytest.raises(ValueError, match=r"^malformed exposition"):
        scan('vllm:num_requests_waiting{model_name="m} 1\n', KEYS)


def test_lines_of_unread_families_are_never_decoded() -> None:
    # garbage in a family no adapter reads: the poll still works, as before
    got = check('python_info{version="3.11 1\nvllm:num_requests_waiting 2\n')
    assert got is not None and got.fast
    assert got.index == {"vllm:num_requests_waiting": {(): 2.0}}
    assert "python_info" in got.samples


# --- fuzzing -------------------------------------------------------------------------------------

NAMES = [
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens",
    "vllm:e2e_request_latency_seconds",
    "sglang:num_queue_reqs",
    "nv_inference_request_success",
    "tgi_request_duration",
    "num_requests_running",
    "trtllm_kv_cache_utilization",
    "python_gc_objects_collected",
    "_total",
]
SUFFIXES = ["", "", "_total", "_bucket", "_sum", "_count", "_created", "_info"]
KINDS = ["gauge", "counter", "histogram", "summary", "untyped", "unknown", "info", "bogus"]
LABELS = ["model_name", "model", "le", "quantile", "engine", "tp_rank", "__name__", "_", "a:b"]
SIMPLE_VALUES = st.sampled_from(
    ["0", "1", "-0", "2.5", "1e3", "1E-2", "+Inf", "-Inf", "NaN", ".5", "5.", "007", "+3"]
)
ODD_VALUES = st.sampled_from(["nan", "inf", "0x10", "1_0", "1e400", "", "1 2", "1\t2", "x"])
LABEL_VALUES = st.one_of(
    st.sampled_from(["m", "0", "+Inf", "1.0", 'a\\"b', "a\\\\", "a\\nb", "a\\tb", "}", ","]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6).map(
        lambda v: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    ),
)


@st.composite
def sample_line(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(NAMES)) + draw(st.sampled_from(SUFFIXES))
    pairs = draw(st.lists(st.tuples(st.sampled_from(LABELS), LABEL_VALUES), max_size=3))
    value = draw(st.one_of(SIMPLE_VALUES, SIMPLE_VALUES, ODD_VALUES))
    space = draw(st.sampled_from([" ", " ", " ", "  ", "\t"]))
    ts = draw(st.sampled_from(["", "", " 1700000000000", " -5"]))
    if not pairs and draw(st.booleans()):
        return f"{name}{space}{value}{ts}"
    comma = draw(st.sampled_from([",", ",", ", "]))
    body = comma.join(f'{k}="{v}"' for k, v in pairs) + draw(st.sampled_from(["", "", ","]))
    return f"{name}{{{body}}}{space}{value}{ts}"


@st.composite
def comment_line(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(NAMES)) + draw(st.sampled_from(SUFFIXES))
    if draw(st.booleans()):
        return f"# TYPE {name} {draw(st.sampled_from(KINDS))}"
    help_text = draw(st.sampled_from(["", "help text", 'with "quotes"']))
    return f"# HELP {name} {help_text}"


@given(st.lists(st.one_of(sample_line(), sample_line(), comment_line()), max_size=40))
def test_structured_expositions_agree(lines: list[str]) -> None:
    check("\n".join(lines) + "\n")


@given(st.lists(st.one_of(sample_line(), comment_line()), max_size=25))
def test_structured_expositions_read_whole_agree(lines: list[str]) -> None:
    keys = frozenset(n + s for n in NAMES for s in SUFFIXES) | frozenset(NAMES)
    check("\n".join(lines) + "\n", keys)


@given(st.text(max_size=400))
def test_random_text_agrees(text: str) -> None:
    check(text)


@given(st.binary(max_size=1024))
def test_random_bytes_agree(data: bytes) -> None:
    check(data.decode("utf-8", errors="replace"))
