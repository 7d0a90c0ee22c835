"""``python -m dashboards [--config SITE] [--profile P] [--check] [--out DIR]``: write (or check)
the JSON of every rule profile (``DIR/*.json`` for ``sidecar``, ``DIR/<profile>/*.json`` for the
others), or of one profile into ``DIR``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from dashboards import generate, generate_all
from exporter.config import ArgumentParser
from exporter.signatures.site import PROFILES, SignatureConfigError, load_config

HERE = Path(__file__).resolve().parent
PROG = "python -m dashboards"


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(
        prog=PROG,
        description="Generate the Grafana dashboards' JSON from the code in dashboards/.",
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="the rule pack's site config (YAML), as for python -m exporter.signatures: "
        "its selectors, join labels and thresholds; the shipped defaults when omitted",
    )
    parser.add_argument(
        "--profile",
        choices=tuple(PROFILES),
        help="only this rule profile's dashboards, into --out (default: every profile's)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when a committed file differs from a fresh generation",
    )
    parser.add_argument(
        "--out", type=Path, default=HERE, help="directory of the JSON files (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.profile or "sidecar")
        files = generate(cfg) if args.profile else generate_all(cfg)
    except SignatureConfigError as err:
        # The one line `python -m exporter.signatures` prints for the same file.
        where = (
            f"{args.config}: " if args.config and not str(err).startswith(str(args.config)) else ""
        )
        sys.stderr.write(f"{PROG}: error: {where}{err}\n")
        return 2
    out: Path = args.out
    stale: list[str] = []
    for name, text in files.items():
        path = out / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(
            f"{', '.join(stale)} differ from the code in dashboards/; run `python -m dashboards`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
