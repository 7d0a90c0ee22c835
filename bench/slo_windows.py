"""What the SLO records cost once Prometheus holds their whole period.

``bench/fleet.py`` measures a Prometheus started minutes before: the SLO records' long windows
(1d, 3d, the 28-day budget) then read minutes of data, not days. This benchmark writes the
period's history of the SLO base records (``inference_pool:slo_<sli>_good:rate5m`` and
``..._total:rate5m``, one series per objective and pool, a sample every ``--step`` seconds over
the period and a margin) into a TSDB with ``promtool tsdb create-blocks-from openmetrics``,
starts Prometheus on it (the lab's, with no scrape and no rule), and times each rule of the
SLO groups of each pack as an instant query at the end of the history (median of
``--repeat``, after one warm-up): what one evaluation of the rule costs then. Per group it
adds the rules up and multiplies by the group's evaluations per minute (its own ``interval``,
else ``--evaluation-interval``): the CPU the group takes a minute, one core's worth.

    python bench/slo_windows.py [--pools 20] [--step 15] [--evaluation-interval 15] \\
        [--pack LABEL=DIR ...]          # default: node=alert_rules/node

Every pack is measured against the same TSDB, its packs taking turns rule by rule. Results:
JSON in ``bench/results/`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import common as c
import yaml

from exporter.config import format_duration, parse_duration
from exporter.lab import processes

DAY = 86400
#: The SLO record groups (``exporter/signatures/slo/slo_signals.py``).
SLO_GROUP_PREFIX = "inference.records.slo"
_BASE = re.compile(r"^inference_pool:slo_\w+_(good|total):rate\w+$")
_BY = re.compile(r"sum by \(([^)]*)\)")
#: A fixed end of the history (2026-12-03), so reruns read the same data.
END_S = 1796400000


@dataclass(frozen=True)
class Rule:
    group: str
    interval_s: float
    record: str
    expr: str


@dataclass(frozen=True)
class Pack:
    label: str
    rules: tuple[Rule, ...]


def load_pack(label: str, directory: Path, default_interval_s: float) -> Pack:
    """The SLO groups' rules of the pack in ``directory`` (its ``recording_rules.yaml``)."""
    doc = yaml.safe_load((directory / "recording_rules.yaml").read_text())
    rules = []
    for group in doc["groups"]:
        if not group["name"].startswith(SLO_GROUP_PREFIX):
            continue
        own = group.get("interval")
        interval = parse_duration(own) if own else default_interval_s
        rules += [Rule(group["name"], interval, r["record"], r["expr"]) for r in group["rules"]]
    if not rules:
        raise ValueError(f"{directory}: no rule group {SLO_GROUP_PREFIX}* (no SLO objectives?)")
    return Pack(label, tuple(rules))


