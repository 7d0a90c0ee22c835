"""Where a Prometheus spends its CPU: its own CPU profile (Go's pprof, ``/debug/pprof/profile``)
split into rule evaluation, scraping, the TSDB and the garbage collector.

The rule groups' ``prometheus_rule_group_last_duration_seconds`` are wall-clock times: on a
loaded machine they hold the time a group waited for a core, and groups run side by side. The
profile counts CPU only: each sample is one 10 ms tick of a core, with the stack that used it.

A sample's part is the first of these its stack holds, from the innermost frame out:

* ``gc``: the Go runtime's background marking and sweeping (``runtime.gcBgMarkWorker``,
  ``runtime.bgsweep``, ``runtime.bgscavenge``), which every part's allocations cause;
* ``rules``: ``github.com/prometheus/prometheus/rules.`` (groups, recording and alerting rules,
  the queries they run);
* ``scrape``: ``github.com/prometheus/prometheus/scrape.`` (scrape loops, parsing, appending);
* ``query``: ``github.com/prometheus/prometheus/web`` (HTTP API queries: the benchmark's own);
* ``tsdb``: ``github.com/prometheus/prometheus/tsdb.`` (head compaction, WAL, GC of series);
* ``other``: everything else.

The profile is decoded here (the wire format of ``profile.proto``, the fields it needs), so
the benchmark needs neither Go nor the pprof tool.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass

PARTS = ("rules", "scrape", "query", "tsdb", "gc", "other")
_GC = ("runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge")
_PACKAGES = (
    ("rules", "github.com/prometheus/prometheus/rules."),
    ("scrape", "github.com/prometheus/prometheus/scrape."),
    ("query", "github.com/prometheus/prometheus/web"),
    ("tsdb", "github.com/prometheus/prometheus/tsdb."),
)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one protobuf message: an int for varints, bytes for
    length-delimited fields (fixed-width fields are skipped: the profile has none that matter
    here)."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            yield number, data[pos : pos + length]
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _ints(value: int | bytes) -> list[int]:
    """A repeated integer field: packed (bytes) or one varint."""
    if isinstance(value, int):
        return [value]
    out, pos = [], 0
    while pos < len(value):
        item, pos = _varint(value, pos)
        out.append(item)
    return out


@dataclass(frozen=True)
class Profile:
    """A CPU profile reduced to what :func:`parts` needs."""

    samples: list[tuple[list[int], int]]  # (location ids, innermost first; CPU nanoseconds)
    functions: dict[int, list[str]]  # location id -> function names, innermost first
    duration_ns: int


def parse(raw: bytes) -> Profile:
    """A pprof CPU profile (gzipped or not)."""
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    strings: list[str] = []
    samples: list[tuple[list[int], list[int]]] = []
    locations: dict[int, list[int]] = {}  # location id -> function ids
    names: dict[int, int] = {}  # function id -> string index
    duration = 0
    for number, value in _fields(data):
        if number == 2 and isinstance(value, bytes):  # Sample
            ids: list[int] = []
            values: list[int] = []
            for n, v in _fields(value):
                if n == 1:
                    ids += _ints(v)
                elif n == 2:
                    values += _ints(v)
            samples.append((ids, values))
        elif number == 4 and isinstance(value, bytes):  # Location
            loc_id, funcs = 0, []
            for n, v in _fields(value):
                if n == 1 and isinstance(v, int):
                    loc_id = v
                elif n == 4 and isinstance(v, bytes):  # Line
                    funcs += [fv for fn, fv in _fields(v) if fn == 1 and isinstance(fv, int)]
            locations[loc_id] = funcs
        elif number == 5 and isinstance(value, bytes):  # Function
            fields = {n: v for n, v in _fields(value) if isinstance(v, int)}
            names[fields.get(1, 0)] = fields.get(2, 0)
        elif number == 6 and isinstance(value, bytes):  # string_table
            strings.append(value.decode("utf-8", "replace"))
        elif number == 10 and isinstance(value, int):  # duration_nanos
            duration = value
    functions = {loc: [strings[names.get(f, 0)] for f in funcs] for loc, funcs in locations.items()}
    # A CPU profile's values are (samples/count, cpu/nanoseconds): the last is the CPU time.
    return Profile([(ids, values[-1]) for ids, values in samples], functions, duration)


def part_of(stack: list[str]) -> str:
    """The part (:data:`PARTS`) of one stack of function names, innermost first."""
    if any(name.startswith(_GC) for name in stack):
        return "gc"
    for name in reversed(stack):  # the outermost frame that names a part decides
        for part, prefix in _PACKAGES:
            if name.startswith(prefix):
                return part
    return "other"


def parts(profile: Profile) -> dict[str, float]:
    """CPU seconds per part (:data:`PARTS`) over the profile."""
    out = dict.fromkeys(PARTS, 0.0)
    for ids, nanoseconds in profile.samples:
        stack = [name for loc in ids for name in profile.functions.get(loc, [])]
        out[part_of(stack)] += nanoseconds / 1e9
    return out
