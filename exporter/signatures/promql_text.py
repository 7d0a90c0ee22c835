"""Small PromQL builders shared by the recording rules, the alerts and the runbooks.

Everything here returns text; nothing talks to Prometheus. Numbers and durations are written
the same way every time so that the generated rule files are byte-for-byte reproducible.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_MATCHER = re.compile(
    r"""\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*(?P<op>=~|!~|!=|=)\s*"""
    r"""(?P<value>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)\s*"""
)


def num(value: float) -> str:
    """A threshold as PromQL (and people) read it: ``0.6``, ``1``, ``0.0333333333333``."""
    if not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number")
    if value == int(value):
        return str(int(value))
    return f"{value:.12g}"


def pct(ratio: float, digits: int | None = None) -> str:
    """A 0-1 ratio as a percentage for people, without the sign: the shortest exact form
    (``0.6`` -> ``60``, ``0.125`` -> ``12.5``), or with ``digits`` fixed decimals
    (``pct(0.1234, 1)`` -> ``12.3``). Thresholds in prose and live values use this one."""
    if digits is not None:
        return f"{100 * ratio:.{digits}f}"
    return num(round(ratio * 100, 6))


def split_matchers(text: str) -> list[str]:
    """The matchers of a selector body (``job="a", mode!~"b"``), each normalised.

    Raises ValueError naming the first part that is not ``label op "value"``.
    """
    text = text.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    out: list[str] = []
    pos = 0
    while pos < len(text):
        match = _MATCHER.match(text, pos)
        if match is None:
            rest = text[pos:].strip()
            raise ValueError(f'cannot read a matcher at {rest[:40]!r} (want label="value")')
        out.append(f"{match['label']}{match['op']}{match['value']}")
        pos = match.end()
        if pos < len(text):
            if text[pos] != ",":
                raise ValueError(f"expected ',' between matchers at {text[pos:][:40]!r}")
            pos += 1
            if not text[pos:].strip():
                break
    return out


def selector(metric: str, *matchers: str | Sequence[str]) -> str:
    """``metric{m1,m2}``; empty matcher groups are skipped, no braces when there are none."""
    flat: list[str] = []
    for group in matchers:
        if isinstance(group, str):
            flat.extend(split_matchers(group) if group.strip() else [])
        else:
            flat.extend(group)
    return f"{metric}{{{','.join(flat)}}}" if flat else metric


def matchers(values: Mapping[str, str]) -> str:
    """``{a="x",b="y"}`` selecting exactly these label values (``""`` matches an absent label).

    What ``diagnose`` substitutes for ``{target}`` in an evidence query of one alert instance.
    """
    body = ",".join(f"{label}={json.dumps(value)}" for label, value in values.items())
    return f"{{{body}}}"


def by(labels: Iterable[str]) -> str:
    """``by (a, b)`` for an aggregation; ``by ()`` when there are no labels."""
    return f"by ({', '.join(labels)})"


def on(labels: Iterable[str]) -> str:
    return f"on ({', '.join(labels)})"


def regex_alternatives(values: Iterable[str | int]) -> str:
    """``a|b|c`` for a label regex; values are plain names or integers (no escaping needed)."""
    return "|".join(str(v) for v in values)


def indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line if line else line for line in text.splitlines())


def printf_matchers(labels: Sequence[str]) -> str:
    """A Go template ``printf`` call rendering matchers of the alert's own values of
    ``labels`` (``namespace="llm",pod=""``), for an annotation's ``query``. A label the alert
    lacks matches the empty value: ``(or $labels.x "")``, since Prometheus' ``$labels`` gives
    ``""`` for a missing label and vmalert's gives nothing, which ``printf`` would spell
    ``%!q(<nil>)`` and the query refuse."""
    fmt = ",".join(f"{label}=%q" for label in labels)
    args = " ".join(f'(or $labels.{label} "")' for label in labels)
    return f"printf `{fmt}` {args}"
