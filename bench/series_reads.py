"""What each rule of a pack reads, in series, and what that costs: a yardstick for the pack's
CPU that one Prometheus over a simulated fleet gives in minutes, and that is the same on a busy
machine (issue 33, docs/scale.md).

For every rule of the pack, each vector selector in its expression (with its range and offset)
is counted as Prometheus sees it: ``count(last_over_time(sel[range]))`` for a range,
``count(sel)`` for an instant read. A selector of a recorded name (one with a ``:``) reads the
pack's own output, any other the exporters' (raw) series. Each rule then runs as an instant
query ``--repeat`` times at one fixed time; Prometheus's own statistics give its evaluation time
(the fastest is kept). A least-squares fit of those times to the raw and recorded series read
(and the number of selectors) gives what one series read costs on this machine; the series
counts themselves depend on nothing but the pack and the fleet.

The output also lists the raw metric names the pack reads more than once per evaluation (the
reads a record could take over), and each group's totals.

Against a Prometheus already loaded with the pack and scraping a fleet::

    python bench/series_reads.py --url http://127.0.0.1:9090 --pack alert_rules/node

or a fleet and Prometheus of its own (``bench/fleet.py``'s simulator; every group at the
global 15 s; the records exist once their 10-minute windows hold data, hence the warm-up)::

    python bench/series_reads.py --gpus 2000 --layout node --pack alert_rules/node --warmup 11

Results go to ``bench/results/series-reads-<stamp>.json`` (and ``series-reads-latest.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine  # noqa: E402
from fleet import (  # noqa: E402
    Api,
    Scenario,
    _start_prometheus,
    _start_simulator,
    capture_all,
    pack_of,
)

from exporter.diagnose.promql_syntax import Node, Range, Selector, parse, source  # noqa: E402
from exporter.lab.processes import stop_process  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Read:
    """One vector selector of a rule, as written (range and offset included)."""

    text: str
    name: str
    ranged: bool

    @property
    def recorded(self) -> bool:
        return ":" in self.name

    @property
    def query(self) -> str:
        """The query that counts the series this read touches."""
        return f"count(last_over_time({self.text}))" if self.ranged else f"count({self.text})"


@dataclass(frozen=True)
class RuleReads:
    group: str
    name: str
    expr: str
    reads: tuple[Read, ...]


def selectors(expr: str) -> list[Read]:
    """The vector selectors of ``expr`` in the order written, each with its range."""
    found: list[Read] = []

    def name(selector: Selector) -> str:
        """Its metric name, or its ``__name__`` matcher's value (``{__name__=~"a|b"}``)."""
        if selector.name:
            return selector.name
        return next(m.value for m in selector.matchers if m.label == "__name__")

    def walk(node: Node) -> None:
        if isinstance(node, Range):
            found.append(Read(source(expr, node), name(node.selector), True))
            return
        if isinstance(node, Selector):
            found.append(Read(source(expr, node), name(node), False))
            return
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            for item in value if isinstance(value, tuple) else (value,):
                if isinstance(item, Node):
                    walk(item)

    walk(parse(expr))
    return found


def pack_rules(files: Sequence[Path]) -> list[RuleReads]:
    rules = []
    for path in files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                name = rule.get("record") or rule.get("alert")
                expr = rule["expr"]
                rules.append(RuleReads(group["name"], name, expr, tuple(selectors(expr))))
    return rules


