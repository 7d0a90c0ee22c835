"""``python -m dashboards [--check] [--out DIR]``: write (or check) the dashboards' JSON."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from dashboards import generate
from exporter.config import ArgumentParser

HERE = Path(__file__).resolve().parent


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m dashboards",
        description="Generate the Grafana dashboards' JSON from the code in dashboards/.",
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
    out: Path = args.out
    stale: list[str] = []
    for name, text in generate().items():
        path = out / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(name)
        else:
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
