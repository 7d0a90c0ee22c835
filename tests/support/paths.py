"""Where the tests find the repository, its fixtures and the bundled replay trace."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
TRACE = ROOT / "exporter" / "data" / "replay-2gpu-synthetic.jsonl"