def base_series(directory: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    """Each base record: its name, the labels it is summed by, its static labels."""
    doc = yaml.safe_load((directory / "recording_rules.yaml").read_text())
    out = []
    for group in doc["groups"]:
        for r in group["rules"]:
            if "record" in r and _BASE.match(r["record"]):
                found = _BY.search(r["expr"])
                by = [x.strip() for x in found.group(1).split(",")] if found else []
                out.append((r["record"], by, dict(r.get("labels") or {})))
    return out


def write_openmetrics(
    path: Path,
    bases: Sequence[tuple[str, list[str], dict[str, str]]],
    pools: int,
    days: float,
    step_s: int,
) -> int:
    """The history of every base record for ``pools`` pools: a busy pool's rates, its good
    events 99 % of all; returns the samples written."""
    n = int(days * DAY / step_s)
    start = END_S - n * step_s
    written = 0
    with path.open("w") as out:
        for name, by, static in bases:
            good = "_good:" in name
            for p in range(pools):
                labels = {k: f"{k}-{p:03d}" for k in by} | static
                text = ",".join(f'{k}="{v}"' for k, v in labels.items())
                rate = 10.0 + p
                chunk = []
                for i in range(n):
                    value = rate * (1 + 0.1 * (i % 97) / 97) * (0.99 if good else 1.0)
                    chunk.append(f"{name}{{{text}}} {value:.4f} {start + i * step_s}\n")
                out.write("".join(chunk))
                written += n
        out.write("# EOF\n")
    return written


def query_s(base: str, expr: str, at: float) -> tuple[float, int]:
    params = urllib.parse.urlencode({"query": expr, "time": f"{at:g}", "stats": "all"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"{base}/api/v1/query?{params}", timeout=600) as response:
        data = json.loads(response.read())["data"]
    elapsed = time.perf_counter() - t0
    samples = data.get("stats", {}).get("samples", {}).get("totalQueryableSamples", 0)
    return elapsed, int(samples)


def measure(base: str, packs: Sequence[Pack], repeat: int, at: float) -> dict[str, Any]:
    """Each pack's rules timed, the packs taking turns rule by rule."""
    times: dict[tuple[str, int], list[float]] = {}
    samples: dict[tuple[str, int], int] = {}
    longest = max(len(p.rules) for p in packs)
    for i in range(longest):
        for pack in packs:
            if i >= len(pack.rules):
                continue
            query_s(base, pack.rules[i].expr, at)  # warm-up
            for _ in range(repeat):
                t, s = query_s(base, pack.rules[i].expr, at)
                times.setdefault((pack.label, i), []).append(t)
                samples[(pack.label, i)] = s
    out: dict[str, Any] = {}
    for pack in packs:
        groups: dict[str, dict[str, Any]] = {}
        for i, rule in enumerate(pack.rules):
            ms = 1000 * statistics.median(times[(pack.label, i)])
            g = groups.setdefault(
                rule.group, {"interval_s": rule.interval_s, "ms_per_evaluation": 0.0, "rules": []}
            )
            g["ms_per_evaluation"] += ms
            g["rules"].append(
                {"record": rule.record, "ms": round(ms, 2), "samples": samples[(pack.label, i)]}
            )
        for g in groups.values():
            g["ms_per_minute"] = g["ms_per_evaluation"] * 60 / g["interval_s"]
        out[pack.label] = {
            "groups": groups,
            "ms_per_minute": sum(g["ms_per_minute"] for g in groups.values()),
        }
    return out


def _timed_on_history(
    work: Path, packs: Sequence[Pack], repeat: int, step_s: int
) -> dict[str, Any]:
    """Prometheus over ``work``'s TSDB, no scrape, no rule: every pack's rules timed on it."""
    server = processes.start_prometheus(
        work,
        {"global": {}},
        args=("--log.level=warn", "--storage.tsdb.retention.time=400d"),
        data=work / "tsdb",
        timeout=120.0,
    )
    try:
        return measure(server.url, packs, repeat, END_S - step_s)
    finally:
        server.stop()


def _pack_arg(text: str) -> tuple[str, Path]:
    label, _, directory = text.partition("=")
    if not label or not directory or not (Path(directory) / "recording_rules.yaml").is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: LABEL=DIR with DIR/recording_rules.yaml")
    return label, Path(directory)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", type=int, default=20)
    parser.add_argument("--step", type=int, default=15, help="seconds between the records' samples")
    parser.add_argument("--evaluation-interval", type=float, default=15.0, help="global, seconds")
    parser.add_argument(
        "--days", type=float, default=28.5, help="history (the period and a margin)"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pack", type=_pack_arg, action="append", default=[])
    args = parser.parse_args(argv)
    specs = args.pack or [("node", c.ROOT / "alert_rules" / "node")]
    try:
        packs = [load_pack(label, d, args.evaluation_interval) for label, d in specs]
    except (ValueError, OSError, KeyError) as err:
        print(f"slo_windows: {err}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="slo-windows-"))
    try:
        om = work / "history.om"
        written = write_openmetrics(om, base_series(specs[0][1]), args.pools, args.days, args.step)
        subprocess.run(
            [
                shutil.which("promtool") or "promtool",
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                f"--max-block-duration={int(args.days * 24) + 24}h",
                str(om),
                str(work / "tsdb"),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        om.unlink()
        result = _timed_on_history(work, packs, args.repeat, args.step)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": c.machine(),
        "pools": args.pools,
        "step_s": args.step,
        "days": args.days,
        "samples_written": written,
        "evaluation_interval_s": args.evaluation_interval,
        "packs": result,
    }
    c.RESULTS.mkdir(parents=True, exist_ok=True)
    out = c.RESULTS / f"slo-windows-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"{args.pools} pools, {args.days:g} days of history every {args.step} s; {out}")
    print("| pack | group | every | ms per evaluation | ms of CPU per minute |")
    print("|---|---|---|---|---|")
    for label, r in result.items():
        for name, g in r["groups"].items():
            print(
                f"| {label} | `{name}` | {format_duration(g['interval_s'])} | "
                f"{g['ms_per_evaluation']:,.1f} | {g['ms_per_minute']:,.0f} |"
            )
        print(f"| {label} | all | | | **{r['ms_per_minute']:,.0f}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
