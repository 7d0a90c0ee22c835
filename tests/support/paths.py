"""Where the tests find the repository, its fixtures and the bundled replay trace."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
TRACE = ROOT / "exporter" / "data" / "replay-2gpu-synthetic.jsonl"


def _module(path: Path, module_name: str) -> ModuleType:
    """``path`` imported as ``module_name`` (once: a second call returns the first module)."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def build_tool(name: str) -> ModuleType:
    """Import ``build-tools/NAME.py`` (a build step, not part of the package) as a module."""
    return _module(ROOT / "build-tools" / f"{name}.py", f"build_tools_{name}")


def bench_script(name: str, module_name: str) -> ModuleType:
    """Import ``bench/NAME.py`` (a benchmark, not part of the package) as ``module_name``,
    with ``bench/`` importable as its scripts expect (``import common``)."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    return _module(ROOT / "bench" / f"{name}.py", module_name)
