"""The one error type of a site configuration, and how a value of it is described.

Apart from :mod:`.site` so that every module that reads a part of the site config (the
objectives of :mod:`.slo_config`) raises the same one-line error without importing the whole
configuration.
"""

from __future__ import annotations

from collections.abc import Mapping


class SignatureConfigError(ValueError):
    """An invalid site configuration; ``str()`` is the one line the user sees."""

    def __init__(self, field_path: str, problem: str) -> None:
        self.field = field_path
        self.problem = problem
        super().__init__(f"{field_path}: {problem}")


def describe(value: object) -> str:
    """A YAML value as an error message names it (``string '5m'``, ``a list``)."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__
