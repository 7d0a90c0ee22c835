"""``python -m exporter.lab.refengine``: run the reference engine (see its ``cli`` module)."""

from __future__ import annotations

if __name__ == "__main__":
    from exporter.lab.refengine.cli import main

    raise SystemExit(main())
