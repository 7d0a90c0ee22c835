"""``python -m exporter.lab.engine``: the reference engine (see :mod:`exporter.lab.engine.cli`)."""

from __future__ import annotations

if __name__ == "__main__":
    from exporter.lab.engine.cli import main

    raise SystemExit(main())
