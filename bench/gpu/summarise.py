"""results.md from what bench/gpu/run.sh left in ``--out``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    lines = ["# GPU check (bench/gpu/run.sh)", ""]
    env = out / "env.txt"
    if env.exists():
        lines += ["```", env.read_text(encoding="utf-8").strip(), "```", ""]
    trace = out / "nvml-trace.jsonl"
    if trace.exists():
        records = trace.read_text(encoding="utf-8").splitlines()
        lines.append(f"NVML trace: {len(records) - 1} records (`nvml-trace.jsonl`).")
    record = out / "record.txt"
    if record.exists():
        lines += ["", "`record` summary:", "```", record.read_text().strip()[-3000:], "```"]
    timing = _json(out / "nvml-timing.json")
    if timing:
        lines += ["", f"NVML init {timing['init_ms']} ms, driver {timing['driver']}.", ""]
        lines += ["| GPU | call | median µs | p99 µs | max µs |", "|---|---|---|---|---|"]
        for gpu in timing["gpus"]:
            for call, t in gpu["calls"].items():
                lines.append(
                    f"| {gpu['index']} | {call} | {t['median_us']} | {t['p99_us']} "
                    f"| {t['max_us']} |"
                )
    drills = _json(out / "drills.json")
    if drills:
        lines += ["", "| drill | first ranked by diagnose / fired |", "|---|---|"]
        for name, result in drills.items():
            findings = result.get("findings") or (result.get("diagnose") or {}).get("findings")
            first = findings[0]["alert"] if findings else "nothing"
            fired = ", ".join(sorted(result.get("fired") or {}))
            lines.append(f"| {name} | {first}{' (fired: ' + fired + ')' if fired else ''} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
