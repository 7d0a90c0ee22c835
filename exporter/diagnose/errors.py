"""The error a user can fix, for every part of ``diagnose``: its ``str()`` is the one line
printed (exit 2)."""

from __future__ import annotations


class DiagnoseError(Exception):
    """Something the user can fix; ``str()`` is the one line printed."""
