"""A fake engine (``tests/support/fakeengine.py``) in a process of its own, for the benchmarks.

Serves ``--body`` on ``/metrics`` (and the tokenize endpoints), prints ``url http://...`` once
listening, then reads modes from stdin, one a line (``hang``, ``ok``, any of
``fakeengine.MODES``), answering ``mode <mode>`` after each; EOF stops it. Its own process, so
serving a large body never holds the benchmark's GIL while it times a scrape.

    python bench/engine_server.py --body tests/fixtures/engines/vllm.txt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.fakeengine import MODES, FakeEngine  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--body", type=Path, required=True, help="exposition to serve")
    parser.add_argument("--flavour", default="vllm", help="tokenize answer shape")
    args = parser.parse_args()
    body = args.body.read_text(encoding="utf-8")
    with FakeEngine.run_in_thread(metrics_body=body, flavour=args.flavour) as engine:
        print(f"url {engine.url}", flush=True)
        for line in sys.stdin:
            mode = line.strip()
            if mode not in MODES:
                print(f"error unknown mode {mode!r}", flush=True)
                continue
            engine.set_mode(mode)
            print(f"mode {mode}", flush=True)
        print(f"requests {dict(engine.requests)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