def fit(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Least squares: a rule's milliseconds against the raw and recorded series it reads and
    its number of selectors. Returns microseconds per series, milliseconds per selector, R²."""
    x = np.array([[r["raw_series"], r["recorded_series"], r["selectors"]] for r in rows], float)
    y = np.array([r["cost_ms"] for r in rows], float)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    predicted = x @ coef
    spread = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float(((y - predicted) ** 2).sum()) / spread if spread else float("nan")
    return {
        "us_per_raw_series": float(coef[0]) * 1000,
        "us_per_recorded_series": float(coef[1]) * 1000,
        "ms_per_selector": float(coef[2]),
        "r2": r2,
    }


def measure(
    rules: Sequence[RuleReads],
    count: Callable[[str], int],
    cost: Callable[[str], float],
) -> dict[str, Any]:
    """Each rule's series reads (``count``: a query's answer) and cost (``cost``: a query's ms),
    the groups' totals, the raw names read more than once, and the fit."""
    counts: dict[str, int] = {}

    def series(read: Read) -> int:
        if read.query not in counts:
            counts[read.query] = count(read.query)
        return counts[read.query]

    rows: list[dict[str, Any]] = []
    for rule in rules:
        raw = sum(series(r) for r in rule.reads if not r.recorded)
        recorded = sum(series(r) for r in rule.reads if r.recorded)
        rows.append(
            {
                "group": rule.group,
                "rule": rule.name,
                "selectors": len(rule.reads),
                "raw_series": raw,
                "recorded_series": recorded,
                "cost_ms": cost(rule.expr),
            }
        )
    groups: dict[str, dict[str, float]] = {}
    for row in rows:
        total = groups.setdefault(
            row["group"],
            {"rules": 0, "selectors": 0, "raw_series": 0, "recorded_series": 0, "cost_ms": 0.0},
        )
        total["rules"] += 1
        for key in ("selectors", "raw_series", "recorded_series", "cost_ms"):
            total[key] += row[key]
    return {
        "rules": rows,
        "groups": groups,
        "total": {
            key: sum(g[key] for g in groups.values())
            for key in ("rules", "selectors", "raw_series", "recorded_series", "cost_ms")
        },
        "raw_read_again": read_again(rules, series),
        "fit": fit(rows),
    }


def read_again(rules: Sequence[RuleReads], series: Callable[[Read], int]) -> list[dict[str, Any]]:
    """Raw metric names read by more than one selector an evaluation: the series read in all
    and by how many rules, most reads first."""
    by_name: dict[str, list[tuple[RuleReads, Read]]] = {}
    for rule in rules:
        for read in rule.reads:
            if not read.recorded:
                by_name.setdefault(read.name, []).append((rule, read))
    out = [
        {
            "name": name,
            "selectors": len(uses),
            "rules": len({(rule.group, rule.name) for rule, _ in uses}),
            "series_read": sum(series(read) for _, read in uses),
            "groups": sorted({rule.group for rule, _ in uses}),
        }
        for name, uses in by_name.items()
        if len(uses) > 1
    ]
    return sorted(out, key=lambda d: -int(d["series_read"]))


def api_count(api: Api) -> Callable[[str], int]:
    def count(query: str) -> int:
        return int(api.scalar(query))

    return count


def api_cost(api: Api, at: float, repeat: int) -> Callable[[str], float]:
    """The fastest of ``repeat`` evaluations of a query at ``at``, by Prometheus's statistics."""

    def cost(query: str) -> float:
        times = []
        for _ in range(repeat):
            data = api.get("/api/v1/query", query=query, time=f"{at:.3f}", stats="all")["data"]
            times.append(float(data["stats"]["timings"]["evalTotalTime"]) * 1000)
        return min(times)

    return cost


@dataclass
class Started:
    processes: list[subprocess.Popen[bytes]]
    workdir: Path
    targets: int = 0

    def stop(self) -> None:
        for proc in reversed(self.processes):
            stop_process(proc, timeout=30)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start(args: argparse.Namespace, pack: Path, binary: str) -> tuple[Api, Started]:
    """A fleet of ``--gpus`` in ``--layout`` and a Prometheus loaded with the pack."""
    workdir = Path(tempfile.mkdtemp(prefix="series-reads-"))
    started = Started([], workdir)
    try:
        exposition = workdir / "exposition.json"
        exposition.write_text(json.dumps(capture_all(workdir)))
        scenario = Scenario(args.gpus, args.layout, "default", 0, 0, "healthy")
        started.targets = len(scenario.pods()) + len(scenario.agents())
        sim, targets, node_targets = _start_simulator(scenario, workdir / "sim", exposition)
        started.processes.append(sim)
        (workdir / "prom").mkdir()
        prom, api = _start_prometheus(
            workdir / "prom", targets, node_targets, pack_of(pack), binary
        )
        started.processes.append(prom)
    except BaseException:
        started.stop()
        raise
    return api, started


def warm_up(api: Api, started: Started, seconds: float) -> None:
    """Every target up (within 10 minutes), then ``seconds`` for the windows to fill."""
    deadline = time.monotonic() + 600
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
            if api.scalar("count(up == 1)") >= started.targets:
                break
        if time.monotonic() > deadline or any(p.poll() is not None for p in started.processes):
            raise RuntimeError(
                f"the fleet's {started.targets} targets are not up ({started.workdir})"
            )
        time.sleep(2)
    time.sleep(seconds)


def head_series(api: Api) -> int:
    """The series in Prometheus's head block, from its own /metrics."""
    for line in api.text("/metrics").splitlines():
        if line.startswith("prometheus_tsdb_head_series "):
            return int(float(line.split()[1]))
    return 0


def report(result: dict[str, Any]) -> Iterator[str]:
    yield "| group | rules | selectors | raw series read | recorded series read | ms |"
    yield "|---|---|---|---|---|---|"
    for name, g in result["groups"].items():
        yield (
            f"| `{name}` | {g['rules']} | {g['selectors']} | {g['raw_series']:,} | "
            f"{g['recorded_series']:,} | {g['cost_ms']:,.0f} |"
        )
    t = result["total"]
    yield (
        f"| all | {t['rules']} | {t['selectors']} | {t['raw_series']:,} | "
        f"{t['recorded_series']:,} | {t['cost_ms']:,.0f} |"
    )
    f = result["fit"]
    yield (
        f"fit: {f['us_per_raw_series']:.2f} us a raw series, {f['us_per_recorded_series']:.2f} us"
        f" a recorded one, {f['ms_per_selector']:.3f} ms a selector (R² {f['r2']:.2f})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--pack", type=Path, required=True, help="a pack's directory")
    parser.add_argument("--url", help="a Prometheus loaded with the pack (else one is started)")
    parser.add_argument("--gpus", type=int, default=2000)
    parser.add_argument("--layout", choices=("sidecar", "node", "dcgm"), default="node")
    parser.add_argument(
        "--warmup",
        type=float,
        default=11.0,
        help="minutes before measuring (the records' 10-minute windows and cold-start guard)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="evaluations of each rule")
    parser.add_argument("--prometheus", default="prometheus")
    parser.add_argument("--label", default="")
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help=f"where to write (default {RESULTS})"
    )
    args = parser.parse_args(argv)
    if not (args.pack / "recording_rules.yaml").is_file():
        print(f"--pack {args.pack}: no recording_rules.yaml there", file=sys.stderr)
        return 2
    if args.repeat < 1 or args.gpus < 1:
        print("--repeat and --gpus must be at least 1", file=sys.stderr)
        return 2
    started_at = dt.datetime.now(dt.UTC)
    running: Started | None = None
    if args.url:
        api = Api(args.url.rstrip("/"))
    else:
        binary = shutil.which(args.prometheus)
        if binary is None:
            print(f"{args.prometheus} not found: apt-get install prometheus", file=sys.stderr)
            return 2
        api, running = start(args, args.pack, binary)
        print(f"warming up for {args.warmup:g} minutes", flush=True)
    try:
        if running is not None:
            warm_up(api, running, args.warmup * 60)
        rules = pack_rules(pack_of(args.pack).files)
        at = time.time()
        result = measure(rules, api_count(api), api_cost(api, at, args.repeat))
        series = head_series(api)
    finally:
        if running is not None:
            running.stop()
    out = {
        "started": started_at.isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/series_reads.py", *(argv or sys.argv[1:])]),
        "machine": machine(),
        "pack": str(args.pack),
        "fleet": None if args.url else {"gpus": args.gpus, "layout": args.layout},
        "head_series": series,
        "measured_at": at,
        "median_rule_ms": statistics.median(r["cost_ms"] for r in result["rules"]),
        **result,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = started_at.strftime("%Y%m%dT%H%M%SZ")
    name = f"series-reads-{args.label}-{stamp}" if args.label else f"series-reads-{stamp}"
    for path in (args.out / f"{name}.json", args.out / "series-reads-latest.json"):
        path.write_text(json.dumps(out, indent=2) + "\n")
    print("\n".join(report(result)))
    if result["total"]["recorded_series"] == 0:
        print(
            "series_reads: no record of the pack has a series yet (a longer --warmup): "
            "the fit's recorded term means nothing",
            file=sys.stderr,
        )
    print(f"wrote {args.out / f'{name}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
