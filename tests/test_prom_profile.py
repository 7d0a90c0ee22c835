"""The fleet benchmark's reading of Prometheus's CPU profile (``bench/prom_profile.py``): a
profile is decoded and each sample's CPU given to the part of Prometheus its stack names.

The profiles are written here with the protobuf wire format of pprof's ``profile.proto`` (the
fields the decoder reads, plus ones it must skip), not captured: the decoder is checked against
the format, the split against stacks chosen to hit each rule.
"""

from __future__ import annotations

import gzip

import pytest
from support.paths import bench_script

prom_profile = bench_script("prom_profile", "prom_profile")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _packed(values: list[int]) -> bytes:
    return b"".join(_varint(v) for v in values)


def _profile(stacks: list[tuple[list[str], int]], *, packed: bool = True) -> bytes:
    """A CPU profile: each stack (function names, innermost first) with its nanoseconds."""
    strings = ["", "samples", "count", "cpu", "nanoseconds"]
    functions: dict[str, int] = {}
    body = bytearray()
    # sample_type: samples/count, cpu/nanoseconds
    body += _field(1, _field(1, 1) + _field(2, 2))
    body += _field(1, _field(1, 3) + _field(2, 4))
    for names, nanoseconds in stacks:
        ids = []
        for name in names:
            if name not in functions:
                functions[name] = len(functions) + 1
                strings.append(name)
            ids.append(functions[name])
        if packed:
            sample = _field(1, _packed(ids)) + _field(2, _packed([1, nanoseconds]))
        else:
            sample = b"".join(_field(1, i) for i in ids)
            sample += _field(2, 1) + _field(2, nanoseconds)
        body += _field(2, sample)
    for name, fid in functions.items():
        # one location per function (id = function id), one line; a mapping and an address
        # the decoder skips
        line = _field(1, fid) + _field(2, 42)
        body += _field(4, _field(1, fid) + _field(2, 1) + _field(3, 0x4000 + fid) + _field(4, line))
        body += _field(5, _field(1, fid) + _field(2, strings.index(name)) + _field(4, 0))
    body += _field(3, _field(1, 1) + _field(2, 0x400000))  # a mapping
    for text in strings:
        body += _field(6, text.encode())
    body += _field(9, 1_700_000_000_000_000_000)  # time_nanos
    body += _field(10, 30_000_000_000)  # duration_nanos
    body += _field(12, 10_000_000)  # period
    return bytes(body)


RULE = "github.com/prometheus/prometheus/rules.(*Group).Eval"
QUERY = "github.com/prometheus/prometheus/promql.(*Engine).exec"
SCRAPE = "github.com/prometheus/prometheus/scrape.(*scrapeLoop).run"
API = "github.com/prometheus/prometheus/web/api/v1.(*API).query"
COMPACT = "github.com/prometheus/prometheus/tsdb.(*DB).Compact"
STACKS = [
    ([QUERY, RULE, "runtime.goexit"], 50_000_000),  # a rule's query
    ([QUERY, API, "net/http.(*conn).serve"], 7_000_000),  # the benchmark's own query
    (["runtime.mallocgc", SCRAPE], 20_000_000),
    ([COMPACT, "runtime.goexit"], 3_000_000),
    (["runtime.scanobject", "runtime.gcBgMarkWorker"], 9_000_000),
    (["runtime.futex", "runtime.mstart"], 1_000_000),
]


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("zipped", [True, False], ids=["gzip", "plain"])
def test_each_part_gets_the_cpu_of_its_stacks(packed: bool, zipped: bool) -> None:
    raw = _profile(STACKS, packed=packed)
    profile = prom_profile.parse(gzip.compress(raw) if zipped else raw)
    assert profile.duration_ns == 30_000_000_000
    assert len(profile.samples) == len(STACKS)
    parts = prom_profile.parts(profile)
    assert parts == pytest.approx(
        {
            "rules": 0.050,
            "query": 0.007,
            "scrape": 0.020,
            "tsdb": 0.003,
            "gc": 0.009,
            "other": 0.001,
        }
    )


def test_the_outermost_part_decides_and_gc_comes_first() -> None:
    # A rule's query that appends to the TSDB is the rule's; GC assists inside a scrape are
    # the garbage collector's.
    assert (
        prom_profile.part_of(["github.com/prometheus/prometheus/tsdb.(*headAppender).Append", RULE])
        == "rules"
    )
    assert prom_profile.part_of(["runtime.gcBgMarkWorker", SCRAPE]) == "gc"
    assert prom_profile.part_of(["main.main"]) == "other"
