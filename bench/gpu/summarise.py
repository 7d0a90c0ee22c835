"""results.md from what bench/gpu/run.sh left in ``--out``."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

# What each drill's GPU readings table shows, in order (tests/drills/harness.py GPU_SIGNALS).
SIGNAL_COLUMNS = (
    ("gpu_util", "GPU util"),
    ("engine_own_util", "engine's own"),
    ("sm_active", "SM active"),
    ("hbm_util", "HBM"),
    ("memory_used_ratio", "memory used"),
    ("decode_efficiency", "decode roofline eff."),
    ("itl_ms", "ITL ms"),
    ("decode_floor_ms", "decode floor ms"),
    ("generation_tokens_per_s", "tokens/s"),
)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _environment(out: Path) -> list[str]:
    try:
        lines = (out / "run.log").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    if "## environment" not in lines:
        return []
    block = lines[lines.index("## environment") + 1 :]
    block = block[: next((i for i, line in enumerate(block) if line.startswith("[")), len(block))]
    return ["```", *block, "```", ""]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _timing(timing: dict[str, Any]) -> list[str]:
    lines = ["", f"NVML init {timing['init_ms']} ms, driver {timing['driver']}.", ""]
    lines += ["| GPU | call | median µs | p99 µs | max µs | error |", "|---|---|---|---|---|---|"]
    for gpu in timing["gpus"]:
        for call, t in gpu["calls"].items():
            lines.append(
                f"| {gpu['index']} | {call} | {t['median_us']} | {t['p99_us']} "
                f"| {t['max_us']} | {t.get('error') or ''} |"
            )
    for gpu in timing["gpus"]:
        lines += _links(gpu)
    for probe in timing.get("probe", []):
        polls = probe["polls"]
        device = [p["device"]["samples"] for p in polls if "samples" in p.get("device", {})]
        process = [p["process"]["samples"] for p in polls if "samples" in p.get("process", {})]
        pids = sorted({pid for p in polls for pid in p.get("process", {}).get("pids", {})})
        gaps = [
            v["gap_ms"]["median"]
            for p in polls
            for v in p.get("process", {}).get("pids", {}).values()
            if v.get("gap_ms")
        ]
        lines += [
            "",
            f"Sampling probe, GPU {probe['index']}, {len(polls)} polls 1 s apart: device "
            f"utilisation samples per poll median {_median(device)}, per-process samples per "
            f"poll median {_median(process)} (PIDs seen: {', '.join(pids) or 'none'}; median gap "
            f"between one PID's samples {_median(gaps)} ms).",
        ]
    return lines


def _links(gpu: dict[str, Any]) -> list[str]:
    """What the links and power state answered on one GPU (nvml_timing.py ``links``)."""
    answered = gpu.get("links")
    if not answered:
        return []
    fields = answered.get("fields") or {}
    if not isinstance(fields, dict):
        fields = {}
    states = sorted({str(v) for k, v in fields.items() if k.startswith("nvlink_state[")})
    speeds = sorted({str(v) for k, v in fields.items() if k.startswith("nvlink_speed_mbps[")})
    keep = ("power_limit_mw", "power_smoothing_enabled", "power_smoothing_floor_w")
    return [
        "",
        f"Links and power state, GPU {gpu['index']}: links {answered.get('links')}, NVLink "
        f"states {states or '-'}, speeds (MBps) {speeds or '-'}, "
        + ", ".join(f"{k} {fields.get(k, '-')}" for k in keep)
        + f", fabric {answered.get('fabric')}, power profiles {answered.get('power_profiles')}, "
        f"enforced power limit (mW) {answered.get('enforced_power_limit_mw')}.",
    ]


def _median(values: list[Any]) -> str:
    return f"{statistics.median(values):g}" if values else "-"


def _drills(drills: dict[str, Any]) -> list[str]:
    lines = ["", "| drill | fired (s after load start) | first ranked by diagnose | took s |"]
    lines.append("|---|---|---|---|")
    for name, result in drills.items():
        if name == "not_started":
            continue
        findings = (result.get("diagnose") or {}).get("findings") or []
        holding = [f["alert"] for f in findings if f.get("status") == "holds"]
        fired = ", ".join(f"{a} {t:g}" for a, t in sorted((result.get("fired") or {}).items()))
        lines.append(
            f"| {name} | {fired or 'nothing'} | {holding[0] if holding else 'nothing'} "
            f"| {_fmt(result.get('duration_s'))} |"
        )
    for name in drills.get("not_started", []):
        lines.append(f"| {name} | not started: too little time left | | |")
    lines += ["", "| drill | " + " | ".join(title for _, title in SIGNAL_COLUMNS) + " |"]
    lines.append("|---" * (len(SIGNAL_COLUMNS) + 1) + "|")
    for name, result in drills.items():
        signals = result.get("gpu_signals") if isinstance(result, dict) else None
        if signals:
            row = " | ".join(_fmt(signals.get(key)) for key, _ in SIGNAL_COLUMNS)
            lines.append(f"| {name} | {row} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    lines = ["# GPU check (bench/gpu/run.sh)", "", *_environment(out)]
    for trace in sorted(out.glob("nvml-trace*.jsonl")):
        records = trace.read_text(encoding="utf-8").splitlines()
        lines.append(f"NVML trace `{trace.name}`: {len(records) - 1} records.")
    try:
        log = (out / "run.log").read_text(encoding="utf-8").splitlines()
    except OSError:
        log = []
    recorded = [line.split("] ", 1)[-1] for line in log if ": record exit code" in line]
    if recorded:
        lines += ["", "`record` summaries:", "```", *recorded, "```"]
    timing = _json(out / "nvml-timing.json")
    if timing:
        lines += _timing(timing)
    drills = _json(out / "drills.json")
    if drills:
        lines += _drills(drills)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
