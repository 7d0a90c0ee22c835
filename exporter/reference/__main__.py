"""``python -m exporter.reference``: the reference engine (see :mod:`exporter.reference.cli`)."""

from __future__ import annotations

if __name__ == "__main__":
    from exporter.reference.cli import main

    raise SystemExit(main())
