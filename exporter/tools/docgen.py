"""Generate ``docs/metrics.md`` from the metric catalogue.

``python -m exporter.tools.docgen`` rewrites the file; ``--check`` exits 1 when it differs
(CI runs the check through the test suite).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exporter.metrics import CATALOGUE, UTILIZATION_BUCKETS, MetricSpec

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"

_COLLECTOR_TITLES = {
    "self": "Exporter (always on)",
    "nvml": "Collector `nvml`",
    "cpu": "Collector `cpu`",
    "engine": "Collector `engine`",
    "tokenizer": "Collector `tokenizer`",
    "process": "Collector `process`",
}


def _row(spec: MetricSpec) -> str:
    labels = ", ".join(f"`{label}`" for label in spec.labels) or "-"
    cells = [f"`{spec.name}`", spec.type, spec.unit or "-", labels, spec.help, spec.source or "-"]
    if spec.collector == "nvml":
        cells.append(spec.gpus or "-")
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def render() -> str:
    """The whole markdown document."""
    out = [
        "# Metrics",
        "",
        "Generated from `exporter/metrics.py` by `python -m exporter.tools.docgen`; do not edit.",
        "CI fails when this file differs from a fresh generation.",
        "",
        "Conventions: base units (seconds, bytes, watts, joules, hertz, celsius), ratios 0-1,",
        "counters end in `_total`. GPU series carry `gpu` (index) and `uuid`; identity details",
        "appear once, in `inference_gpu_info`. Prometheus adds the target labels (`pod`,",
        "`namespace`, `instance`). Every collector also reports",
        "`inference_scrape_collector_success{collector}` and",
        "`inference_scrape_collector_duration_seconds{collector}`; the process's own",
        "`process_*` and `python_info` come from prometheus_client.",
        "",
        f"`inference_gpu_utilization_samples` buckets: {', '.join(map(str, UTILIZATION_BUCKETS))}.",
        "",
    ]
    for collector, title in _COLLECTOR_TITLES.items():
        specs = [s for s in CATALOGUE if s.collector == collector]
        if not specs:
            continue
        out += [f"## {title}", ""]
        header = ["name", "type", "unit", "labels", "meaning", "source"]
        if collector == "nvml":
            header.append("GPUs")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        out += [_row(s) for s in specs]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            sys.stderr.write(f"{args.out} is out of date: run python -m exporter.tools.docgen\n")
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
