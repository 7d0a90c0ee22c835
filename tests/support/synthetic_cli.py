"""``python -m support.synthetic_cli``: write a synthetic NVML trace (whole GPUs, MIG, time-sliced,
links).

Usage::

    python -m support.synthetic_cli --gpus 8 --duration 60s --out trace.jsonl
    python -m support.synthetic_cli --kind mig --product a100 --out mig.jsonl
    python -m support.synthetic_cli --kind timesliced --tenants 1 --out single.jsonl
    python -m support.synthetic_cli --kind tp-linkbound --out tp.jsonl
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from exporter.config import ArgumentParser, parse_duration
from support import synthetic_links, synthetic_shared
from support.synthetic import MAX_GPUS, synthetic_trace_lines

# The link traces (support.synthetic_links): --kind -> (generator, its keyword arguments).
LINK_KINDS = {
    "tp-linkbound": (synthetic_links.tp_trace_lines, {"bound": True}),
    "tp-overlapped": (synthetic_links.tp_trace_lines, {"bound": False}),
    "gb200": (synthetic_links.gb200_trace_lines, {}),
    "pcie": (synthetic_links.pcie_trace_lines, {}),
}


def _duration_arg(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive, got {text!r}")
    return seconds


def _gpus_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad GPU count {text!r}") from None
    if not 1 <= value <= MAX_GPUS:
        raise argparse.ArgumentTypeError(f"GPU count must be between 1 and {MAX_GPUS}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m support.synthetic_cli",
        description="Write a synthetic NVML trace (JSON lines) for replay without a GPU.",
    )
    parser.add_argument("--gpus", type=_gpus_arg, default=2, help="number of GPUs (default 2)")
    parser.add_argument(
        "--duration", type=_duration_arg, default=120.0, help="trace length, e.g. 60s, 2m"
    )
    parser.add_argument(
        "--interval", type=_duration_arg, default=1.0, help="time between records (default 1s)"
    )
    parser.add_argument(
        "--kind",
        choices=("whole", "mig", "timesliced", *LINK_KINDS),
        default="whole",
        help="whole GPUs (default), one GPU in MIG mode with seven MIG devices, one GPU "
        "time-sliced between pods, a tensor-parallel pod bound by NVLink or not, a GB200, a "
        "PCIe GPU without NVLink",
    )
    parser.add_argument(
        "--product", choices=("h100", "a100"), default="h100", help="the MIG GPU (--kind mig)"
    )
    parser.add_argument(
        "--tenants", type=int, choices=(1, 2), default=2, help="pods (--kind timesliced)"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default per kind)")
    parser.add_argument("--out", default="-", help="output file, - for stdout (default)")
    args = parser.parse_args(argv)

    try:
        if args.kind == "mig":
            lines = synthetic_shared.mig_trace_lines(
                product=args.product,
                duration_s=args.duration,
                record_interval_s=args.interval,
                **({} if args.seed is None else {"seed": args.seed}),
            )
        elif args.kind in LINK_KINDS:
            generate, kwargs = LINK_KINDS[args.kind]
            duration = {} if args.duration == 120.0 else {"duration_s": args.duration}
            lines = generate(
                **kwargs,
                **duration,
                record_interval_s=args.interval,
                **({} if args.seed is None else {"seed": args.seed}),
            )
        elif args.kind == "timesliced":
            lines = synthetic_shared.timesliced_trace_lines(
                tenants=args.tenants,
                duration_s=args.duration,
                record_interval_s=args.interval,
                **({} if args.seed is None else {"seed": args.seed}),
            )
        else:
            lines = synthetic_trace_lines(
                gpus=args.gpus,
                duration_s=args.duration,
                record_interval_s=args.interval,
                seed=7 if args.seed is None else args.seed,
            )
    except ValueError as err:
        parser.error(str(err))
    text = "\n".join(lines) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    try:
        with open(args.out, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
    except OSError as err:
        print(f"{parser.prog}: error: cannot write {args.out}: {err.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
