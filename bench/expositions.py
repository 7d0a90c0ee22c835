"""Engine expositions for the benchmarks, built from the fixtures in ``tests/fixtures/engines``.

* vLLM: ``vllm.txt`` as it is (one model, 343 series, prometheus_client's format).
* Triton with ``n`` models: ``triton.txt``'s families, in its format (prometheus-cpp: counters
  without ``_total``, labels sorted, histogram ``_count``/``_sum`` before buckets), with one
  block of series per model, every other model a TensorRT-LLM model (the fixture's
  ``tensorrt_llm`` series: the first-response histogram and the ``nv_trt_llm_*`` gauges), the
  others plain models (the fixture's ``resnet50`` version 1 series). Counters and histogram
  counts are scaled per model, so values differ from model to model. Node-wide families (GPU,
  CPU, pinned memory) appear once. :func:`triton_for_series` picks the number of models that
  comes closest to a number of series.

    python bench/expositions.py triton --models 50 > /tmp/triton-50.txt
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "engines"
VLLM = FIXTURES / "vllm.txt"
TRITON = FIXTURES / "triton.txt"

_LLM = 'model="tensorrt_llm",'
_PLAIN = 'model="resnet50",'
_SAMPLE = re.compile(r"^(?P<series>[^ ]+) (?P<value>[^ ]+)$")


def _blocks(text: str) -> list[tuple[list[str], str, list[str]]]:
    """The fixture's families: (HELP/TYPE lines, type, sample lines), in order."""
    blocks: list[tuple[list[str], str, list[str]]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("# HELP "):
            blocks.append(([line], "untyped", []))
        elif line.startswith("# TYPE "):
            header, _, samples = blocks[-1]
            header.append(line)
            blocks[-1] = (header, line.split()[3], samples)
        elif not line.startswith("#"):
            blocks[-1][2].append(line)
    return blocks


def _scaled(line: str, factor: int, family_type: str) -> str:
    """Counters and histograms grow with ``factor``; gauges keep the fixture's value."""
    if family_type not in ("counter", "histogram") or factor == 1:
        return line
    match = _SAMPLE.match(line)
    if match is None:
        return line
    value = float(match.group("value")) * factor
    text = str(int(value)) if value.is_integer() else repr(value)
    return f"{match.group('series')} {text}"


def triton_exposition(models: int) -> str:
    """A Triton ``/metrics`` body with ``models`` models (see the module docstring)."""
    if models < 1:
        raise ValueError("at least one model")
    out: list[str] = []
    for header, family_type, samples in _blocks(TRITON.read_text(encoding="utf-8")):
        llm = [s for s in samples if _LLM in s]
        plain = [s for s in samples if _PLAIN in s and 'version="1"' in s]
        node = [s for s in samples if "model=" not in s]
        lines = list(node)
        for k in range(models):
            template, model = (llm, "tensorrt_llm") if k % 2 == 0 else (plain, "resnet50")
            name = f'model="{model}_{k:03d}",'
            factor = 1 + k % 7
            lines += [
                _scaled(s.replace(f'model="{model}",', name), factor, family_type) for s in template
            ]
        if lines:
            out += header + lines
    return "\n".join(out) + "\n"


def series_of(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def triton_for_series(target: int) -> tuple[int, str]:
    """(models, body) of the Triton exposition whose series count is closest to ``target``."""
    one, two, three = (series_of(triton_exposition(m)) for m in (1, 2, 3))
    llm, plain = three - two, two - one
    node = one - llm

    def count(models: int) -> int:
        return node + (models + 1) // 2 * llm + models // 2 * plain

    models = min(range(1, max(2, target)), key=lambda m: (abs(count(m) - target), m))
    return models, triton_exposition(models)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="engine", required=True)
    triton = sub.add_parser("triton")
    group = triton.add_mutually_exclusive_group(required=True)
    group.add_argument("--models", type=int)
    group.add_argument("--series", type=int, help="pick the model count closest to this")
    sub.add_parser("vllm")
    args = parser.parse_args()
    if args.engine == "vllm":
        sys.stdout.write(VLLM.read_text(encoding="utf-8"))
    elif args.models is not None:
        sys.stdout.write(triton_exposition(args.models))
    else:
        models, body = triton_for_series(args.series)
        print(f"{models} models, {series_of(body)} series", file=sys.stderr)
        sys.stdout.write(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
